"""DAPO's dynamic sampling: which groups carry a learning signal, and the batch merged from several rounds."""

from __future__ import annotations

import math
from collections.abc import Callable

import torch


def group_has_signal(rewards: torch.Tensor, num_generations: int, atol: float = 1e-6) -> torch.Tensor:
    """(G,) bool: which groups of `num_generations` consecutive rewards (B,) vary (DAPO keeps only those).

    NaN rewards (every reward abstained) are ignored; a group with fewer than two scored completions has none.
    >>> group_has_signal(torch.tensor([1., 1., 0., 1., 0., 0., float("nan"), 1.]), 2).tolist()
    [False, True, False, False]
    """
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}")
    grouped = rewards.view(-1, num_generations).float()
    valid = ~torch.isnan(grouped)
    hi = torch.where(valid, grouped, torch.full_like(grouped, -math.inf)).amax(dim=1)
    lo = torch.where(valid, grouped, torch.full_like(grouped, math.inf)).amin(dim=1)
    return (valid.sum(dim=1) >= 2) & ((hi - lo) > atol)


def _pad_cat(tensors: list[torch.Tensor], value: float, left: bool) -> torch.Tensor:
    """Concatenate (B_i, T_i) tensors along dim 0, padding dim 1 to the widest (left or right)."""
    width = max(t.size(1) for t in tensors)
    out = []
    for t in tensors:
        pad = width - t.size(1)
        if pad:
            filler = t.new_full((t.size(0), pad, *t.shape[2:]), value)
            t = torch.cat([filler, t] if left else [t, filler], dim=1)
        out.append(t)
    return torch.cat(out, dim=0)


def merge_batches(
    parts: list[tuple[dict, torch.Tensor]], pad_token_id: int, gather: Callable[[torch.Tensor], torch.Tensor]
) -> dict:
    """Rows `idx` of each scored batch, merged into one (prompt tensors left-padded, completion tensors right-padded).
    `num_items_in_batch` is recounted from the merged masks over every rank, as TRL counts it: `gather` is the
    trainer's `accelerator.gather` (every rank calls this), and TRL's dapo/cispo normaliser divides the count by the
    number of processes, so each rank's tokens weigh 1 / (every rank's tokens): one global token mean."""
    assert parts, "merge_batches needs at least one part"
    merged: dict = {}
    for key, first in parts[0][0].items():
        if key == "num_items_in_batch":
            continue
        if not isinstance(first, torch.Tensor):
            raise ValueError(
                f"dynamic_sampling cannot merge the batch field {key!r} (multimodal inputs are unsupported)"
            )
        chunks = [batch[key][idx] for batch, idx in parts]
        if first.dim() == 1:
            merged[key] = torch.cat(chunks)
        else:
            value = pad_token_id if key in ("prompt_ids", "completion_ids") else (1 if key == "tool_mask" else 0)
            merged[key] = _pad_cat(chunks, value, left=key.startswith("prompt"))
    mask = merged["completion_mask"] * merged["tool_mask"] if "tool_mask" in merged else merged["completion_mask"]
    merged["num_items_in_batch"] = gather(mask.sum()).sum()
    return merged
