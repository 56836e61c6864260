"""The machine at hand: the device defaults a config takes on it, and the one process setup each stage runs.

`apply_device_defaults(args)` (from a stage config's `__post_init__`) only sets config values: `use_cpu` without
CUDA, bf16 autocast only where the CPU has native bf16 (`cpu_bf16_slower`), gradient checkpointing off on a CPU
unless asked for, `report_to`. `setup_process()` (from each stage's `main`, once) is where the process itself is
tuned: glibc's allocator on a CPU (`align.runtime.memory.keep_freed_memory`), logged once.
"""

from __future__ import annotations

import logging
import os

from align.config import apply_global_batch, check_launch
from align.runtime.memory import keep_freed_memory

logger = logging.getLogger(__name__)


def cpu_bf16_slower(requested: bool) -> bool:
    """Whether a CPU run's requested bf16 autocast should fall back to fp32: the CPU has no native bf16 (AVX512-BF16
    or AMX), where oneDNN emulates bf16 matmuls and autocast runs several times slower than fp32 (an AVX-512
    Xeon without them); on a CPU that has it bf16 is the faster one.
    Logs one line when it falls back. SMOLALIGN_CPU_BF16=1 keeps bf16 (the tests of bf16 autocast's own mechanics
    set it through the `keep_bf16` fixture; scripts/benchmark.py sets it); SMOLALIGN_CPU_BF16=0 trains in fp32 on
    every CPU, silently (the test suite sets it, so what its tests learn does not depend on the CPU they run on)."""
    import torch

    flag = os.environ.get("SMOLALIGN_CPU_BF16")
    if not requested or torch.cuda.is_available() or flag == "1":
        return False
    if flag == "0":
        return True
    native = any(
        getattr(torch.cpu, f, lambda: False)() for f in ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    )
    if not native:
        logger.warning(
            "bf16 -> fp32: this CPU has no native bf16 (AVX512-BF16 or AMX), where bf16 autocast runs "
            "several times slower than fp32; set SMOLALIGN_CPU_BF16=1 to keep bf16"
        )
    return not native


def apply_device_defaults(args) -> None:
    """Make a TRL/transformers training config run on the machine at hand. Call it at the top of a
    stage config's `__post_init__`, before `super().__post_init__()`.

    TRL defaults to bf16=True and gradient checkpointing, which on a CPU-only machine either
    refuses to start ("Your setup doesn't support bf16/gpu") or runs ~20% slower for memory we do
    not need. Without CUDA we set `use_cpu=True` (bf16 then means CPU autocast: faster matmuls where the CPU
    has native bf16, fp32 instead where it has not: `cpu_bf16_slower`), leave checkpointing off unless the recipe
    asks for it (`gradient_checkpointing: true` is kept on a CPU: a rehearsal runs the GPU's path, and a big batch
    may need it). Only the config changes: the process is tuned by `setup_process`, which the stage's main calls.
    """
    import torch

    check_launch()
    apply_global_batch(args)
    if not torch.cuda.is_available():
        args.use_cpu = True
        if cpu_bf16_slower(getattr(args, "bf16", False)):
            args.bf16 = False
    if getattr(args, "gradient_checkpointing", False) is None:  # StageArgs' unset: TRL's default on CUDA only
        args.gradient_checkpointing = torch.cuda.is_available()
    if getattr(args, "report_to", None) in (None, "all", ["all"]):
        args.report_to = "none"


_SETUP = {"done": False}


def setup_process() -> None:
    """Tune this process for training on the machine at hand, once (each stage's main calls it before loading a
    model; a second call does nothing). On a CPU: keep freed memory in the process (`keep_freed_memory`), so that a
    step does not re-fault the pages of the last one's large tensors. Logs what it did, once."""
    import torch

    if _SETUP["done"]:
        return
    _SETUP["done"] = True
    if torch.cuda.is_available():
        return
    kept = keep_freed_memory()
    logger.info(
        "process setup: CPU, freed memory kept in the process: %s",
        "yes" if kept else "no (not glibc, or SMOLALIGN_KEEP_FREED_MEMORY=0)",
    )
