"""Attention in fp32 inside a CPU bf16 autocast (align/modeling/cpu_attention.py): closer to fp32, the same outside
autocast, consistent under gradient checkpointing, and restored afterwards."""

from __future__ import annotations

import torch

from align.modeling.cpu_attention import NAME, fp32_attention


def _model(seed: int = 0):
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=128,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=128,
        attn_implementation="sdpa",
        initializer_range=0.2,
    )
    return LlamaForCausalLM(config)


def _batch():
    g = torch.Generator().manual_seed(1)
    ids = torch.randint(0, 128, (4, 40), generator=g)
    mask = torch.ones_like(ids)
    mask[0, :7] = 0  # left padding, as a GRPO batch has
    mask[2, :3] = 0
    return ids, mask


def _record_attention(model) -> list[str]:
    """The attention implementation each forward call of `model` ran with (its forward wrapped in place)."""
    seen, forward = [], model.forward

    def spy(*args, **kwargs):
        seen.append(model.config._attn_implementation)
        return forward(*args, **kwargs)

    model.forward = spy
    return seen


def _loss_and_grads(model, ids, mask, autocast: bool):
    model.zero_grad(set_to_none=True)
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        logits = model(input_ids=ids, attention_mask=mask).logits
    loss = (logits.float().log_softmax(-1) * mask[..., None]).mean()
    loss.backward()
    grads = torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])
    return logits.detach().float(), loss.detach(), grads


def test_fp32_attention_under_autocast_is_closer_to_fp32_and_equal_outside_it():
    model = _model()
    ids, mask = _batch()
    ref_logits, _, ref_grads = _loss_and_grads(model, ids, mask, autocast=False)
    bf16_logits, _, bf16_grads = _loss_and_grads(model, ids, mask, autocast=True)
    with fp32_attention(model) as switched:
        assert switched and model.config._attn_implementation == NAME
        ours_logits, _, ours_grads = _loss_and_grads(model, ids, mask, autocast=True)
        plain_logits, _, plain_grads = _loss_and_grads(model, ids, mask, autocast=False)
    assert model.config._attn_implementation == "sdpa"  # restored: a saved config never names ours
    assert torch.equal(plain_logits, ref_logits) and torch.equal(plain_grads, ref_grads)  # no autocast: plain sdpa
    assert not torch.equal(ours_logits, bf16_logits)  # it really attended another way
    real = mask.bool()
    err = lambda x: (x - ref_logits)[real].abs().mean().item()  # noqa: E731
    assert err(ours_logits) < err(bf16_logits)
    assert (ours_grads - ref_grads).norm() < (bf16_grads - ref_grads).norm()
    assert (ours_grads - ref_grads).norm() < 0.05 * ref_grads.norm()  # still bf16 projections: close, not equal


def test_fp32_attention_with_gradient_checkpointing_recomputes_the_same_way():
    model = _model()
    ids, mask = _batch()
    with fp32_attention(model):
        _, loss, grads = _loss_and_grads(model, ids, mask, autocast=True)
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()
        _, ckpt_loss, ckpt_grads = _loss_and_grads(model, ids, mask, autocast=True)
    assert torch.equal(loss, ckpt_loss)
    torch.testing.assert_close(ckpt_grads, grads, rtol=1e-4, atol=1e-6)


def test_models_off_the_cpu_sdpa_path_are_left_alone():
    model = _model()
    model.config._attn_implementation = "eager"
    with fp32_attention(model) as switched:
        assert not switched and model.config._attn_implementation == "eager"


def test_the_hf_engine_keeps_its_decode_attention_inside_fp32_attention():
    from align.rollout import SamplingParams
    from align.rollout.hf import HFEngine
    from align.rollout.hf_decode import ATTN_NAME

    model = _model().eval()
    engine = HFEngine(model)
    params = SamplingParams(temperature=0, max_new_tokens=8)
    prompts = [[5, 6, 7], [9, 10, 11, 12, 13]]
    plain = [g[0].completion_ids for g in engine.generate(prompts, params)]
    seen = _record_attention(model)
    with fp32_attention(model):
        inside = [g[0].completion_ids for g in engine.generate(prompts, params)]
        assert model.config._attn_implementation == NAME  # put back after generating
    assert inside == plain and set(seen) == {ATTN_NAME}


def test_stage_train_trains_in_fp32_attention_and_restores_sdpa(tmp_path):
    """What every stage's main calls (align.stage.train): the training passes of a bf16 CPU run attend in fp32."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from align import stage

    model = _model()
    ids, _ = _batch()
    rows = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=2,
        learning_rate=1e-3,
        bf16=True,
        use_cpu=True,
        per_device_train_batch_size=2,
        report_to="none",
        save_strategy="no",
        remove_unused_columns=False,
    )
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    seen = _record_attention(model)
    metrics = stage.train(trainer, args)
    assert seen == [NAME, NAME] and model.config._attn_implementation == "sdpa"
    assert metrics["train_loss"] > 0
