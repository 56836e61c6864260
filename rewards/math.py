r"""Math answer verification with math-verify: ``math_reward`` scores 1.0 when the completion's final
answer equals the gold ``answer`` column mathematically (``\frac{3}{4}`` = ``0.75`` = ``3/4``), else 0.0.

What it accepts: ``\boxed{...}`` (preferred, the last one wins), LaTeX, plain numbers, fractions,
percentages, "the final answer is 42" / "Answer: 42" anchors, units (``\text{ cm}``, ``12 dollars``)
stripped. Reasoning inside ``<think>...</think>`` is ignored. A bare number somewhere in the text does not
count unless ``last_number_fallback=True`` (then the last number of the answer part is used when nothing
anchored is found) — off by default so the policy learns to state its answer.

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

from rewards.match import completion_text, last_boxed, strip_think

_NUMBER = re.compile(r"-?\d[\d,]*(?:\.\d+)?(?:/\d+)?|-?\.\d+")
# "12 dollars", "5 apples." inside a box: math-verify would read the words as symbols multiplied by 12
_NUMBER_WITH_WORDS = re.compile(r"^\s*(-?[\d.,/]+)\s*[A-Za-z][A-Za-z .]*$")


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


def _parse_prediction(text: str, last_number_fallback: bool):
    mv = _math_verify()
    timeout = _timeouts()
    boxed = last_boxed(text)
    if boxed is not None:
        m = _NUMBER_WITH_WORDS.match(boxed)
        text = "\\boxed{" + (m.group(1) if m else boxed) + "}"
    anchored = [
        mv.LatexExtractionConfig(try_extract_without_anchor=False),
        mv.ExprExtractionConfig(try_extract_without_anchor=False),
    ]
    parsed = mv.parse(text, extraction_config=anchored, parsing_timeout=timeout)
    if not parsed and last_number_fallback:
        numbers = _NUMBER.findall(text)
        if numbers:
            parsed = mv.parse(numbers[-1].replace(",", ""), parsing_timeout=timeout)
    return parsed


def math_verify_equal(prediction_text: str, gold: str, last_number_fallback: bool = False) -> bool | None:
    r"""True when the final answer in ``prediction_text`` equals ``gold`` mathematically; None when the gold
    itself cannot be parsed (the row is abstained on, with a warning, rather than scored 0 forever).

    >>> math_verify_equal("so the answer is \\boxed{0.75}", "3/4")
    True
    """
    gold_parsed = _parse_gold(gold)
    if not gold_parsed:
        _warn_gold(gold)
        return None
    pred = _parse_prediction(prediction_text, last_number_fallback)
    if not pred:
        return False
    return bool(_math_verify().verify(gold_parsed, pred, timeout_seconds=_timeouts()))


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
        text = strip_think(completion_text(completion))
        equal = math_verify_equal(text, str(gold), last_number_fallback)
        scores.append(None if equal is None else float(equal))
    return scores
