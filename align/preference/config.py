"""Preference optimisation's configs: DPO (every TRL loss, APO included), KTO and ORPO, and the fields they share."""

from __future__ import annotations

import os
from dataclasses import dataclass, field

import trl

from align.config import StageArgs
from align.runtime.device import apply_device_defaults

DPO_LOSS_TYPES = (
    "sigmoid",
    "hinge",
    "ipo",
    "exo_pair",
    "nca_pair",
    "robust",
    "bco_pair",
    "sppo_hard",
    "aot",
    "aot_unpaired",
    "apo_zero",
    "apo_down",
    "discopop",
    "sft",
    "sigmoid_norm",
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
        metadata={
            "help": "Measure held-out preference accuracy (implicit reward chosen > rejected) before and after."
        },
    )
    preference_eval_batch_size: int = field(
        default=8, metadata={"help": "Pairs per forward pass when measuring held-out preference accuracy."}
    )
    drop_identical: bool = field(
        default=True, metadata={"help": "Drop pairs whose chosen equals rejected (they carry no preference)."}
    )
    replay_data: str | None = field(
        default=None,
        metadata={
            "help": "Conversations (a `messages` column; a local file or directory, a hub-shaped repo) mixed "
            "into the pairs as chosen == rejected rows: their preference terms cancel and only the NLL term "
            "('sft' in loss_type) trains on them, an SFT replay that keeps a chat model chatting. DPO losses "
            "whose terms cancel on identical answers only (see REPLAY_LOSS_TYPES)."
        },
    )
    replay_samples: int | None = field(
        default=None, metadata={"help": "Use at most this many replay conversations (the first ones)."}
    )
    preference_rounds: int = field(
        default=1,
        metadata={
            "help": "Rounds of iterative preference optimisation (align/preference/rounds.py): every round after "
            "the first samples new pairs from the model the round before saved (round_pairs_recipe) and trains "
            "that model on them, itself as the reference. Rounds before the last save to output_dir/round-<k>."
        },
    )
    round_pairs_recipe: str | None = field(
        default=None,
        metadata={
            "help": "preference_rounds > 1: a scripts/generate_preferences.py recipe (method graded) for the "
            "later rounds' pairs; its policy_model becomes the previous round's model, its output_dir "
            "output_dir/pairs-round-<k>, its sampling seed + k - 1."
        },
    )
    round_pairs_overrides: dict | None = field(
        default=None,
        metadata={
            "help": "Keys of round_pairs_recipe to change for the later rounds, e.g. prompts the first round's "
            "pairs did not use: {dataset_args: {num: 1600, seed: 3, mode: mixed}}."
        },
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
