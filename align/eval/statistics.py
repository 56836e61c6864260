"""The statistics every verdict uses: an accuracy with its interval, and the paired test on the same items.

- **Accuracy** (`accuracy`): the share correct with its item count and a 95% Wilson interval, so a reader can
  tell 2 items in 48 from a real change (`overlaps` says when two results are within noise).
- **Before/after on the same items** (`paired_change`): the exact McNemar test on the items that changed, which
  two overlapping intervals under-power (their widths add the noise of items that did not change).
- **Over seeds** (`paired_over_seeds`, `mean_over_seeds`): the same test pooled over seeds, and a mean with a
  t interval.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

Z_95 = 1.959963984540054  # two-sided 95% normal quantile


def wilson_interval(successes: float, num: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a share `successes / num` (95% by default); (0, 1) without items.

    >>> [round(x, 3) for x in wilson_interval(24, 48)]
    [0.364, 0.636]
    """
    if num <= 0:
        return 0.0, 1.0
    p = min(max(successes / num, 0.0), 1.0)
    denom = 1 + z * z / num
    centre = (p + z * z / (2 * num)) / denom
    half = z * math.sqrt(p * (1 - p) / num + z * z / (4 * num * num)) / denom
    low = 0.0 if p == 0.0 else max(0.0, centre - half)  # exact at the ends (no rounding dust)
    high = 1.0 if p == 1.0 else min(1.0, centre + half)
    return low, high


def accuracy(flags: Sequence[float], key: str = "accuracy") -> dict[str, float]:
    """The share of `flags` (1 correct, 0 not; a tie may count 0.5), its item count and 95% Wilson interval."""
    num = len(flags)
    hits = float(sum(flags))
    low, high = wilson_interval(hits, num)
    return {key: hits / num if num else 0.0, "num": num, "ci_low": low, "ci_high": high}


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Two intervals share a point: the difference between their results is within noise."""
    return a[0] <= b[1] and b[0] <= a[1]


def paired_change(before: Sequence[float], after: Sequence[float], alpha: float = 0.05) -> dict:
    """Did a model get better or worse on the SAME items? The exact (binomial) McNemar test: of the items whose
    outcome changed, `gained` went wrong -> right and `lost` right -> wrong; with no real change either way is a fair
    coin, and `p_value` is the two-sided chance of a split at least this uneven. `significant`: p < `alpha`.

    >>> paired_change([0, 0, 0, 0, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1])
    {'num': 8, 'gained': 6, 'lost': 0, 'p_value': 0.03125, 'significant': True}
    >>> paired_change([1, 0, 1, 0], [0, 1, 1, 0])["p_value"]
    1.0
    """
    if len(before) != len(after):
        raise ValueError(
            f"paired_change: {len(before)} items before, {len(after)} after: a paired test needs the same items"
        )
    gained = sum(1 for b, a in zip(before, after) if a > b)
    lost = sum(1 for b, a in zip(before, after) if a < b)
    changed = gained + lost
    tail = sum(math.comb(changed, i) for i in range(min(gained, lost) + 1)) / 2**changed
    p_value = min(1.0, 2 * tail)
    return {"num": len(before), "gained": gained, "lost": lost, "p_value": p_value, "significant": p_value < alpha}


def paired_over_seeds(runs: Sequence[tuple[Sequence[float], Sequence[float]]], alpha: float = 0.05) -> dict:
    """A variant against a baseline on the same items, once per seed: `runs` = [(baseline outcomes, variant outcomes)
    for each seed]. Is the variant better over seeds?

    Per seed: the exact McNemar test (`paired_change`) and the accuracy difference d_s = (gained - lost) / n. Over
    seeds, stratified by seed: the difference is the pooled one, (all gained - all lost) / all items (every prompt of
    every seed weighs the same, as Mantel-Haenszel's), and its variance is the paired within-seed variance plus the
    spread of the seeds' differences beyond what their items explain (tau^2, DerSimonian-Laird's moment estimate with
    equal weights) over the number of seeds. Items are never pooled across seeds as if independent (the same prompt
    under three seeds is one prompt, not three), and seeds that disagree widen the interval instead of averaging into
    a confident verdict. With seeds that agree (tau^2 = 0) it is the pooled McNemar test's normal form
    (`pooled_p_value`, the exact one, is reported too). `verdict`: better / worse (p < alpha) or within noise.
    (Not inverse-variance weights per seed: a seed where one or two prompts changed would get a near-zero variance
    and outweigh the others.)
    Simulated nulls (tests/test_ablation.py, 3 seeds x 128 prompts): 4.6% false verdicts when seeds differ only by
    item noise; with a real seed-to-seed spread (each model's logit moved by N(0, 0.3), about +-5 points) 12%,
    where pooling every (prompt, seed) pair as independent gives 21%: more seeds, fewer surprises. A +10-point
    variant (256 prompts, 3 seeds) is called better in 98% of draws."""
    if not runs:
        raise ValueError("paired_over_seeds: no runs")
    per_seed, diffs = [], []
    for before, after in runs:
        change = paired_change(before, after, alpha)
        if change["num"] == 0:
            raise ValueError("paired_over_seeds: a seed with no items")
        diffs.append((change["gained"] - change["lost"]) / change["num"])
        per_seed.append({**change, "difference": diffs[-1]})
    k = len(diffs)
    num = sum(r["num"] for r in per_seed)
    gained, lost = sum(r["gained"] for r in per_seed), sum(r["lost"] for r in per_seed)
    estimate = (gained - lost) / num
    # variance of the pooled paired difference; floored at one discordant pair so nothing-changed is not certainty
    within = max(((gained + lost) / num - estimate**2) / num, 1.0 / num**2)
    spread = sum((d - estimate) ** 2 for d in diffs) / (k - 1) if k > 1 else 0.0
    tau2 = max(0.0, spread - k * within)  # a seed's own variance is k x the pooled one (n = num / k items)
    se = math.sqrt(within + tau2 / k)
    p_value = math.erfc(abs(estimate) / se / math.sqrt(2))
    pooled = paired_change([0] * gained + [1] * lost, [1] * gained + [0] * lost)["p_value"]
    verdict = "within noise" if p_value >= alpha else ("better" if estimate > 0 else "worse")
    return {
        "difference": estimate,
        "ci_low": estimate - Z_95 * se,
        "ci_high": estimate + Z_95 * se,
        "p_value": p_value,
        "verdict": verdict,
        "num_seeds": k,
        "tau": math.sqrt(tau2),
        "gained": gained,
        "lost": lost,
        "pooled_p_value": pooled,
        "per_seed": per_seed,
    }


# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30); beyond 30 the normal's is within 4%.
_T_975 = (
    12.706,
    4.303,
    3.182,
    2.776,
    2.571,
    2.447,
    2.365,
    2.306,
    2.262,
    2.228,
    2.201,
    2.179,
    2.160,
    2.145,
    2.131,
    2.120,
    2.110,
    2.101,
    2.093,
    2.086,
    2.080,
    2.074,
    2.069,
    2.064,
    2.060,
    2.056,
    2.052,
    2.048,
    2.045,
    2.042,
)


def mean_over_seeds(shares: Sequence[float], nums: Sequence[int]) -> dict:
    """A metric's mean over seeds with a 95% interval: Student's t over the seeds' values (the seed-to-seed spread,
    never narrower than the items' own binomial noise); one seed: its Wilson interval.

    >>> r = mean_over_seeds([0.25, 0.30, 0.35], [256, 256, 256]); round(r["mean"], 3), round(r["ci_high"], 3)
    (0.3, 0.424)
    """
    k = len(shares)
    if k == 0:
        raise ValueError("mean_over_seeds: no values")
    mean = sum(shares) / k
    if k == 1:
        low, high = wilson_interval(mean * nums[0], nums[0])
        return {"mean": mean, "ci_low": low, "ci_high": high, "num_seeds": 1}
    spread = sum((x - mean) ** 2 for x in shares) / (k - 1)
    binomial = sum(x * (1 - x) / max(n, 1) for x, n in zip(shares, nums)) / k
    half = (_T_975[k - 2] if k - 1 <= len(_T_975) else Z_95) * math.sqrt(max(spread, binomial) / k)
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "num_seeds": k}
