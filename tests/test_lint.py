"""The code base passes `make lint` (ruff check, line length 119 included, and ruff format), so a long line or an
unformatted file fails the suite, not a later review."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
PATHS = ["align", "pretrain", "rewards", "data_gen", "scripts", "tests"]


def _ruff() -> str:
    found = Path(sys.executable).with_name("ruff")
    if found.is_file():
        return str(found)
    path = shutil.which("ruff")
    if path is None:
        pytest.skip("ruff is not installed (pip install -e '.[dev]')")
    return path


@pytest.mark.parametrize("args", [["check"], ["format", "--check"]], ids=["check", "format"])
def test_ruff_passes(args):
    proc = subprocess.run([_ruff(), *args, *PATHS], cwd=ROOT, capture_output=True, text=True)
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-2000:]
