"""Shared measuring helpers for the benchmark suites.

Machines here are shared and noisy, so suites alternate ours/baseline repetitions inside ONE run
and compare medians; a ratio is trustworthy, an absolute time is not.
"""

from __future__ import annotations

import gc
import resource
import statistics
import time
from collections.abc import Callable, Sequence

import torch


def measure_matmul_peak(dtype: torch.dtype = torch.float32, n: int = 1024, reps: int = 5) -> float:
    """Achievable matmul FLOP/s on this machine for `dtype` (the denominator of MFU): the faster of `a @ b` (MKL for
    fp32 on x86) and oneDNN's prepacked linear, which on an AMD EPYC runs fp32 at ~2x MKL."""
    a = torch.randn(n, n, dtype=dtype)
    b = torch.randn(n, n, dtype=dtype)
    products = [lambda: a @ b]
    if torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight"):
        try:
            packed = torch.ops.mkldnn._reorder_linear_weight(b.t().contiguous(), n)  # linear(a, W) = a @ W.T = a @ b
            products.append(lambda: torch.ops.mkldnn._linear_pointwise(a, packed, None, "none", [], ""))
        except RuntimeError:  # a dtype this oneDNN build does not pack
            pass
    best = float("inf")
    for product in products:
        for _ in range(2):
            product()
        times = []
        for _ in range(reps):
            t = time.perf_counter()
            product()
            times.append(time.perf_counter() - t)
        best = min(best, statistics.median(times))
    return 2 * n**3 / best


def peak_rss_mb() -> float:
    """Peak resident memory of this process so far (MiB)."""
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def current_rss_mb() -> float:
    with open("/proc/self/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return float("nan")


def median_time(fn: Callable[[], object], reps: int = 3, warmup: int = 1) -> float:
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(reps):
        gc.collect()
        t = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t)
    return statistics.median(times)


def alternate(fns: dict[str, Callable[[], float]], reps: int) -> dict[str, list[float]]:
    """Call each fn in turn, `reps` rounds, so drift on a shared machine hits all of them alike.
    Each fn returns one measurement (e.g. tokens/s); returns all measurements per name."""
    out: dict[str, list[float]] = {name: [] for name in fns}
    for _ in range(reps):
        for name, fn in fns.items():
            gc.collect()
            out[name].append(fn())
    return out


def relative_spread(samples: Sequence[float]) -> float | None:
    """How far the single measurements behind a median ratio lie apart: (max - min) / median.
    None below two measurements (one says nothing of its noise)."""
    if len(samples) < 2:
        return None
    return (max(samples) - min(samples)) / statistics.median(samples)


def summary_line(
    suite: str, what: str, unit: str, ratio: float, target: float, samples: Sequence[float] | None = None
) -> str:
    """The one-line shape scripts read:
    `pretrain: ours/plain-torch tokens-per-s ratio 0.97 (target >= 0.95)`.

    `samples`: the ratio of each single measurement behind `ratio` (each alternating repetition,
    or each timed step where a suite repeats once). Their spread follows the shape as
    `[spread 4.1% of 3 ratios]`: the noise `benchmark.py compare` holds a later drop against."""
    line = f"{suite}: {what} {unit} ratio {ratio:.2f} (target >= {target:g})"
    spread = relative_spread(samples or [])
    return line if spread is None else f"{line} [spread {spread:.1%} of {len(samples)} ratios]"
