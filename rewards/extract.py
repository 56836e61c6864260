r"""Where the answer is: every candidate for the final answer of a completion, before anything is compared.

Shared by every reward that reads an answer (``math_reward``, ``exact_match_reward``, the format rewards,
``code_reward``); ``rewards.answer`` reads each candidate under the gold's grammar and compares.

- **The answer part** (``strip_think``): after the last ``</think>`` and before any ``<think>`` that reopens
  reasoning; a ``<think>`` never closed means no answer (the completion was truncated mid-reasoning).
- **The candidates** (``answer_candidates``), in one left-to-right pass each:

  - every **box**: a command whose name ends in ``box`` or ``boxed`` (any case, starred or not) and is not a
    layout box that holds text (``\mbox``, ``\hbox``, ``\makebox``, ... ``LAYOUT_BOXES``): ``\boxed{3}``,
    ``\boxed {3}``, ``\boxed`` + newline + ``{3}``, ``\boxed*{3}``, ``\fbox{3}``, ``\framebox[2cm]{3}``,
    ``\colorbox{yellow}{3}``; without braces the argument is the run up to the next space or ``$`` (``\boxed 3``).
    A box inside a box is part of the outer one's content, not a candidate of its own;
  - every **answer phrase**: "answer is / are / would be / will be / must be X", "answer: X", "answer = X" (also
    with "option" or "choice" for "answer": "The correct option is B"; so "The
    final answer is X", Minerva's "Final Answer: The final answer is $X$. I hope it is correct.", "**Answer:** X"),
    a heading "Final Answer" with X on the next line, and GSM8K's ``#### X``. X runs to the end of its sentence
    (a ``.``/``!``/``?`` before a space, outside ``$..$``) or line, or to the next answer phrase. A phrase whose
    X holds a box points at that box and adds nothing;
  - with ``choices``, every **lettered choice on a line of its own**: ``(B)``, ``B)``, ``B``, ``(B) 42``,
    ``Option B``.

  A box that prints nothing (``\boxed{}``, ``\boxed{\,}``: ``rewards.visible.box_is_visible``) is no candidate.
- **Bounded, linear**: spans are recorded, and only a candidate of at most ``MAX_ANSWER_CHARS`` is materialised
  (a longer one is kept as ``text=None``: never compared, it can only refuse); nested openings keep one open box;
  no regular expression backtracks more than a constant; an answer part longer than ``MAX_SCAN_CHARS`` or with
  more than ``MAX_CANDIDATES`` candidates has no answer (None).

``final_answer`` (one agreed candidate's text, or None) is what the format rewards read.

Run the examples: ``python -m pytest --doctest-modules rewards/extract.py``.
"""

from __future__ import annotations

import bisect
import re
import string
from dataclasses import dataclass
from typing import Any

from rewards.latex import plain
from rewards.visible import box_is_visible

_THINK_OPEN, _THINK_CLOSE = "<think>", "</think>"
MAX_ANSWER_CHARS = 1000  # a longer candidate is never compared (it refuses)
MAX_SCAN_CHARS = 100_000  # a longer answer part is not searched: no answer
MAX_CANDIDATES = 16  # more candidates than this: no answer

# Boxes that lay out text rather than frame an answer (``12 \mbox{ cm}``).
LAYOUT_BOXES = frozenset(
    "mbox hbox vbox vtop makebox parbox raisebox sbox savebox usebox newsavebox lrbox pbox scalebox resizebox "
    "rotatebox reflectbox".split()
)
_LEADING_ARGUMENTS = {"colorbox": 1, "fcolorbox": 2}  # colour arguments before the boxed content
_BOX_COMMAND = re.compile(r"\\([A-Za-z]*box(?:ed)?)(?![A-Za-z])", re.IGNORECASE)
_BRACE = re.compile(r"\\.|[{}]", re.DOTALL)
_SPACE = re.compile(r"\s*")
_OPTIONAL = re.compile(r"\[[^\[\]{}]{0,100}\]\s*")
_BARE = re.compile(r"[^\s$}]+")
# Answer phrases are found on an ASCII-lower-cased copy (same length, same offsets) by one pattern that starts
# with a literal word, so the search skips ahead in C and prose that merely uses the word costs nothing.
_ASCII_LOWER = str.maketrans(string.ascii_uppercase, string.ascii_lowercase)
_ANCHOR = re.compile(
    r"(?:answer|option|choice)s?[*_ \t]{0,8}(?:(?:is|are|would\s+be|will\s+be|must\s+be)(?![a-z])[*_ \t]{0,4}:?|[:=])"
    r"|(?P<heading>answers?[*_#: \t]{0,8}(?:\n|\Z))"
    r"|(?P<gsm8k>####[ \t]{0,8}(?=[-+$\\(.\d]))"
)
_HEADING_HEAD = re.compile(r"[#*_ \t]{0,8}(?:final[ \t]+)?[#*_ \t]{0,4}")
# A lettered choice alone on its line: "(B)", "B)", "(B) 42", "Option B", "B", "**B.**"; not "A cat sat".
_CHOICE_LINE = re.compile(
    r"^[ \t*_#>]{0,8}(?:(?:[Oo]ption|[Cc]hoice)[ \t]+\(?[A-J]\)?|\(?[A-J]\))(?:[ \t.:*_][^\n]{0,200})?$"
    r"|^[ \t*_#>]{0,8}[A-J][.:]?[ \t*_]{0,8}$",
    re.MULTILINE,
)
_EMPHASIS_ENDS = "*_ \t\n"


@dataclass(frozen=True)
class Candidate:
    """One candidate for the final answer: its text (None when longer than ``MAX_ANSWER_CHARS``), where it came
    from (``box``, ``anchor`` or ``choice``) and where it starts in the answer part."""

    text: str | None
    source: str
    start: int


def completion_text(completion: Any) -> str:
    r"""Return the text of one completion, plain (``str``) or TRL conversational (a list of messages).

    For a conversation the contents of its assistant messages are joined (TRL's completions hold one
    assistant message; tool-calling turns may hold more).

    >>> completion_text("The answer is \\boxed{4}.")
    'The answer is \\boxed{4}.'
    >>> completion_text([{"role": "assistant", "content": "\\boxed{4}"}])
    '\\boxed{4}'
    """
    if isinstance(completion, str):
        return completion
    if isinstance(completion, dict):
        return str(completion.get("content") or "")
    if isinstance(completion, (list, tuple)):
        parts = [
            m.get("content") or ""
            for m in completion
            if isinstance(m, dict) and m.get("role", "assistant") == "assistant"
        ]
        return "\n".join(str(p) for p in parts)
    raise ValueError(
        f"completion must be a str or a list of {{'role', 'content'}} messages, got {type(completion).__name__}"
    )


def prompt_text(prompt: Any) -> str | None:
    r"""The text of one prompt as TRL passes it (``prompts``: a string, or a conversation whose messages' contents
    are joined); None for no prompt.

    >>> prompt_text([{"role": "system", "content": "/think"}, {"role": "user", "content": "How many apples?"}])
    '/think\nHow many apples?'
    """
    if prompt is None:
        return None
    if isinstance(prompt, str):
        return prompt
    if isinstance(prompt, dict):
        return str(prompt.get("content") or "")
    if isinstance(prompt, (list, tuple)):
        parts = []
        for m in prompt:
            content = m.get("content") if isinstance(m, dict) else m
            if isinstance(content, list):  # multimodal parts: [{"type": "text", "text": ...}]
                content = " ".join(str(p.get("text") or "") for p in content if isinstance(p, dict))
            parts.append(str(content or ""))
        return "\n".join(parts)
    return str(prompt)


def strip_think(text: str) -> str:
    r"""Return the answer part of ``text``: what follows the last ``</think>``, up to a ``<think>`` that reopens
    reasoning. Answers inside the reasoning do not count, and text after an unclosed ``<think>`` is reasoning.

    A completion that opens ``<think>`` and never closes it is all reasoning (it was truncated): no answer.

    >>> strip_think("<think>\nmaybe 3\n</think>\nThe answer is 4.")
    '\nThe answer is 4.'
    >>> strip_think("<think>\nstill thinking"), strip_think("<think>a</think> 4 <think> \\boxed{3}")
    ('', ' 4 ')
    """
    if _THINK_CLOSE in text:
        text = text.rsplit(_THINK_CLOSE, 1)[1]
    elif _THINK_OPEN in text:
        return ""
    return text.split(_THINK_OPEN, 1)[0]


def is_box_command(name: str) -> bool:
    r"""Whether ``\name`` frames an answer: a name ending in ``box`` or ``boxed``, any case, not a layout box
    (``_BOX_COMMAND`` finds these).

    >>> [is_box_command(n) for n in ("boxed", "fbox", "framebox", "Boxed", "colorbox", "mbox", "makebox", "box")]
    [True, True, True, True, True, False, False, True]
    """
    low = name.lower()
    return low.endswith(("box", "boxed")) and low not in LAYOUT_BOXES


def _box_argument(text: str, pos: int, name: str) -> tuple[str, int, int] | None:
    """Where the boxed content of ``\\name`` (ending at ``pos``) is: ("group", index of its ``{``, 0), ("bare",
    start, end), or None when the command has no argument."""
    pos = _SPACE.match(text, pos).end()
    if text.startswith("*", pos):
        pos = _SPACE.match(text, pos + 1).end()
    for _ in range(2):  # \framebox[2cm][l]{..}
        m = _OPTIONAL.match(text, pos)
        if m is None:
            break
        pos = m.end()
    for _ in range(_LEADING_ARGUMENTS.get(name.lower(), 0)):  # \colorbox{yellow}{..}
        if not text.startswith("{", pos):
            return None
        close = text.find("}", pos, pos + 100)
        if close < 0:
            return None
        pos = _SPACE.match(text, close + 1).end()
    if text.startswith("{", pos):
        return "group", pos, 0
    bare = _BARE.match(text, pos)
    if bare is None or text.startswith("\\", pos) and bare.end() - pos == 1:
        return None
    end = bare.end()
    while end > pos and text[end - 1] in ".,;:":
        end -= 1
    return ("bare", pos, end) if end > pos else None


def _closing_brace(text: str, open_at: int) -> int:
    """The index of the brace closing the group that opens at ``open_at``: -1 when the text ends first (a box cut
    off), -2 when the group holds more than ``MAX_ANSWER_CHARS`` (never read: it refuses). Bounded scan."""
    depth, stop = 0, open_at + MAX_ANSWER_CHARS + 2
    for m in _BRACE.finditer(text, open_at, stop):
        token = m.group()
        if token == "{":
            depth += 1
        elif token == "}":
            depth -= 1
            if depth == 0:
                return m.start()
    return -1 if stop >= len(text) else -2


def box_spans(text: str, limit: int = MAX_CANDIDATES + 1) -> list[tuple[int, int]]:
    r"""(start, end) of the content of every complete box, in order, at most ``limit``; a box inside a box is part
    of its content. A box longer than ``MAX_ANSWER_CHARS`` (or more than ``4 * limit`` box commands) is
    ``(start, -1)`` and ends the list (it refuses).
    One left-to-right pass: a regular expression finds the next box command; only a box's own content (at most
    ``MAX_ANSWER_CHARS``) is scanned for its closing brace, so nested or unclosed openings cost nothing extra.

    >>> t = "\\boxed{1} then \\fbox {\\frac{3}{4}} and \\boxed{\\boxed{2}} \\boxed 5. \\boxed{"
    >>> [t[a:b] for a, b in box_spans(t)]
    ['1', '\\frac{3}{4}', '\\boxed{2}', '5']
    """
    spans: list[tuple[int, int]] = []
    pos, commands = 0, 0
    while len(spans) < limit and (m := _BOX_COMMAND.search(text, pos)) is not None:
        pos = m.end()
        if m.group(1).lower() in LAYOUT_BOXES:
            continue
        commands += 1
        if commands > 4 * limit:  # a flood of box commands: no answer to find among them
            spans.append((m.start(), -1))
            break
        argument = _box_argument(text, pos, m.group(1))
        if argument is None:
            continue
        kind, start, end = argument
        if kind == "group":
            close = _closing_brace(text, start)
            if close == -1:
                continue  # cut off: a box inside it may still be complete
            start, end = start + 1, close
        if end < 0 or end - start > MAX_ANSWER_CHARS:
            spans.append((start, -1))
            break
        spans.append((start, end))
        pos = end
    return spans


def all_boxed(text: str) -> list[str]:
    r"""The contents of every complete outermost box (``box_spans``), in order.

    >>> all_boxed("\\boxed{1} then \\boxed{\\frac{3}{4}} and \\boxed{")
    ['1', '\\frac{3}{4}']
    """
    return [text[a:b] for a, b in box_spans(text, limit=len(text) + 1) if b >= 0]  # limit: every box


def last_boxed(text: str) -> str | None:
    r"""The content of the last complete box, or None when there is none.

    >>> last_boxed("\\boxed{1} then \\boxed{\\frac{3}{4}}."), last_boxed("no box")
    ('\\frac{3}{4}', None)
    """
    boxes = all_boxed(text)
    return boxes[-1] if boxes else None


def _sentence_end(text: str, start: int, stop: int) -> int:
    """The end of the answer phrase's value starting at ``start``: a newline, or ``.``/``!``/``?`` followed by
    a space or the end, outside ``$..$``; never past ``stop``. Scans at most ``MAX_ANSWER_CHARS + 1`` characters."""
    stop = min(stop, len(text), start + MAX_ANSWER_CHARS + 1)
    math = False
    i = start
    while i < stop:
        ch = text[i]
        if ch == "$":
            math = not math
        elif ch == "\n" and not math:
            return i
        elif ch in ".!?" and not math and (i + 1 >= len(text) or text[i + 1].isspace()) and text[i - 1] != ".":
            return i  # "3..." is an ellipsis, not the end of a sentence
        i += 1
    return stop


def _is_heading(low: str, start: int) -> bool:
    """Whether only markup and "final" stand before the word at ``start`` on its line (a "Final Answer" heading;
    looked at up to 32 characters back)."""
    line_start = low.rfind("\n", max(0, start - 32), start) + 1
    if line_start == 0 and start > 32:
        return False
    return _HEADING_HEAD.fullmatch(low, line_start, start) is not None


def _anchor_spans(text: str, boxes: list[tuple[int, int]], limit: int) -> list[tuple[int, int]]:
    """(start, end) of the value of every answer phrase that does not point at a box, at most ``limit`` + 1."""
    low = text.translate(_ASCII_LOWER)
    matches = []  # (where the phrase starts, where its value starts, the value is the rest of the line)
    for m in _ANCHOR.finditer(low):
        if m.group("gsm8k") is None and m.start() > 0 and low[m.start() - 1].isalpha():
            continue  # inside another word
        if m.group("heading") is not None and not _is_heading(low, m.start()):
            continue
        matches.append((m.start(), _SPACE.match(text, m.end()).end(), m.group("gsm8k") is not None))
        if len(matches) > 4 * limit:
            break
    spans: list[tuple[int, int]] = []
    box_starts = [a for a, _ in boxes]
    for k, (_, start, line) in enumerate(matches):
        stop = min(matches[k + 1][0] if k + 1 < len(matches) else len(text), start + MAX_ANSWER_CHARS + 1)
        if line:
            end = text.find("\n", start, stop)
            end = stop if end < 0 else end
        else:
            end = _sentence_end(text, start, stop)
        i = bisect.bisect_left(box_starts, start)
        if i < len(box_starts) and box_starts[i] < end:
            continue  # "The answer is \boxed{4}": the phrase points at the box
        spans.append((start, end))
        if len(spans) > limit:
            break
    return spans


def _trim(span: str) -> str:
    """A candidate's text without the markdown emphasis and spaces around it."""
    return span.strip(_EMPHASIS_ENDS)


def answer_candidates(text: str, anchors: bool = True, choices: bool = False) -> list[Candidate] | None:
    r"""Every candidate for the final answer in the answer part ``text`` (module docstring), in order; None when
    there are too many or the part is too long to search.

    >>> [(c.text, c.source) for c in answer_candidates("So \\boxed {3}. Final Answer: The final answer is $3$.")]
    [('3', 'box'), ('The final', 'anchor'), ('$3$', 'anchor')]
    >>> [c.text for c in answer_candidates("Thus:\n#### 72")]
    ['72']
    >>> [c.text for c in answer_candidates("I pick\n(B)", choices=True)]
    ['(B)']
    """
    if len(text) > MAX_SCAN_CHARS:
        return None
    found: list[Candidate] = []
    boxes = box_spans(text)
    for a, b in boxes:
        content = text[a:b].strip() if b >= 0 else None
        if content is None or box_is_visible(content):  # a box that prints nothing is no answer
            found.append(Candidate(content, "box", a))
    if anchors:
        for a, b in _anchor_spans(text, boxes, MAX_CANDIDATES):
            content = _trim(text[a:b]) if b - a <= MAX_ANSWER_CHARS else None
            if content != "":
                found.append(Candidate(content, "anchor", a))
    if choices:
        for m in _CHOICE_LINE.finditer(text):
            found.append(Candidate(_trim(m.group()), "choice", m.start()))
            if len(found) > MAX_CANDIDATES:
                break
    if len(found) > MAX_CANDIDATES:
        return None
    return sorted(found, key=lambda c: c.start)


def normalize_answer(answer: str) -> str:
    r"""Normalise an answer for exact comparison: typography made plain (``rewards.latex.plain``: ``$``,
    ``\text{}``-like wrappers, spacing), spaces collapsed, lower-cased, a trailing period dropped.

    >>> normalize_answer("  $\\text{Yes}$. "), normalize_answer("\\textbf{Paris}"), normalize_answer("−3")
    ('yes', 'paris', '-3')
    """
    s = plain(answer)
    s = re.sub(r"\\text\{([^{}]*)\}", r"\1", s)
    s = " ".join(s.split()).lower()
    return s.rstrip(".").strip()


_BOLD = re.compile(r"\*\*|__")
_STAR = re.compile(r"(?<![\w)])\*|\*(?![\w(])")  # a star not between operands (2*3*4 is arithmetic)


def strip_markdown(text: str) -> str:
    r"""Drop markdown emphasis (``**bold**``, ``__bold__``, ``*italic*``) so that an answer phrase reads the same
    with or without it. Linear: no pairing of stars.

    >>> strip_markdown("**Answer:** 3"), strip_markdown("**The answer is *3***"), strip_markdown("2*3*4")
    ('Answer: 3', 'The answer is 3', '2*3*4')
    """
    return _STAR.sub("", _BOLD.sub("", text))


def final_answer(text: str, anchors: bool = False) -> str | None:
    r"""The one final answer of a completion's answer part, as text: its boxes (and with ``anchors`` its answer
    phrases) must all agree after ``normalize_answer``; None when there is none, they disagree, or a box is too
    long to compare. A box that prints nothing is skipped.

    >>> final_answer("<think>\n\\boxed{3}\n</think>\nThe answer is \\boxed{4}.")
    '4'
    >>> final_answer("\\boxed{3} or \\fbox{4}") is None, final_answer("\\boxed{4}, so \\boxed{ 4 }")
    (True, '4')
    >>> final_answer("\\boxed{\\,} \\boxed{4}"), final_answer("\\boxed{\\phantom{3}}") is None
    ('4', True)
    >>> final_answer("The final answer is $-3$.", anchors=True), final_answer("**Answer:** *3*", anchors=True)
    ('$-3$', '3')
    """
    found = answer_candidates(strip_think(text), anchors=anchors)
    if not found or any(c.text is None and c.source == "box" for c in found):
        return None
    texts = [strip_markdown(c.text) if c.source != "box" else c.text for c in found if c.text is not None]
    if not texts or len({normalize_answer(t) for t in texts}) > 1:
        return None
    return texts[-1]
