"""The `smolalign` command: one subcommand per stage and tool, each running the script of the same job.

    smolalign sft recipes/tiny/sft.yaml --learning_rate 1e-4      # = python scripts/sft.py recipes/tiny/sft.yaml ...
    smolalign sft --help                                           # the recipe keys, ours first, grouped
    smolalign recipes [grpo | tiny | ...]                          # every recipe: stage, scale, purpose
    accelerate launch --config_file recipes/accelerate/zero3.yaml -m align.commands sft RECIPE.yaml
    accelerate launch --num_processes 2 $(which smolalign) sft RECIPE.yaml
    smolalign sft RECIPE.yaml --num_processes 2 --accelerate_config zero3   # starts accelerate launch itself

COMMANDS is the one map from a command name to the script in scripts/ that runs it (and a one-line help). A command
runs its script as `__main__` in this process (runpy), with scripts/ first on sys.path, as `python scripts/<x>.py`
does: the same recipe parsing, the same main, the same `if __name__ == "__main__":` guard that vLLM's worker
processes rely on. The script owns its main and its CONFIG_TYPES (`config_types` reads them from it), so nothing is
declared twice and this module imports no stage. The scripts and recipes live in the checkout, so the command runs
from one: `pip install -e .` puts `smolalign` on the PATH.

Launching: options of `accelerate launch` (--num_processes, --config_file, --num_machines, ...) and
`--accelerate_config NAME|PATH` (an accelerate config under recipes/ by file name, e.g. zero3) given to a command
marked `launch` start `accelerate launch <those options> scripts/<x>.py <the rest>`, the launch the recipe headers
write out. A key the command's own configs define stays the command's (`--gradient_accumulation_steps` is the
trainer's), so the split never changes what a recipe key means.
"""

from __future__ import annotations

import dataclasses
import difflib
import os
import runpy
import shlex
import subprocess
import sys
from dataclasses import dataclass
from pathlib import Path

from align import recipes
from align.cli import COMMAND_ENV, PROG, fail, launch_rank

ROOT = Path(__file__).resolve().parents[1]  # the checkout: align/commands.py -> ./
SCRIPTS = ROOT / "scripts"
RECIPES = ROOT / "recipes"


@dataclass(frozen=True)
class Command:
    name: str
    script: str  # the file stem in scripts/
    help: str
    section: str
    launch: bool = False  # accelerate launch options start its ranks (a stage that runs under accelerate)
    wraps: bool = False  # it runs the stage a recipe's header names (its recipe is that stage's)


SECTIONS = ("train", "data", "evaluate", "chains", "checks")
_COMMANDS = (
    Command("pretrain", "run_pretrain", "pretrain or mid-train a base model with our loop", "train", launch=True),
    Command("sft", "sft", "supervised fine-tuning, assistant-only loss for any chat template", "train", launch=True),
    Command(
        "dpo", "dpo", "DPO / APO / IPO preference training (one TRL loss or a weighted list)", "train", launch=True
    ),
    Command("kto", "kto", "KTO preference training (paired data is unpaired)", "train", launch=True),
    Command("orpo", "orpo", "ORPO: odds-ratio preference loss plus NLL, no reference model", "train", launch=True),
    Command("grpo", "grpo", "GRPO on verifiable rewards through the shared rollout engine", "train", launch=True),
    Command(
        "distill", "distill", "on-policy distillation, same tokenizer or cross-tokenizer (GOLD)", "train", launch=True
    ),
    Command("tokenizer", "train_tokenizer", "train a byte-level BPE tokenizer and report its fertility", "data"),
    Command("preferences", "generate_preferences", "make preference pairs: strong-vs-weak or verifier-graded", "data"),
    Command("answers", "generate_answers", "a model's own answers to general prompts, as SFT replay data", "data"),
    Command("base", "base", "save a published model as a chain's local starting point", "data"),
    Command(
        "eval",
        "evaluate",
        "evaluate a checkpoint: held-out loss, multiple choice, verifiable accuracy",
        "evaluate",
        launch=True,
    ),
    Command("compare", "compare", "compare two evaluations item by item: gained, lost, McNemar p", "evaluate"),
    Command("passk", "passk", "greedy accuracy and pass@k per task family (where RL can learn)", "evaluate"),
    Command("pipeline", "pipeline", "run a chain of stages from one recipe: resumable, with a report", "chains"),
    Command("ablate", "ablate", "run an ablation: variants x seeds judged against a baseline", "chains"),
    Command("merge", "merge", "merge checkpoints: uniform or weighted soups, linear merges", "chains"),
    Command("preflight", "preflight", "run a recipe's preflight checks without training", "checks", wraps=True),
    Command("bench", "benchmark", "speed and memory beside a baseline, in one run", "checks"),
)
COMMANDS: dict[str, Command] = {c.name: c for c in _COMMANDS}
BY_SCRIPT: dict[str, Command] = {c.script: c for c in _COMMANDS}
RECIPES_HELP = "list the recipes under recipes/: stage, scale and purpose (filter: a stage, scale or folder)"


def script_path(command: Command) -> Path:
    return SCRIPTS / f"{command.script}.py"


def config_types(name: str) -> tuple:
    """The dataclasses the command's script parses its recipe into (its CONFIG_TYPES); () for a script of its own
    argument parser (compare, bench, preflight)."""
    added = str(SCRIPTS) not in sys.path
    if added:  # as when the script runs: its sibling modules (scripts/benchmarks/) import
        sys.path.insert(0, str(SCRIPTS))
    try:
        namespace = runpy.run_path(str(script_path(COMMANDS[name])))  # not as __main__: only its definitions
    finally:
        if added:
            sys.path.remove(str(SCRIPTS))
    return tuple(namespace.get("CONFIG_TYPES") or ())


def command_of(form: str, word: str) -> Command | None:
    """What a recipe header names (align.recipes.header_commands) as a command: a script stem or a command name."""
    return BY_SCRIPT.get(word) if form == "script" else COMMANDS.get(word)


def stage_of(recipe: recipes.RecipeFile) -> Command | None:
    """The command that runs the recipe: the first its header names that is not a wrapper (preflight)."""
    named = [command_of(form, word) for form, word in recipe.commands]
    return next((c for c in named if c is not None and not c.wraps), None)


# ----------------------------------------------------------------------------------------------- running a script


def run_script(command: Command, args: list[str]) -> int:
    """`python scripts/<x>.py ARGS` in this process; returns its exit code."""
    script = script_path(command)
    if not script.is_file():
        fail(
            f"'{command.name}' runs {script}, which is not there: run {PROG} from a checkout of the repository "
            "(pip install -e .)",
            code=2,
        )
    saved_argv, saved_path = sys.argv[:], sys.path[:]
    sys.argv = [str(script), *args]
    sys.path.insert(0, str(SCRIPTS))  # what `python scripts/<x>.py` puts first (scripts/benchmarks is imported so)
    os.environ[COMMAND_ENV] = f"{PROG} {command.name}"  # the usage line of --help names the command
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        if e.code is None or isinstance(e.code, int):
            return e.code or 0
        print(e.code, file=sys.stderr)  # `sys.exit("message")`, as Python reports it
        return 1
    finally:
        sys.argv[:], sys.path[:] = saved_argv, saved_path
        os.environ.pop(COMMAND_ENV, None)
    return 0


# ----------------------------------------------------------------------------------------------- launching ranks

ACCELERATE_CONFIG = "accelerate_config"
_NOT_LAUNCH_OPTIONS = {"--help", "--module", "--no_python", "--no-python"}  # the command decides what runs


def _launch_options() -> dict[str, int]:
    """accelerate launch's long options -> how many values each takes (0 for a flag), read from its own parser."""
    from accelerate.commands.launch import launch_command_parser

    return {
        opt: 0 if action.nargs == 0 else 1
        for action in launch_command_parser()._actions
        for opt in action.option_strings
        if opt.startswith("--") and opt not in _NOT_LAUNCH_OPTIONS
    }


def accelerate_config_path(value: str) -> str:
    """`--accelerate_config` as a file: a path, or the name of an accelerate config under recipes/ (zero3)."""
    if Path(value).is_file():
        return value
    configs = [r.path for r in recipes.find(RECIPES) if r.kind == "accelerate"]
    found = [p for p in configs if p.stem == value]
    if len(found) != 1:
        names = sorted({p.stem for p in configs})
        what = "is neither a file nor" if not found else f"names {len(found)} files, not"
        raise ValueError(
            f"--{ACCELERATE_CONFIG} {value!r} {what} one accelerate config under recipes/; "
            f"choose one of {names} or give a path"
        )
    return str(found[0])


def split_launch(command: Command, args: list[str]) -> tuple[list[str], list[str]]:
    """(accelerate launch's arguments, the command's own) from one command line. Empty launch arguments mean no
    launch. A key of the command's own configs is the command's even where accelerate knows the same name."""
    if not command.launch or any(a in ("-h", "--help") for a in args):
        return [], args
    if not any(a.startswith("--") for a in args):
        return [], args
    options = _launch_options()
    keys = {a[2:].split("=", 1)[0].replace("-", "_") for a in args if a.startswith("--")}
    launchable = {o[2:].replace("-", "_") for o in options} | {ACCELERATE_CONFIG}
    if not keys & launchable:
        return [], args
    own = {f.name for t in config_types(command.name) for f in dataclasses.fields(t)}
    launch, rest, i = [], [], 0
    while i < len(args):
        token = args[i]
        key = token[2:].split("=", 1)[0] if token.startswith("--") else None
        name = key.replace("-", "_") if key else None
        inline = "=" in token
        if name is None or name in own or (f"--{key}" not in options and name != ACCELERATE_CONFIG):
            rest.append(token)
            i += 1
            continue
        takes = 1 if name == ACCELERATE_CONFIG else options[f"--{key}"]
        values = [] if inline or not takes else args[i + 1 : i + 2]
        if takes and not inline and not values:
            raise ValueError(f"--{key} needs a value")
        if name == ACCELERATE_CONFIG:
            value = token.split("=", 1)[1] if inline else values[0]
            launch += ["--config_file", accelerate_config_path(value)]
        else:
            launch += [token, *values]
        i += 1 + len(values)
    if launch and (launch_rank() > 0 or "LOCAL_RANK" in os.environ):
        raise ValueError(
            f"{' '.join(launch)}: this process was itself started by a launcher; give launch options "
            f"to accelerate launch, or run `{PROG} {command.name}` without one"
        )
    return launch, rest


def launch_ranks(command: Command, launch: list[str], args: list[str]) -> int:
    """`accelerate launch LAUNCH scripts/<x>.py ARGS`, the launch a recipe header writes out."""
    cmd = [sys.executable, "-m", "accelerate.commands.launch", *launch, str(script_path(command)), *args]
    print(
        f"{PROG}: accelerate launch {shlex.join([*launch, str(script_path(command)), *args])}",
        file=sys.stderr,
        flush=True,
    )
    return subprocess.call(cmd)


# ----------------------------------------------------------------------------------------------- recipes


def recipe_table(root: Path, words: list[str]) -> str:
    """The `smolalign recipes` table: path, stage, scale, purpose; each word must equal the stage (or the kind of a
    launch file), the scale or a folder of the recipe."""
    rows = []
    for r in recipes.find(root):
        if r.kind == "recipe":  # a recipe of a stage; a launch file says what it is instead
            stage = stage_of(r)
            rows.append((r, stage.name if stage else "?", r.scale or "-"))
        else:
            rows.append((r, r.kind, r.scale or "any"))
    known = {w for _, what, scale in rows for w in (what, scale) if w not in ("?", "-")}
    known |= {part for r, _, _ in rows for part in r.path.relative_to(root).parts[:-1]}
    for word in words:
        if word not in known:
            close = difflib.get_close_matches(word, sorted(known), n=1)
            hint = f"; did you mean '{close[0]}'?" if close else ""
            raise ValueError(
                f"recipes: nothing is filed under {word!r}{hint} (a stage, scale or folder: "
                f"{', '.join(sorted(known))})"
            )
    shown = [
        (r, what, scale)
        for r, what, scale in rows
        if all(w in (what, scale, *r.path.relative_to(root).parts[:-1]) for w in words)
    ]
    paths = [str(r.path.relative_to(root.parent)) for r, _, _ in shown]
    width = max([len(p) for p in paths] + [4])
    lines = [f"{'path':<{width}}  {'stage':<11}  {'scale':<8}  purpose"]
    lines += [f"{p:<{width}}  {what:<11}  {scale:<8}  {r.purpose}" for p, (r, what, scale) in zip(paths, shown)]
    return "\n".join(lines)


# ----------------------------------------------------------------------------------------------- the entry point


def usage() -> str:
    lines = [
        f"usage: {PROG} COMMAND [RECIPE.yaml] [--key value ...]",
        "",
        "One command per stage and tool; each runs scripts/<script>.py with the same arguments.",
        "",
    ]
    width = max(len(c) for c in [*COMMANDS, "recipes"])
    for section in SECTIONS:
        lines.append(f"{section}:")
        lines += [f"  {c.name:<{width}}  {c.help}" for c in _COMMANDS if c.section == section]
        if section == "checks":
            lines.append(f"  {'recipes':<{width}}  {RECIPES_HELP}")
        lines.append("")
    lines += [
        "A recipe's keys are the fields of its configs: defaults < RECIPE.yaml < --key value.",
        f"`{PROG} COMMAND --help` lists them, ours first. Under accelerate:",
        "  accelerate launch [--config_file F] -m align.commands COMMAND RECIPE.yaml [--key value ...]",
        f"  {PROG} COMMAND RECIPE.yaml --num_processes N [--accelerate_config zero3] [--key value ...]",
        "More: docs/cli.md.",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help", "help"):
        print(usage())
        return 0 if argv else 2
    name, args = argv[0], argv[1:]
    try:
        if name == "recipes":
            if any(a in ("-h", "--help") for a in args):
                print(f"usage: {PROG} recipes [STAGE | SCALE | FOLDER ...]\n\n{RECIPES_HELP}")
                return 0
            print(recipe_table(RECIPES, args))
            return 0
        command = COMMANDS.get(name)
        if command is None:
            close = difflib.get_close_matches(name, [*COMMANDS, "recipes"], n=1)
            hint = f"did you mean '{close[0]}'? " if close else ""
            fail(f"unknown command '{name}'; {hint}run `{PROG} --help` for the list", code=2)
        launch, rest = split_launch(command, args)
    except ValueError as e:
        fail(str(e), code=2)
    if launch:
        return launch_ranks(command, launch, rest)
    return run_script(command, rest)


if __name__ == "__main__":
    sys.exit(main())
