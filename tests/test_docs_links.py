"""Every relative link in the docs resolves: README.md, docs/**/*.md and recipes/**/README.md.

A link names a file or folder of the repository (relative to the page) and, for a markdown page, optionally a
heading of it: `#anchor` must be the GitHub slug of one of the target's headings (or an explicit `<a id=...>`).
Links inside code blocks and code spans are commands, not links; `http(s):` and `mailto:` links are not checked.
"""

from __future__ import annotations

import re
from functools import cache
from pathlib import Path
from urllib.parse import unquote

import pytest

ROOT = Path(__file__).resolve().parents[1]

INLINE = re.compile(r"!?\[(?:[^\[\]]|\[[^\]]*\])*\]\(\s*<?([^)\s>]+)>?(?:\s+\"[^\"]*\")?\s*\)")
REFERENCE = re.compile(r"^\s{0,3}\[[^\]]+\]:\s+<?(\S+?)>?(?:\s+\"[^\"]*\")?\s*$")
HTML_ANCHOR = re.compile(r"<a\s+(?:name|id)=\"([^\"]+)\"")


def pages() -> list[Path]:
    found = [ROOT / "README.md", *(ROOT / "docs").rglob("*.md"), *(ROOT / "recipes").rglob("README.md")]
    return sorted(p for p in set(found) if p.is_file())


def _prose_lines(text: str) -> list[tuple[int, str]]:
    """Each line outside fenced code blocks, with its code spans blanked."""
    lines, fence = [], None
    for n, line in enumerate(text.splitlines(), 1):
        marker = re.match(r"\s*(```+|~~~+)", line)
        if marker:
            if fence is None:
                fence = marker.group(1)[:3]
            elif marker.group(1).startswith(fence):
                fence = None
            continue
        if fence is None:
            lines.append((n, re.sub(r"(`+).*?\1", "", line)))
    return lines


def slug(heading: str) -> str:
    """GitHub's anchor for a heading: its text lower-cased, punctuation but `-` and `_` dropped, spaces as `-`."""
    text = re.sub(r"!?\[([^\]]*)\]\([^)]*\)", r"\1", heading)  # a link in a heading keeps its text
    text = re.sub(r"<[^>]+>", "", text).strip().lower()
    return re.sub(r"[^\w\- ]", "", text).replace(" ", "-")


@cache
def anchors(page: Path) -> frozenset[str]:
    text = page.read_text(encoding="utf-8")
    seen: dict[str, int] = {}
    out = set(HTML_ANCHOR.findall(text))
    fence = False
    for line in text.splitlines():
        if re.match(r"\s*(```|~~~)", line):
            fence = not fence
            continue
        heading = re.match(r"#{1,6}\s+(.*?)\s*#*\s*$", line)
        if fence or not heading:
            continue
        base = slug(heading.group(1))
        n = seen.get(base, 0)
        seen[base] = n + 1
        out.add(base if n == 0 else f"{base}-{n}")
    return frozenset(out)


def links(page: Path) -> list[tuple[int, str]]:
    out = []
    for n, line in _prose_lines(page.read_text(encoding="utf-8")):
        out += [(n, m.group(1)) for m in INLINE.finditer(line)]
        ref = REFERENCE.match(line)
        if ref:
            out.append((n, ref.group(1)))
    return out


def broken(page: Path, target: str) -> str | None:
    """Why a link does not resolve, or None when it does."""
    if re.match(r"[a-z][a-z0-9+.-]*:", target, re.IGNORECASE):  # http:, https:, mailto:
        return None
    path, _, anchor = target.partition("#")
    dest = (page.parent / unquote(path)).resolve() if path else page
    if ROOT not in (dest, *dest.parents):
        return "points outside the repository"
    if not dest.exists():
        return "no such file"
    if anchor and dest.suffix == ".md" and unquote(anchor).lower() not in anchors(dest):
        return f"no heading #{anchor} in {dest.relative_to(ROOT)}"
    return None


def test_every_relative_link_resolves() -> None:
    bad = [
        f"{page.relative_to(ROOT)}:{n}: ({target}) {why}"
        for page in pages()
        for n, target in links(page)
        if (why := broken(page, target))
    ]
    assert not bad, "broken links:\n" + "\n".join(bad)


@pytest.mark.parametrize(
    ("heading", "anchor"),
    [
        ("The embedded default (`make demo`), stage by stage", "the-embedded-default-make-demo-stage-by-stage"),
        ("Ablations (`scripts/ablate.py`)", "ablations-scriptsablatepy"),
        ("Replay rows: an NLL anchor beside the rewards", "replay-rows-an-nll-anchor-beside-the-rewards"),
        ("Tokenizer report", "tokenizer-report"),
        ("[GRPO](grpo.md) on the tiny model", "grpo-on-the-tiny-model"),
        ("Format, length and repetition: what each accepts", "format-length-and-repetition-what-each-accepts"),
    ],
)
def test_slug_is_githubs(heading: str, anchor: str) -> None:
    assert slug(heading) == anchor


def test_a_broken_link_is_found(tmp_path: Path) -> None:
    page = ROOT / "docs" / "cli.md"
    assert broken(page, "no_such_page.md") == "no such file"
    assert broken(page, "cli.md#no-such-heading").startswith("no heading")
    assert broken(page, "../README.md") is None
    assert broken(page, "https://example.com/x.md") is None
    assert links_in(tmp_path, "see [a](b.md) and `[c](d.md)`\n```\n[e](f.md)\n```\n[g]: h.md\n") == ["b.md", "h.md"]


def links_in(tmp_path: Path, text: str) -> list[str]:
    page = tmp_path / "page.md"
    page.write_text(text)
    return [target for _, target in links(page)]
