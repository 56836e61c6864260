"""The benchmark history (scripts/benchmarks/history.py): what a run appends, `compare`'s verdicts
and exit status, the table of the last complete run. Planted histories only: no suite runs here.

Run: pytest tests/test_bench_history.py -q   (seconds)
"""

from __future__ import annotations

import json
import os
import types

import pytest
from bench_suites import runner, suite

history = suite("history")
common = suite("common")

AMD, INTEL = "AMD EPYC 7763 64-Core Processor", "Intel(R) Xeon(R) Platinum 8375C CPU @ 2.90GHz"
IDLE = dict(load_before=0.1, load_after=1.9, load_of_others_during=0.05, busy=False)
BUSY = dict(load_before=1.7, load_after=2.4, load_of_others_during=0.9, busy=True)


TRL = "sft: ours/trl-default non-pad-tokens-per-s ratio"
PLAIN = "sft: ours/plain-loop non-pad-tokens-per-s ratio"
TINY = "grpo: ours/trl-default[tiny] s-per-step ratio"
MEMORY = "distill_memory: ours/whole peak-MiB ratio"
CEILING = "rollout: fp32-ceiling/hf-generate tokens-per-s ratio"
NO_RATIO = dict(name=None, unit=None, ratio=None, target=None, spread=None, num_ratios=None)


@pytest.mark.parametrize(
    "line, expected",
    [
        (
            f"{TRL} 1.75 (target >= 1.5) [spread 4.0% of 3 ratios]",
            dict(
                suite="sft",
                name="ours/trl-default",
                unit="non-pad-tokens-per-s",
                ratio=1.75,
                target=1.5,
                spread=0.04,
                num_ratios=3,
            ),
        ),
        (
            "grpo_padding: ours/padded tokens-per-s ratio 1.48 (target >= 1.3) [spread 2.5% of 4 ratios] "
            "[same loss to 1.0e-07; 2698 real of 4136 padded tokens]",
            dict(
                suite="grpo_padding",
                name="ours/padded",
                unit="tokens-per-s",
                ratio=1.48,
                target=1.3,
                spread=0.025,
                num_ratios=4,
            ),
        ),
        (
            f"{MEMORY} 4.52 (target >= 2) [grads equal to 6.0e-08]",
            dict(
                suite="distill_memory",
                name="ours/whole",
                unit="peak-MiB",
                ratio=4.52,
                target=2.0,
                spread=None,
                num_ratios=None,
            ),
        ),
        (
            f"{CEILING} 3.36 (GEMMs + KV-cache reads only: no exact fp32 engine on this machine passes it)",
            dict(
                suite="rollout",
                name="fp32-ceiling/hf-generate",
                unit="tokens-per-s",
                ratio=3.36,
                target=None,
                spread=None,
                num_ratios=None,
            ),
        ),
        ("sft: padding ours 1.2% vs trl-default 30.1% (target < 5%)", dict(suite="sft", **NO_RATIO)),
        (
            "grpo_async: async (split cores) / sync (all cores) s-per-step speedup 0.95 (no target: 2 cores)",
            dict(suite="grpo_async", **NO_RATIO),
        ),
    ],
)
def test_parse_summary(line, expected):
    assert history.parse_summary(line) == expected


def test_summary_line_carries_the_spread_of_its_ratios_and_parses_back():
    assert common.relative_spread([1.7]) is None and common.relative_spread([]) is None
    assert common.relative_spread([1.8, 1.7, 1.75]) == pytest.approx(0.1 / 1.75)
    line = common.summary_line("sft", "ours/plain-loop", "non-pad-tokens-per-s", 0.82, 0.9, [0.80, 0.82, 0.85])
    assert line == f"{PLAIN} 0.82 (target >= 0.9) [spread 6.1% of 3 ratios]"
    assert history.parse_summary(line)["spread"] == 0.061
    # one measurement: no spread to state, the line keeps its plain shape
    one = common.summary_line("grpo", "ours/trl-default[tiny]", "s-per-step", 1.37, 1.5, [1.37])
    assert one == f"{TINY} 1.37 (target >= 1.5)"


def _run(
    run: str,
    commit: str,
    lines: list[str],
    cpu: str = AMD,
    quick: bool = False,
    load: dict = IDLE,
    invocation: str = "all",
    suites: list[str] | None = None,
) -> list[dict]:
    """The entries one planted run appends (no git, no clock: a fixed context)."""
    suites = suites if suites is not None else sorted({line.split(":")[0] for line in lines})
    context = dict(
        run=run,
        invocation=invocation,
        run_suites=suites,
        quick=quick,
        commit=commit,
        dirty=False,
        cpu=cpu,
        cores=2,
        date=f"2026-01-0{run[-1]}T10:00:00+0000",
    )
    return history.entries(context, lines, load)


OLD_AMD = [
    f"{TRL} 1.75 (target >= 1.5) [spread 4.0% of 3 ratios]",
    f"{PLAIN} 1.00 (target >= 0.9) [spread 2.0% of 3 ratios]",
    "sft: padding ours 1.2% vs trl-default 30.1% (target < 5%)",
    f"{TINY} 1.88 (target >= 1.5) [spread 10.0% of 6 ratios]",
    f"{MEMORY} 4.52 (target >= 2) [grads equal to 6.0e-08]",
    f"{CEILING} 4.18 (GEMMs + KV-cache reads only)",
]
NEW_AMD = [
    f"{TRL} 1.40 (target >= 1.5) [spread 3.0% of 3 ratios]",  # -20%: far beyond 4% + the floor
    f"{PLAIN} 0.96 (target >= 0.9) [spread 1.0% of 3 ratios]",  # -4%: within max(2%, 1%) + 3%
    "sft: padding ours 1.5% vs trl-default 30.1% (target < 5%)",
    f"{TINY} 1.75 (target >= 1.5) [spread 10.0% of 6 ratios]",  # -7%: within its own 10% spread
    f"{MEMORY} 4.34 (target >= 2) [grads equal to 6.0e-08]",  # -4%, no spread: beyond the floor
    f"{CEILING} 2.00 (GEMMs + KV-cache reads only)",  # no target: recorded, never judged
    "pretrain: ours/plain-torch tokens-per-s-fp32 ratio 0.99 (target >= 0.95)",  # a new line
]
# Another CPU between them, much lower: a baseline for nothing on the AMD machine
INTEL_RUN = [f"{TRL} 1.20 (target >= 1.5) [spread 2.0% of 3 ratios]"]
# A quick run on the AMD machine: other shapes, never compared with full-size runs
QUICK_RUN = [f"{TRL} 2.50 (target >= 1.5) [spread 9.0% of 2 ratios]"]


def _planted() -> list[dict]:
    return (
        _run("run1", "aaa1111", OLD_AMD)
        + _run("run2", "bbb2222", INTEL_RUN, cpu=INTEL)
        + _run("run3", "ccc3333", QUICK_RUN, quick=True)
        + _run("run4", "ddd4444", NEW_AMD)
    )


def test_compare_flags_the_planted_slowdown_only_against_the_same_machine_kind():
    lines, dropped = history.compare(_planted())
    assert dropped
    assert lines == [
        f"ddd4444 (2026-01-04T10:00:00+0000, {AMD}, 2 cores) against the last earlier run of each "
        "line on this machine kind:",
        f"{TRL} 1.75 -> 1.40 (-20%, spread 4%; aaa1111 -> ddd4444): DROPPED",
        f"{PLAIN} 1.00 -> 0.96 (-4%, spread 2%; aaa1111 -> ddd4444): ok",
        f"{TINY} 1.88 -> 1.75 (-7%, spread 10%; aaa1111 -> ddd4444): ok",
        f"{MEMORY} 4.52 -> 4.34 (-4%, spread unmeasured; aaa1111 -> ddd4444): DROPPED",
        "pretrain: ours/plain-torch tokens-per-s-fp32 ratio 0.99: no earlier run on this machine kind",
    ]


def test_compare_picks_the_run_by_cpu_and_a_run_within_its_spread_passes():
    lines, dropped = history.compare(_planted(), cpu="xeon")  # the Intel run: none earlier there
    assert not dropped and lines[1:] == [f"{TRL} 1.20: no earlier run on this machine kind"]
    steady = _run("run1", "aaa1111", OLD_AMD) + _run("run2", "bbb2222", OLD_AMD[:2])
    lines, dropped = history.compare(steady)
    assert not dropped and [line.rsplit(": ", 1)[1] for line in lines[1:]] == ["ok", "ok"]
    with pytest.raises(ValueError, match="no benchmark run in the history on a CPU matching 'arm'"):
        history.compare(_planted(), cpu="arm")


def test_busy_lines_are_neither_judged_nor_the_earlier_run():
    slow = [f"{TRL} 0.90 (target >= 1.5)"]
    planted = _run("run1", "aaa1111", OLD_AMD[:1]) + _run("run2", "bbb2222", slow, load=BUSY)
    lines, dropped = history.compare(planted)
    assert not dropped and lines[1:] == [f"{TRL} 0.90: busy (load 1.70 before, others 0.90 during), not compared"]
    lines, _ = history.compare(planted + _run("run3", "ccc3333", OLD_AMD[:1]))
    assert lines[1] == f"{TRL} 1.75 -> 1.75 (+0%, spread 4%; aaa1111 -> ccc3333): ok"


def test_compare_command_exit_status(tmp_path, capsys):
    bench = runner()
    path = tmp_path / "history.jsonl"
    history.append(path, _planted())
    assert bench.main(["compare", "--history", str(path)]) == 1
    assert capsys.readouterr().out.count("DROPPED") == 2
    steady = tmp_path / "steady.jsonl"
    history.append(steady, _run("run1", "aaa1111", OLD_AMD) + _run("run2", "bbb2222", OLD_AMD))
    assert bench.main(["compare", "--history", str(steady)]) == 0
    capsys.readouterr()
    assert bench.main(["compare", "--history", str(tmp_path / "none.jsonl")]) == 2
    assert capsys.readouterr().err.startswith(
        "benchmark.py compare: error: no benchmark run in the history: run `python scripts/benchmark.py all`"
    )
    path.write_text(path.read_text() + "{not json\n")
    assert bench.main(["compare", "--history", str(path)]) == 2
    assert "history.jsonl:16: not a JSON history entry" in capsys.readouterr().err


def test_a_run_appends_every_summary_line_with_its_machine_and_load(tmp_path, monkeypatch, capsys):
    bench = runner()
    lines = [
        "fake: ours/plain tokens-per-s ratio 1.10 (target >= 1.0) [spread 2.0% of 3 ratios]",
        "fake: peak RSS 100 MiB",
    ]
    fake = types.SimpleNamespace(run=lambda quick: {"rows": [{"stack": "ours"}], "summary": lines})
    monkeypatch.setitem(__import__("sys").modules, "benchmarks.fake", fake)
    monkeypatch.setattr(bench, "SUITES", ["fake"])
    monkeypatch.setattr(bench, "keep_freed_memory", lambda: None)
    monkeypatch.setattr(bench, "wait_until_idle", lambda: None)
    monkeypatch.setattr(bench, "OtherLoad", lambda: types.SimpleNamespace(stop=lambda: 0.05))
    monkeypatch.setattr(history, "git_state", lambda: ("abc1234", True))
    monkeypatch.setenv("SMOLALIGN_CPU_BF16", "1")
    loads = iter([0.1, 1.9, 1.2, 2.0, 0.1, 0.1])  # before and after each run; the second is busy
    monkeypatch.setattr(os, "getloadavg", lambda: (next(loads), 0.0, 0.0))
    path = tmp_path / "history.jsonl"
    for _ in range(2):
        assert bench.main(["all", "--history", str(path), "--out", str(tmp_path / "out")]) == 0
    entries = history.load(path)
    assert [e["line"] for e in entries] == lines * 2
    first, second = entries[0], entries[2]
    expected = dict(
        suite="fake",
        name="ours/plain",
        unit="tokens-per-s",
        ratio=1.1,
        target=1.0,
        spread=0.02,
        num_ratios=3,
        commit="abc1234",
        dirty=True,
        cpu=bench.cpu_model(),
        cores=os.cpu_count(),
        quick=False,
        invocation="all",
        run_suites=["fake"],
        load_before=0.1,
        load_after=1.9,
        load_of_others_during=0.05,
        busy=False,
    )
    assert {k: first[k] for k in expected} == expected
    assert entries[1]["ratio"] is None and entries[1]["suite"] == "fake"  # kept as text
    assert first["run"] == entries[1]["run"] != second["run"]
    assert second["busy"] and second["load_before"] == 1.2
    assert first["date"][:2] == "20"
    # the busy run left no JSON result behind, the idle one did
    assert json.loads((tmp_path / "out" / "fake.json").read_text())["load_before"] == 0.1
    assert "fake: NOT written: the machine was busy" in capsys.readouterr().out
    assert (
        bench.main(["all", "--history", str(tmp_path / "other.jsonl"), "--no-history", "--out", str(tmp_path / "out")])
        == 0
    )
    assert not (tmp_path / "other.jsonl").exists()


def test_table_is_the_last_complete_run_naming_its_commit_and_cpu(tmp_path, capsys):
    planted = (
        _run("run1", "aaa1111", OLD_AMD)
        + _run("run2", "bbb2222", OLD_AMD[:1], suites=["sft", "grpo"])  # grpo crashed
        + _run("run3", "ccc3333", QUICK_RUN, quick=True)
        + _run("run4", "ddd4444", OLD_AMD, load=BUSY)
        + _run("run5", "eee5555", INTEL_RUN, invocation="sft")
    )
    table = history.table(planted, source="docs/research/bench/history.jsonl")
    assert table == "\n".join(
        [
            f"`make bench` at commit aaa1111: {AMD}, 2 cores, 2026-01-01T10:00:00+0000 "
            "(docs/research/bench/history.jsonl).",
            "",
            "| suite | comparison | unit | ratio | spread | target | met |",
            "|---|---|---|---:|---:|---:|---|",
            "| sft | ours/trl-default | non-pad-tokens-per-s | 1.75 | 4% | >= 1.5 | yes |",
            "| sft | ours/plain-loop | non-pad-tokens-per-s | 1.00 | 2% | >= 0.9 | yes |",
            "| grpo | ours/trl-default[tiny] | s-per-step | 1.88 | 10% | >= 1.5 | yes |",
            "| distill_memory | ours/whole | peak-MiB | 4.52 | - | >= 2 | yes |",
            "| rollout | fp32-ceiling/hf-generate | tokens-per-s | 4.18 | - | - | - |",
        ]
    )
    below = history.table(_run("run1", "aaa1111", NEW_AMD[:1]))
    assert below.endswith("| ours/trl-default | non-pad-tokens-per-s | 1.40 | 3% | >= 1.5 | **no** |")
    with pytest.raises(ValueError, match="no complete `make bench` run in the history"):
        history.table(planted[-1:])

    page = tmp_path / "README.md"
    markers = f"{history.TABLE_START}\nold table\n{history.TABLE_END}"
    page.write_text(f"# Speed\n\nintro\n\n{markers}\n\nafter\n")
    bench = runner()
    path = tmp_path / "history.jsonl"
    history.append(path, planted)
    assert bench.main(["table", "--history", str(path), "--write", str(page)]) == 0
    written = page.read_text()
    assert written.startswith(f"# Speed\n\nintro\n\n{history.TABLE_START}\n`make bench` at commit aaa1111")
    assert written.endswith(f"| - | - |\n{history.TABLE_END}\n\nafter\n") and "old table" not in written
    page.write_text("# no markers\n")
    assert bench.main(["table", "--history", str(path), "--write", str(page)]) == 2
    assert page.read_text() == "# no markers\n"
    assert "no `<!-- bench-table:start -->` ... `<!-- bench-table:end -->` section" in capsys.readouterr().err
