"""align/modeling/document_attention.py: per-document causal attention on packed rows equals attending each document
alone, and equals transformers' own block-diagonal mask, in the forward and the backward."""

import pytest
import torch

from align.modeling.document_attention import document_attention, document_index
from pretrain.model import ModelArguments, build_model


@pytest.fixture(scope="module")
def model():
    args = ModelArguments(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=1, head_dim=16, intermediate_size=128
    )
    return build_model(args, 300, seed=0)


def packed(lengths_per_row: list[list[int]], seed: int = 0):
    """Rows of documents (positions restart at 0), each row filled to the longest with a padding 'document'."""
    g = torch.Generator().manual_seed(seed)
    width = max(sum(r) for r in lengths_per_row)
    ids, pos, docs = (
        torch.zeros(len(lengths_per_row), width, dtype=torch.long),
        torch.zeros(len(lengths_per_row), width, dtype=torch.long),
        [],
    )
    for b, row in enumerate(lengths_per_row):
        start = 0
        for n in [*row, width - sum(row)]:
            if n == 0:
                continue
            doc = torch.randint(5, 300, (n,), generator=g)
            ids[b, start : start + n], pos[b, start : start + n] = doc, torch.arange(n)
            docs.append((b, start, doc))
            start += n
    return ids, pos, docs


def test_the_index_lists_every_position_once_by_length_class():
    _, pos, _ = packed([[7, 40], [3, 70, 2]])
    seen = torch.cat([i[v] for i, v in document_index(pos)])
    assert sorted(seen.tolist()) == list(range(pos.numel()))
    longest = [int(v.sum(1).max()) for _, v in document_index(pos)]
    assert sorted(longest) == longest or len(set(longest)) == len(longest)  # one call per length class


def test_packed_rows_equal_documents_alone_and_the_masked_path(model, monkeypatch):
    import align.modeling.document_attention as da

    calls = []
    real = da._index
    monkeypatch.setattr(da, "_index", lambda *a: calls.append(1) or real(*a))
    model.eval()
    ids, pos, docs = packed([[7, 40], [3, 70]])
    with torch.no_grad():
        masked = model(input_ids=ids, position_ids=pos, use_cache=False).logits  # transformers' block-diagonal mask
        with document_attention(model):
            ours = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        for b, start, doc in docs:
            alone = model(input_ids=doc[None], use_cache=False).logits[0]
            assert torch.allclose(ours[b, start : start + len(doc)], alone, atol=1e-5)
    assert torch.allclose(ours, masked, atol=1e-5)
    assert len(calls) == 2  # per-document attention ran in both layers (no mask, no fallback)
    assert model.config._attn_implementation == "sdpa"  # restored


def test_the_layout_is_computed_once_per_forward_and_never_borrowed_by_address(model, monkeypatch):
    """Every layer reuses the forward's layout; position ids of a later forward at the address a freed tensor held
    (same shape, same version, other boundaries) get their own. numpy hands torch the same buffer twice: two tensors
    with one address, as the allocator does for successive chunks of a pass."""
    import numpy as np

    import align.modeling.document_attention as da

    computed = []
    real = da.document_index
    monkeypatch.setattr(da, "document_index", lambda p: computed.append(1) or real(p))
    model.eval()
    ids = torch.randint(5, 300, (1, 12), generator=torch.Generator().manual_seed(4))
    buffer = np.array([[*range(5), *range(7)]])
    with torch.no_grad(), document_attention(model):
        first = torch.from_numpy(buffer)
        model(input_ids=ids, position_ids=first, use_cache=False)
        address = first.data_ptr()
        del first
        buffer[0] = [*range(9), *range(3)]  # other documents, written where the freed ids lay
        second = torch.from_numpy(buffer)
        assert second.data_ptr() == address and second._version == 0
        ours = model(input_ids=ids, position_ids=second, use_cache=False).logits
    masked = model(input_ids=ids, position_ids=second, use_cache=False).logits
    torch.testing.assert_close(ours, masked, atol=1e-5, rtol=1e-5)
    assert len(computed) == 2  # once per forward, not once per layer


def test_inference_mode_positions_get_their_layout_and_a_change_in_place_a_new_one(model, monkeypatch):
    """Generation under `torch.inference_mode` (the hf engine inside a padding-free training step) hands position ids
    without a version counter: the layout is still computed once per forward, and the same tensor changed in place
    between forwards gets a new one."""
    import align.modeling.document_attention as da

    computed = []
    real = da.document_index
    monkeypatch.setattr(da, "document_index", lambda p: computed.append(1) or real(p))
    model.eval()
    ids = torch.randint(5, 300, (1, 12), generator=torch.Generator().manual_seed(5))
    with torch.inference_mode():
        pos = torch.tensor([[*range(5), *range(7)]])
        with document_attention(model):
            model(input_ids=ids, position_ids=pos, use_cache=False)
            pos.copy_(torch.tensor([[*range(9), *range(3)]]))  # other documents, in the same inference tensor
            ours = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        masked = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    torch.testing.assert_close(ours, masked, atol=1e-5, rtol=1e-5)
    assert len(computed) == 2  # once per forward, not once per layer


def test_gradients_equal_the_masked_path(model):
    model.train()
    ids, pos, _ = packed([[5, 33, 64], [100, 2]], seed=1)

    def grads(per_document: bool):
        model.zero_grad()
        ctx = document_attention(model) if per_document else torch.enable_grad()
        with ctx:
            model(input_ids=ids, position_ids=pos, use_cache=False).logits.square().mean().backward()
        return {n: p.grad.clone() for n, p in model.named_parameters()}

    masked, ours = grads(False), grads(True)
    assert all(torch.allclose(masked[n], ours[n], atol=1e-7, rtol=1e-4) for n in masked)


def test_a_mask_or_a_kv_cache_falls_back_to_sdpa(model):
    model.eval()
    ids = torch.randint(5, 300, (2, 9))
    mask = torch.ones_like(ids)
    mask[1, :4] = 0  # left padding
    with torch.no_grad():
        plain = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        with document_attention(model):
            ours = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
    assert torch.allclose(plain, ours, atol=1e-6)


def test_bf16_autocast_on_the_cpu(model):
    """SFT trains under CPU bf16 autocast: sdpa returns bf16 while the rotated queries are fp32."""
    model.train()
    ids, pos, _ = packed([[5, 33], [40]], seed=2)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        masked = model(input_ids=ids, position_ids=pos, use_cache=False).logits
        with document_attention(model):
            ours = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    ours.float().square().mean().backward()
    assert torch.allclose(ours.float(), masked.float(), atol=5e-2)


def test_bf16_weights_without_autocast():
    """DeepSpeed's bf16 keeps bf16 weights and no autocast: the attention must hand bf16 back to o_proj."""
    args = ModelArguments(
        num_layers=2, hidden_size=64, num_heads=4, num_kv_heads=1, head_dim=16, intermediate_size=128
    )
    model = build_model(args, 300, seed=0).to(torch.bfloat16)
    ids, pos, _ = packed([[6, 20], [30]], seed=3)
    masked = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    with document_attention(model):
        ours = model(input_ids=ids, position_ids=pos, use_cache=False).logits
    assert ours.dtype == torch.bfloat16 and torch.allclose(ours.float(), masked.float(), atol=5e-2)
