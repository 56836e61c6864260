"""DPO / APO / IPO preference training: any TRL DPO loss or a weighted list (loss_type + loss_weights).

    python scripts/dpo.py recipes/tiny/apo.yaml [--key value ...]
    accelerate launch --config_file recipes/accelerate/zero3.yaml scripts/dpo.py recipes/smollm3/apo.yaml

All the work is in align/preference/trainer.py (main); this file wires the recipe to it.
"""

import logging

from align.cli import run
from align.config import ModelConfig, ScriptArguments
from align.preference.config import DPOConfig
from align.preference.trainer import main

CONFIG_TYPES = (ScriptArguments, DPOConfig, ModelConfig)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, *CONFIG_TYPES)
