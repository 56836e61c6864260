"""Two evaluations of the same held-out items, paired: what a model gained and lost against another.

    python scripts/compare.py outputs/smol135m/sft/eval outputs/smol135m/apo/eval
    python scripts/compare.py BEFORE/eval_results.json AFTER/eval_results.json --out compare.md

Every share that both eval_results.json files hold per-item outcomes for is compared on those items: the generative
suite's `acc/<set>/<mode>` and `format/<set>/<mode>`, the tool suite's `tools/<mode>/<share>` (and each tool family
alone), by the exact McNemar test on the items that changed (`align.eval.statistics.paired_change`); the per-item chat loss
(`loss/chat`) by the mean difference with its 95% interval (`paired_loss`). Two results on different
items (another seed, row count or family list: their prompts' hash differs) are listed as not comparable, never
compared. This is the test the pipeline report applies between stages, for any two models evaluated alike.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

from align.eval.statistics import paired_change

TOOL_SHARES = ("acc_with_tools", "acc_without_tools", "right_tool", "format")


def eval_outcomes(stage: dict, metric: str) -> dict | None:
    """Per-item outcomes of an eval-suite share (`acc/<set>/<mode>` -> correct, `format/<set>/<mode>` -> formatted)
    from the stage's eval results (align/eval/suite.py writes them): {"items", "prompts"}, or None (older results)."""
    kind, _, where = metric.partition("/")
    try:
        details = json.loads(Path(stage["eval"]["results"]).read_text())["details"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if kind == "tools":  # tools/<mode>/<share> (align/tools/evaluate.py)
        mode, _, share = where.partition("/")
        tools = details.get(f"tools/{mode}") or {}
        key = {"acc_with_tools": "with_tools", "acc_without_tools": "without_tools", "right_tool": "right_tool",
               "format": "format"}
        items = (tools.get("outcomes") or {}).get(key.get(share, ""))
        return None if items is None else {"items": items, "prompts": tools.get("prompts_sha")}
    gen = details.get(f"gen/{where}") or {}
    items = (gen.get("outcomes") or {}).get({"acc": "correct", "format": "formatted"}.get(kind, ""))
    return None if items is None else {"items": items, "prompts": gen.get("prompts_sha")}


def paired_eval(before: dict, after: dict, metric: str, metric_after: str | None = None) -> dict | None:
    """The exact McNemar test of two stages' eval outcomes on the same items (None when either lacks them)."""
    a, b = eval_outcomes(before, metric), eval_outcomes(after, metric_after or metric)
    if a is None or b is None or len(a["items"]) != len(b["items"]) or a["prompts"] != b["prompts"]:
        return None
    return paired_change(a["items"], b["items"])


def paired_loss(before: dict, after: dict, metric: str = "loss/chat") -> dict | None:
    """Two stages' per-item losses on the same held-out items (the eval's `loss/chat`): the mean difference (after
    minus before) with its 95% interval; `word` is worse / better when the interval excludes 0, else within noise."""
    def items(stage):
        try:
            got = json.loads(Path(stage["eval"]["results"]).read_text())["details"][metric]
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return got["items"], got.get("prompts_sha")

    a, b = items(before), items(after)
    if a is None or b is None or len(a[0]) != len(b[0]) or a[1] != b[1] or len(a[0]) < 2:
        return None
    diffs = [y - x for x, y in zip(a[0], b[0])]
    mean = sum(diffs) / len(diffs)
    half = 1.96 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
    word = "**worse**" if mean - half > 0 else "better" if mean + half < 0 else "within noise"
    return {"difference": mean, "ci_low": mean - half, "ci_high": mean + half, "word": word}


def results_file(path: str | Path) -> Path:
    """An eval output directory or its eval_results.json (align/eval/suite.py writes it)."""
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
