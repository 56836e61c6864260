r"""What an answer of each kind may look like: the gold's kind, and the grammar that reads a prediction as a value
of that kind. Whatever a grammar does not read refuses; ``rewards.answer`` compares what it reads.

Kinds of gold (``answer_kind``), tried in this order:

=============  ===========================================  ====================================================
kind           gold                                         a prediction may be
=============  ===========================================  ====================================================
choice         ``B``, ``(B)``                               ``B``, ``(B)``, ``B)``, ``\text{(B)}``, ``Option B``,
                                                            ``(B) 42`` when ``42`` is that option's text in the
                                                            prompt (``read_choice``)
equation       ``y = 2x+1``, ``x = 1, y = 2``, ``y = 3``    equations matched by variable name, in any order;
                                                            a chain only when every side is equal; a bare value
                                                            for a one-variable gold; ``(x, y) = (1, 2)``;
                                                            ``x \in \{1, 2\}`` (``read_equations``)
number         ``42``, ``3/4``, ``50\%``, ``12 \text{cm}``  ``rewards.numbers.parse_number``; ``x = 42``
matrix         ``\begin{pmatrix}..\end{pmatrix}``           a matrix in any matrix environment (or ``array``),
                                                            entry by entry (``read_matrix``)
inequality     ``x \leq 5``, ``-1 < x < 2``                 an inequality in any spelling or direction, or an
                                                            interval (``relations``)
set            ``\{1, 2\}``, ``\emptyset``                  a set, a bare list (commas, "and", "or"),
                                                            ``x \in \{..\}``, ``a \pm b``, in any order
interval       ``(1, 2]``, ``[0, \infty)``, ``A \cup B``    intervals with the same brackets, endpoints in order;
                                                            ``x \in (1, 2]``; an inequality (``read_intervals``)
tuple          ``(1, 2)``, ``[1, 2, 3]``                    the same brackets, entries in order;
                                                            ``(x, y) = (1, 2)``
list           ``3, 3, 7, 9``, ``(1, 2), (3, 4)``           entries in order, each by its gold entry's kind;
                                                            ``[..]`` around it; ``a \pm b`` for two entries
text           ``Paris``, ``yes``                           the same words (case, spaces, ``\text{}``, a final
                                                            period aside)
expression     ``\sqrt{2}``, ``2x``                         ``expression_foreign`` finds nothing foreign, then
                                                            math-verify decides
=============  ===========================================  ====================================================

The expression allow-list (``expression_foreign``): numbers, single-letter symbols, products of the gold's
letters (``yx`` for ``xy``), function names (``MATH_WORDS``), ``MATH_COMMANDS`` (``\frac``, ``\sqrt``, Greek
letters, ``\pi``, ``\infty``, ``\cdot``, accents, ``\mathbb``, set operators ...), operators and brackets, and
anything else only when the gold itself has it (a relation, ``\pm``, ``\ldots``, a word, a command); ``\text{..}``
only for the gold's words or accepted units. Typography is made plain first (``rewards.latex.plain``), so
``\displaystyle``, ``\cfrac``, ``\textnormal``, ``\left(`` and spacing never count.

Run the examples: ``python -m pytest --doctest-modules rewards/grammar.py``.
"""

from __future__ import annotations

import re

from rewards.latex import plain, split_top, tokens
from rewards.numbers import _VARIABLE, gold_number
from rewards.units import UnitContext

KINDS = (
    "choice", "equation", "number", "matrix", "inequality", "set", "interval", "tuple", "list", "text", "expression",
)  # fmt: skip

MATH_WORDS = frozenset(
    "sin cos tan sec csc cot arcsin arccos arctan sinh cosh tanh coth log ln lg exp lim sup inf max min gcd lcm "
    "det mod deg dim ker arg sgn tr".split()
)
_GREEK = (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa lambda mu nu xi omicron pi varpi "
    "rho varrho sigma varsigma tau upsilon phi varphi chi psi omega Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi "
    "Psi Omega"
)
MATH_COMMANDS = frozenset(
    (
        "\\" + c
        for c in (
            "frac sqrt sin cos tan sec csc cot arcsin arccos arctan sinh cosh tanh coth log ln lg exp det gcd lcm max "
            "min mod bmod pmod deg infty cdot times div circ prime overline bar hat vec dot ddot tilde widetilde "
            "widehat mathbb mathcal mathfrak cup cap setminus emptyset lfloor rfloor lceil rceil lvert rvert vert "
            "lVert rVert langle rangle text ell hbar partial nabla angle degree Re Im ast " + _GREEK
        ).split()
    ),
) | frozenset({"\\{", "\\}", "\\|"})
RELATIONS = frozenset({"<", ">", "\\leq", "\\geq"})
_OPERATORS = frozenset("+-*/^_()[]{}|,!'.")
_SET_OPEN, _SET_CLOSE = "\\{", "\\}"
_MATRIX = re.compile(r"\\begin\s*\{\s*([A-Za-z]*matrix\*?|array)\s*\}")
_ENV_ARGS = re.compile(r"\s*(?:\[[^\]]*\])?\s*(?:\{[^{}]*\})?")
_IN = re.compile(r"^\s*(?:" + _VARIABLE.pattern + r")\s*\\in(?![A-Za-z])\s*")
_TUPLE_OF_VARIABLES = re.compile(r"^\(\s*(" + _VARIABLE.pattern + r"(?:\s*,\s*" + _VARIABLE.pattern + r")+)\s*\)$")
_CHOICE = re.compile(
    r"^(?:(?:option|choice|answer)\s*:?\s*)?(?:\(\s*(?P<p>[A-Ja-j])\s*\)|(?P<b>[A-Ja-j])\s*[).:]?)"
    r"(?:\s+(?P<rest>.+))?$",
    re.IGNORECASE,
)
_TEXT_GROUP = re.compile(r"\\text\{([^{}]*)\}")
_AND_OR = re.compile(r"\s*(?:\\text\{\s*(?:and|or)\s*\}|(?<![A-Za-z])(?:and|or)(?![A-Za-z]))\s*")


# ----------------------------------------------------------------------------------------------- shapes


def unwrap_text(s: str) -> str:
    r"""``\text{..}`` groups replaced by their content.

    >>> unwrap_text("\\text{(B)} and \\text{yes}")
    '(B) and yes'
    """
    return _TEXT_GROUP.sub(lambda m: m.group(1), s)


def outer_pair(s: str) -> tuple[str, str, str] | None:
    r"""(opening, inside, closing) when ``s`` is one bracketed group from end to end: ``(..)``, ``[..]``, ``(..]``,
    ``[..)`` or ``\{..\}``; None otherwise (``(1)+(2)`` is two groups).

    >>> outer_pair("(1, 2]"), outer_pair("\\{1, 2\\}"), outer_pair("(1)+(2)")
    (('(', '1, 2', ']'), ('\\{', '1, 2', '\\}'), None)
    """
    s = s.strip()
    if s.startswith(_SET_OPEN) and s.endswith(_SET_CLOSE) and len(s) >= 4:
        opening, closing, inner = _SET_OPEN, _SET_CLOSE, s[2:-2]
    elif len(s) >= 2 and s[0] in "([" and s[-1] in ")]":
        opening, closing, inner = s[0], s[-1], s[1:-1]
    else:
        return None
    depth, i = 0, 0
    while i < len(inner):  # the opening must close only at the very end
        ch = inner[i]
        if ch == "\\" and i + 1 < len(inner):
            if inner[i + 1] in "{}":
                depth += 1 if inner[i + 1] == "{" else -1
            i += 2
            if depth < 0:
                return None
            continue
        depth += (ch in "([{") - (ch in ")]}")
        if depth < 0:
            return None
        i += 1
    return (opening, inner.strip(), closing) if depth == 0 else None


def split_items(s: str, words: bool = False) -> list[str]:
    r"""The items of a list: split on top-level commas (with ``words``, also on "and" / "or").

    >>> split_items("1, 2 \\text{ or } 3", words=True), split_items("(1, 2), (3, 4)")
    (['1', '2', '3'], ['(1, 2)', '(3, 4)'])
    """
    if words:
        s = _AND_OR.sub(",", s)
    return split_top(s)


def split_pm(s: str) -> tuple[str, str] | None:
    r"""The two values of an answer with one top-level ``\pm`` (or ``\mp``): ``a \pm b`` is the set {a+b, a-b}.

    >>> split_pm("1 \\pm \\sqrt{2}"), split_pm("3")
    (('1 + \\sqrt{2}', '1 - \\sqrt{2}'), None)
    """
    t = plain(s)
    count = len(re.findall(r"\\(?:pm|mp)(?![A-Za-z])", t))
    if count != 1:
        return None
    plus = re.sub(r"\\(?:pm|mp)(?![A-Za-z])", "+", t)
    minus = re.sub(r"\\(?:pm|mp)(?![A-Za-z])", "-", t)
    return plus.replace("+ ", "+ ").strip(), minus.strip()


def strip_membership(s: str) -> str:
    r"""``x \in S`` states ``S``.

    >>> strip_membership("x \\in \\{1, 2\\}")
    '\\{1, 2\\}'
    """
    return _IN.sub("", s, count=1)


def read_matrix(s: str) -> list[list[str]] | None:
    r"""The entries of a matrix, rows of cells, whatever its environment (``pmatrix``, ``bmatrix``, ``matrix``,
    ``array{cc}`` ...); None when ``s`` is not one matrix.

    >>> read_matrix("\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}"), read_matrix("(1, 2)")
    ([['1', '2'], ['3', '4']], None)
    """
    t = plain(s).strip()
    t = re.sub(r"^[(\[]\s*(\\begin)", r"\1", t)  # \left( \begin{array}..\end{array} \right)
    t = re.sub(r"(\\end\s*\{[^{}]*\})\s*[)\]]$", r"\1", t)
    m = _MATRIX.match(t)
    if m is None:
        return None
    env = m.group(1)
    end = f"\\end{{{env}}}"
    body_start = _ENV_ARGS.match(t, m.end()).end() if env == "array" else m.end()
    if not t.endswith(end) or t.count("\\begin") != 1:
        return None
    body = t[body_start : len(t) - len(end)].strip()
    rows = [r.strip() for r in body.split("\\\\")]
    while rows and not rows[-1]:
        rows.pop()
    cells = [[c.strip() for c in r.split("&")] for r in rows]
    if not cells or any(not c for row in cells for c in row) or len({len(r) for r in cells}) != 1:
        return None
    return cells


def is_interval(opening: str, left: str, right: str, closing: str) -> bool:
    """A bracketed pair is an interval (not a tuple) when its brackets are mixed or square, or an endpoint is
    infinite; ``(1, 2)`` reads as a tuple (compared the same way: brackets and entries in order)."""
    return opening != "(" or closing != ")" or "\\infty" in left + right


def read_intervals(s: str) -> list[tuple[str, str, str, str]] | None:
    r"""(opening, left, right, closing) of each interval of a union (``\cup``), in order; None when ``s`` is not
    intervals (a set is not an interval).

    >>> read_intervals("(-\\infty, 1) \\cup [2, 3]"), read_intervals("\\{1, 2\\}")
    ([('(', '-\\infty', '1', ')'), ('[', '2', '3', ']')], None)
    """
    t = plain(strip_membership(plain(s)))
    t = re.sub(r"\\mathbb\s*\{\s*R\s*\}", r"(-\\infty, \\infty)", t)  # the real line
    pieces = [p.strip() for p in re.split(r"\\cup(?![A-Za-z])", t)]
    out = []
    for piece in pieces:
        pair = outer_pair(piece)
        if pair is None or pair[0] == _SET_OPEN:
            return None
        items = split_top(pair[1])
        if len(items) != 2 or not all(items):
            return None
        out.append((pair[0], items[0], items[1], pair[2]))
    return out


_FLIP = {"<": ">", ">": "<", "\\leq": "\\geq", "\\geq": "\\leq"}
_CLOSED = {"<": False, ">": False, "\\leq": True, "\\geq": True}


def inequality_interval(s: str) -> tuple[str, tuple[str, str, str, str]] | None:
    r"""(variable, interval) of an inequality in one variable: ``x \leq 5`` is ``x`` in ``(-\infty, 5]``, read in
    any direction (``5 \geq x``, ``2 > x > -1``); None for anything else (two variables, mixed directions).

    >>> inequality_interval("5 \\geq x"), inequality_interval("2 > x > -1")
    (('x', ('(', '-\\infty', '5', ']')), ('x', ('(', '-1', '2', ')')))
    """
    toks = re.split(r"(<|>|\\leq(?![A-Za-z])|\\geq(?![A-Za-z]))", plain(s))
    sides, ops = [t.strip() for t in toks[0::2]], toks[1::2]
    if not ops or len(ops) > 2 or not all(sides):
        return None
    if ops[0] in (">", "\\geq"):  # read left to right as "less than"
        sides, ops = sides[::-1], [_FLIP[o] for o in ops[::-1]]
    if any(o not in ("<", "\\leq") for o in ops):
        return None
    names = [i for i, side in enumerate(sides) if _VARIABLE.fullmatch(side.replace(" ", ""))]
    if len(ops) == 2:
        if names != [1] and 1 not in names:
            return None
        low, high = (sides[0], _CLOSED[ops[0]]), (sides[2], _CLOSED[ops[1]])
        var = sides[1]
    elif 0 in names:
        var, low, high = sides[0], ("-\\infty", False), (sides[1], _CLOSED[ops[0]])
    elif 1 in names:
        var, low, high = sides[1], (sides[0], _CLOSED[ops[0]]), ("\\infty", False)
    else:
        return None
    interval = ("[" if low[1] else "(", low[0], high[0], "]" if high[1] else ")")
    return var.replace(" ", ""), interval


def relations(s: str) -> list[str]:
    r"""The order relations of ``s``, in order, spelt one way (``\geq`` = ``>=`` = ``≥``; ``\lt`` = ``<``).

    >>> relations("5 \\ge x"), relations("-1 \\lt x <= 2"), relations("x = 3")
    (['\\geq'], ['<', '\\leq'], [])
    """
    return [t for t in tokens(plain(s)) if t in RELATIONS]


# ----------------------------------------------------------------------------------------------- kinds


def answer_kind(gold: str) -> str:
    r"""The kind of a gold answer (module docstring).

    >>> [answer_kind(g) for g in ("42", "1,000", "3, 3, 7, 9", "\\{2, 3\\}", "Paris", "\\sqrt{2}", "(1, 2]", "2x")]
    ['number', 'number', 'list', 'set', 'text', 'expression', 'interval', 'expression']
    >>> [answer_kind(g) for g in ("(B)", "y = 2x + 1", "x \\leq 5", "(1, 2)", "\\begin{pmatrix}1\\\\2\\end{pmatrix}")]
    ['choice', 'equation', 'inequality', 'tuple', 'matrix']
    """
    s = plain(gold)
    if choice_letter(gold) is not None:
        return "choice"
    if read_equations(s) is not None:  # before numbers: "y = 3" names its variable
        return "equation"
    if gold_number(gold) is not None:
        return "number"
    if read_matrix(s) is not None:
        return "matrix"
    if relations(s):
        return "inequality"
    pair = outer_pair(s)
    if s == "\\emptyset" or (pair is not None and pair[0] == _SET_OPEN):
        return "set"
    intervals = read_intervals(s)
    if intervals is not None and (len(intervals) > 1 or is_interval(*intervals[0])):
        return "interval"
    if pair is not None and len(split_top(pair[1])) >= 2:
        return "tuple"
    if len(split_top(s)) > 1:
        return "list"
    if re.fullmatch(r"[A-Za-z][A-Za-z '\-]*", unwrap_text(s)):
        return "text"
    return "expression"


def choice_letter(gold: str) -> str | None:
    r"""The letter of a gold that is a lettered choice (``B``, ``(B)``, ``\text{(B)}``), else None.

    >>> choice_letter("(C)"), choice_letter("\\textbf{B}"), choice_letter("x"), choice_letter("BC")
    ('C', 'B', None, None)
    """
    m = re.fullmatch(r"\(?\s*([A-J])\s*\)?", unwrap_text(plain(gold)).strip())
    return m.group(1) if m else None


def _squash(s: str) -> str:
    return " ".join(unwrap_text(plain(s)).lower().split())


_OPTION_LABEL = re.compile(r"(?:^|(?<=[\s(]))\(?([A-J])[).:](?=\s)|\(([A-J])\)", re.MULTILINE)


def option_text(prompt: str, letter: str) -> str | None:
    r"""The text of option ``letter`` in a prompt that lists options (``(A) 40 (B) 42``, ``A. 40\nB. 42``): from
    its label to the next label or the end of its line; None when the prompt has no such option.

    >>> option_text("Pick one: (A) 40 (B) 42 (C) 44", "B"), option_text("A) red\nB) blue", "B")
    ('42', 'blue')
    """
    labels = [(m.group(1) or m.group(2), m.start(), m.end()) for m in _OPTION_LABEL.finditer(prompt[:20_000])]
    for k, (found, _, end) in enumerate(labels):
        if found == letter:
            stop = labels[k + 1][1] if k + 1 < len(labels) else len(prompt)
            line_end = prompt.find("\n", end, stop)
            return prompt[end : line_end if line_end >= 0 else stop].strip()
    return None


def read_choice(pred: str, prompt: str | None) -> str | None:
    r"""The letter a prediction chooses: ``B``, ``(B)``, ``B)``, ``B.``, ``\text{(B)}``, ``Option B``; a text after
    the letter only when it is that option's own text in the prompt. Upper-cased; None otherwise.

    >>> options = "(A) 40 (B) 42"
    >>> read_choice("\\text{(b)}", None), read_choice("(B) 42", options), read_choice("(B) 40", options)
    ('B', 'B', None)
    """
    s = unwrap_text(plain(pred)).strip().strip("*_").strip()
    m = _CHOICE.match(s)
    if m is None:
        return None
    letter = (m.group("p") or m.group("b")).upper()
    rest = m.group("rest")
    if rest is not None:
        own = option_text(prompt, letter) if prompt is not None else None
        if own is None or _squash(rest).strip(" .*_") != _squash(own).strip(" .*_"):
            return None
    return letter


# ----------------------------------------------------------------------------------------------- equations


def _variable_name(s: str) -> str | None:
    """The name of a variable as written (``x``, ``a_{n}``, ``\\theta``, ``f(2)``), spaces removed; None if not one."""
    t = plain(s).replace(" ", "")
    return t if _VARIABLE.fullmatch(t) else None


def read_equations(s: str) -> list[tuple[str, str]] | None:
    r"""(variable, side) for each equation of ``s`` when it is one or more equations whose other side has no
    ``=``: ``x = 1, y = 2`` (also ``;``, "and", ``\quad``, ``\\``), ``(x, y) = (1, 2)``, ``2x + 1 = y``;
    ``x \in \{1, 2\}`` gives ``x`` twice. A chain ``y = 7 = 2x+1`` gives (``y``, ``7 = 2x+1``): its sides are
    checked by the comparer. None when ``s`` is not equations of variables (``x^2 + y^2 = 1`` is an expression
    equation, compared whole).

    >>> read_equations("y = 1, x = 2"), read_equations("(x, y) = (1, 2)"), read_equations("x^2 + y^2 = 1")
    ([('y', '1'), ('x', '2')], [('x', '1'), ('y', '2')], None)
    >>> read_equations("x \\in \\{1, 2\\}"), read_equations("5"), read_equations("x \\leq 5")
    ([('x', '1'), ('x', '2')], None, None)
    """
    t = plain(re.sub(r"\\q?quad(?![A-Za-z])|\\\\|;", ",", s))
    if "=" not in t and "\\in" not in t:
        return None
    t = _AND_OR.sub(",", t)
    out: list[tuple[str, str]] = []
    for part in split_top(t):
        if not part:
            return None
        membership = _IN.match(part)
        if membership is not None:
            name = _variable_name(part[: membership.end()].replace("\\in", ""))
            pair = outer_pair(part[membership.end() :])
            if name is None or pair is None or pair[0] != _SET_OPEN:
                return None
            out += [(name, item) for item in split_top(pair[1])]
            continue
        sides = [x.strip() for x in split_top(part, ("=",))]
        if len(sides) < 2 or not all(sides):
            return None
        lhs = sides[0]
        if (m := _TUPLE_OF_VARIABLES.match(lhs)) is not None and len(sides) == 2:
            names = [_variable_name(v) for v in split_top(m.group(1))]
            pair = outer_pair(sides[1])
            values = split_top(pair[1]) if pair is not None and pair[0] == "(" else []
            if None in names or len(values) != len(names):
                return None
            out += list(zip(names, values))  # type: ignore[arg-type]
            continue
        name = _variable_name(lhs)
        if name is None and len(sides) == 2 and (flipped := _variable_name(sides[1])) is not None:
            name, sides = flipped, [sides[1], lhs]  # 2x + 1 = y
        if name is None:
            return None
        out.append((name, " = ".join(sides[1:])))
    return out


# ----------------------------------------------------------------------------------------------- expressions


def _letters(s: str) -> set[str]:
    """The letters of ``s`` that are math symbols: outside commands and ``\\text{..}``."""
    out = set()
    for t in tokens(_TEXT_GROUP.sub(" ", plain(s))):
        if t[0].isalpha():
            out.update(t)
    return out


def symbols(s: str) -> set[str]:
    r"""The letters of ``s`` that are math symbols: outside commands (``\sqrt``) and ``\text{..}`` units.

    >>> sorted(symbols("2x + \\sqrt{y} \\text{ cm}")), symbols("\\frac{\\pi}{2}")
    (['x', 'y'], set())
    """
    return _letters(s)


def _gold_vocabulary(gold: str) -> tuple[set[str], set[str], set[str]]:
    """The gold's commands, its words (lower case, in ``\\text{}`` or not) and its symbol letters."""
    g = plain(gold)
    toks = tokens(g)
    commands = {t for t in toks if t.startswith("\\")}
    words = {w.lower() for w in re.findall(r"[A-Za-z]+", unwrap_text(re.sub(r"\\[A-Za-z]+", " ", g)))}
    return commands, words, _letters(gold)


def expression_foreign(
    pred: str, gold: str, units: UnitContext | None = None, allow: frozenset[str] = frozenset()
) -> str | None:
    r"""The first token of ``pred`` that the expression grammar does not allow next to ``gold`` (module
    docstring), else None. ``allow``: tokens the caller's kind admits (relations for an inequality, ``=`` after a
    checked equation, ``&`` and ``\\`` in a matrix).

    >>> [expression_foreign(p, "\\sqrt{2}") for p in ("maybe \\sqrt{2}", "\\approx \\sqrt{2}", "\\sqrt{2}\\ldots")]
    ['maybe', '\\approx', '\\ldots']
    >>> [expression_foreign(p, "xy+1") for p in ("yx+1", "\\displaystyle \\cfrac{x}{1}y+1", "2\\sqrt{3}\\text{ cm}")]
    [None, None, None]
    """
    units = units or UnitContext(gold=gold)
    commands, words, letters = _gold_vocabulary(gold)
    g = plain(gold)
    t = plain(pred)
    for m in _TEXT_GROUP.finditer(t):
        for word in re.findall(r"[^\s/]+", m.group(1)):
            w = word.strip(".,").lower()
            if not (w in words or w in MATH_WORDS or (len(w) == 1 and w.isalpha()) or units.accepts(w, marked=True)):
                return word
    for tok in tokens(_TEXT_GROUP.sub(" ", t)):
        if tok.startswith("\\"):
            if tok in MATH_COMMANDS or tok in commands or tok in allow:
                continue
            return tok
        if tok[0].isdigit():
            continue
        if tok[0].isalpha():
            low = tok.lower()
            if len(tok) == 1 or low in MATH_WORDS or low in words or set(tok) <= letters:
                continue
            return tok
        if tok in _OPERATORS or tok in allow or (tok in g and tok not in "=<>"):
            continue
        return tok
    return None


__all__ = [
    "KINDS", "MATH_COMMANDS", "MATH_WORDS", "answer_kind", "choice_letter", "expression_foreign", "outer_pair",
    "read_choice", "read_equations", "read_intervals", "read_matrix", "relations", "split_items", "split_pm",
    "strip_membership", "symbols", "unwrap_text",
]  # fmt: skip
