"""Ablations: change one thing, run it against a baseline on the same evaluation, keep what wins.

    python scripts/ablate.py recipes/ablations/tiny_preference.yaml               # run (or continue) it
    python scripts/ablate.py recipes/ablations/tiny_preference.yaml --report_only true
    python scripts/ablate.py recipes/ablations/smol135m_preference.yaml --executor slurm   # one array job per run

An ablation recipe names a base (one stage: `script`, `recipe`, `overrides`; or a pipeline from one stage on:
`pipeline`, `from_stage`), named variants (each a set of overrides, optionally another script or recipe; exactly
one is the `baseline`), seeds, the metric that decides and a budget. Every variant x seed is one run: a one-run
pipeline (align/pipeline/run.py) under `<run_dir>/runs/<variant>-s<seed>/`, launched as `python scripts/pipeline.py
<its pipeline.yaml>`, so it gets the pipeline's finished-markers, resume from the last checkpoint, per-stage
evaluation and wandb tracking (one wandb group per ablation). A finished run is skipped; an interrupted one
resumes; rerunning the command continues the ablation. Every run's config is checked against its script's
dataclasses before any run starts (an unknown key or a bad value is one line).

The verdict (align/pipeline/ablation_report.py): each variant against the baseline on the same held-out prompts, per
seed by the exact McNemar test and over seeds by a test stratified by seed (`align.eval.statistics.paired_over_seeds`),
with the metric's mean and interval over seeds; written to `<run_dir>/ablation.md`, `ablation.json` and `plots/`.
"""

from __future__ import annotations

import json
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import yaml

from align.cli import RecipeError, load_recipe
from align.pipeline.plan import LAUNCHERS, REF, ROOT, TRACKING, PipelineConfig, read_yaml, resolve_stages, script_path
from align.pipeline.run import read_marker

EXECUTORS = ("local", "slurm")


@dataclass
class AblationConfig:
    """The ablation recipe (keys of the same names); `base` and `variants` are described in the module doc."""

    name: str = field(default="ablation", metadata={"help": "Ablation name: run_dir default, wandb group, titles."})
    base: dict = field(
        default_factory=dict,
        metadata={
            "help": "What every run trains: {script, recipe, overrides} (one stage) or {pipeline, from_stage} (a "
            "pipeline's stages from from_stage on; earlier stages must have finished)."
        },
    )
    variants: list[dict] = field(
        default_factory=list,
        metadata={
            "help": "[{name, overrides, script?, recipe?, remove?, stage_overrides?, baseline?, description?}]: what "
            "each variant changes (`remove`: keys of the base recipe its script does not take, e.g. ORPO's "
            "loss_type); exactly one has baseline: true (or the first is the baseline)."
        },
    )
    overrides: dict | None = field(
        default=None,
        metadata={
            "help": "Overrides for every run's ablated stage (under each variant's own), e.g. a shorter max_steps."
        },
    )
    seeds: list[int] = field(default_factory=lambda: [0], metadata={"help": "Seeds; every variant runs once each."})
    seed_key: str = field(default="seed", metadata={"help": "The config key each run's seed is written to."})
    metric: str = field(
        default="acc/tasks/think",
        metadata={
            "help": "The metric that decides: an eval-suite share (acc/<set>/<mode>, format/<set>/<mode>) or a "
            "stage's own held-out accuracy (grpo_eval/accuracy, distill_eval/accuracy). Higher is better."
        },
    )
    also_report: list[str] = field(
        default_factory=list,
        metadata={"help": "More metrics in the table, each with its own paired verdict (e.g. acc/tasks/no_think)."},
    )
    metric_stage: str | None = field(default=None, metadata={"help": "The stage whose metric counts (default: last)."})
    eval_recipe: str | None = field(
        default="recipes/tiny/eval.yaml",
        metadata={"help": "Eval recipe run after each run's stages: the same prompts for every variant and seed."},
    )
    eval_overrides: dict | None = field(default=None, metadata={"help": "Keys overriding the eval recipe."})
    allow_sealed_test: bool = field(
        default=False,
        metadata={
            "help": "An ablation chooses on the dev split; evaluating its runs on the sealed test split (eval_split: "
            "test) is refused unless this asks for it by name."
        },
    )
    run_dir: str | None = field(
        default=None, metadata={"help": "Where runs and results go (outputs/ablations/<name>)."}
    )
    num_parallel: int = field(
        default=1, metadata={"help": "Runs at a time on this machine (each gets cores / num_parallel threads)."}
    )
    max_minutes: float | None = field(
        default=None,
        metadata={"help": "Budget: no new run starts after this many minutes; rerun the command to continue."},
    )
    executor: str = field(
        default="local",
        metadata={"help": f"{EXECUTORS}: run here, or write a Slurm array job (one task per run) and run nothing."},
    )
    launcher: str = field(default="auto", metadata={"help": f"{LAUNCHERS}: how each run launches its stages."})
    accelerate_config: str | None = field(default=None, metadata={"help": "accelerate config for every run's stages."})
    num_processes: int | None = field(default=None, metadata={"help": "Processes per stage launch."})
    tracking: str = field(default="wandb", metadata={"help": f"{TRACKING}: report_to for every run's stages."})
    report_only: bool = field(default=False, metadata={"help": "Only (re)write ablation.md, JSON and plots."})
    dry_run: bool = field(
        default=False, metadata={"help": "Check every run's config and print the runs; run nothing."}
    )

    def __post_init__(self):
        if not re.fullmatch(r"[A-Za-z0-9_\-]+", self.name):
            raise ValueError(f"name={self.name!r}: use letters, digits, '_' and '-' (it names directories)")
        self.run_dir = self.run_dir or f"outputs/ablations/{self.name}"
        if not isinstance(self.base, dict) or not (
            {"script"} <= set(self.base) or {"pipeline", "from_stage"} <= set(self.base)
        ):
            raise ValueError("base: give {script, recipe, overrides} (one stage) or {pipeline, from_stage}")
        if not self.variants or not all(isinstance(v, dict) and v.get("name") for v in self.variants):
            raise ValueError("variants: list at least two {name, overrides} mappings, one with baseline: true")
        names = [str(v["name"]) for v in self.variants]
        bad = [n for n in names if not re.fullmatch(r"[A-Za-z0-9_\-]+", n)]
        if bad or len(set(names)) != len(names):
            raise ValueError(f"variants: names must be unique [A-Za-z0-9_-]+ (got {names})")
        allowed = {"name", "overrides", "script", "recipe", "remove", "stage_overrides", "baseline", "description"}
        for v in self.variants:
            if set(v) - allowed:
                raise ValueError(
                    f"variant '{v['name']}': unknown key(s) {sorted(set(v) - allowed)}; valid: {sorted(allowed)}"
                )
        baselines = [v["name"] for v in self.variants if v.get("baseline")]
        if len(baselines) > 1:
            raise ValueError(f"variants: one baseline, got {baselines}")
        if not self.seeds or len(set(self.seeds)) != len(self.seeds):
            raise ValueError(f"seeds={self.seeds}: give distinct seeds, e.g. [0, 1, 2]")
        for key, value, valid in (
            ("executor", self.executor, EXECUTORS),
            ("launcher", self.launcher, LAUNCHERS),
            ("tracking", self.tracking, TRACKING),
        ):
            if value not in valid:
                raise ValueError(f"{key}={value!r}: choose one of {valid}")
        if self.num_parallel < 1:
            raise ValueError(f"num_parallel={self.num_parallel} must be >= 1")

    @property
    def baseline(self) -> str:
        return next((v["name"] for v in self.variants if v.get("baseline")), self.variants[0]["name"])


@dataclass
class Run:
    variant: str
    seed: int
    dir: Path
    pipeline: dict  # the one-run pipeline recipe

    @property
    def name(self) -> str:
        return f"{self.variant}-s{self.seed}"

    @property
    def recipe(self) -> Path:
        return self.dir / "pipeline.yaml"


# ----------------------------------------------------------------------------------------------- the plan


def _base_stages(cfg: AblationConfig) -> list[dict]:
    """The raw stages every run starts from: one stage, or a pipeline's from `from_stage` on with references to its
    earlier (finished) stages replaced by their values."""
    base = cfg.base
    if "script" in base:
        script = str(base["script"])
        return [
            {
                "name": str(base.get("name", script)),
                "script": script,
                "recipe": base.get("recipe"),
                "overrides": dict(base.get("overrides") or {}),
            }
        ]
    raw = read_yaml(base["pipeline"], "base.pipeline")
    keys = set(PipelineConfig.__dataclass_fields__)
    original = PipelineConfig(**{k: v for k, v in raw.items() if k in keys})
    resolved = resolve_stages(original)
    names = [s.name for s in resolved]
    if base["from_stage"] not in names:
        raise ValueError(
            f"base.from_stage={base['from_stage']!r} is not a stage of {base['pipeline']}; stages: {names}"
        )
    cut = names.index(base["from_stage"])
    earlier = {s.name: s.config for s in resolved[:cut]}
    for s in resolved[:cut]:
        if s.makes_model and read_marker(s.output_dir) is None:
            raise ValueError(
                f"base: stage '{s.name}' of {base['pipeline']} has not finished; run `python "
                f"scripts/pipeline.py {base['pipeline']} --until {names[cut - 1]}` first"
            )

    def pin(value):  # ${earlier.key} -> its value; ${run_dir} and later stages' references stay for each run
        if isinstance(value, dict):
            return {k: pin(v) for k, v in value.items()}
        if isinstance(value, list):
            return [pin(v) for v in value]
        if not isinstance(value, str) or "${" not in value:
            return value
        whole = REF.fullmatch(value)
        if whole and whole.group(1) in earlier and whole.group(2):
            return earlier[whole.group(1)][whole.group(2)]
        return REF.sub(
            lambda m: str(earlier[m.group(1)][m.group(2)]) if m.group(1) in earlier and m.group(2) else m.group(0),
            value,
        )

    return [pin(dict(s)) for s in raw["stages"][cut:]]


def _without(recipe: str | None, keys: list[str], path: Path) -> str | None:
    """A copy of `recipe` without `keys` at `path` (written when it differs), so a variant can drop a key its script
    does not take."""
    if not recipe:
        return recipe
    config = {k: v for k, v in read_yaml(recipe, "variant recipe").items() if k not in set(keys)}
    text = f"# {recipe} without {sorted(keys)}\n" + yaml.safe_dump(config, sort_keys=False)
    if not path.is_file() or path.read_text() != text:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return str(path)


def plan(cfg: AblationConfig) -> list[Run]:
    """Every variant x seed as a one-run pipeline recipe, seed-major (a partial ablation has every variant at the
    first seed). Nothing is run; a variant with `remove` gets its trimmed recipe written beside its run."""
    stages = _base_stages(cfg)
    runs = []
    for seed in cfg.seeds:
        for v in cfg.variants:
            run_dir = Path(cfg.run_dir) / "runs" / f"{v['name']}-s{seed}"
            out = []
            for i, raw in enumerate(stages):
                stage = {**raw, "overrides": dict(raw.get("overrides") or {})}
                if i == 0:
                    stage["script"] = v.get("script", stage["script"])
                    stage["recipe"] = v.get("recipe", stage.get("recipe"))
                    stage["overrides"].update(cfg.overrides or {})
                    stage["overrides"].update(v.get("overrides") or {})
                    if v.get("remove"):  # keys the variant's script does not take: out of the recipe and overrides
                        stage["recipe"] = _without(
                            stage.get("recipe"), v["remove"], run_dir / f"{stage['name']}.recipe.yaml"
                        )
                        for key in v["remove"]:
                            stage["overrides"].pop(key, None)
                stage["overrides"].update((v.get("stage_overrides") or {}).get(stage["name"], {}))
                stage["overrides"]["output_dir"] = f"${{run_dir}}/{stage['name']}"
                stage["overrides"][cfg.seed_key] = seed
                stage["eval"] = stage["name"] == (cfg.metric_stage or stages[-1]["name"])  # one eval per run
                out.append(stage)
            unknown = set(v.get("stage_overrides") or {}) - {s["name"] for s in stages}
            if unknown:
                raise ValueError(
                    f"variant '{v['name']}': stage_overrides for {sorted(unknown)}, which are not stages "
                    f"of this ablation ({[s['name'] for s in stages]})"
                )
            pipeline = {
                "name": f"{cfg.name}-{v['name']}-s{seed}",
                "run_dir": str(run_dir),
                "launcher": cfg.launcher,
                "eval_recipe": cfg.eval_recipe,
                "eval_overrides": cfg.eval_overrides,
                "tracking": cfg.tracking,
                "tracking_group": cfg.name,
                "report": False,
                "accelerate_config": cfg.accelerate_config,
                "num_processes": cfg.num_processes,
                "stages": out,
                "sealed_test": False,  # a run is one variant being chosen: the sealed test is for a finished chain
            }
            runs.append(Run(v["name"], seed, run_dir, pipeline))
    if cfg.metric_stage and cfg.metric_stage not in [s["name"] for s in stages]:
        raise ValueError(
            f"metric_stage={cfg.metric_stage!r} is not a stage of the ablation ({[s['name'] for s in stages]})"
        )
    if not cfg.allow_sealed_test:
        check_dev_only(cfg, runs)
    return runs


def check_dev_only(cfg: AblationConfig, runs: list[Run]) -> None:
    """An ablation chooses, so it evaluates on the dev split: an eval config (the recipe, the ablation's or a stage's
    eval_overrides) that asks for the sealed test split is one line, unless `allow_sealed_test` asks for it."""
    base = read_yaml(cfg.eval_recipe, "eval_recipe") if cfg.eval_recipe else {}
    for run in runs:
        for stage in run.pipeline["stages"]:
            merged = {**base, **(cfg.eval_overrides or {}), **(stage.get("eval_overrides") or {})}
            if stage.get("eval") and merged.get("eval_split", "dev") != "dev":
                raise ValueError(
                    f"ablation '{cfg.name}', variant '{run.variant}', stage '{stage['name']}': "
                    f"eval_split={merged['eval_split']!r} evaluates the sealed test split, which is kept "
                    "for the end of a chain; an ablation chooses on dev (drop eval_split), or set "
                    "allow_sealed_test: true to ask for the test split by name"
                )


def script_types(script: str) -> tuple:
    """The dataclasses a stage script parses its recipe into (its CONFIG_TYPES)."""
    import runpy

    namespace = runpy.run_path(str(script_path(script)))
    types = namespace.get("CONFIG_TYPES")
    if not types:
        raise ValueError(f"script '{script}' has no CONFIG_TYPES: it cannot be checked (or ablated)")
    return tuple(types)


def check(runs: list[Run]) -> None:
    """Resolve every run's pipeline and check each stage's config against its script's dataclasses (keys and value
    types), so a typo in one variant fails now, in one line, not after the other runs spent their time."""
    types: dict[str, tuple] = {}
    for run in runs:
        stages = resolve_stages(PipelineConfig(**run.pipeline))
        for stage in stages:
            if stage.script not in types:
                types[stage.script] = script_types(stage.script)
            with tempfile.NamedTemporaryFile("w", suffix=".yaml", delete=False) as f:
                yaml.safe_dump(stage.config, f)
            try:
                load_recipe(f.name, types[stage.script])
            except RecipeError as e:
                raise ValueError(
                    f"variant '{run.variant}', stage '{stage.name}': " + str(e).replace(f" in {f.name}", "")
                ) from None
            finally:
                os.unlink(f.name)


def write_runs(runs: list[Run]) -> None:
    for run in runs:
        run.dir.mkdir(parents=True, exist_ok=True)
        text = f"# python scripts/pipeline.py {run.recipe}\n" + yaml.safe_dump(run.pipeline, sort_keys=False)
        if not run.recipe.is_file() or run.recipe.read_text() != text:
            run.recipe.write_text(text)


def finished(run: Run) -> bool:
    """Every stage of the run done (the pipeline's markers), and the evaluated stage evaluated."""
    try:
        stages = json.loads((run.dir / "manifest.json").read_text()).get("stages", [])
    except (OSError, ValueError):
        return False
    evaluated = (
        {st["name"] for st in run.pipeline["stages"] if st.get("eval")} if run.pipeline.get("eval_recipe") else set()
    )
    return bool(stages) and all(
        s.get("status") == "done"
        and read_marker(s["output_dir"]) is not None
        and (s["name"] not in evaluated or s.get("metrics"))
        for s in stages
    )


# ------------------------------------------------------------------------------------------------ running


def _stop_with_parent() -> None:
    """In a run's process: get SIGTERM when the ablation process dies, even by SIGKILL (Linux `PR_SET_PDEATHSIG`), so
    no orphaned run keeps writing while a rerun starts the same run; the pipeline turns SIGTERM into a clean stop."""
    if sys.platform.startswith("linux"):
        import ctypes

        ctypes.CDLL("libc.so.6", use_errno=True).prctl(1, signal.SIGTERM)  # 1 = PR_SET_PDEATHSIG


def run_all(cfg: AblationConfig, runs: list[Run], log=print) -> dict:
    """Run every unfinished run, `num_parallel` at a time, until done or the budget is spent. Returns
    {"ran", "skipped", "left", "failed"} (run names). Ctrl-C / SIGTERM stops the running ones (they resume)."""
    todo = [r for r in runs if not finished(r)]
    skipped = [r.name for r in runs if r not in todo]
    for name in skipped:
        log(f"{name}: finished earlier (skipped)")
    threads = max(1, (os.cpu_count() or 1) // cfg.num_parallel)
    start, active, ran, failed = time.time(), {}, [], []
    queue = list(todo)

    def launch(run: Run) -> subprocess.Popen:
        env = {
            **os.environ,
            "PYTHONPATH": os.pathsep.join(filter(None, [str(ROOT), os.environ.get("PYTHONPATH")])),
            "PYTHONUNBUFFERED": "1",
        }  # the run's log shows where it is while it runs
        if cfg.num_parallel > 1:
            env.setdefault("OMP_NUM_THREADS", str(threads))
        log_file = open(run.dir / "ablation.log", "a")  # noqa: SIM115 (closed when the run ends)
        proc = subprocess.Popen(
            [sys.executable, str(ROOT / "scripts" / "pipeline.py"), str(run.recipe)],
            env=env,
            stdout=log_file,
            stderr=subprocess.STDOUT,
            cwd=os.getcwd(),
            start_new_session=True,
            preexec_fn=_stop_with_parent,
        )
        proc.log_file, proc.started = log_file, time.time()
        log(
            f"{run.name}: running ({len(ran) + len(active) + 1}/{len(todo)} of this call; "
            f"log {run.dir / 'ablation.log'})"
        )
        return proc

    try:
        while queue or active:
            over = cfg.max_minutes is not None and time.time() - start > cfg.max_minutes * 60
            while queue and len(active) < cfg.num_parallel and not over:
                run = queue.pop(0)
                active[run.name] = (run, launch(run))
            for name, (run, proc) in list(active.items()):
                if proc.poll() is None:
                    continue
                proc.log_file.close()
                del active[name]
                took = time.time() - proc.started
                if proc.returncode == 0 and finished(run):
                    ran.append(name)
                    log(f"{name}: done in {took:.0f} s")
                else:
                    failed.append(name)
                    log(
                        f"{name}: FAILED (exit code {proc.returncode}) after {took:.0f} s; "
                        f"see {run.dir / 'ablation.log'}"
                    )
            if over and queue and not active:
                log(
                    f"budget of {cfg.max_minutes:g} min spent: {len(queue)} run(s) not started; run the command again "
                    "to continue"
                )
                break
            time.sleep(0.5)
    except BaseException:
        for _, proc in active.values():
            try:
                os.killpg(proc.pid, signal.SIGTERM)  # the pipeline stops its stage; the run resumes next time
            except ProcessLookupError:
                pass
        for _, proc in active.values():
            try:
                proc.wait(timeout=60)
            except subprocess.TimeoutExpired:
                os.killpg(proc.pid, signal.SIGKILL)
        raise
    return {"ran": ran, "skipped": skipped, "left": [r.name for r in queue], "failed": failed}


SLURM = """#!/bin/bash
# sbatch {script}
# Ablation '{name}': one array task per run ({num} runs: {runs_list}). Each task runs one run's pipeline; a requeued
# or repeated task skips what finished and resumes from the last checkpoint. When all tasks are done:
#   python scripts/ablate.py {recipe} --report_only true
#SBATCH --job-name=ablate-{name}
#SBATCH --array=0-{last}
#SBATCH --ntasks=1
#SBATCH --requeue
#SBATCH --signal=B:SIGTERM@120
#SBATCH --output={slurm_dir}/%x-%A_%a.out
set -euo pipefail
cd "${{SLURM_SUBMIT_DIR:-.}}"
RUNS=({runs})
RUN=${{RUNS[$SLURM_ARRAY_TASK_ID]:?no run for array task $SLURM_ARRAY_TASK_ID}}
export WANDB_MODE=${{WANDB_MODE:-offline}}
# exec: the pipeline becomes the batch shell, so Slurm's SIGTERM (B:, two minutes before preemption) reaches it and it
# stops its stage cleanly; the environment's python (activate it, or set PYTHON)
exec "${{PYTHON:-python}}" scripts/pipeline.py "$RUN"
"""


def write_slurm(cfg: AblationConfig, runs: list[Run], recipe: str) -> Path:
    """`<run_dir>/slurm/ablation.sbatch`: a Slurm array job, task i runs runs[i] (submit from the repository)."""
    slurm_dir = Path(cfg.run_dir) / "slurm"
    slurm_dir.mkdir(parents=True, exist_ok=True)
    path = slurm_dir / "ablation.sbatch"
    path.write_text(
        SLURM.format(
            script=path,
            name=cfg.name,
            num=len(runs),
            runs_list=", ".join(r.name for r in runs),
            recipe=recipe,
            last=len(runs) - 1,
            slurm_dir=slurm_dir,
            runs=" ".join(f'"{r.recipe}"' for r in runs),
        )
    )
    path.chmod(0o755)
    return path
