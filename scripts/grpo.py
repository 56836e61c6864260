"""GRPO on verifiable rewards, generation through the shared rollout engine.

    python scripts/grpo.py recipes/tiny/grpo.yaml [--key value ...]
    python scripts/grpo.py recipes/smol135m/grpo.yaml --rollout_backend vllm
    accelerate launch scripts/grpo.py recipes/smollm3/grpo.yaml                    # GPU

All the work is in align/grpo/trainer.py (main); this file wires the recipe to it. The `__main__` guard matters:
vLLM starts worker processes that re-import this module.
"""

import logging

from align.cli import run
from align.config import ModelConfig, ScriptArguments
from align.grpo.config import GRPOConfig
from align.grpo.trainer import main

CONFIG_TYPES = (ScriptArguments, GRPOConfig, ModelConfig)

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, *CONFIG_TYPES)
