"""Run a recipe's preflight checks without training: `python scripts/preflight.py recipe.yaml [--key value ...]`.

The stage comes from the recipe's header command (its first comment naming `scripts/<stage>.py`); that script then
runs exactly as it would for training (same parsing, same model/data/trainer building, same rank layout under
`accelerate launch`) up to `align.runtime.preflight.preflight`, which stops it with exit code 0 once every check passed
(SMOLALIGN_PREFLIGHT_ONLY=1). A failing check prints one line and exits 1. Training is never reached: a stage
that got to `Trainer.train` without running the preflight is an error here.

    python scripts/preflight.py recipes/tiny/apo.yaml
    accelerate launch --num_processes 2 scripts/preflight.py recipes/smollm3/sft.yaml
"""

from __future__ import annotations

import logging
import os
import runpy
import sys
from pathlib import Path

from align.cli import fail
from align.commands import command_of, script_path
from align.recipes import header, header_commands

# Scripts whose loop is not an HF Trainer (nothing would stop them before training): refused, not run.
NO_PREFLIGHT = {"train_tokenizer", "pipeline", "evaluate", "benchmark", "generate_preferences"}


def stage_script(recipe: str) -> Path:
    """The stage script named by the recipe's header comment (`scripts/<stage>.py` or `smolalign <stage>`)."""
    path = Path(recipe)
    if not path.is_file():
        raise FileNotFoundError(f"recipe file '{recipe}' not found")
    for form, word in header_commands(header(path)):
        command = command_of(form, word)
        if command is None and form == "script":
            raise FileNotFoundError(f"recipe '{recipe}' names scripts/{word}.py, which does not exist")
        if command is None or command.wraps:  # prose that says "smolalign ...", or this very check
            continue
        if command.script in NO_PREFLIGHT:
            raise ValueError(f"recipe '{recipe}' runs scripts/{command.script}.py, which has no preflight checks yet")
        return script_path(command)
    raise ValueError(
        f"recipe '{recipe}' has no header command naming a stage script; its first line should be a comment such "
        "as '# python scripts/sft.py recipes/tiny/sft.yaml'"
    )


def _forbid_training() -> None:
    import transformers

    def train(self, *args, **kwargs):
        raise RuntimeError(
            f"{type(self).__name__}.train was reached without running align.runtime.preflight.preflight"
        )

    transformers.Trainer.train = train


def main(argv: list[str]) -> int:
    if argv[:1] in (["--help"], ["-h"]):
        print(__doc__)
        return 0
    if not argv or argv[0].startswith("-"):
        fail("usage: scripts/preflight.py recipe.yaml [--key value ...]", code=2)
    try:
        script = stage_script(argv[0])
    except (FileNotFoundError, ValueError) as e:
        fail(str(e), code=2)
    os.environ["SMOLALIGN_PREFLIGHT_ONLY"] = "1"
    _forbid_training()
    sys.argv = [str(script), *argv]
    try:
        runpy.run_path(str(script), run_name="__main__")
    except SystemExit as e:
        return e.code if isinstance(e.code, int) else 1
    print(f"{script.name} finished without running the preflight checks", file=sys.stderr)
    return 1


if __name__ == "__main__":
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    sys.exit(main(sys.argv[1:]))
