"""Import scripts/benchmarks/<name>.py and scripts/benchmark.py in a test without putting scripts/ on sys.path
(its scripts would shadow the packages of the same name)."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]


def suite(name: str):
    """scripts/benchmarks/<name>.py as `benchmarks.<name>`."""
    if "benchmarks" not in sys.modules:
        init = ROOT / "scripts" / "benchmarks" / "__init__.py"
        spec = importlib.util.spec_from_file_location(
            "benchmarks", init, submodule_search_locations=[str(init.parent)]
        )
        module = importlib.util.module_from_spec(spec)
        sys.modules["benchmarks"] = module
        spec.loader.exec_module(module)
    return importlib.import_module(f"benchmarks.{name}")


def runner():
    """scripts/benchmark.py as a module (`main`, `read_history`, ...)."""
    suite("history")  # the `benchmarks` package it imports from
    spec = importlib.util.spec_from_file_location("benchmark_runner", ROOT / "scripts" / "benchmark.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module
