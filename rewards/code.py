r"""Code verification: run the completion's program against the row's tests in the sandbox.

``code_reward(completions, tests, entry_point=None)`` takes the last fenced ```python block of each
completion (or the raw text after any ``<think>`` block when there is no fence), runs it and the row's
``tests`` in ``rewards.sandbox`` (no network, no host files, no parent environment, CPU/memory/process/
file limits, a wall-clock kill), and scores 1.0 when every test passed, 0.0 on failure, timeout or crash,
None (abstain) for a row without tests. Tests are human-eval style (a ``check(candidate)`` function,
called on ``entry_point``), plain ``assert`` statements, or stdin/stdout cases: a list of
``{"input": ..., "output": ...}`` (or its JSON text), each run as a program whose output this process
compares with the expected one (trailing spaces and blank lines ignored).

The verdict comes from ``rewards.judge``: the tests run in a second sandbox and see only plain data the
solution returns, so a solution cannot forge a pass (see that module). Rows run in parallel (``num_workers``,
default up to 4).
Limits are keyword arguments (``timeout_s``, ``memory_mb``, ...), set per recipe via ``reward_kwargs``.

Run the examples: ``python -m pytest --doctest-modules rewards/code.py``.
"""

from __future__ import annotations

import json
import os
import re
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from rewards.judge import execute
from rewards.match import completion_text, strip_think
from rewards.sandbox import SandboxLimits, run_program

_FENCE = re.compile(r"```[ \t]*(python3?|py)?[ \t]*\n(.*?)```", re.DOTALL | re.IGNORECASE)


def extract_code(text: str) -> str:
    r"""The last fenced Python block (```python, ```py or a bare ```), else the text after any reasoning.

    >>> extract_code("Try this:\n```python\nx = 1\n```\nor better\n```python\nx = 2\n```")
    'x = 2\n'
    >>> extract_code("<think>\nhmm\n</think>\ndef f():\n    return 1")
    'def f():\n    return 1'
    """
    body = strip_think(text)
    blocks = _FENCE.findall(body)
    if blocks:
        tagged = [code for lang, code in blocks if lang]
        return (tagged or [code for _, code in blocks])[-1]
    return body.strip()


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
    if isinstance(tests, (list, tuple)) and tests and all(isinstance(t, dict) and {"input", "output"} <= t.keys()
                                                          for t in tests):
        return [(str(t["input"]), str(t["output"])) for t in tests]
    return None


def _lines(text: str) -> list[str]:
    return [line.rstrip() for line in text.rstrip().splitlines()]


def passes_io(code: str, cases: list[tuple[str, str]], limits: SandboxLimits, isolation: str) -> bool:
    """True when the program, run once per case, exits 0 in time and prints the expected output each time."""
    for stdin, expected in cases:
        r = run_program(code, stdin, limits=limits, isolation=isolation)
        if not r.passed or _lines(r.stdout) != _lines(expected):
            return False
    return True


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
    >>> code_reward(["print(sum(map(int, input().split())))"], tests=[[{"input": "2 3", "output": "5"}]])
    [1.0]
    """
    n = len(completions)
    tests = _per_row(tests, n, "tests")
    entry_points = _per_row(entry_point, n, "entry_point")
    limits = SandboxLimits(wall_s=timeout_s, cpu_s=cpu_s, memory_mb=memory_mb, max_procs=max_procs)
    jobs = [
        (i, extract_code(completion_text(c)), t, ep)
        for i, (c, t, ep) in enumerate(zip(completions, tests, entry_points))
        if t is not None and (str(t).strip() if isinstance(t, str) else len(t))
    ]
    scores: list[float | None] = [None] * n

    def run(job: tuple[int, str, Any, str | None]) -> tuple[int, float]:
        i, code, t, ep = job
        cases = io_cases(t)
        if cases is not None:
            return i, float(passes_io(code, cases, limits, isolation))
        return i, 1.0 if execute(code, str(t), ep, limits=limits, isolation=isolation).passed else 0.0

    workers = num_workers or min(4, os.cpu_count() or 1)
    if workers <= 1 or len(jobs) <= 1:
        results = map(run, jobs)
    else:
        with ThreadPoolExecutor(max_workers=workers) as pool:
            results = list(pool.map(run, jobs))
    for i, s in results:
        scores[i] = s
    return scores
