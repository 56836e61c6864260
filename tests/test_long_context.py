"""Long-context stages (pretraining with init_from, a longer seq_len and a raised RoPE theta, as SmolLM3's 4k->32k->64k)
and YaRN `rope_scaling` written into the final config: a model trained at length L, extended to 2L, then read at 4L.

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

from align.models import set_rope_scaling

ROOT = os.path.join(os.path.dirname(__file__), "..")


def _script():
    spec = importlib.util.spec_from_file_location("pretrain_script_lc", os.path.join(ROOT, "scripts", "run_pretrain.py"))
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
        tmp_path / "long", init_from=str(tmp_path / "base"), tokenizer_path="", seq_len=2 * L, max_steps=3,
        eval_steps=0, warmup_steps=1,
    )
    yarn = {"rope_type": "yarn", "factor": 2.0}
    args = tiny_model_args(rope_theta=2_000_000.0, max_position_embeddings=2 * L, rope_scaling=yarn)
    result = script.main(args, long, skill)
    assert len(result["history"]) == 3 and all(math.isfinite(h["loss"]) for h in result["history"])

    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(tmp_path / "long")
    assert config.rope_parameters == {
        "rope_type": "yarn", "rope_theta": 2_000_000.0, "factor": 2.0, "original_max_position_embeddings": 2 * L,
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
