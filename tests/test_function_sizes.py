"""Function sizes follow responsibility: a function or method longer than `MAX_LINES` lines (its docstring
included) says in its docstring why it is one unit, on a line with "Long because ...". A reader who meets a long
function then knows whether it is one sequence of steps or several jobs waiting to be split."""

import ast
import re
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
CODE_DIRS = ("align", "pretrain", "rewards", "data_gen", "scripts")
MAX_LINES = 80
REASON = re.compile(r"long because", re.IGNORECASE)


def long_functions_without_a_reason(source: str, name: str) -> list[str]:
    """`name:line: function (N lines)` for each function or method of `source` over MAX_LINES lines whose docstring
    has no line saying "Long because"."""
    out = []
    for node in ast.walk(ast.parse(source, name)):
        if not isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            continue
        length = node.end_lineno - node.lineno + 1
        doc = ast.get_docstring(node) or ""
        if length > MAX_LINES and not any(REASON.search(line) for line in doc.splitlines()):
            out.append(f"{name}:{node.lineno}: {node.name} ({length} lines)")
    return out


@pytest.mark.parametrize(
    ("body_lines", "doc", "flagged"),
    [
        (MAX_LINES - 2, "Short.", False),  # def line + docstring line + body = MAX_LINES: at the limit
        (MAX_LINES - 1, "Short.", True),
        (MAX_LINES, "Steps in order.\n\n    Long because each step reads the one before.", False),
        (MAX_LINES, "LONG BECAUSE it is one loop.", False),
        (MAX_LINES, "Why it is long: nobody said.", True),
    ],
)
def test_the_rule_on_made_up_functions(body_lines, doc, flagged):
    source = f'def f():\n    """{doc}"""\n' + "    x = 1\n" * body_lines
    assert bool(long_functions_without_a_reason(source, "made_up.py")) == flagged


def test_a_long_method_is_measured_too():
    source = "class C:\n    def m(self):\n" + "        x = 1\n" * MAX_LINES
    assert long_functions_without_a_reason(source, "made_up.py") == [f"made_up.py:2: m ({MAX_LINES + 1} lines)"]


def test_every_long_function_says_why_it_is_long():
    offenders = []
    for d in CODE_DIRS:
        for path in sorted((ROOT / d).rglob("*.py")):
            offenders += long_functions_without_a_reason(path.read_text(encoding="utf-8"), str(path.relative_to(ROOT)))
    assert not offenders, (
        f"functions over {MAX_LINES} lines without a 'Long because ...' line in their docstring (split them into "
        "named steps, or say why they are one unit):\n" + "\n".join(offenders)
    )
