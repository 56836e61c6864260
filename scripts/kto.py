"""KTO preference training. Paired {prompt, chosen, rejected} data is unpaired automatically.

    python scripts/kto.py recipes/tiny_kto.yaml [--key value ...]

All the work is in align/preference.py (main); this file wires the recipe to it.
"""

import logging

from align.cli import run
from align.configs import ModelConfig, ScriptArguments
from align.preference import KTOConfig, main

CONFIG_TYPES = (ScriptArguments, KTOConfig, ModelConfig)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, *CONFIG_TYPES)
