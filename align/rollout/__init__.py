"""One generation interface for every stage that generates (data_gen, GRPO, distillation, evaluation).

    from align.rollout import SamplingParams, get_engine
    engine = get_engine(model_path_or_model, backend="auto")   # "hf" | "vllm" | "vllm-server"
    rollouts = engine.generate(prompt_ids, SamplingParams(n=8, temperature=1.0, max_new_tokens=256))

Backends are imported lazily (vllm takes ~10 s to import); see base.py for the conventions.
"""

from align.rollout.base import (
    BACKENDS,
    Rollout,
    RolloutEngine,
    SamplingParams,
    choose_backend,
    close_all,
    get_engine,
)
from align.rollout.vllm import fix_vllm_patched_model

__all__ = [
    "BACKENDS",
    "Rollout",
    "RolloutEngine",
    "SamplingParams",
    "choose_backend",
    "close_all",
    "fix_vllm_patched_model",
    "get_engine",
]
