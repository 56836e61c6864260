"""User-facing text describes the software, not the history of its making.

README.md, docs/ (outside docs/research/, which holds the research record), recipes/ and the comments, docstrings
and strings of the code (align/, rewards/, pretrain/, data_gen/, scripts/) must not name a numbered chain, design,
try or red-team round, a work-log session, an issue, or a commit. The rule is one allow-list per kind of text:

- prose (markdown, YAML comments, Python comments and string literals) is searched for the words;
- a commit hash is searched for only where prose is: in markdown outside code spans, in YAML and Python comments
  and in Python docstrings, so a digest or hex constant that the code computes or compares is never read as one;
- a pipeline report that the code writes (docs/tiny_demo/) names the commit of its run in its provenance line
  (`Run ..., git <hash>, updated ...`), which is the software's output and stays.
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

_ORDINAL = (r"(?:first|second|third|fourth|fifth|sixth|seventh|eighth|ninth|tenth|eleventh|twelfth|thirteenth"
            r"|fourteenth|fifteenth|\d+(?:st|nd|rd|th))")
# Words that number the project's own history. Each is a phrase a user guide has no reason to write.
HISTORY = re.compile(
    "|".join((
        rf"\b{_ORDINAL}\s+(?:chain|design|try|red[- ]team(?:\s+round)?)s?\b",   # "the twelfth chain", "third design"
        r"\b(?:chain|design|try|tries)s?\s+(?:#?\d+|[A-H])\b(?![-.]\w)",         # "chain 8", "design 9", "design E"
        r"\bred[- ]team(?:ing)?\s+(?:round|pass)\s*\d+",                          # "red-team round 3"
        r"\bround\s*\d+\s+(?:of\s+the\s+)?red[- ]team",                           # "round 2 red team"
        r"\bsessions?\s+#?\d+",                                                   # "session 47"
        r"\b(?:issues?|PRs?|pull requests?)\s+#?\d+",                             # "issue 36", "PR 12"
        r"(?<![\w/&\]\(])#\d{1,5}\b(?![-\w])",                                    # "#36" in prose
    )),
    re.IGNORECASE,
)
# 7 to 40 hex digits with at least one digit and one letter: a number or an English word is not a commit.
COMMIT = re.compile(r"(?<![\w.])(?=[0-9a-f]*[a-f])(?=[0-9a-f]*[0-9])[0-9a-f]{7,40}(?![\w])")
REPORT_PROVENANCE = re.compile(r"^Run `[^`]+`, git `[0-9a-f]+`")


def _user_files() -> list[Path]:
    files = [ROOT / "README.md"]
    files += [p for p in (ROOT / "docs").rglob("*.md") if RESEARCH not in p.parents]
    files += sorted((ROOT / "recipes").rglob("*.md")) + sorted((ROOT / "recipes").rglob("*.yaml"))
    files += sorted((ROOT / "recipes").rglob("*.slurm"))
    for d in CODE_DIRS:
        files += sorted((ROOT / d).rglob("*.py"))
    return sorted(set(files))


def _markdown_prose(text: str) -> list[tuple[int, str, bool]]:
    """(line number, line, whether commits count) for each line; code blocks and spans hold commands, not prose."""
    out, fence = [], False
    for n, line in enumerate(text.splitlines(), 1):
        if line.lstrip().startswith(("```", "~~~")):
            fence = not fence
            continue
        if fence:
            continue
        prose = re.sub(r"`[^`]*`", "``", line)
        out.append((n, line if REPORT_PROVENANCE.match(line) else prose, not REPORT_PROVENANCE.match(line)))
    return out


def _yaml_prose(text: str) -> list[tuple[int, str, bool]]:
    """Every comment of a recipe (and a value's text is prose too: a recipe names no history in its values)."""
    return [(n, line, "#" in line) for n, line in enumerate(text.splitlines(), 1)]


def _docstring_lines(tree: ast.AST) -> set[int]:
    lines: set[int] = set()
    for node in ast.walk(tree):
        if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
            body = getattr(node, "body", [])
            if body and isinstance(body[0], ast.Expr) and isinstance(body[0].value, ast.Constant) \
                    and isinstance(body[0].value.value, str):
                lines.update(range(body[0].lineno, body[0].end_lineno + 1))
    return lines


def _python_prose(text: str) -> list[tuple[int, str, bool]]:
    """Comments and string literals; commits count in comments and docstrings only (a literal may be a digest)."""
    docstrings = _docstring_lines(ast.parse(text))
    out = []
    for tok in tokenize.generate_tokens(io.StringIO(text).readline):
        if tok.type == tokenize.COMMENT:
            out.append((tok.start[0], tok.string, True))
        elif tok.type == tokenize.STRING or tok.type == getattr(tokenize, "FSTRING_MIDDLE", -1):
            for i, line in enumerate(tok.string.splitlines()):
                n = tok.start[0] + i
                out.append((n, line, n in docstrings))
    return out


def history_mentions(path: Path) -> list[str]:
    """Each place in one user-facing file that names the project's history, as 'path:line: text'."""
    text = path.read_text(encoding="utf-8")
    if path.suffix == ".md":
        prose = _markdown_prose(text)
    elif path.suffix == ".py":
        prose = _python_prose(text)
    else:
        prose = _yaml_prose(text)
    found = []
    for n, line, commits_count in prose:
        hits = [m.group(0) for m in HISTORY.finditer(line)]
        if commits_count:
            hits += [m.group(0) for m in COMMIT.finditer(line)]
        if hits:
            found.append(f"{path.relative_to(ROOT)}:{n}: {', '.join(hits)}")
    return found


@pytest.mark.parametrize(("line", "hits"), [
    ("From the twelfth chain's APO model", True),
    ("design 9 kept 80 steps; design E too", True),
    ("the third design (docs/...)", True),
    ("tries 5 and 7", True),
    ("round 2 red team found", True),
    ("red-team round 3", True),
    ("the recipe from session 43 to 46", True),
    ("Two rounds (issue 36; ...)", True),
    ("fixed in #36.", True),
    ("at 8c9707d the loss fell", True),
    ("the chain of stages runs SFT then APO", False),
    ("round 2 samples from round 1's model", False),
    ("a sha256 digest of the file", False),
    ("steps 1e-5 and 20261128", False),
    ("see [the install](#1-install)", False),
    ("a defaced facade", False),
    ("try 2e-5 first", False),
])
def test_history_patterns(tmp_path: Path, line: str, hits: bool) -> None:
    doc = tmp_path / "doc.md"
    doc.write_text(line + "\n")
    assert bool(history_mentions_in(doc)) == hits


def history_mentions_in(path: Path) -> list[str]:
    text = path.read_text(encoding="utf-8")
    return [line for _, line, commits in _markdown_prose(text)
            if HISTORY.search(line) or (commits and COMMIT.search(line))]


def test_code_literals_are_not_commits(tmp_path: Path) -> None:
    """A hex constant in code is data; the same hash in a comment or docstring is history."""
    src = tmp_path / "mod.py"
    src.write_text('"""Docs."""\nDIGEST = "9f86d081884c7d65"  # a known digest\n')
    assert not _python_prose_hits(src)
    src.write_text('"""Fixed at 8c9707d."""\nX = 1  # since e0de595\n')
    assert len(_python_prose_hits(src)) == 2


def _python_prose_hits(path: Path) -> list[tuple[int, str, bool]]:
    return [(n, s, c) for n, s, c in _python_prose(path.read_text())
            if HISTORY.search(s) or (c and COMMIT.search(s))]


def test_user_facing_text_names_no_history() -> None:
    found = [hit for path in _user_files() for hit in history_mentions(path)]
    assert not found, "user-facing text names the project's history (move it to docs/research/):\n" + "\n".join(found)
