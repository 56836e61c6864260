r"""What "correct" means for each kind of gold answer, given a completion: one definition, shared by
``math_reward`` and ``exact_match_reward`` (and so by GRPO, preference grading and evaluation, which call them).

A verdict (``judge``) is read in three steps, each owned by one module:

1. **Where the candidates are** (``rewards.extract.answer_candidates``): every box in any spelling, every answer
   phrase ("The answer is X", "Final Answer: X", ``#### X``) and, for a lettered-choice gold, every choice on a
   line of its own, in the answer part (after the reasoning).
2. **What each candidate states** (``Reader.read``): the gold's kind (``rewards.grammar.answer_kind``) names the
   grammar that must read the WHOLE candidate as a value of that kind (``rewards.numbers`` for numbers,
   ``rewards.grammar`` for the others); anything left over means it states no value.
3. **The rule over candidates**: a box that states no value refuses (the completion boxed something that is not
   an answer); an answer phrase or choice line that states no value is prose and is skipped; every candidate
   left must equal the gold. So two distinct answers refuse, whichever spelling hides the second one.

``Reader.read`` compares one candidate, by the gold's kind: numbers exactly (a percent read one way per gold),
lists in order, sets in any order, intervals and tuples with their brackets in order, matrices entry by entry
whatever their environment, equations by variable name, inequalities in any spelling and direction, a choice by
its letter, text after normalising; expressions by math-verify (``expression_equal``, passed in by
``rewards.math``) once the expression grammar found nothing foreign. The gold's own text always matches.

Never raises, bounded: a candidate longer than ``MAX_ANSWER_CHARS`` is never read (a box that long refuses);
arithmetic errors on adversarial text score 0.

Names of ``rewards.extract``, ``rewards.numbers`` and ``rewards.grammar`` that callers used from here are
importable from here too. Run the examples: ``python -m pytest --doctest-modules rewards/answer.py``.
"""

from __future__ import annotations

import re
from collections.abc import Callable
from dataclasses import dataclass, field

from rewards.extract import (  # noqa: F401  (re-exported: reward modules and tests import them from here)
    MAX_ANSWER_CHARS,
    Candidate,
    all_boxed,
    answer_candidates,
    completion_text,
    final_answer,
    last_boxed,
    normalize_answer,
    prompt_text,
    strip_markdown,
    strip_think,
)
from rewards.grammar import (  # noqa: F401  (re-exported)
    KINDS,
    RELATIONS,
    answer_kind,
    choice_letter,
    expression_foreign,
    inequality_interval,
    outer_pair,
    read_choice,
    read_equations,
    read_intervals,
    read_matrix,
    relations,
    split_items,
    split_pm,
    strip_membership,
    symbols,
)
from rewards.latex import plain, split_top
from rewards.numbers import (  # noqa: F401  (Number, is_proportion, percent_divisor: re-exported)
    _VARIABLE,
    Number,
    _equal,
    gold_number,
    is_proportion,
    is_unit_tail,
    numbers_equal,
    parse_number,
    percent_divisor,
)
from rewards.units import UnitContext

ExpressionEqual = Callable[[str, str], "bool | None"]
Reading = tuple[bool, "bool | None"]  # (the candidate states a value of the gold's kind, it equals the gold)
NOT_A_VALUE: Reading = (False, False)


def same_text(pred: str, gold: str) -> bool:
    r"""Whether two answers read the same after normalising typography, ``$``/``\text{}``, case, spaces and a
    trailing period.

    >>> same_text("\\text{Yes}.", "yes"), same_text("−3", "-3"), same_text("~3", "3")
    (True, True, False)
    """
    return normalize_answer(pred) == normalize_answer(gold)


def _words(s: str) -> int:
    return len(normalize_answer(s).split())


_LEADING_NUMBER = re.compile(r"(?:\\\$\s*)?([-+]?(?:\d+(?:,\d{3})*(?:\.\d+)?|\.\d+)(?:\s*/\s*\d+)?)(?![\d.])")
_TRAILING_UNIT = re.compile(r"\s*\\text\{([^{}]*)\}(?:\s*\^\s*\{?[23]\}?)?\s*$")


def drop_marked_units(s: str, units: UnitContext | None = None) -> str:
    r"""Drop ``\text{..}`` units the context accepts at the end of an expression (``\sqrt{2}\text{ cm}``).

    >>> drop_marked_units("2\\sqrt{3} \\text{ cm}^2"), drop_marked_units("\\sqrt{2}\\text{ probably}")
    ('2\\sqrt{3}', '\\sqrt{2}\\text{probably}')
    """
    s = plain(s)
    units = units or UnitContext()
    while (m := _TRAILING_UNIT.search(s)) and m.start() > 0:
        words = m.group(1).replace("/", " ").split()
        if not words or not all(units.accepts(w, marked=True) for w in words):
            break
        s = s[: m.start()]
    return s.strip()


@dataclass
class Reader:
    """Reads candidates against one gold: its kind, the units the question allows, and the comparers."""

    gold: str
    prompt: str | None = None
    exact: bool = False
    expression_equal: ExpressionEqual | None = None
    kind: str = field(init=False)
    units: UnitContext = field(init=False)

    def __post_init__(self) -> None:
        self.kind = answer_kind(self.gold)
        self.units = UnitContext(gold=self.gold, prompt=self.prompt)

    # ------------------------------------------------------------------------------------------- one candidate

    def read(self, pred: str) -> Reading:
        """(states a value of the gold's kind, equals the gold; None when the gold cannot be judged)."""
        if len(pred) > MAX_ANSWER_CHARS:
            return NOT_A_VALUE
        try:
            return self._read(pred, self.gold, self.kind)
        except Exception:  # int() past 4,300 digits, or any text no grammar foresaw: not an answer, never a crash
            return NOT_A_VALUE

    def _read(self, pred: str, gold: str, kind: str) -> Reading:
        if same_text(pred, gold):  # the gold's own shape always counts ("3 and 4" for "3 and 4")
            return True, True
        if kind == "choice":
            letter = read_choice(pred, self.prompt)
            return letter is not None, letter == choice_letter(gold)
        if self.exact:
            return self._read_exact(pred, gold, kind)
        reader = getattr(self, "_" + kind)
        return reader(pred, gold)

    def contradicts(self, prose: str) -> bool:
        """Whether an answer phrase that states no value still begins with a number other than a number gold
        ("The answer is 4 apples, ..." beside ``\boxed{3}``): what a phrase begins with is what it answers."""
        if self.kind != "number" or (m := _LEADING_NUMBER.match(plain(prose))) is None:
            return False
        lead, gold = gold_number(m.group(1)), gold_number(self.gold)
        return lead is not None and gold is not None and not _equal(lead, gold)

    def item(self, pred: str, gold: str) -> bool:
        """Whether one entry (of a list, set, interval, tuple or matrix) equals its gold entry, by that entry's
        kind."""
        value, equal = self._read(pred, gold, answer_kind(gold))
        return value and bool(equal)

    def _read_exact(self, pred: str, gold: str, kind: str) -> Reading:
        value = _words(pred) <= max(_words(gold), 1)  # a longer phrase is a sentence, not an answer
        if kind in ("list", "set"):
            p, g = _items(pred, kind), _items(gold, kind)
            if kind == "list":
                return value, len(p) == len(g) and all(same_text(a, b) for a, b in zip(p, g))
            return value, _cover(p, g, same_text)
        return value, False  # same_text was the test

    # ------------------------------------------------------------------------------------------- by kind

    def _sides(self, pred: str) -> tuple[bool, str] | None:
        """An answer with ``=``: (True, its stated value) for ``x = v`` or a chain whose sides all equal its last
        side (checked symbolically); (False, "") for a chain that is false or cannot be checked; None without ``=``."""
        sides = split_top(plain(pred), ("=",))
        if len(sides) == 1:
            return None
        if not all(sides):
            return False, ""
        if _VARIABLE.fullmatch(sides[0].replace(" ", "")):
            sides = sides[1:]
        last = sides[-1]
        for side in sides[:-1]:
            if self.expression_equal is None or expression_foreign(side, last, self.units) is not None:
                return False, ""
            if not self.expression_equal(side, last):
                return False, ""
        return True, last

    def _number(self, pred: str, gold: str) -> Reading:
        g = gold_number(gold)
        units = self.units if gold == self.gold else UnitContext(gold=gold, prompt=self.prompt)
        p = parse_number(pred, units=units)
        pair = outer_pair(plain(pred)) if p is None else None
        if pair is not None and pair[0] + pair[2] == "()" and len(split_top(pair[1])) == 1:
            p = parse_number(pair[1], units=units)  # \left(\frac{1}{3}\right): the value in parentheses
        if p is None:
            sides = self._sides(pred)
            if sides is None or (p := parse_number(sides[1], units=units)) is None:
                return NOT_A_VALUE
            if not sides[0]:
                return True, False  # a false equation states no value
        return True, g is not None and _equal(p, g)

    def _text(self, pred: str, gold: str) -> Reading:
        return _words(pred) <= max(_words(gold), 1), False

    def _list(self, pred: str, gold: str) -> Reading:
        g = _items(gold, "list")
        if len(g) == 2 and (pm := split_pm(pred)) is not None:
            return True, _cover(list(pm), g, self.item)
        p = _items(pred, "list")
        if len(p) != len(g):
            return len(p) > 1, False
        readings = [self._read(a, b, answer_kind(b)) for a, b in zip(p, g)]
        return all(v for v, _ in readings), all(v and bool(e) for v, e in readings)

    def _set(self, pred: str, gold: str) -> Reading:
        t = strip_membership(plain(pred))
        g = _items(gold, "set")
        intervals = read_intervals(t)
        if intervals is not None and len(intervals) == 1 and not any(outer_pair(x) for x in g):
            return True, False  # an interval or a tuple is not a set (unless the set's entries are tuples)
        return True, _cover(_items(t, "set"), g, self.item)

    def _same_intervals(self, p: list[tuple[str, str, str, str]], g: list[tuple[str, str, str, str]]) -> bool:
        """Intervals in order, each with the same brackets and equal endpoints in order."""
        return len(p) == len(g) and all(
            a[0] == b[0] and a[3] == b[3] and self.item(a[1], b[1]) and self.item(a[2], b[2]) for a, b in zip(p, g)
        )

    def _interval(self, pred: str, gold: str) -> Reading:
        t = strip_membership(plain(pred))
        g = read_intervals(gold)
        p = read_intervals(t)
        if p is None and (one := inequality_interval(t)) is not None:
            p = [one[1]]  # 1 < x \leq 2 is (1, 2]
        if p is not None and g is not None:
            return True, self._same_intervals(p, g)
        if relations(t):
            return self._symbolic(t, gold, RELATIONS)
        return NOT_A_VALUE

    def _tuple(self, pred: str, gold: str) -> Reading:
        gp = outer_pair(plain(gold))
        if gp is None:
            return NOT_A_VALUE
        g = split_top(gp[1])
        equations = read_equations(pred)
        if equations is not None:
            p = [value for _, value in equations]
        else:
            pp = outer_pair(plain(pred))
            if pp is None or len(split_top(pp[1])) < 2:
                return NOT_A_VALUE
            if (pp[0], pp[2]) != (gp[0], gp[2]):
                return True, False  # other brackets: another object ((1, 2] is not (1, 2))
            p = split_top(pp[1])
        return True, len(p) == len(g) and all(self.item(a, b) for a, b in zip(p, g))

    def _matrix(self, pred: str, gold: str) -> Reading:
        p, g = read_matrix(pred), read_matrix(gold)
        if p is None or g is None:
            return NOT_A_VALUE
        same_shape = len(p) == len(g) and len(p[0]) == len(g[0])
        return True, same_shape and all(self.item(a, b) for pr, gr in zip(p, g) for a, b in zip(pr, gr))

    def _equation(self, pred: str, gold: str) -> Reading:
        g = read_equations(gold)
        if g is None:
            return NOT_A_VALUE
        p = read_equations(pred)
        if p is None:
            if "=" in plain(pred):
                return self._symbolic(pred, gold, frozenset({"="}))  # an equation of expressions, compared whole
            names = {name for name, _ in g}
            if len(names) != 1:
                return NOT_A_VALUE  # a bare value cannot say which variable it is
            p = [(g[0][0], item) for item in _items(pred, "set")]
        stated = []
        for name, value in p:
            sides = self._sides(f"{name} = {value}")
            if sides is None or not sides[0]:
                return True, False  # a false chain (y = 7 = 2x+1) states nothing true
            stated.append((name, sides[1]))
        by_name: dict[str, list[str]] = {}
        for name, value in stated:
            by_name.setdefault(name, []).append(value)
        gold_by_name: dict[str, list[str]] = {}
        for name, value in g:
            gold_by_name.setdefault(name, []).append(value)
        if set(by_name) != set(gold_by_name):
            return True, False  # variables are matched by name
        return True, all(_cover(by_name[n], gold_by_name[n], self.item) for n in gold_by_name)

    def _inequality(self, pred: str, gold: str) -> Reading:
        t = strip_membership(plain(pred))
        g = inequality_interval(gold)
        p = inequality_interval(t)
        if g is not None and p is not None:  # one variable: the same variable, the same interval
            return True, p[0] == g[0] and self._same_intervals([p[1]], [g[1]])
        intervals = read_intervals(t)
        if g is not None and intervals is not None:
            return True, self._same_intervals(intervals, [g[1]])
        if not relations(t):
            return NOT_A_VALUE
        return self._symbolic(t, gold, RELATIONS)

    def _expression(self, pred: str, gold: str) -> Reading:
        value = plain(pred)
        if "=" not in plain(gold):
            sides = self._sides(value)
            if sides is not None:
                if not sides[0]:
                    return True, False  # a false equation (1 + 1 = \sqrt{2}) states nothing
                value = sides[1]
        value = drop_marked_units(value, self.units)
        if symbols(gold) and parse_number(value) is not None:
            return True, False  # "2" for "2x": a number is not an expression in a variable
        return self._symbolic(value, gold, frozenset({"="}) if "=" in plain(gold) else frozenset())

    def _symbolic(self, pred: str, gold: str, allow: frozenset[str]) -> Reading:
        """math-verify's verdict on a prediction the expression grammar accepts next to the gold."""
        if expression_foreign(pred, gold, self.units, allow=allow) is not None:
            return NOT_A_VALUE
        if self.expression_equal is None:
            return True, None
        return True, self.expression_equal(plain(pred), plain(gold))


def _items(s: str, kind: str) -> list[str]:
    r"""The entries of a list (``[..]`` or ``(..)`` around it allowed) or a set (``\{..\}`` or bare, commas, "and",
    "or"; ``a \pm b`` is two entries; ``\emptyset`` none)."""
    t = plain(s)
    if kind == "set":
        t = strip_membership(t)
        if t in ("\\emptyset", "\\{\\}"):
            return []
        pm = split_pm(t)
        if pm is not None:
            return list(pm)
        pair = outer_pair(t)
        inner = pair[1] if pair is not None and pair[0] == "\\{" else t
        return [x for x in split_items(inner, words=True) if x] if inner else []
    pair = outer_pair(t)
    if pair is not None and pair[0] + pair[2] in ("()", "[]") and len(split_top(pair[1])) > 1:
        t = pair[1]
    return split_top(t)


def _cover(p: list[str], g: list[str], equal: Callable[[str, str], bool]) -> bool:
    """Set equality: every predicted entry equals some gold entry and every gold entry some predicted one."""
    if not p or not g:
        return not p and not g
    return all(any(equal(a, b) for b in g) for a in p) and all(any(equal(a, b) for a in p) for b in g)


def answer_matches(
    pred: str,
    gold: str,
    exact: bool = False,
    expression_equal: ExpressionEqual | None = None,
    prompt: str | None = None,
) -> bool | None:
    r"""Whether one final answer ``pred`` states the gold answer, by the gold's kind; None when the gold cannot be
    judged (an expression and no ``expression_equal``, or one it cannot parse). ``exact`` compares as text
    (``exact_match_reward``). Never raises.

    >>> answer_matches("7, 3, 9", "3, 3, 7, 9"), answer_matches("3, 3, 7, 9", "3, 3, 7, 9")
    (False, True)
    >>> answer_matches("\\{3, 2\\}", "\\{2, 3\\}"), answer_matches("3 not four", "3"), answer_matches("3 + 4", "7")
    (True, False, False)
    >>> answer_matches("3 and 4", "3 and 4"), answer_matches("x = 3", "3"), answer_matches("(B)", "B")
    (True, True, True)
    """
    value, equal = Reader(gold, prompt, exact, expression_equal).read(pred)
    return equal if value else False


def judge(
    text: str,
    gold: str,
    *,
    prompt: str | None = None,
    exact: bool = False,
    expression_equal: ExpressionEqual | None = None,
    need_box: bool = False,
) -> bool | None:
    r"""The verdict on a whole completion (module docstring): True when every candidate of its answer part states
    the gold, False when none does, one states something else, a box states no value, or every answer phrase is
    prose; None when the gold cannot be judged or there is no candidate at all (the caller decides:
    ``math_reward`` may read the last number).
    ``need_box``: an answer phrase alone is not enough (``exact_match_reward``).

    >>> judge("So \\boxed{4}. The answer is 4.", "4"), judge("\\boxed{4}. The answer is 5.", "4")
    (True, False)
    >>> judge("\\boxed{4} \\fbox{5}", "4"), judge("Final Answer: The final answer is $4$. I hope it is correct.", "4")
    (False, True)
    >>> judge("The answer is 4 because 2 + 2 = 4, so \\boxed{4}", "4"), judge("no answer", "4") is None
    (True, True)
    """
    reader = Reader(gold, prompt, exact, expression_equal)
    found = answer_candidates(strip_think(text), choices=reader.kind == "choice")
    if found is None:
        return False
    verdicts, boxed = [], False
    for candidate in found:
        if candidate.text is None:
            if candidate.source == "box":
                return False
            continue
        value, equal = reader.read(candidate.text)
        if candidate.source == "box":
            boxed = True
            if not value:
                return False  # \boxed{3 or 4}: the completion boxed something that is no answer
        elif not value:
            if reader.contradicts(candidate.text):
                return False  # "The answer is 4 apples." beside \boxed{3}
            continue  # "the answer is 4 because ...": prose after an answer phrase
        verdicts.append(equal)
    if not verdicts:
        return False if found else None  # only prose after answer phrases: stated, but not as a value
    if need_box and not boxed:
        return False
    if any(v is False for v in verdicts):
        return False
    return None if any(v is None for v in verdicts) else True
