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

from align.runtime.memory import keep_freed_memory

SUITES = ["pretrain", "sft", "rollout", "grpo", "grpo_padding", "distill_memory", "grpo_async"]
# Run by name only: needs the SmolLM2-135M chain's models and ~30 min (not yet measured; issue 23 item 4).
EXTRA_SUITES = ["grpo_tta", "vllm_seeding"]
IDLE_LOAD = 0.5  # 1-minute load average below which a machine counts as idle (before and after a suite)


class OtherLoad:
    """CPU used by OTHER processes while a suite runs, in cores: the machine's busy time (/proc/stat) minus this
    process's own (and its waited-for children's). The 1-minute load average after a suite counts the suite itself."""

    def __init__(self):
        self.wall, self.busy, self.own = time.time(), self._busy(), self._own()

    @staticmethod
    def _busy() -> float:
        with open("/proc/stat") as f:
            fields = [float(x) for x in f.readline().split()[1:]]
        idle = fields[3] + (fields[4] if len(fields) > 4 else 0.0)  # idle + iowait
        return (sum(fields[:8]) - idle) / os.sysconf("SC_CLK_TCK")

    @staticmethod
    def _own() -> float:
        t = os.times()
        return t.user + t.system + t.children_user + t.children_system

    def stop(self) -> float:
        wall = max(time.time() - self.wall, 1e-9)
        return max(0.0, (self._busy() - self.busy) - (self._own() - self.own)) / wall


def cpu_model() -> str:
    """The CPU's model name: ratios move with it (MKL's fp32 sgemm runs at under half oneDNN's speed on AMD EPYC)."""
    try:
        with open("/proc/cpuinfo") as f:
            return next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), "unknown")
    except OSError:
        return platform.processor() or "unknown"


def wait_until_idle(limit_s: float = 300.0) -> None:
    """Let the 1-minute load average fall below IDLE_LOAD before a suite: after `make setup` or the suite before it
    (two busy cores) it takes ~1.5 minutes. A machine still busy after `limit_s` is measured, and marked busy."""
    start = time.time()
    if os.getloadavg()[0] >= IDLE_LOAD:
        print(f"waiting for the load average ({os.getloadavg()[0]:.2f}) to fall below {IDLE_LOAD} ...", flush=True)
    while os.getloadavg()[0] >= IDLE_LOAD and time.time() - start < limit_s:
        time.sleep(5)


def markdown_table(rows: list[dict]) -> str:
    if not rows:
        return "(no rows)"
    cols = list(dict.fromkeys(k for r in rows for k in r))
    fmt = lambda v: f"{v:.3g}" if isinstance(v, float) else str(v)  # noqa: E731
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(fmt(r.get(c, "")) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


def read_history(argv: list[str]) -> int:
    """`compare` and `table`: read the history and print. Returns 1 when `compare` found a drop, 2
    (with the message on stderr) when there is nothing to read."""
    parser = argparse.ArgumentParser(prog="benchmark.py " + argv[0], description=history.__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["compare", "table"])
    parser.add_argument("--history", type=Path, default=history.HISTORY,
                        help="the history file (JSON lines)")
    parser.add_argument("--cpu", default=None, help="the last run on a CPU whose model name "
                        "contains this, case-insensitive (default: the last run)")
    parser.add_argument("--write", type=Path, default=None,
                        help="table: also write it between the bench-table markers of this file")
    args = parser.parse_args(argv)
    try:
        entries = history.load(args.history)
        if args.command == "compare":
            lines, dropped = history.compare(entries, args.cpu)
            print("\n".join(lines))
            return 1 if dropped else 0
        text = history.table(entries, args.cpu, source=str(args.history))
        if args.write is not None:
            history.write_section(args.write, text)
    except ValueError as e:
        print(f"benchmark.py {args.command}: error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else argv
    if argv[:1] and argv[0] in ("compare", "table"):
        return read_history(argv)
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("suite", choices=SUITES + EXTRA_SUITES + ["all"])
    parser.add_argument("--quick", action="store_true", help="fewer repetitions and smaller shapes")
    parser.add_argument("--out", default="outputs/bench", help="directory for the JSON results")
    parser.add_argument("--allow-busy", action="store_true",
                        help=f"write results even when the machine was busy (load >= {IDLE_LOAD}, before or by others)")
    parser.add_argument("--history", type=Path, default=history.HISTORY,
                        help="append every summary line to this file (JSON lines)")
    parser.add_argument("--no-history", action="store_true", help="append nothing to the history")
    args = parser.parse_args(argv)
    suites = SUITES if args.suite == "all" else [args.suite]
    context = history.run_context(args.suite, suites, args.quick, cpu_model(), os.cpu_count())
    # What every stage of ours runs with on a CPU (align.runtime.memory.keep_freed_memory), applied before any suite so that
    # ours and the baseline beside it in this process run under the same allocator, whichever is built first.
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
        result.update(suite=name, quick=args.quick, seconds=round(time.time() - t0, 1), time=time.strftime("%F %T"),
                      machine=platform.platform(), cpu=cpu_model(), load_before=load_before,
                      load_after=load_after, load_of_others_during=load_others)
        busy = load_before >= IDLE_LOAD or load_others >= IDLE_LOAD
        if not args.no_history:  # every line, busy or not: compare and table skip the busy ones
            load = dict(load_before=load_before, load_after=load_after,
                        load_of_others_during=load_others, busy=busy)
            history.append(args.history, history.entries(context, result["summary"], load))
        if busy and not args.allow_busy:  # a number from a busy machine is not a number to report
            print(f"## {name}: NOT written: the machine was busy (load average {load_before:.2f} before; other "
                  f"processes used {load_others:.2f} cores during it; idle means < {IDLE_LOAD}). Re-run on an idle "
                  "machine, or --allow-busy.")
            summaries += [f"{line} [busy: load {load_before:.2f} before, others {load_others:.2f} during]"
                          for line in result["summary"]]
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
