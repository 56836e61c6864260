r"""Reading a number: the grammar of an answer that states a number, and when two stated numbers are equal.

An answer states a number only when the whole span is, in this order (``parse_number``)::

    [variable =] [currency] [sign] [currency] NUMBER [percent | degrees] [currency] [units]

- **NUMBER**: digits with thousands separators (``1,000``, ``12{,}345``, ``2,\!000``, ``12 345`` with thin or
  non-breaking spaces), a decimal (``-3.5``, ``.5``), a fraction (``\frac{3}{4}``, ``3/4``; in lowest terms with a
  denominator above 1 for a prediction: ``12/4`` is a division, not a statement of 3), a mixed number
  (``2\frac{1}{2}``, ``2 1/2``, a proper fraction), a repeating decimal (``0.\overline{3}``, ``0.1\dot{6}``, or
  ``0.333\ldots`` when the digits before the ellipsis repeat a block at least twice), normalised scientific
  notation (``1.2e3``, ``1.2 \times 10^{3}``, 1 <= |m| < 10).
- **percent**: ``%``, ``\%``, ``percent``, ``per cent``, ``pct``, ``percentage``, ``percentage points``, in
  ``\text{..}`` or not — read by its meaning (``percent_divisor``), never as a unit word.
- **degrees**: ``^\circ``, ``°``, ``\degree``, with a temperature scale letter (``20^\circ C``).
- **units**: up to ``MAX_UNIT_WORDS`` words that ``rewards.units.UnitContext.accepts`` (a word of the gold or the
  question, or a unit of measure of a dimension it names), in ``\text{..}`` or not, joined by spaces, ``/`` or
  "per", with ``^2``/``^3`` or "square"/"cubic"; touching the number only a unit of measure of 2+ letters
  (``12cm``; ``2x`` is a variable, so an expression).

Anything else anywhere in the span — a word before the number (``maybe 3``, ``~3``), a second number, an operator
(``3 + 4``, ``2^3``), a word the context does not accept after it (``3 approximately``, ``3 dozen``), a trailing
ellipsis that repeats nothing (``3\ldots``, ``1.41\ldots``) — and the span is not a number.

Equality (``numbers_equal``): exact, a percent read one way per gold (``percent_divisor``), a decimal rounding of a
non-terminating gold to 3 or more places (``0.333`` for 1/3).

Bounded: an answer longer than ``MAX_NUMBER_CHARS``, more than ``MAX_DIGITS`` digits or a power of ten past
``MAX_POWER_OF_TEN`` is not a number (Python refuses ``int()`` past 4,300 digits).

Run the examples: ``python -m pytest --doctest-modules rewards/numbers.py``.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import NamedTuple

from rewards.latex import plain, typography
from rewards.units import FUNCTION_WORDS, NUMBER_WORDS, UnitContext, dimension_of  # noqa: F401  (re-exported)

MAX_NUMBER_CHARS = 200  # a longer answer is not read as a number
MAX_DIGITS = 100  # a number with more digits is not read (int() raises past 4,300)
MAX_POWER_OF_TEN = 400  # |k| in scientific notation m x 10^k
MAX_UNIT_WORDS = 4  # "square metres per second"; a longer tail is a sentence, not a unit

_GREEK = (
    r"\\(?:alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|"
    r"sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega)(?![A-Za-z])"
)
# x, a_{n}, \theta, f(2), x'
_VAR = r"(?:[A-Za-z]|" + _GREEK + r")(?:_\{?[A-Za-z0-9]+\}?)?'*(?:\([A-Za-z0-9, ]*\))?"
_VARIABLE = re.compile(_VAR)
_CURRENCY = r"\\\$|€|£|¥"
_HEAD = re.compile(
    rf"(?:(?P<var>{_VAR})\s*=\s*)?(?:(?P<cur1>{_CURRENCY})\s*)?(?P<sign>[-+])?\s*(?:(?P<cur2>{_CURRENCY})\s*)?"
)
_BODIES = [
    ("mixed", re.compile(r"(?P<whole>\d+)\s*\\frac\{\s*(?P<top>\d+)\s*\}\{\s*(?P<bottom>\d+)\s*\}")),
    ("fraction", re.compile(r"\\frac\{\s*(?P<top>-?\d+)\s*\}\{\s*(?P<bottom>\d+)\s*\}")),
    ("mixed", re.compile(r"(?P<whole>\d+)\s+(?P<top>\d+)\s*/\s*(?P<bottom>\d+)")),
    ("fraction", re.compile(r"(?P<top>\d+)\s*/\s*(?P<bottom>\d+)")),
    (
        "scientific",
        re.compile(
            r"(?P<mant>[1-9](?:\.\d+)?)\s*(?:[eE](?P<exp>[-+]?\d+)"
            r"|\\(?:times|cdot)\s*10\s*\^\s*(?:\{\s*(?P<texp>[-+]?\d+)\s*\}|(?P<texp1>\d)))"
        ),
    ),
    (
        "repeating",
        re.compile(
            r"(?P<int>\d*)\.(?P<pre>\d*)(?:\\overline\s*\{\s*(?P<rep>\d+)\s*\}|\\dot\s*\{?\s*(?P<dot>\d)\s*\}?)"
        ),
    ),
    ("decimal", re.compile(r"(?P<dec>(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+)(?:\s*(?P<dots>\\ldots))?")),
]
_PERCENT_WORD = r"(?:%|percent(?:age)?(?:\s+points?)?|per\s*cent|pct\.?)"
_PERCENT = re.compile(rf"\s*(?:{_PERCENT_WORD}|\\text\{{\s*{_PERCENT_WORD}\s*\}})(?![A-Za-z])")
_DEGREES = re.compile(
    r"\s*(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree(?![A-Za-z]))(?:\s*(?:\\text\{\s*[CFK]\s*\}|[CFK](?![A-Za-z])))?"
)
_TRAILING_CURRENCY = re.compile(rf"\s*(?:{_CURRENCY})")
_UNIT_ITEM = re.compile(
    r"(?P<sep>\s*/\s*|\s*\\cdot\s*|\s+per\s+|\s*)"
    r"(?:\\text\{(?P<marked>[^{}]*)\}|(?P<word>[A-Za-z]+\.?))"
    r"(?:\s*\^\s*\{?\s*(?P<power>[23])\s*\}?)?"
)
_MODIFIERS = {"square": "2", "sq": "2", "cubic": "3", "cu": "3"}


class Number(NamedTuple):
    """A number as stated: its value (a percent as its figure: ``50\\%`` is 50), whether it carried a percent,
    whether it was written as a fraction, and its decimal places when written as a plain decimal."""

    value: Fraction
    percent: bool
    fraction: bool = False
    places: int = 0


def _units_ok(tail: str, units: UnitContext, attached: bool) -> bool:
    """Whether ``tail`` (what follows the number) is only units the context accepts (module docstring)."""
    if not tail.strip():
        return True
    words: list[tuple[str, bool, str]] = []  # (word, marked or under a slash, power)
    pos = 0
    while pos < len(tail):
        m = _UNIT_ITEM.match(tail, pos)
        if m is None or m.end() == pos:
            return False
        joined = m.group("sep").strip() in ("/", "per", "\\cdot")
        power = m.group("power") or ""
        if m.group("marked") is not None:
            parts = [p for p in re.split(r"[\s/]+", m.group("marked")) if p]
            if not parts or any(not p.rstrip(".").isalpha() for p in parts):
                return False
            words += [(p, True, power if k == len(parts) - 1 else "") for k, p in enumerate(parts)]
        else:
            words.append((m.group("word"), joined, power))
        pos = m.end()
    if not words or len(words) > MAX_UNIT_WORDS:
        return False
    first = words[0][0].rstrip(".").lower()
    if attached and (len(first) < 2 or dimension_of(first) is None):
        return False  # 2x, 3ab: letters touching a number are a variable unless they are a unit of measure
    modifier = ""
    for i, (word, marked, power) in enumerate(words):
        low = word.rstrip(".").lower()
        if low in _MODIFIERS and i + 1 < len(words) and not modifier:
            modifier = _MODIFIERS[low]  # "square metres": the next word must be a unit
            continue
        if not units.accepts(word, marked=marked, power=power or modifier):
            return False
        modifier = ""
    return True


def _repeating(digits: str) -> tuple[str, str] | None:
    """(prefix, block) when ``digits`` end in a block repeated at least twice (``1666`` -> ``1``, ``6``), else None:
    an ellipsis after such digits says the block repeats; after any other digits it only says "and so on"."""
    n = len(digits)
    for p in range(1, n // 2 + 1):
        if digits[n - p :] == digits[n - 2 * p : n - p]:
            start = n - 2 * p
            while start > 0 and digits[start - 1] == digits[start - 1 + p]:
                start -= 1
            return digits[:start], digits[start : start + p]
    return None


def _value(kind: str, m: re.Match, strict: bool) -> tuple[Fraction, bool, int] | None:
    """(value, written as a fraction, decimal places) of a matched number body; None when it is not a number:
    a zero denominator, a reducible or improper fraction when ``strict``, a power of ten past the bound."""
    if kind in ("fraction", "mixed"):
        top, bottom = int(m.group("top")), int(m.group("bottom"))
        if bottom == 0 or (strict and (bottom == 1 or math.gcd(top, bottom) != 1)):
            return None
        if kind == "mixed":
            if top >= bottom or top == 0:
                return None  # 2\frac{3}{2} is not a mixed number
            return int(m.group("whole")) + Fraction(top, bottom), True, 0
        return Fraction(top, bottom), True, 0
    if kind == "scientific":
        exponent = int(m.group("exp") or m.group("texp") or m.group("texp1"))
        if abs(exponent) > MAX_POWER_OF_TEN:
            return None
        return Fraction(m.group("mant")) * Fraction(10) ** exponent, False, 0
    if kind == "repeating":
        pre, block = m.group("pre"), m.group("rep") or m.group("dot")
        return _from_repeating(m.group("int") or "0", pre, block), False, 0
    dec = m.group("dec").replace(",", "")
    if m.group("dots"):
        whole, _, frac = dec.partition(".")
        found = _repeating(frac)
        if found is None:
            return None
        return _from_repeating(whole or "0", *found), False, 0
    return Fraction(dec), False, len(dec.partition(".")[2])


def _from_repeating(whole: str, pre: str, block: str) -> Fraction:
    """The value of ``whole.pre(block)(block)...``."""
    return (
        int(whole)
        + Fraction(int(pre or "0"), 10 ** len(pre))
        + Fraction(int(block), 10 ** len(pre) * (10 ** len(block) - 1))
    )


def parse_number(s: str, strict: bool = True, units: UnitContext | None = None) -> Number | None:
    r"""The number ``s`` states under the grammar of the module docstring, or None. ``strict=False`` (for golds)
    accepts a fraction not in lowest terms; ``units`` says which words may follow the number (default: units of
    measure only, as with no prompt).

    >>> parse_number("\\$1,000"), parse_number("42 \\text{ cm}").value
    (Number(value=Fraction(1000, 1), percent=False, fraction=False, places=0), Fraction(42, 1))
    >>> parse_number("\\frac{3}{4}"), parse_number("2\\frac{1}{2}").value, parse_number("0.\\overline{3}").value
    (Number(value=Fraction(3, 4), percent=False, fraction=True, places=0), Fraction(5, 2), Fraction(1, 3))
    >>> parse_number("50 per cent").percent, parse_number("1.2 \\times 10^{3}").value, parse_number("0.1666...").value
    (True, Fraction(1200, 1), Fraction(1, 6))
    >>> [parse_number(s) for s in ("3 + 4", "3 or 4", "about 3", "~3", "3 dozen", "3, 4", "12/4", "2x", "3\\ldots")]
    [None, None, None, None, None, None, None, None, None]
    """
    if len(s) > MAX_NUMBER_CHARS:
        return None
    s = plain(s)
    head = _HEAD.match(s)
    pos = head.end()
    found = next(((kind, m) for kind, pattern in _BODIES if (m := pattern.match(s, pos)) is not None), None)
    if found is None:
        return None
    kind, body = found
    if sum(ch.isdigit() for ch in body.group()) > MAX_DIGITS:
        return None
    pos = body.end()
    percent = _PERCENT.match(s, pos)
    if percent is not None:
        pos = percent.end()
    elif (degrees := _DEGREES.match(s, pos)) is not None:
        pos = degrees.end()
    if (money := _TRAILING_CURRENCY.match(s, pos)) is not None:
        pos = money.end()
    tail = s[pos:]
    attached = pos == body.end() and bool(tail) and not tail[0].isspace() and not tail.startswith("\\text")
    if not _units_ok(tail, units if units is not None else UnitContext(), attached):
        return None
    stated = _value(kind, body, strict)
    if stated is None:
        return None
    value, fraction, places = stated
    if head.group("sign") and body.group().startswith("-"):
        return None  # --3
    return Number(-value if head.group("sign") == "-" else value, percent is not None, fraction, places)


def gold_number(gold: str) -> Number | None:
    r"""A gold answer read as a number: reducible fractions allowed, its own words accepted as its units.

    >>> gold_number("12 apples").value, gold_number("\\frac{12}{4}").value, gold_number("2x")
    (Fraction(12, 1), Fraction(3, 1), None)
    """
    return parse_number(gold, strict=False, units=UnitContext(gold=gold, prompt=""))


def is_unit_tail(tail: str, units: UnitContext | None = None) -> bool:
    r"""Whether ``tail`` (what follows a number, starting with its space) is only units the context accepts.

    >>> [is_unit_tail(t) for t in (" cm", " \\text{m}", " km/h", " cm^2", " square metres", " probably", " x")]
    [True, True, True, True, True, False, False]
    """
    return _units_ok(plain(" " + tail) if tail[:1].isspace() else tail, units or UnitContext(), attached=False)


def _terminates(q: Fraction) -> bool:
    """Whether ``q`` has a finite decimal expansion (its denominator has no prime factor but 2 and 5)."""
    d = q.denominator
    for p in (2, 5):
        while d % p == 0:
            d //= p
    return d == 1


def is_proportion(gold: Number) -> bool:
    """A gold a percent can stand for: written as a fraction, or strictly between -1 and 1 (``0.5``)."""
    return gold.fraction or 0 < abs(gold.value) < 1


def percent_divisor(pred: Number, gold: Number) -> int:
    r"""What the prediction's figure is divided by (100 or 1) to compare it with the gold: a percent (in any
    spelling) is read one way for each gold, never both, so no answer matches at two scales:

    - a percent gold (``50\%``) asks for a percentage: figures are compared, the percent optional (``50``
      and ``50 percent`` match, ``0.5`` does not);
    - a proportion gold (``0.5``, ``\frac{1}{2}``): a percent divides by 100 (``50\%``, ``50 pct`` match,
      ``0.5\%`` does not);
    - any other gold (``50``): a percent leaves the figure as it is (``50\%`` matches, ``5000\%`` does not).
    """
    return 100 if pred.percent and not gold.percent and is_proportion(gold) else 1


def numbers_equal(pred: str, gold: str, units: UnitContext | None = None) -> bool:
    r"""Exact equality of two stated numbers, a percent read by ``percent_divisor``; a decimal rounding of a
    non-terminating gold (1/3) counts when it gives at least 3 places. ``units``: what may follow the prediction
    (default: the gold's words and units of measure).

    >>> [numbers_equal(p, g) for p, g in [("0.75", "3/4"), ("25%", "25"), ("0.333", "1/3"), ("0.3", "1/3")]]
    [True, True, True, False]
    >>> [numbers_equal(p, g) for p, g in [("50\\%", "0.5"), ("0.5 pct", "0.5"), ("0.5", "50\\%"), ("50", "50\\%")]]
    [True, False, False, True]
    """
    p = parse_number(pred, units=units if units is not None else UnitContext(gold=gold))
    g = gold_number(gold)
    if p is None or g is None:
        return False
    return _equal(p, g)


def _equal(p: Number, g: Number) -> bool:
    divisor = percent_divisor(p, g)
    if p.value / divisor == g.value:
        return True
    places = p.places + (2 if divisor == 100 else 0)  # 33.33% gives 4 places of 1/3
    if places >= 3 and not _terminates(g.value):  # 0.333 for 1/3: a rounding, to the places it gives
        return abs(p.value / divisor - g.value) <= Fraction(1, 2 * 10**places)
    return False


__all__ = [
    "MAX_DIGITS", "MAX_NUMBER_CHARS", "MAX_POWER_OF_TEN", "Number", "gold_number", "is_proportion",
    "is_unit_tail", "numbers_equal", "parse_number", "percent_divisor", "typography",
]  # fmt: skip
