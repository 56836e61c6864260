r"""Where the answer is: the one final answer of a completion, before anything is compared.

Shared by every reward that reads an answer (``math_reward``, ``exact_match_reward``, the format rewards,
``code_reward``); ``rewards.answer`` compares what it finds with the gold.

- **The answer part** (``strip_think``): after the last ``</think>`` and before any ``<think>`` that reopens
  reasoning; a ``<think>`` never closed means no answer (the completion was truncated mid-reasoning).
- **The answer** (``final_answer``): the content of its ``\boxed{...}``; without a box, with ``anchors=True``,
  "The answer is X." / "Final answer: X", markdown emphasis ignored (``**Answer:** 3``). A box that prints nothing
  (``\boxed{}``, ``\boxed{\,}``, ``\boxed{\phantom{3}}``: ``rewards.visible.box_is_visible``) is no answer, so it
  neither counts nor disagrees; all the others must agree: ``\boxed{3} \boxed{4}`` is no answer.
- **Bounded**: one pass over the text finds every box (``all_boxed``); a candidate longer than
  ``MAX_ANSWER_CHARS`` is never compared (``rewards.answer.answer_matches`` refuses it), so it skips the
  visibility check (quadratic in nested LaTeX) and stays a box that must agree: it can only make no answer.

Run the examples: ``python -m pytest --doctest-modules rewards/extract.py``.
"""

from __future__ import annotations

import re
from typing import Any

from rewards.numbers import _TEXT_WRAP
from rewards.visible import box_is_visible

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
MAX_ANSWER_CHARS = 1000  # a longer final answer is not compared at all (score 0)


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
    r"""Return the answer part of ``text``: what follows the last ``</think>``, up to a ``<think>`` that reopens
    reasoning. Answers inside the reasoning do not count, and text after an unclosed ``<think>`` is reasoning.

    A completion that opens ``<think>`` and never closes it is all reasoning (it was truncated): no answer.

    >>> strip_think("<think>\nmaybe 3\n</think>\nThe answer is 4.")
    '\nThe answer is 4.'
    >>> strip_think("<think>\nstill thinking"), strip_think("<think>a</think> 4 <think> \\boxed{3}")
    ('', ' 4 ')
    """
    if _THINK_CLOSE in text:
        text = text.rsplit(_THINK_CLOSE, 1)[1]
    elif _THINK_OPEN in text:
        return ""
    return text.split(_THINK_OPEN, 1)[0]


def all_boxed(text: str) -> list[str]:
    r"""The contents of every complete ``\boxed{...}`` (nested braces allowed), outer before inner, in order.
    One pass over the text: a completion full of unclosed boxes costs no more than any other.

    >>> all_boxed("\\boxed{1} then \\boxed{\\frac{3}{4}} and \\boxed{")
    ['1', '\\frac{3}{4}']
    """
    found, opened, depth, i, n = [], [], 0, 0, len(text)
    while i < n:
        if text.startswith("\\boxed", i):
            j = i + len("\\boxed")
            while j < n and text[j] == " ":
                j += 1
            if j < n and text[j] == "{":
                depth += 1
                opened.append((depth, j + 1))
            i = j + 1 if j < n and text[j] == "{" else j
            continue
        if text[i] == "{":
            depth += 1
        elif text[i] == "}":
            if opened and opened[-1][0] == depth:
                start = opened.pop()[1]
                found.append((start, text[start:i]))
            depth -= 1
        i += 1
    return [content for _, content in sorted(found)]


def last_boxed(text: str) -> str | None:
    r"""The content of the last complete ``\boxed{...}``, or None when there is none.

    >>> last_boxed("\\boxed{1} then \\boxed{\\frac{3}{4}}."), last_boxed("no box")
    ('\\frac{3}{4}', None)
    """
    boxes = all_boxed(text)
    return boxes[-1] if boxes else None



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


_BOLD = re.compile(r"\*\*|__")
# *x* emphasis: a star not between word characters (2*3*4 is arithmetic), hugging non-space text.
_EMPHASIS = re.compile(r"(?<![\w*\\])\*(?=\S)([^*\n]+?)(?<=\S)\*(?![\w*])")


def strip_markdown(text: str) -> str:
    r"""Drop markdown emphasis (``**bold**``, ``__bold__``, ``*italic*``) so that an answer phrase reads the same
    with or without it.

    >>> strip_markdown("**Answer:** 3"), strip_markdown("**The answer is *3***"), strip_markdown("2*3*4")
    ('Answer: 3', 'The answer is 3', '2*3*4')
    """
    return _EMPHASIS.sub(r"\1", _BOLD.sub("", text))


# "The answer is 42." / "Final answer: 42" — up to the end of the sentence or line.
_ANCHOR = re.compile(
    r"answer\s*(?:is|:|=)\s*:?\s*((?:\.\d|[^\s.]).*?)\s*(?:\.\s|\.?$|\n)", re.IGNORECASE | re.MULTILINE
)


def final_answer(text: str, anchors: bool = False) -> str | None:
    r"""The one final answer of a completion: its boxed answer after any reasoning (all boxes that print
    something must agree), else with ``anchors`` an "answer is X" phrase (markdown emphasis ignored); None when
    there is none or it is ambiguous. A box that prints nothing is skipped, but still stands for a box: it does
    not let ``anchors`` read a phrase instead.

    >>> final_answer("<think>\n\\boxed{3}\n</think>\nThe answer is \\boxed{4}.")
    '4'
    >>> final_answer("\\boxed{3} or \\boxed{4}") is None, final_answer("\\boxed{4}, so \\boxed{ 4 }")
    (True, '4')
    >>> final_answer("\\boxed{\\,} \\boxed{4}"), final_answer("\\boxed{\\phantom{3}}") is None
    ('4', True)
    >>> final_answer("The final answer is $-3$.", anchors=True), final_answer("**Answer:** *3*", anchors=True)
    ('$-3$', '3')
    """
    body = strip_think(text)
    found = [b.strip() for b in all_boxed(body)]
    if not found and anchors:
        found = [m.strip() for m in _ANCHOR.findall(strip_markdown(body))]
    found = [f for f in found if len(f) > MAX_ANSWER_CHARS or box_is_visible(f)]  # what prints nothing is no answer
    if not found or len({normalize_answer(f) for f in found}) > 1:
        return None
    return found[-1]

