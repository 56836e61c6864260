r"""Units after a number: which words may follow a stated number without changing what it states.

A unit is accepted by an allow-list, never by excluding words one at a time:

- **a word the question uses for what it counts or measures**: a word of the gold answer (``10 \text{ cm}``), or of
  the prompt right after a number or after "how many" / "how much" / "number of" (``Tom has 5 apples ... How many
  apples ...`` makes ``apples`` a unit);
- **a unit of measure** (``UNITS``: SI and imperial units, time, currency, angle, temperature, data, with their
  spellings and plurals) whose **dimension** the prompt or the gold names, by one of its units or a word for the
  dimension (``DIMENSION_WORDS``: "long", "weigh", "cost", ...); with no prompt at all (a caller that passes
  none), any unit of measure;
- never a word of a closed grammatical class (``FUNCTION_WORDS``: conjunctions, prepositions, determiners,
  auxiliaries, adverbs of degree and doubt), a number word or a word that operates on the number
  (``NUMERAL_WORDS``: "dozen", "squared", "hundred", "times"), or an adverb in -ly — even when the prompt has it.

Units are dropped, not converted: ``12 cm`` states 12 whenever ``cm`` is accepted. Imports nothing of ours.

Run the examples: ``python -m pytest --doctest-modules rewards/units.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from functools import cached_property

MAX_PROMPT_CHARS = 20_000  # a longer prompt is read only up to here for its units

# Closed word classes: after a number they make a hedge, a comparison or a sentence, never a unit.
FUNCTION_WORDS = frozenset(
    "and or nor but yet so either neither else otherwise then also plus minus times versus vs und oder et ou "
    "to from than over under about around above below at by for of in on into onto with without within between "
    "among near beyond up down off out a an the this that these those it its some any each every all both few "
    "many much more most less least fewer other another such what which who is are was were be been being am "
    "do does did has have had may might can could will would shall should must not never no none maybe perhaps "
    "possibly probably approximately approx about circa ca exactly just only likely unlikely surely "
    "certainly definitely clearly apparently presumably somewhat very quite rather too ever still even already "
    "yes greater smaller larger bigger higher lower if unless except whether though although because since while "
    "etc ish odd something almost".split()
)
NUMBER_WORDS = frozenset(
    "zero one two three four five six seven eight nine ten eleven twelve thirteen fourteen fifteen sixteen seventeen "
    "eighteen nineteen twenty thirty forty fifty sixty seventy eighty ninety hundred thousand million billion "
    "trillion half halves third thirds quarter quarters fourth fifth sixth".split()
)
# Words that change the number they follow: multipliers and powers.
NUMERAL_WORDS = frozenset(
    "dozen dozens score scores gross hundreds thousands millions billions lakh crore squared cubed square cube "
    "th st nd rd fold times thou percentile".split()
)

# dimension -> spellings of its units (lower case; plurals are read by ``_stem``)
UNITS: dict[str, frozenset[str]] = {
    "length": frozenset(
        "m meter metre cm centimeter centimetre mm millimeter millimetre km kilometer kilometre dm decimeter "
        "decimetre um micrometer micrometre micron nm nanometer nanometre in inch inches ft foot feet yd yard mi "
        "mile nmi league".split()
    ),
    "area": frozenset("acre acres hectare hectares ha".split()),
    "volume": frozenset(
        "l liter litre ml milliliter millilitre cl centiliter centilitre dl gallon gal quart qt pint pt cc "
        "floz".split()
    ),
    "mass": frozenset(
        "g gram gramme kg kilogram kilogramme mg milligram lb lbs pound ounce oz ton tonne stone ct carat".split()
    ),
    "time": frozenset(
        "s sec secs second ms millisecond min mins minute h hr hrs hour day week month year yr yrs decade century "
        "fortnight".split()
    ),
    "speed": frozenset("mph kph kmh knot knots".split()),
    "currency": frozenset(
        "dollar cent euro yen rupee rupees usd eur gbp buck bucks penny pennies pence quid franc peso yuan "
        "baht".split()
    ),
    "angle": frozenset("degree deg rad radian arcminute arcsecond".split()),
    "temperature": frozenset("celsius fahrenheit kelvin".split()),
    "data": frozenset("bit byte kb mb gb tb kib mib gib".split()),
    "energy": frozenset("j joule kj cal calorie kcal kwh wh ev".split()),
    "power": frozenset("w watt kw mw hp horsepower".split()),
    "force": frozenset("n newton".split()),
    "pressure": frozenset("pa pascal kpa atm bar psi".split()),
    "frequency": frozenset("hz hertz khz mhz ghz rpm".split()),
    "electric": frozenset("v volt a amp ampere ohm".split()),
    "generic": frozenset("unit units".split()),  # "square units": never changes the number
}
# Words that name a dimension without naming a unit ("How long is ...", "How much does it cost?").
DIMENSION_WORDS: dict[str, frozenset[str]] = {
    "length": frozenset(
        "length long tall wide width height high distance far perimeter circumference radius diameter side sides "
        "deep depth thick".split()
    ),
    "area": frozenset("area surface".split()),
    "volume": frozenset("volume capacity".split()),
    "mass": frozenset("weight weigh weighs heavy mass".split()),
    "time": frozenset("time long duration take takes took age old".split()),
    "speed": frozenset("speed fast velocity".split()),
    "currency": frozenset(
        "money cost costs price prices earn earns earned pay pays paid spend spends spent "
        "worth save saves saved charge charges budget profit wage wages salary $ € £ ¥".split()
    ),
    "angle": frozenset("angle angles degrees triangle arc rotation rotate rotates turn ° \\circ".split()),
    "temperature": frozenset("temperature hot cold warm warmer colder".split()),
    "data": frozenset("memory storage file download".split()),
}
# A squared or cubed unit of length is an area or a volume ("cm^2", "square metres").
_POWER_DIMENSION = {"2": "area", "3": "volume"}
_SPELLING_DIMENSION = {w: d for d, words in UNITS.items() for w in words}
# Single letters that are units only when marked up (\text{m}) or under a slash (km/h); alone they are variables.
LETTER_UNITS = frozenset("m g s h l t n w v a j".split())

_WORD = re.compile(r"[A-Za-z]+|\$(?=\s?\d)|€|£|¥|°|\\circ|\d+")
_ASKS = {("how", "many"), ("how", "much"), ("number", "of"), ("amount", "of")}


def _stem(word: str) -> str:
    """The singular of a plural, roughly: enough to match ``apple`` with ``apples``, ``box`` with ``boxes``."""
    w = word.lower().rstrip(".")
    if len(w) > 4 and w.endswith("ies"):
        return w[:-3] + "y"
    if len(w) > 3 and w.endswith(("ses", "xes", "zes", "ches", "shes")):
        return w[:-2]
    if len(w) > 2 and w.endswith("s") and not w.endswith("ss"):
        return w[:-1]
    return w


def dimension_of(word: str) -> str | None:
    """The dimension of a unit spelling (``cm`` -> length), or None for a word that is no unit of measure.

    >>> dimension_of("Metres"), dimension_of("apples"), dimension_of("km")
    ('length', None, 'length')
    """
    w = word.lower().rstrip(".")
    return _SPELLING_DIMENSION.get(w) or _SPELLING_DIMENSION.get(_stem(w))


def is_closed_class(word: str) -> bool:
    """A word that is never a unit: function words, number words, words operating on the number, -ly adverbs."""
    w = word.lower().rstrip(".")
    return w in FUNCTION_WORDS or w in NUMBER_WORDS or w in NUMERAL_WORDS or (w.endswith("ly") and len(w) > 3)


@dataclass(frozen=True)
class UnitContext:
    """What a unit after a number may be, from the gold answer and the prompt (None: no prompt was given)."""

    gold: str = ""
    prompt: str | None = None

    @cached_property
    def _words(self) -> tuple[list[str], list[str]]:
        prompt = (self.prompt or "")[:MAX_PROMPT_CHARS]
        return _WORD.findall(self.gold), _WORD.findall(prompt)

    @cached_property
    def counted(self) -> frozenset[str]:
        """Stems of the words the question counts or measures: every word of the gold, and the prompt's words right
        after a number or after "how many" / "how much" / "number of" (up to two, stopping at a closed-class word)."""
        gold, prompt = self._words
        out = {_stem(w) for w in gold if w.isalpha()}
        lower = [w.lower() for w in prompt]
        for i, w in enumerate(lower):
            starts = w.isdigit() or (i > 0 and (lower[i - 1], w) in _ASKS)
            if not starts:
                continue
            for nxt in lower[i + 1 : i + 3]:
                if not nxt.isalpha() or is_closed_class(nxt):
                    break
                out.add(_stem(nxt))
        return frozenset(out)

    @cached_property
    def dimensions(self) -> frozenset[str]:
        """The dimensions the gold or the prompt names, by a unit or a dimension word."""
        gold, prompt = self._words
        out = set()
        for w in gold + prompt:
            low = w.lower()
            if (d := dimension_of(low)) is not None and (len(low) > 1 or w in gold):
                out.add(d)
            out.update(d for d, words in DIMENSION_WORDS.items() if low in words or _stem(low) in words)
        if "length" in out:
            out.update(("area", "volume"))  # a square or cubic unit of a named length
        return frozenset(out)

    def accepts(self, word: str, marked: bool = False, power: str = "") -> bool:
        r"""Whether ``word`` may stand after a number as its unit here (module docstring). ``marked``: written in
        ``\text{..}`` or under a slash (a single letter is a unit only then, or when the question writes it after
        a number: ``2 m long``); ``power``: ``2``/``3`` for ``cm^2``.

        >>> ctx = UnitContext(gold="12", prompt="Tom has 5 red apples. How many apples does he have?")
        >>> [ctx.accepts(w) for w in ("apples", "apple", "red", "cm", "approximately", "dozen", "tops")]
        [True, True, True, False, False, False, False]
        >>> [UnitContext().accepts(w) for w in ("cm", "dollars", "apples", "squared")]
        [True, True, False, False]
        >>> UnitContext(prompt="How long is the rope?").accepts("m", marked=True)
        True
        """
        w = word.lower().rstrip(".")
        if not w.isalpha() or is_closed_class(w):
            return False
        if len(w) == 1 and not (w in LETTER_UNITS and (marked or w in self.counted)):
            return False  # a lone letter is a variable, unless marked up or the question uses it as a unit
        if _stem(w) in self.counted:
            return True
        dimension = dimension_of(w)
        if dimension is None:
            return False
        if self.prompt is None or dimension == "generic":
            return True
        if power in _POWER_DIMENSION and dimension == "length":
            dimension = _POWER_DIMENSION[power]
        return dimension in self.dimensions
