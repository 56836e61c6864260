"""An ablation's results: every run's metric with its per-item outcomes, each variant's verdict against the baseline,
written as `ablation.md` (one table), `ablation.json` (every run) and `plots/` (the metric per variant with its
interval; training curves per variant). See align/pipeline/ablation.py for how the runs are made.

A metric's per-item outcomes come from the evaluated stage: the eval suite's `gen/<set>/<mode>` outcomes
(`acc/...` -> correct, `format/...` -> formatted; align/eval/suite.py), or a stage's own result file
(`grpo_eval/accuracy` -> grpo_eval.json's after.correct). The verdict is `align.eval.statistics.paired_over_seeds`.
"""

from __future__ import annotations

import json
from pathlib import Path

from align.eval.compare import eval_outcomes
from align.eval.statistics import mean_over_seeds, paired_over_seeds
from align.pipeline.ablation import AblationConfig, Run, finished
from align.pipeline.report import _plt, _series, log_history


def _manifest(run: Run) -> dict:
    try:
        return json.loads((run.dir / "manifest.json").read_text())
    except (OSError, ValueError):
        return {}


def outcomes(run: Run, metric: str, stage: str | None = None) -> dict | None:
    """{"value", "num", "items" (0/1 per item), "prompts"} of one run's metric, or None when it has none."""
    stages = _manifest(run).get("stages", [])
    rec = next((s for s in stages if s["name"] == stage), None) if stage else (stages[-1] if stages else None)
    if rec is None:
        return None
    head, _, rest = metric.partition("/")
    if metric in (rec.get("metrics") or {}):  # an eval-suite metric: acc/<set>/<mode> or format/<set>/<mode>
        got = eval_outcomes(rec, metric)
        return None if got is None else {"value": rec["metrics"][metric], "num": len(got["items"]), **got}
    try:  # a stage's own result file: grpo_eval/accuracy -> <output_dir>/grpo_eval.json {"after": {...}}
        own = json.loads((Path(rec["output_dir"]) / f"{head}.json").read_text())["after"]
    except (OSError, ValueError, KeyError, TypeError):
        return None
    if rest not in own or "correct" not in own or rest != "accuracy":
        return None
    items = [int(bool(x)) for x in own["correct"]]
    return {"value": own[rest], "num": len(items), "items": items, "prompts": None}


def seconds(run: Run) -> float:
    """Wall time of a run: its stages and evaluations."""
    total = 0.0
    for s in _manifest(run).get("stages", []):
        total += float(s.get("duration_s") or 0) + float((s.get("eval") or {}).get("duration_s") or 0)
    return total


def describe(variant: dict) -> str:
    if variant.get("description"):
        return str(variant["description"])
    parts = [f"script {variant['script']}"] if variant.get("script") else []
    parts += [f"recipe {variant['recipe']}"] if variant.get("recipe") else []
    parts += [f"without {', '.join(variant['remove'])}"] if variant.get("remove") else []
    parts += [f"{k}={v}" for k, v in (variant.get("overrides") or {}).items()]
    for stage, over in (variant.get("stage_overrides") or {}).items():
        parts += [f"{stage}.{k}={v}" for k, v in over.items()]
    return ", ".join(parts) or "(the base as it is)"


def results(cfg: AblationConfig, runs: list[Run]) -> dict:
    """Every run's numbers and every variant's verdict per metric (the decisive one first)."""
    metrics = [cfg.metric, *[m for m in cfg.also_report if m != cfg.metric]]
    by = {(r.variant, r.seed): r for r in runs}
    out = {
        "name": cfg.name,
        "baseline": cfg.baseline,
        "metric": cfg.metric,
        "seeds": cfg.seeds,
        "runs": [],
        "variants": [],
    }
    cache: dict[tuple, dict | None] = {}
    for r in runs:
        done = finished(r)
        row = {"variant": r.variant, "seed": r.seed, "dir": str(r.dir), "finished": done, "seconds": seconds(r)}
        for m in metrics:
            cache[(r.name, m)] = outcomes(r, m, cfg.metric_stage) if done else None
            got = cache[(r.name, m)]
            row[m] = None if got is None else {"value": got["value"], "num": got["num"]}
        out["runs"].append(row)
    for v in cfg.variants:
        entry = {
            "variant": v["name"],
            "baseline": v["name"] == cfg.baseline,
            "changes": describe(v),
            "seconds": sum(seconds(by[(v["name"], s)]) for s in cfg.seeds),
            "metrics": {},
        }
        for m in metrics:
            mine = {s: cache[(f"{v['name']}-s{s}", m)] for s in cfg.seeds}
            have = {s: x for s, x in mine.items() if x is not None}
            summary: dict = {"num_seeds": len(have), "per_seed": {s: x["value"] for s, x in have.items()}}
            if have:
                summary.update(mean_over_seeds([x["value"] for x in have.values()], [x["num"] for x in have.values()]))
            if v["name"] != cfg.baseline:
                base = {s: cache[(f"{cfg.baseline}-s{s}", m)] for s in cfg.seeds}
                pairs = [
                    (base[s]["items"], have[s]["items"])
                    for s in have
                    if base.get(s) is not None
                    and len(base[s]["items"]) == len(have[s]["items"])
                    and base[s]["prompts"] == have[s]["prompts"]
                ]
                if pairs:
                    summary["vs_baseline"] = paired_over_seeds(pairs)
            entry["metrics"][m] = summary
        out["variants"].append(entry)
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f}%"


def markdown(cfg: AblationConfig, res: dict, plots: list[str]) -> str:
    lines = [
        f"# Ablation: {cfg.name}",
        "",
        f"Metric `{cfg.metric}` (higher is better), {len(cfg.seeds)} seed(s) {cfg.seeds}, baseline "
        f"**{cfg.baseline}**. Each cell: mean over seeds ± half its 95% interval (Student's t over the seeds; one "
        "seed: Wilson). Difference: the variant minus the baseline on the same prompts, stratified by seed "
        "(random effects over the seeds' paired differences; `align.eval.statistics.paired_over_seeds`), with its 95% "
        "interval and p-value; per-seed exact McNemar counts in ablation.json.",
        "",
    ]
    metrics = [cfg.metric, *[m for m in cfg.also_report if m != cfg.metric]]
    for m in metrics:
        if m != cfg.metric:
            lines += [f"### Also: `{m}`", ""]
        lines += [
            "| variant | what it changes | " + m + " | vs baseline | p | verdict | seeds | wall time |",
            "|---|---|---:|---:|---:|---|---:|---:|",
        ]
        for v in res["variants"]:
            s = v["metrics"][m]
            cell = f"{_pct(s['mean'])} ± {100 * (s['ci_high'] - s['ci_low']) / 2:.1f}" if "mean" in s else "—"
            vs = s.get("vs_baseline")
            if v["baseline"]:
                diff, p, verdict = "(baseline)", "", ""
            elif vs:
                diff = f"{100 * vs['difference']:+.1f} pts [{100 * vs['ci_low']:+.1f}, {100 * vs['ci_high']:+.1f}]"
                p, verdict = (
                    f"{vs['p_value']:.2g}",
                    f"**{vs['verdict']}**" if vs["verdict"] != "within noise" else vs["verdict"],
                )
            else:
                diff, p, verdict = "—", "", "not run yet"
            name = f"**{v['variant']}**" if v["baseline"] else v["variant"]
            lines.append(
                f"| {name} | {v['changes']} | {cell} | {diff} | {p} | {verdict} | {s['num_seeds']}/"
                f"{len(cfg.seeds)} | {v['seconds'] / 60:.1f} min |"
            )
        lines.append("")
    tests = sum(1 for v in res["variants"] for m in metrics if "vs_baseline" in v["metrics"][m])
    if tests > 1:
        lines += [
            f"{tests} variant-vs-baseline tests in these tables: with no real differences, about "
            f"{0.05 * tests:.1f} of them would read better or worse at p < 0.05 by chance; a lone verdict near "
            "p = 0.05 among them is weak evidence.",
            "",
        ]
    missing = [f"{r['variant']}-s{r['seed']}" for r in res["runs"] if not r["finished"]]
    if missing:
        lines += [
            f"Not finished yet ({len(missing)}): {', '.join(missing)}. Run the same command again to continue.",
            "",
        ]
    lines += [f"![{Path(p).name}](plots/{Path(p).name})" for p in plots]
    return "\n".join(lines) + "\n"


def plot(cfg: AblationConfig, res: dict, runs: list[Run], out_dir: Path) -> list[str]:
    """plots/metric.png (mean and interval per variant, each seed a dot) and plots/curves.png (training loss per
    variant over steps, every seed)."""
    made = []
    out_dir.mkdir(parents=True, exist_ok=True)
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(4.5, 1.1 * len(res["variants"]) + 2), 3.4))
    for i, v in enumerate(res["variants"]):
        s = v["metrics"][cfg.metric]
        if "mean" not in s:
            continue
        ax.errorbar(
            [i],
            [s["mean"]],
            yerr=[[s["mean"] - s["ci_low"]], [s["ci_high"] - s["mean"]]],
            fmt="o",
            color="black" if v["baseline"] else "tab:blue",
            capsize=4,
        )
        ax.scatter([i] * len(s["per_seed"]), list(s["per_seed"].values()), s=10, color="tab:orange", zorder=3)
    ax.set_xticks(range(len(res["variants"])), [v["variant"] for v in res["variants"]], rotation=20)
    ax.set(title=f"{cfg.name}: {cfg.metric}", ylabel=cfg.metric)
    fig.tight_layout()
    fig.savefig(out_dir / "metric.png", dpi=90)
    plt.close(fig)
    made.append(str(out_dir / "metric.png"))
    curves = {}
    for r in runs:
        stage = next((s for s in _manifest(r).get("stages", [])), None)
        pts = _series(log_history(stage["output_dir"]), "loss") if stage else []
        if pts:
            curves.setdefault(r.variant, []).append(pts)
    if curves:
        fig, ax = plt.subplots(figsize=(6, 3.4))
        colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
        for i, (variant, series) in enumerate(curves.items()):
            for j, pts in enumerate(series):
                ax.plot(*zip(*pts), lw=1, color=colors[i % len(colors)], label=variant if j == 0 else None)
        ax.set(title="training loss (the ablated stage; every seed)", xlabel="step", ylabel="loss")
        ax.legend(fontsize=7)
        fig.tight_layout()
        fig.savefig(out_dir / "curves.png", dpi=90)
        plt.close(fig)
        made.append(str(out_dir / "curves.png"))
    return made


def write(cfg: AblationConfig, runs: list[Run]) -> Path:
    """ablation.md, ablation.json and plots/ under the ablation's run_dir; returns the markdown's path."""
    out = Path(cfg.run_dir)
    res = results(cfg, runs)
    plots = plot(cfg, res, runs, out / "plots")
    (out / "ablation.json").write_text(json.dumps(res, indent=1, default=str))
    path = out / "ablation.md"
    path.write_text(markdown(cfg, res, plots))
    return path
