"""The recipe command line shared by every script.

    python scripts/sft.py recipes/tiny/sft.yaml --learning_rate 1e-4
    accelerate launch scripts/sft.py recipes/tiny/sft.yaml

Precedence: dataclass defaults < recipe YAML < command line (TRL's `TrlParser` underneath). Before
TRL sees anything we check the recipe ourselves, because a typo must not cost a run: a missing
file, malformed YAML, an unknown key (with the closest valid key suggested) or a value of the
wrong type each end in ONE line on stderr and exit code 2. `run(main, *types)` also turns the
user errors a stage raises (ValueError, FileNotFoundError, ImportError) into one line and exit
code 1; set `SMOLALIGN_DEBUG=1` to see the traceback instead. Under `accelerate launch` the line comes
from rank 0 (another rank prints only an error of its own), and only rank 0 logs below WARNING.

Every script follows one shape (tests/test_cli.py parses every recipe through it):

    CONFIG_TYPES = (ScriptArguments, SFTConfig, ModelConfig)   # module level: the recipe's dataclasses
    def main(script_args, training_args, model_args): ...
    if __name__ == "__main__":
        run(main, *CONFIG_TYPES)

and every recipe's first line is a comment with the command that runs it.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import inspect
import os
import re
import sys
import types
import typing
from collections.abc import Callable, Sequence
from pathlib import Path

import yaml

from align.runtime.distributed import leave_launcher

PROG = "smolalign"
# Set by align/commands.py while it runs a script: the command the usage line of --help names (read once, removed,
# so the processes a stage starts do not inherit it).
COMMAND_ENV = "SMOLALIGN_COMMAND"
OUR_PACKAGES = ("align", "pretrain", "rewards", "data_gen")


class RecipeError(ValueError):
    """A problem with the recipe or the command line: reported as one line."""


def _fields(dataclass_types: Sequence[type]) -> dict[str, object]:
    """Field name -> declared type. From `get_type_hints`, because the argument parser rewrites
    `dataclasses.Field.type` in place (`dict | str | None` becomes `str`) once it has seen a class."""
    out: dict[str, object] = {}
    for dc in dataclass_types:
        try:
            hints = typing.get_type_hints(dc)
        except Exception:  # an annotation we cannot resolve: fall back to what the field says
            hints = {}
        for f in dataclasses.fields(dc):
            if f.init:
                out.setdefault(f.name, hints.get(f.name, f.type))
    return out


def _unknown_key_error(key: str, where: str, valid: Sequence[str]) -> RecipeError:
    close = difflib.get_close_matches(key, valid, n=1, cutoff=0.6)
    hint = f"; did you mean '{close[0]}'?" if close else "; run the script with --help to list the valid keys"
    return RecipeError(f"unknown key '{key}' in {where}{hint}")


def _base_types(annotation) -> list:
    """The concrete types a field accepts: `float | None` -> [float]; `str` -> [str]."""
    if isinstance(annotation, str):
        return []  # postponed annotations we cannot resolve cheaply: skip the check
    origin = typing.get_origin(annotation)
    if origin in (typing.Union, types.UnionType):
        return [t for a in typing.get_args(annotation) for t in _base_types(a)]
    if annotation is type(None):
        return []
    if origin is typing.Literal:
        return [typing.Literal[typing.get_args(annotation)]]
    return [origin or annotation]


def _coerce(key: str, value, annotation, path: str):
    """Check a YAML value against the field's type; convert what YAML leaves as a string ('1e-5')."""
    if value is None:
        return value
    allowed = _base_types(annotation)
    if not allowed:
        return value
    import enum

    def fits(t) -> bool:
        if typing.get_origin(t) is typing.Literal:
            return value in typing.get_args(t)
        if t is float:
            return isinstance(value, (int, float)) and not isinstance(value, bool)
        if t is int:
            return isinstance(value, int) and not isinstance(value, bool)
        if isinstance(t, type) and issubclass(t, enum.Enum):
            return value in [m.value for m in t] or value in t.__members__ or isinstance(value, t)
        if isinstance(t, type):
            return isinstance(value, t)
        return True

    if any(fits(t) for t in allowed):
        return value
    if list in allowed and isinstance(value, (str, int, float)) and not isinstance(value, bool):
        return [value]  # `loss_type: apo_zero` means the one-element list, as on the command line
    if isinstance(value, str):
        for t in allowed:
            if t in (int, float):
                try:
                    return t(value)
                except ValueError:
                    pass
    names = ", ".join(getattr(t, "__name__", str(t)) for t in allowed)
    raise RecipeError(f"key '{key}' in {path} has value {value!r} ({type(value).__name__}); expected {names}")


def load_recipe(path: str | os.PathLike, dataclass_types: Sequence[type]) -> dict:
    """Read and check a recipe YAML against the dataclasses: the keys and the value types."""
    p = Path(path)
    if not p.is_file():
        raise RecipeError(f"recipe file '{path}' not found" + (" (it is a directory)" if p.is_dir() else ""))
    try:
        config = yaml.safe_load(p.read_text())
    except yaml.YAMLError as e:
        mark = getattr(e, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark else ""
        problem = getattr(e, "problem", None) or str(e).splitlines()[0]
        raise RecipeError(f"recipe '{path}' is not valid YAML{where}: {problem}") from None
    if config is None:
        config = {}
    if not isinstance(config, dict):
        raise RecipeError(f"recipe '{path}' must be a YAML mapping of key: value, got {type(config).__name__}")
    if "env" in config and not isinstance(config["env"], dict):
        raise RecipeError(f"'env' in {path} must be a mapping of environment variables")
    return check_keys(config, dataclass_types, str(path), allow_env=True)


def check_keys(config: dict, dataclass_types: Sequence[type], where: str, allow_env: bool = False) -> dict:
    """Check a mapping's keys and value types against the dataclasses, as a recipe's are checked (a recipe, or keys
    that override one: iterative APO's `round_pairs_overrides`); coerce in place, return it. One RecipeError line
    names a wrong key (with the closest valid one) or value."""
    fields = _fields(dataclass_types)
    for key, value in config.items():
        if key == "env" and allow_env:
            continue
        if key not in fields:
            raise _unknown_key_error(str(key), where, list(fields))
        config[key] = _coerce(key, value, fields[key], where)
    return config


def _aliases(dataclass_types: Sequence[type]) -> set[str]:
    """The other flag names fields declare (`metadata={"aliases": ["--from"]}`), as keys: {"from"}."""
    names = set()
    for dc in dataclass_types:
        for f in dataclasses.fields(dc):
            aliases = f.metadata.get("aliases") or []
            names |= {a.lstrip("-").replace("-", "_") for a in ([aliases] if isinstance(aliases, str) else aliases)}
    return names


def _check_cli_keys(args: Sequence[str], dataclass_types: Sequence[type]) -> None:
    valid = set(_fields(dataclass_types)) | _aliases(dataclass_types) | {"config", "help", "h"}
    for token in args:
        if token.startswith("--") and len(token) > 2:
            key = token[2:].split("=", 1)[0].replace("-", "_")
            if key not in valid:
                raise _unknown_key_error(key, "the command line", sorted(valid))


def parse(*dataclass_types: type, args: Sequence[str] | None = None) -> tuple:
    """Parse `[recipe.yaml] [--key value ...]` into one instance per dataclass type."""
    from trl import TrlParser

    args = list(sys.argv[1:] if args is None else args)
    if args and not args[0].startswith("-"):
        args = ["--config", *args]  # `script.py recipe.yaml ...` == `script.py --config recipe.yaml ...`
    _check_cli_keys([a for i, a in enumerate(args) if not (i > 0 and args[i - 1] == "--config")], dataclass_types)
    parser = TrlParser(
        list(dataclass_types), usage=f"{_prog()} [RECIPE.yaml] [--key value ...]", description=HELP_DESCRIPTION
    )
    parser.error = lambda message: fail(message, code=2)  # argparse would print the whole usage first
    _escape_help(parser)
    _group_by_defining_class(parser, dataclass_types)
    if "--config" in args:
        i = args.index("--config")
        if i + 1 >= len(args):
            raise RecipeError("--config needs a recipe path")
        recipe = args[i + 1]
        config = load_recipe(recipe, dataclass_types)
        for key, value in config.pop("env", {}).items():
            os.environ[key] = str(value)
        parser.set_defaults_with_config(**config)
        args = args[:i] + args[i + 2 :]
    args = _structured_cli_values(args, dataclass_types, parser)
    return tuple(parser.parse_args_into_dataclasses(args=args))


HELP_DESCRIPTION = (
    "RECIPE.yaml sets these keys, --key value overrides them (defaults < recipe < command line). They are grouped "
    f"by the config class that defines them: {PROG}'s first, then those of the libraries it builds on."
)


def _prog() -> str:
    """How the user ran us: `smolalign sft` (align/commands.py says so), `python scripts/sft.py`, or the program."""
    command = os.environ.pop(COMMAND_ENV, None)
    if command:
        return command
    argv0 = sys.argv[0] if sys.argv else PROG
    if argv0.endswith(".py"):
        path = Path(argv0)
        if path.is_absolute() and path.is_relative_to(Path.cwd()):
            path = path.relative_to(Path.cwd())
        return f"python {path}"
    return os.path.basename(argv0) or PROG


def _origin(cls: type) -> str:
    """The package a config class comes from: ours (PROG) or the library's top-level module."""
    module = cls.__module__
    top = module.split(".")[0]
    return PROG if top in OUR_PACKAGES or module in ("__main__", "<run_path>") else top


def _defining_class(dataclass_type: type, name: str) -> type:
    """The class whose definition of a field the dataclass uses: the first in its MRO that annotates it."""
    return next((k for k in dataclass_type.__mro__ if name in inspect.get_annotations(k)), dataclass_type)


def _library_order(classes: list[type]) -> list[str]:
    """The packages of the classes, each before the packages its classes subclass (ours before TRL's before
    transformers'), otherwise in the order they first appear."""
    packages = list(dict.fromkeys(_origin(c) for c in classes))
    below = {p: set() for p in packages}
    for c in classes:
        below[_origin(c)] |= {_origin(b) for b in c.__mro__[1:] if dataclasses.is_dataclass(b)} - {_origin(c)}
    ordered: list[str] = []
    while len(ordered) < len(packages):
        left = [p for p in packages if p not in ordered]
        # the first package no other remaining one builds on; a cycle (never seen) keeps first-seen order
        ordered.append(next((p for p in left if not any(p in below[q] for q in left if q != p)), left[0]))
    return ordered


def _group_by_defining_class(parser, dataclass_types: Sequence[type]) -> None:
    """--help lists each field under the class that defines it ("GRPOConfig (smolalign)", "ReplayArgs (smolalign)",
    "GRPOConfig (trl)", "TrainingArguments (transformers)"), our classes first; argparse would list every field
    in one block, the base class's (transformers') first."""
    owner: dict[str, type] = {}
    for dc in dataclass_types:
        for f in dataclasses.fields(dc):
            owner.setdefault(f.name, _defining_class(dc, f.name))
    owners = set(owner.values())
    # each config type's classes, the most derived first (GRPOConfig, then its mixins, then TRL's); ours first
    classes = list(dict.fromkeys(k for dc in dataclass_types for k in dc.__mro__ if k in owners))
    rank = {p: i for i, p in enumerate(_library_order(classes))}
    classes.sort(key=lambda c: rank[_origin(c)])  # stable: that order within a package
    groups = {c: parser.add_argument_group(f"{c.__name__} ({_origin(c)})", _docstring_line(c)) for c in classes}
    for group in [parser._positionals, parser._optionals]:
        for action in list(group._group_actions):
            if action.dest in owner:
                group._group_actions.remove(action)
                groups[owner[action.dest]]._group_actions.append(action)
    parser._action_groups = [parser._positionals, parser._optionals, *groups.values()]


def _docstring_line(cls: type) -> str | None:
    """The first sentence of a class's own docstring (not the signature dataclasses writes when there is none)."""
    doc = cls.__dict__.get("__doc__") or ""
    first = " ".join(doc.strip().split("\n\n")[0].split())
    if not first or first.startswith(f"{cls.__name__}("):
        return None
    end = first.find(". ")
    return first if end < 0 else first[: end + 1]


def _escape_help(parser) -> None:
    """argparse %-formats every help string when it prints --help; help text that quotes a chat template
    (`{% generation %}`) or a percentage would end --help in a TypeError. Keep `%(default)s`-style fields."""
    for action in parser._actions:
        if action.help and action.help != argparse.SUPPRESS:
            action.help = re.sub(r"%(?!\()", "%%", action.help)


def _list_item_type(annotation):
    """The element type of a list field (`list[str] | None` -> str), None when it is not one simple type."""
    for t in (
        typing.get_args(annotation)
        if typing.get_origin(annotation) in (typing.Union, types.UnionType)
        else [annotation]
    ):
        if (
            typing.get_origin(t) is list
            and len(typing.get_args(t)) == 1
            and typing.get_args(t)[0] in (str, int, float)
        ):
            return typing.get_args(t)[0]
    return None


def _structured_cli_values(args: list[str], dataclass_types: Sequence[type], parser) -> list[str]:
    """`--dataset_args '{num: 10}'`: argparse cannot build a dict (or a list of dicts) from a string, so we
    read such values as YAML and hand them over as defaults, which the command line may set last. A list field also
    takes YAML flow syntax, `--suites '[generative, mc]'` (or unquoted, `--suites [generative, mc]`), besides
    argparse's space-separated `--suites generative mc`."""
    fields = _fields(dataclass_types)
    structured = {k for k, t in fields.items() if dict in _base_types(t) or typing.get_origin(t) is dict}
    lists = {k for k, t in fields.items() if list in _base_types(t)} - structured
    rest, values, i = [], {}, 0
    while i < len(args):
        key = args[i][2:].split("=", 1)[0].replace("-", "_") if args[i].startswith("--") else None
        inline = "=" in args[i]
        value = args[i].split("=", 1)[1] if key and "=" in args[i] else (args[i + 1] if i + 1 < len(args) else None)
        if key in fields and value == "null" and _accepts_none(fields[key]):  # `--key null` unsets a recipe's value
            values[key] = None
            i += 1 if "=" in args[i] else 2
            continue
        if key in structured:
            raw = args[i].split("=", 1)[1] if inline else (args[i + 1] if i + 1 < len(args) else None)
            if raw is None:
                raise RecipeError(f"--{key} needs a value, e.g. --{key} '{{name: value}}'")
            try:
                values[key] = _coerce(key, yaml.safe_load(raw), fields[key], "the command line")
            except yaml.YAMLError:
                raise RecipeError(f"--{key} {raw!r} is not valid YAML/JSON") from None
            i += 1 if inline else 2
            continue
        first = args[i].split("=", 1)[1] if inline else (args[i + 1] if i + 1 < len(args) else "")
        if key in lists and first.lstrip().startswith("["):
            # the shell may have split an unquoted flow list: take tokens up to the one that closes it
            end = i if inline else i + 1
            while not args[end].rstrip().endswith("]") and end + 1 < len(args) and not args[end + 1].startswith("--"):
                end += 1
            raw = " ".join([first, *args[(i if inline else i + 1) + 1 : end + 1]])
            try:
                value = yaml.safe_load(raw)
            except yaml.YAMLError:
                raise RecipeError(
                    f"--{key} {raw!r} is not a valid YAML list; write --{key} '[a, b]' or --{key} a b"
                ) from None
            if not isinstance(value, list):
                raise RecipeError(f"--{key} {raw!r} is not a list; write --{key} '[a, b]' or --{key} a b")
            item = _list_item_type(fields[key])
            values[key] = [item(v) for v in value] if item is not None else value
            i = end + 1
            continue
        rest.append(args[i])
        i += 1
    if values:
        parser.set_defaults_with_config(**values)
    return rest


def _accepts_none(annotation) -> bool:
    return typing.get_origin(annotation) in (typing.Union, types.UnionType) and type(None) in typing.get_args(
        annotation
    )


# One error line per launch. Rank 0 leaves a marker beside its line; a rank other than 0 that fails waits up to this
# long for that marker and, seeing it, exits without printing (rank 0 already said it, usually the same thing). With
# no marker by then (an error of that rank alone, or rank 0 on another machine) it prints its own line, tagged with
# its rank; the launcher then stops the rest, so no rank is left waiting in a collective. A fixed sleep would
# not do: on a loaded machine rank 0's exit can take longer than any fixed delay.
OTHER_RANK_ERROR_DELAY_S = 20.0


def launch_rank() -> int:
    """This process's rank as the launcher (accelerate launch, torchrun) announced it; 0 in a plain process."""
    return int(os.environ.get("RANK", "0") or 0)


def _error_marker() -> str | None:
    """A path the ranks of one launch on one machine share (they are children of one launcher process)."""
    if "RANK" not in os.environ:
        return None
    import tempfile

    launch = f"{os.getppid()}-{os.environ.get('MASTER_PORT', '')}-{os.environ.get('TORCHELASTIC_RESTART_COUNT', '0')}"
    return os.path.join(tempfile.gettempdir(), f"smolalign-error-{launch}")


def fail(message: str, code: int = 1) -> typing.NoReturn:
    rank, marker = launch_rank(), _error_marker()
    if rank > 0:
        import time

        deadline = time.monotonic() + OTHER_RANK_ERROR_DELAY_S
        while time.monotonic() < deadline:
            if marker and os.path.exists(marker) and os.path.getmtime(marker) > time.time() - 600:
                raise SystemExit(code)
            time.sleep(0.2)
        message = f"[rank {rank}] {message}"
    elif marker:
        try:
            with open(marker, "w") as f:
                f.write(message)
        except OSError:
            pass
    print(f"{PROG}: error: {message}", file=sys.stderr, flush=True)
    raise SystemExit(code)


def run(main: Callable[..., object], *dataclass_types: type, args: Sequence[str] | None = None) -> object:
    """Parse the recipe, call `main(*configs)`, and turn user errors into one line (see module doc). Under a
    multi-process launch only rank 0 logs below WARNING and prints the error line (see OTHER_RANK_ERROR_DELAY_S)."""
    debug = os.environ.get("SMOLALIGN_DEBUG", "") not in ("", "0")
    if launch_rank() > 0 and not debug:
        import logging

        logging.getLogger().setLevel(logging.WARNING)
    try:
        configs = parse(*dataclass_types, args=args)
    except (RecipeError, ValueError, TypeError) as e:
        if debug:
            raise
        fail(" ".join(str(e).split()) or type(e).__name__, code=2)
    try:
        result = main(*configs)
    except (ValueError, OSError, ImportError) as e:  # OSError: FileNotFoundError, an output_dir that is a file
        if debug:
            raise
        fail(f"{type(e).__name__}: {' '.join(str(e).split())}")
    # A normal exit under a launcher closes the process group: a gloo group left open at exit can abort a rank
    # ("terminate called without an active exception") whose peer has already gone, failing a finished stage.
    leave_launcher()
    return result
