"""Config dataclasses shared by every stage.

Stage-specific configs subclass TRL's (`align.sft.SFTConfig(StageArgs, trl.SFTConfig)`, ...) and live beside
their stage; this module holds what every script takes: `ScriptArguments` (data and run options), TRL's
`ModelConfig` (model id, dtype, LoRA / QLoRA fields), re-exported so scripts import one place, `StageArgs` (the
fields every post-training stage adds) and `rename_deprecated` (an old key name kept as an alias of its new one).
Every field has help text (`--help` prints it); a recipe key equals a field name.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field

import trl
from trl import ModelConfig

from align.distributed import launched_world_size

__all__ = ["ScriptArguments", "ModelConfig", "StageArgs", "rename_deprecated"]

logger = logging.getLogger(__name__)


@dataclass
class ScriptArguments(trl.ScriptArguments):
    dataset_args: dict | None = field(
        default=None,
        metadata={"help": "Keyword arguments for a builtin source, e.g. {families: [arithmetic], num: 2000, mode: think}."},
    )
    dataset_mixture: dict | None = field(
        default=None,
        metadata={
            "help": "A weighted mixture instead of dataset_name: {datasets: [{id, config, split, columns, weight, "
            "args}], seed, weighting (share | fraction), test_split_size}. Each id is a hub id, a local file/dir "
            "(a hub-shaped repo too) or builtin:NAME."
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
        metadata={"help": "On a NaN/inf loss or an exploding gradient: 'skip' the update, or 'stop' with a checkpoint."},
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

    def __post_init__(self):
        if self.dataset_mixture is not None:
            if not isinstance(self.dataset_mixture, dict) or not self.dataset_mixture.get("datasets"):
                raise ValueError(
                    "dataset_mixture must be a mapping with a non-empty 'datasets' list, "
                    "e.g. {datasets: [{id: builtin:tasks, weight: 1.0}]}"
                )
        if self.on_nonfinite not in ("skip", "stop"):
            raise ValueError(f"on_nonfinite={self.on_nonfinite!r}: choose 'skip' or 'stop'")
        if self.test_split_size is not None and self.test_split_size <= 0:
            raise ValueError(f"test_split_size must be > 0 (a fraction or a row count), got {self.test_split_size}")


@dataclass
class StageArgs:
    """Fields every post-training stage's config adds to TRL's (mixed in before the TRL config class)."""

    merge_lora_on_save: bool = field(
        default=True,
        metadata={"help": "With LoRA: save the merged model to output_dir (the adapter goes to output_dir/adapter); "
                  "false saves the adapter alone to output_dir."},
    )
    global_batch_size: int | None = field(
        default=None,
        metadata={"help": "Sequences per optimizer step over all ranks, as published recipes state it (SmolLM3's SFT: "
                  "128). gradient_accumulation_steps is then derived from it, per_device_train_batch_size and the "
                  "launched world size, so the same recipe trains at the same batch on 8 GPUs or 64; it must divide."},
    )
    gradient_checkpointing: bool | None = field(
        default=None,
        metadata={"help": "Recompute each layer's activations in the backward instead of keeping them: less memory, "
                  "~20-30% more compute. Unset: on with CUDA (TRL's default), off on a CPU; true or false is kept "
                  "on every device."},
    )


def rename_deprecated(config, renamed: dict[str, str]) -> None:
    """Old key -> its new name: a recipe that still sets the old key gets it mapped, with one warning line.

    Call it first in `__post_init__`; the old field stays on the dataclass (default None) so old recipes parse."""
    for old, new in renamed.items():
        value = getattr(config, old, None)
        if value is None:
            continue
        logger.warning("%s: '%s' is deprecated, use '%s' (same meaning); %s=%r", type(config).__name__, old, new,
                       new, value)
        setattr(config, new, value)
        setattr(config, old, None)


def check_launch() -> None:
    """Refuse, in one line, a launch the stage cannot honour. FSDP on a CPU: accelerate silently turns it into
    plain DDP (no sharding), so a run that would not fit on the GPUs it is meant for "works" here."""
    import torch

    if os.environ.get("ACCELERATE_USE_FSDP", "false").lower() == "true" and not torch.cuda.is_available():
        raise ValueError(
            "FSDP needs CUDA GPUs (on a CPU accelerate runs it as plain DDP): launch with "
            "recipes/accelerate_configs/ddp.yaml, zero2.yaml or zero3.yaml on this machine"
        )


def cpu_bf16_slower(requested: bool) -> bool:
    """Whether a CPU run's requested bf16 autocast should fall back to fp32: the CPU has no native bf16 (AVX512-BF16
    or AMX), where oneDNN emulates bf16 matmuls and autocast runs several times slower than fp32 (seen on a 2-core
    AVX-512 Xeon without them, not yet measured on an idle machine); on a CPU that has it bf16 is the faster one.
    Logs one line when it falls back. SMOLALIGN_CPU_BF16=1 keeps bf16 (the tests of bf16 autocast's own mechanics
    set it through the `keep_bf16` fixture; scripts/benchmark.py sets it); SMOLALIGN_CPU_BF16=0 trains in fp32 on
    every CPU, silently (the test suite sets it, so what its tests learn does not depend on the CPU they run on)."""
    import torch

    flag = os.environ.get("SMOLALIGN_CPU_BF16")
    if not requested or torch.cuda.is_available() or flag == "1":
        return False
    if flag == "0":
        return True
    native = any(getattr(torch.cpu, f, lambda: False)() for f in ("_is_avx512_bf16_supported", "_is_amx_tile_supported"))
    if not native:
        logger.warning("bf16 -> fp32: this CPU has no native bf16 (AVX512-BF16 or AMX), where bf16 autocast runs "
                       "several times slower than fp32; set SMOLALIGN_CPU_BF16=1 to keep bf16")
    return not native


KEEP_FREED_CEILING = 256 << 20  # bytes: freed blocks up to this stay in the process (keep_freed_memory)
_KEPT = {"on": False}  # whether keep_freed_memory applied in this process


def keep_freed_memory() -> bool:
    """CPU training: keep freed memory in the process instead of handing it back to the OS.

    glibc serves every block over 32 MB (a step's logits, activations, gradients) with a fresh mmap and returns it
    on free, so every step re-faults every page of them. On these VMs that cost 10% of an SmolLM2-135M training step,
    and 35-45% once a vLLM engine lives in the same process (measured: forward+backward of 16 x 160 tokens, 4.5 s ->
    6-7 s after `LLM(...)`; 4.1-4.5 s either way with this). Blocks up to KEEP_FREED_CEILING are kept; bigger ones
    (whole-vocabulary logits: a preference batch of 16 x 320 tokens over SmolLM2's 49k vocabulary is 1 GB in fp32)
    still come from mmap and go back on free: kept in a heap that never shrinks, blocks that large and of a size that
    changes with every batch's longest sequence left the heap fragmented and growing (the 135M APO grew to 24 GB and
    was killed at step 69 of 159, where glibc's defaults held 10.2 GB). Set SMOLALIGN_KEEP_FREED_MEMORY=0 to keep
    glibc's defaults. Returns whether it applied."""
    if os.environ.get("SMOLALIGN_KEEP_FREED_MEMORY", "1") == "0" or not os.uname().sysname == "Linux":
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, ...): nothing to tune
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    _KEPT["on"] = bool(libc.mallopt(m_mmap_threshold, KEEP_FREED_CEILING)
                       and libc.mallopt(m_trim_threshold, 2**31 - 1) and libc.mallopt(m_top_pad, 64 << 20))
    return _KEPT["on"]


def _meminfo() -> tuple[int, int]:
    """(MemAvailable, MemTotal) in kB, from /proc/meminfo."""
    fields = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    return int(fields["MemAvailable"].split()[0]), int(fields["MemTotal"].split()[0])


def trim_if_memory_low(min_available: float = 0.2) -> bool:
    """keep_freed_memory's safety valve, called after every training step (align.stage.train): when the machine has
    less than `min_available` of its memory left, hand the kept free memory back (glibc's malloc_trim). A heap that
    keeps what it frees still fragments under shapes that change every batch (the 135M APO: 12 -> 16 GB over 30 steps
    with blocks under the ceiling kept); this costs one round of page faults when it fires and nothing otherwise.
    Returns whether it trimmed."""
    if not _KEPT["on"]:
        return False
    try:
        available, total = _meminfo()
    except (OSError, KeyError, ValueError):
        return False
    if available >= min_available * total:
        return False
    import ctypes

    ctypes.CDLL("libc.so.6").malloc_trim(0)
    return True


def apply_global_batch(args, world_size: int | None = None) -> None:
    """`global_batch_size` -> gradient_accumulation_steps = global / (per_device_train_batch_size x world size);
    the world size is the launcher's (WORLD_SIZE). A global batch the ranks cannot split evenly is refused."""
    target = getattr(args, "global_batch_size", None)
    if not target:
        return
    if world_size is None:
        world_size = launched_world_size()
    per_step = args.per_device_train_batch_size * world_size
    if target % per_step:
        raise ValueError(
            f"global_batch_size={target} is not a multiple of per_device_train_batch_size x ranks = "
            f"{args.per_device_train_batch_size} x {world_size} = {per_step}: change per_device_train_batch_size or "
            "the number of processes, or unset global_batch_size and set gradient_accumulation_steps"
        )
    args.gradient_accumulation_steps = target // per_step
    logger.info("global batch %d = %d per device x %d ranks x %d accumulation steps", target,
                args.per_device_train_batch_size, world_size, args.gradient_accumulation_steps)


def apply_device_defaults(args) -> None:
    """Make a TRL/transformers training config run on the machine at hand. Call it at the top of a
    stage config's `__post_init__`, before `super().__post_init__()`.

    TRL defaults to bf16=True and gradient checkpointing, which on a CPU-only machine either
    refuses to start ("Your setup doesn't support bf16/gpu") or runs ~20% slower for memory we do
    not need. Without CUDA we set `use_cpu=True` (bf16 then means CPU autocast: faster matmuls where the CPU
    has native bf16, fp32 instead where it has not: `cpu_bf16_slower`), leave checkpointing off unless the recipe
    asks for it (`gradient_checkpointing: true` is kept on a CPU: a rehearsal runs the GPU's path, and a big batch
    may need it), and keep freed memory in the process (`keep_freed_memory`).
    """
    import torch

    check_launch()
    apply_global_batch(args)
    if not torch.cuda.is_available():
        args.use_cpu = True
        keep_freed_memory()
        if cpu_bf16_slower(getattr(args, "bf16", False)):
            args.bf16 = False
    if getattr(args, "gradient_checkpointing", False) is None:  # StageArgs' unset: TRL's default on CUDA only
        args.gradient_checkpointing = torch.cuda.is_available()
    if getattr(args, "report_to", None) in (None, "all", ["all"]):
        args.report_to = "none"
