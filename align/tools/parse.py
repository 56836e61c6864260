"""Tool calls out of a model's turn, and the text that shows the model its tools.

What a call is, by an allow-list of the call syntax (everything else in the turn is text):

- `<tool_call>{"name": ..., "arguments": {...}}</tool_call>` (SmolLM3's `xml_tools`, Hermes, Qwen; one or more
  per turn) is a call anywhere outside the think block; it is malformed when its body is not a JSON object with a
  string `name` and an object `arguments` (or a JSON string of one), or when it is left open;
- `<code>...</code>`, a call of the `python` tool (SmolLM3's `python_tools`) when that tool is offered, is a call
  when it stands on its own lines: only spaces (or another call) between the start of its line and `<code>`, and
  between `</code>` and the end of its line; malformed when it stands at the start of a line and is left open.

A call's content that is one fenced block (```` <code>```python ... ```</code> ````) is read as that block's body.
Line ends may be `\n` or `\r\n`. So `Use <code>len(s)</code> to count` is prose, never a call. Text inside the
turn's think block is reasoning, not a call. A malformed call is answered with a tool message saying so (and
counted), never dropped in silence. Whether a call that parsed did anything (an empty program, one that raised)
is the tool's own verdict (`align.tools.runner`). One pass over the turn, whatever its shape (100k unclosed tags cost
what one does); a turn longer than `MAX_TURN_CHARS` is one malformed call, and a turn reads at most `MAX_CALLS` calls
(one more is a malformed call).
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from align.tools.functions import PYTHON_TOOL
from rewards.fences import fences

MAX_TURN_CHARS = 1 << 20
MAX_CALLS = 16  # calls in one turn; one more is a malformed call and the rest of the turn is not read
_OPENERS = {False: re.compile(r"<tool_call>"), True: re.compile(r"<tool_call>|<code>")}
_CLOSERS = {"<tool_call>": "</tool_call>", "<code>": "</code>"}


@dataclass
class ToolCall:
    """One parsed call; `error` says why it is malformed (then name/arguments may be empty)."""

    name: str
    arguments: dict = field(default_factory=dict)
    error: str | None = None


def _outside_think(text: str) -> str:
    if "</think>" in text:
        return text.rsplit("</think>", 1)[1]
    return "" if "<think>" in text else text  # an unclosed think block: still reasoning


def _json_call(raw: str) -> ToolCall:
    try:
        obj: Any = json.loads(raw)
    except json.JSONDecodeError as e:
        return ToolCall("", error=f"the call is not valid JSON ({e.msg} at {e.pos})")
    except RecursionError:
        return ToolCall("", error="the call is not valid JSON (nested too deep)")
    if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
        return ToolCall("", error='a call is {"name": "<tool>", "arguments": {...}}')
    args = obj.get("arguments", obj.get("parameters", {}))
    if isinstance(args, str):  # OpenAI style: arguments as a JSON string
        try:
            args = json.loads(args)
        except (json.JSONDecodeError, RecursionError):
            pass
    if not isinstance(args, dict):
        return ToolCall(obj["name"], {}, "arguments must be a JSON object")
    return ToolCall(obj["name"], args)


def _unfenced(content: str) -> str:
    """A call's content as written, or the body of the one fenced block it is (```python ... ``` inside <code>)."""
    stripped = content.strip()
    if not (stripped.startswith(("```", "~~~")) and stripped.endswith(("```", "~~~"))):
        return content
    blocks = fences(stripped)
    return blocks[0].body if len(blocks) == 1 and blocks[0].closed else content


class _Lines:
    """Whether a position starts its line (only spaces before it, back to a line end or the end of a call), read
    forwards once: each question costs only the text since the last one."""

    _END = re.compile(r"[ \t\r]*(?:\n|$|<tool_call>|<code>)")

    def __init__(self, text: str):
        self.text, self.checked, self.clean = text, 0, True
        self.ends: dict[int, bool] = {}

    def starts(self, i: int) -> bool:
        t = self.text
        newline = t.rfind("\n", self.checked, i)
        if newline >= 0:
            self.clean = not t[newline + 1 : i].strip(" \t\r")
        else:
            self.clean = self.clean and not t[self.checked : i].strip(" \t\r")
        self.checked = i
        return self.clean

    def skip(self, i: int, clean: bool) -> None:
        """The text up to ``i`` was read: a call ended there (clean) or a tag of prose did."""
        self.checked, self.clean = i, clean

    def ends_line(self, i: int) -> bool:
        if i not in self.ends:
            self.ends[i] = self._END.match(self.text, i) is not None
        return self.ends[i]


def parse_tool_calls(text: str, python_tool: bool = False) -> list[ToolCall]:
    """Every call the turn makes, in order (malformed ones with their `error`); see the module docstring."""
    body = _outside_think(text)
    if len(body) > MAX_TURN_CHARS:
        return [ToolCall("", error=f"the turn is longer than {MAX_TURN_CHARS} characters: no call in it is read")]
    calls: list[ToolCall] = []
    lines, closes = _Lines(body), {}  # closes: where the next closing tag of each kind is (found once)
    pos = 0
    while (m := _OPENERS[python_tool].search(body, pos)) is not None:
        if len(calls) >= MAX_CALLS:
            calls.append(ToolCall("", error=f"more than {MAX_CALLS} calls in one turn: the rest are not read"))
            break
        tag, start = m.group(), m.end()
        closer = _CLOSERS[tag]
        if closes.get(closer, -1) < start:
            closes[closer] = body.find(closer, start)
            if closes[closer] < 0:
                closes[closer] = len(body) + 1  # none: every later opening of this tag is left open
        close = closes[closer]
        opened = close > len(body)
        if tag == "<code>" and not lines.starts(m.start()):
            lines.skip(start, False)  # inline markup in prose
            pos = start
            continue
        if opened:
            what = "<tool_call>" if tag == "<tool_call>" else "<code> block"
            name = "" if tag == "<tool_call>" else PYTHON_TOOL
            calls.append(ToolCall(name, error=f"a {what} was opened and not closed"))
            break
        end = close + len(closer)
        if tag == "<code>":
            if not lines.ends_line(end):  # text after </code> on its line: prose
                lines.skip(start, False)
                pos = start
                continue
            calls.append(ToolCall(PYTHON_TOOL, {"code": _unfenced(body[start:close]).strip("\r\n")}))
        else:
            calls.append(_json_call(_unfenced(body[start:close]).strip()))
        lines.skip(end, True)
        pos = end
    return calls


def tools_system_text(schemas: list[dict]) -> str:
    """The tool instructions put in the system turn for a chat template that renders no tools itself (SmolLM2's
    ChatML, this project's SmolLM3-style template): Hermes/SmolLM3's `xml_tools` wording."""
    listing = "\n".join(json.dumps(s["function"] if "function" in s else s) for s in schemas)
    return (
        "You can call tools. Their signatures, one per line:\n<tools>\n" + listing + "\n</tools>\n"
        'To call one, write <tool_call>{"name": <tool name>, "arguments": <arguments object>}</tool_call>; '
        "its result comes back in a tool message."
    )


def call_text(name: str, arguments: dict) -> str:
    """How an assistant turn writes a call (the inverse of `parse_tool_calls`), for SFT traces."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
