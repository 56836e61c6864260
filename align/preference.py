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
    python scripts/dpo.py recipes/tiny_apo.yaml          # DPO / APO / IPO / weighted loss lists
    python scripts/kto.py recipes/tiny_kto.yaml          # paired data is unpaired automatically
    python scripts/orpo.py recipes/tiny_orpo.yaml        # no reference model, no SFT stage needed
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import torch
import trl

from align import stage
from align.configs import StageArgs, apply_device_defaults
from align.data import load_replay_conversations
from align.distributed import full_model
from align.preference_rounds import iterate
from align.scoring import accuracy, sequence_logprobs

logger = logging.getLogger(__name__)

DPO_LOSS_TYPES = (
    "sigmoid", "hinge", "ipo", "exo_pair", "nca_pair", "robust", "bco_pair", "sppo_hard", "aot", "aot_unpaired",
    "apo_zero", "apo_down", "discopop", "sft", "sigmoid_norm",
)
KTO_LOSS_TYPES = ("kto", "apo_zero_unpaired")
# The DPO losses whose preference term has zero gradient when chosen == rejected: functions of the margin
# (chosen - rejected log-ratio), and apo_zero, whose two halves cancel (1 - s(x) + s(x)). The others (bco_pair,
# nca_pair, sppo_hard, apo_down, aot*) would push a replay answer's likelihood against the reference model.
REPLAY_LOSS_TYPES = ("sigmoid", "hinge", "ipo", "exo_pair", "robust", "discopop", "sigmoid_norm", "apo_zero", "sft")


@dataclass
class PreferenceArgs(StageArgs):
    """Fields every preference config adds to TRL's (and StageArgs: merge_lora_on_save)."""

    chat_template_path: str | None = field(
        default=None, metadata={"help": "A .jinja chat template to use instead of the tokenizer's own."}
    )
    preference_eval: bool = field(
        default=True,
        metadata={"help": "Measure held-out preference accuracy (implicit reward chosen > rejected) before and after."},
    )
    preference_eval_batch_size: int = field(
        default=8, metadata={"help": "Pairs per forward pass when measuring held-out preference accuracy."}
    )
    drop_identical: bool = field(
        default=True, metadata={"help": "Drop pairs whose chosen equals rejected (they carry no preference)."}
    )
    replay_data: str | None = field(
        default=None,
        metadata={"help": "Conversations (a `messages` column; a local file or directory, a hub-shaped repo) mixed "
                  "into the pairs as chosen == rejected rows: their preference terms cancel and only the NLL term "
                  "('sft' in loss_type) trains on them, an SFT replay that keeps a chat model chatting. DPO losses "
                  "whose terms cancel on identical answers only (see REPLAY_LOSS_TYPES)."},
    )
    replay_samples: int | None = field(
        default=None, metadata={"help": "Use at most this many replay conversations (the first ones)."}
    )
    preference_rounds: int = field(
        default=1,
        metadata={"help": "Rounds of iterative preference optimisation (align/preference_rounds.py): every round after "
                  "the first samples new pairs from the model the round before saved (round_pairs_recipe) and trains "
                  "that model on them, itself as the reference. Rounds before the last save to output_dir/round-<k>."},
    )
    round_pairs_recipe: str | None = field(
        default=None,
        metadata={"help": "preference_rounds > 1: a scripts/generate_preferences.py recipe (method graded) for the "
                  "later rounds' pairs; its policy_model becomes the previous round's model, its output_dir "
                  "output_dir/pairs-round-<k>, its sampling seed + k - 1."},
    )
    round_pairs_overrides: dict | None = field(
        default=None,
        metadata={"help": "Keys of round_pairs_recipe to change for the later rounds, e.g. prompts the first round's "
                  "pairs did not use: {dataset_args: {num: 1600, seed: 3, mode: mixed}}."},
    )


def _finish_post_init(args) -> None:
    apply_device_defaults(args)
    if args.preference_eval_batch_size < 1:
        raise ValueError(f"preference_eval_batch_size must be >= 1, got {args.preference_eval_batch_size}")
    if args.replay_data is None:
        return
    losses = getattr(args, "loss_type", None)
    losses = [losses] if isinstance(losses, str) else list(losses or [])
    if not isinstance(args, DPOConfig) or "sft" not in losses or set(losses) - set(REPLAY_LOSS_TYPES):
        raise ValueError(
            f"replay_data needs a DPO loss_type list with 'sft' (the NLL term that trains on replay rows) and "
            f"preference losses that cancel on identical answers ({', '.join(REPLAY_LOSS_TYPES[:-1])}); got "
            f"{type(args).__name__} loss_type {losses}: e.g. loss_type: [apo_zero, sft], or drop replay_data"
        )


@dataclass
class DPOConfig(PreferenceArgs, trl.DPOConfig):
    """TRL's DPOConfig (loss_type may be one name or a list, weighted by loss_weights) + our fields."""

    def __post_init__(self):
        _finish_post_init(self)
        losses = [self.loss_type] if isinstance(self.loss_type, str) else list(self.loss_type)
        bad = [name for name in losses if name not in DPO_LOSS_TYPES]
        if bad:
            raise ValueError(f"loss_type {bad} is not a DPO loss; choose from {list(DPO_LOSS_TYPES)}")
        super().__post_init__()


@dataclass
class KTOConfig(PreferenceArgs, trl.KTOConfig):
    """TRL's KTOConfig + our fields. Paired {prompt, chosen, rejected} data is unpaired before training."""

    def __post_init__(self):
        _finish_post_init(self)
        if self.loss_type not in KTO_LOSS_TYPES:
            raise ValueError(f"loss_type {self.loss_type!r} is not a KTO loss; choose from {list(KTO_LOSS_TYPES)}")
        super().__post_init__()


def _orpo_base():
    os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # ORPO lives in trl.experimental in TRL 1.x
    from trl.experimental.orpo import ORPOConfig as TrlORPOConfig

    return TrlORPOConfig


@dataclass
class ORPOConfig(PreferenceArgs, _orpo_base()):
    """TRL's ORPOConfig (odds-ratio loss added to NLL; no reference model) + our fields."""

    def __post_init__(self):
        _finish_post_init(self)
        super().__post_init__()


# ----------------------------------------------------------------------------- data


def _is_empty(value) -> bool:
    if value is None:
        return True
    if isinstance(value, str):
        return not value.strip()
    if isinstance(value, list):  # conversational: every message empty
        return all(_is_empty(m.get("content") if isinstance(m, dict) else m) for m in value)
    return False


def to_unpaired(dataset, seed: int | None = 0):
    """{prompt, chosen, rejected} -> {prompt, completion, label}: each pair gives a desirable and an undesirable row.

    The rows are shuffled under `seed` (None keeps TRL's order): TRL's KTO samples sequentially and estimates its KL
    term from each batch's neighbours, and unpairing writes a block of desirable rows then a block of undesirable
    ones, so unshuffled batches hold one label only and the KL term cancels the reward (the loss sits at 0.5)."""
    from trl.data_utils import unpair_preference_dataset

    out = unpair_preference_dataset(dataset)
    return out if seed is None else out.shuffle(seed=seed).flatten_indices()


def _is_text_or_messages(value) -> bool:
    if isinstance(value, str):
        return True
    return isinstance(value, list) and all(isinstance(m, dict) and "content" in m for m in value)


def _check_text_column(dataset, column: str, name: str, kind: str) -> None:
    """A number or a list of ids in `chosen` would reach TRL's tokenizer and die there with a TypeError."""
    for i, value in enumerate(dataset[column][:1000]):
        if value is not None and not _is_text_or_messages(value):
            raise ValueError(
                f"{name} dataset for {kind}: column '{column}' must hold text or a list of chat messages "
                f"({{role, content}}), but row {i} holds {type(value).__name__} {str(value)[:40]!r}"
            )


def prepare_preference_data(dataset, kind: str, name: str = "train", drop_identical: bool = True, seed: int = 0):
    """Check columns, drop rows that carry no preference, unpair for KTO. Raises ValueError naming the cause."""
    columns = set(dataset.column_names)
    paired = {"chosen", "rejected"} <= columns
    unpaired = {"prompt", "completion", "label"} <= columns
    if not paired and not (kind == "kto" and unpaired):
        missing = sorted({"chosen", "rejected"} - columns)
        accepted = "{prompt, chosen, rejected}" + (" or {prompt, completion, label}" if kind == "kto" else "")
        raise ValueError(
            f"{name} dataset for {kind} lacks column(s) {missing}; it has {sorted(columns)}. {kind} needs "
            f"{accepted}: make pairs with scripts/generate_preferences.py or rename the columns"
        )
    num_rows = len(dataset)
    if num_rows == 0:
        raise ValueError(f"{name} dataset for {kind} is empty (0 rows): check dataset_name / max_train_samples")
    text_columns = ["prompt", "chosen", "rejected"] if paired else ["prompt", "completion"]
    for column in text_columns:
        if column in columns:
            _check_text_column(dataset, column, name, kind)
    if paired:
        empty = dataset.filter(lambda r: not (_is_empty(r["chosen"]) or _is_empty(r["rejected"])))
        num_empty = num_rows - len(empty)
        kept = empty.filter(lambda r: r["chosen"] != r["rejected"]) if drop_identical else empty
        num_identical = len(empty) - len(kept)
        if len(kept) == 0:
            raise ValueError(
                f"{name} dataset for {kind} is empty after filtering: {num_rows} rows, {num_empty} with an empty "
                f"chosen/rejected, {num_identical} with chosen == rejected (drop_identical=True)"
            )
        if num_empty or num_identical:
            logger.warning("%s: dropped %d empty and %d identical pairs of %d", name, num_empty, num_identical, num_rows)
        return to_unpaired(kept, seed) if kind == "kto" else kept
    kept = dataset.filter(lambda r: not _is_empty(r["completion"]))
    if len(kept) == 0:
        raise ValueError(f"{name} dataset for kto is empty after filtering: all {num_rows} completions are empty")
    return kept


def replay_pairs(conversations, features=None):
    """Conversations ({messages: [..., assistant]}) as pairs whose chosen and rejected are the last assistant turn:
    prompt = every message before it. `features`: the pair dataset's, so the two concatenate (other columns None)."""
    import datasets

    rows = []
    for i, row in enumerate(conversations):
        messages = row.get("messages")
        if not (messages and isinstance(messages, list) and all(isinstance(m, dict) and {"role", "content"} <= set(m)
                                                                for m in messages)
                and messages[-1]["role"] == "assistant"):
            raise ValueError(f"replay_data row {i} has no conversation ending in an assistant turn (a `messages` "
                             f"list of {{role, content}}); got {str(messages)[:60]!r}")
        turn = [{"role": "assistant", "content": messages[-1]["content"]}]
        prompt = [{"role": m["role"], "content": m["content"]} for m in messages[:-1]]
        rows.append({"prompt": prompt, "chosen": turn, "rejected": turn})
    if features is None:
        return datasets.Dataset.from_list(rows)
    return datasets.Dataset.from_list([{**dict.fromkeys(features), **r} for r in rows], features=features)


def add_replay(train, spec: str, limit: int | None = None):
    """The pairs + `spec`'s conversations as chosen == rejected rows (PreferenceArgs.replay_data)."""
    import datasets

    conversations = load_replay_conversations(spec, limit)
    if not {"prompt", "chosen", "rejected"} <= set(train.column_names) or not len(conversations):
        raise ValueError(f"replay_data {spec!r}: needs paired train data and at least one conversation")
    replay = replay_pairs(conversations, train.features)
    logger.info("replay: %d conversations from %s added to %d pairs (chosen == rejected: NLL only)",
                len(replay), spec, len(train))
    return datasets.concatenate_datasets([train, replay])


# ----------------------------------------------------------------------------- held-out preference accuracy


def _render_ids(tokenizer, messages, add_generation_prompt: bool, template_kwargs: dict) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def pair_token_ids(tokenizer, row: dict) -> tuple[list[int], list[int], list[int]]:
    """(prompt_ids, chosen_ids, rejected_ids) as TRL's DPO tokenizes a pair: chat template for conversational rows,
    plain text + eos otherwise; the completion starts where prompt and prompt+completion tokens diverge."""
    from trl.data_utils import extract_prompt, is_conversational

    if "prompt" not in row:
        row = {**row, **extract_prompt(row)}
    kwargs = dict(row.get("chat_template_kwargs") or {})
    if is_conversational(row):
        prompt = _render_ids(tokenizer, row["prompt"], True, kwargs)
        full = [_render_ids(tokenizer, row["prompt"] + row[k], False, kwargs) for k in ("chosen", "rejected")]
    else:
        eos = tokenizer.eos_token or ""
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        full = [
            tokenizer(row["prompt"] + (row[k] if row[k].endswith(eos) else row[k] + eos), add_special_tokens=False)[
                "input_ids"
            ]
            for k in ("chosen", "rejected")
        ]
    n = min(len(prompt), *(next((i for i, (a, b) in enumerate(zip(prompt, f)) if a != b), len(f)) for f in full))
    return prompt[:n], full[0][n:], full[1][n:]


def completion_logps(model, sequences: list[tuple[list[int], list[int]]], batch_size: int = 8,
                     collective: bool = False) -> torch.Tensor:
    """Summed log-prob of each completion given its prompt: (N,) float32 (`align.scoring.sequence_logprobs`)."""
    scored = sequence_logprobs(model, [(p + c, len(c)) for p, c in sequences], 0, batch_size, collective=collective)
    return torch.tensor([s for s, _ in scored], dtype=torch.float32)


def pair_logps(model, tokenizer, dataset, batch_size: int = 8, accelerator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen_logps, rejected_logps) of `model` on the paired `dataset`.

    With an `accelerator`, `model` is what the trainer trains (`trainer.model_wrapped`) and the call is collective:
    every rank scores its share of the pairs on whole weights (gathered under ZeRO-3) and gets all the results."""
    ids = [pair_token_ids(tokenizer, row) for row in dataset]
    if accelerator is None:
        return _pair_logps(model, ids, batch_size, collective=False)
    with full_model(model, accelerator) as whole:
        return _pair_logps(whole, ids, batch_size, collective=True)


def _pair_logps(model, ids: list[tuple], batch_size: int, collective: bool) -> tuple[torch.Tensor, torch.Tensor]:
    chosen = completion_logps(model, [(p, c) for p, c, _ in ids], batch_size, collective)
    rejected = completion_logps(model, [(p, r) for p, _, r in ids], batch_size, collective)
    return chosen, rejected


def _share(margin: torch.Tensor) -> list[float]:
    """Per pair: 1 when the margin is positive, 0.5 on a tie, 0 otherwise."""
    return ((margin > 0).float() + 0.5 * (margin == 0).float()).tolist()


def preference_accuracy(
    chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor
) -> dict[str, float]:
    """Implicit-reward accuracy against the reference, the reference-free log-prob accuracy, and the mean margin."""
    margin = (chosen - ref_chosen) - (rejected - ref_rejected)
    pref = accuracy(_share(margin), "preference_accuracy")  # the one scorer's share, with its 95% interval
    del pref["num"]  # num_pairs below
    if not len(margin):
        pref["preference_accuracy"] = float("nan")
    return {
        **pref,
        "logp_accuracy": accuracy(_share(chosen - rejected))["accuracy"] if len(margin) else float("nan"),
        "mean_margin": float(margin.mean()) if len(margin) else float("nan"),
        "num_pairs": len(margin),
    }


# ----------------------------------------------------------------------------- main


def trainer_kind(training_args) -> str:
    if isinstance(training_args, KTOConfig):
        return "kto"
    if isinstance(training_args, ORPOConfig):
        return "orpo"
    if isinstance(training_args, DPOConfig):
        return "dpo"
    raise ValueError(f"training_args must be align.preference DPOConfig, KTOConfig or ORPOConfig, got "
                     f"{type(training_args).__name__}")


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
    `preference_rounds` > 1, that many rounds, each on pairs the round before's model made (align/preference_rounds.py)."""
    if training_args.preference_rounds != 1:
        return iterate(script_args, training_args, model_args, train_round)
    return train_round(script_args, training_args, model_args)


def train_round(script_args, training_args, model_args) -> dict:
    """One round: train on the stage's pairs, measure held-out preference accuracy before and after."""
    kind = trainer_kind(training_args)
    stage.start(kind, script_args, training_args, model_args)
    tokenizer, chat_template = stage.load_tokenizer(model_args, training_args)

    data = stage.load_data(script_args)
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
    trainer = _trainer_class(kind)(model=model, args=training_args, train_dataset=train, eval_dataset=test,
                                   processing_class=tokenizer, peft_config=stage.peft_config(model_args))
    stage.prepare(trainer, script_args, kind, raw_train=train, chat_template=chat_template)

    metrics: dict = {"trainer": kind, "loss_type": getattr(training_args, "loss_type", None),
                     "world_size": trainer.accelerator.num_processes}
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
            b["preference_accuracy"], a["preference_accuracy"], b["logp_accuracy"], a["logp_accuracy"], a["num_pairs"],
        )
    stage.write_report(trainer, training_args.output_dir, "preference_eval.json", metrics)
    return metrics
