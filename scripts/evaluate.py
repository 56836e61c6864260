r"""Evaluate one checkpoint: held-out loss, cloze/MC scoring, verifiable accuracy (think / no_think / plain),
completion lengths and a vibe-check markdown file. The suites live in align/eval/suite.py.

    python scripts/evaluate.py recipes/tiny/eval.yaml --model_name_or_path outputs/tiny/sft
    python scripts/evaluate.py recipes/tiny/eval.yaml --model_name_or_path builtin:smollm2-135m-instruct \
        --output_dir outputs/tiny/eval_smollm2

Writes <output_dir>/eval_results.json, outcomes.jsonl (every item's outcome) and vibes.md (output_dir defaults to
<model dir>/eval) and prints the metrics and, per mode, on how many task families the model beats the best trivial
rule; the pipeline runs it after every stage (`eval_split: dev`) and once at the end (`eval_split: test`).
"""

import logging

from align.cli import run
from align.eval.suite import EvalConfig, evaluate, format_metrics
from align.runtime.distributed import init_from_launcher, leave_launcher, world

CONFIG_TYPES = (EvalConfig,)


def main(cfg: EvalConfig) -> dict:
    init_from_launcher()  # under `accelerate launch --num_processes N` the ranks split the items
    results = evaluate(cfg)
    if world()[0] == 0:
        print(format_metrics(results["metrics"], results["stats"]))
        for key, base in results["details"].items():
            if key.startswith("baseline/"):  # the model against each task family's best trivial rule
                for mode, v in base.get("by_mode", {}).items():
                    print(
                        f"{key}/{mode}: beats the best trivial rule on {v['beaten']} of {v['num_families']} "
                        "task families (paired test, p < 0.05)"
                    )
        print(f"eval of {cfg.model_name_or_path}: {results['seconds']['total']:.1f} s")
    leave_launcher()
    return results


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    run(main, *CONFIG_TYPES)
