"""What a recipe file says about itself: the command in its header, its scale, its purpose.

Every recipe under recipes/ starts with a comment block whose first line is the command that runs it
(`# python scripts/sft.py recipes/tiny/sft.yaml`, `# accelerate launch ... scripts/grpo.py ...` or
`# smolalign sft ...`). From that block and the file's place this module reads, without importing any stage:

- the commands the header names (`header_commands`): script stems (`sft`, `run_pretrain`) or `smolalign` command
  names, in order; align/commands.py maps them to its command names;
- the scale (`scale_of`): the first folder under recipes/, or else the file name's first `_` part, that is one of
  SCALES (`recipes/tiny/sft.yaml` and `recipes/ablations/tiny_preference.yaml` are both tiny);
- the purpose (`purpose_of`): a header line `# purpose: <one line>` (every shipped recipe's second line), else the
  first clause of the header's prose (the lines after the command line, up to a blank comment line), clipped to
  PURPOSE_WIDTH characters;
- the kind: a recipe of a stage, an accelerate config (a YAML mapping with `distributed_type`, accelerate's own
  key) or a launch template (a shell file such as a Slurm script).

`smolalign recipes` (align/commands.py) lists them; scripts/preflight.py finds a recipe's stage script here.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from pathlib import Path

import yaml

SCALES = ("tiny", "micro", "smol135m", "smollm3")
RECIPE_SUFFIXES = (".yaml", ".yml")
TEMPLATE_SUFFIXES = (".slurm", ".sh")  # launch templates: listed, never parsed as a recipe
PURPOSE_WIDTH = 100
PURPOSE_TAG = "purpose:"

_COMMAND_RE = re.compile(r"scripts/(\w+)\.py|\bsmolalign\s+(\w+)")


@dataclass(frozen=True)
class RecipeFile:
    path: Path
    kind: str  # "recipe", "accelerate" (a launch config) or the template's suffix ("slurm")
    commands: tuple[tuple[str, str], ...]  # what the header names: ("script", stem) or ("smolalign", name)
    scale: str  # one of SCALES, or "" when neither the folders nor the name say
    purpose: str


def header(path: Path) -> list[str]:
    """The leading comment block's lines, without their '#' (a shebang line is skipped)."""
    lines = []
    for line in path.read_text(errors="replace").splitlines():
        stripped = line.strip()
        if not stripped.startswith("#"):
            break
        if not stripped.startswith("#!"):
            lines.append(stripped[1:].strip())
    return lines


def header_commands(lines: list[str]) -> tuple[tuple[str, str], ...]:
    """What the header runs, in order: ("script", stem) for `scripts/<stem>.py`, ("smolalign", word) for
    `smolalign <word>` (a word that is no command is prose, and align/commands.py skips it)."""
    return tuple(
        ("script", script) if script else ("smolalign", command)
        for line in lines
        for script, command in _COMMAND_RE.findall(line)
    )


def scale_of(path: Path, root: Path) -> str:
    """The first folder under `root`, or else the name's first `_` part, that is a scale."""
    folders = path.relative_to(root).parts[:-1]
    for word in (*folders, path.stem.split("_")[0]):
        if word in SCALES:
            return word
    return ""


def first_clause(text: str, width: int = PURPOSE_WIDTH) -> str:
    """Text up to the first '. ', '; ' or ': ' outside brackets (a ': ' only after four words), clipped to `width`
    at a word boundary with '…'. One pass over the text."""
    depth, words, end = 0, 0, len(text)
    for i, ch in enumerate(text):
        if ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth = max(0, depth - 1)
        elif ch == " ":
            words += 1
        at_break = i + 1 == len(text) or text[i + 1] == " "
        if depth == 0 and at_break and (ch in ".;" or (ch == ":" and words >= 4)):
            end = i
            break
    clause = text[:end].strip()
    if len(clause) <= width:
        return clause
    cut = clause.rfind(" ", 0, width)
    return clause[: cut if cut > 0 else width].rstrip(" ,") + "…"


def purpose_of(lines: list[str]) -> str:
    """The `# purpose:` line, or else the first clause of the prose after the header's first line (its command)."""
    for line in lines:
        if line.lower().startswith(PURPOSE_TAG):
            return line[len(PURPOSE_TAG) :].strip()
    prose: list[str] = []
    for line in lines[1:]:  # the first line is the command that runs the file
        if not line:  # a blank comment line ends the header's first paragraph
            break
        prose.append(line)
    return first_clause(" ".join(prose))


def is_accelerate_config(path: Path) -> bool:
    try:
        data = yaml.safe_load(path.read_text())
    except yaml.YAMLError:
        return False
    return isinstance(data, dict) and "distributed_type" in data


def read(path: Path, root: Path) -> RecipeFile:
    lines = header(path)
    if path.suffix in TEMPLATE_SUFFIXES:
        kind = path.suffix[1:]
    else:
        kind = "accelerate" if is_accelerate_config(path) else "recipe"
    return RecipeFile(path, kind, header_commands(lines), scale_of(path, root), purpose_of(lines))


def find(root: Path) -> list[RecipeFile]:
    """Every recipe, accelerate config and launch template under `root`, recursively, sorted by path."""
    suffixes = RECIPE_SUFFIXES + TEMPLATE_SUFFIXES
    return [read(p, root) for p in sorted(root.rglob("*")) if p.is_file() and p.suffix in suffixes]
