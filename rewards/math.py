r"""Math answer verification: ``math_reward`` scores 1.0 when the completion's one final answer equals the
gold ``answer`` column, else 0.0.

What "equals" means depends on the gold (``rewards.answer``): a number must be stated as a number and be
equal (``\frac{3}{4}`` = ``0.75`` = ``3/4``, ``50\%`` = ``0.5``, ``\$1,000`` = ``1000``, up to two unit words
``12 dollars``, ``42 \text{ cm}``); a comma list (the sort family's ``3, 3, 7, 9``) compares element by
element in order; a set ``\{2, 3\}`` as a set; anything else (``\sqrt{2}``, ``x^2+1``, intervals) by
math-verify. Where the answer is: the ``\boxed{...}`` after any ``<think>...</think>`` (several boxes must
agree), else "The final answer is 42" / "Answer: 42". Not accepted: an arithmetic expression for a number
(``3 + 4`` for 7: echoing the question), hedges (``3 or 4``, ``about 3``, ``3 not four``), several different
boxed answers, an answer only inside the reasoning. A bare number somewhere in the text does not count unless
``last_number_fallback=True`` (then the last number of the answer part is used when nothing anchored is
found) — off by default so the policy learns to state its answer.

math-verify bounds its parsing with ``signal.alarm``, which only works in the main thread; in any other
thread (an async reward loop, a thread pool) the timeouts are switched off rather than crashing.

math-verify is imported lazily (it pulls sympy and antlr). Run the examples:
``python -m pytest --doctest-modules rewards/math.py``.
"""

from __future__ import annotations

import re
import threading
import warnings
from functools import lru_cache
from typing import Any

from rewards.answer import answer_kind, answer_matches, completion_text, final_answer, strip_think

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")


@lru_cache(maxsize=1)
def _math_verify():
    try:
        import math_verify
    except ImportError as e:  # pragma: no cover - math-verify is a core dependency
        raise ImportError("math_reward needs math-verify: pip install 'math-verify[antlr4_13_2]'") from e
    return math_verify


@lru_cache(maxsize=256)
def _warn_gold(gold: str) -> None:
    warnings.warn(
        f"math_reward cannot parse the gold answer {gold!r}: those rows get None (abstain). Check the dataset's "
        "'answer' column, or use exact_match_reward for non-mathematical answers.",
        stacklevel=3,
    )


def _timeouts() -> int | None:
    # signal.alarm can only be armed from the main thread; elsewhere math-verify raises ValueError.
    return 5 if threading.current_thread() is threading.main_thread() else None


def _parse_gold(gold: str):
    mv = _math_verify()
    timeout = _timeouts()
    # Boxing the gold makes math-verify read "2, 5, 9" as one set instead of its last number.
    parsed = mv.parse("\\boxed{" + gold + "}", parsing_timeout=timeout)
    return parsed or mv.parse(gold, parsing_timeout=timeout)


def _expression_equal(pred: str, gold: str) -> bool | None:
    mv = _math_verify()
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        _warn_gold(gold)
        return None
    parsed = mv.parse("\\boxed{" + pred + "}", parsing_timeout=_timeouts())
    return bool(parsed) and bool(mv.verify(gold_parsed, parsed, timeout_seconds=_timeouts()))


def math_verify_equal(text: str, gold: str, last_number_fallback: bool = False) -> bool | None:
    r"""True when the final answer of ``text`` (a completion) equals ``gold``; None when the gold itself
    cannot be parsed (the row is abstained on, with a warning, rather than scored 0 forever).

    >>> math_verify_equal("so the answer is \\boxed{0.75}", "3/4"), math_verify_equal("\\boxed{3 + 4}", "7")
    (True, False)
    """
    pred = final_answer(text, anchors=True)
    if pred is None and last_number_fallback:
        numbers = _NUMBER.findall(strip_think(text))
        pred = numbers[-1].rstrip(",").replace(",", "") if numbers else None
    if pred is None:
        if answer_kind(gold) == "expression" and not _parse_gold(gold):
            _warn_gold(gold)
            return None
        return False
    return answer_matches(pred, gold, expression_equal=_expression_equal)


def math_reward(
    completions: list, answer: list[str | None], last_number_fallback: bool = False, **kwargs: Any
) -> list[float | None]:
    r"""1.0 when the completion's final answer equals the gold ``answer``, 0.0 otherwise, None without a gold.

    >>> math_reward(
    ...     ["<think>\n2+2\n</think>\nThe answer is \\boxed{4}.", "\\boxed{\\frac{1}{2}}", "I think 4", "\\boxed{5}"],
    ...     answer=["4", "0.5", "4", None])
    [1.0, 1.0, 0.0, None]
    >>> math_reward(["I think 4"], answer=["4"], last_number_fallback=True)
    [1.0]
    """
    scores: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        if gold is None or str(gold).strip() == "":
            scores.append(None)
            continue
        equal = math_verify_equal(completion_text(completion), str(gold), last_number_fallback)
        scores.append(None if equal is None else float(equal))
    return scores
