"""The per-item outcomes of every evaluation of a pipeline run, gathered beside its report: `<run_dir>/outcomes/`.

Why: every p-value the report prints must recompute from files a reader has (`scripts/compare.py A B`), so each
evaluation's outcomes are written there as compact JSONL (align/eval/outcomes.py), named by what was evaluated:
- `<stage>.jsonl`: the stage's model on the eval suite (dev split);
- `<stage>.test.jsonl`: the sealed test split (the final model and its SFT model);
- `<stage>.<own eval>.before.jsonl`, `.after.jsonl`: a stage's own held-out evaluation before and after it trained
  (`grpo_eval`, `distill_eval`: the rows' `correct` flags).

    files = write_outcome_files(run_dir, manifest)   # [{"file", "what", "stage"}], in pipeline order
"""

from __future__ import annotations

import json
from pathlib import Path

from align.eval.outcomes import OUTCOMES_FILE, lines_from_details, own_lines, read_lines, write_lines

OUTCOMES_DIR = "outcomes"
# The stages' own before/after evaluations whose per-row outcomes are gathered (what the report pairs).
OWN_EVALS = ("grpo_eval", "distill_eval")


def _suite_lines(results: str | Path) -> list[dict]:
    """An eval's outcome lines: its outcomes.jsonl, else derived from its eval_results.json."""
    results = Path(results)
    beside = results.with_name(OUTCOMES_FILE)
    if beside.is_file():
        return read_lines(beside)
    return lines_from_details(json.loads(results.read_text()).get("details") or {})


def write_outcome_files(run_dir: str | Path, manifest: dict) -> list[dict]:
    """Write every evaluation's outcomes under `<run_dir>/outcomes/`; return what was written, in pipeline order."""
    out = Path(run_dir) / OUTCOMES_DIR
    written = []

    def put(name: str, lines: list[dict], what: str, stage: str) -> None:
        if lines:
            write_lines(out / name, lines)
            written.append({"file": f"{OUTCOMES_DIR}/{name}", "what": what, "stage": stage})

    sealed = manifest.get("sealed_test") or {}
    for s in manifest.get("stages", []):
        name = s["name"]
        for rec, suffix, what in (
            ((s.get("eval") or {}), "", "eval suite, dev split"),
            (sealed.get(name) or {}, ".test", "eval suite, sealed test split"),
        ):
            if rec.get("returncode") == 0 and rec.get("results"):
                try:
                    put(f"{name}{suffix}.jsonl", _suite_lines(rec["results"]), what, name)
                except (OSError, ValueError):
                    continue
        for own in OWN_EVALS:
            try:
                report = json.loads((Path(s.get("output_dir") or "") / f"{own}.json").read_text())
            except (OSError, ValueError):
                continue
            for when in ("before", "after"):
                put(
                    f"{name}.{own}.{when}.jsonl", own_lines(own, report, when), f"its own {own}, {when} training", name
                )
    return written
