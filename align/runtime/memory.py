"""Memory on a CPU: keep freed blocks in the process, and hand them back when the machine runs low.

`keep_freed_memory` tunes glibc's allocator once per process (called by `align.runtime.device.setup_process`);
`trim_if_memory_low` is its valve, called after every training step (`align.stage.train`).
"""

from __future__ import annotations

import os

KEEP_FREED_CEILING = 256 << 20  # bytes: freed blocks up to this stay in the process (keep_freed_memory)


_KEPT = {"on": False}  # whether keep_freed_memory applied in this process


def keep_freed_memory() -> bool:
    """CPU training: keep freed memory in the process instead of handing it back to the OS.

    glibc serves every block over 32 MB (a step's logits, activations, gradients) with a fresh mmap and returns it
    on free, so every step re-faults every page of them; the cost grows when a vLLM engine lives in the same
    process. Blocks up to KEEP_FREED_CEILING are kept in the heap. Bigger ones (whole-vocabulary logits: a
    preference batch of 16 x 320 tokens over a 49k vocabulary is 1 GB in fp32) still come from mmap and go back on
    free: blocks that large, of a size that changes with every batch's longest sequence, would leave a heap that
    never shrinks fragmented and growing. Set SMOLALIGN_KEEP_FREED_MEMORY=0 to keep glibc's defaults. Returns
    whether it applied."""
    if os.environ.get("SMOLALIGN_KEEP_FREED_MEMORY", "1") == "0" or not os.uname().sysname == "Linux":
        return False
    import ctypes

    try:
        libc = ctypes.CDLL("libc.so.6")
    except OSError:  # not glibc (musl, ...): nothing to tune
        return False
    m_trim_threshold, m_top_pad, m_mmap_threshold = -1, -2, -3
    _KEPT["on"] = bool(
        libc.mallopt(m_mmap_threshold, KEEP_FREED_CEILING)
        and libc.mallopt(m_trim_threshold, 2**31 - 1)
        and libc.mallopt(m_top_pad, 64 << 20)
    )
    return _KEPT["on"]


def _meminfo() -> tuple[int, int]:
    """(MemAvailable, MemTotal) in kB, from /proc/meminfo."""
    fields = dict(line.split(":", 1) for line in open("/proc/meminfo"))
    return int(fields["MemAvailable"].split()[0]), int(fields["MemTotal"].split()[0])


def trim_if_memory_low(min_available: float = 0.2) -> bool:
    """keep_freed_memory's safety valve, called after every training step (align.stage.train): when the machine has
    less than `min_available` of its memory left, hand the kept free memory back (glibc's malloc_trim). A heap that
    keeps what it frees still fragments under shapes that change every batch (a 135M model's APO grows by a third over
    30 steps with blocks under the ceiling kept); this costs one round of page faults when it fires and nothing
    otherwise. Returns whether it trimmed."""
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
