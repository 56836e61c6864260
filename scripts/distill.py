"""On-policy distillation (same tokenizer) and GOLD cross-tokenizer distillation.

    python scripts/distill.py recipes/tiny/distill.yaml [--key value ...]
    python scripts/distill.py recipes/tiny/gold.yaml
    accelerate launch --config_file recipes/accelerate/zero3.yaml scripts/distill.py recipes/smollm3/distill.yaml

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
