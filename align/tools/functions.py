"""Tools and environments: what a model may call, named in a recipe like a reward.

TRL's conventions (`GRPOTrainer(tools=..., environment_factory=...)`):
- a tool is a Python function with a type hint on every argument and a docstring with an `Args:` section; its
  JSON schema (what the model is shown) comes from the signature (`transformers.utils.get_json_schema`). A
  function without them is refused at start with one line naming the function and what is missing;
- an environment is a small class: `reset(row)` starts one rollout's state from its dataset row (the prompt, from
  the same row, holds the task), each public typed and documented method is a tool bound to that rollout's
  state, and an optional `reward()` scores the rollout at its end (the `environment_reward` reward reads it).

A recipe names tools by registry key (`calculator`, `python`, `search`) or dotted / file path
(`my_lab.tools:lookup`, `./tools.py:lookup`), environments by path (`my_lab.envs:Inventory`).

    from align.tools import load_tools
    tools = load_tools(["calculator", "my_lab.tools:lookup"])
    tools["calculator"].schema   # {"type": "function", "function": {"name": "calculator", ...}}
"""

from __future__ import annotations

import ast
import importlib
import inspect
import math
import operator
import random
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

from transformers.utils import get_json_schema

from rewards.checks import parse_source
from rewards.limits import SandboxLimits
from rewards.registry import _load_file_module
from rewards.sandbox import run_program

PYTHON_TOOL = "python"
JSON_TYPES = {
    "string": (str,),
    "integer": (int,),
    "number": (int, float),
    "boolean": (bool,),
    "array": (list, tuple),
    "object": (dict,),
    "null": (type(None),),
}


class ToolError(Exception):
    """A tool's own verdict that a call failed: raise it from a tool (a builtin, a user tool or an environment's
    method) and the call's status is ``error`` with this ``kind`` (why: ``empty``, ``exception``, ``timeout``, ...),
    never ``ok``; the model is shown the message as the tool's reply."""

    def __init__(self, message: str, kind: str = "error"):
        super().__init__(message)
        self.kind = kind


@dataclass
class Tool:
    """One callable tool: its name, the function, its JSON schema and where it came from (its spec)."""

    name: str
    func: Callable
    schema: dict
    spec: str

    @property
    def parameters(self) -> dict:
        return self.schema["function"].get("parameters", {})


def tool_from_function(func: Callable, spec: str | None = None, name: str | None = None) -> Tool:
    """A Tool from a typed, documented function; one clear line when it is not one."""
    label = spec or getattr(func, "__qualname__", repr(func))
    if not callable(func):
        raise ValueError(f"tool {label!r} is not a function; a tool is a typed Python function with a docstring")
    if not inspect.getdoc(func):
        raise ValueError(
            f"tool {label!r} has no docstring: write one line saying what it does, then an Args: "
            "section describing each argument (docs/tools.md)"
        )
    untyped = [
        p.name
        for p in inspect.signature(func).parameters.values()
        if p.name != "self"
        and p.annotation is inspect.Parameter.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if untyped:
        raise ValueError(
            f"tool {label!r}: arguments {untyped} have no type hints; the model is shown a JSON schema "
            "built from them (e.g. `def add(a: int, b: int) -> int`)"
        )
    try:
        schema = get_json_schema(func)
    except Exception as e:  # transformers' DocstringParsingException / TypeHintParsingException
        raise ValueError(f"tool {label!r}: {e} (docs/tools.md shows a tool transformers can describe)") from None
    if name:
        schema["function"]["name"] = name
    return Tool(schema["function"]["name"], func, schema, spec or schema["function"]["name"])


def resolve(spec: str, kind: str = "tool") -> Any:
    """A registry key, `module:attr` or `path/file.py:attr` -> the object."""
    if kind == "tool" and spec in TOOLS:
        return TOOLS[spec]
    if ":" not in spec:
        known = f" Registered tools: {sorted(TOOLS)}." if kind == "tool" else ""
        raise ValueError(
            f"unknown {kind} {spec!r}.{known} Name your own by dotted path ('my_lab.tools:lookup') or "
            "file path ('./tools.py:lookup')"
        )
    module_part, attr = spec.rsplit(":", 1)
    if module_part.endswith(".py") or "/" in module_part:
        module, _ = _load_file_module(module_part)
    else:
        try:
            module = importlib.import_module(module_part)
        except ModuleNotFoundError as e:
            raise ValueError(
                f"{kind} {spec!r}: cannot import {module_part!r} ({e}); put its directory on "
                "PYTHONPATH or name the file ('./tools.py:lookup')"
            ) from None
    if not hasattr(module, attr):
        raise ValueError(f"{kind} {spec!r}: {module_part!r} has no attribute {attr!r}")
    return getattr(module, attr)


def load_tools(specs: Iterable[str | Callable]) -> dict[str, Tool]:
    """Resolve and check every tool; two tools with one name are refused."""
    tools: dict[str, Tool] = {}
    for spec in specs or []:
        func = spec if callable(spec) else resolve(str(spec))
        tool = tool_from_function(func, spec=spec if isinstance(spec, str) else None)
        if tool.name in tools:
            raise ValueError(f"two tools are named {tool.name!r} ({tools[tool.name].spec}, {tool.spec}); rename one")
        tools[tool.name] = tool
    return tools


class Environment:
    """Base class of a tool environment (TRL's `environment_factory` shape). One instance per rollout.

    Subclass it: `reset(row)` sets the rollout's state from its dataset row; public methods with type hints and
    docstrings are the tools; `reward()` (optional) scores the rollout."""

    def reset(self, row: dict) -> str | None:  # noqa: ARG002 - a subclass reads the row
        return None


ENV_RESERVED = {"reset", "reward"}


def environment_tools(env_class: type) -> dict[str, Tool]:
    """The tools an environment class exposes (its public methods, checked like functions)."""
    if not (isinstance(env_class, type) and callable(getattr(env_class, "reset", None))):
        raise ValueError(
            f"environment {env_class!r} must be a class with a reset(row) method (align.tools.Environment)"
        )
    tools = {}
    for name, member in inspect.getmembers(env_class, inspect.isfunction):
        if name.startswith("_") or name in ENV_RESERVED:
            continue
        tools[name] = tool_from_function(member, spec=f"{env_class.__qualname__}.{name}", name=name)
    if not tools:
        raise ValueError(
            f"environment {env_class.__qualname__} has no tools: give it a public typed, documented method"
        )
    return tools


def check_arguments(tool: Tool, arguments: Any) -> str | None:
    """Why `arguments` do not fit the tool's schema (missing, unknown or wrongly typed), or None."""
    if not isinstance(arguments, dict):
        return f"arguments must be a JSON object, got {type(arguments).__name__}"
    props = tool.parameters.get("properties", {})
    missing = [k for k in tool.parameters.get("required", []) if k not in arguments]
    unknown = [k for k in arguments if k not in props]
    if missing or unknown:
        return "; ".join(
            filter(
                None,
                [
                    missing and f"missing arguments {missing}",
                    unknown and f"unknown arguments {unknown} (it takes {sorted(props)})",
                ],
            )
        )
    for key, value in arguments.items():
        wanted = props[key].get("type")
        types = wanted if isinstance(wanted, list) else [wanted] if wanted else []
        ok = not types or any(
            isinstance(value, JSON_TYPES.get(t, object))
            and not (t in ("integer", "number") and isinstance(value, bool))
            for t in types
        )
        if not ok:
            return f"argument {key!r} must be {'/'.join(types)}, got {type(value).__name__} {value!r:.40}"
    return None


# ----------------------------------------------------------------------------- builtin tools

_BINOPS = {
    ast.Add: operator.add,
    ast.Sub: operator.sub,
    ast.Mult: operator.mul,
    ast.Div: operator.truediv,
    ast.FloorDiv: operator.floordiv,
    ast.Mod: operator.mod,
    ast.Pow: operator.pow,
}
_UNOPS = {ast.UAdd: operator.pos, ast.USub: operator.neg}
MAX_DIGITS = 100  # a calculator result or operand beyond this is refused, not computed


def _evaluate(node: ast.AST) -> int | float:
    if isinstance(node, ast.Expression):
        return _evaluate(node.body)
    if isinstance(node, ast.Constant) and type(node.value) in (int, float):
        return node.value
    if isinstance(node, ast.UnaryOp) and type(node.op) in _UNOPS:
        return _UNOPS[type(node.op)](_evaluate(node.operand))
    if isinstance(node, ast.BinOp) and type(node.op) in _BINOPS:
        left, right = _evaluate(node.left), _evaluate(node.right)
        if isinstance(node.op, ast.Pow) and (abs(right) > 64 or abs(left) > 10**6):
            raise ValueError("exponent too large for the calculator")
        value = _BINOPS[type(node.op)](left, right)
        if isinstance(value, int) and abs(value) >= 10**MAX_DIGITS:
            raise ValueError(f"result has more than {MAX_DIGITS} digits")
        return value
    raise ValueError(f"not arithmetic: {ast.unparse(node)!r:.40} (numbers, + - * / // % ** and parentheses)")


def calculator(expression: str) -> str:
    """Evaluate an arithmetic expression exactly.

    Args:
        expression: Numbers with + - * / // % ** and parentheses, e.g. "48213 * 907 + 15".
    """
    if len(expression) > 500:
        raise ValueError("expression longer than 500 characters")
    value = _evaluate(parse_source(expression.replace("^", "**").replace("×", "*").replace(",", ""), mode="eval"))
    if isinstance(value, float):
        if not math.isfinite(value):
            raise ValueError("result is not a finite number")
        value = int(value) if value.is_integer() else round(value, 10)
    return str(value)


MAX_CODE_CHARS = 20_000  # a longer program is refused before it runs
PYTHON_LIMITS = SandboxLimits(wall_s=5.0, cpu_s=3, memory_mb=256, output_bytes=1 << 16)
# killed by a signal: SIGXCPU at the CPU limit; SIGKILL at the CPU hard limit or the memory cgroup's limit
_KILLED = {
    128 + 24: ("timeout", "the program ran out of CPU time"),
    128 + 9: ("killed", "the program was killed (it ran out of CPU time or memory)"),
}


def _printed(reason: str, out: str) -> str:
    return reason + (f"\nIt printed before that:\n{out}" if out.strip() else "")


def python(code: str) -> str:
    """Run a Python program and return what it printed.

    Args:
        code: A complete Python program; print the values you need. Standard library only, no files or network.
    """
    if not code.strip():
        raise ToolError("the code is empty: write a program that prints the values you need", "empty")
    if len(code) > MAX_CODE_CHARS:
        raise ToolError(f"the program is longer than {MAX_CODE_CHARS} characters", "too_long")
    try:
        tree = parse_source(code, "program.py")
    except (SyntaxError, ValueError, RecursionError, MemoryError) as e:  # ValueError: a null byte
        where = f" (line {e.lineno})" if getattr(e, "lineno", None) else ""
        raise ToolError(f"{type(e).__name__}: {getattr(e, 'msg', None) or e}{where}", "syntax_error") from None
    if not tree.body:
        raise ToolError("the code holds no statement (only comments): write a program that prints", "empty")
    result = run_program(code, limits=PYTHON_LIMITS)
    out = result.stdout[-2000:]
    if result.timed_out:
        raise ToolError(_printed(f"the program timed out after {PYTHON_LIMITS.wall_s:g} s", out), "timeout")
    if result.output_truncated:
        raise ToolError(f"the program printed more than {PYTHON_LIMITS.output_bytes} bytes", "output_cap")
    if not result.passed:
        err = result.stderr.strip().splitlines()
        last = err[-1] if err else ""
        if "Traceback (most recent call last)" in result.stderr:
            kind = "memory" if last.startswith("MemoryError") else "exception"
            raise ToolError(_printed(last, out), kind)
        kind, reason = _KILLED.get(result.returncode, ("exit", f"the program exited with status {result.returncode}"))
        raise ToolError(_printed(reason + (f": {last}" if last else ""), out), kind)
    if not out.strip():
        raise ToolError("the program printed nothing: print the values you need", "no_output")
    return out


# ----------------------------------------------------------------------------- the search tool's offline table
# Made-up places with four numbers each, fixed by a seed: no model has seen them, so a question about one is answered
# only by looking it up (data_gen/tool_tasks.py's `tool_lookup` family asks them).

_SYLLABLES = [
    "var",
    "nol",
    "kes",
    "tri",
    "bam",
    "dor",
    "quen",
    "lis",
    "mar",
    "zet",
    "hul",
    "pry",
    "sov",
    "ganth",
    "wel",
    "obr",
    "tesk",
    "fim",
    "rau",
    "dil",
]
FIELDS = ["population", "height in metres", "founding year", "number of bridges"]


def _table(seed: int = 1234, size: int = 240) -> list[dict]:
    """The offline reference table: made-up places with four numbers each (fixed by the seed)."""
    rng = random.Random(seed)
    names, rows = set(), []
    while len(rows) < size:
        name = "".join(rng.choice(_SYLLABLES) for _ in range(rng.choice((2, 3)))).capitalize()
        if name in names:
            continue
        names.add(name)
        rows.append(
            {
                "name": name,
                "population": rng.randint(1_000, 900_000),
                "height in metres": rng.randint(2, 2_900),
                "founding year": rng.randint(1100, 1990),
                "number of bridges": rng.randint(0, 90),
            }
        )
    return rows


TABLE = _table()


def _document(row: dict) -> str:
    return f"{row['name']}: " + "; ".join(f"{f} {row[f]}" for f in FIELDS)


def search_documents(query: str, k: int = 3) -> list[str]:
    """The `search` tool's index: the table's entries ranked by words shared with the query (names first)."""
    words = {w for w in re.findall(r"[a-z]+", query.lower()) if len(w) > 2}
    scored = []
    for row in TABLE:
        name_hit = row["name"].lower() in words
        overlap = len(words & set(re.findall(r"[a-z]+", _document(row).lower())))
        if name_hit or overlap:
            scored.append((not name_hit, -overlap, row["name"], _document(row)))
    return [doc for *_, doc in sorted(scored)[:k]] if any(not s[0] for s in scored) else []


def search(query: str) -> str:
    """Look a name up in the offline reference table and return the matching entries.

    Args:
        query: Words to look for, e.g. the name of a place or item.
    """
    if not query.strip():
        raise ToolError("the query is empty: name the place or item to look up", "empty")
    hits = search_documents(query, k=3)
    if not hits:
        raise ToolError("no entry matches", "no_result")
    return "\n".join(hits)


TOOLS: dict[str, Callable] = {"calculator": calculator, PYTHON_TOOL: python, "search": search}
