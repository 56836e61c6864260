"""Compare two evaluations of the same held-out items, paired: what the second model gained and lost.

    python scripts/compare.py outputs/smol135m/sft/eval outputs/smol135m/apo/eval
    python scripts/compare.py BEFORE/eval_results.json AFTER/eval_results.json --out compare.md
    python scripts/compare.py BEFORE AFTER --first 256      # only the first 256 items of each set
    python scripts/compare.py outputs/tiny/pipeline/outcomes/grpo.jsonl --baseline   # against the trivial rules

BEFORE and AFTER: eval output directories, their eval_results.json or outcomes.jsonl, or the per-item outcome files a
pipeline gathers under <run_dir>/outcomes/ (the report names them). Prints a markdown table: each share both hold
per-item outcomes for (accuracy and format per eval set and mode, MC cloze and letter accuracy, the tool suite's
shares, a stage's own held-out accuracy, each family alone), its value before and after, the items gained and lost,
the exact McNemar p-value and the verdict; the chat loss's paired difference. `--baseline` judges one evaluation
against the best trivial rule of each task family on the same items. The logic lives in align/eval/compare.py.
"""

import argparse
import sys
from pathlib import Path

from align.eval.compare import compare, compare_baseline, compare_markdown


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="eval output_dir, eval_results.json or outcomes .jsonl of the reference model")
    parser.add_argument(
        "after", nargs="?", default=None, help="the same of the model to judge (omitted with --baseline)"
    )
    parser.add_argument(
        "--baseline",
        action="store_true",
        help="judge BEFORE against the best trivial rule of each task family on the same items",
    )
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    parser.add_argument(
        "--first",
        type=int,
        default=None,
        help="judge only the first N items of each set (e.g. the 256 an earlier, smaller eval held)",
    )
    args = parser.parse_args(argv)
    if (args.after is None) != args.baseline:
        parser.error("give BEFORE and AFTER, or one evaluation with --baseline")
    try:
        found = (
            compare_baseline(args.before, args.first)
            if args.baseline
            else compare(args.before, args.after, args.first)
        )
        md = compare_markdown(found, args.before, args.after)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(str(e))
    print(md, end="")
    if args.out:
        Path(args.out).write_text(md)
    return md


if __name__ == "__main__":
    main()
