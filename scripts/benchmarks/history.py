"""The benchmark history: every summary line of every `scripts/benchmark.py` run, one JSON object
a line, with the commit, the CPU and the load it ran under. `compare` holds a run against the last
earlier one on the same kind of machine; `table` prints the markdown table of the last full run.

    python scripts/benchmark.py all           # appends to docs/research/bench/history.jsonl
    python scripts/benchmark.py compare [--history PATH] [--cpu KIND]
    python scripts/benchmark.py table [--history PATH] [--cpu KIND] [--write FILE]

A summary line such as
`sft: ours/trl-default non-pad-tokens-per-s ratio 1.75 (target >= 1.5) [spread 4.0% of 3 ratios]`
becomes an entry with suite, name, unit, ratio, target and spread (the relative range of the
single measurements behind the median: `benchmarks.common.relative_spread`); a line of another
shape keeps its text only. Ratios are compared only within one machine kind: the same CPU model,
core count and size (`--quick` or not). They move with the machine, not only with the code (MKL's
fp32 GEMM runs at under half oneDNN's speed on an AMD EPYC).
"""

from __future__ import annotations

import argparse
import json
import re
import subprocess
import sys
import time
import uuid
from collections.abc import Callable, Iterable
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
HISTORY = ROOT / "docs" / "research" / "bench" / "history.jsonl"
# Added to the larger of the two runs' spreads: runs in separate processes, minutes or days apart,
# differ by more than the repetitions inside one run do (placement, clock, page cache).
FLOOR = 0.03
TABLE_START, TABLE_END = "<!-- bench-table:start -->", "<!-- bench-table:end -->"

_LINE = re.compile(
    r"(?P<suite>[\w-]+): (?P<name>\S+) (?P<unit>\S+) ratio (?P<ratio>\d+(?:\.\d+)?)"
    r"(?: \(target >= (?P<target>\d+(?:\.\d+)?)\))?"
)
_SPREAD = re.compile(r"\[spread (?P<spread>\d+(?:\.\d+)?)% of (?P<num>\d+) ratios\]")


def parse_summary(line: str) -> dict:
    """The fields of one summary line; `ratio` None for a line without one (kept as text)."""
    fields = dict(
        suite=line.split(":", 1)[0], name=None, unit=None, ratio=None, target=None, spread=None, num_ratios=None
    )
    match = _LINE.match(line)
    if match:
        target = match["target"]
        fields.update(
            suite=match["suite"],
            name=match["name"],
            unit=match["unit"],
            ratio=float(match["ratio"]),
            target=None if target is None else float(target),
        )
        spread = _SPREAD.search(line, match.end())
        if spread:
            fields.update(spread=float(spread["spread"]) / 100, num_ratios=int(spread["num"]))
    return fields


def git_state(root: Path = ROOT) -> tuple[str, bool]:
    """(short commit, whether tracked files differ from it). The history file does not count: a
    run appends to it, and it changes nothing that is measured."""

    def git(*args: str) -> str:
        done = subprocess.run(["git", *args], cwd=root, capture_output=True, text=True, check=True)
        return done.stdout.strip()

    try:
        commit = git("rev-parse", "--short", "HEAD")
        changed = git(
            "status", "--porcelain", "--untracked-files=no", "--", ".", f":(exclude){HISTORY.relative_to(ROOT)}"
        )
    except (OSError, subprocess.CalledProcessError):  # not a git checkout (an sdist, a copied tree)
        return "unknown", True
    return commit, bool(changed)


def run_context(invocation: str, suites: list[str], quick: bool, cpu: str, cores: int) -> dict:
    """What every entry of one `benchmark.py` run shares; `run`, an id of its own, tells them from
    the next run's."""
    commit, dirty = git_state()
    return dict(
        run=uuid.uuid4().hex[:12],
        invocation=invocation,
        run_suites=suites,
        quick=quick,
        commit=commit,
        dirty=dirty,
        cpu=cpu,
        cores=cores,
        date=time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    )


def entries(context: dict, summary: Iterable[str], load: dict) -> list[dict]:
    """One entry per summary line of a suite: the run's context, the line's fields, the load it ran
    under (`load_before`, `load_after`, `load_of_others_during`, `busy`) and the line itself."""
    return [{**context, **parse_summary(line), **load, "line": line} for line in summary]


def append(path: Path, new: list[dict]) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path, "a") as f:
        f.writelines(json.dumps(entry, sort_keys=True) + "\n" for entry in new)


def load(path: Path) -> list[dict]:
    """The history's entries in the order they were written ([] for no file). A line that is not
    JSON raises ValueError naming it."""
    if not path.exists():
        return []
    out = []
    for number, line in enumerate(path.read_text().splitlines(), start=1):
        if not line.strip():
            continue
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError as e:
            raise ValueError(f"{path}:{number}: not a JSON history entry ({e.msg}): fix or delete the line") from e
    return out


def machine(entry: dict) -> tuple:
    """The kind of machine and run within which a ratio is comparable."""
    return entry["cpu"], entry["cores"], entry["quick"]


def _latest_run(
    history: list[dict], cpu: str | None, keep: Callable[[list[dict]], bool] = lambda run: True
) -> list[int]:
    """The positions in `history` of the last run (the last on a CPU model containing `cpu`,
    case-insensitive, when given) whose entries `keep` accepts; [] when there is none."""
    runs: dict[str, list[int]] = {}
    for i, entry in enumerate(history):
        if cpu is None or cpu.lower() in entry["cpu"].lower():
            runs.setdefault(entry["run"], []).append(i)
    return next((run for run in reversed(runs.values()) if keep([history[i] for i in run])), [])


def _label(entry: dict) -> str:
    return entry["commit"] + ("+dirty" if entry["dirty"] else "")


def _comparison(entry: dict) -> tuple:
    return entry["suite"], entry["name"], entry["unit"], machine(entry)


def compare(history: list[dict], cpu: str | None = None) -> tuple[list[str], bool]:
    """Each comparison of the last run (the last on a CPU model containing `cpu`) against the same
    comparison's last earlier idle entry of the same machine kind (`machine`). Dropped: the new
    ratio lies below the old by more than the larger spread of the two plus FLOOR, relative. Lines
    without a target are not judged; one measured on a busy machine is neither judged nor used as
    the earlier one. Returns (one line each, whether any dropped)."""
    latest = _latest_run(history, cpu)
    if not latest:
        recorded = sorted({e["cpu"] for e in history})
        where = "" if cpu is None else f" on a CPU matching {cpu!r} (recorded: {recorded})"
        raise ValueError(f"no benchmark run in the history{where}: run `python scripts/benchmark.py all` first")
    first = history[latest[0]]
    lines = [
        f"{_label(first)} ({first['date']}, {first['cpu']}, {first['cores']} cores"
        f"{', quick' if first['quick'] else ''}) against the last earlier run of each line on "
        "this machine kind:"
    ]
    dropped = False
    for position in latest:
        new = history[position]
        if new["ratio"] is None or new["target"] is None:
            continue
        head = f"{new['suite']}: {new['name']} {new['unit']} ratio"
        if new["busy"]:
            lines.append(
                f"{head} {new['ratio']:.2f}: busy (load {new['load_before']:.2f} before, "
                f"others {new['load_of_others_during']:.2f} during), not compared"
            )
            continue
        old = next(
            (
                e
                for e in reversed(history[:position])
                if e["run"] != new["run"]
                and not e["busy"]
                and e["ratio"] is not None
                and _comparison(e) == _comparison(new)
            ),
            None,
        )
        if old is None:
            lines.append(f"{head} {new['ratio']:.2f}: no earlier run on this machine kind")
            continue
        spreads = [s for s in (old["spread"], new["spread"]) if s is not None]
        spread = max(spreads, default=0.0)
        change = new["ratio"] / old["ratio"] - 1
        drop = change < -(spread + FLOOR)
        dropped |= drop
        shown = f"spread {spread:.0%}" if spreads else "spread unmeasured"
        lines.append(
            f"{head} {old['ratio']:.2f} -> {new['ratio']:.2f} ({change:+.0%}, {shown}; "
            f"{_label(old)} -> {_label(new)}): {'DROPPED' if drop else 'ok'}"
        )
    return lines, dropped


def _complete(run: list[dict]) -> bool:
    """A run of every suite (`all`), full size, each suite recorded, none on a busy machine."""
    first = run[0]
    return (
        first["invocation"] == "all"
        and not first["quick"]
        and not any(e["busy"] for e in run)
        and set(first["run_suites"]) <= {e["suite"] for e in run}
    )


def table(history: list[dict], cpu: str | None = None, source: str = "the benchmark history") -> str:
    """The markdown table of the last complete run (`_complete`), naming its commit, CPU and date:
    every summary line with a ratio, with its spread and target."""
    run = [history[i] for i in _latest_run(history, cpu, keep=_complete)]
    if not run:
        which = "" if cpu is None else f", CPU matching {cpu!r}"
        raise ValueError(
            f"no complete `make bench` run in the history (every suite, full size, "
            f"idle machine{which}): run `make bench` on an idle machine"
        )
    first = run[0]
    out = [
        f"`make bench` at commit {_label(first)}: {first['cpu']}, {first['cores']} cores, {first['date']} ({source}).",
        "",
        "| suite | comparison | unit | ratio | spread | target | met |",
        "|---|---|---|---:|---:|---:|---|",
    ]
    for e in run:
        if e["ratio"] is None:
            continue
        spread = "-" if e["spread"] is None else f"{e['spread']:.0%}"
        target, met = "-", "-"
        if e["target"] is not None:
            target, met = f">= {e['target']:g}", "yes" if e["ratio"] >= e["target"] else "**no**"
        out.append(f"| {e['suite']} | {e['name']} | {e['unit']} | {e['ratio']:.2f} | {spread} | {target} | {met} |")
    return "\n".join(out)


def write_section(path: Path, text: str) -> None:
    """Replace what lies between TABLE_START and TABLE_END in the file `path` by `text`."""
    content = path.read_text()
    start, end = content.find(TABLE_START), content.find(TABLE_END)
    if start < 0 or end < start:
        raise ValueError(
            f"{path}: no `{TABLE_START}` ... `{TABLE_END}` section to write the table "
            "into: add the two markers where the table goes"
        )
    path.write_text(content[: start + len(TABLE_START)] + "\n" + text + "\n" + content[end:])


def cli(argv: list[str]) -> int:
    """`compare` and `table`: read the history and print. Returns 1 when `compare` found a drop, 2
    (with the message on stderr) when there is nothing to read."""
    parser = argparse.ArgumentParser(
        prog="benchmark.py", description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    parser.add_argument("command", choices=["compare", "table"])
    parser.add_argument("--history", type=Path, default=HISTORY, help="the history file (JSON lines)")
    parser.add_argument(
        "--cpu",
        default=None,
        help="the last run on a CPU whose model name contains this, case-insensitive (default: the last run)",
    )
    parser.add_argument(
        "--write", type=Path, default=None, help="table: also write it between the bench-table markers of this file"
    )
    args = parser.parse_args(argv)
    try:
        entries = load(args.history)
        if args.command == "compare":
            lines, dropped = compare(entries, args.cpu)
            print("\n".join(lines))
            return 1 if dropped else 0
        shown = args.history.resolve()  # named from the checkout's root when it lies inside it
        source = str(shown.relative_to(ROOT) if shown.is_relative_to(ROOT) else shown)
        text = table(entries, args.cpu, source=source)
        if args.write is not None:
            write_section(args.write, text)
    except ValueError as e:
        print(f"benchmark.py {args.command}: error: {e}", file=sys.stderr)
        return 2
    print(text)
    return 0
