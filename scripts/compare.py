"""Compare two evaluations of the same held-out items, paired: what the second model gained and lost.

    python scripts/compare.py outputs/smol135m/sft/eval outputs/smol135m/apo/eval
    python scripts/compare.py BEFORE/eval_results.json AFTER/eval_results.json --out compare.md
    python scripts/compare.py BEFORE AFTER --first 256      # only the first 256 items of each set

Prints a markdown table: each share both results hold per-item outcomes for (accuracy and format per eval set and
mode, the tool suite's shares and each tool family), its value before and after, the items gained and lost, the
exact McNemar p-value and the verdict; the chat loss's paired difference. The logic lives in align/eval/compare.py.
"""

import argparse
import sys
from pathlib import Path

from align.eval.compare import compare, compare_markdown


def main(argv: list[str] | None = None) -> str:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("before", help="eval output_dir (or its eval_results.json) of the reference model")
    parser.add_argument("after", help="eval output_dir (or its eval_results.json) of the model to judge")
    parser.add_argument("--out", default=None, help="also write the table to this markdown file")
    parser.add_argument("--first", type=int, default=None,
                        help="judge only the first N items of each set (e.g. the 256 an earlier, smaller eval held)")
    args = parser.parse_args(argv)
    try:
        md = compare_markdown(compare(args.before, args.after, args.first), args.before, args.after)
    except (FileNotFoundError, ValueError) as e:
        sys.exit(str(e))
    print(md, end="")
    if args.out:
        Path(args.out).write_text(md)
    return md


if __name__ == "__main__":
    main()
