r"""Typography of an answer span: the spellings of the same mathematics made one, before any grammar reads it.

Shared by the number grammar (``rewards.numbers``) and the per-kind grammars (``rewards.grammar``). What is made
plain is only what prints the same or means the same: Unicode minus and superscripts, ``×`` ``·`` ``÷``, thin and
non-breaking spaces (digit groups separated by them are one number: ``12 345``), LaTeX spacing, size and style
switches (``\left``, ``\big``, ``\displaystyle``), fraction variants (``\dfrac``, ``\tfrac``, ``\cfrac``), text
wrappers (``\textnormal``, ``\mathrm``, ``\mbox``, ... all become ``\text{..}``), relation spellings (``\ge``,
``\geqslant``, ``>=``, ``≥`` are ``\geq``; ``\lt`` is ``<``), brace spellings (``\lbrace``), ellipses (``...``,
``\cdots``, ``…`` are ``\ldots``), a box inside the answer (``\boxed{\boxed{3}}``), and the math delimiters
``$``, ``\(``, ``\[``. Nothing here decides whether an answer is acceptable: the grammars do.

Every function is a fixed number of linear passes (regular expressions without nested quantifiers, and one
brace scan); callers bound the span to ``rewards.extract.MAX_ANSWER_CHARS`` first. Imports nothing of ours.

Run the examples: ``python -m pytest --doctest-modules rewards/latex.py``.
"""

from __future__ import annotations

import re

THIN = "\u2009"  # every thin space (typographic or LaTeX) becomes this; between digit groups it is a separator

_MINUS = str.maketrans({"\u2212": "-", "\ufe63": "-", "\uff0d": "-", "\u2013": "-"})
_SUPERSCRIPT = str.maketrans("⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻", "0123456789+-")
_SUPERSCRIPTS = re.compile("[⁰¹²³⁴⁵⁶⁷⁸⁹⁺⁻]+")
_SPACES = re.compile(
    r"[\u00a0\u2007\u2009\u200a\u202f]|(?<!\\)\\[,;:> ]"
    r"|\\(?:thinspace|medspace|thickspace|enspace|quad|qquad)(?![A-Za-z])"
    r"|\\[hm]space\s*\{[^{}]*\}"
)
# A leading ~ means "about" (~3); anywhere else it is LaTeX's non-breaking space (12~\text{cm}).
_TILDE_ABOUT = re.compile(r"(?:^|(?<=[\s$({=]))~(?=\s*[-+.\d])")
_THOUSANDS = re.compile(rf"(?<![\d.,])(\d{{1,3}})((?:{THIN}\d{{3}})+)(?![\d])")

# Commands that only change size or style: they print the same mathematics.
_NO_MEANING = re.compile(
    r"\\(?:displaystyle|textstyle|scriptstyle|scriptscriptstyle|limits|nolimits|left|right|middle"
    r"|[bB]ig{1,2}[lrm]?|bigg[lrm]?|Bigg[lrm]?)(?![A-Za-z])\s*\.?"
)
# \left. and \right. print nothing; after \left/\right went, a lone "." before a closing delimiter is gone too.
_TEXT_WRAPPERS = (
    r"text|textnormal|textrm|textup|textmd|textbf|textit|textsf|texttt|textsl|emph|mbox|hbox|mathrm|mathnormal"
    r"|mathit|mathsf|mathtt|mathbf|boldsymbol|bm|operatorname|underline|uline"
)
_COLOUR = re.compile(r"\\(?:color|textcolor)\s*\{[^{}]*\}")  # \textcolor{red}{3}: the colour goes
_INKLESS_TEXT = re.compile(r"\\text\{([^{}A-Za-z]*)\}")  # \text{3}, \textbf{\%}: prints what it holds
_WRAPPER = re.compile(r"\\(?:" + _TEXT_WRAPPERS + r")\*?(?![A-Za-z])\s*(?=\{)")
_NESTED_TEXT = re.compile(r"\\text\{\s*\\text\{([^{}]*)\}\s*\}")
_FRAC = re.compile(r"\\[dtc]frac(?![A-Za-z])")
_BRACELESS_FRAC = re.compile(r"\\frac\s*(\d)\s*(\d)")  # \frac12
_BRACELESS_FRAC_ARG = re.compile(r"\\frac\s*(\d)\s*\{")  # \frac3{4}
_BRACELESS_SQRT = re.compile(r"\\sqrt\s*(\d+|[A-Za-z])(?![A-Za-z{])")  # \sqrt2
_RELATIONS = [
    (re.compile(r"\\(?:geqslant|geqq|ge|geq)(?![A-Za-z])|≥|⩾|>="), r"\\geq "),
    (re.compile(r"\\(?:leqslant|leqq|le|leq)(?![A-Za-z])|≤|⩽|<="), r"\\leq "),
    (re.compile(r"\\(?:neq|ne)(?![A-Za-z])|≠|!="), r"\\neq "),
    (re.compile(r"\\lt(?![A-Za-z])"), "<"),
    (re.compile(r"\\gt(?![A-Za-z])"), ">"),
    (re.compile(r"\\(?:lbrace)(?![A-Za-z])"), r"\\{"),
    (re.compile(r"\\(?:rbrace)(?![A-Za-z])"), r"\\}"),
    (re.compile(r"\\(?:dots|dotsc|dotsb|dotsm|cdots|hdots|ldots)(?![A-Za-z])|…|\.\.\.+"), r"\\ldots "),
    (re.compile(r"\\(?:dbinom|tbinom)(?![A-Za-z])"), r"\\binom"),
    (re.compile(r"∞"), r"\\infty "),
    (re.compile(r"π"), r"\\pi "),
    (re.compile(r"±"), r"\\pm "),
    (re.compile(r"∓"), r"\\mp "),
    (re.compile(r"√\s*(\d+|[A-Za-z])"), r"\\sqrt{\1}"),
    (re.compile(r"\\(?:varnothing)(?![A-Za-z])|∅"), r"\\emptyset "),
    (re.compile(r"∪"), r"\\cup "),
    (re.compile(r"∩"), r"\\cap "),
    (re.compile(r"∈"), r"\\in "),
    (re.compile(r"\\%"), "%"),
    (re.compile(r"\{,\}"), ","),
    (re.compile(r"\\!"), ""),
]
_DELIMITERS = re.compile(r"(?<!\\)\\[()\[\]]|\$")
_BOX = re.compile(r"\\(?:boxed|fbox|framebox)\*?\s*\{")


def group_end(s: str, open_at: int) -> int:
    """The index just past the brace group opening at ``open_at`` (``s[open_at] == "{"``), or -1 when unclosed.
    Escaped braces ``\\{`` ``\\}`` are not group braces."""
    depth, i, n = 0, open_at, len(s)
    while i < n:
        ch = s[i]
        if ch == "\\":
            i += 2
            continue
        if ch == "{":
            depth += 1
        elif ch == "}":
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    return -1


def _unwrap(s: str, pattern: re.Pattern, keep: str) -> str:
    """Replace every ``pattern`` + brace group by ``keep`` formatted with the group's content (``{}``); an unclosed
    group is left as it is. One left-to-right pass: the content is unwrapped again by the callers' loop."""
    out, i = [], 0
    while (m := pattern.search(s, i)) is not None:
        end = group_end(s, m.end() - 1)
        if end < 0:
            break
        out.append(s[i : m.start()])
        out.append(keep.format(s[m.end() : end - 1]))
        i = end
    out.append(s[i:])
    return "".join(out)


def typography(s: str) -> str:
    r"""Typographic forms of the same characters made plain: Unicode minus, superscript exponents,
    ``×``/``·``/``÷``, thin and non-breaking spaces and LaTeX spacing (digit groups separated by them are joined:
    ``12 345`` is 12345), and ``~`` read as "about" when it leads a number (``≈``).

    >>> typography("−1.2×10³"), typography("12\u202f345"), typography("~3"), typography("2,\\!000")
    ('-1.2 \\times 10^{3}', '12345', '≈3', '2,000')
    """
    s = s.translate(_MINUS).replace(",\\!", ",")  # 2,\!000: MATH's thousands comma
    s = _SUPERSCRIPTS.sub(lambda m: "^{" + m.group().translate(_SUPERSCRIPT) + "}", s)
    s = s.replace("×", " \\times ").replace("·", " \\cdot ").replace("⋅", " \\cdot ").replace("÷", " \\div ")
    s = _TILDE_ABOUT.sub("≈", s)
    s = _SPACES.sub(THIN, s.replace("~", THIN))
    s = _THOUSANDS.sub(lambda m: m.group(1) + m.group(2).replace(THIN, ""), s)
    return s.replace(THIN, " ").strip()


def plain(s: str) -> str:
    r"""An answer span in one spelling (module docstring): typography, delimiters, style switches, fraction and
    relation variants, text wrappers as ``\text{..}``, boxes inside the answer unwrapped, spaces collapsed, a
    trailing sentence period dropped.

    >>> plain("$\\displaystyle \\cfrac{1}{2}$."), plain("x \\ge 5"), plain("\\textnormal{(B)}")
    ('\\frac{1}{2}', 'x \\geq 5', '\\text{(B)}')
    >>> plain("\\left( 1, 2 \\right]"), plain("0.333..."), plain("\\boxed{\\mathrm{cm}}")
    ('( 1, 2 ]', '0.333\\ldots', '\\text{cm}')
    """
    s = typography(s)
    s = _DELIMITERS.sub(" ", s.replace("\\$", "\x00")).replace("\x00", "\\$")
    s = _NO_MEANING.sub(" ", s)
    s = _FRAC.sub(r"\\frac", s)
    s = _BRACELESS_FRAC.sub(r"\\frac{\1}{\2}", s)
    s = _BRACELESS_FRAC_ARG.sub(r"\\frac{\1}{", s)
    s = _BRACELESS_SQRT.sub(r"\\sqrt{\1}", s)
    for pattern, repl in _RELATIONS:
        s = pattern.sub(repl, s)
    for _ in range(4):  # nested boxes (\boxed{\boxed{3}}); each pass is linear
        before = s
        s = _unwrap(s, _BOX, " {} ")
        if s == before:
            break
    s = _WRAPPER.sub(r"\\text", _COLOUR.sub(" ", s))
    for _ in range(4):  # \text{\textbf{B}}
        s = _NESTED_TEXT.sub(r"\\text{\1}", s)
    s = _INKLESS_TEXT.sub(r" \1 ", s)
    s = re.sub(r"\\text\{\s*([^{}]*?)\s*\}", lambda m: "\\text{" + " ".join(m.group(1).split()) + "}", s)
    s = " ".join(s.split())
    s = s[:-1].rstrip() if s.endswith(".") and not s.endswith("\\.") else s
    for _ in range(4):  # {{3}}: a group around the whole answer prints what it holds
        if not (s.startswith("{") and group_end(s, 0) == len(s)):
            break
        s = s[1:-1].strip()
    return s


_TOKEN = re.compile(r"\\[A-Za-z]+|\\.|\d+(?:\.\d+)?|[A-Za-z]+|\s+|.", re.DOTALL)


def tokens(s: str) -> list[str]:
    r"""The tokens of a plain span: commands (``\frac``), escaped symbols (``\{``), numbers, letter runs, spaces
    and single characters.

    >>> tokens("2x+\\sqrt{y}")
    ['2', 'x', '+', '\\sqrt', '{', 'y', '}']
    """
    return [t for t in _TOKEN.findall(s) if not t.isspace()]


def split_top(s: str, seps: tuple[str, ...] = (",",)) -> list[str]:
    r"""Split on any of ``seps`` (single characters) outside brackets, braces and ``\{..\}``; parts stripped.

    >>> split_top("(1, 2), (3, 4)"), split_top("\\{1, 2\\}, 3"), split_top("a;b", (";",))
    (['(1, 2)', '(3, 4)'], ['\\{1, 2\\}', '3'], ['a', 'b'])
    """
    parts, depth, start, i, n = [], 0, 0, 0, len(s)
    while i < n:
        ch = s[i]
        if ch == "\\":
            if i + 1 < n and s[i + 1] in "{}":
                depth += 1 if s[i + 1] == "{" else -1
            i += 2
            continue
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif depth == 0 and ch in seps:
            parts.append(s[start:i].strip())
            start = i + 1
        i += 1
    parts.append(s[start:].strip())
    return parts


def balanced(s: str) -> bool:
    r"""Whether the braces of ``s`` pair up (escaped ``\{`` ``\}`` aside).

    >>> balanced("\\frac{1}{2}"), balanced("{1"), balanced("}{")
    (True, False, False)
    """
    depth, i, n = 0, 0, len(s)
    while i < n:
        if s[i] == "\\":
            i += 2
            continue
        depth += (s[i] == "{") - (s[i] == "}")
        if depth < 0:
            return False
        i += 1
    return depth == 0
