"""Speed and memory, measured side by side with a baseline in one run.

    python scripts/benchmark.py pretrain [--quick]
    python scripts/benchmark.py all --quick
    python scripts/benchmark.py compare [--history PATH] [--cpu KIND]  # 1: a ratio dropped
    python scripts/benchmark.py table [--history PATH] [--cpu KIND] [--write FILE]

Each suite lives in scripts/benchmarks/<suite>.py and returns table rows and summary lines shaped
`<suite>: ours/<baseline> <unit> ratio R (target >= T)`, most followed by
`[spread S% of N ratios]`. Results go to outputs/bench/<suite>.json (with the load average before
and the CPU other processes used during it) and a markdown table on stdout, then the summary
lines. A suite run on a busy machine (1-minute load >= 0.5 before, or other processes using >= 0.5
cores during it) is printed, marked, and not written (--allow-busy).
Every summary line, busy or not (marked), goes to the history, docs/research/bench/history.jsonl
(--history, --no-history): `compare` holds the last run against the last earlier one on the same
CPU and core count, `table` prints the last complete `all` run (scripts/benchmarks/history.py).
"""

from __future__ import annotations

import argparse
import importlib
import json
import os
import platform
import sys
import time
from pathlib import Path

from benchmarks import history
from benchmarks.machine import IDLE_LOAD, OtherLoad, cpu_model, wait_until_idle

from align.runtime.memory import keep_freed_memory

SUITES = ["pretrain", "sft", "rollout", "grpo", "grpo_padding", "distill_memory", "grpo_async"]
# Run by name only: they need the SmolLM2-135M pipeline's models and ~30 min.
EXTRA_SUITES = ["grpo_tta", "vllm_seeding"]


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in ("compare", "table"):
        return history.cli(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=SUITES + EXTRA_SUITES + ["all"])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and smaller shapes")
    parser.add_argument("--out", default="outputs/bench", help="directory for the JSON results")
    parser.add_argument(
        "--allow-busy",
        action="store_true",
        help=f"write results even when the machine was busy (load >= {IDLE_LOAD}, before or by others)",
    )
    parser.add_argument(
        "--history", type=Path, default=history.HISTORY, help="append every summary line to this file (JSON lines)"
    )
    parser.add_argument("--no-history", action="store_true", help="append nothing to the history")
    args = parser.parse_args(argv)
    suites = SUITES if args.suite == "all" else [args.suite]
    context = history.run_context(args.suite, suites, args.quick, cpu_model(), os.cpu_count())
    # What every stage of ours runs with on a CPU (align.runtime.memory.keep_freed_memory), applied before any suite so
    # that ours and the baseline beside it in this process run under the same allocator, whichever is built first.
    keep_freed_memory()
    # Each suite names its precision and runs ours and the baseline in it: no fallback of a bf16 row to fp32 on a CPU
    # without native bf16 (align.runtime.device.cpu_bf16_slower), or a bf16 row would compare fp32 against bf16.
    os.environ["SMOLALIGN_CPU_BF16"] = "1"
    summaries = []
    for name in suites:
        try:
            module = importlib.import_module(f"benchmarks.{name}")
        except ModuleNotFoundError as e:
            if e.name == f"benchmarks.{name}":
                print(f"## {name}: suite not written yet, skipped")
                continue
            raise
        wait_until_idle()
        load_before, others = os.getloadavg()[0], OtherLoad()
        t0 = time.time()
        result = module.run(quick=args.quick)
        load_others = others.stop()
        load_after = os.getloadavg()[0]
        result.update(
            suite=name,
            quick=args.quick,
            seconds=round(time.time() - t0, 1),
            time=time.strftime("%F %T"),
            machine=platform.platform(),
            cpu=cpu_model(),
            load_before=load_before,
            load_after=load_after,
            load_of_others_during=load_others,
        )
        busy = load_before >= IDLE_LOAD or load_others >= IDLE_LOAD
        if not args.no_history:  # every line, busy or not: compare and table skip the busy ones
            load = dict(load_before=load_before, load_after=load_after, load_of_others_during=load_others, busy=busy)
            history.append(args.history, history.entries(context, result["summary"], load))
        if busy and not args.allow_busy:  # a number from a busy machine is not a number to report
            print(
                f"## {name}: NOT written: the machine was busy (load average {load_before:.2f} before; other "
                f"processes used {load_others:.2f} cores during it; idle means < {IDLE_LOAD}). Re-run on an idle "
                "machine, or --allow-busy."
            )
            summaries += [
                f"{line} [busy: load {load_before:.2f} before, others {load_others:.2f} during]"
                for line in result["summary"]
            ]
            continue
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / f"{name}.json").write_text(json.dumps(result, indent=2, default=str))
        print(f"## {name} ({result['cpu']}, {os.cpu_count()} cores)\n\n{markdown_table(result['rows'])}\n")
        summaries += result["summary"]
    print("\n".join(summaries))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
