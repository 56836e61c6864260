"""Benchmark suites, one module per stage: each exposes `run(quick: bool) -> {"rows": [...], "summary": [...]}`."""
