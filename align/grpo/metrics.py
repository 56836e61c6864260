"""GRPO's training metrics per asked reasoning mode: reward, accuracy, format and length of each mode's rows."""

from __future__ import annotations

from collections.abc import Sequence

import torch

from align.eval.verification import CORRECT_AT
from rewards import mode_format_reward
from rewards.verifier import ACCURACY_VERIFIERS


def per_mode_metrics(
    rows: list[tuple[str | None, int, object]],
    rewards_per_func: torch.Tensor,
    weights: torch.Tensor,
    names: list[str],
    accuracy: list[float | None] | None = None,
) -> dict[str, float]:
    r"""Hybrid reasoning, logged per asked mode: `mode/<m>/reward` (the weighted total), `mode/<m>/<reward name>`,
    `mode/<m>/accuracy` (the accuracy verifier's share at >= 1; `accuracy`, one verifier score a row, when no reward
    is one: `verifier_scores`), `mode/<m>/format` (`mode_format_reward`'s share) and `mode/<m>/length` (completion
    tokens). `rows` = (mode, completion length, completion) per row of `rewards_per_func` (B, F); nothing for rows
    without a mode.

    >>> rows = [("think", 40, "<think>one two three four five six seven eight</think> \\boxed{1}"),
    ...         ("no_think", 6, "\\boxed{2}"), ("no_think", 8, "<think>hm</think> \\boxed{2}")]
    >>> m = per_mode_metrics(rows, torch.tensor([[1.0, 0.0], [0.0, -0.5], [1.0, -1.0]]), torch.tensor([1.0, 0.5]),
    ...                      ["math_reward", "soft_overlong_reward"])
    >>> m["mode/think/reward"], m["mode/no_think/reward"], m["mode/no_think/accuracy"], m["mode/no_think/format"]
    (1.0, 0.125, 0.5, 0.5)
    >>> m["mode/think/length"], m["mode/no_think/length"], m["mode/think/format"]
    (40.0, 7.0, 1.0)
    >>> per_mode_metrics(rows, torch.tensor([[1.0], [0.0], [0.0]]), torch.tensor([1.0]), ["mode_math_reward"],
    ...                  accuracy=[1.0, 1.0, 0.0])["mode/no_think/accuracy"]
    0.5
    """
    if len(rows) != rewards_per_func.shape[0]:
        raise ValueError(f"per_mode_metrics: {len(rows)} rows for {rewards_per_func.shape[0]} rewards")
    per_func = rewards_per_func.detach().float().cpu()
    total = (per_func * weights.float().cpu().unsqueeze(0)).nansum(dim=1)
    column = next((i for i, n in enumerate(names) if n in ACCURACY_VERIFIERS), None)
    if accuracy is not None and len(accuracy) != len(rows):
        raise ValueError(f"per_mode_metrics: {len(accuracy)} accuracy scores for {len(rows)} rows")
    out: dict[str, float] = {}
    for mode in sorted({m for m, _, _ in rows if m in ("think", "no_think")}):
        idx = [i for i, (m, _, _) in enumerate(rows) if m == mode]
        sel = torch.tensor(idx)
        out[f"mode/{mode}/reward"] = total[sel].mean().item()
        for j, name in enumerate(names):
            values = per_func[sel, j]
            if (~torch.isnan(values)).any():
                out[f"mode/{mode}/{name}"] = torch.nanmean(values).item()
        if accuracy is not None or column is not None:
            scored = (
                torch.tensor([s for s in (accuracy[i] for i in idx) if s is not None], dtype=torch.float)
                if accuracy is not None
                else per_func[sel, column][~torch.isnan(per_func[sel, column])]
            )
            if scored.numel():
                out[f"mode/{mode}/accuracy"] = (scored >= CORRECT_AT).float().mean().item()
        fmt = mode_format_reward([rows[i][2] for i in idx], mode=[mode] * len(idx))
        out[f"mode/{mode}/format"] = sum(fmt) / len(fmt)
        out[f"mode/{mode}/length"] = sum(rows[i][1] for i in idx) / len(idx)
    return out


def mean_metric(log_history: Sequence[dict], key: str, last: int | None = None) -> float:
    """Mean of a logged metric over the training log (the last `last` entries when given)."""
    values = [h[key] for h in log_history if key in h]
    values = values[-last:] if last else values
    return sum(values) / len(values) if values else float("nan")
