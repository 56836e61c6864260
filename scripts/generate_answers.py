"""Self-answered conversations for SFT replay: a model's own answers to general prompts (data_gen/answers.py).

    python scripts/generate_answers.py recipes/smol135m/replay.yaml

Output: <output_dir>/train.jsonl ({"messages": [...]}, the SFT shape) and card.json.
"""

import logging

from align.cli import run
from data_gen.answers import AnswerDataConfig, generate_answers

CONFIG_TYPES = (AnswerDataConfig,)

if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(generate_answers, *CONFIG_TYPES)
