"""User-facing text describes the software, not the history of its making.

README.md, docs/ outside docs/research/ (which holds the research record), recipes/ and the code (align/, rewards/,
pretrain/, data_gen/, scripts/) must not name a numbered chain, design, try or red-team round, a work-log session,
an issue or pull request, a commit, or a date. What counts as text is decided per kind of file:

- markdown: every line outside code blocks, with code spans and link targets left out (a command or an address
  is not prose; the page a link leads to is checked on its own);
- YAML and Slurm files: comments and values alike (a recipe names no history in its values either);
- Python: comments, docstrings and string literals, with ``code`` spans left out. Commits and dates are looked
  for in comments and docstrings only, so that a digest, a hex constant or a date the code computes or compares
  is never read as history;
- a pipeline report the code writes (docs/tiny_demo/) names its run, commit and time in its provenance line
  (``Run `...`, git `<hash>`, updated <time>``): that line is the software's output and is not read.
"""

from __future__ import annotations

import ast
import io
import re
import tokenize
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
CODE_DIRS = ("align", "rewards", "pretrain", "data_gen", "scripts")
RESEARCH = ROOT / "docs" / "research"

_ORDINAL = (
    r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
    r"|fourteenth|fifteenth|sixteenth|seventeenth|eighteenth|nineteenth|twentieth|\d+(?:st|nd|rd|th))"
)
# Phrases that number the project's own history; none has a reason to be in a user guide.
HISTORY = re.compile(
    "|".join(
        (
            # "the twelfth chain", "third design"
            rf"\b{_ORDINAL}\s+(?:chain|design|try|red[- ]team(?:\s+round)?)s?\b",
            r"\b(?:chain|design|try|tries)s?\s+(?:#?\d+|(?-i:[A-H]))\b",  # "chain 8", "design 9", "design E"
            r"\bred[- ]team(?:ing)?\s*,?\s+(?:round|pass)\s*\d+",  # "red-team round 3"
            r"\bround\s*\d+\s+(?:of\s+the\s+)?red[- ]team",  # "round 2 red team"
            r"\bsessions?\s+#?\d+",  # "session 47"
            r"\b(?:issues?|PRs?|pull\s+requests?)\s+#?\d+",  # "issue 36", "PR 12"
            r"(?<![\w/&#])(?-i:(?<![A-Z]{2} ))#\d{1,5}\b(?![-\w])",  # "#36", but "UTS #39" is a standard
        )
    ),
    re.IGNORECASE,
)
# 7 to 40 hex digits, at least one a digit and one a letter: neither a number nor an English word.
COMMIT = re.compile(r"(?<![\w.\-/])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w\-])")
DATE = re.compile(r"\b20\d\d-[01]\d-[0-3]\d\b")
REPORT_PROVENANCE = re.compile(r"^Run `[^`]+`, git `[0-9a-f]+`, updated ")

# (line number, text, whether the text is prose: commits and dates are looked for in prose only)
Text = list[tuple[int, str, bool]]


def user_files() -> list[Path]:
    """Every user-facing file: README.md, docs/ outside docs/research/, recipes/, the code."""
    files = [ROOT / "README.md"]
    files += [p for p in (ROOT / "docs").rglob("*.md") if RESEARCH not in p.parents]
    files += [p for p in (ROOT / "recipes").rglob("*") if p.suffix in (".md", ".yaml", ".yml", ".slurm")]
    for d in CODE_DIRS:
        files += (ROOT / d).rglob("*.py")
    return sorted(set(files))


def markdown_text(text: str) -> Text:
    out, fence = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if re.match(r"\s*(```|~~~)", line):
            fence = not fence
        elif not fence and not REPORT_PROVENANCE.match(line):
            line = re.sub(r"(`+).*?\1", "", line)  # code spans
            line = re.sub(r"\]\([^)]*\)", "]", line)  # link targets
            out.append((n, line, True))
    return out


def config_text(text: str) -> Text:
    return [(n, line, True) for n, line in enumerate(text.splitlines(), 1)]


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)) and node.body:
            first = node.body[0]
            if (
                isinstance(first, ast.Expr)
                and isinstance(first.value, ast.Constant)
                and isinstance(first.value.value, str)
            ):
                lines.update(range(first.lineno, first.end_lineno + 1))
    return lines


def python_text(text: str) -> Text:
    docstrings = _docstring_lines(ast.parse(text))
    strings = {tokenize.STRING, getattr(tokenize, "FSTRING_MIDDLE", tokenize.STRING)}
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], re.sub(r"(`+).*?\1", "", tok.string), True))
        elif tok.type in strings:
            for i, line in enumerate(tok.string.splitlines()):
                n = tok.start[0] + i
                out.append((n, re.sub(r"(`+).*?\1", "", line), n in docstrings))
    return out


def history_mentions(path: Path, text: str | None = None) -> list[str]:
    """Each place in one user-facing file that names the project's history, as 'path:line: what'."""
    text = path.read_text(encoding="utf-8") if text is None else text
    reader = {".md": markdown_text, ".py": python_text}.get(path.suffix, config_text)
    found = []
    for n, line, prose in reader(text):
        hits = [m.group(0) for m in HISTORY.finditer(line)]
        if prose:
            hits += [m.group(0) for m in COMMIT.finditer(line)] + [m.group(0) for m in DATE.finditer(line)]
        if hits:
            found.append(
                f"{path.relative_to(ROOT) if path.is_relative_to(ROOT) else path.name}:{n}: {', '.join(hits)}"
            )
    return found


@pytest.mark.parametrize(
    ("line", "names_history"),
    [
        ("From the twelfth chain's APO model", True),
        ("design 9 kept 80 steps; design E too", True),
        ("designs 5-7 and chains 4 and 6", True),
        ("the third design (a recipe)", True),
        ("tries 5 and 7", True),
        ("round 2 red team found", True),
        ("What a verifier must never do (red team, round 2)", True),
        ("the recipe from session 43 to 46", True),
        ("Two rounds (issue 36; see there)", True),
        ("fixed in #36.", True),
        ("at 8c9707d the loss fell", True),
        ("measured on 2026-11-28", True),
        ("the chain of stages runs SFT then APO", False),
        ("round 2 samples from round 1's model", False),
        ("a sha256 digest of the file", False),
        ("learning rates 1e-5 and 3e-5, 20261128 rows", False),
        ("see [the install](#1-install) and [a chain](research/chain_20261128/README.md#2026-11-28-session-3)", False),
        ("a defaced facade", False),
        ("try 2e-5 first", False),
        ("try a smaller learning rate, or design a recipe of your own", False),
        ("Unicode's confusables (UTS #39) and word boundaries (UAX #29)", False),
        ("run `git checkout 8c9707d` by hand", False),
        ("Run `tiny-20261125-113727`, git `4df5797aab`, updated 2026-11-25T11:53:27.", False),
    ],
)
def test_markdown_prose(tmp_path: Path, line: str, names_history: bool) -> None:
    assert bool(history_mentions(tmp_path / "page.md", line + "\n")) == names_history


def test_python_reads_commits_and_dates_in_comments_and_docstrings_only(tmp_path: Path) -> None:
    src = tmp_path / "mod.py"
    code = '"""Docs."""\nDIGEST = "9f86d081884c7d65"  # a known digest\nSINCE = "2026-11-28"\n'
    assert history_mentions(src, code) == []
    code = '"""Fixed at 8c9707d."""\nX = 1  # since e0de595, 2026-11-28\n'
    assert history_mentions(src, code) == ["mod.py:1: 8c9707d", "mod.py:2: e0de595, 2026-11-28"]
    code = 'def f():\n    """Keys repeat as ``#2``."""\n    raise ValueError("see issue 23")\n'
    assert history_mentions(src, code) == ["mod.py:3: issue 23"]


def test_recipe_comments(tmp_path: Path) -> None:
    text = "# design 7's learning rate (the ninth chain)\nlearning_rate: 3.0e-5\n"
    assert history_mentions(tmp_path / "r.yaml", text) == ["r.yaml:1: design 7, ninth chain"]


def test_user_facing_text_names_no_history() -> None:
    found = [hit for path in user_files() for hit in history_mentions(path)]
    assert not found, (
        "user-facing text names the project's history; say what the software does and why, and "
        "move the record to docs/research/:\n" + "\n".join(found)
    )
