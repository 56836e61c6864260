"""Pretraining's loss: next-token cross-entropy (+ z-loss) of a packed batch, whole or in chunks of positions.

Why chunks: the whole-batch path builds fp32 logits for every position, batch x length x vocabulary (a 64k-token
row of SmolLM3's 128,256-token vocabulary is 33.6 GB), which no GPU holds. `chunk_tokens` applies the LM head and
the cross-entropy to a slice of positions at a time under activation checkpointing: the forward keeps one slice's
logits, the backward recomputes each slice's from its hidden states. Same loss and gradients (summation order
aside), at the cost of one more LM-head pass.

    loss = lm_loss(model, batch)                       # short rows: one pass
    loss = lm_loss(model, batch, chunk_tokens=4096)    # long context: 4,096 positions' logits at a time

`evaluate` is the held-out loss per source on the same function; `to_device` moves a CPU-collated batch to the
model's device.
"""

from __future__ import annotations

import math

import torch
import torch.nn.functional as F
from torch.utils.checkpoint import checkpoint

IGNORE = -100  # targets that carry no loss (F.cross_entropy's default ignore_index)


def lm_loss(model, batch: dict[str, torch.Tensor], z_loss: float = 0.0, chunk_tokens: int = 0) -> torch.Tensor:
    """Mean next-token cross-entropy (+ z-loss) of a packed batch; no attention mask, so the position ids (restarting
    at every document) mask documents. `chunk_tokens` > 0: the logits of that many positions at a time."""
    if chunk_tokens <= 0:
        logits = model(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        logits = logits.float().view(-1, logits.size(-1))  # (B*T, V)
        loss = F.cross_entropy(logits, batch["targets"].view(-1))
        if z_loss:
            loss = loss + z_loss * torch.logsumexp(logits, dim=-1).pow(2).mean()
        return loss
    body = model.get_decoder() if hasattr(model, "get_decoder") else model.model
    hidden = body(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).last_hidden_state
    head = model.get_output_embeddings()
    targets = batch["targets"]
    count = (targets != IGNORE).sum().clamp(min=1)
    ce = z = hidden.new_zeros((), dtype=torch.float32)
    for start in range(0, hidden.size(1), chunk_tokens):
        h, t = hidden[:, start : start + chunk_tokens], targets[:, start : start + chunk_tokens]
        ce_part, z_part = checkpoint(_chunk_loss, h, t, head, bool(z_loss), use_reentrant=False)
        ce, z = ce + ce_part, z + z_part
    loss = ce / count
    return loss + z_loss * z / targets.numel() if z_loss else loss  # z-loss over every position, as the whole path


def _chunk_loss(hidden: torch.Tensor, targets: torch.Tensor, head, with_z: bool) -> tuple[torch.Tensor, torch.Tensor]:
    """Summed cross-entropy and summed squared logsumexp of one slice of positions ((B, t, H) hidden states)."""
    logits = head(hidden).float()  # (B, t, V): the only logits alive at once
    flat = logits.view(-1, logits.size(-1))
    ce = F.cross_entropy(flat, targets.reshape(-1), reduction="sum", ignore_index=IGNORE)
    z = torch.logsumexp(flat, dim=-1).pow(2).sum() if with_z else flat.new_zeros(())
    return ce, z


def to_device(batch: dict[str, torch.Tensor], device) -> dict[str, torch.Tensor]:
    """The stream collates on the CPU; the model may be on a GPU (a no-op on a CPU run)."""
    return {k: v.to(device, non_blocking=True) for k, v in batch.items()}


@torch.no_grad()
def evaluate(model, eval_batches: dict[str, dict], autocast, chunk_tokens: int = 0) -> dict[str, float]:
    """Held-out loss per source and their plain mean (`eval_loss`), plus perplexity."""
    was_training = model.training
    model.eval()
    out = {}
    with autocast():
        for name, batch in eval_batches.items():
            out[f"eval_loss/{name}"] = lm_loss(model, batch, chunk_tokens=chunk_tokens).item()
    model.train(was_training)
    if out:
        out["eval_loss"] = sum(out.values()) / len(out)
        out["eval_ppl"] = math.exp(min(out["eval_loss"], 50))
    return out
