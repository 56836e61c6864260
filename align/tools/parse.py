"""Tool calls out of a model's turn, and the text that shows the model its tools.

Formats read (both are what SmolLM3's template asks for, the first also Hermes/Qwen's):
- `<tool_call>{"name": "calculator", "arguments": {"expression": "2+2"}}</tool_call>` (one or more per turn);
- `<code>print(2 + 2)</code>`: a call of the `python` tool (SmolLM3's `python_tools`), when that tool is offered.
Text inside the turn's think block is reasoning, not a call. A `<tool_call>` that is not a JSON object with a
string `name` and an object `arguments`, or one left open, is a malformed call: it is answered with a tool
message saying so (and counted), never dropped in silence.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from typing import Any

from align.tools.functions import PYTHON_TOOL

_CALL_RE = re.compile(r"<tool_call>(.*?)(</tool_call>|$)", re.S)
_CODE_RE = re.compile(r"<code>(.*?)(</code>|$)", re.S)


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


def parse_tool_calls(text: str, python_tool: bool = False) -> list[ToolCall]:
    """Every call the turn makes, in order (malformed ones with their `error`)."""
    body = _outside_think(text)
    calls: list[tuple[int, ToolCall]] = []
    for m in _CALL_RE.finditer(body):
        raw, closed = m.group(1).strip(), bool(m.group(2))
        if not closed:
            calls.append((m.start(), ToolCall("", error="a <tool_call> was opened and not closed")))
            continue
        try:
            obj: Any = json.loads(raw)
        except json.JSONDecodeError as e:
            calls.append((m.start(), ToolCall("", error=f"the call is not valid JSON ({e.msg} at {e.pos})")))
            continue
        if not isinstance(obj, dict) or not isinstance(obj.get("name"), str):
            calls.append((m.start(), ToolCall("", error='a call is {"name": "<tool>", "arguments": {...}}')))
            continue
        args = obj.get("arguments", obj.get("parameters", {}))
        if isinstance(args, str):  # OpenAI style: arguments as a JSON string
            try:
                args = json.loads(args)
            except json.JSONDecodeError:
                pass
        calls.append((m.start(), ToolCall(obj["name"], args if isinstance(args, dict) else {},
                                          None if isinstance(args, dict) else "arguments must be a JSON object")))
    if python_tool:
        for m in _CODE_RE.finditer(body):
            if not m.group(2):
                calls.append((m.start(), ToolCall(PYTHON_TOOL, error="a <code> block was opened and not closed")))
            else:
                calls.append((m.start(), ToolCall(PYTHON_TOOL, {"code": m.group(1).strip("\n")})))
    return [c for _, c in sorted(calls, key=lambda x: x[0])]


def tools_system_text(schemas: list[dict]) -> str:
    """The tool instructions put in the system turn for a chat template that renders no tools itself (SmolLM2's
    ChatML, this project's SmolLM3-style template): Hermes/SmolLM3's `xml_tools` wording."""
    listing = "\n".join(json.dumps(s["function"] if "function" in s else s) for s in schemas)
    return ("You can call tools. Their signatures, one per line:\n<tools>\n" + listing + "\n</tools>\n"
            'To call one, write <tool_call>{"name": <tool name>, "arguments": <arguments object>}</tool_call>; '
            "its result comes back in a tool message.")


def call_text(name: str, arguments: dict) -> str:
    """How an assistant turn writes a call (the inverse of `parse_tool_calls`), for SFT traces."""
    return "<tool_call>" + json.dumps({"name": name, "arguments": arguments}) + "</tool_call>"
