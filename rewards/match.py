r"""Exact-match verification of a final ``\boxed{...}`` answer, and the text helpers every reward shares.

Task families whose answers are not mathematical expressions (sorted lists, words, yes/no) are checked by
``exact_match_reward``: it takes the last ``\boxed{...}`` of the completion, normalises whitespace, case, a
trailing period and ``$...$`` / ``\text{...}`` wrappers, and compares it with the gold ``answer`` column;
comma-separated lists are compared element by element, in order.

The helpers ``completion_text`` (plain or TRL conversational completions), ``last_boxed`` and
``strip_think`` live here because matching answers in completion text is what this module is about; the
other reward modules import them from here.

Run the examples: ``python -m pytest --doctest-modules rewards/match.py``.
"""

from __future__ import annotations

import re
from typing import Any

_THINK_CLOSE = "</think>"


def completion_text(completion: Any) -> str:
    r"""Return the text of one completion, plain (``str``) or TRL conversational (a list of messages).

    For a conversation the contents of its assistant messages are joined (TRL's completions hold one
    assistant message; tool-calling turns may hold more).

    >>> completion_text("The answer is \\boxed{4}.")
    'The answer is \\boxed{4}.'
    >>> completion_text([{"role": "assistant", "content": "\\boxed{4}"}])
    '\\boxed{4}'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        parts = [
            m.get("content") or ""
            for m in completion
            if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
        ]
        return "\n".join(str(p) for p in parts)
    raise ValueError(
        f"completion must be a str or a list of {{'role', 'content'}} messages, got {type(completion).__name__}"
    )


def strip_think(text: str) -> str:
    r"""Return the part of ``text`` after the last ``</think>``: answers inside the reasoning do not count.

    A completion that opens ``<think>`` and never closes it is all reasoning (it was truncated): no answer.

    >>> strip_think("<think>\nmaybe 3\n</think>\nThe answer is 4.")
    '\nThe answer is 4.'
    >>> strip_think("<think>\nstill thinking")
    ''
    """
    if _THINK_CLOSE in text:
        return text.rsplit(_THINK_CLOSE, 1)[1]
    if "<think>" in text:
        return ""
    return text


def last_boxed(text: str) -> str | None:
    r"""Return the content of the last ``\boxed{...}`` (nested braces allowed), or None when there is none.

    >>> last_boxed("\\boxed{1} then \\boxed{\\frac{3}{4}}.")
    '\\frac{3}{4}'
    >>> last_boxed("no box") is None
    True
    """
    start = text.rfind("\\boxed")
    while start != -1:
        i = start + len("\\boxed")
        while i < len(text) and text[i] == " ":
            i += 1
        if i < len(text) and text[i] == "{":
            depth, j = 0, i
            for j in range(i, len(text)):
                if text[j] == "{":
                    depth += 1
                elif text[j] == "}":
                    depth -= 1
                    if depth == 0:
                        return text[i + 1 : j]
        # an unclosed or brace-less \boxed: look for an earlier, complete one
        start = text.rfind("\\boxed", 0, start)
    return None


_TEXT_WRAP = re.compile(r"\\(?:text|textbf|mathrm|mbox)\{([^{}]*)\}")


def normalize_answer(answer: str) -> str:
    r"""Normalise an answer for exact comparison: unwrap ``$``/``\text{}``, collapse spaces, lower-case,
    drop a trailing period.

    >>> normalize_answer("  $\\text{Yes}$. ")
    'yes'
    """
    s = _TEXT_WRAP.sub(r"\1", answer)
    s = s.replace("$", "").strip()
    s = re.sub(r"\s+", " ", s).lower()
    return s.rstrip(".").strip()


def _elements(answer: str) -> list[str]:
    return [normalize_answer(x) for x in normalize_answer(answer).split(",")]


def answers_match(predicted: str, gold: str) -> bool:
    r"""True when two answers are equal after normalisation; comma lists are compared element-wise, in order.

    >>> answers_match("2,5, 9", "2, 5, 9"), answers_match("9, 5, 2", "2, 5, 9")
    (True, False)
    """
    return _elements(predicted) == _elements(gold)


def exact_match_reward(completions: list, answer: list[str | None], **kwargs: Any) -> list[float | None]:
    r"""1.0 when the last ``\boxed{...}`` of the completion equals the gold ``answer`` after normalisation,
    else 0.0; None (abstain) for a row without a gold answer.

    >>> exact_match_reward(
    ...     ["The answer is \\boxed{2, 5, 9}.", "\\boxed{9, 5, 2}", "no box", "\\boxed{YES}."],
    ...     answer=["2, 5, 9", "2, 5, 9", "2, 5, 9", "yes"])
    [1.0, 0.0, 0.0, 1.0]
    """
    scores: list[float | None] = []
    for completion, gold in zip(completions, answer, strict=True):
        if gold is None or str(gold).strip() == "":
            scores.append(None)
            continue
        boxed = last_boxed(strip_think(completion_text(completion)))
        scores.append(1.0 if boxed is not None and answers_match(boxed, str(gold)) else 0.0)
    return scores
