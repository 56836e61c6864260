"""Two evaluations of the same held-out items, paired: what a model gained and lost against another.

    python scripts/compare.py outputs/smol135m/sft/eval outputs/smol135m/apo/eval
    python scripts/compare.py BEFORE/eval_results.json AFTER/eval_results.json --out compare.md

Every share that both eval_results.json files hold per-item outcomes for is compared on those items: the generative
suite's `acc/<set>/<mode>` and `format/<set>/<mode>`, the tool suite's `tools/<mode>/<share>` (and each tool family
alone), by the exact McNemar test on the items that changed (`align.scoring.paired_change`); the per-item chat loss
(`loss/chat`) by the mean difference with its 95% interval (`align.report.paired_loss`). Two results on different
items (another seed, row count or family list: their prompts' hash differs) are listed as not comparable, never
compared. This is the test the pipeline report applies between stages, for any two models evaluated alike.
"""

from __future__ import annotations

import json
from pathlib import Path

from align.report import eval_outcomes, paired_loss
from align.scoring import paired_change

TOOL_SHARES = ("acc_with_tools", "acc_without_tools", "right_tool", "format")


def results_file(path: str | Path) -> Path:
    """An eval output directory or its eval_results.json (align/evaluate.py writes it)."""
    path = Path(path)
    found = path / "eval_results.json" if path.is_dir() else path
    if not found.is_file():
        raise FileNotFoundError(f"compare: no eval results at {found}: pass an eval output_dir (scripts/evaluate.py "
                                "writes <output_dir>/eval_results.json) or the json file itself")
    return found


def paired_shares(stage: dict) -> list[str]:
    """The metric names whose per-item outcomes this stage's eval results hold, in the order they were written."""
    details = json.loads(Path(stage["eval"]["results"]).read_text()).get("details") or {}
    names = []
    for key in details:
        kind, _, where = key.partition("/")
        if kind == "gen":
            names += [f"acc/{where}", f"format/{where}"]
        elif kind == "tools":
            names += [f"{key}/{share}" for share in TOOL_SHARES]
    return [name for name in names if eval_outcomes(stage, name) is not None]


def _row(metric: str, before: list, after: list) -> dict:
    p = paired_change(before, after)
    word = "within noise" if not p["significant"] else "better" if p["gained"] > p["lost"] else "worse"
    return {"metric": metric, "num": p["num"], "before": sum(before) / len(before), "after": sum(after) / len(after),
            "gained": p["gained"], "lost": p["lost"], "p_value": p["p_value"], "word": word}


def compare(before: str | Path, after: str | Path, first: int | None = None) -> dict:
    """{"rows": one dict a share (and a tool family) both results hold on the same items, "not_comparable": the
    shares both hold on different items, "loss": the paired chat loss or None}. `first`: judge the shares on their
    first `first` items only (the same items in both, as the whole lists are; the chat loss stays whole), e.g. the
    256 prompts an earlier, smaller eval set held (the task sets keep their prefix as they grow)."""
    if first is not None and first < 1:
        raise ValueError(f"compare: first must be a positive number of items, got {first}")
    stages = [{"eval": {"results": str(results_file(p))}} for p in (before, after)]
    details = json.loads(Path(stages[0]["eval"]["results"]).read_text()).get("details") or {}
    rows, not_comparable = [], []
    for metric in [m for m in paired_shares(stages[0]) if m in paired_shares(stages[1])]:
        a, b = (eval_outcomes(s, metric) for s in stages)
        if a["prompts"] != b["prompts"] or len(a["items"]) != len(b["items"]):
            not_comparable.append(metric)
            continue
        head = slice(None, first)
        rows.append(_row(metric, a["items"][head], b["items"][head]))
        families = ((details.get(metric.rsplit("/", 1)[0]) or {}).get("families") or [])[head]
        for family in sorted(set(families)) if len(set(families)) > 1 else []:  # tool rows name their family
            keep = [i for i, f in enumerate(families) if f == family]
            rows.append(_row(f"{metric} [{family}]", [a["items"][i] for i in keep], [b["items"][i] for i in keep]))
    if not rows and not_comparable:
        raise ValueError(f"compare: the two results were evaluated on different items ({', '.join(not_comparable)}): "
                         "evaluate both with the same eval recipe (rows, families, seed)")
    if not rows:
        raise ValueError("compare: the two results share no per-item outcomes: evaluate both with the same suites "
                         "(generative or tools) and the same rows")
    return {"rows": rows, "not_comparable": not_comparable, "loss": paired_loss(*stages), "first": first}


def compare_markdown(found: dict, before: str, after: str) -> str:
    """The comparison as a markdown table (bold: a change the paired test calls real, p < 0.05)."""
    which = f"the first {found['first']} items of each set" if found.get("first") else "the same items"
    lines = [f"# {after} against {before}", "", f"Paired on {which} (exact McNemar test); p < 0.05 in bold.", "",
             "| metric | n | before | after | gained | lost | p | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in found["rows"]:
        verdict = r["word"] if r["word"] == "within noise" else f"**{r['word']}**"
        lines.append(f"| {r['metric']} | {r['num']} | {r['before']:.1%} | {r['after']:.1%} | {r['gained']} | "
                     f"{r['lost']} | {r['p_value']:.2g} | {verdict} |")
    if found["loss"]:
        loss = found["loss"]
        lines += ["", f"Chat loss (per item, after minus before): {loss['difference']:+.4f} "
                      f"[{loss['ci_low']:+.4f}, {loss['ci_high']:+.4f}], {loss['word'].strip('*')}."]
    if found["not_comparable"]:
        lines += ["", "Not comparable (evaluated on different items): " + ", ".join(found["not_comparable"]) + "."]
    return "\n".join(lines) + "\n"
