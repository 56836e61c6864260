r"""Every registered reward is bounded on any input: a list of float-or-None, in bounded time and memory.

A policy under RL writes whatever the reward pays or whatever breaks it. A verifier whose parser backtracks, or keeps
every nested candidate, turns one long completion into a stalled or killed trainer. Two suites hold the rule for every
reward in ``rewards.REWARDS`` (iterated, so a reward added to the registry is covered without editing this file):

- **adversarial shapes** (``SHAPES``): about 256 KiB of UTF-8 per shape (a quarter of the longest completion the
  verifiers read, ``MAX_COMPLETION_CHARS``; the growth check below extrapolates), each aimed at a scan the verifiers
  run (nested and unclosed ``\boxed{``, whitespace after an answer anchor or a code fence, unpaired tags, brace and
  ``\frac`` towers, equality chains, combining marks, ...). Each call runs in a forked child, so a hang or a runaway
  allocation fails its own case instead of the suite: it must finish within ``CPU_BOUND_S`` seconds of CPU, raise its
  peak resident memory by at most ``MEMORY_BOUND_MB``, take at most ``MAX_GROWTH`` times as long as on an eighth of the
  input (when it takes ``GROWTH_MIN_S`` or more: a quadratic scan still under the bound), and is killed past ``KILL_S``
  seconds of wall time or ``ADDRESS_HEADROOM_MB`` of address space. About 1,800 cases, minutes of CPU: marked ``slow``;
- **property fuzz** (Hypothesis, derandomised): short random texts over an alphabet weighted toward the syntax the
  verifiers read (box commands, braces, think and other tags, answer anchors, fences, digits, ``=``, ``%``, ``$``,
  line ends, look-alike letters, invisible characters), with random gold answers and modes: the reward never raises
  and returns float-or-None within ``CPU_BOUND_S``.

``code_reward`` is judged on parsing only: the names in ``rewards.code`` that would start a sandbox (``SANDBOX_ENTRY``)
are replaced by a failing verdict, so what is bounded here is everything it does in the trainer's process.

Memory is the child's peak resident set (``/proc/self/status`` VmHWM after resetting it through
``/proc/self/clear_refs``), which counts C allocations too and costs nothing; where that is not available, the call
is repeated under ``tracemalloc`` (which slows the pure-Python scanners about 8 times, too slow for every case). Set
``REWARD_BOUNDS_LOG=path`` to append one JSON line per shape case (reward, shape, mode, CPU and wall seconds, peak
MB, growth, verdict), ``REWARD_BOUNDS_KILL_S`` to change the kill, ``REWARD_FUZZ_EXAMPLES`` the examples per
reward. Run it from the checkout's root (``python -m pytest``) so that its ``rewards`` is the one imported.

Run: ``python -m pytest -q tests/test_reward_bounds.py`` (``-m "not slow"``: the fuzz and the harness's own checks,
under a minute); one reward: ``-k "math_reward-"``.
"""

from __future__ import annotations

import contextlib
import ctypes
import ctypes.util
import inspect
import json
import math
import os
import pickle
import random
import resource
import select
import signal
import time
import tracemalloc
import warnings
from collections.abc import Callable, Iterator
from types import SimpleNamespace
from typing import Any
from unittest import mock

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import rewards
from rewards import REWARDS

SIZE = 1 << 18  # UTF-8 bytes of each adversarial shape
CPU_BOUND_S = 3.0  # per call, generous for a slow 2-core machine: a linear scan of 256 KiB takes well under 0.3 s
MEMORY_BOUND_MB = 64  # peak growth for a 256 KiB input
KILL_S = float(os.environ.get("REWARD_BOUNDS_KILL_S", 10))  # wall clock: past it the child is killed and fails
# A call that takes GROWTH_MIN_S or more is timed on an eighth of its input too: linear time grows 8 times, quadratic
# 64 times. This catches a quadratic scan that is still under the bound at 256 KiB (memcpy-fast, but 4 times slower
# on each doubling of the cap). Linear calls measured 3-13 times on a loaded 2-core machine; over the bound, both
# sizes are timed again and the best of each kept.
GROWTH_MIN_S = 0.1  # a quadratic scan under it here takes under 1.6 s on the longest completion read (4x the input)
GROWTH_DIVISOR = 8
MAX_GROWTH = 16.0
GROWTH_KILL_FACTOR = 3  # the growth timing after a finished call runs it and its eighth up to twice more
ADDRESS_HEADROOM_MB = 1024  # a child allocating past this much new address space fails with MemoryError
FUZZ_EXAMPLES = int(os.environ.get("REWARD_FUZZ_EXAMPLES", 100))
LOG = os.environ.get("REWARD_BOUNDS_LOG")

# Arguments a reward needs from the recipe rather than the dataset.
REWARD_KWARGS: dict[str, dict[str, Any]] = {
    "soft_overlong_reward": {"max_completion_len": 512, "soft_punish_cache": 128},
}
# What code_reward calls to run a program; replaced by a failing verdict (parsing only).
SANDBOX_ENTRY = ("execute", "passes_io", "run_program")
MODES = ("think", "no_think")


# ----------------------------------------------------------------------------------------------- calling a reward


def _utf8_len(s: str) -> int:
    return len(s.encode("utf-8", "surrogatepass"))


def fill(unit: str, size: int) -> str:
    """``unit`` repeated to about ``size`` bytes of UTF-8."""
    return unit * max(1, size // _utf8_len(unit))


def nest(opening: str, middle: str, closing: str, size: int) -> str:
    """``middle`` nested in as many ``opening``/``closing`` pairs as fit in about ``size`` bytes."""
    k = max(1, (size - _utf8_len(middle)) // (_utf8_len(opening) + _utf8_len(closing)))
    return opening * k + middle + closing * k


def row_columns(text: str, gold: str | None, mode: str | None, **overrides: Any) -> dict[str, Any]:
    """One dataset row as TRL hands it to every reward: the gold, the asked mode, token ids, code tests, tool-loop
    columns."""
    row = {
        "answer": gold,
        "mode": mode,
        "prompts": f"What is it? /{mode}" if mode else "What is it?",
        "completion_ids": [0] * (_utf8_len(text) // 4),
        "tests": "assert add(1, 2) == 3",
        "entry_point": "add",
        "tool_calls": [{"status": "ok"}],
        "env_reward": 1.0,
        "reward": None,
    }
    row.update(overrides)
    return row


def reward_call(name: str, completions: list, rows: list[dict[str, Any]]) -> Any:
    """Call the registered reward ``name`` as TRL does: every column (only the ones it names when it takes no
    ``**kwargs``), one entry per completion, plus the recipe arguments it needs."""
    func = REWARDS[name]
    params = inspect.signature(func).parameters
    takes_any = any(p.kind is p.VAR_KEYWORD for p in params.values())
    columns = {k: [r[k] for r in rows] for k in rows[0] if takes_any or k in params}
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # unparseable golds and data errors warn once; not what is tested here
        return func(completions, **columns, **REWARD_KWARGS.get(name, {}))


def score_problem(out: Any, n: int) -> str | None:
    """Why ``out`` is not ``n`` scores (a list of finite floats or None), else None."""
    if not isinstance(out, list):
        return f"returned a {type(out).__name__}, not a list"
    if len(out) != n:
        return f"returned {len(out)} scores for {n} completions"
    for i, s in enumerate(out):
        if s is not None and not (type(s) is float and math.isfinite(s)):
            return f"score {i} is {s!r} ({type(s).__name__}), not a finite float or None"
    return None


class _Failed(SimpleNamespace):
    """A sandbox verdict that failed; any other field reads as empty."""

    def __getattr__(self, name: str) -> Any:
        return None


def _failed(*args: Any, **kwargs: Any) -> Any:
    return _Failed(passed=False, stdout="", stderr="", status="error", returncode=1)


@contextlib.contextmanager
def no_programs_run():
    """code_reward without its sandbox: whatever would run a program fails at once."""
    code = rewards.code
    with contextlib.ExitStack() as stack:
        for name in SANDBOX_ENTRY:
            if hasattr(code, name):
                stub = (lambda *a, **k: False) if name == "passes_io" else _failed
                stack.enter_context(mock.patch.object(code, name, stub))
        yield


# ----------------------------------------------------------------------------------------------- adversarial shapes

# name -> (builder of about n bytes, gold). Each builder aims at a scan; the group comment says which.
SHAPES: dict[str, tuple[Callable[[int], str], str]] = {
    # honest long replies: the floor every reward must be fast on
    "prose_then_box": (lambda n: fill("We add the two numbers and check. ", n) + "The answer is \\boxed{42}.", "42"),
    "think_then_box": (
        lambda n: "<think>\n" + fill("I add the numbers. ", n) + "\n</think>\nThe answer is \\boxed{42}.",
        "42",
    ),
    # boxes: rewards.extract.all_boxed / final_answer, rewards.visible.box_is_visible
    "boxed_nested": (lambda n: nest("\\boxed{", "42", "}", n), "42"),
    "boxed_unclosed": (lambda n: fill("\\boxed{", n), "42"),
    "boxed_many_agreeing": (lambda n: fill("\\boxed{42} ", n), "42"),
    "boxed_many_distinct": (lambda n: " ".join(f"\\boxed{{{i}}}" for i in range(n // 13)), "42"),
    "boxed_space_before_brace": (lambda n: "\\boxed" + " " * n + "{42}", "42"),
    "boxed_newline_before_brace": (lambda n: fill("\\boxed\n{42} \\boxed \n", n), "42"),
    "box_spellings": (
        lambda n: fill("\\fbox{1} \\boxed 2 \\framebox{3} \\boxed{{4}} \\mbox{5} \\boxed{\\boxed{6}} ", n),
        "42",
    ),
    "box_one_huge": (lambda n: "\\boxed{" + fill("x + ", n) + "1}", "2x+1"),
    "box_phantoms": (lambda n: "\\boxed{" + fill("\\phantom{1}", n) + "42}", "42"),
    "box_nested_hspace": (lambda n: "\\boxed{" + nest("\\hspace{", "1em", "}", n) + "42}", "42"),
    "box_nested_empty_groups": (lambda n: "\\boxed{" + nest("{", "", "}", n) + "42}", "42"),
    "box_emptied_commands": (lambda n: "\\boxed{" + fill("\\a{}", n) + "42}", "42"),
    "boxes_small_nested_hspace": (lambda n: fill("\\boxed{" + nest("\\hspace{", "1em", "}", 900) + "42} ", n), "42"),
    "boxes_small_phantoms": (lambda n: fill("\\boxed{" + fill("\\phantom{1}", 900) + "42} ", n), "42"),
    # answer anchors: rewards.extract._ANCHOR (after strip_markdown)
    "anchor_then_spaces": (lambda n: "The answer is" + " " * n, "42"),
    "anchor_value_spaces_value": (lambda n: "The answer is 4" + " " * n + "2", "42"),
    "final_answer_colon_tabs": (lambda n: "Final Answer:" + fill(" \t", n), "42"),
    "anchor_then_crlf": (lambda n: "The answer is" + fill("\r\n", n), "42"),
    "gsm8k_hashes_spaces": (lambda n: "#### " + " " * n + "42", "42"),
    "gsm8k_hashes_lines": (lambda n: fill("#### 42\n", n), "42"),
    "anchor_repeated_one_line": (lambda n: fill("The answer is 42 ", n), "42"),
    "anchor_lines": (lambda n: fill("Answer: 42\n", n), "42"),
    "minerva_lines": (lambda n: fill("Final Answer: The final answer is $42$. I hope it is correct.\n", n), "42"),
    "answer_word_run": (lambda n: fill("answer ", n), "42"),
    "markdown_bold_run": (lambda n: fill("**", n) + "The answer is 42.", "42"),
    "markdown_emphasis_unclosed": (lambda n: fill("*a ", n), "42"),
    "markdown_bold_anchors": (lambda n: fill("**Answer:** *42* ", n), "42"),
    "choice_letters": (lambda n: fill("(A) ", n), "B"),
    # code fences: rewards.code.extract_code (before any sandbox)
    "fence_then_spaces": (lambda n: "```" + " " * n, "42"),
    "fence_lang_then_tabs": (lambda n: "```python" + fill(" \t", n) + "x", "42"),
    "fences_many": (lambda n: fill("```python\nx = 1\n```\n", n), "42"),
    "fence_openers": (lambda n: fill("```python\n", n), "42"),
    "backtick_run": (lambda n: "`" * n, "42"),
    "fence_huge_program": (lambda n: "```python\n" + fill("x = 1\n", n) + "```", "42"),
    "fence_deep_parens": (lambda n: "```python\nx = " + fill("(", n) + "\n```", "42"),
    "fence_defs_without_body": (lambda n: "```python\n" + fill("def add(a, b):\n", n) + "```", "42"),
    "tilde_fences": (lambda n: fill("~~~python\nx = 1\n~~~\n", n), "42"),
    "crlf_fences": (lambda n: fill("```python\r\nx = 1\r\n```\r\n", n), "42"),
    "fence_in_string": (lambda n: fill('s = """```python\n"""\n', n), "42"),
    # tags: rewards.format (_THINK, _TAG_BLOCK), rewards.extract.strip_think, rewards.length._THINK_CONTENT
    "tags_unpaired": (lambda n: fill("<a>", n), "42"),
    "tags_unpaired_then_box": (lambda n: "<think></think>" + fill("<r>", n) + "The answer is \\boxed{42}.", "42"),
    "think_opens": (lambda n: fill("<think>", n), "42"),
    "think_closes": (lambda n: fill("</think>", n), "42"),
    "think_pairs": (lambda n: fill("<think>x</think>", n), "42"),
    "think_unclosed_then_box": (lambda n: "<think>" + fill("a ", n) + "\\boxed{42}", "42"),
    "tags_with_attributes": (lambda n: fill('<reasoning type="x">', n), "42"),
    "tags_self_closing": (lambda n: fill("<br/>", n), "42"),
    "tags_inline_html_then_box": (lambda n: fill("<b>x ", n) + "The answer is \\boxed{42}.", "42"),
    "tags_bracket": (lambda n: fill("[think]", n), "42"),
    "html_comments_open": (lambda n: fill("<!--", n), "42"),
    "lt_run": (lambda n: "<" * n, "42"),
    "lt_letters": (lambda n: fill("<a", n), "42"),
    "tool_call_nested_json": (lambda n: "<tool_call>" + nest('{"a": ', "1", "}", n) + "</tool_call>", "42"),
    "tool_calls_many": (
        lambda n: fill('<tool_call>{"name": "python", "arguments": {"code": "1"}}</tool_call>\n', n),
        "42",
    ),
    "code_tags_open": (lambda n: fill("<code>", n), "42"),
    # LaTeX: rewards.numbers, rewards.answer, rewards.math.within_budget
    "braces_nested": (lambda n: nest("{", "42", "}", n), "42"),
    "braces_open": (lambda n: "{" * n, "42"),
    "braces_close": (lambda n: "}" * n, "42"),
    "frac_tower": (lambda n: nest("\\frac{1}{", "2", "}", n), "\\frac{1}{2}"),
    "power_tower": (lambda n: nest("2^{", "2", "}", n), "2^{16}"),
    "sqrt_tower": (lambda n: nest("\\sqrt{", "2", "}", n), "\\sqrt{2}"),
    "left_right_nested": (lambda n: nest("\\left(", "x", "\\right)", n), "2x+1"),
    "boxes_small_frac_tower": (
        lambda n: fill("\\boxed{" + nest("\\frac{1}{", "2", "}", 900) + "} ", n),
        "\\frac{1}{2}",
    ),
    "boxes_small_power_tower": (lambda n: fill("\\boxed{" + nest("2^{", "2", "}", 290) + "} ", n), "2^{16}"),
    "digits_long": (lambda n: "9" * n, "42"),
    "anchor_digits_long": (lambda n: "The answer is " + "9" * n, "42"),
    "boxes_digits_at_cap": (lambda n: fill("\\boxed{" + "9" * 990 + "} ", n), "42"),
    "digit_groups": (lambda n: "1" + fill(",000", n), "1,000"),
    "thin_space_digit_groups": (lambda n: "\\boxed{1" + fill("\u2009000", n) + "}", "1000"),
    "equals_run": (lambda n: "=" * n, "x = 3"),
    "boxes_equality_chain": (lambda n: fill("\\boxed{" + "=".join(["1"] * 450) + "} ", n), "1"),
    "boxes_equation_chain_expression": (lambda n: fill("\\boxed{" + "=".join(["x+1"] * 200) + "} ", n), "1+x"),
    "commas_run": (lambda n: "," * n, "3, 3, 7, 9"),
    "boxes_long_set": (lambda n: fill("\\boxed{\\{" + ", ".join(map(str, range(200))) + "\\}} ", n), "\\{1, 2\\}"),
    "boxes_long_list": (lambda n: fill("\\boxed{" + ", ".join("3" for _ in range(330)) + "} ", n), "3, 3, 7, 9"),
    "text_openings": (lambda n: fill("\\text{", n), "42"),
    "text_then_spaces": (lambda n: "\\boxed{42\\text" + " " * n + "{cm}}", "42"),
    "boxes_many_units": (lambda n: fill("\\boxed{42" + "\\text{ cm}" * 90 + "} ", n), "42"),
    "percent_run": (lambda n: "%" * n, "50\\%"),
    "percent_signs": (lambda n: fill("50\\% per cent ", n), "50\\%"),
    "dollar_run": (lambda n: "$" * n, "42"),
    "backslash_run": (lambda n: "\\" * n, "42"),
    "dots_run": (lambda n: "." * n, "42"),
    "ldots_run": (lambda n: fill("\\ldots", n), "42"),
    "overline_nested": (lambda n: "\\boxed{" + nest("0.\\overline{", "3", "}", n) + "}", "\\frac{1}{3}"),
    "matrix_env_open": (lambda n: fill("\\begin{pmatrix}", n), "42"),
    "matrix_rows": (lambda n: "\\boxed{\\begin{pmatrix}" + fill("1 & 2 \\\\ ", n) + "\\end{pmatrix}}", "42"),
    "relations": (lambda n: fill("x \\leq 5 < y \\geq ", n), "x \\leq 5"),
    "tilde_run": (lambda n: "~" * n, "42"),
    "caret_underscore_run": (lambda n: fill("^_", n), "42"),
    # unicode: rewards.visible (NFKC, kinds), rewards.repetition.skeleton
    "zero_width_run": (lambda n: fill("\u200b", n), "42"),
    "zero_width_in_words": (lambda n: fill("a\u200bb ", n), "42"),
    "combining_one_class": (lambda n: "\\boxed{4" + fill("\u0301", n) + "2}", "42"),
    "combining_two_classes": (lambda n: "a" + fill("\u0301\u0316", n), "42"),
    "combining_two_classes_framed": (
        lambda n: "<think>a" + fill("\u0301\u0316", n // 2) + "</think>\\boxed{4" + fill("\u0301\u0316", n // 2) + "}",
        "42",
    ),
    "mixed_scripts": (lambda n: fill("Тhе саt ѕаt οn thе mаt ", n), "42"),
    "nfkc_expanding": (lambda n: fill("\ufdfa", n), "42"),
    "fullwidth_boxes": (lambda n: fill("\\boxed{４２} ", n), "42"),
    "math_alnum_words": (lambda n: fill("𝐭𝐡𝐞 𝐜𝐚𝐭 ", n), "42"),
    "hangul_fillers": (lambda n: "<think>" + fill("\u3164 ", n) + "</think>\\boxed{42}", "42"),
    "bidi_controls": (lambda n: fill("\u202e\u202d", n), "42"),
    "lone_surrogates": (lambda n: fill("a\ud800 ", n), "42"),
    "minus_digits_fractions": (lambda n: fill("−٣½² ", n), "42"),
    # whitespace
    "spaces": (lambda n: " " * n, "42"),
    "newlines": (lambda n: "\n" * n, "42"),
    "crlf_run": (lambda n: fill("\r\n", n), "42"),
    "unicode_spaces": (lambda n: fill("\u00a0\u2009\u3000", n), "42"),
    # repetition: n-grams of rewards.repetition
    "one_word_loop": (lambda n: fill("go ", n), "42"),
    "short_words": (lambda n: fill("a b ", n), "42"),
    "distinct_words": (lambda n: " ".join(f"w{i}" for i in range(n // 7)), "42"),
    "letters_run": (lambda n: "a" * n, "42"),
}


def _status() -> dict[str, int]:
    out = {}
    with open("/proc/self/status") as f:
        for line in f:
            key, _, value = line.partition(":")
            if key in ("VmRSS", "VmHWM", "VmSize"):
                out[key] = int(value.split()[0]) * 1024
    return out


def _reset_peak() -> int | None:
    """Release free heap, reset the peak resident set to the current one and return it; None where Linux's
    ``clear_refs`` is not available."""
    with contextlib.suppress(OSError, AttributeError, TypeError):
        ctypes.CDLL(ctypes.util.find_library("c") or "libc.so.6").malloc_trim(0)
    try:
        with open("/proc/self/clear_refs", "w") as f:
            f.write("5")
        return _status()["VmRSS"]
    except (OSError, KeyError):
        return None


def _measure(make_call: Callable[[int], Callable[[], Any]], n: int) -> Iterator[dict[str, Any]]:
    """In the child: yield the measurements of the call on ``SIZE`` bytes (run once more under tracemalloc where RSS
    cannot be read), then, when it took ``GROWTH_MIN_S`` or more, its ``growth`` against ``1 / GROWTH_DIVISOR`` of
    the input."""
    with contextlib.suppress(OSError, ValueError, KeyError):
        soft, hard = resource.getrlimit(resource.RLIMIT_AS)
        cap = _status()["VmSize"] + ADDRESS_HEADROOM_MB * 2**20
        if soft == resource.RLIM_INFINITY or soft > cap:
            resource.setrlimit(resource.RLIMIT_AS, (cap, hard))
    call = make_call(SIZE)
    rss0 = _reset_peak()
    cpu0, wall0 = time.process_time(), time.perf_counter()
    out = call()
    cpu, wall = time.process_time() - cpu0, time.perf_counter() - wall0
    result = {"cpu": cpu, "wall": wall, "problem": score_problem(out, n), "peak_mb": None, "growth": None}
    if rss0 is not None:
        result["peak_mb"] = (_status()["VmHWM"] - rss0) / 2**20
    elif cpu <= CPU_BOUND_S:
        tracemalloc.start()
        call()
        result["peak_mb"] = tracemalloc.get_traced_memory()[1] / 2**20
        tracemalloc.stop()
    yield result
    if GROWTH_MIN_S <= cpu <= CPU_BOUND_S:
        small = make_call(SIZE // GROWTH_DIVISOR)
        growth = cpu / _timed(small)
        if growth > MAX_GROWTH:  # a loaded machine's noise, or real: the best of two of each decides
            growth = min(cpu, _timed(call)) / min(_timed(small), _timed(small))
        yield {"growth": growth}


def _timed(call: Callable[[], Any]) -> float:
    cpu0 = time.process_time()
    call()
    return max(time.process_time() - cpu0, 1e-3)


def _send(fd: int, message: dict[str, Any]) -> None:
    data = pickle.dumps(message)
    data = len(data).to_bytes(8, "little") + data
    while data:
        data = data[os.write(fd, data) :]


def _receive(fd: int, deadline: float) -> dict[str, Any] | None:
    """One framed message, None at end of stream; raises TimeoutError past ``deadline``."""
    buf = b""
    while len(buf) < 8 or len(buf) < 8 + int.from_bytes(buf[:8], "little"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            raise TimeoutError
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            return None
        buf += chunk
    return pickle.loads(buf[8:])


def run_in_child(make_call: Callable[[int], Callable[[], Any]], n: int = 1, kill_s: float = KILL_S) -> dict[str, Any]:
    """In a forked child, run ``make_call(size)()`` (``n`` scores expected) as ``_measure`` does; return its
    measurements, ``{"killed": s}`` when the call ran past ``kill_s`` seconds, or ``{"error": ...}`` when it raised.
    The growth timing that follows a finished call has ``GROWTH_KILL_FACTOR`` times as long."""
    rfd, wfd = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: never returns into pytest
        try:
            os.close(rfd)
            try:
                for message in _measure(make_call, n):
                    _send(wfd, message)
            except BaseException as e:  # noqa: B036 - reported to the parent, which fails the case
                _send(wfd, {"error": f"{type(e).__name__}: {str(e)[:500]}"})
        finally:
            os._exit(0)
    os.close(wfd)
    start, result = time.monotonic(), {}
    try:
        first = _receive(rfd, start + kill_s)
        if first is None:
            return {"error": "the child died without a result (killed by the kernel?)"}
        result.update(first)
        if "error" not in first:
            with contextlib.suppress(TimeoutError):  # the call finished in time; only its growth is left unmeasured
                result.update(_receive(rfd, time.monotonic() + GROWTH_KILL_FACTOR * kill_s) or {})
            if "error" in result:
                result = {"error": result["error"]}
    except TimeoutError:
        return {"killed": time.monotonic() - start}
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)
        os.close(rfd)
        os.waitpid(pid, 0)
    return result


def _shape_cases() -> list:
    cases = []
    for shape in SHAPES:
        for name in sorted(REWARDS):
            takes_mode = "mode" in inspect.signature(REWARDS[name]).parameters
            for mode in MODES if takes_mode else MODES[:1]:
                case_id = f"{name}-{shape}" + (f"-{mode}" if takes_mode else "")
                cases.append(pytest.param(name, shape, mode, id=case_id))
    return cases


@pytest.fixture(scope="module", autouse=True)
def _loaded():
    """Import what the rewards import lazily (math-verify) before forking, so no child imports under a lock."""
    rewards.math._math_verify()


@pytest.mark.slow
@pytest.mark.parametrize(("name", "shape", "mode"), _shape_cases())
def test_reward_bounded_on_adversarial_shape(name: str, shape: str, mode: str):
    builder, gold = SHAPES[shape]

    def make_call(size: int) -> Callable[[], Any]:
        text = builder(size)
        rows = [row_columns(text, gold, mode)]

        def call() -> Any:
            with no_programs_run():
                return reward_call(name, [text], rows)

        return call

    r = run_in_child(make_call)
    if LOG:
        with open(LOG, "a") as f:
            f.write(json.dumps({"reward": name, "shape": shape, "mode": mode, **r}) + "\n")
    where = f"{name} on {shape} ({mode} row, gold {gold!r})"
    assert "killed" not in r, f"{where} ran past {KILL_S:.0f} s (killed)"
    assert "error" not in r, f"{where} raised {r.get('error')}"
    assert r["problem"] is None, f"{where}: {r['problem']}"
    assert r["cpu"] <= CPU_BOUND_S, f"{where} took {r['cpu']:.2f} s of CPU (bound {CPU_BOUND_S} s)"
    if r["peak_mb"] is not None:
        assert r["peak_mb"] <= MEMORY_BOUND_MB, f"{where} grew {r['peak_mb']:.0f} MB (bound {MEMORY_BOUND_MB} MB)"
    if r["growth"] is not None:
        assert r["growth"] <= MAX_GROWTH, (
            f"{where}: {r['cpu']:.2f} s of CPU on {SIZE} bytes is {r['growth']:.1f} times its time on 1/"
            f"{GROWTH_DIVISOR} of them (linear is {GROWTH_DIVISOR}, quadratic {GROWTH_DIVISOR**2}; bound {MAX_GROWTH})"
        )


def test_shapes_are_about_size_bytes():
    """Each shape is the size the bounds are stated for (a shape that shrank would test nothing)."""
    sizes = {shape: _utf8_len(builder(SIZE)) for shape, (builder, _) in SHAPES.items()}
    wrong = {shape: n for shape, n in sizes.items() if not 0.9 * SIZE <= n <= 1.1 * SIZE}
    assert not wrong, f"shapes not within 10% of {SIZE} bytes: {wrong}"


def _busy(seconds: float) -> list[float]:
    end = time.process_time() + seconds
    while time.process_time() < end:
        pass
    return [0.0]


def test_child_runner_catches_hang_error_growth_and_bad_scores():
    """The harness itself: a hang is killed, an exception, a malformed result, memory and growth are reported."""
    assert "killed" in run_in_child(lambda size: lambda: time.sleep(30), kill_s=0.5)
    assert "ZeroDivisionError" in run_in_child(lambda size: lambda: 1 / 0)["error"]
    assert run_in_child(lambda size: lambda: [1])["problem"] == "score 0 is 1 (int), not a finite float or None"
    assert run_in_child(lambda size: lambda: [0.0], n=2)["problem"] == "returned 1 scores for 2 completions"
    grown = run_in_child(lambda size: lambda: [bytearray(100 << 20) and 0.0])["peak_mb"]
    assert grown is None or grown >= 90
    quadratic = run_in_child(lambda size: lambda: _busy(0.8 * (size / SIZE) ** 2))["growth"]
    linear = run_in_child(lambda size: lambda: _busy(0.8 * size / SIZE))["growth"]
    assert quadratic > MAX_GROWTH >= linear, (quadratic, linear)


# ----------------------------------------------------------------------------------------------- property fuzz

# Tokens the verifiers read, by family: syntax of several characters, and characters that look like others or print
# nothing.
FAMILIES = {
    "boxes": ["\\boxed{", "\\boxed", "\\boxed ", "\\fbox{", "{", "}", "{}", "\\phantom{", "\\hspace{", "\\,", "~",
              "\\text{", "\\text{ }", "$", "\\{", "\\}"],
    "latex": ["\\frac{", "\\dfrac", "\\mathrm{", "\\left(", "\\right)", "\\sqrt{", "^{", "^", "_", "\\\\", "\\",
              "&", "\\pi", "\\infty", "\\pm", "\\leq", "\\geq", "\\in", "\\%", "\\$", "\\ldots", "\\overline{",
              "\\times 10^{", "\\cdot", "\\begin{pmatrix}", "\\end{pmatrix}", "{", "}", "=", "$$"],
    "tags": ["<think>", "</think>", "<think>\n", "\n</think>\n", "<", ">", "</", "<a>", "</a>", "<b>", "<br/>",
             "<!--", "-->", "<tool_call>", "</tool_call>", '{"name": "python", "arguments": {"code": "', '"}}',
             "<code>", "</code>", "[think]"],
    "anchors": ["The answer is ", "the answer is", "Final Answer: ", "Answer:", "**Answer:**", "answer = ", "####",
                "(A)", "**", "*", ".", "\n", " ", "$"],
    "code": ["```", "```python\n", "```py\n", "~~~", "def add(a, b):\n    return a + b\n", "print(", "input()",
             "\n", "    ", '"""', "#"],
    "words": ["x", "y", "n", "cm", "percent", " per cent", "dozen", "and", "or", "maybe", "not", "yes", "no", "pi",
              " ", ", ", ".", "...", "-", "+", "*", "/", "(", ")", "[", "]", "!", "?", "'", '"', "%", "=", "=="],
    "numbers": ["0", "1", "2", "3", "4", "7", "9", "42", "1,000", "0.5", "3/4", "-3", "1e3", "10", ",", ".", "%"],
    "unicode": ["а", "е", "о", "с", "х", "Т", "ο", "α", "Ι", "１", "２", "−", "⁴", "²", "٣", "½", "𝐱", "ｘ",
                "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff", "\u00ad", "\u0301", "\u0316", "\u3164", "\u2800",
                "\u202e", "\ufdfa", "\ufe0f", "\U000e0041"],
    "whitespace": ["\n", "\r\n", "\r", " ", "  ", "\t", "\u00a0", "\u2009", "\u202f", "\u3000"],
}  # fmt: skip
SYNTAX = sorted({token for tokens in FAMILIES.values() for token in tokens})
GOLDS = [
    "42", "\\frac{1}{2}", "x = 3", "\\{1, 2\\}", "3, 3, 7, 9", "2x+1", "\\sqrt{2}", "50\\%", "yes", "(1, 2]",
    "-3.5", "x \\leq 5", "B", "1,000", "12 \\text{ cm}", "\\begin{pmatrix} 1 & 2 \\end{pmatrix}", "", None,
]  # fmt: skip
TESTS = [
    "assert add(1, 2) == 3",
    "def check(candidate):\n    assert candidate(1, 2) == 3\n",
    '[{"input": "1 2", "output": "3"}]',
    None,
]
TOOL_CALLS = [None, [], [{"status": "ok"}], [{"status": "malformed"}, {"status": "ok"}]]


def _swarm(rng: random.Random) -> str:
    """A run of tokens from a few picked at random (swarm testing: two ``<a>`` or a box beside a zero-width space
    are then likely), some repeated, some arbitrary characters among them."""
    pool = [t for family in rng.sample(sorted(FAMILIES), rng.randint(1, 3)) for t in FAMILIES[family]]
    alphabet = rng.sample(pool, min(len(pool), rng.randint(1, 8)))
    parts = []
    for _ in range(rng.randint(0, 40)):
        if rng.random() < 0.1:
            parts.append(chr(rng.choice([rng.randint(0, 0x2FF), rng.randint(0, 0xFFFF), rng.randint(0, 0x10FFFF)])))
        else:
            parts.append(rng.choice(alphabet) * (1 if rng.random() < 0.6 else rng.randint(2, 30)))
    return "".join(parts)


# Bodies two ways: built by Hypothesis from tokens (they shrink to a short failing text), and seeded swarms (each
# example a different handful of tokens: Hypothesis's own draws repeat the same few tokens across examples).
_pieces = st.one_of(
    st.lists(st.one_of(st.sampled_from(SYNTAX), st.characters()), max_size=60).map("".join),
    st.integers(0, 2**32 - 1).map(lambda seed: _swarm(random.Random(seed))),
)
# Frames that lead a random body past the first checks (a think block, a box, a fence) into the deeper parsers.
_FRAMES = [
    "{0}",
    "<think>\n{0}\n</think>\n{1}",
    "The answer is \\boxed{{{0}}}.",
    "```python\n{0}\n```\n{1}",
    "<think>\n{0}\n</think>\nThe answer is \\boxed{{{1}}}.",
    "{0}\\boxed{{{1}}}{0}",
]
texts = st.builds(lambda frame, a, b: frame.format(a, b), st.sampled_from(_FRAMES), _pieces, _pieces)


@st.composite
def rows(draw) -> tuple[list, list[dict[str, Any]]]:
    """One or two completions (plain or conversational) with the columns of their rows."""
    completions, out = [], []
    for _ in range(draw(st.integers(1, 2))):
        text = draw(texts)
        completions.append([{"role": "assistant", "content": text}] if draw(st.booleans()) else text)
        mode = draw(st.sampled_from([*MODES, None]))
        row = row_columns(
            text,
            draw(st.sampled_from(GOLDS)),
            mode,
            tests=draw(st.sampled_from(TESTS)),
            tool_calls=draw(st.sampled_from(TOOL_CALLS)),
            env_reward=draw(st.sampled_from([None, 0.0, 1.0])),
            reward=draw(st.sampled_from([None, "math_reward", "exact_match_reward", "code_reward"])),
        )
        out.append(row)
    if draw(st.booleans()):  # a batch without token ids: the length rewards count words
        for row in out:
            del row["completion_ids"]
    return completions, out


class Overran(BaseException):
    """Raised by the CPU timer inside a reward call; a BaseException, so no ``except Exception`` swallows it."""


@contextlib.contextmanager
def cpu_bound(seconds: float):
    """Interrupt the block after ``seconds`` of process CPU time (SIGPROF: pytest-timeout keeps SIGALRM)."""

    def overran(signum: int, frame: Any) -> None:
        raise Overran(f"more than {seconds} s of CPU")

    previous = signal.signal(signal.SIGPROF, overran)
    signal.setitimer(signal.ITIMER_PROF, seconds, 0.25)  # again every 0.25 s: a handler that swallows it gains nothing
    try:
        yield
    finally:
        signal.setitimer(signal.ITIMER_PROF, 0)
        signal.signal(signal.SIGPROF, previous)


@pytest.mark.parametrize("name", sorted(REWARDS))
@settings(
    max_examples=FUZZ_EXAMPLES,
    deadline=None,
    derandomize=True,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
@given(batch=rows())
def test_reward_fuzz_returns_scores_in_bounded_time(name: str, batch: tuple[list, list[dict[str, Any]]]):
    completions, batch_rows = batch
    start = time.process_time()
    try:
        with no_programs_run(), cpu_bound(CPU_BOUND_S):
            out = reward_call(name, completions, batch_rows)
    except Overran as e:
        raise AssertionError(f"{name} ran past {CPU_BOUND_S} s of CPU") from e
    took = time.process_time() - start
    assert score_problem(out, len(completions)) is None, score_problem(out, len(completions))
    assert took <= CPU_BOUND_S, f"{name} took {took:.2f} s of CPU"
