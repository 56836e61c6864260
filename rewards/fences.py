r"""Markdown code fences out of model output, in one linear pass.

``fences(text)`` returns every fenced block of ``text`` in order, by CommonMark's rule for fences: an opening
line of three or more backticks or tildes (any indentation; a backtick fence's info string holds no backtick,
so ```` ```x``` ```` on one line is inline code, not a fence), then the block's lines, up to a closing line of the
same character at least as long as the opening run with nothing after it but spaces. A fence never closes
mid-line, so ``print("```")`` stays in the block. Line ends may be ``\n``, ``\r\n`` or ``\r``. A block left
open runs to the end of the text (a completion cut at the budget).

Python blocks (info string ``python``, ``py``, ``python3`` ... or none) are read with the string rules of
Python: a closing line inside a triple-quoted string (a docstring that shows a fenced example) belongs to the
string, not the fence. If the block never closes outside a string (its quotes were unbalanced), the first
closing line closes it after all, and from there on the scan keeps to plain CommonMark: each character of the
text is read at most twice, whatever its shape (1 MB of whitespace after a fence, 100k fences, unbalanced
quotes).

    >>> [(f.lang, f.body) for f in fences("Try:\r\n~~~python\r\nx = '```'\r\n~~~\r\n```\nbare\n```")]
    [('python', "x = '```'\n"), ('', 'bare\n')]
    >>> fences("```python\ns = '''\n```\n'''\n```")[0].body
    "s = '''\n```\n'''\n"
"""

from __future__ import annotations

import re
from typing import NamedTuple

PYTHON_LANGS = frozenset({"", "python", "python3", "py", "py3", "python2", "ipython", "pycon", "sage"})
_FENCE_LINE = re.compile(r"^[ \t]*(`{3,}|~{3,})(.*)$", re.M)  # a line that starts with a fence run
MAX_FENCES = 4096  # a text with more fenced blocks than this is read up to its 4096th
# Python source up to the next triple-quoted string: other characters, escapes, comments and single-quoted strings
# (each to its quote or the end of its line), all possessive, so the engine keeps no backtracking state
_CODE = re.compile(
    r"""(?:[^#'"\\]++|\\.|#[^\n]*+|'(?!'')(?:[^'\\\n]++|\\.)*+'?|"(?!"")(?:[^"\\\n]++|\\.)*+"?)*+""", re.S
)


class Fence(NamedTuple):
    """One fenced block: ``lang`` is the info string's first word, lower-cased (``""`` for a bare fence)."""

    lang: str
    body: str
    closed: bool = True

    @property
    def is_python(self) -> bool:
        return self.lang in PYTHON_LANGS


def _line_end(text: str, pos: int) -> int:
    end = text.find("\n", pos)
    return len(text) if end < 0 else end


def _triple_end(text: str, pos: int, end: int, quote: str) -> int:
    """Where the triple-quoted string open at ``pos`` ends (just past its quotes), or -1 before ``end``."""
    while True:
        hit = text.find(quote, pos, end)
        if hit < 0:
            return -1
        slashes = hit
        while slashes > pos and text[slashes - 1] == "\\":
            slashes -= 1
        if (hit - slashes) % 2 == 0:  # not escaped
            return hit + 3
        pos = hit + 1


def _string_state(text: str, pos: int, end: int, state: str | None) -> str | None:
    """Python's string state after ``text[pos:end]``, from ``state``: None outside a string, else the triple quote
    that is open. Single-quoted strings and comments end at the end of their line."""
    while pos < end:
        if state is not None:
            close = _triple_end(text, pos, end, state)
            if close < 0:
                return state
            pos, state = close, None
            continue
        pos = _CODE.match(text, pos, end).end()
        if pos >= end:
            return None
        if text.startswith(("'''", '"""'), pos):
            state, pos = text[pos : pos + 3], pos + 3
        else:  # a backslash that ends the text
            pos += 1
    return state


def _body(text: str, start: int, stop: int, indent: int) -> str:
    """The block's lines, each without up to ``indent`` of the spaces that indent the opening fence."""
    body = text[start:stop]
    if body and not body.endswith("\n"):
        body += "\n"
    return re.sub(rf"^ {{1,{min(indent, 64)}}}", "", body, flags=re.M) if indent else body


def fences(text: str) -> list[Fence]:
    """Every fenced block of ``text``, in order (see the module docstring)."""
    if "\r" in text:
        text = text.replace("\r\n", "\n").replace("\r", "\n")
    found: list[Fence] = []
    aware, pos = True, 0  # Python's string rules for python blocks, until one block's quotes do not balance
    while pos is not None:
        pos, aware = _scan(text, pos, aware, found)
    return found


def _scan(text: str, pos: int, aware: bool, found: list[Fence]) -> tuple[int | None, bool]:
    """Read fences from ``pos`` on into ``found``; (where to read on, aware) when a python block's quotes did not
    balance and it was closed at its first closing line after all, else (None, aware)."""
    block = None  # (char, run, indent, lang, python, start)
    for m in _FENCE_LINE.finditer(text, pos):
        if len(found) >= MAX_FENCES:
            return None, aware
        fence, info = m.group(1), m.group(2)
        if block is None:
            if fence[0] == "`" and "`" in info:  # inline code, not a fence
                continue
            lang = info.split(None, 1)[0].strip("{}.").lower() if info.strip() else ""
            block = (fence[0], len(fence), m.start(1) - m.start(), lang, aware and lang in PYTHON_LANGS, m.end() + 1)
            scanned, state, first = m.end() + 1, None, None
            continue
        char, run, indent, lang, python, start = block
        if fence[0] != char or len(fence) < run or info.strip(" \t"):  # a line of the block's content
            continue
        if python:
            state = _string_state(text, scanned, m.start(), state)
            scanned = m.end() + 1
        if state is None:
            found.append(Fence(lang, _body(text, start, m.start(), indent)))
            block = None
        elif first is None:
            first = (m.start(), m.end() + 1)
    if block is None:
        return None, aware
    char, run, indent, lang, python, start = block
    if first is None:  # left open: the block runs to the end of the text
        found.append(Fence(lang, _body(text, start, len(text), indent), False))
        return None, aware
    found.append(Fence(lang, _body(text, start, first[0], indent)))  # unbalanced quotes: CommonMark's close
    return first[1], False
