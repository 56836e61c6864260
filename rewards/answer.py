r"""What "correct" means for each kind of gold answer, given the final answer of a completion.

One definition of correct, shared by ``math_reward`` and ``exact_match_reward`` (and so by GRPO, preference
grading and evaluation, which call them). It is read in three steps, in three modules:

- **Where the answer is** (``final_answer``, in ``rewards.extract``): after the last ``</think>`` and before any
  ``<think>`` that reopens reasoning (a ``<think>`` never closed means no answer there); the content of its
  ``\boxed{...}``. A box that prints nothing (``\boxed{\,}``) is skipped; the others must agree:
  ``\boxed{3} \boxed{4}`` is no answer. Without a box, ``anchors=True`` accepts "The answer is X." /
  "Final answer: X", markdown emphasis ignored (``**Answer:** 3``); all must agree.
- **What kind the gold is** (``answer_kind``, here): ``number`` (``42``, ``-3.5``, ``3/4``, ``\frac{3}{4}``,
  ``1,000``, ``50\%``, ``12 \text{ cm}``), ``list`` (``3, 3, 7, 9``: order and multiplicity count), ``set``
  (``\{2, 3\}``: order does not), ``text`` (``paris``, ``yes``) or ``expression`` (anything else:
  ``\sqrt{2}``, ``2x``, ``(1, 2]``).
- **How a prediction is compared** (``answer_matches``, here): the gold's own text (normalised) always matches.
  Otherwise a number must be *stated as a number* (``parse_number``, in ``rewards.numbers``): nothing before it
  but ``x =``, nothing after it but units (words, ``\text{..}``, ``°``), a fraction only in lowest terms,
  scientific notation only normalised (``1.2 \times 10^{3}``); ``3 + 4``, ``12/4``, ``maybe 3``, ``~3``,
  ``3 und 4`` are not numbers. A percent sign is read one way per gold (``numbers_equal``). An equation counts
  only as ``x = value`` or when its sides are equal (``equation_value``). Lists compare element by element in
  order, sets as sets, text after normalising case, spaces, ``$``/``\text{}`` and a trailing period.
  Expressions are compared by math-verify (``expression_equal``, passed in by ``rewards.math``) once words
  and relations the gold does not have are refused (``foreign_to``).
- **Never raises, bounded**: an answer longer than ``MAX_ANSWER_CHARS`` or a number longer than
  ``MAX_DIGITS`` digits is not read (Python refuses ``int()`` past 4,300 digits); arithmetic errors on
  adversarial text score 0.

The names of ``rewards.extract`` (``final_answer``, ``completion_text``, ``strip_think``, ...) and the number
reading this module uses (``parse_number``, ``numbers_equal``, ...) are importable from here too.

Run the examples: ``python -m pytest --doctest-modules rewards/answer.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable

from rewards.extract import (  # noqa: F401  (re-exported: reward modules and tests import them from here)
    MAX_ANSWER_CHARS,
    all_boxed,
    completion_text,
    final_answer,
    last_boxed,
    normalize_answer,
    strip_markdown,
    strip_think,
)
from rewards.numbers import (  # noqa: F401  (Number, is_proportion, percent_divisor: re-exported)
    _TEXT_WRAP,
    _VAR,
    _VARIABLE,
    Number,
    _clean,
    _typography,
    is_proportion,
    is_unit_tail,
    numbers_equal,
    parse_number,
    percent_divisor,
)

KINDS = ("number", "list", "set", "text", "expression")

ExpressionEqual = Callable[[str, str], "bool | None"]


# ----------------------------------------------------------------------------------------------- equations


def _split_top(s: str, sep: str = ",") -> list[str]:
    """Split on ``sep`` outside brackets and braces."""
    parts, depth, cur = [], 0, []
    for ch in s:
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        if ch == sep and depth == 0:
            parts.append("".join(cur))
            cur = []
        else:
            cur.append(ch)
    parts.append("".join(cur))
    return [p.strip() for p in parts]


_MEMBERSHIP = re.compile(r"^\s*" + _VAR + r"\s*\\in\b\s*")  # "x \in [1, 2]"


def equation_value(pred: str, gold: str, sides_equal: ExpressionEqual | None) -> str | None:
    r"""The value an answer states when it is an equation, or None for an equation that states nothing.

    ``x = value`` (a variable name on the left) states its right side, as ``x \in [1, 2]`` states its set;
    ``3 + 4 = 7`` states its last side when every side equals it (checked by ``sides_equal``; without one it
    cannot be checked); a false equation (``2 + 2 = 5``) states nothing. An answer without ``=``, or a gold that
    is itself an equation, is left as is.

    >>> equation_value("x = 5", "5", None), equation_value("2+2=5", "5", None), equation_value("5", "5", None)
    ('5', None, '5')
    """
    if "=" in gold:
        return pred
    pred = _MEMBERSHIP.sub("", pred, count=1)
    sides = _split_top(pred, "=")
    if len(sides) == 1:
        return pred
    if any(not side for side in sides):
        return None
    if _VARIABLE.fullmatch(_clean(sides[0])):
        sides = sides[1:]
    if len(sides) > 1 and (sides_equal is None or not all(sides_equal(a, sides[-1]) for a in sides[:-1])):
        return None
    return sides[-1]


# ----------------------------------------------------------------------------------------------- expressions

_RELATION = re.compile(
    r"\\(?:approx|approxeq|sim|simeq|cong|propto|pm|mp|lor|vee|land|wedge|geq?|leq?|geqslant|leqslant|neq?|"
    r"gtrsim|lesssim|in|ni|notin|subset|subseteq|supset|supseteq|lt|gt)\b|[<>≈∼±∓≤≥≠∨∧]"
)
MATH_WORDS = frozenset(
    "sin cos tan sec csc cot arcsin arccos arctan sinh cosh tanh coth log ln lg exp lim sup inf max min gcd lcm "
    "det mod deg dim ker arg sgn tr pi infty".split()
)
_COMMAND = re.compile(r"\\[A-Za-z]+")
_LETTERS = re.compile(r"[A-Za-z]+")
_TRAILING_UNIT = re.compile(r"\s*\\(?:text|textrm|mathrm|mbox)\s*\{([^{}]*)\}(?:\s*\^\s*\{?[23]\}?)?\s*$")


def drop_marked_units(s: str) -> str:
    r"""Drop ``\text{..}`` units at the end of an expression (``\sqrt{2}\text{ cm}``) when they are unit words.

    >>> drop_marked_units("2\\sqrt{3} \\text{ cm}^2"), drop_marked_units("\\sqrt{2}\\text{ probably}")
    ('2\\sqrt{3}', '\\sqrt{2}\\text{ probably}')
    """
    while (m := _TRAILING_UNIT.search(s)) and m.start() > 0 and is_unit_tail(" \\text{" + m.group(1).strip() + "}"):
        s = s[: m.start()]
    return s.strip()


def symbols(s: str) -> set[str]:
    r"""The letters of ``s`` that are math symbols: outside commands (``\sqrt``) and ``\text{..}`` units.

    >>> sorted(symbols("2x + \\sqrt{y} \\text{ cm}")), symbols("\\frac{\\pi}{2}")
    (['x', 'y'], set())
    """
    return set("".join(_LETTERS.findall(_COMMAND.sub(" ", _TEXT_WRAP.sub(" ", s)))))


def foreign_to(pred: str, gold: str) -> str | None:
    r"""The first word or relation in ``pred`` that the gold does not have, else None. Allowed: the gold's own
    words, function names (``sin``, ``log``), products of the gold's variables (``xy``), single-letter symbols
    (math-verify compares those). Refused: any other word (``maybe``, ``und``, ``roughly``) and relations or
    alternatives (``\approx``, ``\pm``, ``<``, ``\lor``) the gold does not use.

    >>> foreign_to("maybe \\sqrt{2}", "\\sqrt{2}"), foreign_to("\\approx \\sqrt{2}", "\\sqrt{2}"), foreign_to("yx+1", "xy+1")
    ('maybe', '\\approx', None)
    """
    for rel in _RELATION.findall(_typography(pred)):
        if rel not in gold:
            return rel
    gold_words = {w.lower() for w in _LETTERS.findall(_COMMAND.sub(" ", gold))}
    gold_letters = symbols(gold)
    for word in _LETTERS.findall(_COMMAND.sub(" ", pred)):
        low = word.lower()
        if len(word) == 1 or low in gold_words or low in MATH_WORDS or set(word) <= gold_letters:
            continue
        return word
    return None


# ----------------------------------------------------------------------------------------------- kinds


def _unwrap(s: str, pairs: tuple[tuple[str, str], ...]) -> str | None:
    for left, right in pairs:
        if s.startswith(left) and s.endswith(right):
            return s[len(left) : len(s) - len(right)].strip()
    return None


_SET_BRACES = (("\\{", "\\}"), ("{", "}"))
_LIST_BRACKETS = (("[", "]"), ("(", ")"))


def answer_kind(gold: str) -> str:
    r"""The kind of a gold answer: number, list, set, text or expression.

    >>> [answer_kind(g) for g in ("42", "1,000", "3, 3, 7, 9", "\\{2, 3\\}", "Paris", "\\sqrt{2}", "(1, 2]", "2x")]
    ['number', 'number', 'list', 'set', 'text', 'expression', 'expression', 'expression']
    """
    s = _clean(gold)
    if parse_number(gold, strict=False) is not None:
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


def same_text(pred: str, gold: str) -> bool:
    r"""Whether two answers read the same after normalising typography, ``$``/``\text{}``, case, spaces and a
    trailing period.

    >>> same_text("\\text{Yes}.", "yes"), same_text("−3", "-3"), same_text("~3", "3")
    (True, True, False)
    """
    return normalize_answer(_clean(pred)) == normalize_answer(_clean(gold))


def _item_equal(pred: str, gold: str, exact: bool) -> bool:
    if not exact and answer_kind(gold) == "number":
        return numbers_equal(pred, gold)
    return same_text(pred, gold)


def answer_matches(
    pred: str, gold: str, exact: bool = False, expression_equal: ExpressionEqual | None = None
) -> bool | None:
    r"""Whether the final answer ``pred`` is the gold answer, by the gold's kind; None when the gold cannot be
    judged (an expression and no ``expression_equal``, or one it cannot parse). ``exact`` compares numbers as
    text too (``exact_match_reward``). Never raises: adversarial text that breaks arithmetic scores False.

    >>> answer_matches("7, 3, 9", "3, 3, 7, 9"), answer_matches("3, 3, 7, 9", "3, 3, 7, 9")
    (False, True)
    >>> answer_matches("\\{3, 2\\}", "\\{2, 3\\}"), answer_matches("3 not four", "3"), answer_matches("3 + 4", "7")
    (True, False, False)
    >>> answer_matches("3 and 4", "3 and 4"), answer_matches("x = 3", "3"), answer_matches("2+2=5", "5")
    (True, True, False)
    """
    if len(pred) > MAX_ANSWER_CHARS:
        return False
    try:
        return _matches(pred, gold, exact, expression_equal)
    except (ValueError, ArithmeticError, RecursionError):  # e.g. int() past 4,300 digits: not an answer
        return False


def _matches(pred: str, gold: str, exact: bool, expression_equal: ExpressionEqual | None) -> bool | None:
    if same_text(pred, gold):  # the gold's own shape always counts ("3 and 4" for "3 and 4")
        return True
    kind = answer_kind(gold)
    if kind == "list":
        p, g = _items(pred, _LIST_BRACKETS), _items(gold, ())
        return len(p) == len(g) and all(_item_equal(a, b, exact) for a, b in zip(p, g))
    if kind == "set":
        p, g = _items(pred, _SET_BRACES), _items(gold, _SET_BRACES)
        return all(any(_item_equal(a, b, exact) for b in g) for a in p) and all(
            any(_item_equal(a, b, exact) for a in p) for b in g
        )
    if kind == "text" or exact:
        return False  # same_text was the test
    value = equation_value(pred, gold, expression_equal)
    if value is None:
        return False
    if kind == "number":
        return numbers_equal(value, gold)
    value = drop_marked_units(value)
    if foreign_to(value, gold) is not None:
        return False  # "maybe x", "x \pm 1", "x und y": not one answer
    if symbols(gold) and parse_number(value) is not None:
        return False  # "2" for "2x": a number is not an expression in a variable
    return None if expression_equal is None else expression_equal(value, gold)
