"""Iterative preference optimisation (`preference_rounds`): each round's pairs come from the model the round before
made.

One round is `align.preference.trainer.train_round`: pairs in, a trained model out. With `preference_rounds: R > 1` the
stage runs R rounds. Round 1 trains the stage's starting model on the stage's data (the pipeline's `preferences`
stage: pairs the SFT model graded itself on). Every later round first samples new pairs from the model the round
before saved, with `round_pairs_recipe` (a `scripts/generate_preferences.py` recipe, method graded: its
`policy_model` becomes that model, its `output_dir` `output_dir/pairs-round-<k>`, its sampling seed moves on by
k - 1, and `round_pairs_overrides` changes what else should differ, e.g. new prompts), then trains that model on
them, the model itself as its reference. That is iterative DPO with an NLL term (Pang et al. 2024, "Iterative
Reasoning Preference Optimization"; Xiong et al. 2024): the chosen answers are the newest policy's verified best of
n, so the lead the round learns from moves with the model, as in distillation's expert iteration
(align/distill/rounds.py).

Rounds before the last save to `output_dir/round-<k>`; the last saves to `output_dir`. Its `preference_eval.json`
is the last round's (held-out preference accuracy on that round's own test pairs) with `rounds`: each round's
model, pairs, their card's policy and best-of-n accuracy, and its before/after preference accuracy. The stage's
verdict is the pipeline's evaluation: the starting model against the last round's.

Resume: a round whose `round-<k>/preference_eval.json` exists is done (it is written after the model is saved) and
is skipped; pairs whose `card.json` exists are not made again (a cut-short pair run resumes batch by batch); a round
cut short resumes from its own checkpoints, as a one-round stage does.

    python scripts/dpo.py recipes/smol135m/apo.yaml --preference_rounds 2
"""

from __future__ import annotations

import copy
import json
import logging
import os
from dataclasses import fields

from accelerate import PartialState

from align.cli import check_keys, load_recipe
from align.config import ScriptArguments
from align.runtime.checkpoint import write_json_atomic
from align.runtime.distributed import release_accelerator_state, zero3_init_disabled
from align.stage import round_dir
from data_gen.preferences import PreferenceDataConfig, make_pairs

logger = logging.getLogger(__name__)


def pairs_config(args, k: int, policy: str) -> tuple:
    """(ScriptArguments, PreferenceDataConfig) that make round k's pairs from `policy` (`round_pairs_recipe` +
    `round_pairs_overrides`; policy_model, output_dir and the sampling seed set here)."""
    types = (ScriptArguments, PreferenceDataConfig)
    config = load_recipe(args.round_pairs_recipe, types)
    config.pop("env", None)
    config.update(check_keys(copy.deepcopy(args.round_pairs_overrides or {}), types, "round_pairs_overrides"))
    if config.get("method", "strong_weak") != "graded":
        raise ValueError(
            f"round_pairs_recipe {args.round_pairs_recipe} must use method: graded (each round's pairs are "
            f"the previous round's model grading itself), got {config.get('method', 'strong_weak')!r}"
        )
    config.update(
        policy_model=policy,
        output_dir=os.path.join(args.output_dir, f"pairs-round-{k}"),
        seed=int(config.get("seed", 0)) + k - 1,
    )
    script = {f.name for f in fields(ScriptArguments) if f.init}
    return (
        ScriptArguments(**{k_: v for k_, v in config.items() if k_ in script}),
        PreferenceDataConfig(**{k_: v for k_, v in config.items() if k_ not in script}),
    )


def check(args, model_args) -> None:
    """The settings rounds cannot run with, one line each, before round 1 trains."""
    if args.preference_rounds < 1:
        raise ValueError(f"preference_rounds must be >= 1, got {args.preference_rounds}")
    if args.preference_rounds == 1:
        return
    if not args.round_pairs_recipe:
        raise ValueError(
            "preference_rounds > 1 needs round_pairs_recipe: the generate_preferences recipe that makes "
            "each later round's pairs (e.g. recipes/smol135m/preferences.yaml)"
        )
    if getattr(model_args, "use_peft", False) and not args.merge_lora_on_save:
        raise ValueError(
            "preference_rounds > 1 with use_peft needs merge_lora_on_save: true (the next round samples "
            "from and trains the saved model, which must be a whole model, not an adapter)"
        )
    pairs_config(args, 2, model_args.model_name_or_path)  # a bad recipe or override fails now, not after round 1


def iterate(script_args, args, model_args, one_round) -> dict:
    """`preference_rounds` rounds of `one_round(script_args, training_args, model_args)`; the whole stage's report."""
    check(args, model_args)
    rounds, results, model, data = args.preference_rounds, [], model_args.model_name_or_path, script_args
    for k in range(1, rounds + 1):
        out, pairs = round_dir(args.output_dir, k, rounds), None
        report = os.path.join(out, "preference_eval.json")
        if k > 1:
            pair_args, pair_cfg = pairs_config(args, k, model)
            pairs = pair_cfg.output_dir
            if not os.path.exists(os.path.join(pairs, "card.json")):
                logger.info("preference rounds: round %d of %d: pairs from %s -> %s", k, rounds, model, pairs)
                with zero3_init_disabled():  # the engines build whole models of their own, not ZeRO-3 partitions
                    make_pairs(pair_args, pair_cfg)
            data = copy.copy(script_args)
            data.dataset_name, data.dataset_args, data.dataset_mixture, data.dataset_config = pairs, None, None, None
        if k < rounds and os.path.exists(report):
            logger.info("preference rounds: round %d of %d is done (%s): skipped", k, rounds, out)
            with open(report) as f:
                result = json.load(f)
        else:
            logger.info(
                "preference rounds: round %d of %d: %s on %s -> %s",
                k,
                rounds,
                model,
                data.dataset_name or "the stage's data",
                out,
            )
            round_args, round_model = copy.copy(args), copy.copy(model_args)
            round_args.output_dir, round_args.preference_rounds = out, 1
            round_model.model_name_or_path = model
            resume = getattr(args, "resume_from_checkpoint", None)
            if k < rounds and isinstance(resume, str) and os.path.isdir(resume):
                round_args.resume_from_checkpoint = (
                    None  # a checkpoint dir is the last round's: this one resumes its own
                )
            result = one_round(data, round_args, round_model)
            if k < rounds:
                release_accelerator_state()
        results.append({"round": k, "model": model, "pairs": pairs or data.dataset_name, "result": result})
        model = out
    return whole_stage(results, args)


def _card(pairs: str | None) -> dict:
    path = os.path.join(pairs or "", "card.json")
    if not pairs or not os.path.exists(path):
        return {}
    with open(path) as f:
        card = json.load(f)
    return {
        "kept": {s: c.get("kept") for s, c in card.get("counts", {}).items()},
        "strength": card.get("strength", {}),
    }


def whole_stage(results: list[dict], args) -> dict:
    """The last round's report with `preference_rounds` and `rounds` (each round's model, pairs, their card's counts
    and policy/best-of-n accuracy, before/after held-out preference accuracy). Rewrites
    `output_dir/preference_eval.json`."""
    metrics = dict(results[-1]["result"])
    metrics["preference_rounds"] = len(results)
    metrics["rounds"] = [
        {
            "round": r["round"],
            "model": r["model"],
            "pairs": r["pairs"],
            **_card(r["pairs"]),
            **{when: r["result"].get(when) for when in ("before", "after") if r["result"].get(when)},
        }
        for r in results
    ]
    if PartialState().is_main_process:
        write_json_atomic(os.path.join(args.output_dir, "preference_eval.json"), metrics, indent=2)
    return metrics
