"""On-policy distillation (same tokenizer) and GOLD cross-tokenizer distillation.

    python scripts/distill.py recipes/tiny_distill.yaml [--key value ...]
    python scripts/distill.py recipes/tiny_gold.yaml
    accelerate launch --config_file recipes/accelerate_configs/zero3.yaml scripts/distill.py recipes/smollm3_distill.yaml

All the work is in align/distill/trainer.py (main); this file wires the recipe to it.
"""

import logging

from align.cli import run
from align.config import ModelConfig, ScriptArguments
from align.distill import DistillConfig, main

CONFIG_TYPES = (ScriptArguments, DistillConfig, ModelConfig)

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, *CONFIG_TYPES)
