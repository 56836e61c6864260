r"""Code verification: run the completion's program against the row's tests in the sandbox.

``code_reward(completions, tests, entry_point=None)`` takes each completion's solution block
(``extract_code``: the fenced Python block that defines the entry point or a name the tests take from the
solution, else the only one, else the last that defines something or reads input: never a usage example or a
block of asserts after it; the raw text after any ``<think>`` block when there is no block), runs it and the
row's ``tests`` in ``rewards.sandbox`` (no network, no host files, no parent environment, CPU/memory/process/
file limits, a wall-clock kill), and scores 1.0 when every test passed, 0.0 on failure, timeout or crash. A
completion longer than ``MAX_COMPLETION_CHARS`` scores 0 unread. Fences are read by ``rewards.fences`` in one
linear pass.

Tests are human-eval style (a ``check(candidate)`` function, called on ``entry_point``), plain ``assert``
statements (one text, or a list of them), or stdin/stdout cases: a list of ``{"input": ..., "output": ...}`` (or its
JSON text), each run as a program (its stdin the case's input, ``exit()``/``quit()`` available) that must exit with
status 0 and print the expected output. Outputs are compared line by line, as competitive judges do: trailing
whitespace of each line and trailing blank lines are ignored; leading whitespace, blank lines inside, case and
everything else count.

None (abstain, as TRL and ``rewards.score`` read it: the row adds nothing to the total) for a row no
solution can pass or fail: no tests, or tests that are a data error (``rewards.checks.data_error``: they
do not parse, check nothing — no ``assert``, ``raise`` or ``assert*``/``fail*`` call — or define
``check(candidate)`` with no entry point and no call of ``check``). Each kind of data error is warned once
per process. Tests that reach no check at run time, or never call the solution, score 0. Where rows are
loaded, ``check_code_rows`` refuses the ``check(candidate)`` rows without an entry point with a ``ValueError``
naming the row.

The verdict comes from ``rewards.judge``: the tests run in a second sandbox and see only plain data the
solution returns, so a solution cannot forge a pass (see that module). Rows run in parallel (``num_workers``,
default up to 4).
Limits are keyword arguments (``timeout_s``, ``memory_mb``, ...), set per recipe via ``reward_kwargs``.

Run the examples: ``python -m pytest --doctest-modules rewards/code.py``.
"""

from __future__ import annotations

import builtins
import json
import os
import re
import warnings
from collections.abc import Iterable
from concurrent.futures import ThreadPoolExecutor
from functools import lru_cache
from typing import Any

from rewards.checks import data_error, free_names, parse_source
from rewards.fences import fences
from rewards.judge import execute
from rewards.match import completion_text, strip_think
from rewards.sandbox import SandboxLimits, run_program

MAX_COMPLETION_CHARS = 1 << 20  # a longer completion is not read: it scores 0, and nothing of it runs
# top-level names a block defines (def, class, an assignment) and whether it reads input: one line at a time
_DEFINES = re.compile(
    r"^(?:async[ \t]+)?(?:def|class)[ \t]+([A-Za-z_]\w*)|^([A-Za-z_]\w*)[ \t]*(?::[^\n=]*)?=(?!=)", re.M
)
_READS_INPUT = re.compile(r"\binput\(|\bstdin\b|\bopen\([ \t]*0\b")


def defined_names(code: str) -> set[str]:
    r"""The names a block of code defines at its top level (a ``def``, a ``class``, an assignment).

    >>> sorted(defined_names("import math\ndef add(a, b):\n    x = 1\nclass P: pass\nN: int = 3\nassert add(1) == 3"))
    ['N', 'P', 'add']
    """
    return {m.group(1) or m.group(2) for m in _DEFINES.finditer(code)}


def extract_code(text: str, names: Iterable[str] | str | None = None) -> str:
    r"""The solution's code out of a completion: the fenced Python block that defines one of ``names`` (the entry
    point, or the names the tests take from the solution), else the only Python block, else the last one that
    defines something or reads input (not a usage example or a block of asserts), else the text after any
    reasoning when there is no block. Blocks are read by ``rewards.fences`` (backtick and tilde fences, any line
    ends, a fence line inside a string is the string's); a block tagged python is preferred to a bare one.

    >>> extract_code("Try this:\n```python\nx = 1\n```\nor better\n```python\nx = 2\n```")
    'x = 2\n'
    >>> extract_code("```python\ndef add(a, b):\n    return a + b\n```\nUsage:\n```python\nprint(add(2, 3))\n```")
    'def add(a, b):\n    return a + b\n'
    >>> extract_code("```python\ndef f():\n    return 1\n```\n```python\nassert f() == 1\n```", names=["f"])
    'def f():\n    return 1\n'
    >>> extract_code("<think>\nhmm\n</think>\ndef f():\n    return 1")
    'def f():\n    return 1'
    """
    body = strip_think(text)
    blocks = [f for f in fences(body) if f.is_python]
    if not blocks:
        return body.strip()
    wanted = {names} if isinstance(names, str) else set(names or ())
    if wanted:
        defining = [f for f in blocks if defined_names(f.body) & wanted]
        if defining:
            return defining[-1].body
    pool = [f for f in blocks if f.lang] or blocks
    if len(pool) == 1:
        return pool[0].body
    solutions = [f for f in pool if defined_names(f.body) or _READS_INPUT.search(f.body)]
    return (solutions or pool)[-1].body


@lru_cache(maxsize=1024)
def solution_names(tests: str, entry_point: str | None = None) -> frozenset[str]:
    """The names the row's tests take from the solution: its entry point, else the names assert-style tests read
    and never bind (builtins only when the tests read no other). Empty for tests that do not parse.

    >>> sorted(solution_names("assert set(similar([1, 2], [2])) == {2}")), sorted(solution_names("", "add"))
    (['similar'], ['add'])
    """
    if (entry_point or "").strip():
        return frozenset({entry_point.strip()})
    try:
        free, _ = free_names(parse_source(tests, "tests.py"))
    except (SyntaxError, ValueError, RecursionError, MemoryError):
        return frozenset()
    own = {n for n in free if not hasattr(builtins, n)}
    return frozenset(own or free)


def io_cases(tests: Any) -> list[tuple[str, str]] | None:
    """The (stdin, expected stdout) pairs of stdin/stdout tests, or None for assert-style tests.

    >>> io_cases('[{"input": "1 2", "output": "3"}]'), io_cases("assert f() == 1")
    ([('1 2', '3')], None)
    """
    if isinstance(tests, str):
        if not tests.lstrip().startswith("["):
            return None
        try:
            tests = json.loads(tests)
        except ValueError:
            return None
    if (
        isinstance(tests, (list, tuple))
        and tests
        and all(isinstance(t, dict) and {"input", "output"} <= t.keys() for t in tests)
    ):
        return [(str(t["input"]), str(t["output"])) for t in tests]
    return None


def _tests_source(tests: Any) -> str:
    r"""Assert-style tests as one source text: a string as it is, a list of strings (MBPP's ``test_list``) joined
    by lines.

    >>> _tests_source(["assert f(1) == 2", "assert f(2) == 3"])
    'assert f(1) == 2\nassert f(2) == 3'
    """
    if isinstance(tests, (list, tuple)) and all(isinstance(t, str) for t in tests):
        return "\n".join(tests)
    return str(tests)


def _lines(text: str) -> list[str]:
    r"""The output as compared: lines without their trailing whitespace, without trailing blank lines.

    >>> _lines("1 2 \n\n3\n\n\n") == _lines("1 2\n\n3"), _lines(" 1") == _lines("1")
    (True, False)
    """
    return [line.rstrip() for line in text.rstrip().splitlines()]


def passes_io(code: str, cases: list[tuple[str, str]], limits: SandboxLimits, isolation: str) -> bool:
    """True when the program, run once per case, exits 0 in time and prints the expected output each time."""
    for stdin, expected in cases:
        r = run_program(code, stdin, limits=limits, isolation=isolation)
        if not r.passed or _lines(r.stdout) != _lines(expected):
            return False
    return True


CODE_ROW_COLUMNS = ("reward", "tests", "entry_point", "task_id", "id", "name")  # what check_code_rows reads


def check_code_rows(rows: Iterable[dict], default_verifier: str | None = None, where: str = "the dataset") -> None:
    r"""Refuse, before anything is generated, a code row whose tests no solution can be judged by: human-eval style
    tests (a ``check(candidate)`` they never call) with no ``entry_point`` naming the function to check. A row is a
    code row when its ``reward`` column says ``code_reward`` (or names nothing and ``default_verifier`` is
    ``code_reward``). Other data errors (tests that do not parse or check nothing) abstain at scoring time.

    >>> row = {"reward": "code_reward", "tests": "def check(c):\n    assert c(1) == 2\n", "entry_point": ""}
    >>> try:
    ...     check_code_rows([row])
    ... except ValueError as e:
    ...     print(str(e)[:96])
    the dataset, row 0: its 'tests' define check(candidate) and never call it, and its 'entry_point'
    >>> check_code_rows([{**row, "entry_point": "f"}, {**row, "tests": row["tests"] + "check(f)\n"}])  # fine
    """
    for i, row in enumerate(rows):
        verifier = row.get("reward") or default_verifier
        tests = row.get("tests")
        if verifier != "code_reward" or tests is None or io_cases(tests) is not None:
            continue
        entry_point = row.get("entry_point")
        if (entry_point or "").strip():
            continue
        problem = data_error(_tests_source(tests), entry_point)
        if problem is None or not problem.startswith("the tests define check(candidate)"):
            continue
        label = next((f"{k} {row[k]!r}" for k in ("task_id", "id", "name") if row.get(k) is not None), "")
        column = "column is missing" if "entry_point" not in row else "column is empty"
        raise ValueError(
            f"{where}, row {i}{f' ({label})' if label else ''}: its 'tests' define check(candidate) and never call "
            f"it, and its 'entry_point' {column}: no solution could be checked. Add an 'entry_point' column naming "
            "the function the tests check (human-eval's entry_point), or end the tests with a call such as "
            "check(my_function)."
        )


@lru_cache(maxsize=16)
def _warn_data_error(problem: str) -> None:
    warnings.warn(
        f"code_reward: {problem}: those rows get None (abstain). Check the dataset's 'tests' and "
        "'entry_point' columns.",
        stacklevel=3,
    )


def _per_row(value: Any, n: int, name: str) -> list:
    # A recipe may bind one entry_point for all rows; a dataset column gives one per row.
    if value is None or isinstance(value, str):
        return [value] * n
    if len(value) != n:
        raise ValueError(f"code_reward: the {name!r} column has {len(value)} rows but there are {n} completions")
    return list(value)


def code_reward(
    completions: list,
    tests: list[str | list[dict] | None],
    entry_point: list[str | None] | str | None = None,
    timeout_s: float = 10.0,
    cpu_s: int = 5,
    memory_mb: int = 512,
    max_procs: int = 16,
    num_workers: int | None = None,
    isolation: str = "auto",
    **kwargs: Any,
) -> list[float | None]:
    r"""1.0 when the completion's code passes the row's tests in the sandbox, 0.0 otherwise.

    >>> code_reward(
    ...     ["```python\ndef add(a, b):\n    return a + b\n```", "```python\ndef add(a, b):\n    return a - b\n```"],
    ...     tests=["def check(f):\n    assert f(2, 3) == 5\n"] * 2, entry_point="add")
    [1.0, 0.0]
    >>> code_reward(["import sys; sys.exit(0)"], tests=["assert False"])
    [0.0]
    >>> code_reward(["def add(a, b):\n    return 0"], tests=["def check(f):\n    assert f(2, 3) == 5\n"])  # no entry
    [None]
    >>> code_reward(["print(sum(map(int, input().split())))"], tests=[[{"input": "2 3", "output": "5"}]])
    [1.0]
    """
    n = len(completions)
    tests = _per_row(tests, n, "tests")
    entry_points = _per_row(entry_point, n, "entry_point")
    limits = SandboxLimits(wall_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_procs=max_procs)
    jobs = []
    for i, (c, t, ep) in enumerate(zip(completions, tests, entry_points)):
        if t is None or not (str(t).strip() if isinstance(t, str) else len(t)):
            continue  # no tests: abstain
        if io_cases(t) is None:
            problem = data_error(_tests_source(t), ep)
            if problem is not None:  # a data error no completion can pass or fail: abstain, warned once
                _warn_data_error(problem.partition(":")[0])
                continue
        text = completion_text(c)
        if len(text) > MAX_COMPLETION_CHARS:
            jobs.append((i, None, t, ep))
            continue
        names = () if io_cases(t) is not None else solution_names(_tests_source(t), ep)
        jobs.append((i, extract_code(text, names), t, ep))
    scores: list[float | None] = [None] * n

    def run(job: tuple[int, str, Any, str | None]) -> tuple[int, float]:
        i, code, t, ep = job
        if code is None:
            return i, 0.0
        cases = io_cases(t)
        if cases is not None:
            return i, float(passes_io(code, cases, limits, isolation))
        judged = execute(code, _tests_source(t), ep, limits=limits, isolation=isolation, require_call=True)
        return i, 1.0 if judged.passed else 0.0

    workers = num_workers or min(4, os.cpu_count() or 1)
    if workers <= 1 or len(jobs) <= 1:
        results = map(run, jobs)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(run, jobs))
    for i, s in results:
        scores[i] = s
    return scores
