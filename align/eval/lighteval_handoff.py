"""Hand-off to lighteval, the harness SmolLM3's evaluation used, for hub benchmarks (GPU machines with the hub).

    # in an eval recipe (align/eval/suite.py runs it after our own suites, on rank 0):
    lighteval_tasks: ["gsm8k|5", "hellaswag|0"]
    lighteval_bin: /opt/lighteval/bin/lighteval      # lighteval installed in an environment of its own
    lighteval_backend: vllm                          # or accelerate

Why a subprocess in its own environment: lighteval 0.13.0 pins latex2sympy2_extended==1.0.6 where math-verify 0.9.0
(our verifiers' expression comparison) pins 1.11.0, and brings ~40 more packages; it cannot share our virtualenv.
It downloads the benchmarks from the hub, so it needs network, and a GPU to be quick. The builtin items (offline)
stay with `align/eval/suite.py`, whose scoring agrees with lighteval's formulas item by item
(tests/test_harness_agreement.py). lighteval writes `<out>/results/<model>/results_<date>.json`; its metrics join
ours as `lighteval/<task>/<metric>` (its standard errors as `lighteval/<task>/<metric>_stderr`).
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

BACKENDS = ("accelerate", "vllm")
# Variables a launcher sets for OUR ranks: lighteval starts its own processes and must not join our group.
_LAUNCH_VARS = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "GROUP_RANK")


def lighteval_command(
    binary: str, backend: str, model_path: str, tasks: list[str], out_dir: str, model_args: str = ""
) -> list[str]:
    """`lighteval <backend> "model_name=<path>[,<model_args>]" "<task>,<task>" --output-dir <out_dir>`."""
    if backend not in BACKENDS:
        raise ValueError(f"lighteval_backend={backend!r}; choose from {list(BACKENDS)}")
    args = f"model_name={model_path}" + (f",{model_args}" if model_args else "")
    return [binary, backend, args, ",".join(tasks), "--output-dir", out_dir]


def read_results(out_dir: str | Path) -> dict[str, float]:
    """The newest lighteval results file under `out_dir`, flattened to {"lighteval/<task>/<metric>": value}."""
    files = sorted(Path(out_dir).glob("results/**/results_*.json"), key=lambda p: p.stat().st_mtime)
    if not files:
        raise FileNotFoundError(f"lighteval wrote no results_*.json under {out_dir}/results: see its log above")
    results = json.loads(files[-1].read_text()).get("results", {})
    return {
        f"lighteval/{task}/{metric}": float(value)
        for task, metrics in results.items()
        if task != "all"
        for metric, value in metrics.items()
        if isinstance(value, (int, float)) and not isinstance(value, bool)
    }


def find_lighteval(binary: str) -> str:
    """The lighteval executable's path; ValueError naming the fix when there is none (checked before any scoring)."""
    found = shutil.which(binary)
    if found is None:
        raise ValueError(
            f"lighteval_tasks is set but lighteval_bin={binary!r} is not an executable: install "
            f"lighteval==0.13.0 in an environment of its own (it cannot share ours: its "
            f"latex2sympy2_extended pin) and point lighteval_bin at its `lighteval`, or drop lighteval_tasks"
        )
    return found


def run_lighteval(
    binary: str, backend: str, model_path: str, tasks: list[str], out_dir: str, model_args: str = ""
) -> dict[str, float]:
    """Run lighteval on one checkpoint and return its metrics. Raises ValueError when it is not installed."""
    found = find_lighteval(binary)
    env = {k: v for k, v in os.environ.items() if k not in _LAUNCH_VARS and not k.startswith("ACCELERATE_")}
    cmd = lighteval_command(found, backend, model_path, tasks, out_dir, model_args)
    rc = subprocess.run(cmd, env=env).returncode
    if rc != 0:
        raise ValueError(f"lighteval failed (exit code {rc}): {' '.join(cmd)}")
    return read_results(out_dir)
