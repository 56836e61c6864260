"""The starting point of a post-training chain: a pretrained model saved as a local HF directory, so a pipeline
evaluates it like any other stage and every later stage's "before" is measured, not assumed.

    python scripts/base.py --model_name_or_path builtin:smollm2-135m-instruct --output_dir outputs/smol135m/base

In a pipeline (recipes/smol135m/pipeline.yaml) it is the first stage: `script: base` with `model_name_or_path`
and `output_dir` in its overrides. The weights are saved as loaded (their own dtype), with the tokenizer and its
chat template, and a `base.json` naming where they came from.
"""

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from align.cli import run
from align.modeling.loading import load_model, load_tokenizer, resolve_model_path


@dataclass
class BaseConfig:
    model_name_or_path: str = field(
        default="", metadata={"help": "HF model dir, hub id (org/name[@rev]) or builtin:NAME."}
    )
    output_dir: str = field(default="", metadata={"help": "Where the local copy goes."})

    def __post_init__(self):
        if not self.model_name_or_path or not self.output_dir:
            raise ValueError("base: set model_name_or_path (the model to start from) and output_dir (where it goes)")


def main(cfg: BaseConfig) -> dict:
    source = resolve_model_path(cfg.model_name_or_path)
    model, tokenizer = load_model(cfg.model_name_or_path, dtype="auto"), load_tokenizer(cfg.model_name_or_path)
    out = Path(cfg.output_dir)
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    info = {"model_name_or_path": cfg.model_name_or_path, "resolved": source, "num_params": model.num_parameters()}
    (out / "base.json").write_text(json.dumps(info, indent=1))
    print(json.dumps(info))
    return info


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, BaseConfig)
