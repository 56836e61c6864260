"""Make preference pairs: strong-vs-weak answers, or verifier-graded samples of one model (data_gen/preferences.py).

    python scripts/generate_preferences.py recipes/tiny/preferences.yaml [--max_pairs 200 --backend hf]

Prompts come from dataset_name / dataset_mixture (any source align.data.loading reads: builtin:tasks, a local jsonl, a
hub id); every split the data has gets its own file. Rerun the same command to resume after an interruption.
"""

import logging

from align.cli import run
from align.config import ScriptArguments
from data_gen.preferences import PreferenceDataConfig, main

CONFIG_TYPES = (ScriptArguments, PreferenceDataConfig)


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, *CONFIG_TYPES)
