"""Two evaluations of the same held-out items, paired: what a model gained and lost against another.

    python scripts/compare.py outputs/smol135m/sft/eval outputs/smol135m/apo/eval
    python scripts/compare.py BEFORE/outcomes.jsonl AFTER/outcomes.jsonl --out compare.md
    python scripts/compare.py outputs/tiny/pipeline/outcomes/grpo.jsonl --baseline   # the model against its baselines

Every share that both evaluations hold per-item outcomes for (align/eval/outcomes.py: an eval directory, its
eval_results.json or outcomes.jsonl, or an outcomes file the pipeline gathered) is compared on those items: the
generative suite's `acc/<set>/<mode>` and `format/<set>/<mode>`, the MC suite's `cf/<set>` and `mcf/<set>`, the tool
suite's `tools/<mode>/<share>`, a stage's own `<eval>/accuracy`, each family alone where the items name families
(accuracies and tool shares), by the exact McNemar test on the items that changed
(`align.eval.statistics.paired_change`); the per-item chat loss (`loss/chat`) by the mean difference with its 95%
interval (`paired_loss`). Two results on different items (another seed, row count, split or family list) are listed
as not comparable, never compared. With `baseline` one evaluation is judged against the best trivial rule of each
task family on the same items (align/eval/baselines.py). This is the test the pipeline report applies.
"""

from __future__ import annotations

import math
from pathlib import Path

from align.eval.outcomes import OutcomeSet, outcome_sets, outcomes_path
from align.eval.statistics import paired_change

TOOL_SHARES = ("acc_with_tools", "acc_without_tools", "right_tool", "format")


def _sets(stage: dict) -> dict[str, OutcomeSet] | None:
    try:
        return outcome_sets(stage["eval"]["results"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def eval_outcomes(stage: dict, metric: str) -> dict | None:
    """Per-item outcomes of a share (`acc/<set>/<mode>`, `format/...`, `cf/<set>`, `tools/<mode>/<share>`, ...) in the
    stage's eval results: {"items": values, "prompts": the items' key, "families"}, or None (none recorded)."""
    found = (_sets(stage) or {}).get(metric)
    return None if found is None else {"items": list(found.values), "prompts": found.key, "families": found.families}


def paired_eval(before: dict, after: dict, metric: str, metric_after: str | None = None) -> dict | None:
    """The exact McNemar test of two stages' eval outcomes on the same items (None when either lacks them)."""
    a, b = eval_outcomes(before, metric), eval_outcomes(after, metric_after or metric)
    if a is None or b is None or len(a["items"]) != len(b["items"]) or a["prompts"] != b["prompts"]:
        return None
    return paired_change(a["items"], b["items"])


def _loss(a: OutcomeSet | None, b: OutcomeSet | None) -> dict | None:
    if a is None or b is None or a.key != b.key or len(a.values) < 2:
        return None
    diffs = [y - x for x, y in zip(a.values, b.values)]
    mean = sum(diffs) / len(diffs)
    half = 1.96 * math.sqrt(sum((d - mean) ** 2 for d in diffs) / (len(diffs) - 1) / len(diffs))
    word = "**worse**" if mean - half > 0 else "better" if mean + half < 0 else "within noise"
    return {"difference": mean, "ci_low": mean - half, "ci_high": mean + half, "word": word}


def paired_loss(before: dict, after: dict, metric: str = "loss/chat") -> dict | None:
    """Two stages' per-item losses on the same held-out items (the eval's `loss/chat`): the mean difference (after
    minus before) with its 95% interval; `word` is worse / better when the interval excludes 0, else within noise."""
    return _loss((_sets(before) or {}).get(metric), (_sets(after) or {}).get(metric))


def results_file(path: str | Path) -> Path:
    """The file holding an evaluation's outcomes (align.eval.outcomes.outcomes_path)."""
    return outcomes_path(path)


def _paired_share(metric: str) -> bool:
    """A share two models are compared on: an outcome of theirs, not a loss or the (model-free) baseline."""
    return not metric.startswith(("loss/", "baseline/"))


def paired_shares(stage: dict) -> list[str]:
    """The metric names whose per-item outcomes this stage's eval results hold, in the order they were written."""
    return [m for m in (_sets(stage) or {}) if _paired_share(m)]


def _by_family(metric: str) -> bool:
    return metric.startswith(("acc/", "tools/")) or metric.endswith("/accuracy")


def _row(metric: str, before: list, after: list) -> dict:
    p = paired_change(before, after)
    word = "within noise" if not p["significant"] else "better" if p["gained"] > p["lost"] else "worse"
    return {
        "metric": metric,
        "num": p["num"],
        "before": sum(before) / len(before),
        "after": sum(after) / len(after),
        "gained": p["gained"],
        "lost": p["lost"],
        "p_value": p["p_value"],
        "word": word,
    }


def _rows(metric: str, a: OutcomeSet, b: OutcomeSet) -> list[dict]:
    """The share, then each family alone (when the items name more than one)."""
    rows = [_row(metric, list(a.values), list(b.values))]
    families = a.families or ()
    for family in sorted(set(families)) if len(set(families)) > 1 and _by_family(metric) else []:
        keep = [i for i, f in enumerate(families) if f == family]
        rows.append(_row(f"{metric} [{family}]", [a.values[i] for i in keep], [b.values[i] for i in keep]))
    return rows


def compare(before: str | Path, after: str | Path, first: int | None = None) -> dict:
    """{"rows": one dict a share (and a family) both results hold on the same items, "not_comparable": the shares
    both hold on different items, "loss": the paired chat loss or None}. `first`: judge the shares on their first
    `first` items only (the same items in both, as the whole lists are; the chat loss stays whole), e.g. the 256
    prompts an earlier, smaller eval set held (the task sets keep their prefix as they grow)."""
    if first is not None and first < 1:
        raise ValueError(f"compare: first must be a positive number of items, got {first}")
    a_sets, b_sets = outcome_sets(before), outcome_sets(after)
    rows, not_comparable = [], []
    for metric in [m for m in a_sets if m in b_sets and _paired_share(m)]:
        a, b = a_sets[metric], b_sets[metric]
        if a.key != b.key:
            not_comparable.append(metric)
            continue
        rows += _rows(metric, a.head(first), b.head(first))
    if not rows and not_comparable:
        raise ValueError(
            f"compare: the two results were evaluated on different items ({', '.join(not_comparable)}): "
            "evaluate both with the same eval recipe (rows, families, seed, eval_split)"
        )
    if not rows:
        raise ValueError(
            "compare: the two results share no per-item outcomes: evaluate both with the same suites "
            "(generative, mc or tools) and the same rows"
        )
    return {
        "rows": rows,
        "not_comparable": not_comparable,
        "first": first,
        "loss": _loss(a_sets.get("loss/chat"), b_sets.get("loss/chat")),
    }


def compare_baseline(path: str | Path, first: int | None = None) -> dict:
    """One evaluation against the best trivial rule of each task family on the same items: per `acc/<set>/<mode>`
    with a `baseline/<set>/<mode>`, the share and each family (before: the rule, after: the model; `better`: the model
    beats it at p < 0.05). {"rows", "beaten": {share: families beaten}, "num_families": {share: families}}."""
    sets = outcome_sets(path)
    rows, beaten, num_families = [], {}, {}
    for metric, model in sets.items():
        base = sets.get("baseline/" + metric.removeprefix("acc/")) if metric.startswith("acc/") else None
        if base is None or base.key != model.key:
            continue
        found = _rows(metric, base.head(first), model.head(first))
        rows += found
        families = found[1:] or found[:1]
        beaten[metric] = sum(r["word"] == "better" for r in families)
        num_families[metric] = len(families)
    if not rows:
        raise ValueError(
            f"compare: {path} holds no baseline outcomes: evaluate with the generative suite on our task "
            "families (baselines: true)"
        )
    return {"rows": rows, "beaten": beaten, "num_families": num_families, "first": first, "baseline": True}


def compare_markdown(found: dict, before: str, after: str | None = None) -> str:
    """The comparison as a markdown table (bold: a change the paired test calls real, p < 0.05)."""
    which = f"the first {found['first']} items of each set" if found.get("first") else "the same items"
    if found.get("baseline"):
        lines = [
            f"# {before} against the best trivial rule of each task family",
            "",
            f"Paired on {which} (exact McNemar test); before: the rule, after: the model; p < 0.05 in bold.",
            "",
        ]
        lines += [
            f"- `{m}`: beats the baseline on {found['beaten'][m]} of {found['num_families'][m]} families"
            for m in found["beaten"]
        ] + [""]
    else:
        lines = [f"# {after} against {before}", "", f"Paired on {which} (exact McNemar test); p < 0.05 in bold.", ""]
    lines += ["| metric | n | before | after | gained | lost | p | verdict |", "|---|---|---|---|---|---|---|---|"]
    for r in found["rows"]:
        verdict = r["word"] if r["word"] == "within noise" else f"**{r['word']}**"
        lines.append(
            f"| {r['metric']} | {r['num']} | {r['before']:.1%} | {r['after']:.1%} | {r['gained']} | "
            f"{r['lost']} | {r['p_value']:.2g} | {verdict} |"
        )
    if found.get("loss"):
        loss = found["loss"]
        lines += [
            "",
            f"Chat loss (per item, after minus before): {loss['difference']:+.4f} "
            f"[{loss['ci_low']:+.4f}, {loss['ci_high']:+.4f}], {loss['word'].strip('*')}.",
        ]
    if found.get("not_comparable"):
        lines += ["", "Not comparable (evaluated on different items): " + ", ".join(found["not_comparable"]) + "."]
    return "\n".join(lines) + "\n"
