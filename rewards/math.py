r"""Math answer verification: ``math_reward`` scores 1.0 when the completion states the gold ``answer`` column,
else 0.0 (None without a gold, or for a gold math-verify cannot read).

What "states" means is ``rewards.answer.judge``: every answer candidate of the answer part (every box in any
spelling, "The answer is X", "Final Answer: X", ``#### X``; ``rewards.extract``) must be read whole by the grammar
of the gold's kind (``rewards.grammar``: a number as a number, ``\frac{3}{4}`` = ``0.75``, ``50 pct`` = ``0.5``,
units only from the question or a unit of measure of its dimension; equations by variable name; sets in any order;
intervals, tuples and lists in order; matrices in any environment; inequalities in any spelling or direction; a
choice by its letter) and equal the gold; expressions are compared by math-verify once the grammar found nothing
foreign in them. Not accepted: ``3 + 4`` or ``12/4`` for 3 (echoing the question), a false equation, hedges
(``3 or 4``, ``about 3``, ``3 approximately``), a second different answer in any spelling, an answer only inside
the reasoning. A bare number somewhere in the text does not count unless ``last_number_fallback=True`` (then the
last number of the answer part is used when there is no candidate at all) — off by default so the policy learns
to state its answer. ``prompts`` (TRL passes them) lets a unit be the question's own word (``5 apples``).

Symbolic comparison is bounded on every thread (``bounded``): a prediction far more costly than its gold (an
exponent tower, a huge exponent or literal, a factorial the gold does not have) is refused before parsing,
since big-integer arithmetic cannot be interrupted; what remains runs under a wall-clock deadline that works
outside the main thread too (math-verify's own ``signal.alarm`` only works in the main thread), and all the
comparisons one completion needs share that deadline (``SymbolicBudget``).

math-verify is imported lazily (it pulls sympy and antlr). Run the examples:
``python -m pytest --doctest-modules rewards/math.py``.
"""

from __future__ import annotations

import ctypes
import re
import threading
import time
import warnings
from collections.abc import Callable
from functools import lru_cache
from typing import Any, TypeVar

from rewards.answer import answer_kind, answer_matches, completion_text, judge, prompt_text, strip_think
from rewards.extract import MAX_SCAN_CHARS

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
T = TypeVar("T")
_SYMBOLIC_KINDS = ("expression", "inequality", "equation")  # kinds math-verify must read for a verdict

SYMBOLIC_SECONDS = 5.0  # wall-clock bound on one symbolic comparison (parse + verify), on any thread
MAX_SYMBOLIC_CHARS = 300  # a longer prediction (and twice the gold's length) is not parsed
MAX_EXPONENT = 1000  # a larger integer in an exponent is refused unless the gold has one as large
MAX_LITERAL_DIGITS = 30  # a longer integer literal is refused unless the gold has one as long
MAX_NESTING = 6  # deeper brackets are refused unless the gold nests as deep (parsing time doubles per level)
# Operators whose cost grows with the value of their argument (n!, binomials, sums and products to n).
COSTLY_OPERATORS = (r"(?<!\\)!", r"\\[dt]?binom\b", r"\\choose\b", r"\\Gamma\b", r"\\sum\b", r"\\prod\b")


@lru_cache(maxsize=1)
def _math_verify():
    try:
        import math_verify
    except ImportError as e:  # pragma: no cover - math-verify is a core dependency
        raise ImportError("math_reward needs math-verify: pip install 'math-verify[antlr4_13_2]'") from e
    for module in (math_verify.parser, math_verify.grader):  # its "timeout is disabled" warning: ``bounded`` is ours
        module.TIMEOUT_WARNING_SHOWN = True
    return math_verify


@lru_cache(maxsize=256)
def _warn_gold(gold: str) -> None:
    warnings.warn(
        f"math_reward cannot parse the gold answer {gold!r}: those rows get None (abstain). Check the dataset's "
        "'answer' column, or use exact_match_reward for non-mathematical answers.",
        stacklevel=3,
    )


# ----------------------------------------------------------------------------------------------- bounds


class DeadlineExceeded(BaseException):
    """Raised inside a thread whose symbolic evaluation ran past its deadline. A BaseException, so that
    math-verify's and sympy's ``except Exception`` handlers do not swallow it and go on computing."""


def bounded(fn: Callable[[], T], seconds: float = SYMBOLIC_SECONDS, default: T | None = None) -> T | None:
    """Run ``fn()`` in the calling thread, any thread, and return its result, or ``default`` when it runs past
    ``seconds``: a timer raises ``DeadlineExceeded`` in the thread once (as ``signal.alarm`` would, but not only
    in the main thread), and never after ``fn`` returned. Python code is interrupted between bytecodes; a single
    C-level operation (a huge integer power) is not, which is why ``within_budget`` refuses those first.

    >>> bounded(lambda: 2 + 2), bounded(lambda: [0 for _ in iter(int, 1)], seconds=0.2, default="late")
    (4, 'late')
    """
    target, lock, done, timers = threading.get_ident(), threading.Lock(), [], []

    def expire() -> None:
        with lock:  # under the lock: it either lands before ``done`` is set (and is caught below) or not at all
            if not done:
                ctypes.pythonapi.PyThreadState_SetAsyncExc(ctypes.c_ulong(target), ctypes.py_object(DeadlineExceeded))

    try:
        try:
            with lock:
                timers.append(threading.Timer(seconds, expire))
                timers[0].daemon = True
                timers[0].start()
            return fn()
        finally:
            with lock:
                done.append(True)
            for timer in timers:
                timer.cancel()  # a Python call: a deadline still pending is raised here, inside the try
    except DeadlineExceeded:
        return default


def _exponents(s: str) -> list[tuple[str, str, bool]]:
    r"""(base, exponent, stacked) for every ``^`` in ``s``: the braced, bracketed or single-token group on each
    side, and whether the base is itself an exponent (``9^{9}^{9}``).

    >>> _exponents("9^{9^{9}}"), _exponents("(x+1)^2")
    ([('9', '9^{9}', False), ('9', '9', False)], [('(x+1)', '2', False)])
    """
    s = s.replace("**", "^")
    out = []
    for i, ch in enumerate(s):
        if ch != "^":
            continue
        j = i + 1
        while j < len(s) and s[j] == " ":
            j += 1
        if j < len(s) and s[j] == "{":
            exponent = _group(s, j)
        else:
            m = re.match(r"\\[A-Za-z]+|-?\d+|.", s[j:]) if j < len(s) else None
            exponent = m.group() if m else ""
        k = i - 1
        while k >= 0 and s[k] == " ":
            k -= 1
        if k >= 0 and s[k] in ")}]":
            base = _group_back(s, k)
        else:
            m = re.search(r"(?:\\[A-Za-z]+|\d+|.)$", s[: k + 1]) if k >= 0 else None
            base = m.group() if m else ""
        out.append((base, exponent, s[: k + 1 - len(base)].rstrip().endswith("^")))
    return out


def _group(s: str, start: int) -> str:
    """The inside of the brace group opening at ``start`` (to the end of ``s`` when unclosed)."""
    depth = 0
    for i in range(start, len(s)):
        depth += (s[i] == "{") - (s[i] == "}")
        if depth == 0:
            return s[start + 1 : i]
    return s[start + 1 :]


def _group_back(s: str, end: int) -> str:
    """The bracket group closing at ``end``, found backwards, brackets included."""
    depth = 0
    for i in range(end, -1, -1):
        depth += (s[i] in ")}]") - (s[i] in "({[")
        if depth == 0:
            return s[i : end + 1]
    return s[: end + 1]


def _tower(s: str) -> bool:
    """A power of a power (``9^{9^{9}}``, ``(2^{10})^{10}``, ``9^{9}^{9}``): its value can outgrow any bound."""
    return any("^" in base or "^" in exponent or stacked for base, exponent, stacked in _exponents(s))


def _largest_exponent(s: str) -> int:
    """The largest integer written in an exponent (read in 12-digit pieces: no int() of a huge string)."""
    return max((int(n) for _, e, _ in _exponents(s) for n in re.findall(r"\d{1,12}", e)), default=0)


def _longest_literal(s: str) -> int:
    return max((len(n) for n in re.findall(r"\d+", s)), default=0)


def _nesting(s: str) -> int:
    """The deepest bracket nesting of ``s``, ``(``, ``[`` and ``{`` alike."""
    depth = deepest = 0
    for ch in s:
        depth += (ch in "([{") - (ch in ")]}")
        deepest = max(deepest, depth)
    return deepest


def _costly_operators(s: str) -> set[str]:
    return {op for op in COSTLY_OPERATORS if re.search(op, s)}


def within_budget(pred: str, gold: str) -> bool:
    r"""Whether ``pred`` is cheap enough to evaluate symbolically next to ``gold``: not longer than
    ``MAX_SYMBOLIC_CHARS`` (or twice the gold), no exponent tower, no exponent above ``MAX_EXPONENT``, no
    integer literal over ``MAX_LITERAL_DIGITS`` digits, brackets at most ``MAX_NESTING`` deep and none of
    ``COSTLY_OPERATORS`` — each unless the gold has it too. An answer states a value; these shapes only make evaluation
    cost what the policy chooses.

    >>> [within_budget(p, "\\sqrt{2}") for p in ("9^{9^{9^{9}}}", "2^{100000000}", "999999!", "((((((((1))))))))")]
    [False, False, False, False]
    >>> within_budget("\\frac{\\sqrt{8}}{2}", "\\sqrt{2}"), within_budget("\\left(\\frac{x}{2}\\right)^{2}", "x^2/4")
    (True, True)
    """
    return (
        len(pred) <= max(MAX_SYMBOLIC_CHARS, 2 * len(gold))
        and (not _tower(pred) or _tower(gold))
        and _largest_exponent(pred) <= max(MAX_EXPONENT, _largest_exponent(gold))
        and _longest_literal(pred) <= max(MAX_LITERAL_DIGITS, _longest_literal(gold))
        and _nesting(pred) <= max(MAX_NESTING, _nesting(gold))
        and _costly_operators(pred) <= _costly_operators(gold)
    )


# ----------------------------------------------------------------------------------------------- math-verify


def _read(answer: str) -> list:
    """math-verify's reading of an answer (boxing it makes "2, 5, 9" one set rather than its last number).
    Unbounded: call it under ``bounded`` (math-verify's own timeouts stay off: they need the main thread)."""
    mv = _math_verify()
    return mv.parse("\\boxed{" + answer + "}", parsing_timeout=None) or mv.parse(answer, parsing_timeout=None)


def _gold_unreadable(gold: str) -> bool:
    return answer_kind(gold) in _SYMBOLIC_KINDS and not bounded(lambda: _read(gold), default=[])


def _expression_equal(pred: str, gold: str, seconds: float = SYMBOLIC_SECONDS) -> bool | None:
    """math-verify's equality of two expressions, within budget and bounded in time (a timeout is False);
    None when the gold cannot be parsed."""
    if not within_budget(pred, gold):
        return False
    mv = _math_verify()

    def compare() -> bool | None:
        gold_parsed = _read(gold)
        if not gold_parsed:
            return None
        parsed = _read(pred)
        return bool(parsed) and bool(mv.verify(gold_parsed, parsed, timeout_seconds=None))

    return bounded(compare, seconds=seconds, default=False)


class SymbolicBudget:
    """``_expression_equal`` under one deadline for a whole completion: a list or set of costly entries, or a
    chain of sides, shares ``seconds`` rather than getting them each; once spent, every comparison is False."""

    def __init__(self, seconds: float = SYMBOLIC_SECONDS) -> None:
        self.deadline = time.monotonic() + seconds

    def __call__(self, pred: str, gold: str) -> bool | None:
        left = self.deadline - time.monotonic()
        return _expression_equal(pred, gold, seconds=left) if left > 0 else False


def math_verify_equal(
    text: str, gold: str, last_number_fallback: bool = False, prompt: str | None = None
) -> bool | None:
    r"""True when the completion ``text`` states ``gold`` (``rewards.answer.judge``: every answer candidate, read
    under the gold's grammar); None when the gold itself cannot be parsed (the row is abstained on, with a warning,
    rather than scored 0 forever). ``prompt``: the question, whose words may be the answer's units.

    >>> math_verify_equal("so the answer is \\boxed{0.75}", "3/4"), math_verify_equal("\\boxed{3 + 4}", "7")
    (True, False)
    """
    budget = SymbolicBudget()
    equal = judge(text, gold, prompt=prompt, expression_equal=budget)
    if equal is None and last_number_fallback:
        numbers = _NUMBER.findall(strip_think(text)[-MAX_SCAN_CHARS:])
        if numbers:
            last = numbers[-1].rstrip(",").replace(",", "")
            equal = answer_matches(last, gold, expression_equal=budget, prompt=prompt)
    if equal is None:
        if not _gold_unreadable(gold):
            return False
        _warn_gold(gold)
    return equal


def math_reward(
    completions: list,
    answer: list[str | None],
    last_number_fallback: bool = False,
    prompts: list | None = None,
    **kwargs: Any,
) -> list[float | None]:
    r"""1.0 when the completion's final answer equals the gold ``answer``, 0.0 otherwise, None without a gold.
    ``prompts`` (TRL passes them): a unit after a number may be a word the question uses (``5 apples``).

    >>> math_reward(
    ...     ["<think>\n2+2\n</think>\nThe answer is \\boxed{4}.", "\\boxed{\\frac{1}{2}}", "I think 4", "\\boxed{5}"],
    ...     answer=["4", "0.5", "4", None])
    [1.0, 1.0, 0.0, None]
    >>> math_reward(["I think 4"], answer=["4"], last_number_fallback=True)
    [1.0]
    >>> math_reward(["\\boxed{5 apples}"] * 2, answer=["5"] * 2, prompts=["How many apples?", "How tall is it?"])
    [1.0, 0.0]
    """
    scores: list[float | None] = []
    for i, (completion, gold) in enumerate(zip(completions, answer, strict=True)):
        if gold is None or str(gold).strip() == "":
            scores.append(None)
            continue
        prompt = prompt_text(prompts[i]) if prompts is not None and i < len(prompts) else None
        equal = math_verify_equal(completion_text(completion), str(gold), last_number_fallback, prompt)
        scores.append(None if equal is None else float(equal))
    return scores
