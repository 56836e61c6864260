r"""Reading a number: what an answer's text states when it states a number, and when two numbers are equal.

Split from ``rewards.answer`` (which compares a final answer with its gold by kind) because reading a number is a
grammar of its own, the part of "correct" most attacked: a number is stated as a number (``parse_number``) —
``[x =] [sign] number [%] [units]`` and nothing else — so hedges (``maybe 3``, ``~3``), echoes (``12/4``,
``3 + 4``), two values (``3 und 4``) and variables (``2x``, ``5m``) are not numbers. The pieces:

- **typography is not content** (``_typography``, ``_clean``): Unicode minus, superscript exponents, ``×``/``·``,
  thin and non-breaking spaces between digit groups (``12 345``), ``\dfrac``, ``\left``/``\right``, degrees and
  currency are made plain before anything is read;
- **units vs variables** (``is_unit_tail``): a unit is a word of 2+ letters after a space, anything letters-only
  in ``\text{}``, or a known abbreviation touching the number (``12cm``); a lone letter or other letters touching
  it (``2x``) are a variable; a closed-class word (``and``, ``probably``, ``ish``) is never a unit;
- **the number itself** (``parse_number``): digits with thousands commas, a fraction in lowest terms (``strict``;
  golds may be reducible), normalised scientific notation, a percent sign;
- **equality** (``numbers_equal``): exact, a percent sign read one way per gold (``percent_divisor``), a rounding
  to 3 or more places of a non-terminating gold (``0.333`` for 1/3).

Bounded: an answer longer than ``MAX_NUMBER_CHARS``, more than ``MAX_DIGITS`` digits or a power of ten past
``MAX_POWER_OF_TEN`` is not a number (Python refuses ``int()`` past 4,300 digits). Imports nothing of ours.

Run the examples: ``python -m pytest --doctest-modules rewards/numbers.py``.
"""

from __future__ import annotations

import math
import re
from fractions import Fraction
from typing import NamedTuple

MAX_NUMBER_CHARS = 200  # a longer answer is not read as a number
MAX_DIGITS = 100  # a number with more digits is not read (int() raises past 4,300)
MAX_POWER_OF_TEN = 400  # |k| in scientific notation m x 10^k
MAX_UNIT_WORDS = 3  # "metres per second"; a longer tail is a sentence, not a unit

# \text{..}-like wrappers (also read by rewards.extract and rewards.answer)
_TEXT_WRAP = re.compile(r"\\(?:text|textbf|textrm|textit|mathrm|mathbf|mathit|mbox|operatorname)\s*\{([^{}]*)\}")

# ----------------------------------------------------------------------------------------------- typography

_MINUS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-"})
_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-")
_SUPERSCRIPTS = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻]+")
_THIN = "\u2009"  # every thin space (typographic or LaTeX) becomes this; between digit groups it is a separator
_SPACES = re.compile(r"[\u00a0\u2007\u2009\u200a\u202f]|\\[,;:!> ]|\\(?:thinspace|quad|qquad)\b")
# A leading ~ means "about" (~3); anywhere else it is LaTeX's non-breaking space (12~\text{cm}).
_TILDE_ABOUT = re.compile(r"(?:^|(?<=[\s$({=]))~(?=\s*[-+.\d])")
_THOUSANDS = re.compile(rf"(?<![\d.,])(\d{{1,3}})((?:{_THIN}\d{{3}})+)(?![\d])")


def _typography(s: str) -> str:
    r"""Typographic forms of the same characters, made plain: Unicode minus, superscript exponents, ``×``/``·``,
    thin and non-breaking spaces (digit groups separated by them are joined: ``12 345`` is 12345), and
    ``~`` read as "about" when it leads a number.

    >>> _typography("−1.2×10³"), _typography("12\u202f345"), _typography("~3")
    ('-1.2 \\times 10^{3}', '12345', '≈3')
    """
    s = s.translate(_MINUS).replace(",\\!", ",")  # 2,\!000: MATH's thousands comma
    s = _SUPERSCRIPTS.sub(lambda m: "^{" + m.group().translate(_SUPERSCRIPT) + "}", s)
    s = s.replace("×", " \\times ").replace("·", " \\cdot ").replace("⋅", " \\cdot ").replace("÷", " \\div ")
    s = _TILDE_ABOUT.sub("≈", s)
    s = _SPACES.sub(_THIN, s.replace("~", _THIN))
    s = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(_THIN, ""), s)
    return s.replace(_THIN, " ").strip()


_LATEX_NOISE = [
    (re.compile(r"\\[dt]frac"), r"\\frac"),
    (re.compile(r"\\frac(\d)(\d)"), r"\\frac{\1}{\2}"),
    (re.compile(r"\{,\}"), ","),
    (re.compile(r"\\left\b|\\right\b"), " "),
    # degrees are a unit, dropped (with a temperature scale letter: 20°C)
    (
        re.compile(r"(?:\^\s*\{?\s*\\circ\s*\}?|°|\\degree\b)(?:\s*(?:\\(?:text|mathrm)\s*\{\s*[CFK]\s*\}|[CFK]\b))?"),
        " ",
    ),
    (re.compile(r"\\\$|\\euro\b|\\pounds\b|€|£|¥"), " "),  # currency before a number
    (re.compile(r"\\%"), "%"),
]


def _unwrap_text(s: str, keep_units: bool) -> str:
    r"""Unwrap ``\text{..}``-like groups; with ``keep_units`` a group of letters only stays, as ``\text{..}``,
    so that the number grammar can tell a marked unit (``\text{m}``) from a variable (``m``)."""

    def one(m: re.Match) -> str:
        inner = m.group(1)
        if keep_units and re.search(r"[A-Za-z]", inner) and not re.search(r"\d", inner):
            return " \\text{" + inner.strip() + "} "
        return " " + inner + " "

    return _TEXT_WRAP.sub(one, s)


def _clean(s: str, keep_units: bool = False) -> str:
    s = _typography(s)
    s = _unwrap_text(s, keep_units)
    for pattern, repl in _LATEX_NOISE:
        s = pattern.sub(repl, s)
    s = s.replace("$", " ")
    return re.sub(r"\s+", " ", s).strip().rstrip(".").strip()


# ----------------------------------------------------------------------------------------------- numbers

# Closed word classes (conjunctions, prepositions, determiners, pronouns, auxiliaries, adverbs of degree and
# doubt): after a number they make a hedge, a comparison or a sentence, never a unit. Adverbs in -ly are too.
FUNCTION_WORDS = frozenset(
    "and or nor but yet so either neither else otherwise then also plus minus times versus vs und oder et ou "
    "to from than over under about around above below at by for of in on into onto with without within between "
    "among near beyond up down off out a an the this that these those it its some any each every all both few "
    "many much more most less least fewer other another such what which who is are was were be been being am "
    "do does did has have had may might can could will would shall should must not never no none maybe perhaps "
    "possibly probably approximately approx about circa ca exactly just only likely unlikely surely certainly "
    "definitely clearly apparently presumably somewhat very quite rather too ever still even already yes "
    "greater smaller larger bigger higher lower if unless except whether though although because since while "
    "or/and and/or etc ish odd something".split()
)
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion "
    "half third quarter".split()
)
# Unit abbreviations that may touch the number (12cm, 5kg); any other letters touching it are variables (2x, 3ab).
ATTACHED_UNITS = frozenset(
    "mm cm dm km nm um mg kg ml cl dl lb lbs oz ft yd mi hr hrs min mins sec secs ms mph kph kmh deg rad "
    "kw kwh mw gb mb kb tb hz khz mhz ghz".split()
)

_GREEK = (
    r"\\(?:alpha|beta|gamma|delta|epsilon|varepsilon|zeta|eta|theta|vartheta|iota|kappa|lambda|mu|nu|xi|rho|"
    r"sigma|tau|upsilon|phi|varphi|chi|psi|omega|Gamma|Delta|Theta|Lambda|Xi|Sigma|Phi|Psi|Omega)"
)
_VAR = r"(?:[A-Za-z]|" + _GREEK + r")(?:_\{?[A-Za-z0-9]+\}?)?'*(?:\([A-Za-z0-9, ]*\))?"  # x, a_{n}, \theta, f(2)
_VARIABLE = re.compile(_VAR)
_DEC = r"(?:\d{1,3}(?:,\d{3})+|\d+)(?:\.\d+)?|\.\d+"
_NUMBER_ANSWER = re.compile(
    rf"(?:(?P<var>{_VAR})\s*=\s*)?(?P<sign>[-+])?\s*"
    r"(?:\\frac\{\s*(?P<ftop>-?\d+)\s*\}\{\s*(?P<fbot>\d+)\s*\}"  # \frac{3}{4}
    r"|(?P<stop>\d+)\s*/\s*(?P<sbot>\d+)"  # 3/4
    r"|(?P<mant>[1-9](?:\.\d+)?)\s*(?:[eE](?P<eexp>[-+]?\d+)"  # 1.2e3
    r"|\\(?:times|cdot)\s*10\s*\^\s*(?:\{\s*(?P<texp>[-+]?\d+)\s*\}|(?P<texp1>\d)))"  # 1.2 \times 10^{3}
    rf"|(?P<dec>{_DEC}))"  # 42, -3.5, 1,000
    r"(?P<pct>\s*(?:%|percent\b))?"
    r"(?P<tail>.*)",
    re.DOTALL,
)
_UNIT = r"(?:\\text\{[^{}]*\}|[A-Za-z]+\.?)(?:\s*\^\s*(?:\{\s*[23]\s*\}|[23]))?"
_UNIT_TAIL = re.compile(rf"\s*{_UNIT}(?:(?:\s+|\s*/\s*){_UNIT})*\s*")  # words apart: no backtracking blow-up
_UNIT_PART = re.compile(r"(/?)\s*(?:\\text\{([^{}]*)\}|([A-Za-z]+)\.?)")


class Number(NamedTuple):
    """A number as stated: its value (a percent as its figure: ``50\\%`` is 50), whether it carried a percent
    sign, whether it was written as a fraction, and its decimal places when written as a plain decimal."""

    value: Fraction
    percent: bool
    fraction: bool = False
    places: int = 0


def _is_unit_word(word: str, marked: bool, after_slash: bool) -> bool:
    """A word that can name a unit: letters, not a closed-class word, a number word or an -ly adverb; a single
    letter only when marked up (``\\text{m}``) or under a slash (``km/h``) — alone it is a variable."""
    w = word.rstrip(".").lower()
    if not w.isalpha() or w in FUNCTION_WORDS or w in NUMBER_WORDS or (w.endswith("ly") and len(w) > 3):
        return False
    return len(w) >= 2 or marked or after_slash


def is_unit_tail(tail: str) -> bool:
    r"""Whether what follows a number is only units: up to ``MAX_UNIT_WORDS`` unit words (``cm``, ``apples``,
    ``\text{ m}``, ``km/h``, ``cm^2``). A unit touching the number must be a known abbreviation (``12cm``);
    other letters touching it (``2x``) or a lone letter (``2 x``) are a variable, so the answer is an expression.

    >>> [is_unit_tail(t) for t in (" cm", " \\text{m}", " km/h", "cm", " apples", " cm^2")]
    [True, True, True, True, True, True]
    >>> [is_unit_tail(t) for t in ("x", " x", " or 4", " probably", " und 4", " (approx)", " three")]
    [False, False, False, False, False, False, False]
    """
    if not tail.strip():
        return True
    if _UNIT_TAIL.fullmatch(tail) is None:
        return False
    words = []
    for m in _UNIT_PART.finditer(tail):
        after_slash = m.group(1) == "/"
        if m.group(2) is not None:
            parts = [p for p in re.split(r"[\s/.]+", re.sub(r"\^\{?[23]\}?", "", m.group(2))) if p]
            words += [(p, True, after_slash) for p in parts]
        else:
            words.append((m.group(3), False, after_slash))
    if not words or len(words) > MAX_UNIT_WORDS:
        return False
    attached = not tail[0].isspace() and not tail.startswith("\\text")
    if attached and words[0][0].rstrip(".").lower() not in ATTACHED_UNITS:
        return False
    return all(_is_unit_word(*w) for w in words)


def _digits(m: re.Match) -> int:
    return sum(ch.isdigit() for ch in m.string[: m.start("tail")])


def _fraction(top: str, bottom: str, strict: bool) -> Fraction | None:
    """``top/bottom`` as a number: a zero denominator is none, and ``strict`` wants lowest terms with a
    denominator above 1 (``12/4`` is a division, not a statement of 3)."""
    t, b = int(top), int(bottom)
    if b == 0 or (strict and (b == 1 or math.gcd(t, b) != 1)):
        return None
    return Fraction(t, b)


def parse_number(s: str, strict: bool = True) -> Number | None:
    r"""The number ``s`` states, or None. Allowed: ``x =`` before it, a sign, digits (``1,000``, ``−3``, ``12 345``
    with thin spaces), a fraction in lowest terms, normalised scientific notation, a percent sign, and units
    after it (``is_unit_tail``). Anything else — words or symbols before it, a second number, an operator —
    makes it not a number. ``strict=False`` (for golds) accepts a fraction not in lowest terms.

    >>> parse_number("\\$1,000"), parse_number("42 \\text{ cm}").value
    (Number(value=Fraction(1000, 1), percent=False, fraction=False, places=0), Fraction(42, 1))
    >>> parse_number("\\frac{3}{4}")
    Number(value=Fraction(3, 4), percent=False, fraction=True, places=0)
    >>> parse_number("50\\%").percent, parse_number("1.2 \\times 10^{3}").value, parse_number("−3").value
    (True, Fraction(1200, 1), Fraction(-3, 1))
    >>> [parse_number(s) for s in ("3 + 4", "3 or 4", "about 3", "~3", "3 not four", "3, 4", "12/4", "2x")]
    [None, None, None, None, None, None, None, None]
    """
    if len(s) > MAX_NUMBER_CHARS:
        return None
    m = _NUMBER_ANSWER.fullmatch(_clean(s, keep_units=True))
    if m is None or _digits(m) > MAX_DIGITS or not is_unit_tail(m.group("tail")):
        return None
    stated = _stated_value(m, strict)
    if stated is None:
        return None
    value, fraction, places = stated
    return Number(-value if m.group("sign") == "-" else value, bool(m.group("pct")), fraction, places)


def _stated_value(m: re.Match, strict: bool) -> tuple[Fraction, bool, int] | None:
    """(value before the sign, written as a fraction, decimal places) of a matched number; None when it is not
    one: a zero denominator, a reducible fraction when ``strict``, two signs, a power of ten past the bound."""
    top, bottom = m.group("ftop") or m.group("stop"), m.group("fbot") or m.group("sbot")
    if top is not None:
        if m.group("sign") and top.startswith("-"):
            return None
        value = _fraction(top, bottom, strict)
        return None if value is None else (value, True, 0)
    if m.group("mant") is not None:
        exponent = int(m.group("eexp") or m.group("texp") or m.group("texp1"))
        if abs(exponent) > MAX_POWER_OF_TEN:
            return None
        return Fraction(m.group("mant")) * Fraction(10) ** exponent, False, 0
    dec = m.group("dec")
    return Fraction(dec.replace(",", "")), False, len(dec.partition(".")[2])


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
    r"""What the prediction's figure is divided by (100 or 1) to compare it with the gold: a percent sign is
    read one way for each gold, never both, so no answer matches at two scales:

    - a percent gold (``50\%``) asks for a percentage: figures are compared, the percent sign optional (``50``
      and ``50\%`` match, ``0.5`` does not);
    - a proportion gold (``0.5``, ``\frac{1}{2}``): a percent sign divides by 100 (``50\%`` matches, ``0.5\%``
      does not);
    - any other gold (``50``): a percent sign is a unit, dropped like ``cm`` (``50\%`` matches, ``5000\%`` does not).
    """
    return 100 if pred.percent and not gold.percent and is_proportion(gold) else 1


def numbers_equal(pred: str, gold: str) -> bool:
    r"""Exact equality of two stated numbers, a percent read by ``percent_divisor``; a decimal rounding of a
    non-terminating gold (1/3) counts when it gives at least 3 places.

    >>> numbers_equal("0.75", "3/4"), numbers_equal("25%", "25"), numbers_equal("0.333", "1/3"), numbers_equal("0.3", "1/3")
    (True, True, True, False)
    >>> numbers_equal("50\\%", "0.5"), numbers_equal("5000\\%", "50"), numbers_equal("0.5", "50\\%"), numbers_equal("50", "50\\%")
    (True, False, False, True)
    """
    p, g = parse_number(pred), parse_number(gold, strict=False)
    if p is None or g is None:
        return False
    divisor = percent_divisor(p, g)
    if p.value / divisor == g.value:
        return True
    places = p.places + (2 if divisor == 100 else 0)  # 33.33% gives 4 places of 1/3
    if places >= 3 and not _terminates(g.value):  # 0.333 for 1/3: a rounding, to the places it gives
        return abs(p.value / divisor - g.value) <= Fraction(1, 2 * 10**places)
    return False

