r"""Markup in a reply, whatever its spelling, and the words a reply shows: what the format rewards read.

A policy that is paid for "no reasoning" learns to hide its reasoning in markup the rule does not name, so markup
is found by its shape, never by a list of names to refuse:

- **tags** of any name in any bracket shape: ``<name ...>``, ``</name>``, ``<name/>``, ``[name]``/``[/name]``,
  ``{{name}}``/``{{/name}}``, ``【name】``, ``〈name〉``, ``《name》``, ``«name»`` ... (a letter first, then letters,
  digits, ``_ : . -``; attributes after a space); ``<`` followed by a space or a digit is a comparison, not a tag;
- **blocks** with delimiters of their own: code fences (a line opening with three or more backticks or tildes, up to
  the next such line), HTML comments ``<!-- ... -->``, LaTeX environments ``\begin{name} ... \end{name}``;
- **formatting** is the one allow-list: HTML's text-level and grouping elements (``FORMATTING``: ``<b>``, ``<sup>``,
  ``<span class="x">``, ``<p>``, ``<br/>``, ... in ``<>`` or ``[]``). It is transparent: its content is prose and
  its tag names are no words. Every other tag (including a self-closing one), fence, comment or environment is
  *structure*.

``reply_shape`` reads a reply (its answer boxes masked by the caller) in one pass and says how many words it shows
(``words``: prose words plus the attribute values of formatting tags) and whether structure other than the
answer's own wrapper holds a word (``hidden``). A structural region is everything between its opening and closing
delimiters (any closing tag closes the innermost open region: mismatched names still pair; a closing tag with
nothing open closes a region that began with the reply; a self-closing tag opens a region or closes the one the
last self-closing tag opened; a region never closed runs to the end). A region whose own text (not that of the
regions inside it) holds a word is hidden reasoning unless that own text holds the answer too (``<answer>The answer
is \boxed{9}</answer>`` wraps the answer; ``[think] 5 + 4 = 9 [answer] \boxed{9}`` reasons in ``[think]``); the
words of a structural tag's attributes are hidden too (``<r why="5 + 4 = 9"/>``).

``prose_words``: the words a text shows (``rewards.visible.reasoning_words``) once every tag (with its attributes)
and every LaTeX command name is removed: ``<b></b><i></i>`` or ``\frac{}{}`` is no reasoning.

Linear time: each delimiter is found by one scan forward from the last (a fence or a comment jumps to its end),
the region stack is a bytearray of flags, and words are counted by ``str.count``.

Run the examples: ``python -m pytest --doctest-modules rewards/markup.py``.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from rewards.visible import _KINDS, reasoning_words

# HTML's text-level semantics (HTML Living Standard 4.5), edits (4.7), grouping content (4.4), headings and tables,
# and the old presentational inline elements: they format prose and hold no hidden content.
FORMATTING = frozenset(
    "a em strong small s cite q dfn abbr ruby rt rp data time code var samp kbd sub sup i b u mark bdi bdo span br wbr"
    " ins del p div hr pre blockquote ol ul li dl dt dd figure figcaption main h1 h2 h3 h4 h5 h6"
    " table caption thead tbody tfoot tr td th font big tt strike center".split()
)
# Bracket shapes a tag may take: each opening with its closing. Attributes run up to the next bracket of any shape.
_SHAPES = {"<": ">", "[": "]", "{{": "}}", "【": "】", "〔": "〕", "〖": "〗", "〘": "〙", "〚": "〛", "〈": "〉",
           "《": "》", "«": "»", "‹": "›", "⟨": "⟩", "⟦": "⟧", "⟪": "⟫", "｢": "｣"}  # fmt: skip
_BRACKETS = re.escape("".join(_SHAPES) + "".join(_SHAPES.values()))
_OPEN = "|".join(re.escape(o) for o in sorted(_SHAPES, key=len, reverse=True))
_CLOSE = "|".join(re.escape(c) for c in sorted(set(_SHAPES.values()), key=len, reverse=True))
_TAG_RE = (
    rf"(?P<open>{_OPEN})(?P<slash>/?)(?P<name>[^\W\d_][\w:.\-]*)(?P<attrs>(?:[\s/][^{_BRACKETS}]*)?)"
    rf"(?P<close>{_CLOSE})"
)
_TAG = re.compile(_TAG_RE)
# One scan finds the next delimiter of any kind; which kind it is decides how far the scan jumps.
_DELIMITER = re.compile(
    r"(?P<comment><!--)"
    r"|(?P<fence>^[ \t]{0,3}(?:`{3,}|~{3,})[^\n]*)"
    r"|\\(?P<env>begin|end)\s*\{[^{}\n]*\}"
    rf"|{_TAG_RE}",
    re.MULTILINE,
)
_FENCE_LINE = re.compile(r"^[ \t]{0,3}(?:`{3,}|~{3,})[^\n]*", re.MULTILINE)
_COMMAND_NAME = re.compile(r"\\[a-zA-Z]+")
_INK = re.compile("[ws]")  # in a text's kinds (rewards.visible): a letter or digit with ink

ANSWER_MARK = "\ue000"  # stands for a masked answer box (private use: no word, no ink)

# Region flags (one byte per open region): it holds a word of its own, it holds an answer, a self-closing tag
# opened it.
_WORDS, _ANSWER, _TOGGLE = 1, 2, 4


def _blank_commands(text: str) -> str:
    """LaTeX command names become spaces (the same length: positions stay): ``\\frac`` is no word."""
    return _COMMAND_NAME.sub(lambda m: " " * len(m.group()), text)


def shown_words(text: str) -> int:
    r"""The words ``text`` shows, markup included (a tag's name and attributes are words; a LaTeX command name is
    not): what a reply's word budget counts (``reply_shape``'s ``words``).

    >>> shown_words("The answer is <b>9</b>."), shown_words("\\frac{1}{2}")
    (6, 2)
    """
    return reasoning_words(_blank_commands(text))


def prose_words(text: str) -> int:
    r"""The words ``text`` shows without its markup: tags of every shape (with their attributes) and LaTeX command
    names removed, then ``reasoning_words``.

    >>> prose_words("<b></b><i></i><u></u>"), prose_words("\\frac{}{} \\sqrt{}"), prose_words("<b>two</b> plus 2")
    (0, 0, 3)
    """
    return reasoning_words(_COMMAND_NAME.sub(" ", _TAG.sub(" ", text)))


@dataclass(frozen=True)
class Shape:
    """What ``reply_shape`` found: ``words`` the reply shows in all (prose, tag names and attributes, what hides in
    structure) and ``hidden`` when structure other than the answer's wrapper holds a word."""

    words: int
    hidden: bool


class _Regions:
    """The open structural regions of a reply (one flag byte each, innermost last) and the text outside them."""

    def __init__(self, text: str, kinds: str) -> None:
        self.text, self.kinds = text, kinds
        self.flags = bytearray()
        self.outside = 0  # flags of the text outside every region so far
        self.hidden = False

    def segment(self, a: int, b: int) -> None:
        """Text from ``a`` to ``b`` belongs to the innermost open region (or to none)."""
        bits = _WORDS if _INK.search(self.kinds, a, b) else 0
        if self.text.find(ANSWER_MARK, a, b) >= 0:
            bits |= _ANSWER
        if self.flags:
            self.flags[-1] |= bits
        else:
            self.outside |= bits

    def open(self, bits: int = 0) -> None:
        self.flags.append(bits)

    def close(self) -> None:
        """Close the innermost region (with nothing open: the region that began with the reply)."""
        if not self.flags:
            self.hidden |= bool(self.outside & _WORDS) and not self.outside & _ANSWER
            return
        bits = self.flags.pop()
        self.hidden |= bool(bits & _WORDS) and not bits & _ANSWER

    def leaf(self, a: int, b: int) -> None:
        """A region with no region inside: a fence, a comment, a structural tag's attributes."""
        self.open()
        self.segment(a, b)
        self.close()

    def toggle(self) -> None:
        """A self-closing tag: it closes the region the last one opened, else opens one."""
        if self.flags and self.flags[-1] & _TOGGLE:
            self.close()
        else:
            self.open(_TOGGLE)


def reply_shape(text: str) -> Shape:
    r"""Read a reply whose answer boxes are masked (``ANSWER_MARK``) by the module's rules. ``text`` is read as it
    is (give it ``rewards.visible.visible_text``'s form: invisible characters dropped, NFKC).

    >>> A = ANSWER_MARK
    >>> reply_shape(f"The answer is {A}."), reply_shape(f"The answer is <b>{A}</b>.")
    (Shape(words=3, hidden=False), Shape(words=5, hidden=False))
    >>> [reply_shape(t).hidden for t in (f"<r>5 + 4 = 9</r> The answer is {A}.", f"[r]5 + 4 = 9[/r] {A}",
    ...  f"<r mode='x'>\n</r> {A}", f"5 + 4 = 9</r> {A}", f"```\n5 + 4 = 9\n```\n{A}", f"<!-- 5 + 4 --> {A}",
    ...  f"<answer>The answer is {A}</answer>", f"<r/>5 + 4<r/> {A}", f"<r>\n</r> {A}", f"3 < 5 > 1 so {A}")]
    [True, True, True, True, True, True, False, True, False, False]
    """
    regions = _Regions(text, _blank_commands(text).translate(_KINDS))
    pos, n = 0, len(text)
    while (m := _DELIMITER.search(text, pos)) is not None:
        regions.segment(pos, m.start())
        pos = m.end()
        if m.group("comment"):
            end = text.find("-->", pos)
            end = n if end < 0 else end
            regions.leaf(pos, end)
            pos = min(n, end + 3)
        elif m.group("fence"):
            f = _FENCE_LINE.search(text, pos + 1) if pos < n else None
            regions.leaf(pos, f.start() if f else n)
            pos = f.end() if f else n
        elif m.group("env"):
            regions.close() if m.group("env") == "end" else regions.open()
        elif _SHAPES[m.group("open")] != m.group("close"):  # brackets of two shapes: no tag, read on
            pos = m.start() + 1
            regions.segment(m.start(), pos)
        elif m.group("open") in "<[" and m.group("name").lower() in FORMATTING:
            pass  # formatting: its name and attributes are words, it makes no region
        else:
            regions.leaf(m.start("attrs"), m.end("attrs"))
            if m.group("attrs").rstrip().endswith("/"):
                regions.toggle()
            elif m.group("slash"):
                regions.close()
            else:
                regions.open()
    regions.segment(pos, n)
    while regions.flags:
        regions.close()
    return Shape(words=shown_words(text), hidden=regions.hidden)
