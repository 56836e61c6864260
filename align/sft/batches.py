"""SFT's batches on a CPU: length-bucketed batches, and packed rows that stay rows.

- packed rows that stay rows (`packing: true`, `packing_layout: rows`): TRL's bfd packing, but a batch is
  [batch, max_length] rows with restarting position ids and per-document attention instead of TRL's single
  flattened [1, batch*max_length] row, whose attention spans the whole batch on CPU/sdpa (~3x slower).
  Padding is the tail of each bin, a few percent. `packing_layout: flat` keeps TRL's layout, the right one
  for flash-attention varlen kernels on GPUs;
- without packing, `length_bucketing` batches rows of similar length (shuffled batch order) for the same
  padding savings.
"""

from __future__ import annotations

import logging

import torch
from torch.utils.data import Sampler
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

logger = logging.getLogger(__name__)


class LengthBucketSampler(Sampler[int]):
    """Indices such that each run of `batch_size` rows has similar lengths, in a shuffled batch order.

    Per epoch (seeded by seed + epoch, so a resume replays the same order): shuffle, cut into pools of
    `pool_batches` batches, sort each pool by length, cut it into batches, shuffle all batches. Unlike
    transformers' LengthGroupedSampler the order does not run long-to-short within a pool (the preflight
    data-order check and the loss curve both see a shuffled stream).
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int = 0, pool_batches: int = 64):
        self.lengths, self.batch_size, self.seed, self.pool_batches = list(lengths), batch_size, seed, pool_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def batches(self) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        pool = self.batch_size * self.pool_batches
        batches = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool], key=lambda i: self.lengths[i])
            batches += [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]

    def __iter__(self):
        for batch in self.batches():
            yield from batch


class RowPackedCollator(DataCollatorForLanguageModeling):
    """Packed rows kept as [B, max_length] rows (not flattened into one [1, B*max_length] row as TRL's padding-free
    collator does): position ids restart at every document and no attention mask is passed, so transformers
    builds a block-diagonal causal mask per row (document masking) and attention spans max_length, not the batch.
    """

    def torch_call(self, examples: list[dict]) -> dict:
        width = max(len(e["input_ids"]) for e in examples)
        ids = torch.full((len(examples), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        positions = torch.zeros_like(ids)
        for row, e in enumerate(examples):
            n = len(e["input_ids"])
            ids[row, :n] = torch.tensor(e["input_ids"])
            labels[row, :n] = torch.tensor(e.get("labels", e["input_ids"]))
            lengths = list(e.get("seq_lengths") or [n])
            if width > n:
                lengths.append(width - n)  # the tail padding is its own "document", never a label
            positions[row] = torch.cat([torch.arange(k) for k in lengths])
        labels[positions == 0] = -100  # a document's first token is never predicted from the previous document
        return {"input_ids": ids, "labels": labels, "position_ids": positions}


def resolve_packing_layout(layout: str, cuda: bool) -> str:
    """'auto' -> rows on a CPU (per-document sdpa over padded buckets), flat on a GPU (one row with sequence
    boundaries, what flash-attention's varlen kernel takes without the buckets' host syncs). An explicit 'rows' on a
    GPU is kept, with one warning."""
    if layout not in ("auto", "rows", "flat"):
        raise ValueError(f"packing_layout={layout!r}; choose 'auto', 'rows' or 'flat'")
    if layout == "auto":
        return "flat" if cuda else "rows"
    if layout == "rows" and cuda:
        logger.warning(
            "packing_layout: rows on a GPU runs per-bucket sdpa with host syncs; 'flat' (or 'auto') lets "
            "flash-attention's varlen kernel take the packed row"
        )
    return layout
