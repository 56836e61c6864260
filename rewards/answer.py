r"""The final answer of a completion, and what "correct" means for each kind of gold answer.

One definition of correct, shared by ``math_reward`` and ``exact_match_reward`` (and so by GRPO, preference
grading and evaluation, which call them):

- **Where the answer is** (``final_answer``): after the last ``</think>`` (a ``<think>`` never closed means no
  answer); the content of its ``\boxed{...}``. Several boxes must agree: ``\boxed{3} \boxed{4}`` is no
  answer. Without a box, ``anchors=True`` accepts "The answer is X." / "Final answer: X" (again, all such
  phrases must agree).
- **What kind the gold is** (``answer_kind``): ``number`` (``42``, ``-3.5``, ``3/4``, ``\frac{3}{4}``,
  ``1,000``, ``50%``), ``list`` (``3, 3, 7, 9``: order and multiplicity count), ``set`` (``\{2, 3\}``: order
  does not), ``text`` (``paris``, ``yes``) or ``expression`` (anything else: ``\sqrt{2}``, ``(1, 2]``).
- **How a prediction is compared** (``answer_matches``): a number must be *stated as a number* (digits,
  a fraction, a percent, optionally ``x =`` before it and up to two unit words after it) and equal the gold
  exactly (``0.75`` = ``3/4``; a decimal may round a non-terminating gold to 3+ places). ``3 + 4`` for 7 is
  an expression, not a number: echoing the question's arithmetic earns nothing; ``3 or 4``, ``about 3``,
  ``3 not four`` are not numbers either. Lists compare element by element in order, sets as sets, text
  after normalising case, spaces, ``$``/``\text{}`` and a trailing period. Expressions are compared by
  math-verify (``expression_equal``, passed in by ``rewards.math``), after the same refusal of hedges.

Run the examples: ``python -m pytest --doctest-modules rewards/answer.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from fractions import Fraction
from typing import Any

_THINK_CLOSE = "</think>"
KINDS = ("number", "list", "set", "text", "expression")


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


_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textrm|mathrm|mathbf|mbox)\s*\{([^{}]*)\}")


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


# "The answer is 42." / "Final answer: 42" — up to the end of the sentence or line.
_ANCHOR = re.compile(r"answer\s*(?:is|:|=)\s*:?\s*((?:\.\d|[^\s.]).*?)\s*(?:\.\s|\.?$|\n)", re.IGNORECASE | re.MULTILINE)


def final_answer(text: str, anchors: bool = False) -> str | None:
    r"""The one final answer of a completion: its boxed answer after any reasoning (all boxes must agree),
    else with ``anchors`` an "answer is X" phrase; None when there is none or it is ambiguous.

    >>> final_answer("<think>\n\\boxed{3}\n</think>\nThe answer is \\boxed{4}.")
    '4'
    >>> final_answer("\\boxed{3} or \\boxed{4}") is None, final_answer("\\boxed{4}, so \\boxed{ 4 }")
    (True, '4')
    >>> final_answer("The final answer is $-3$.", anchors=True)
    '$-3$'
    """
    body = strip_think(text)
    found = [b.strip() for b in all_boxed(body)]
    if not found and anchors:
        found = [m.strip() for m in _ANCHOR.findall(body)]
    found = [f for f in found if f]
    if not found or len({normalize_answer(f) for f in found}) > 1:
        return None
    return found[-1]


# ----------------------------------------------------------------------------------------------- numbers

_LATEX_NOISE = [
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"\\frac(\d)(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\{,\}"), ","),
    (re.compile(r"\\left|\\right|\\!|\\,|\\;|\\:|~|\\ "), " "),
    (re.compile(r"\^\s*\{?\\circ\}?|°"), ""),
    (re.compile(r"\\\$|\\euro|€|£"), ""),
    (re.compile(r"\\%"), "%"),
]
_NUMBER = re.compile(
    r"(?P<num>-?\\frac\{\s*-?\d+\s*\}\{\s*\d+\s*\}|-?\d+\s*/\s*\d+|-?(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|-?\.\d+)"
    r"\s*(?P<pct>%|percent)?"
)
# Words that turn "3 <words>" from a number with a unit into a hedge or a second answer.
HEDGE_WORDS = frozenset(
    "or and not nor but either neither maybe perhaps possibly probably approximately approx about around roughly "
    "nearly almost over under than to plus minus times divided except also or/and and/or if unless".split()
)
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion "
    "half third quarter".split()
)
_UNIT = re.compile(r"[a-z][a-z.]*")


def _clean(s: str) -> str:
    s = _TEXT_WRAP.sub(r" \1 ", s)
    for pattern, repl in _LATEX_NOISE:
        s = pattern.sub(repl, s)
    s = s.replace("$", " ")
    return re.sub(r"\s+", " ", s).strip().rstrip(".").strip()


def parse_number(s: str) -> tuple[Fraction, bool] | None:
    r"""(value, is_percent) when ``s`` states one number — optionally ``x =`` before it and at most two unit
    words after it, none a hedge or a number word — else None.

    >>> parse_number("\\$1,000"), parse_number("\\frac{3}{4}"), parse_number("42 \\text{ cm}"), parse_number("50\\%")
    ((Fraction(1000, 1), False), (Fraction(3, 4), False), (Fraction(42, 1), False), (Fraction(50, 1), True))
    >>> [parse_number(s) for s in ("3 + 4", "3 or 4", "about 3", "3 not four", "3, 4")]
    [None, None, None, None, None]
    """
    s = _clean(s)
    s = re.sub(r"^[A-Za-z]\s*=\s*", "", s)  # "x = 3"
    m = _NUMBER.match(s)
    if m is None:
        return None
    words = s[m.end() :].split()
    if len(words) > 2 or not all(_UNIT.fullmatch(w.lower()) for w in words):
        return None
    if any(w.lower().strip(".") in HEDGE_WORDS | NUMBER_WORDS for w in words):
        return None
    num = m.group("num").replace(" ", "").replace(",", "")
    if num.lstrip("-").startswith("\\frac"):
        sign = -1 if num.startswith("-") else 1
        top, bottom = re.findall(r"\{(-?\d+)\}", num)
        if int(bottom) == 0:
            return None
        value = sign * Fraction(int(top), int(bottom))
    elif "/" in num:
        top, bottom = num.split("/")
        if int(bottom) == 0:
            return None
        value = Fraction(int(top), int(bottom))
    else:
        value = Fraction(num)
    return value, bool(m.group("pct"))


def _decimals(s: str) -> int:
    m = re.search(r"\.(\d+)", _clean(s))
    return len(m.group(1)) if m else 0


def numbers_equal(pred: str, gold: str) -> bool:
    """Exact equality of two stated numbers (a percent may stand for its fraction or its figure); a decimal
    rounding of a non-terminating gold (1/3) counts when it gives at least 3 places.

    >>> numbers_equal("0.75", "3/4"), numbers_equal("25%", "25"), numbers_equal("0.333", "1/3"), numbers_equal("0.3", "1/3")
    (True, True, True, False)
    """
    p, g = parse_number(pred), parse_number(gold)
    if p is None or g is None:
        return False
    (pv, ppct), (gv, gpct) = p, g
    candidates = {pv} | ({pv / 100} if ppct else set())
    targets = {gv} | ({gv / 100} if gpct else set())
    if candidates & targets:
        return True
    places = _decimals(pred)
    terminating = all(f in (2, 5) for f in _factors(gv.denominator))
    if places >= 3 and not terminating:
        return any(abs(c - t) <= Fraction(1, 2 * 10**places) for c in candidates for t in targets)
    return False


def _factors(n: int) -> set[int]:
    out, f = set(), 2
    while f * f <= n:
        while n % f == 0:
            out.add(f)
            n //= f
        f += 1
    return out | ({n} if n > 1 else set())


# ----------------------------------------------------------------------------------------------- kinds


def _split_top(s: str) -> list[str]:
    """Split on commas outside brackets and braces."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == "," and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


def _unwrap(s: str, pairs: tuple[tuple[str, str], ...]) -> str | None:
    for left, right in pairs:
        if s.startswith(left) and s.endswith(right):
            return s[len(left) : len(s) - len(right)].strip()
    return None


_SET_BRACES = (("\\{", "\\}"), ("{", "}"))
_LIST_BRACKETS = (("[", "]"), ("(", ")"))


def answer_kind(gold: str) -> str:
    r"""The kind of a gold answer: number, list, set, text or expression.

    >>> [answer_kind(g) for g in ("42", "1,000", "3, 3, 7, 9", "\\{2, 3\\}", "Paris", "\\sqrt{2}", "(1, 2]")]
    ['number', 'number', 'list', 'set', 'text', 'expression', 'expression']
    """
    s = _clean(gold)
    if parse_number(s) is not None:
        return "number"
    if _unwrap(s, _SET_BRACES) is not None:
        return "set"
    if len(_split_top(s)) > 1:
        return "list"
    if re.fullmatch(r"[A-Za-z][A-Za-z '\-]*", s):
        return "text"
    return "expression"


def _items(s: str, brackets: tuple[tuple[str, str], ...]) -> list[str]:
    s = _clean(s)
    inner = _unwrap(s, brackets)
    return _split_top(inner if inner is not None else s)


def _item_equal(pred: str, gold: str, exact: bool) -> bool:
    if not exact and answer_kind(gold) == "number":
        return numbers_equal(pred, gold)
    return normalize_answer(_clean(pred)) == normalize_answer(_clean(gold))


def answer_matches(
    pred: str, gold: str, exact: bool = False, expression_equal: Callable[[str, str], bool | None] | None = None
) -> bool | None:
    r"""Whether the final answer ``pred`` is the gold answer, by the gold's kind; None when the gold cannot be
    judged (an expression and no ``expression_equal``, or one it cannot parse). ``exact`` compares numbers as
    text too (``exact_match_reward``).

    >>> answer_matches("7, 3, 9", "3, 3, 7, 9"), answer_matches("3, 3, 7, 9", "3, 3, 7, 9")
    (False, True)
    >>> answer_matches("\\{3, 2\\}", "\\{2, 3\\}"), answer_matches("3 not four", "3"), answer_matches("3 + 4", "7")
    (True, False, False)
    """
    kind = answer_kind(gold)
    if kind == "number":
        return numbers_equal(pred, gold) if not exact else normalize_answer(_clean(pred)) == normalize_answer(_clean(gold))
    if kind == "list":
        p, g = _items(pred, _LIST_BRACKETS), _items(gold, ())
        return len(p) == len(g) and all(_item_equal(a, b, exact) for a, b in zip(p, g))
    if kind == "set":
        p, g = _items(pred, _SET_BRACES), _items(gold, _SET_BRACES)
        return all(any(_item_equal(a, b, exact) for b in g) for a in p) and all(
            any(_item_equal(a, b, exact) for a in p) for b in g
        )
    if kind == "text" or exact:
        return normalize_answer(_clean(pred)) == normalize_answer(_clean(gold))
    words = set(re.findall(r"[a-z]+", _TEXT_WRAP.sub(r" \1 ", pred).lower()))
    if words & HEDGE_WORDS or re.search(r"\\(?:lor|vee|pm|mp)\b", pred):
        return False  # "x or y", "\pm": two answers in one
    return None if expression_equal is None else expression_equal(pred, gold)
