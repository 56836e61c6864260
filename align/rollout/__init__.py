"""One generation interface for every stage that generates (data_gen, GRPO, distillation, evaluation).

    from align.rollout import SamplingParams, get_engine
    engine = get_engine(model_path_or_model, backend="auto")   # "hf" | "vllm" | "vllm-server"
    rollouts = engine.generate(prompt_ids, SamplingParams(n=8, temperature=1.0, max_new_tokens=256))

The modules, in import order: base.py (the interface, the checks every backend runs, the engine cache),
vllm_patch.py (keeps transformers classes usable beside vLLM), the backends hf.py / vllm.py / vllm_server.py, and
factory.py (`get_engine`, `choose_backend`). vLLM itself is imported only when a vllm engine starts (~10 s).
"""

from align.rollout.base import BACKENDS, Rollout, RolloutEngine, SamplingParams, close_all
from align.rollout.factory import choose_backend, get_engine
from align.rollout.vllm_patch import fix_vllm_patched_model

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
