"""Merge models: a soup (uniform or weighted average) of checkpoints, or a linear merge; see align/pipeline/merge.py.

    python scripts/merge.py recipes/smollm3/apo_soup.yaml          # uniform soup of the APO checkpoints
    python scripts/merge.py recipes/smollm3/merge.yaml             # 0.9 x soup + 0.1 x mid-training, YaRN 128k
    python scripts/merge.py --models a/ b/ --weights 0.9 0.1 --output_dir merged/

The output is an HF model directory (loads with AutoModelForCausalLM and vLLM) with merge_config.yaml beside it.
"""

import json
import logging

from align.cli import run
from align.pipeline.merge import MergeConfig, merge

CONFIG_TYPES = (MergeConfig,)


def main(cfg: MergeConfig) -> dict:
    summary = merge(cfg)
    print(json.dumps(summary, indent=1))
    return summary


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, *CONFIG_TYPES)
