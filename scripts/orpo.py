"""ORPO preference training: odds-ratio loss plus NLL, no reference model (needs no SFT stage first).

    python scripts/orpo.py recipes/tiny/orpo.yaml [--key value ...]

All the work is in align/preference/trainer.py (main); this file wires the recipe to it.
"""

import logging

from align.cli import run
from align.config import ModelConfig, ScriptArguments
from align.preference.config import ORPOConfig
from align.preference.trainer import main

CONFIG_TYPES = (ScriptArguments, ORPOConfig, ModelConfig)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, *CONFIG_TYPES)
