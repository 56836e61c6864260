"""Supervised fine-tuning with assistant-only loss for any chat template.

    python scripts/sft.py recipes/tiny/sft.yaml [--key value ...]
    accelerate launch --config_file recipes/accelerate/zero2.yaml --use_deepspeed --num_processes 2 \
        scripts/sft.py recipes/tiny/sft.yaml                                      # 2 CPU ranks
    accelerate launch --config_file recipes/accelerate/zero3.yaml scripts/sft.py recipes/smollm3/sft.yaml

All the work is in align/sft/trainer.py (main); this file wires the recipe to it.
"""

import logging

from align.cli import run
from align.config import ModelConfig, ScriptArguments
from align.sft.config import SFTConfig
from align.sft.trainer import main

CONFIG_TYPES = (ScriptArguments, SFTConfig, ModelConfig)

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, *CONFIG_TYPES)
