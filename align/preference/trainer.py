"""Preference optimisation: DPO (every TRL loss, APO included), KTO and ORPO behind one `main()`.

Why: SmolLM3's largest post-training gain came from APO (`loss_type: apo_zero`) on strong-vs-weak pairs.
This stage configures TRL's trainers rather than forking them; what we add is what TRL leaves to the user:
clear errors for data in the wrong shape (a missing `chosen` column, nothing left after filtering), paired
data for KTO converted to unpaired automatically, LoRA adapters merged so the next stage loads a plain HF
model, and the metric that says whether it worked: held-out preference accuracy, before and after.

Held-out preference accuracy: over the test split's pairs, the share where the implicit reward of chosen
beats rejected, r(y) = log pi(y|x) - log pi_start(y|x) (ties count one half, so the start model scores 0.5).
`logp_accuracy` (pi(chosen) > pi(rejected), reference-free) is reported beside it. Both land in
`<output_dir>/preference_eval.json` and the log.

How to run:
    python scripts/dpo.py recipes/tiny/apo.yaml          # DPO / APO / IPO / weighted loss lists
    python scripts/kto.py recipes/tiny/kto.yaml          # paired data is unpaired automatically
    python scripts/orpo.py recipes/tiny/orpo.yaml        # no reference model, no SFT stage needed
"""

from __future__ import annotations

import logging
import os

import trl

from align import stage
from align.preference.accuracy import pair_logps, preference_accuracy
from align.preference.config import DPOConfig, KTOConfig, ORPOConfig
from align.preference.data import add_replay, prepare_preference_data
from align.preference.rounds import iterate

logger = logging.getLogger(__name__)


def trainer_kind(training_args) -> str:
    if isinstance(training_args, KTOConfig):
        return "kto"
    if isinstance(training_args, ORPOConfig):
        return "orpo"
    if isinstance(training_args, DPOConfig):
        return "dpo"
    raise ValueError(
        f"training_args must be align.preference.trainer DPOConfig, KTOConfig or ORPOConfig, got "
        f"{type(training_args).__name__}"
    )


def _trainer_class(kind: str):
    if kind == "dpo":
        return trl.DPOTrainer
    if kind == "kto":
        return trl.KTOTrainer
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")
    from trl.experimental.orpo import ORPOTrainer

    return ORPOTrainer


def main(script_args, training_args, model_args) -> dict:
    """Train one preference stage; return {"before": ..., "after": ...} held-out preference metrics. With
    `preference_rounds` > 1, that many rounds, each on pairs the round before's model made
    (align/preference/rounds.py)."""
    if training_args.preference_rounds != 1:
        return iterate(script_args, training_args, model_args, train_round)
    return train_round(script_args, training_args, model_args)


def train_round(script_args, training_args, model_args) -> dict:
    """One round: train on the stage's pairs, measure held-out preference accuracy before and after."""
    kind = trainer_kind(training_args)
    stage.start(kind, script_args, training_args, model_args)
    tokenizer, chat_template = stage.load_tokenizer(model_args, training_args)

    data = stage.load_data(script_args, training_args.output_dir)
    train = prepare_preference_data(data["train"], kind, "train", training_args.drop_identical, training_args.seed)
    if training_args.replay_data:
        train = add_replay(train, training_args.replay_data, training_args.replay_samples)
    raw_test = data["test"] if "test" in data else None
    test_pairs, test = None, None
    if raw_test is not None and len(raw_test):
        test = prepare_preference_data(raw_test, kind, "test", training_args.drop_identical, training_args.seed)
        if {"chosen", "rejected"} <= set(raw_test.column_names):
            test_pairs = prepare_preference_data(raw_test, "dpo", "test", training_args.drop_identical)

    model = stage.load_model(model_args)
    trainer = _trainer_class(kind)(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=test,
        processing_class=tokenizer,
        peft_config=stage.peft_config(model_args),
    )
    stage.prepare(trainer, script_args, kind, raw_train=train, chat_template=chat_template)

    metrics: dict = {
        "trainer": kind,
        "loss_type": getattr(training_args, "loss_type", None),
        "world_size": trainer.accelerator.num_processes,
    }
    ref = None
    batch = training_args.preference_eval_batch_size
    if training_args.preference_eval and test_pairs is not None:
        ref = pair_logps(trainer.model_wrapped, tokenizer, test_pairs, batch, trainer.accelerator)
        metrics["before"] = preference_accuracy(*ref, *ref)
        logger.info("held-out preference before: %s", metrics["before"])
    elif training_args.preference_eval:
        logger.warning("no paired test split: held-out preference accuracy is not measured (set test_split_size)")
    metrics["train"] = stage.train(trainer, training_args)
    stage.save(trainer, tokenizer, training_args)  # every rank
    if ref is not None:
        with stage.own_precision(trainer):  # as "before": the model's dtype, not the training autocast
            after = pair_logps(trainer.model_wrapped, tokenizer, test_pairs, batch, trainer.accelerator)
        metrics["after"] = preference_accuracy(*after, *ref)
        b, a = metrics["before"], metrics["after"]
        logger.info(
            "held-out preference accuracy %.3f -> %.3f (logp accuracy %.3f -> %.3f, n=%d)",
            b["preference_accuracy"],
            a["preference_accuracy"],
            b["logp_accuracy"],
            a["logp_accuracy"],
            a["num_pairs"],
        )
    stage.write_report(trainer, training_args.output_dir, "preference_eval.json", metrics)
    return metrics
