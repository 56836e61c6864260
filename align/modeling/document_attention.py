"""Causal attention inside each document of a packed row, with no mask: what makes SFT's packed rows fast.

Why: a packed [B, T] row holds several documents whose position ids restart at 0. transformers turns restarting
positions into a block-diagonal [B, 1, T, T] mask, and sdpa given a mask runs its unfused kernel over the whole row:
T x T scores per row however short the documents, plus building the mask. Here the documents of the batch are
gathered into right-padded [documents, heads, length, head_dim] batches and attended with causal sdpa calls, one per
length class (1-32, 33-64, ..., tokens): right padding needs no mask (a causal query never reaches the pad keys
after it), so sdpa takes its fused kernel, and the work is about the sum of the documents' squared lengths instead
of rows x T x T. The outputs go back to their positions; pad rows get no gradient.

    with document_attention(model):           # forward AND backward (gradient checkpointing re-runs the forward)
        loss = model(input_ids=ids, position_ids=positions, labels=labels).loss
        loss.backward()

Registered as the attention implementation `sdpa_documents`, with a mask function that builds no mask for packed
rows and sdpa's mask when a padding mask is given. Outside the context the model's own implementation (sdpa) runs,
so generation with a KV cache is untouched; inside it, a call with a mask or without position ids falls back to
plain sdpa.
"""

from __future__ import annotations

import contextlib
import weakref

import torch
import torch.nn.functional as F

from align.modeling.cpu_attention import sdpa_cpu_fp32

NAME = "sdpa_documents"
_CACHE: dict = {}  # one forward's document index, reused by every layer (see `_index`)


def document_index(position_ids: torch.Tensor) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """[(index (N, L) into the flattened B*T positions, valid (N, L)), ...] per length class: each row of an index
    lists one document's positions, right-padded with its first position."""
    flat = position_ids.reshape(-1)
    t = position_ids.shape[-1]
    starts = position_ids == 0
    starts[:, 0] = True  # a row always starts a document
    begin = starts.reshape(-1).nonzero().squeeze(-1)  # (N,)
    row_end = (begin // t + 1) * t
    end = torch.cat([begin[1:], begin.new_tensor([flat.numel()])])
    end = torch.minimum(end, row_end)  # a document never runs into the next row
    lengths = end - begin
    out = []
    classes = torch.ceil(torch.log2(lengths.clamp(min=32).float() / 32)).long()  # 0: <=32, 1: <=64, ...
    for c in classes.unique().tolist():
        docs = (classes == c).nonzero().squeeze(-1)
        longest = int(lengths[docs].max())
        offsets = torch.arange(longest, device=flat.device)
        valid = offsets[None, :] < lengths[docs, None]  # (n, L)
        index = torch.where(valid, begin[docs, None] + offsets[None, :], begin[docs, None])
        out.append((index, valid))
    return out


def _index(position_ids: torch.Tensor, batch: int):
    """The document index of `position_ids` (expanded to `batch` rows), computed once per forward: every layer gets the
    same tensor object. The cache holds that object by weak reference, never by address: a later forward's position
    ids allocated where a freed tensor lay (the chunks of one log-prob pass do that) must not reuse its layout. A
    change in place is seen by the tensor's version counter; an inference tensor (generation under
    `torch.inference_mode`) has none, so its content is compared with the cached copy instead."""
    ref = _CACHE.get("ref")
    inference = position_ids.is_inference()
    key = (None if inference else position_ids._version, tuple(position_ids.shape), batch)
    if (
        ref is None
        or ref() is not position_ids
        or _CACHE["key"] != key
        or (inference and not torch.equal(_CACHE["content"], position_ids))
    ):
        expanded = position_ids.expand(batch, -1) if position_ids.shape[0] != batch else position_ids
        _CACHE.clear()
        _CACHE.update(ref=weakref.ref(position_ids), key=key, value=document_index(expanded))
        if inference:
            _CACHE["content"] = position_ids.clone()
    return _CACHE["value"]


def sdpa_documents(
    module,
    query,
    key,
    value,
    attention_mask,
    dropout: float = 0.0,
    scaling: float | None = None,
    position_ids: torch.Tensor | None = None,
    **kwargs,
):
    """transformers attention-function signature: query (B, H, T, D), key/value (B, Hkv, T, D) -> ((B, T, H, D),
    None)."""
    if attention_mask is not None or position_ids is None or query.shape[2] != key.shape[2]:
        return sdpa_cpu_fp32(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs)
    b, h, t, d = query.shape
    hkv = key.shape[1]
    q = query.transpose(1, 2).reshape(b * t, h, d)
    k = key.transpose(1, 2).reshape(b * t, hkv, d)
    v = value.transpose(1, 2).reshape(b * t, hkv, d)
    out = None
    gqa = hkv != h
    # On a CPU, sdpa's fused kernel is fast in fp32 and slow in bf16 for many short documents (forward + backward of
    # 32 documents x 128 tokens: 9.9 ms fp32 vs 37 ms bf16; 64 x 32: 2.1 vs 16 ms): attend in fp32 there, under
    # autocast too (the projections around it keep bf16).
    cpu = query.device.type == "cpu"
    for index, valid in _index(position_ids, b):
        qd, kd, vd = (x[index].transpose(1, 2) for x in (q, k, v))  # (n, heads, L, D)
        if cpu:
            qd, kd, vd = qd.float(), kd.float(), vd.float()
        with torch.autocast("cpu", enabled=False) if cpu else contextlib.nullcontext():
            od = F.scaled_dot_product_attention(
                qd,
                kd,
                vd,
                is_causal=True,
                scale=scaling,
                enable_gqa=gqa,
                dropout_p=dropout if module.training else 0.0,
            )
        if out is None:
            out = od.new_zeros(b * t, h, d)
        out = out.index_put((index[valid],), od.transpose(1, 2)[valid])
    # the queries' dtype: bf16 weights (DeepSpeed's bf16, no autocast) need bf16 back; autocast takes either
    return out.view(b, t, h, d).to(query.dtype), None


def document_mask(*args, attention_mask: torch.Tensor | None = None, **kwargs):
    """The mask transformers builds for `sdpa_documents`: none for packed rows (the documents come from the position
    ids), sdpa's own when a padding mask is given (the attention then falls back to sdpa)."""
    if attention_mask is None:
        return None
    from transformers.masking_utils import sdpa_mask

    return sdpa_mask(*args, attention_mask=attention_mask, **kwargs)


def register() -> None:
    from transformers import AttentionInterface
    from transformers.masking_utils import AttentionMaskInterface

    AttentionInterface.register(NAME, sdpa_documents)
    AttentionMaskInterface.register(NAME, document_mask)


@contextlib.contextmanager
def document_attention(model):
    """Run `model` (and its backward) with per-document attention on packed rows; restore its implementation after."""
    register()
    config = model.config
    saved = config._attn_implementation
    config._attn_implementation = NAME
    try:
        yield model
    finally:
        config._attn_implementation = saved
        _CACHE.clear()
