"""Long-context stages (pretraining with init_from, a longer seq_len and a raised RoPE theta, as SmolLM3's
4k->32k->64k) and YaRN `rope_scaling` written into the final config: a model trained at length L, extended to 2L, then
read at 4L.

Run: pytest tests/test_long_context.py -q   (~10 s; tiny models, no network)
"""

from __future__ import annotations

import importlib.util
import math
import os
import sys

import pytest
import torch
from test_pretrain_helpers import tiny_config, tiny_model_args

from align.modeling.loading import set_rope_scaling

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _script():
    spec = importlib.util.spec_from_file_location(
        "pretrain_script_lc", os.path.join(ROOT, "scripts", "run_pretrain.py")
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules["pretrain_script_lc"] = module
    spec.loader.exec_module(module)
    return module


def _eval_loss(model_dir: str, length: int) -> tuple[float, object]:
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = torch.randint(0, model.config.vocab_size, (1, length), generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        return model(input_ids=ids, labels=ids).loss.item(), model


def test_a_model_trained_at_L_extends_to_2L_and_reads_4L_with_yarn_in_its_config(tmp_path):
    script = _script()
    skill = script.SkillArguments()
    L = 32
    base = tiny_config(tmp_path / "base", seq_len=L, max_steps=3, eval_steps=0)
    script.main(tiny_model_args(max_position_embeddings=L), base, skill)
    long = tiny_config(
        tmp_path / "long",
        init_from=str(tmp_path / "base"),
        tokenizer_path="",
        seq_len=2 * L,
        max_steps=3,
        eval_steps=0,
        warmup_steps=1,
    )
    yarn = {"rope_type": "yarn", "factor": 2.0}
    args = tiny_model_args(rope_theta=2_000_000.0, max_position_embeddings=2 * L, rope_scaling=yarn)
    result = script.main(args, long, skill)
    assert len(result["history"]) == 3 and all(math.isfinite(h["loss"]) for h in result["history"])

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tmp_path / "long")
    assert config.rope_parameters == {
        "rope_type": "yarn",
        "rope_theta": 2_000_000.0,
        "factor": 2.0,
        "original_max_position_embeddings": 2 * L,
    }
    assert config.max_position_embeddings == 4 * L
    loss, model = _eval_loss(str(tmp_path / "long"), 4 * L)  # twice the trained length, without error
    assert math.isfinite(loss)
    assert model.model.rotary_emb.rope_type == "yarn" and model.model.rotary_emb.attention_scaling > 1.0
    # the base stage's config is untouched: no scaling was asked there
    assert AutoConfig.from_pretrained(tmp_path / "base").rope_parameters["rope_type"] == "default"


@pytest.mark.parametrize(
    "spec, message",
    [
        ({"rope_type": "ntk", "factor": 2.0}, r"rope_type='ntk': choose one of"),
        ({"rope_type": "yarn", "factor": 1.0}, r"factor=1.0 must be a number > 1"),
        ({"rope_type": "yarn"}, r"factor=None"),
    ],
)
def test_bad_rope_scaling_is_a_value_error_naming_the_key(spec, message):
    from transformers import SmolLM3Config

    with pytest.raises(ValueError, match=message):
        set_rope_scaling(SmolLM3Config(num_hidden_layers=1), spec)


# ------------------------------------------------------------------ long rows: logits in chunks (pretrain/loss.py)


def _vocab_heavy_model(vocab: int = 8192, seed: int = 0):
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    torch.manual_seed(seed)
    config = SmolLM3Config(
        vocab_size=vocab,
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=1,
        max_position_embeddings=8192,
        tie_word_embeddings=True,
        no_rope_layers=[1, 0],
        pad_token_id=0,
        bos_token_id=None,
        eos_token_id=1,
    )
    return SmolLM3ForCausalLM(config)


def _packed_batch(vocab: int, rows: int, length: int, seed: int = 0) -> dict:
    g = torch.Generator().manual_seed(seed)
    ids = torch.randint(0, vocab, (rows, length + 1), generator=g)
    pos = torch.arange(length).repeat(rows, 1)
    pos[:, length // 3 :] -= length // 3  # a second document starts a third of the way in
    targets = ids[:, 1:].clone()
    targets[0, :5] = -100  # and a few positions carry no loss
    return {"input_ids": ids[:, :-1], "position_ids": pos, "targets": targets}


@pytest.mark.parametrize("z_loss", [0.0, 1e-3])
def test_chunked_logits_give_the_whole_batch_loss_and_gradients(z_loss):
    from pretrain.loss import lm_loss

    model = _vocab_heavy_model(vocab=512)
    batch = _packed_batch(512, rows=2, length=96)
    whole = lm_loss(model, batch, z_loss)
    grads = torch.autograd.grad(whole, list(model.parameters()))
    for chunk in (32, 40, 96, 500):  # even, ragged, one chunk, longer than the row
        chunked = lm_loss(model, batch, z_loss, chunk_tokens=chunk)
        assert chunked.item() == pytest.approx(whole.item(), rel=1e-6, abs=1e-6)
        for a, b in zip(grads, torch.autograd.grad(chunked, list(model.parameters()))):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-6)


_PEAK = """
import sys, torch
sys.path.insert(0, {tests!r}); sys.path.insert(0, {root!r})
from test_long_context import _vocab_heavy_model, _packed_batch
from pretrain.loss import lm_loss

def peak_mib():  # this process's own peak RSS: getrusage's ru_maxrss keeps the parent's peak across fork+exec
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

torch.set_num_threads(1)
model = _vocab_heavy_model(vocab=32768)
batch = _packed_batch(32768, rows=2, length=2048)
before = peak_mib()
lm_loss(model, batch, chunk_tokens={chunk}).backward()
print(peak_mib() - before)
"""


def test_chunked_logits_hold_a_fraction_of_the_whole_batch_peak_memory():
    """2 x 2,048 positions x a 32,768-token vocabulary: the whole-batch fp32 logits (and their softmax and gradient)
    are ~0.5 GB apiece; 512 positions at a time need a quarter of one. Peak RSS growth of a forward+backward in a
    fresh process, whole vs chunked."""
    import subprocess

    peaks = {}
    for chunk in (0, 512):
        code = _PEAK.format(tests=os.path.dirname(__file__), root=ROOT, chunk=chunk)
        out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=300)
        assert out.returncode == 0, out.stderr[-2000:]
        peaks[chunk] = float(out.stdout.strip().splitlines()[-1])  # MiB
    assert peaks[512] < 0.5 * peaks[0], peaks


def test_long_context_recipes_chunk_the_logits_and_checkpoint_the_layers():
    import yaml

    for name in ("smollm3/long_context_32k.yaml", "smollm3/long_context_64k.yaml"):
        recipe = yaml.safe_load(open(os.path.join(ROOT, "recipes", name)).read())
        assert recipe["loss_chunk_tokens"] and recipe["gradient_checkpointing"] is True, name
        assert recipe.get("attn_implementation", "auto") == "auto", name
