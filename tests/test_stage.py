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

from align import stage
from align.distill import DistillConfig
from align.distill import trainer as distill_trainer
from align.grpo import trainer as grpo
from align.grpo.config import GRPOConfig
from align.preference import trainer as preference
from align.preference.config import DPOConfig, KTOConfig, ORPOConfig
from align.rollout.sampler import ROLLOUT_BACKENDS
from align.sft import trainer as sft
from align.sft.config import SFTConfig

STEPS = ["start", "load_tokenizer", "load_data", "load_model", "prepare", "train", "save", "write_report"]
# one round of the stages that repeat: distillation's (align.distill.trainer.main; rounds.py repeats it for
# rejection_rounds) and the preference stage's (preference.train_round; preference_rounds.py repeats it)
MAINS = {"sft": sft.main, "preference": preference.train_round, "grpo": grpo.main, "distill": distill_trainer.main}
CONFIGS = [SFTConfig, DPOConfig, KTOConfig, ORPOConfig, GRPOConfig, DistillConfig]


def _steps_called(func) -> list[str]:
    """The `stage.<step>(...)` calls in a function's body, in source order."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(func)))
    calls = [
        n
        for n in ast.walk(tree)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
        and n.func.value.id == "stage"
    ]
    return [c.func.attr for c in sorted(calls, key=lambda c: (c.lineno, c.col_offset)) if c.func.attr in STEPS]


@pytest.mark.parametrize("name", MAINS)
def test_every_stage_main_takes_the_shared_steps_in_one_order(name):
    assert _steps_called(MAINS[name]) == STEPS


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_every_stage_config_has_the_shared_keys(config, tmp_path):
    args = config(output_dir=str(tmp_path), merge_lora_on_save=False)
    assert args.merge_lora_on_save is False
    assert "merge_adapter" not in {f for f in vars(args)}  # one name for the LoRA merge


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: c.__name__)
def test_bf16_on_a_cpu_without_native_bf16_trains_in_fp32(config, tmp_path, monkeypatch, caplog):
    """Without AVX512-BF16 or AMX, CPU bf16 autocast is emulated and several times slower than fp32: every stage's
    config falls back to fp32 with one line saying why; a CPU that has it, or SMOLALIGN_CPU_BF16=1, keeps bf16."""
    import torch

    from align.runtime.device import cpu_bf16_slower

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    monkeypatch.delenv("SMOLALIGN_CPU_BF16", raising=False)
    for native in (False, True):
        monkeypatch.setattr(torch.cpu, "_is_avx512_bf16_supported", lambda: False)
        monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda n=native: n)
        caplog.clear()
        with caplog.at_level("WARNING", logger="align.config"):
            assert config(output_dir=str(tmp_path), bf16=True).bf16 is native
        assert ("no native bf16" in caplog.text) is (not native)
        assert config(output_dir=str(tmp_path), bf16=False).bf16 is False
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: False)
    assert cpu_bf16_slower(True) and not cpu_bf16_slower(False)
    monkeypatch.setenv("SMOLALIGN_CPU_BF16", "1")
    assert config(output_dir=str(tmp_path), bf16=True).bf16 is True
    monkeypatch.setenv("SMOLALIGN_CPU_BF16", "0")  # fp32 on every CPU, native bf16 or not (the test suite's setting)
    monkeypatch.setattr(torch.cpu, "_is_amx_tile_supported", lambda: True)
    assert cpu_bf16_slower(True) and config(output_dir=str(tmp_path), bf16=True).bf16 is False


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


def test_qlora_loads_on_this_ranks_gpu(monkeypatch):
    """On a GPU the quantized base goes to cuda:LOCAL_RANK (TRL 1.x has no get_kbit_device_map: an H200 run failed)."""
    import torch

    seen = {}
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setenv("LOCAL_RANK", "2")
    monkeypatch.setattr(stage.models, "load_model", lambda name, **kw: seen.update(kw) or "model")
    assert stage.load_model(ModelConfig(model_name_or_path="unused", load_in_4bit=True, dtype="bfloat16")) == "model"
    assert seen["device_map"] == {"": torch.device("cuda", 2)}
    assert (
        seen["quantization_config"].load_in_4bit
        and seen["quantization_config"].bnb_4bit_compute_dtype == torch.bfloat16
    )


def test_lora_without_target_modules_adapts_every_linear_layer_where_peft_has_no_default(tmp_path):
    """SmolLM3 (and every model pretrain/ makes) is not in PEFT's table of default LoRA modules: use_peft alone
    failed ("Please specify `target_modules`"); it now adapts every linear layer but the head. A llama keeps PEFT's
    own default (q_proj, v_proj), as with TRL."""
    import torch
    from peft import get_peft_model
    from transformers import SmolLM3Config, SmolLM3ForCausalLM

    torch.manual_seed(0)
    config = SmolLM3Config(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        pad_token_id=0,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    SmolLM3ForCausalLM(config).save_pretrained(tmp_path / "smollm3")
    _tiny_causal_lm().save_pretrained(tmp_path / "llama")
    lora = stage.peft_config(ModelConfig(model_name_or_path=str(tmp_path / "smollm3"), use_peft=True))
    assert lora.target_modules == "all-linear"
    adapted = get_peft_model(SmolLM3ForCausalLM.from_pretrained(tmp_path / "smollm3"), lora)
    names = {n.split(".lora_A")[0].split(".")[-1] for n, _ in adapted.named_parameters() if "lora_A" in n}
    assert names >= {"q_proj", "k_proj", "v_proj", "o_proj", "gate_proj", "up_proj", "down_proj"}
    assert not any("lm_head" in n and "lora" in n for n, _ in adapted.named_parameters())
    assert (
        stage.peft_config(ModelConfig(model_name_or_path=str(tmp_path / "llama"), use_peft=True)).target_modules
        is None
    )


def _tiny_causal_lm():
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
    )
    return LlamaForCausalLM(config)


def test_own_precision_measures_after_training_in_the_precision_of_before(tmp_path):
    """`trainer.train()` leaves the model's forward in bf16 autocast; inside `stage.own_precision` the trained model
    computes exactly what it computed before training (learning rate 0: same weights), outside it does not."""
    import torch
    from datasets import Dataset
    from transformers import Trainer, TrainingArguments

    model = _tiny_causal_lm()
    ids = torch.randint(0, 64, (2, 16), generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        before = model(ids).logits
    rows = Dataset.from_dict({"input_ids": ids.tolist(), "labels": ids.tolist()})
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
    trainer = Trainer(model=model, args=args, train_dataset=rows)
    trainer.train()
    with torch.no_grad():
        autocast = model(ids).logits
        with stage.own_precision(trainer):
            own = model(ids).logits
        again = model(ids).logits
    assert not torch.equal(autocast, before)  # what an after-training measurement saw: bf16 autocast
    assert torch.equal(own, before)
    assert torch.equal(again, autocast)  # training's forward is put back


@pytest.mark.parametrize("name", MAINS)
def test_every_stage_measures_after_training_in_its_own_precision(name):
    calls = [
        n
        for n in ast.walk(ast.parse(textwrap.dedent(inspect.getsource(MAINS[name]))))
        if isinstance(n, ast.Attribute) and n.attr == "own_precision"
    ]
    assert calls, f"{name}.main measures after training without stage.own_precision"


def test_a_report_is_written_whole_or_not_at_all(tmp_path, monkeypatch):
    """A round's report marks it finished (preference and distillation rounds skip it on a rerun): a write killed
    half-way leaves the previous report, not half a file that the rerun could not read."""
    import json

    from align.runtime.checkpoint import write_json_atomic

    path = tmp_path / "round-1" / "preference_eval.json"
    write_json_atomic(str(path), {"after": {"accuracy": 0.5}})
    assert json.loads(path.read_text()) == {"after": {"accuracy": 0.5}}

    real_dump = json.dump

    def dies_half_way(obj, f, **kw):
        f.write('{"after": {"accur')
        raise KeyboardInterrupt

    monkeypatch.setattr(json, "dump", dies_half_way)
    with pytest.raises(KeyboardInterrupt):
        write_json_atomic(str(path), {"after": {"accuracy": 0.75}})
    monkeypatch.setattr(json, "dump", real_dump)
    assert json.loads(path.read_text()) == {"after": {"accuracy": 0.5}}  # the old report, whole
    write_json_atomic(str(path), {"after": {"accuracy": 0.75}})
    assert json.loads(path.read_text()) == {"after": {"accuracy": 0.75}}
