"""Padding-free log-prob passes for RL: every sequence's real tokens in one row, so a pass costs the tokens generated.

Why: TRL's GRPO loss pass runs the model on the padded batch, (rows x (longest prompt + longest completion)), so with
completions of mixed length most of a pass is padding (uniform 16-512 tokens: about half). `packed_logps` drops the
padding: the rows' tokens are laid end to end in one row whose position ids restart at every sequence, each
sequence attends only to itself (on a CPU through `align.modeling.document_attention`: causal sdpa per length class; on
a GPU with `attn_implementation: flash_attention_2`, transformers' varlen kernel reads the restarting position ids),
and TRL's fused LM head scores only the completion tokens, with labels shifted inside each sequence (never across a
boundary). The result is laid back out as TRL's (rows, logits_to_keep) log-probs (and entropies), so the loss,
importance sampling and `tool_mask` see the same tensors as on the padded path (tests/test_grpo.py: equal to 1e-5,
gradients too).

    with packed_attention(model):  # forward AND backward: gradient checkpointing re-runs the forward
        logps, entropies = packed_logps(model, input_ids, attention_mask, logits_to_keep, compute_entropy=True)
"""

from __future__ import annotations

import contextlib

import torch

from align.modeling.document_attention import document_attention


def _flash(model) -> bool:
    impl = getattr(model.config, "_attn_implementation", None) or ""
    return impl.startswith("flash_attention") or impl == "kernels-community/flash-attn"  # GPU only


@contextlib.contextmanager
def packed_attention(model):
    """Per-sequence attention on packed rows around a forward and its backward (a no-op under flash-attention, whose
    varlen path follows the position ids). `model` may be wrapped (DDP, DeepSpeed): its config is the inner one's."""
    from accelerate.utils import extract_model_from_parallel

    inner = extract_model_from_parallel(model)  # DDP, DeepSpeed, torch.compile wrappers
    if _flash(inner):  # GPU branch: transformers' flash-attention reads packed sequences from the position ids
        yield
        return
    with document_attention(inner):
        yield


def pack(input_ids: torch.Tensor, attention_mask: torch.Tensor, logits_to_keep: int) -> dict[str, torch.Tensor]:
    """The batch's real tokens in one row: `input_ids` and `position_ids` (1, N) restarting per sequence,
    `shift_labels` (1, N) the next token where it is a completion token of the same sequence (the last
    `logits_to_keep` columns, not padding), else -100; `row`, `col` (N,) where each packed token came from."""
    keep = attention_mask.bool()
    b, t = input_ids.shape
    rows = torch.arange(b, device=input_ids.device)[:, None].expand(b, t)[keep]
    cols = torch.arange(t, device=input_ids.device)[None, :].expand(b, t)[keep]
    ids = input_ids[keep]
    positions = (keep.long().cumsum(dim=1) - 1)[keep]
    scored = cols >= t - logits_to_keep  # a completion column holding a real token
    labels = torch.full_like(ids, -100)
    nxt = (rows[1:] == rows[:-1]) & scored[1:]  # the next packed token: same sequence, and scored
    labels[:-1] = torch.where(nxt, ids[1:], labels[:-1])
    return {
        "input_ids": ids[None],
        "position_ids": positions[None],
        "shift_labels": labels[None],
        "row": rows,
        "col": cols,
    }


def unpack(values: torch.Tensor, packed: dict, shape: tuple[int, int], logits_to_keep: int) -> torch.Tensor:
    """(1, N) per-position values (a position predicts the token after it) -> (rows, logits_to_keep), TRL's layout:
    entry [b, j] belongs to the token at column T - logits_to_keep + j of row b; 0 where there is none."""
    b, t = shape
    out = values.new_zeros(b, logits_to_keep)
    valid = packed["shift_labels"][0] != -100
    target = valid.nonzero().squeeze(-1) + 1  # the predicted token's packed index
    return out.index_put((packed["row"][target], packed["col"][target] - (t - logits_to_keep)), values[0][valid])


def packed_logps(
    model,
    input_ids: torch.Tensor,
    attention_mask: torch.Tensor,
    logits_to_keep: int,
    compute_entropy: bool = False,
    autocast=contextlib.nullcontext,
):
    """TRL's per-token log-probs (and entropies) of the completion tokens, (rows, logits_to_keep), from one packed
    row. `model` takes TRL's fused LM head (`fused_lm_head=True`, `shift_labels`); call inside `packed_attention`."""
    packed = pack(input_ids, attention_mask, logits_to_keep)
    with autocast():
        out = model(
            input_ids=packed["input_ids"],
            position_ids=packed["position_ids"],
            shift_labels=packed["shift_labels"],
            fused_lm_head=True,
        )
    shape = tuple(input_ids.shape)
    logps = unpack(out.log_probs, packed, shape, logits_to_keep)
    entropies = unpack(out.entropy, packed, shape, logits_to_keep) if compute_entropy else None
    return logps, entropies
