"""Every command the user docs show runs as written: its make target, script, recipe files and flags exist.

The README, docs/*.md and the recipe folders' READMEs are read (docs/research/ is the record of what ran, with the
commands of then). A command is a line of a ```bash / ```sh / ```console block (continuation lines joined, comments
dropped, `&&`/`;`/`|` split) or an inline code span, that starts with `make`, `smolalign`, `python scripts/...`,
`python -m align.commands` or `accelerate launch`. For each one:

- `make T`: T is a target of the Makefile;
- a stage (`smolalign sft ...`, `python scripts/sft.py ...`, under `accelerate launch` too): the script exists, every
  path under recipes/ it names exists, and every `--flag` is a key of the script's configs (its CONFIG_TYPES, aliases
  included) or, for a command that launches ranks, an option of `accelerate launch` (align.commands.split_launch:
  the split the command itself makes);
- `accelerate launch`: its own options are accelerate's, and what follows is a stage as above.

Placeholders (`<model dir>`, `$RANK`, `RECIPE.yaml`) are values, never checked; flags next to them are.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import pytest

from align import commands
from align.cli import _check_cli_keys

ROOT = Path(__file__).resolve().parents[1]
DOCS = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md")), *sorted((ROOT / "recipes").glob("*/README.md"))]
HEADS = ("make", "smolalign", "python", "python3", "accelerate")
_FENCE = re.compile(r"^```(\w*)\n(.*?)^```", re.S | re.M)
_SPAN = re.compile(r"`([^`\n]+)`")
_SHELL = {"bash", "sh", "shell", "console"}


def doc_commands(text: str) -> list[str]:
    """The commands in a markdown text (see the module doc), in order."""
    found = []
    for lang, body in _FENCE.findall(text):
        if lang in _SHELL:
            joined = re.sub(r"\\\n\s*", " ", body)
            found += [line.strip().removeprefix("$ ") for line in joined.splitlines()]
    prose = _FENCE.sub("", text)
    found += [m.group(1).strip() for m in _SPAN.finditer(prose)]
    out = []
    for line in found:
        try:
            tokens = shlex.split(line, comments=True)
        except ValueError:  # an unbalanced quote: not a command line
            continue
        part: list[str] = []
        for token in [*tokens, "&&"]:
            if token in ("&&", ";", "|", "||"):
                if part and part[0] in HEADS:
                    out.append(shlex.join(part))
                part = []
            else:
                part.append(token)
    return out


def _makefile_targets() -> set[str]:
    return set(re.findall(r"^([A-Za-z][\w-]*):", (ROOT / "Makefile").read_text(), re.M))


def _is_placeholder(token: str) -> bool:
    return any(c in token for c in "<>$*{}") or "..." in token or token.isupper() or "RECIPE" in token


def _check_paths(tokens: list[str]) -> list[str]:
    return [
        f"{t} is not there"
        for t in tokens
        if t.startswith("recipes/") and not _is_placeholder(t) and not (ROOT / t.split("=", 1)[-1]).exists()
    ]


def _check_stage(name: str, args: list[str], launched: bool) -> list[str]:
    """Problems of `smolalign NAME ARGS` (or its script under accelerate launch: `launched`)."""
    if _is_placeholder(name):
        return []
    if name not in commands.COMMANDS:
        return [f"no command {name!r}"]
    command = commands.COMMANDS[name]
    problems = _check_paths(args)
    types = commands.config_types(name)
    if not types:  # a script of its own argument parser (compare, bench, preflight)
        return problems
    rest = args
    if command.launch and not launched:
        try:
            rest = commands.split_launch(command, args)[1]
        except ValueError as e:
            return [*problems, str(e)]
    try:
        _check_cli_keys([a for a in rest if a.startswith("--")], types)
    except Exception as e:  # noqa: BLE001 - the one-line unknown-key error
        problems.append(str(e).splitlines()[0])
    return problems


def check_command(line: str) -> list[str]:
    """What is wrong with one documented command line ([] when it runs as written)."""
    tokens = shlex.split(line)
    head, args = tokens[0], tokens[1:]
    if head == "make":
        targets = _makefile_targets()
        return [
            f"make target {t!r} is not in the Makefile"
            for t in args
            if not t.startswith("-") and "=" not in t and t not in targets
        ]
    if head == "smolalign":
        if not args or args[0].startswith("-"):
            return []
        if args[0] == "recipes":
            return []
        return _check_stage(args[0], args[1:], launched=False)
    if head in ("python", "python3"):
        if args[:2] == ["-m", "align.commands"]:
            return _check_stage(args[2], args[3:], launched=False) if len(args) > 2 else []
        if not args or not args[0].startswith("scripts/"):
            return []
        return _check_script(args[0], args[1:], launched=False)
    if head == "accelerate":
        if args[:1] != ["launch"]:
            return []
        return _check_launch(args[1:])
    return []


def _check_script(script: str, args: list[str], launched: bool) -> list[str]:
    path = ROOT / script
    if _is_placeholder(script):
        return []
    if not path.is_file():
        return [f"{script} is not there"]
    command = commands.BY_SCRIPT.get(path.stem)
    if command is None:
        return _check_paths(args)
    return _check_stage(command.name, args, launched=launched)


def _check_launch(args: list[str]) -> list[str]:
    options = commands._launch_options()
    problems, i = [], 0
    while i < len(args) and args[i].startswith("-") and args[i] != "-m":
        key = args[i].split("=", 1)[0]
        if key not in options:
            problems.append(f"accelerate launch has no option {key}")
            i += 1
            continue
        takes = options[key] and "=" not in args[i]
        problems += _check_paths(args[i + 1 : i + 2] if takes else [args[i].split("=", 1)[-1]])
        i += 1 + int(bool(takes))
    rest = args[i:]
    if rest[:2] == ["-m", "align.commands"] and len(rest) > 2:
        return problems + _check_stage(rest[2], rest[3:], launched=True)
    if rest and rest[0].startswith("scripts/"):
        return problems + _check_script(rest[0], rest[1:], launched=True)
    if len(rest) > 1 and "smolalign" in rest[0]:  # $(which smolalign) sft ...
        return problems + _check_stage(rest[1], rest[2:], launched=True)
    return problems


def _documented() -> list[tuple[str, str]]:
    return [(str(p.relative_to(ROOT)), c) for p in DOCS for c in doc_commands(p.read_text())]


def test_the_docs_show_commands_of_every_kind():
    heads = {
        shlex.split(c)[0] + (" " + shlex.split(c)[1] if len(shlex.split(c)) > 1 else "") for _, c in _documented()
    }
    assert {"make demo", "make test", "accelerate launch"} <= heads
    assert sum(h.startswith("smolalign ") for h in heads) >= 5 and any(h.startswith("python scripts/") for h in heads)


def test_every_documented_command_runs_as_written():
    problems = [f"{where}: `{line}`: {p}" for where, line in _documented() for p in check_command(line)]
    assert not problems, "documented commands that would not run as written:\n" + "\n".join(problems)


@pytest.mark.parametrize(
    ("line", "wrong"),
    [
        ("smolalign sft recipes/tiny/sft.yaml --learning_rte 1e-4", "learning_rte"),
        ("smolalign sft recipes/tiny/no_such.yaml", "no_such.yaml"),
        ("smolalign sftt recipes/tiny/sft.yaml", "sftt"),
        ("python scripts/no_such.py recipes/tiny/sft.yaml", "no_such.py"),
        (
            "accelerate launch --config_file recipes/accelerate/zero9.yaml scripts/sft.py recipes/tiny/sft.yaml",
            "zero9",
        ),
        ("accelerate launch --num_procs 2 scripts/grpo.py recipes/tiny/grpo.yaml", "--num_procs"),
        ("smolalign pipeline recipes/tiny/pipeline.yaml --start_from sft", "start_from"),
        ("make demoo", "demoo"),
    ],
)
def test_a_planted_mistake_is_named(line, wrong):
    problems = check_command(line)
    assert problems and wrong in " ".join(problems)


@pytest.mark.parametrize(
    "line",
    [
        "smolalign sft recipes/tiny/sft.yaml --learning_rate 1e-4 --num_processes 2 --accelerate_config zero3",
        "accelerate launch --config_file recipes/accelerate/zero3.yaml scripts/grpo.py recipes/tiny/grpo.yaml",
        "smolalign pipeline recipes/tiny/pipeline.yaml --from sft --dry_run true",
        "python scripts/sft.py RECIPE.yaml --model_name_or_path <model dir>",
        "make test",
    ],
)
def test_a_right_command_passes(line):
    assert check_command(line) == []


def test_commands_are_read_from_fences_spans_and_continuations():
    text = (
        "Run `make demo`, then:\n\n```bash\nsmolalign sft recipes/tiny/sft.yaml \\\n"
        "    --learning_rate 1e-4  # why\ncd x && make test\n```\n\n```python\nmake = 1\n```\n"
    )
    assert doc_commands(text) == ["smolalign sft recipes/tiny/sft.yaml --learning_rate 1e-4", "make test", "make demo"]
