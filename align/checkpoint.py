"""Crash-safe training state for every HF-Trainer stage: atomic checkpoints, auto-resume, and a non-finite guard.

Why: transformers 5.19's `Trainer._save_checkpoint` writes straight into `checkpoint-N`, and `get_last_checkpoint`
picks the highest `checkpoint-N` whether or not it was finished, so a run killed mid-save resumes from a torn
checkpoint (or crashes on it). Here, on top of the Trainer's own saving (which already stores model, optimizer,
scheduler, scaler, per-rank RNG and trainer state, and whose resume skips the consumed batches):

* `install(trainer, script_args)` makes each save atomic: the Trainer writes into `.tmp-checkpoint-N/`, every
  file is fsynced, a completion marker (`smolalign_complete.json`) is written, and only then the directory is
  renamed to `checkpoint-N`. A directory without the marker is never loaded. The last `save_total_limit` complete
  checkpoints are kept (plus the best one when `load_best_model_at_end`).
* `resume_checkpoint(training_args)` is what every stage passes to `trainer.train(resume_from_checkpoint=...)`:
  unset/"auto" -> the latest complete checkpoint in output_dir (None for a fresh dir), "no"/"false" -> fresh
  start, a path -> that checkpoint (an error if it is partial).
* After a resume, a trainer with its own rollout engine (GRPO) gets `sync_engine()` before the first step, so the
  engine generates with the restored weights, not the initial ones.
* `NonFiniteGuard` checks every optimizer step: a NaN/inf micro-batch loss, a non-finite gradient norm, or a
  gradient norm above `grad_explosion_factor` x the median of recent steps. The step is logged with its step
  and batch index and handled per `on_nonfinite`: `skip` drops the update (gradients discarded, so neither the
  weights nor the Adam moments move) and trains on; `stop` drops it, saves a checkpoint and raises
  `NonFiniteError` naming the step (re-running the same command resumes after the bad batch).

    trainer = trl.SFTTrainer(...)
    install(trainer, script_args)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))

Distributed: every rank writes its part into the staging directory (DeepSpeed shards, per-rank RNG); the
renaming process (`args.should_save`) renames after a barrier. Guard decisions use the all-reduced gradient norm,
so every rank decides alike. Under DeepSpeed the engine owns the gradients: the guard only logs there.
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import shutil
import statistics
import time
import types
from pathlib import Path

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

COMPLETE_MARKER = "smolalign_complete.json"
STAGING_PREFIX = ".tmp-"
NONFINITE_POLICIES = ("skip", "stop")
_CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
_FRESH = {"no", "false", "none", "never", "fresh", "0"}
_AUTO = {"", "auto", "yes", "true", "latest", "1"}


class NonFiniteError(ValueError):
    """Training stopped on a NaN/inf loss or an exploding gradient (after saving a checkpoint)."""


# ----------------------------------------------------------------------------- finding checkpoints


def is_complete(path: str | os.PathLike) -> bool:
    """True for a checkpoint written to the end: it carries the completion marker and its trainer state."""
    p = Path(path)
    return (p / COMPLETE_MARKER).is_file() and (p / "trainer_state.json").is_file()


def list_checkpoints(output_dir: str | os.PathLike, complete_only: bool = True) -> list[Path]:
    """`checkpoint-N` directories of output_dir, oldest step first (partial ones left out unless asked)."""
    root = Path(output_dir)
    if not root.is_dir():
        return []
    found = []
    for p in root.iterdir():
        m = _CHECKPOINT_RE.match(p.name)
        if m and p.is_dir() and (not complete_only or is_complete(p)):
            found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The latest COMPLETE checkpoint of output_dir (resume_from_checkpoint=True semantics, torn ones skipped)."""
    partial = [p for p in list_checkpoints(output_dir, complete_only=False) if not is_complete(p)]
    for p in partial:
        logger.warning("ignoring %s: no completion marker (a save that did not finish); it will not be loaded", p)
    done = list_checkpoints(output_dir)
    return str(done[-1]) if done else None


def resume_checkpoint(training_args) -> str | None:
    """What to pass to `trainer.train(resume_from_checkpoint=...)` (see the module doc)."""
    value = getattr(training_args, "resume_from_checkpoint", None)
    if value is None or value is True or (isinstance(value, str) and value.strip().lower() in _AUTO):
        path = latest_checkpoint(training_args.output_dir)
        if path:
            logger.info("resuming from %s (the latest complete checkpoint in %s)", path, training_args.output_dir)
        return path
    if value is False or (isinstance(value, str) and value.strip().lower() in _FRESH):
        return None
    p = Path(str(value)).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(
            f"resume_from_checkpoint={value!r} does not exist; use 'auto' (the latest complete checkpoint in "
            "output_dir), 'no' (start fresh) or an existing checkpoint-N directory"
        )
    if not is_complete(p):
        raise ValueError(
            f"resume_from_checkpoint={value!r} is a partial checkpoint (no {COMPLETE_MARKER}: its save did not "
            "finish); use 'auto' to take the latest complete one"
        )
    return str(p)


# ----------------------------------------------------------------------------- atomic saving


def _fsync_tree(path: str) -> None:
    for root, _, files in os.walk(path):
        for name in files:
            with open(os.path.join(root, name), "rb") as fh:
                os.fsync(fh.fileno())
        _fsync_dir(root)


def _fsync_dir(path: str) -> None:
    try:
        fd = os.open(path, os.O_RDONLY)
    except OSError:
        return
    try:
        os.fsync(fd)
    except OSError:  # some filesystems refuse fsync on directories
        pass
    finally:
        os.close(fd)


def write_marker(path: str, step: int) -> None:
    """Write the completion marker of a checkpoint directory (tmp name, fsync, rename)."""
    files = {
        os.path.relpath(os.path.join(r, f), path): os.path.getsize(os.path.join(r, f))
        for r, _, fs in os.walk(path)
        for f in fs
    }
    tmp = os.path.join(path, f".{COMPLETE_MARKER}.tmp")
    with open(tmp, "w") as f:
        json.dump({"step": step, "time": time.time(), "files": files}, f, indent=1)
        f.flush()
        os.fsync(f.fileno())
    os.rename(tmp, os.path.join(path, COMPLETE_MARKER))


def rotate(output_dir: str, keep: int | None, best: str | None = None) -> list[str]:
    """Delete all but the last `keep` complete checkpoints (the best one is kept too); return what was deleted."""
    if not keep or keep <= 0:
        return []
    done = list_checkpoints(output_dir)
    doomed = [p for p in done[:-keep] if not (best and os.path.abspath(best) == os.path.abspath(p))]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return [str(p) for p in doomed]


def clean_staging(output_dir: str) -> None:
    """Remove staging directories a killed run left behind (they were never complete)."""
    root = Path(output_dir)
    if root.is_dir():
        for p in root.glob(f"{STAGING_PREFIX}checkpoint-*"):
            logger.warning("removing %s: a checkpoint save interrupted by a crash", p)
            shutil.rmtree(p, ignore_errors=True)


def _atomic_save(trainer, original):
    def save_checkpoint(self, model, trial=None):
        args, state = self.args, self.state
        run_dir = self._get_output_dir(trial=trial)
        name = f"checkpoint-{state.global_step}"
        staging_root, final = os.path.join(run_dir, f"{STAGING_PREFIX}{name}"), os.path.join(run_dir, name)
        if args.should_save:
            shutil.rmtree(staging_root, ignore_errors=True)
            os.makedirs(staging_root)
        self.accelerator.wait_for_everyone()
        own = "_get_output_dir" in vars(self)
        saved = vars(self).get("_get_output_dir")
        self._get_output_dir = lambda trial=None: staging_root  # the Trainer writes run_dir/checkpoint-N there
        try:
            original(model, trial)
        finally:
            if own:
                self._get_output_dir = saved
            else:
                del self._get_output_dir
        self.accelerator.wait_for_everyone()
        if args.should_save:
            staged = os.path.join(staging_root, name)
            if state.best_model_checkpoint and state.best_model_checkpoint.startswith(staging_root):
                state.best_model_checkpoint = final
                state.save_to_json(os.path.join(staged, "trainer_state.json"))
            _fsync_tree(staged)
            write_marker(staged, state.global_step)
            if os.path.exists(final):  # a torn save of the same step, or a re-save: replace it
                shutil.rmtree(final)
            os.rename(staged, final)
            _fsync_dir(run_dir)
            shutil.rmtree(staging_root, ignore_errors=True)
            deleted = rotate(run_dir, args.save_total_limit, state.best_model_checkpoint)
            logger.info("saved %s atomically%s", final, f"; deleted {deleted}" if deleted else "")
        self.accelerator.wait_for_everyone()

    return types.MethodType(save_checkpoint, trainer)


# ----------------------------------------------------------------------------- numerics


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return True


class NonFiniteGuard(TrainerCallback):
    """Detect NaN/inf losses and gradient explosions each optimizer step; skip the update or stop (module doc)."""

    def __init__(self, trainer, policy: str = "stop", explosion_factor: float = 100.0, window: int = 20):
        if policy not in NONFINITE_POLICIES:
            raise ValueError(f"on_nonfinite={policy!r}: choose one of {list(NONFINITE_POLICIES)}")
        if explosion_factor < 0:
            raise ValueError(f"grad_explosion_factor must be >= 0 (0 turns the check off), got {explosion_factor}")
        self.trainer, self.policy, self.factor, self.window = trainer, policy, explosion_factor, window
        self.norms: list[float] = []  # recent healthy grad norms (the explosion baseline)
        self.events: list[dict] = []  # every bad step seen: {step, batch, reason}
        self.micro = 0  # micro-batches (forward+backward) since the start of training
        self.bad_loss: tuple[int, float] | None = None
        self.grad_norm: float | None = None
        self.stopping: dict | None = None
        self._wrap()

    def _wrap(self) -> None:
        guard, trainer = self, self.trainer
        training_step = trainer.training_step

        def checked_training_step(*args, **kwargs):
            loss = training_step(*args, **kwargs)
            if guard.bad_loss is None and not _finite(loss.detach().float().mean()):
                guard.bad_loss = (guard.micro, float(loss.detach().float().mean()))
            guard.micro += 1
            return loss

        trainer.training_step = checked_training_step
        if hasattr(trainer, "_get_grad_norm"):  # transformers 5.x: the pre-clip norm, all-reduced
            get_grad_norm = trainer._get_grad_norm

            def recorded_grad_norm(*args, **kwargs):
                norm = get_grad_norm(*args, **kwargs)
                guard.grad_norm = None if norm is None else float(norm)
                return norm

            trainer._get_grad_norm = recorded_grad_norm

    def on_train_begin(self, args, state, control, **kwargs):
        self.micro = state.global_step * args.gradient_accumulation_steps

    def on_step_begin(self, args, state, control, **kwargs):
        self.bad_loss, self.grad_norm = None, None

    def _reason(self) -> str | None:
        if self.bad_loss is not None:
            return f"non-finite loss {self.bad_loss[1]}"
        norm = self.grad_norm
        if norm is None:
            return None
        if not math.isfinite(norm):
            return f"non-finite gradient norm {norm}"
        if self.factor and len(self.norms) >= 10:
            baseline = statistics.median(self.norms[-self.window :])
            if norm > self.factor * baseline:
                return f"gradient explosion (norm {norm:.4g} > {self.factor:g} x recent median {baseline:.4g})"
        return None

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        reason = self._reason()
        if reason is None:
            if self.grad_norm is not None:
                self.norms = (self.norms + [self.grad_norm])[-self.window :]
            return
        step = state.global_step + 1  # the step being taken; log_history counts from 1
        ga = args.gradient_accumulation_steps
        batch = self.bad_loss[0] if self.bad_loss else self.micro - ga
        event = {"step": step, "batch": batch, "reason": reason}
        self.events.append(event)
        trainer = self.trainer
        if trainer.is_deepspeed_enabled:
            logger.error("step %d, batch %d: %s (DeepSpeed owns the gradients: not skipped)", step, batch, reason)
            return
        if getattr(trainer.accelerator, "scaler", None) is None:  # a GradScaler skips non-finite steps itself
            for p in trainer.model.parameters():
                p.grad = None  # optimizers skip parameters without a gradient: weights and moments stay put
        logger.warning("step %d, batch %d: %s; update skipped (on_nonfinite=%s)", step, batch, reason, self.policy)
        if self.policy == "stop":
            self.stopping = event

    def on_step_end(self, args, state, control, **kwargs):
        if self.stopping is not None:
            control.should_save = True
            control.should_training_stop = True

    def on_save(self, args, state, control, **kwargs):
        if self.stopping is None:
            return
        e, self.stopping = self.stopping, None
        path = os.path.join(args.output_dir, f"checkpoint-{state.global_step}")
        raise NonFiniteError(
            f"{e['reason']} at step {e['step']} (batch {e['batch']}): training stopped (on_nonfinite=stop); "
            f"checkpoint saved at {path} without that update. Re-run the same command to resume after the bad "
            "batch, or lower learning_rate, or set on_nonfinite: skip"
        )


class _EngineResync(TrainerCallback):
    """After a resume, push the restored weights to a trainer's own rollout engine before the first step."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step > 0 and callable(getattr(self.trainer, "sync_engine", None)):
            self.trainer.sync_engine()
            logger.info("resumed at step %d: rollout engine weights synced", state.global_step)


def install(trainer, script_args=None) -> NonFiniteGuard:
    """Atomic checkpoints, engine resync after resume and the non-finite guard on an HF/TRL trainer."""
    if getattr(trainer, "_smolalign_checkpoint_installed", False):
        return trainer._smolalign_guard
    trainer._save_checkpoint = _atomic_save(trainer, trainer._save_checkpoint)
    if trainer.args.should_save:
        clean_staging(trainer.args.output_dir)
    policy = getattr(script_args, "on_nonfinite", "stop") or "stop"
    factor = getattr(script_args, "grad_explosion_factor", 100.0)
    guard = NonFiniteGuard(trainer, policy, 100.0 if factor is None else factor)
    trainer.add_callback(guard)
    trainer.add_callback(_EngineResync(trainer))
    trainer._smolalign_checkpoint_installed, trainer._smolalign_guard = True, guard
    return guard
