"""Config dataclasses shared by every stage, with no side effects.

Stage-specific configs subclass TRL's (`align.sft.config.SFTConfig(StageArgs, trl.SFTConfig)`, ...) and live in
their stage's package; this module holds what every script takes: `ScriptArguments` (data and run options), TRL's
`ModelConfig` (model id, dtype, LoRA / QLoRA fields), re-exported so scripts import one place, `StageArgs` (the
fields every post-training stage adds) and `rename_deprecated` (an old key name kept as an alias of its new one).
Every field has help text (`--help` prints it); a recipe key equals a field name. Building a config changes
nothing in the process: process tuning is `align.runtime.device.setup_process`, which each stage's main calls.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import trl
from trl import ModelConfig

from align.runtime.distributed import launched_world_size

logger = logging.getLogger(__name__)


__all__ = ["ScriptArguments", "ModelConfig", "StageArgs", "rename_deprecated"]


@dataclass
class ScriptArguments(trl.ScriptArguments):
    dataset_args: dict | None = field(
        default=None,
        metadata={
            "help": "Keyword arguments for a builtin source, e.g. {families: [arithmetic], num: 2000, mode: think}."
        },
    )
    dataset_mixture: dict | None = field(
        default=None,
        metadata={
            "help": "A weighted mixture instead of dataset_name: {datasets: [{id, config, split, columns, weight, "
            "args}], seed, weighting (share | fraction), test_split_size}. Each id is a hub id, a local file/dir "
            "(a hub-shaped repo too) or builtin:NAME."
        },
    )
    dataset_test_split: str | None = field(
        default=None,
        metadata={
            "help": "The split the stage holds out (its own before/after checks, early stopping, preference "
            "accuracy). Unset: the source's `validation` split when it has one, else its `test` split; our task "
            "families' validation split shares no problem with the eval suite's dev split or the sealed test."
        },
    )
    test_split_size: float | None = field(
        default=None,
        metadata={"help": "Hold out this fraction (or number) of rows as the test split when the source has none."},
    )
    max_train_samples: int | None = field(default=None, metadata={"help": "Use at most this many training rows."})
    max_eval_samples: int | None = field(default=None, metadata={"help": "Use at most this many evaluation rows."})
    skip_preflight: bool = field(
        default=False, metadata={"help": "Skip the preflight checks (logged loudly; for debugging only)."}
    )
    on_nonfinite: str = field(
        default="stop",
        metadata={
            "help": "On a NaN/inf loss or an exploding gradient: 'skip' the update, or 'stop' with a checkpoint."
        },
    )
    grad_explosion_factor: float = field(
        default=100.0,
        metadata={"help": "A gradient norm above this x the recent median counts as an explosion (0 = off)."},
    )
    eval_after: bool = field(
        default=True, metadata={"help": "Run the stage's evaluation suite on the saved model after training."}
    )
    eval_num_prompts: int = field(
        default=64, metadata={"help": "Held-out prompts for the post-stage verifiable-accuracy evaluation."}
    )
    decontamination: str = field(
        default="drop",
        metadata={
            "help": "Training rows that overlap an eval set (align/data/decontamination.py: the same canonical "
            "problem, or more than half of an eval prompt in shared 8-grams): 'drop' them (counted), 'warn' "
            "and keep them, or 'refuse' to train. Runs when decontamination_eval_sets is set."
        },
    )
    decontamination_eval_sets: str | None = field(
        default=None,
        metadata={
            "help": "The eval sets to check the training rows against: a JSON file {eval: [eval recipe "
            "configs], held_out: {stage: its data keys}} (the pipeline writes it and sets this key for every "
            "training stage); the stage's own held-out split is checked too. Unset: no check."
        },
    )
    decontamination_ngram: int = field(default=8, metadata={"help": "n of the n-gram overlap (open-instruct's 8)."})
    decontamination_threshold: float = field(
        default=0.5, metadata={"help": "Share of an eval prompt's tokens the shared n-grams must cover (more than)."}
    )

    def __post_init__(self):
        if self.dataset_mixture is not None:
            if not isinstance(self.dataset_mixture, dict) or not self.dataset_mixture.get("datasets"):
                raise ValueError(
                    "dataset_mixture must be a mapping with a non-empty 'datasets' list, "
                    "e.g. {datasets: [{id: builtin:tasks, weight: 1.0}]}"
                )
        if self.on_nonfinite not in ("skip", "stop"):
            raise ValueError(f"on_nonfinite={self.on_nonfinite!r}: choose 'skip' or 'stop'")
        if self.decontamination not in ("warn", "drop", "refuse"):
            raise ValueError(
                f"decontamination={self.decontamination!r}: choose 'drop' (the default), 'warn' or 'refuse'"
            )
        if self.decontamination_ngram < 1 or not 0 <= self.decontamination_threshold < 1:
            raise ValueError(
                f"decontamination_ngram={self.decontamination_ngram} must be >= 1 and "
                f"decontamination_threshold={self.decontamination_threshold} in [0, 1)"
            )
        if self.test_split_size is not None and self.test_split_size <= 0:
            raise ValueError(f"test_split_size must be > 0 (a fraction or a row count), got {self.test_split_size}")


@dataclass
class StageArgs:
    """Fields every post-training stage's config adds to TRL's (mixed in before the TRL config class)."""

    merge_lora_on_save: bool = field(
        default=True,
        metadata={
            "help": "With LoRA: save the merged model to output_dir (the adapter goes to output_dir/adapter); "
            "false saves the adapter alone to output_dir."
        },
    )
    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Sequences per optimizer step over all ranks, as published recipes state it (SmolLM3's SFT: "
            "128). gradient_accumulation_steps is then derived from it, per_device_train_batch_size and the "
            "launched world size, so the same recipe trains at the same batch on 8 GPUs or 64; it must divide."
        },
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={
            "help": "Recompute each layer's activations in the backward instead of keeping them: less memory, "
            "~20-30% more compute. Unset: on with CUDA (TRL's default), off on a CPU; true or false is kept "
            "on every device."
        },
    )


def rename_deprecated(config, renamed: dict[str, str]) -> None:
    """Old key -> its new name: a recipe that still sets the old key gets it mapped, with one warning line.

    Call it first in `__post_init__`; the old field stays on the dataclass (default None) so old recipes parse."""
    for old, new in renamed.items():
        value = getattr(config, old, None)
        if value is None:
            continue
        logger.warning(
            "%s: '%s' is deprecated, use '%s' (same meaning); %s=%r", type(config).__name__, old, new, new, value
        )
        setattr(config, new, value)
        setattr(config, old, None)


def check_launch() -> None:
    """Refuse, in one line, a launch the stage cannot honour. FSDP on a CPU: accelerate silently turns it into
    plain DDP (no sharding), so a run that would not fit on the GPUs it is meant for "works" here."""
    import torch

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not torch.cuda.is_available():
        raise ValueError(
            "FSDP needs CUDA GPUs (on a CPU accelerate runs it as plain DDP): launch with "
            "recipes/accelerate/ddp.yaml, zero2.yaml or zero3.yaml on this machine"
        )


def apply_global_batch(
    args,
    world_size: int | None = None,
    per_device: str = "per_device_train_batch_size",
    accumulation: str = "gradient_accumulation_steps",
) -> None:
    """`global_batch_size` -> `accumulation` = global / (`per_device` x world size), on any config that names its
    per-rank batch and its accumulation (TRL's names by default; pretraining's micro_batch_size and
    grad_accum_steps); the world size is the launcher's (WORLD_SIZE). A global batch the ranks cannot split evenly
    is refused."""
    target = getattr(args, "global_batch_size", None)
    if not target:
        return
    if world_size is None:
        world_size = launched_world_size()
    rows = getattr(args, per_device)
    per_step = rows * world_size
    if target % per_step:
        raise ValueError(
            f"global_batch_size={target} is not a multiple of {per_device} x ranks = {rows} x {world_size} = "
            f"{per_step}: change {per_device} or the number of processes, or unset global_batch_size and set "
            f"{accumulation}"
        )
    setattr(args, accumulation, target // per_step)
    logger.info(
        "global batch %d = %d per device x %d ranks x %d accumulation steps",
        target,
        rows,
        world_size,
        target // per_step,
    )
