"""pretrain/: document masking, packing and staged mixtures, param groups, schedules, golden loss, exact resume,
NaN guard, mid-training (incl. long context), saved-model loading and recipe parsing. Tiny models, no network."""

from __future__ import annotations

import glob
import json
import math
import os
import sys

import pytest
import torch
from test_pretrain_helpers import ASSETS, synthetic_docs, tiny_config, tiny_model_args, tiny_tokenizer

from pretrain.data import PackedStream, parse_stages, position_ids_for
from pretrain.model import ModelArguments, build_model, count_params, flops_per_token
from pretrain.tokenizer import EOS
from pretrain.train import PretrainConfig, lm_loss, lr_at, param_groups, train

torch.set_num_threads(1)
GOLDEN = os.path.join(ASSETS, "pretrain_golden_loss.json")


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


def stream_for(tok, **kw):
    args = dict(
        sources={"words": synthetic_docs("words", 100), "math": synthetic_docs("math", 100)},
        stages=[{"num_tokens": 640, "weights": {"words": 3, "math": 1}}, {"num_tokens": 640, "weights": {"math": 1}}],
        tokenizer=tok,
        seq_len=32,
    )
    return PackedStream(**{**args, **kw})


# ---- data ----------------------------------------------------------------------------------------------------


def test_position_ids_restart_at_every_document_and_row():
    x = torch.tensor([[5, 6, 0, 7, 8, 9, 0, 4], [3, 0, 2, 2, 2, 2, 2, 2]])
    assert position_ids_for(x, eos_id=0).tolist() == [[0, 1, 0, 1, 2, 3, 0, 1], [0, 0, 1, 2, 3, 4, 5, 6]]


def test_document_masking_changing_one_document_leaves_the_others_logits_unchanged(tok):
    model = build_model(tiny_model_args(), len(tok), seed=0).eval()
    eos = tok.convert_tokens_to_ids(EOS)
    a, b, c = ([eos] + tok(t)["input_ids"] for t in ("the cat sat", "a dog ran on the mat", "it was red"))
    b2 = [eos] + tok("blue blue log under then very")["input_ids"]
    assert len(b2) != len(b)  # a different length shifts C: positions must still restart, so C is unchanged

    def logits(ids):
        x = torch.tensor([ids])
        with torch.no_grad():
            return model(input_ids=x, position_ids=position_ids_for(x, eos), use_cache=False).logits[0]

    one, two = logits(a + b + c), logits(a + b2 + c)
    torch.testing.assert_close(one[: len(a)], two[: len(a)])
    torch.testing.assert_close(one[-len(c) :], two[-len(c) :], rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(one[-len(c) :], logits(c))  # C alone == C after other documents
    # and without restarting positions C does see B (so the test can fail)
    with torch.no_grad():
        plain = model(input_ids=torch.tensor([a + b2 + c]), use_cache=False).logits[0]
    assert not torch.allclose(plain[-len(c) :], two[-len(c) :], atol=1e-4)


def test_stream_is_deterministic_and_meets_stage_token_shares(tok):
    s1, s2 = stream_for(tok), stream_for(tok)
    rows = [s1.next_batch(4)["input_ids"] for _ in range(5)]
    assert all(torch.equal(r, s2.next_batch(4)["input_ids"]) for r in rows)
    # stage 1 (640 tokens = 20 rows): words get ~3/4 of the tokens; then stage 2 is math only
    s = stream_for(tok)
    s.next_batch(20)
    consumed = s.stage_consumed
    assert s.stage_index == 0 and abs(consumed["words"] / sum(consumed.values()) - 0.75) < 0.1
    s.next_batch(4)
    assert s.stage_index == 1 and set(s.stage_consumed) == {"math"}


def test_ranks_get_disjoint_slices_of_the_same_global_batches(tok):
    whole = stream_for(tok).next_batch(4)["input_ids"]
    r0 = stream_for(tok, rank=0, world_size=2).next_batch(2)["input_ids"]
    r1 = stream_for(tok, rank=1, world_size=2).next_batch(2)["input_ids"]
    assert torch.equal(torch.cat([r0, r1]), whole)
    assert not any(torch.equal(x, y) for x in r0 for y in r1)


def test_stream_state_dict_resumes_exactly(tok):
    s = stream_for(tok)
    for _ in range(7):
        s.next_batch(3)
    state = json.loads(json.dumps(s.state_dict()))  # must survive JSON (it goes into trainer_state.json)
    expected = [s.next_batch(3)["input_ids"] for _ in range(6)]
    fresh = stream_for(tok)
    fresh.load_state_dict(state)
    assert all(torch.equal(e, fresh.next_batch(3)["input_ids"]) for e in expected)


def test_held_out_documents_are_never_trained_on(tok):
    docs = [f"document number {i} " * 3 for i in range(50)]
    s = PackedStream({"d": docs}, [{"num_tokens": 10_000, "weights": {"d": 1}}], tok, seq_len=32, eval_docs=5)
    held = set(s.sources["d"].eval_texts)
    assert len(held) == 5 and not held & set(s.sources["d"].texts)
    assert set(s.eval_batches(2)) == {"d"}


@pytest.mark.parametrize(
    "stages,match",
    [
        ([], "empty"),
        ([{"num_tokens": 10, "weights": {"nope": 1}}], "unknown sources"),
        ([{"num_tokens": 10}], "needs keys"),
        ([{"num_tokens": 0, "weights": {"a": 1}}], "positive"),
    ],
)
def test_bad_stages_are_value_errors_naming_the_problem(stages, match):
    with pytest.raises(ValueError, match=match):
        parse_stages(stages, ["a"])


# ---- model / optimizer / schedule --------------------------------------------------------------------------


def test_model_knobs_gqa_nope_tied_and_flops():
    m = build_model(ModelArguments(num_layers=8, hidden_size=64, num_heads=4, num_kv_heads=2), vocab_size=300)
    cfg = m.config
    assert cfg.no_rope_layers == [1, 1, 1, 0, 1, 1, 1, 0]  # every 4th layer has no RoPE
    assert m.model.layers[0].self_attn.k_proj.out_features == 2 * 16  # 2 KV heads of dim 16
    assert m.lm_head.weight is m.model.embed_tokens.weight
    total, non_emb = count_params(m)
    assert total - non_emb == 300 * 64
    assert flops_per_token(cfg, 128) > 6 * non_emb
    untied = build_model(
        ModelArguments(num_layers=1, hidden_size=64, num_heads=4, num_kv_heads=2, tie_embeddings=False), vocab_size=300
    )
    assert count_params(untied)[0] - count_params(untied)[1] == 2 * 300 * 64
    with pytest.raises(ValueError, match="num_kv_heads"):
        ModelArguments(num_heads=6, num_kv_heads=4)


def test_same_seed_same_init_and_qk_norm_variant():
    a, b = build_model(tiny_model_args(), 300, seed=3), build_model(tiny_model_args(), 300, seed=3)
    assert all(torch.equal(x, y) for x, y in zip(a.state_dict().values(), b.state_dict().values()))
    q = build_model(tiny_model_args(qk_norm=True), 300)
    assert hasattr(q.model.layers[0].self_attn, "q_norm")


def test_param_groups_no_decay_on_embeddings_norms_biases():
    m = build_model(tiny_model_args(), 300)
    m.model.layers[0].self_attn.q_proj.bias = torch.nn.Parameter(torch.zeros(32))  # a bias, to check it too
    decay, no_decay = param_groups(m, 0.1)
    names = {id(p): n for n, p in m.named_parameters()}
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    no_decay_names = {names[id(p)] for p in no_decay["params"]}
    assert "model.embed_tokens.weight" in no_decay_names and "model.layers.0.self_attn.q_proj.bias" in no_decay_names
    assert all("norm" in n or "embed" in n or n.endswith("bias") for n in no_decay_names)
    assert all(p.ndim == 2 and "embed" not in names[id(p)] for p in decay["params"])
    assert len(decay["params"]) + len(no_decay["params"]) == len(list(m.parameters()))


def lrs(total, **kw):
    cfg = PretrainConfig(learning_rate=1.0, warmup_steps=10, **kw)
    return [lr_at(s, cfg, total) for s in range(total)]


def test_held_out_evaluation_builds_no_graph_and_keeps_the_mode():
    """pretrain.loss.evaluate: the held-out loss of each source and their mean, computed without autograd (a graph
    over a long-context batch would hold its activations) and leaving the model in the mode it found."""
    from contextlib import nullcontext

    from pretrain.loss import evaluate, to_device

    model = build_model(ModelArguments(num_layers=1, hidden_size=32, num_heads=2, num_kv_heads=1), vocab_size=50)
    ids = torch.randint(1, 50, (2, 9))
    batch = to_device(
        {
            "input_ids": ids[:, :-1].contiguous(),
            "targets": ids[:, 1:].contiguous(),
            "position_ids": torch.arange(8).expand(2, 8),
        },
        torch.device("cpu"),
    )
    model.train()
    out = evaluate(model, {"a": batch, "b": batch}, nullcontext)
    assert model.training
    want = lm_loss(model.eval(), batch).item()
    assert out["eval_loss/a"] == out["eval_loss/b"] == pytest.approx(want) == pytest.approx(out["eval_loss"])
    assert out["eval_ppl"] == pytest.approx(math.exp(want))
    seen = []
    import pretrain.loss as loss_module

    original = loss_module.lm_loss
    try:
        loss_module.lm_loss = lambda *a, **k: seen.append(torch.is_grad_enabled()) or original(*a, **k)
        evaluate(model, {"a": batch}, nullcontext)
    finally:
        loss_module.lm_loss = original
    assert seen == [False]


def test_wsd_shape_and_extending_mid_run():
    short = lrs(100, lr_scheduler="wsd", decay_fraction=0.2)
    assert short[0] == pytest.approx(0.1) and short[9] == 1.0  # linear warmup
    assert set(short[10:80]) == {1.0}  # stable
    assert short[80] < 1.0 and short[-1] == pytest.approx(0.0) and all(a >= b for a, b in zip(short[80:], short[81:]))
    # extending the run before the decay starts changes nothing already seen (no restart needed)
    long = lrs(200, lr_scheduler="wsd", decay_fraction=0.2)
    assert long[:80] == short[:80] and set(long[80:160]) == {1.0}


def test_cosine_and_multistep_shapes():
    cos = lrs(110, lr_scheduler="cosine", min_lr_ratio=0.1)
    assert cos[10] == pytest.approx(1.0) and cos[60] == pytest.approx(0.55) and cos[-1] == pytest.approx(0.1, abs=1e-3)
    assert all(a >= b for a, b in zip(cos[10:], cos[11:]))
    ms = lrs(100, lr_scheduler="multistep", milestones=[50, 80], gamma=0.5)
    assert ms[49] == 1.0 and ms[50] == 0.5 and ms[80] == 0.25
    with pytest.raises(ValueError, match="lr_scheduler"):
        PretrainConfig(lr_scheduler="linear")


# ---- the loop --------------------------------------------------------------------------------------------------


def losses(result):
    return [h["loss"] for h in result["history"]]


def test_golden_loss_20_steps(tmp_path):
    """A refactor must keep this deterministic run's losses. Regenerate: SMOLALIGN_UPDATE_GOLDEN=1 pytest ..."""
    result = train(tiny_model_args(), tiny_config(tmp_path))
    got = losses(result)
    assert len(got) == 20 and got[-1] < got[0] - 1.0  # it learns
    if os.environ.get("SMOLALIGN_UPDATE_GOLDEN") or not os.path.exists(GOLDEN):
        with open(GOLDEN, "w") as f:
            json.dump({"losses": got, "torch": torch.__version__}, f, indent=1)
    golden = json.load(open(GOLDEN))["losses"]
    assert got == pytest.approx(golden, rel=1e-4, abs=1e-4)
    # the run left a loadable HF model, the tokenizer, metrics and a loss curve
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(tmp_path)
    assert AutoTokenizer.from_pretrained(tmp_path).chat_template
    assert next(model.parameters()).dtype == torch.float32
    assert os.path.exists(tmp_path / "model.safetensors") and os.path.getsize(tmp_path / "loss_curve.png") > 1000
    evals = json.load(open(tmp_path / "metrics.json"))["evals"]
    assert [e["step"] for e in evals] == [10, 20] and evals[-1]["eval_loss"] < evals[0]["eval_loss"] + 0.5


def test_resume_gives_the_same_losses_as_an_uninterrupted_run(tmp_path):
    kw = dict(max_steps=8, eval_steps=0, save_total_limit=1)
    full = losses(train(tiny_model_args(), tiny_config(tmp_path / "full", **kw)))
    part = train(tiny_model_args(), tiny_config(tmp_path / "cut", stop_after_steps=5, **kw))
    assert part["stopped"] and len(part["history"]) == 5
    ckpts = glob.glob(str(tmp_path / "cut" / "checkpoints" / "step_*"))
    assert [os.path.basename(c) for c in ckpts] == ["step_0000005"]
    resumed = losses(train(tiny_model_args(), tiny_config(tmp_path / "cut", resume_from_checkpoint="auto", **kw)))
    assert resumed == full  # bit-identical: weights, optimizer, schedule and data position restored


def test_checkpoints_are_atomic_and_only_the_last_k_are_kept(tmp_path):
    train(tiny_model_args(), tiny_config(tmp_path, max_steps=6, save_steps=2, save_total_limit=2, eval_steps=0))
    names = sorted(os.listdir(tmp_path / "checkpoints"))
    assert names == ["step_0000004", "step_0000006"]  # no leftover .tmp_ dirs
    assert {"model.safetensors", "optimizer.pt", "rng.pt", "trainer_state.json"} <= set(
        os.listdir(tmp_path / "checkpoints" / names[-1])
    )


def test_nan_loss_skip_or_stop_naming_the_step(tmp_path, monkeypatch):
    import pretrain.train as pt

    real = pt.lm_loss

    def poisoned(model, batch, z_loss=0.0, chunk_tokens=0):
        loss = real(model, batch, z_loss, chunk_tokens)
        poisoned.calls += 1
        return loss * float("nan") if poisoned.calls == 4 else loss

    poisoned.calls = 0
    monkeypatch.setattr(pt, "lm_loss", poisoned)
    r = train(tiny_model_args(), tiny_config(tmp_path / "skip", max_steps=6, eval_steps=0, nan_policy="skip"))
    assert r["skipped"] == [{"step": 3, "reason": "non-finite loss/grad"}]
    assert all(math.isfinite(h["loss"]) for h in r["history"] if h["step"] != 4)
    from safetensors.torch import load_file  # the skipped batch never reached the weights

    assert all(torch.isfinite(t).all() for t in load_file(str(tmp_path / "skip" / "model.safetensors")).values())
    poisoned.calls = 0
    with pytest.raises(RuntimeError, match="at step 3; checkpoint saved"):
        train(tiny_model_args(), tiny_config(tmp_path / "stop", max_steps=6, eval_steps=0, nan_policy="stop"))
    assert os.path.isdir(tmp_path / "stop" / "checkpoints" / "step_0000004")


def test_midtraining_continues_from_a_model_with_new_data_and_long_context(tmp_path):
    base = tiny_config(tmp_path / "base", max_steps=10, eval_steps=0)
    train(tiny_model_args(), base)
    start_loss = None
    mid = tiny_config(
        tmp_path / "mid",
        init_from=str(tmp_path / "base"),
        tokenizer_path="",
        stages=[{"num_tokens": 640, "weights": {"math": 1}}],
        seq_len=64,
        max_steps=4,
        eval_steps=0,
        warmup_steps=1,
    )
    r = train(tiny_model_args(rope_theta=500_000.0, max_position_embeddings=4096), mid)
    start_loss = r["history"][0]["loss"]
    fresh = train(tiny_model_args(), tiny_config(tmp_path / "fresh", stages=mid.stages, seq_len=64, max_steps=1))
    assert start_loss < fresh["history"][0]["loss"] - 0.5  # it continued from the trained weights
    cfg = json.load(open(tmp_path / "mid" / "config.json"))
    assert cfg["rope_parameters"]["rope_theta"] == 500_000.0 and cfg["max_position_embeddings"] == 4096
    assert r["history"][0]["lr"] < r["history"][1]["lr"] or mid.warmup_steps == 1  # a fresh schedule


def test_grow_depth_is_function_preserving_and_the_copies_then_train(tmp_path):
    from pretrain.model import grow_depth

    base = build_model(ModelArguments(num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=2), vocab_size=300)
    x = torch.randint(0, 300, (2, 24))
    grown = grow_depth(base, 2)
    assert grown.config.num_hidden_layers == 8 and len(grown.model.layers) == 8
    assert grown.config.no_rope_layers == [1, 1, 1, 1, 1, 1, 0, 0]  # each layer's NoPE flag goes with its copies
    assert [layer.self_attn.layer_idx for layer in grown.model.layers] == list(range(8))  # own KV-cache slots
    assert grown.lm_head.weight is grown.model.embed_tokens.weight  # still tied
    with torch.no_grad():
        torch.testing.assert_close(grown(x).logits, base(x).logits, rtol=0, atol=1e-5)
    layer_params = [sum(p.numel() for p in m.model.layers.parameters()) for m in (grown, base)]
    assert layer_params[0] == 2 * layer_params[1]
    # the zeroed copies' output projections get gradients (they are not dead weight)
    loss = grown(x, labels=x).loss
    loss.backward()
    assert grown.model.layers[1].self_attn.o_proj.weight.grad.abs().sum() > 0
    assert grown.model.layers[1].mlp.down_proj.weight.grad.abs().sum() > 0
    with pytest.raises(ValueError, match="grow_depth"):
        grow_depth(base, 0)
    with pytest.raises(ValueError, match="set init_from"):
        tiny_config(tmp_path / "nothing", grow_depth=2)  # growing needs a model to grow
    # through the loop: init_from + grow_depth saves a model twice as deep
    cfg = tiny_config(tmp_path / "base", max_steps=2, eval_steps=0)
    train(tiny_model_args(), cfg)
    grown_cfg = tiny_config(
        tmp_path / "grown",
        init_from=str(tmp_path / "base"),
        tokenizer_path="",
        grow_depth=2,
        max_steps=2,
        eval_steps=0,
        warmup_steps=1,
    )
    train(tiny_model_args(), grown_cfg)
    saved = json.load(open(tmp_path / "grown" / "config.json"))
    assert saved["num_hidden_layers"] == 2 * json.load(open(tmp_path / "base" / "config.json"))["num_hidden_layers"]


def test_recipes_parse():
    import importlib.util

    from align.cli import parse

    root = os.path.join(os.path.dirname(__file__), "..")
    spec = importlib.util.spec_from_file_location("pretrain_script", os.path.join(root, "scripts", "run_pretrain.py"))
    script = importlib.util.module_from_spec(spec)
    sys.modules["pretrain_script"] = script  # dataclasses look their module up there
    spec.loader.exec_module(script)
    for name in ("tiny/pretrain", "tiny/pretrain_strong", "tiny/pretrain_reasoning", "smollm3/pretrain"):
        path = os.path.join(root, "recipes", f"{name}.yaml")
        if not os.path.exists(path):
            pytest.fail(f"missing recipe {path}")
        with open(path) as f:
            assert f.readline().startswith("# "), f"{name}: first line must be the command that runs it"
        model_args, cfg, _ = parse(ModelArguments, PretrainConfig, script.SkillArguments, args=[path])
        assert cfg.stages and cfg.sources and model_args.num_layers > 0, name
        parse_stages(cfg.stages, list(cfg.sources))


def test_loss_is_next_token_cross_entropy(tok):
    m = build_model(tiny_model_args(), len(tok))
    batch = stream_for(tok).next_batch(2)
    with torch.no_grad():
        logits = m(input_ids=batch["input_ids"], position_ids=batch["position_ids"], use_cache=False).logits
        want = torch.nn.functional.cross_entropy(logits.flatten(0, 1), batch["targets"].flatten())
        assert lm_loss(m, batch).item() == pytest.approx(want.item(), rel=1e-5)
        assert lm_loss(m, batch, z_loss=1e-2).item() > want.item()


def test_pretrain_runs_the_preflight_and_stops_on_a_bad_output_dir(tmp_path, monkeypatch):
    from align.runtime.preflight import PREFLIGHT_ONLY_ENV, PreflightError, PreflightPassed

    bad = tmp_path / "a_file"
    bad.write_text("not a directory")
    with pytest.raises(PreflightError, match="output_dir .* exists and is a file"):
        train(tiny_model_args(), tiny_config(bad))
    monkeypatch.setenv(PREFLIGHT_ONLY_ENV, "1")  # what scripts/preflight.py sets: stop once the checks pass
    with pytest.raises(PreflightPassed):
        train(tiny_model_args(), tiny_config(tmp_path / "ok"))
    assert not (tmp_path / "ok" / "model.safetensors").exists()  # nothing was trained


def test_mfu_is_against_the_training_devices_peak(monkeypatch):
    """MFU's denominator is the device the model trains on: a GPU's spec-sheet peak by name (fp32 = TF32, half),
    a measured matmul on that device otherwise; it once measured the CPU's matmul on a GPU machine."""
    import torch

    from pretrain import train as pt

    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "NVIDIA H100 80GB HBM3")
    assert pt.peak_flops(torch.bfloat16, torch.device("cuda", 0)) == 989e12
    assert pt.peak_flops(torch.float32, torch.device("cuda", 0)) == 989e12 / 2
    measured = []
    monkeypatch.setattr(pt, "measure_matmul_flops", lambda dtype, device="cpu": measured.append(device) or 1e11)
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: "Some Future GPU")
    assert pt.peak_flops(torch.bfloat16, torch.device("cuda", 1)) == 1e11 and measured == [torch.device("cuda", 1)]
    assert pt.peak_flops(torch.float32, "cpu") == 1e11 and measured[-1] == torch.device("cpu")
