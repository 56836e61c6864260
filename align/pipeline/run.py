"""Chain every stage from one pipeline recipe: resumable, evaluated after each stage, with a lineage manifest.

    python scripts/pipeline.py recipes/tiny/pipeline.yaml              # what `make demo` runs
    python scripts/pipeline.py recipes/tiny/pipeline.yaml --report_only
    python scripts/pipeline.py recipes/smollm3/post_train_pipeline.yaml --start_at apo \
        --inputs '{sft: {output_dir: HuggingFaceTB/SmolLM3-3B}}'      # from a stage on, its input declared

A pipeline recipe lists stages; each names a script (pretrain, sft, generate_preferences, dpo, kto, orpo, apo,
grpo, distill, train_tokenizer, or a path to a .py file), that stage's own recipe, overrides, and optionally an
accelerate config. A value `${sft.output_dir}` is read from an earlier stage's resolved config
(recipe + overrides), so each stage's model feeds the next; `${run_dir}` is the pipeline's run directory
(align/pipeline/plan.py resolves the stages; this module runs them).

How a stage runs: its resolved config is written to `<run_dir>/configs/<stage>.yaml` and launched as a
subprocess (`accelerate launch [--config_file F] scripts/<x>.py <that yaml>`, or plain `python` with
`launcher: python`), output to `<run_dir>/logs/<stage>.log`. Only after it exits 0 AND its output is there
(a model dir has config.json) does the pipeline write a completion marker into the output dir
(`.smolalign_stage.json`, with a hash of the config). On a re-run, a stage with a marker is skipped unless its
config changed or a stage it references finished after it; a stage without one is re-run and, when its
script supports it and neither its config nor a stage it references changed since it started, resumes from its
latest complete checkpoint (`--resume_from_checkpoint <dir>`: HF-Trainer
`checkpoint-N` dirs or pretrain's `checkpoints/step_N`, as align/runtime/checkpoint.py names and finds them). Each
model stage is then evaluated (scripts/evaluate.py as a subprocess, on the dev split, results under
`<run_dir>/eval/<stage>/`); when every stage has finished, the final model and the SFT model it descends from are
evaluated once more, on the sealed test split (`<run_dir>/eval_test/<stage>/`, `sealed_test` in the manifest). The
manifest `<run_dir>/manifest.json` is rewritten atomically after every step: per stage the command, resolved config,
git commit, data provenance, eval and training metrics, duration and outcome. Tracking: stages log to wandb
(offline unless WANDB_MODE says otherwise) grouped by the pipeline run (WANDB_RUN_GROUP), or TensorBoard.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import yaml

from align.pipeline.plan import (
    DATA_KEYS,
    DISTRIBUTED,
    MARKER,
    ROOT,
    STARTED,
    PipelineConfig,
    Stage,
    decontamination_sets,
    read_yaml,
    resolve_stages,
    script_path,
    sealed_eval_config,
    sealed_test_stages,
)
from align.runtime.checkpoint import latest_checkpoint, write_json_atomic

# ----------------------------------------------------------------------------------------- state on disk


def config_hash(config: dict) -> str:
    return hashlib.sha256(json.dumps(config, sort_keys=True, default=str).encode()).hexdigest()[:16]


def read_marker(output_dir: str, name: str = MARKER) -> dict | None:
    try:
        return json.loads((Path(output_dir) / name).read_text())
    except (OSError, ValueError):
        return None


def output_complete(stage: Stage) -> bool:
    out = Path(stage.output_dir)
    if stage.makes_model:
        return (out / "config.json").is_file() or (out / "adapter_config.json").is_file()
    return (
        out.exists() and any(p.name not in (MARKER, STARTED) for p in out.iterdir()) if out.is_dir() else out.exists()
    )


def git_state() -> dict:
    def git(*args: str) -> str:
        try:
            return subprocess.run(["git", *args], cwd=ROOT, capture_output=True, text=True, timeout=20).stdout.strip()
        except (OSError, subprocess.SubprocessError):
            return ""

    return {
        "commit": git("rev-parse", "HEAD") or None,
        "dirty": bool(git("status", "--porcelain", "--untracked-files=no")),
    }


def provenance(config: dict) -> dict:
    """The data a stage read: its dataset / source / model keys (ids and arguments)."""
    return {k: v for k, v in config.items() if DATA_KEYS.search(k) and v not in (None, "", [], {})}


def flatten(d: dict, prefix: str = "", depth: int = 3) -> dict[str, float]:
    """Numeric leaves of nested dicts as {"a/b/c": x} (lists, strings and bools left out)."""
    out: dict[str, float] = {}
    for k, v in (d or {}).items():
        if isinstance(v, dict) and depth > 1:
            out.update(flatten(v, f"{prefix}{k}/", depth - 1))
        elif isinstance(v, (int, float)) and not isinstance(v, bool):
            out[prefix + str(k)] = v
    return out


# What each stage leaves behind besides its model: HF save_metrics files, pretrain's held-out loss and skill,
# the stages' own before/after evaluations, the preference data card.
STAGE_RESULT_FILES = (
    "all_results.json",
    "metrics.json",
    "skill.json",
    "sft_eval.json",
    "preference_eval.json",
    "grpo_eval.json",
    "distill_eval.json",
    "card.json",
    "decontamination.json",
)


def train_metrics(output_dir: str) -> dict[str, float]:
    """Scalars from a stage's result files, prefixed by the file's name (`skill/accuracy`, `grpo_eval/after/...`)."""
    out: dict[str, float] = {}
    for name in STAGE_RESULT_FILES:
        try:
            data = json.loads((Path(output_dir) / name).read_text())
        except (OSError, ValueError):
            continue
        if not isinstance(data, dict):
            continue
        if name == "metrics.json":  # pretrain: the whole history is in there; keep the end of it
            data = {
                "step": data.get("step"),
                "total_tokens": data.get("total_tokens"),
                "final_eval": data.get("final_eval"),
            }
        if name == "card.json":
            data = {"counts": data.get("counts"), "seconds": data.get("seconds")}
        if name == "decontamination.json":  # the counts; the report reads the examples from the file
            data = {k: data.get(k) for k in ("rows", "overlapping", "dropped")}
        out.update(flatten(data, name.removesuffix(".json") + "/"))
    return out


# ----------------------------------------------------------------------------------------------- running


def distributed(stage: Stage) -> bool:
    """The stage's script runs on many processes (the others, e.g. the tokenizer, run once, on machine 0)."""
    return stage.script in DISTRIBUTED or stage.script.endswith(".py")


def launcher_of(stage: Stage, cfg: PipelineConfig) -> str:
    launcher = stage.launcher or cfg.launcher
    if not distributed(stage):
        return "python"
    if launcher == "auto":
        many = (stage.num_processes or cfg.num_processes or 1) > 1 or cfg.num_machines > 1
        launcher = "accelerate" if stage.accelerate_config or cfg.accelerate_config or many else "python"
    return launcher


def stage_command(stage: Stage, cfg: PipelineConfig, config_path: Path, resume_from: str | None) -> list[str]:
    script = str(script_path(stage.script))
    if launcher_of(stage, cfg) == "accelerate":
        cmd = [sys.executable, "-m", "accelerate.commands.launch"]
        config_file = stage.accelerate_config or cfg.accelerate_config
        if config_file:
            cmd += ["--config_file", config_file]
        num_processes = stage.num_processes or cfg.num_processes
        if num_processes:
            cmd += ["--num_processes", str(num_processes)]
        if cfg.num_machines > 1:
            cmd += [
                "--num_machines",
                str(cfg.num_machines),
                "--machine_rank",
                str(cfg.machine_rank),
                "--main_process_ip",
                str(cfg.main_process_ip),
                "--main_process_port",
                str(cfg.main_process_port),
            ]
        cmd += [script]
    else:
        cmd = [sys.executable, script]
    cmd.append(str(config_path))
    if resume_from:
        cmd += ["--resume_from_checkpoint", resume_from]
    return cmd


def stage_env(cfg: PipelineConfig, run_id: str, stage: Stage) -> dict[str, str]:
    env = dict(os.environ)
    env.setdefault("WANDB_MODE", "offline")  # no account needed; `wandb sync` uploads later
    env.setdefault("WANDB_PROJECT", "smolalign")
    env.setdefault("TOKENIZERS_PARALLELISM", "false")
    env.update(
        WANDB_RUN_GROUP=cfg.tracking_group or run_id,
        WANDB_NAME=f"{run_id}/{stage.name}",
        WANDB_DIR=str(Path(cfg.run_dir).resolve()),
    )
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.update(stage.env)
    return env


def _last_line(log: Path) -> str:
    try:
        with log.open("rb") as f:
            f.seek(max(0, log.stat().st_size - 2048))
            tail = f.read().decode(errors="replace")
    except OSError:
        return ""
    lines = [x.strip() for x in re.split(r"[\r\n]", tail) if x.strip()]
    return lines[-1][:90] if lines else ""


# How long a stopped stage gets to save before SIGKILL: below Slurm's `--signal=SIGTERM@120` notice
# (recipes/slurm/smolalign.slurm). torchrun's agent, which also gets the signal, allows its workers 30 s.
STOP_GRACE_S = 100


def run_logged(cmd: list[str], env: dict, log: Path, on_tick=None) -> int:
    """Run `cmd` with its output appended to `log`; call on_tick(last log line) ~twice a second."""
    log.parent.mkdir(parents=True, exist_ok=True)
    with log.open("a") as f:
        f.write(f"\n=== {time.strftime('%Y-%m-%d %H:%M:%S')} $ {' '.join(cmd)}\n")
        f.flush()
        # own process group: on Ctrl-C / SIGTERM we stop the stage and everything it started. The stage runs in
        # the pipeline's working directory, so a relative path in a recipe means the same file to both (the
        # package's own directory is another place whenever smolalign is installed, not run from its checkout).
        proc = subprocess.Popen(
            cmd, stdout=f, stderr=subprocess.STDOUT, env=env, cwd=os.getcwd(), start_new_session=True
        )
        try:
            while proc.poll() is None:
                if on_tick:
                    on_tick(_last_line(log))
                time.sleep(0.5)
        except BaseException:
            # the stage finishes its step and saves a checkpoint on SIGTERM (align.runtime.checkpoint): give it time
            try:
                os.killpg(proc.pid, signal.SIGTERM)
                proc.wait(timeout=STOP_GRACE_S)
            except (ProcessLookupError, subprocess.TimeoutExpired):
                os.killpg(proc.pid, signal.SIGKILL)
            raise
    return proc.returncode


class Manifest:
    """manifest.json: the pipeline's lineage record, rewritten atomically after every change."""

    def __init__(self, cfg: PipelineConfig, stages: list[Stage]):
        self.leader = cfg.machine_rank == 0
        self.path = Path(cfg.run_dir) / "manifest.json"
        old = json.loads(self.path.read_text()) if self.path.is_file() else {}
        prev = {s["name"]: s for s in old.get("stages", [])}
        self.data = {
            "name": cfg.name,
            "run_id": old.get("run_id") or f"{cfg.name}-{time.strftime('%Y%m%d-%H%M%S')}",
            "created": old.get("created", time.strftime("%Y-%m-%dT%H:%M:%S")),
            "argv": sys.argv,
            "git": git_state(),
            "pipeline": {k: v for k, v in asdict(cfg).items() if k != "stages"},
            "stages": [prev.get(s.name, {"name": s.name, "status": "pending"}) for s in stages],
            "sealed_test": old.get("sealed_test") or {},  # evaluated once: kept until its model or config changes
        }
        for rec, s in zip(self.data["stages"], stages):
            rec.update(
                script=s.script,
                recipe=s.recipe,
                output_dir=s.output_dir,
                target=s.target,
                makes_model=s.makes_model,
                parent=s.parent,
            )

    def stage(self, name: str) -> dict:
        return next(s for s in self.data["stages"] if s["name"] == name)

    def save(self) -> None:
        if not self.leader:  # machine 0 alone writes the record (machines share the run_dir)
            return
        self.data["updated"] = time.strftime("%Y-%m-%dT%H:%M:%S")
        write_json_atomic(self.path, self.data)


def needs_run(stage: Stage, stages: dict[str, Stage], forced: set[str]) -> tuple[bool, str]:
    """(run it?, why). "not finished" is the one reason to resume; any other reason starts the stage fresh."""
    marker = read_marker(stage.output_dir)
    if stage.name in forced:
        return True, "asked to rerun"
    if marker is None:
        started = read_marker(stage.output_dir, STARTED)
        if started and started.get("config_hash") != config_hash(stage.config):
            return True, "its config changed since it was interrupted"
        if started:  # an interrupted stage resumes only on the inputs it started from
            since = started.get("started") or (Path(stage.output_dir) / STARTED).stat().st_mtime
            for ref in stage.refs:
                up = read_marker(stages[ref].output_dir)
                if up and up.get("finished", 0) > since:
                    return True, f"'{ref}' finished after it was interrupted"
        return True, "not finished"
    if marker.get("config_hash") != config_hash(stage.config):
        return True, "its config changed since it finished"
    for ref in stage.refs:
        up = read_marker(stages[ref].output_dir)
        if up and up.get("finished", 0) > marker.get("finished", 0):
            return True, f"'{ref}' finished after it"
    return False, "finished earlier"


def eval_config(stage: Stage, cfg: PipelineConfig, sealed: bool = False) -> dict:
    """The eval recipe a stage's model is evaluated with: the pipeline's and the stage's overrides on the eval recipe,
    on the dev split, or (`sealed`) on the sealed test split, its results in `eval_test/` instead of `eval/`."""
    config = {**read_yaml(cfg.eval_recipe, "eval_recipe"), **(cfg.eval_overrides or {}), **stage.eval_overrides}
    if sealed:
        config = sealed_eval_config(config)
    out_dir = Path(cfg.run_dir) / ("eval_test" if sealed else "eval") / stage.name
    config.update(model_name_or_path=stage.output_dir, output_dir=str(out_dir), stage=stage.name)
    return config


def evaluate_stage(
    stage: Stage, cfg: PipelineConfig, env: dict, log: Path, on_tick=None, sealed: bool = False
) -> dict:
    config = eval_config(stage, cfg, sealed)
    out_dir = Path(config["output_dir"])
    path = Path(cfg.run_dir) / "configs" / f"eval{'_test' if sealed else ''}_{stage.name}.yaml"
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    cmd = [sys.executable, str(ROOT / cfg.eval_script), str(path)]
    t = time.time()
    rc = run_logged(cmd, env, log, on_tick)
    rec = {
        "command": cmd,
        "returncode": rc,
        "duration_s": round(time.time() - t, 2),
        "results": str(out_dir / "eval_results.json"),
        "config_hash": config_hash(config),
    }
    if rc == 0:
        results = json.loads((out_dir / "eval_results.json").read_text())
        rec["metrics"] = results["metrics"]
        rec["stats"] = results.get("stats", {})  # item counts, 95% intervals, MC chance: the report shows them
    return rec


def leader_finished(stage: Stage, cfg: PipelineConfig) -> bool:
    """Machine 0 is done with `stage`: its marker is written AND, when machine 0 evaluates it, the evaluation is
    recorded. A follower that launched stage k+1 on the marker alone waited at the rendezvous while machine 0 still
    evaluated stage k; a long evaluation outlasted torch's 600 s rendezvous timeout."""
    if read_marker(stage.output_dir) is None:
        return False
    if not (stage.eval and cfg.eval_recipe):
        return True
    try:
        records = json.loads((Path(cfg.run_dir) / "manifest.json").read_text()).get("stages", [])
    except (OSError, ValueError):
        return False
    rec = next((r for r in records if r["name"] == stage.name), {})
    return "returncode" in (rec.get("eval") or {})


def follow_stage(
    stage: Stage, cfg: PipelineConfig, run_dir: Path, env: dict, log: Path, tick, console, label: str, why: str
) -> None:
    """A machine other than 0 in a multi-node run: launch its ranks of a distributed stage (the launcher meets
    machine 0's ranks at the rendezvous), then wait until machine 0 has recorded the stage as finished, so both
    machines decide the next stage from the same markers. Single-process stages run on machine 0 only."""
    start = time.time()
    if distributed(stage):
        resume_from = latest_checkpoint(stage.output_dir) if stage.resume and why == "not finished" else None
        config_path = run_dir / "configs" / f"{stage.name}.machine{cfg.machine_rank}.yaml"
        config_path.parent.mkdir(parents=True, exist_ok=True)
        config_path.write_text(yaml.safe_dump(stage.config, sort_keys=False))
        cmd = stage_command(stage, cfg, config_path, resume_from)
        console.print(f"{label}: running on machine {cfg.machine_rank}; log {log}")
        rc = run_logged(cmd, env, log.with_name(f"{log.stem}.machine{cfg.machine_rank}.log"), tick)
        if rc != 0:
            raise RuntimeError(
                f"stage '{stage.name}' failed on machine {cfg.machine_rank} (exit code {rc}); see "
                f"{log}. Re-run the pipeline on every machine to resume it."
            )
    while not leader_finished(stage, cfg):
        recorded = Path(cfg.run_dir) / "manifest.json"
        status = next(
            (
                s.get("status")
                for s in (json.loads(recorded.read_text()).get("stages", []) if recorded.is_file() else [])
                if s["name"] == stage.name
            ),
            None,
        )
        if status == "failed" or time.time() - start > cfg.wait_for_main_s:
            raise RuntimeError(
                f"machine 0 did not record stage '{stage.name}' as finished (status {status}, waited "
                f"{time.time() - start:.0f} s); see its log {log}"
            )
        time.sleep(1.0)
    console.print(f"{label}: done (recorded by machine 0)")


def run_pipeline(cfg: PipelineConfig, console=None) -> dict:
    """Run (or resume) every stage in order; return the manifest. Raises RuntimeError on a failed stage.

    Long because it is one loop over the stages whose steps (skip, follow the leader, start, run, record, evaluate)
    update the same manifest record and progress bar in the order a resume reads them back."""
    from rich.console import Console
    from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn

    console = console or Console(soft_wrap=True)
    stages = resolve_stages(cfg)
    by_name = {s.name: s for s in stages}
    stages = [s for s in stages if not s.before_start]
    if cfg.until:
        stages = stages[: [s.name for s in stages].index(cfg.until) + 1]
    run_dir = Path(cfg.run_dir)
    manifest = Manifest(cfg, list(by_name.values()))
    forced = set(cfg.rerun)
    for s in by_name.values():
        if s.before_start:
            rec = manifest.stage(s.name)  # an earlier run's record of it stays as it was
            rec["skipped_this_run"] = True
            if rec["status"] == "pending":
                rec["status"] = "not run"
            console.print(f"{s.name}: not run (before start_at={cfg.start_at})")
    if cfg.dry_run:
        for s in stages:
            path = run_dir / "configs" / f"{s.name}.yaml"
            console.print(
                f"[bold]{s.name}[/]: {' '.join(stage_command(s, cfg, path, None))}  "
                f"({needs_run(s, by_name, forced)[1]})"
            )
        return manifest.data
    manifest.save()
    planned = decontamination_sets(cfg, list(by_name.values()))
    if planned is not None and manifest.leader:  # what each training stage checks its rows against
        write_json_atomic(planned[0], planned[1], indent=2)
        manifest.data["decontamination"] = {"mode": cfg.decontamination, "eval_sets": str(planned[0])}
        manifest.save()
    columns = [
        TextColumn("[bold]{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total}"),
        TimeElapsedColumn(),
    ]
    with Progress(*columns, console=console, transient=False) as progress:
        bar = progress.add_task("pipeline", total=len(stages))
        for i, stage in enumerate(stages):
            rec = manifest.stage(stage.name)
            label = f"[{i + 1}/{len(stages)}] {stage.name}"
            run, why = needs_run(stage, by_name, forced)
            env = stage_env(cfg, manifest.data["run_id"], stage)
            log = run_dir / "logs" / f"{stage.name}.log"
            tick = lambda line, label=label: progress.update(bar, description=f"{label}: {line}")  # noqa: E731
            if not run:
                rec["status"] = "done"
                rec["skipped_this_run"] = True
                console.print(f"{label}: skipped ({why})")
            elif not manifest.leader:
                follow_stage(stage, cfg, run_dir, env, log, tick, console, label, why)
                progress.update(bar, advance=1, description=label)
                continue
            else:
                resume_from = latest_checkpoint(stage.output_dir) if stage.resume and why == "not finished" else None
                config_path = run_dir / "configs" / f"{stage.name}.yaml"
                config_path.parent.mkdir(parents=True, exist_ok=True)
                config_path.write_text(
                    f"# {stage.name}: {stage.script} {stage.recipe or ''} + overrides\n"
                    + yaml.safe_dump(stage.config, sort_keys=False)
                )
                cmd = stage_command(stage, cfg, config_path, resume_from)
                console.print(
                    f"{label}: running ({why}{', resuming from ' + resume_from if resume_from else ''}); log {log}"
                )
                out = Path(stage.output_dir)
                (out / MARKER).unlink(missing_ok=True)
                if why != "not finished" and out.exists():
                    # A fresh start must not pick up the old run's checkpoints (stages auto-resume): keep the
                    # old output one level aside instead of deleting it.
                    aside = out.with_name(out.name + ".previous")
                    shutil.rmtree(aside, ignore_errors=True)
                    out.rename(aside)
                    console.print(f"{label}: previous output moved to {aside}")
                write_json_atomic(
                    out / STARTED,
                    {"stage": stage.name, "config_hash": config_hash(stage.config), "started": time.time()},
                )
                start = time.time()
                rec.update(
                    status="running",
                    command=cmd,
                    config=stage.config,
                    config_path=str(config_path),
                    git=git_state(),
                    data=provenance(stage.config),
                    resumed_from=resume_from,
                    log=str(log),
                    started=time.strftime("%Y-%m-%dT%H:%M:%S"),
                    attempts=rec.get("attempts", 0) + 1,
                    skipped_this_run=False,
                )
                rec.pop("eval", None)
                manifest.save()
                try:
                    rc = run_logged(cmd, env, log, tick)
                except BaseException:
                    rec.update(status="interrupted", duration_s=round(time.time() - start, 2))
                    manifest.save()
                    raise
                rec.update(returncode=rc, duration_s=round(time.time() - start, 2))
                if rc != 0 or not output_complete(stage):
                    why = f"exit code {rc}" if rc != 0 else f"exit 0 but no finished output in {stage.output_dir}"
                    rec.update(status="failed", error=why)
                    manifest.save()
                    raise RuntimeError(
                        f"stage '{stage.name}' failed ({why}); see its log {log}. Re-run the pipeline to resume it."
                    )
                finished = time.time()
                write_json_atomic(
                    Path(stage.output_dir) / MARKER,
                    {
                        "stage": stage.name,
                        "config_hash": config_hash(stage.config),
                        "finished": finished,
                        "run_id": manifest.data["run_id"],
                    },
                )
                rec.update(
                    status="done",
                    finished=time.strftime("%Y-%m-%dT%H:%M:%S"),
                    train_metrics=train_metrics(stage.output_dir),
                )
                console.print(f"{label}: done in {rec['duration_s']:.1f} s")
            manifest.save()
            if (
                manifest.leader
                and stage.eval
                and cfg.eval_recipe
                and (run or "metrics" not in (rec.get("eval") or {}))
            ):
                progress.update(bar, description=f"{label}: evaluating")
                rec["eval"] = evaluate_stage(stage, cfg, env, run_dir / "logs" / f"eval_{stage.name}.log", tick)
                manifest.save()
                if rec["eval"]["returncode"] != 0:
                    console.print(
                        f"[red]{label}: evaluation failed[/] (log {run_dir / 'logs' / f'eval_{stage.name}.log'})"
                    )
            rec["metrics"] = (rec.get("eval") or {}).get("metrics", {})
            rec["stats"] = (rec.get("eval") or {}).get("stats", {})
            manifest.save()
            progress.update(bar, advance=1, description=label)
        if manifest.leader and cfg.sealed_test and cfg.eval_recipe and len(stages) == len(by_name):
            run_sealed_test(cfg, list(by_name.values()), manifest, console, progress, bar)
    return manifest.data


def run_sealed_test(cfg: PipelineConfig, stages: list[Stage], manifest: Manifest, console, progress, bar) -> None:
    """The chain has finished: its final model and the SFT model it descends from, evaluated once on the sealed test
    split (`run_dir/eval_test/<stage>/`). Evaluated again only when the model or its eval config changed since."""
    sealed = manifest.data.setdefault("sealed_test", {})
    chosen = sealed_test_stages(stages)
    sealed["stages"] = [s.name for s in chosen]
    for stage in chosen:
        rec = sealed.get(stage.name) or {}
        made = (read_marker(stage.output_dir) or {}).get("finished")
        wanted = config_hash(eval_config(stage, cfg, sealed=True))
        if rec.get("returncode") == 0 and rec.get("config_hash") == wanted and rec.get("model_finished") == made:
            console.print(f"sealed test of {stage.name}: evaluated earlier (skipped)")
            continue
        progress.update(bar, description=f"sealed test: {stage.name}")
        log = Path(cfg.run_dir) / "logs" / f"eval_test_{stage.name}.log"
        rec = evaluate_stage(
            stage,
            cfg,
            stage_env(cfg, manifest.data["run_id"], stage),
            log,
            lambda line, name=stage.name: progress.update(bar, description=f"sealed test {name}: {line}"),
            sealed=True,
        )
        rec["model_finished"] = made
        sealed[stage.name] = rec
        manifest.save()
        if rec["returncode"] != 0:
            console.print(f"[red]sealed test of {stage.name}: evaluation failed[/] (log {log})")
        else:
            console.print(f"sealed test of {stage.name}: done in {rec['duration_s']:.1f} s")
