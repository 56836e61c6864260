r"""What prints: the one reading of "visible" that every reward shares.

It is its own module because two floors of rewards need it and neither may import the other: ``rewards.extract``
(``final_answer``, read by ``math_reward`` and ``exact_match_reward``) must skip a box that prints nothing exactly
as the format rewards (``rewards.format``, which import ``final_answer``) refuse one, and ``rewards.repetition``
compares loops by the same visible text. It imports nothing of ours.

Only what is visible counts (``visible_text``, ``has_visible``, ``reasoning_words``, ``box_is_visible``,
``box_holds_answer``):

- a character is dropped before anything is read when it is Default_Ignorable_Code_Point (Unicode
  DerivedCoreProperties: zero-width spaces and joiners, bidi controls, the soft hyphen, Hangul fillers, variation
  selectors, tag characters) or a format control (category Cf); the rest is read in NFKC form;
- a word is a run of letters, digits and combining marks holding at least one letter or digit that shows ink by
  itself: category L or N but not a modifier letter (Lm: the tatweel, IPA marks) and not an inkless character (the
  blank Braille cell U+2800, U+FFFC, U+1D159). A combining mark alone is no word. Han ideographs and Hiragana are
  a word each (as in Unicode's word boundaries, UAX #29), and so is each letter of Thai, Lao, Myanmar and Khmer
  (written without spaces), so unspaced reasoning is counted;
- a box is visible (``box_is_visible``, what ``final_answer`` skips) when, after LaTeX that prints nothing is removed
  (spacing commands, ``~``, ``\phantom`` and its kin with their argument, ``\hspace{..}``/``\kern``/``\rule``, colour
  and label arguments, style switches, ``\left.``, ``$``, comments, empty groups, and commands whose every argument is
  empty, such as ``\text{}``), it still holds a visible character: a command (``\pi``) or a letter, digit, symbol or
  bracket; sentence punctuation alone (``\boxed{.}``) is not;
- a box holds an answer (``box_holds_answer``, what the format rewards pay) when what is left holds a value, an
  allow-list: a digit, a math-mode letter, a text-mode word or single letter, a command that names a value, a
  relation, an operation or a function (``VALUE_COMMANDS``), a math symbol, an empty bracket pair or a sign alone.
  Placeholders print but hold none: ``?``, ``\ldots``, ``\cdots``, ``\text{N/A}``, ``\_``, ``\square``, ``\foo``.
  A box longer than ``MAX_BOX_CHARS`` is not read (neither).

Run the examples: ``python -m pytest --doctest-modules rewards/visible.py``.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

# ------------------------------------------------------------------------------------------ visible text

# Default_Ignorable_Code_Point (DerivedCoreProperties.txt, unchanged since Unicode 14): characters that render as
# nothing (tests/test_red_team_format.py checks the table against the `regex` package).
DEFAULT_IGNORABLE = (
    (0x00AD, 0x00AD), (0x034F, 0x034F), (0x061C, 0x061C), (0x115F, 0x1160), (0x17B4, 0x17B5), (0x180B, 0x180F),
    (0x200B, 0x200F), (0x202A, 0x202E), (0x2060, 0x206F), (0x3164, 0x3164), (0xFE00, 0xFE0F), (0xFEFF, 0xFEFF),
    (0xFFA0, 0xFFA0), (0xFFF0, 0xFFF8), (0x1BCA0, 0x1BCA3), (0x1D173, 0x1D17A), (0xE0000, 0xE0FFF),
)  # fmt: skip
# Printing characters without ink that are not default-ignorable: the blank Braille cell, the object replacement
# character, the null notehead (a font scan of every L/N/P/S glyph found no other blank one).
INKLESS = frozenset("\u2800\ufffc\U0001d159")


def is_ignorable(ch: str) -> bool:
    """True for a default-ignorable or format-control character: it is dropped before text is read."""
    cp = ord(ch)
    return unicodedata.category(ch) == "Cf" or any(lo <= cp <= hi for lo, hi in DEFAULT_IGNORABLE)


class _Table(dict):
    """A ``str.translate`` table filled on first sight of each character by ``rule(ch)``."""

    def __init__(self, rule: Any) -> None:
        super().__init__()
        self.rule = rule

    def __missing__(self, cp: int) -> Any:
        value = self[cp] = self.rule(chr(cp))
        return value


_DROP = _Table(lambda ch: None if is_ignorable(ch) else ord(ch))


# Scripts written without spaces between words (Line_Break=SA): Thai, Lao, Myanmar, Khmer. Like Han ideographs and
# Hiragana, each letter of theirs counts as a word (an upper bound: the true words need a dictionary).
_UNSPACED = ((0x0E00, 0x0EFF), (0x1000, 0x109F), (0x1780, 0x17FF))


def _kind(ch: str) -> str:
    """w: a letter or digit with ink, s: one that is a word by itself (Han, Hiragana, _UNSPACED), l: a modifier letter,
    m: a combining mark, p: a visible symbol or punctuation, space: nothing visible."""
    cat = unicodedata.category(ch)
    if ch in INKLESS or cat[0] not in "LNMPS":
        return " "
    if cat[0] in "PS":
        return "p"
    if cat[0] == "M":
        return "m"
    if cat == "Lm":
        return "l"
    if any(lo <= ord(ch) <= hi for lo, hi in _UNSPACED):
        return "s"
    name = unicodedata.name(ch, "")
    return "s" if name.startswith(("CJK UNIFIED IDEOGRAPH", "CJK COMPATIBILITY IDEOGRAPH", "HIRAGANA")) else "w"


_KINDS = _Table(_kind)
# A word is a maximal run of w, l and m holding a w, or one s: with l and m deleted, each run of w starts a word.
# Counted by str.count, so a long text costs no list of its words.
_WORD_STARTS = str.maketrans({"l": None, "m": None, "p": " "})


def _non_starter_class() -> str:
    """A regex class of every non-starter (canonical combining class > 0), as ranges (all in planes 0 and 1)."""
    ranges, start, prev = [], None, None
    for cp in range(0x300, 0x20000):
        if unicodedata.combining(chr(cp)):
            if start is None:
                start = cp
            elif cp != prev + 1:
                ranges.append((start, prev))
                start = cp
            prev = cp
    ranges.append((start, prev))
    return "[" + "".join(re.escape(chr(a)) + ("-" + re.escape(chr(b)) if b > a else "") for a, b in ranges) + "]"


# UAX #15's Stream-Safe Text Format: no more than 30 non-starters in a row, a combining grapheme joiner (a starter,
# default-ignorable: dropped after normalising) after each 30. Normalisation reorders a run of non-starters by their
# classes in time quadratic in the run's length; cut into runs of 30, it is linear in the text's.
_NON_STARTER = _non_starter_class()
_NON_STARTERS_30 = re.compile(f"{_NON_STARTER}{{30}}(?={_NON_STARTER})")
_CGJ = "\u034f"


def normalize(form: str, text: str) -> str:
    """``unicodedata.normalize(form, text)`` in linear time: ``text`` in the Stream-Safe Text Format first."""
    return unicodedata.normalize(form, _NON_STARTERS_30.sub(lambda m: m.group(0) + _CGJ, text))


def drop_invisible(text: str) -> str:
    """``text`` without default-ignorable or format characters, not normalised (``visible_text`` without NFKC)."""
    return text.translate(_DROP)


def visible_text(text: str) -> str:
    """``text`` in NFKC form without default-ignorable or format characters.

    >>> visible_text("th\u200be \uff43\u00ada\u2060t\U000e0041"), visible_text("\u3164\ufe0f")
    ('the cat', '')
    """
    return normalize("NFKC", text.translate(_DROP)).translate(_DROP)


def has_visible(text: str) -> bool:
    r"""True when ``text`` shows anything: a letter, digit, symbol or punctuation with ink.

    >>> has_visible("\n \u200b\u3164\u2800\u0301"), has_visible("...")
    (False, True)
    """
    return any(k in "wslp" for k in visible_text(text).translate(_KINDS))


def reasoning_words(text: str) -> int:
    """How many words a reasoning text shows (the module's rule: a word needs a letter or digit with ink).

    >>> reasoning_words("3 + 4 = 7, so the sum is 7"), reasoning_words("\u3164\u3164 \u3164 \u2800 \u0640\u0640")
    (8, 0)
    >>> reasoning_words("th\u200bi\u200bs"), reasoning_words("三加四等于七"), reasoning_words("삼 더하기 사")
    (1, 6, 3)
    """
    kinds = visible_text(text).translate(_KINDS).translate(_WORD_STARTS)
    return kinds.count("s") + (" " + kinds.replace("s", " ")).count(" w")


# ------------------------------------------------------------------------------------------ visible boxes

_NUM = r"[-+]?\s*(?:\d+(?:\.\d*)?|\.\d+)"
_DIM = _NUM + r"\s*[a-z]{2}"
_OPT = r"(?:\s*\[[^\[\]{}]*\])?"
_GLUE = rf"{_DIM}(?:\s*(?:plus|minus)\s*(?:(?:{_NUM})?\s*fil+|{_DIM}))*"  # 1em plus 2pt minus 1fil
# LaTeX that prints nothing (with the arguments it consumes). Ordered: ``\left.`` before ``\left``.
_NO_INK = re.compile(
    r"(?<!\\)%[^\n]*|\\\\" + _OPT + r"|\\[,:;!> \n/@-]|(?<!\\)~|(?<!\\)\$|\\[()\[\]]"
    r"|\\(?:left|right|middle|[bB]igg?[lrm]?)\s*\."
    r"|\\(?:[hv]space\*?|mspace|label|color|textcolor|colorbox|pagecolor|tag\*)" + _OPT + r"\s*\{[^{}]*\}"
    r"|\\rule" + _OPT + r"\s*\{[^{}]*\}\s*\{[^{}]*\}"
    r"|\\(?:kern|mkern|hskip|mskip|vskip|hglue|vglue)\s*(?:\{[^{}]*\}|" + _GLUE + ")"
    r"|\\(?:quad|qquad|enspace|enskip|thinspace|medspace|thickspace|negthinspace|negmedspace|negthickspace"
    r"|space|nobreakspace|nobreak|allowbreak|hfill|hfil|hss|vfill|vfil|break|newline|linebreak|par|relax|null"
    r"|empty|strut|mathstrut|displaystyle|textstyle|scriptstyle|scriptscriptstyle|left|right|middle"
    r"|[bB]igg?[lrm]?|limits|nolimits|nonumber|notag|noindent|centering|normalfont|normalsize|footnotesize"
    r"|scriptsize|tiny|small|large|Large|LARGE|huge|Huge|bf|it|rm|sf|tt|sl|sc|em|bfseries|mdseries|itshape"
    r"|upshape|slshape|scshape|rmfamily|sffamily|ttfamily|boldmath|unboldmath)(?![a-zA-Z])\*?"
)
_PHANTOM = re.compile(r"\\(?:[hv]?phantom)(?![a-zA-Z])\s*")
_COMMAND = re.compile(r"\\(?:[a-zA-Z]+|.)", re.DOTALL)
# A command with its optional arguments and the space after it, an escaped character, a brace, or a run of text.
_TOKEN = re.compile(r"\\[a-zA-Z]+\*?(?:\s*\[[^\[\]{}]*\])*\s*|\\.|[{}]|[^\\{}]+", re.DOTALL)
# Blank characters read as a space (a line end stays: it ends a % comment), combining marks dropped (alone they
# print nothing; on a letter, the letter prints).
_BOX_BLANKS = _Table(lambda ch: ord(ch) if ch == "\n" else {" ": " ", "m": None}.get(_KINDS[ord(ch)], ord(ch)))
_SYNTAX = re.compile(r"[{}^_&\\.,;:!?\s]")  # TeX syntax, a nameless backslash, sentence punctuation


_DEPTH = {"{": 1, "}": -1}


def _drop_phantoms(s: str) -> str:
    """Remove ``\\phantom``, ``\\hphantom``, ``\\vphantom`` and the argument each takes (a group or one token), in
    one pass: the pieces kept are joined once."""
    kept, i = [], 0
    while m := _PHANTOM.search(s, i):
        kept.append(s[i : m.start()])
        j = m.end()
        if s.startswith("{", j):
            depth = 0
            while j < len(s):
                depth += _DEPTH.get(s[j], 0)
                j += 1
                if depth == 0:
                    break
        elif c := _COMMAND.match(s, j):
            j = c.end()
        else:
            j += 1
        i = j
    kept.append(s[i:])
    return "".join(kept)


def _drop_empty_groups(s: str) -> str:
    """Remove every group with nothing in it and every command whose argument is such a group (``\\text{}``,
    ``{{ }}``, ``\\frac{}{}``), innermost first, in one pass."""
    out: list[str | None] = []  # None: a command emptied of its argument (still owns the groups after it)
    opened: list[tuple[int, int | None]] = []  # (where a group opened, where the command it belongs to is)
    for token in _TOKEN.findall(s):
        if token == "{":
            last = out[-1] if out else ""
            owner = len(out) - 1 if last is None or (last.startswith("\\") and last[1:2].isalpha()) else None
            opened.append((len(out), owner))
            out.append(token)
        elif token == "}" and opened:
            start, owner = opened.pop()
            if all(out[i] is None or out[i].isspace() for i in range(start + 1, len(out))):
                del out[start:]
                if owner is not None:
                    out[owner] = None
            else:
                out.append(token)
        else:
            out.append(token)
    return "".join(piece for piece in out if piece is not None)


MAX_BOX_CHARS = 4096  # a longer box is not read: no answer (rewards.extract never asks about one over 1,000)


def _inked(content: str) -> str | None:
    """The box's content without the LaTeX that prints nothing (module docstring), or None when it is too long to
    read. Each round removes what the last one uncovered (``\\hspace{\\,}``), so rounds are bounded by the nesting."""
    if len(content) > MAX_BOX_CHARS:
        return None
    s, previous = visible_text(content).translate(_BOX_BLANKS), None
    while s != previous:
        previous = s
        s = _drop_empty_groups(_NO_INK.sub(" ", _drop_phantoms(s)))
    return s


def box_is_visible(content: str) -> bool:
    r"""True when a box's content prints something once LaTeX that prints nothing is removed (module docstring).

    >>> [box_is_visible(b) for b in ["~", "\\,\\quad", "{}", "\\text{ }", "\\phantom{3}", "\\hspace{1em}", "\u200b"]]
    [False, False, False, False, False, False, False]
    >>> [box_is_visible(b) for b in ["\\frac{1}{2}", "\\text{yes}", "-3", "x^2", "\\pi", "\\{\\}", "0"]]
    [True, True, True, True, True, True, True]
    """
    s = _inked(content)
    if s is None:
        return False
    if _COMMAND.search(s):  # a command or escaped symbol that prints (\pi, \infty, \{, \%)
        return True
    return any(k in "wslp" for k in _SYNTAX.sub("", s).translate(_KINDS))


# ------------------------------------------------------------------------------------------ boxes that hold an answer

# Commands that name a value, a relation or an operation: each is an answer by itself (\boxed{\pi}, \boxed{\geq}).
_GREEK = (
    "alpha beta gamma delta epsilon varepsilon zeta eta theta vartheta iota kappa varkappa lambda mu nu xi "
    "omicron pi varpi rho varrho sigma varsigma tau upsilon phi varphi chi psi omega digamma "
    "Gamma Delta Theta Lambda Xi Pi Sigma Upsilon Phi Psi Omega varGamma varDelta varTheta varLambda varXi "
    "varPi varSigma varUpsilon varPhi varPsi varOmega"
)
_CONSTANTS = (
    "infty emptyset varnothing hbar hslash ell imath jmath aleph beth gimel daleth Re Im wp partial nabla top bot"
)
_RELATIONS = (
    "leq le geq ge neq ne lt gt leqslant geqslant equiv approx sim simeq cong propto ll gg prec succ "
    "preceq succeq subset subseteq subsetneq supset supseteq supsetneq in notin ni cup cap setminus "
    "bigcup bigcap perp parallel mid nmid"
)
_OPERATIONS = (
    "pm mp times div oplus ominus otimes odot land lor lnot neg wedge vee to rightarrow "
    "leftarrow Rightarrow Leftarrow leftrightarrow Leftrightarrow iff implies impliedby mapsto "
    "longrightarrow Longrightarrow uparrow downarrow forall exists nexists sum prod int iint oint "
    "checkmark surd"
)
_FUNCTIONS = (
    "sin cos tan cot sec csc sinh cosh tanh coth arcsin arccos arctan log ln lg exp lim liminf limsup "
    "max min sup inf det gcd lcm deg dim ker arg Pr mod bmod"
)
VALUE_COMMANDS = frozenset(" ".join((_GREEK, _CONSTANTS, _RELATIONS, _OPERATIONS, _FUNCTIONS)).split())
# Commands whose argument is text (prose rules: a word, a number or one letter; not N/A, not ?).
TEXT_COMMANDS = frozenset(
    "text textrm textbf textit textsf texttt textnormal textup textsl textsc textmd emph mbox hbox fbox".split()
)
_NAME_COMMANDS = frozenset({"begin", "end"})  # their argument names an environment, it is no answer
_BOX_TOKEN = re.compile(r"\\[a-zA-Z]+\*?\s*|\\.|[{}]|[^\\{}]+", re.DOTALL)
_EMPTY_PAIR = re.compile(r"(?:\\\{|\[|\()\s*(?:\\\}|\]|\))")  # \{\}, [], (): the empty set, list, tuple


def _math_symbol(ch: str) -> bool:
    """A mathematical symbol that is an answer by itself (``<``, ``=``, ``±``, ``∞``, ``−``); not an ellipsis (``⋯``
    is a math symbol in Unicode) nor a dot operator (a placeholder as much as ``.``)."""
    if unicodedata.category(ch) != "Sm":
        return False
    name = unicodedata.name(ch, "")
    return "ELLIPSIS" not in name and "DOT" not in name


_MATH_SYMBOL = _Table(lambda ch: "y" if _math_symbol(ch) else None)


def _text_holds_answer(text: str) -> bool:
    """Text-mode content holds an answer when one of its words, stripped of the punctuation around it, is a number
    (a digit), a word (two letters in a row) or a single letter (a choice, a variable): ``yes``, ``(B)``, ``12 cm``,
    ``七``; not ``?``, ``...``, ``--``, nor letters only joined by punctuation (``N/A``, ``n.a.``)."""
    for token in text.split():
        inner = token.translate(_KINDS).replace("m", "").strip("p")
        if any(ch.isdigit() for ch in token) or "ww" in inner or "s" in inner or inner == "w":
            return True
    return False


def _read_box(s: str) -> tuple[bool, str]:
    """(whether inked box content ``s`` holds a value outside text mode, its text-mode content): one pass."""
    if _EMPTY_PAIR.search(s) or s.strip() == "-":  # the empty set; a sign alone (a dash line is punctuation)
        return True, ""
    # What each open group is: "t" text mode, "n" an environment's name (no answer), "m" math mode. A group opened
    # right after a command takes the mode that command gives its argument (``pending``), else its parent's.
    stack: list[str] = []
    pending: str | None = None
    text: list[str] = []
    value = False
    for token in _BOX_TOKEN.findall(s):
        mode = stack[-1] if stack else "m"
        if token.startswith("\\") and token[1:2].isalpha():
            name = token[1:].rstrip().rstrip("*")
            value |= name in VALUE_COMMANDS
            pending = "t" if name in TEXT_COMMANDS else "n" if name in _NAME_COMMANDS else None
            continue
        if token == "{":
            stack.append(pending or mode)
            if stack[-1] == "t":
                text.append(" ")  # a text group is its own words
        elif token == "}":
            if stack:
                stack.pop()
                if mode == "t":
                    text.append(" ")
        elif token.startswith("\\"):
            pass  # an escaped sign alone (\{ \} \% \$ \_ \# \&) is no answer
        elif mode == "t":
            text.append(token)
        elif mode == "m" and (any(k in "ws" for k in token.translate(_KINDS)) or token.translate(_MATH_SYMBOL)):
            value = True
        pending = None
    return value, "".join(text)


def box_holds_answer(content: str) -> bool:
    r"""True when a box holds an answer, not only something that prints: once LaTeX that prints nothing is removed
    (``box_is_visible``'s rule), it holds a digit, a letter of math mode (``x``, ``AB``), a text-mode word
    (``_text_holds_answer``), a command that names a value, a relation or an operation (``VALUE_COMMANDS``: ``\pi``,
    ``\infty``, ``\emptyset``, greek letters, ``\leq``, ``\times``, ``\sin``), a mathematical symbol (``<``, ``=``)
    or an empty pair of brackets (the empty set ``\{\}``), or is a sign alone (``-``). Placeholders hold none of
    them: punctuation (``?``, ``.``, ``--``), ellipses (``\ldots``, ``\dots``, ``\cdots``, ``⋯``), dots (``\cdot``),
    blanks to fill (``\_``, ``\square``), escaped signs alone (``\%``, ``\$``), ``\text{N/A}``, unknown commands.

    >>> [box_holds_answer(b) for b in ["?", "\\text{?}", "\\ldots", "\\dots", "\\text{N/A}", "\\_\\_", "\\square"]]
    [False, False, False, False, False, False, False]
    >>> [box_holds_answer(b) for b in ["3", "x", "\\text{yes}", "\\text{(B)}", "\\pi", "\\{\\}", "\\geq", "-"]]
    [True, True, True, True, True, True, True, True]
    """
    s = _inked(content)
    if s is None:
        return False
    value, text = _read_box(s)
    return value or _text_holds_answer(text)


def box_prose(content: str) -> str:
    r"""The text-mode content of a box (the arguments of ``\text`` and its kin): the prose an answer holds.

    >>> box_prose("3\\text{ cm}").split(), box_prose("\\text{I added \\textbf{4}} 9").split()
    (['cm'], ['I', 'added', '4'])
    """
    s = _inked(content)
    return "" if s is None else _read_box(s)[1]
