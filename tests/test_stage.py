"""align/stage.py: one stage shape. Every post-training stage's main() takes the shared steps in the same order, and
the same keys (LoRA merge, QLoRA, rollout backend) mean the same thing in every stage's config.

Run: pytest tests/test_stage.py -q   (a few seconds; nothing trains)
"""

from __future__ import annotations

import ast
import inspect
import textwrap

import pytest
from trl import ModelConfig

from align import distill, grpo, preference, sft, stage
from align.distill import DistillConfig
from align.grpo import GRPOConfig
from align.preference import DPOConfig, KTOConfig, ORPOConfig
from align.sampler import ROLLOUT_BACKENDS
from align.sft import SFTConfig

STEPS = ["start", "load_tokenizer", "load_data", "load_model", "prepare", "train", "save", "write_report"]
MAINS = {"sft": sft.main, "preference": preference.main, "grpo": grpo.main, "distill": distill.main}
CONFIGS = [SFTConfig, DPOConfig, KTOConfig, ORPOConfig, GRPOConfig, DistillConfig]


def _steps_called(func) -> list[str]:
    """The `stage.<step>(...)` calls in a function's body, in source order."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    calls = [n for n in ast.walk(tree) if isinstance(n, ast.Call) and isinstance(n.func, ast.Attribute)
             and isinstance(n.func.value, ast.Name) and n.func.value.id == "stage"]
    return [c.func.attr for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset)) if c.func.attr in STEPS]


@pytest.mark.parametrize("name", MAINS)
def test_every_stage_main_takes_the_shared_steps_in_one_order(name):
    assert _steps_called(MAINS[name]) == STEPS


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_every_stage_config_has_the_shared_keys(config, tmp_path):
    args = config(output_dir=str(tmp_path), merge_lora_on_save=False)
    assert args.merge_lora_on_save is False
    assert "merge_adapter" not in {f for f in vars(args)}  # one name for the LoRA merge


@pytest.mark.parametrize("config", [GRPOConfig, DistillConfig], ids=lambda c: c.__name__)
def test_trainers_that_generate_take_every_rollout_backend_auto_included(config, tmp_path):
    assert "auto" in ROLLOUT_BACKENDS
    for backend in ("auto", "hf", "trl"):
        assert config(output_dir=str(tmp_path), rollout_backend=backend, rollout_kwargs={}).rollout_backend == backend
    with pytest.raises(ValueError, match="rollout_backend"):
        config(output_dir=str(tmp_path), rollout_backend="vlm")


def test_qlora_keys_are_read_the_same_way_for_every_stage():
    """load_in_4bit / load_in_8bit go through stage.load_model, which every stage's main calls: on a CPU one line."""
    import torch

    if torch.cuda.is_available():
        pytest.skip("on a GPU QLoRA loads")
    with pytest.raises(ValueError, match="QLoRA"):
        stage.load_model(ModelConfig(model_name_or_path="unused", load_in_4bit=True))
