"""Crash-safe training state for every training job: atomic checkpoints, their names, auto-resume.

One module for the checkpoints of the HF-Trainer stages (SFT, preference, GRPO, distillation), of pretraining's
own loop and of the pipeline that resumes either. Two layouts, one rule for each:

* trainer layout: `<output_dir>/checkpoint-N`, the HF Trainer's own name (its resume reads it); the Trainer saves
  model, optimizer, scheduler, scaler, per-rank RNG and trainer state, and its resume skips the consumed batches.
* loop layout: `<output_dir>/checkpoints/step_NNNNNNN`, pretraining's loop (`save_loop_checkpoint` /
  `load_loop_checkpoint`): model weights (a loadable HF model), optimizer or DeepSpeed's sharded state (`ds/`),
  RNG, and the loop's state (step, data position, history).

Every save is atomic the same way: the files are written into `.tmp-<name>/` next to the final directory, every
file is fsynced, a completion marker (`smolalign_complete.json`) is written, and only then is the directory renamed
to its name. A trainer-layout directory without the marker is never loaded (transformers 5.19's `get_last_checkpoint`
would pick a torn one); a loop-layout directory only ever got its name when whole, so older ones without the
marker still resume. The last `save_total_limit` complete checkpoints are kept (plus the best one).

* `install(trainer, script_args)` makes an HF/TRL trainer's saves atomic, resyncs its rollout engine after a resume
  (`sync_engine()`, GRPO/distillation) and adds the non-finite guard (`align.runtime.nonfinite`).
* `resume_checkpoint(training_args)` is what every stage passes to `trainer.train(resume_from_checkpoint=...)`:
  unset/"auto" -> the latest complete checkpoint in output_dir (None for a fresh dir), "no"/"false" -> fresh
  start, a path -> that checkpoint (an error if it is partial). `resolve_resume` is the same for any layout.
* `latest_checkpoint(output_dir)`: the newest complete checkpoint of either layout (what the pipeline resumes).

    trainer = trl.SFTTrainer(...)
    install(trainer, script_args)
    trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))

Distributed: every rank writes its part into the staging directory (DeepSpeed shards, per-rank RNG); the renaming
process (`args.should_save`, or the main process in the loop) renames after a barrier.
"""

from __future__ import annotations

import json
import logging
import os
import random
import re
import shutil
import time
import types
from collections.abc import Iterable
from pathlib import Path

import torch
from safetensors.torch import load_file
from transformers import TrainerCallback

from align.runtime.nonfinite import NONFINITE_POLICIES, NonFiniteError, NonFiniteGuard  # noqa: F401

logger = logging.getLogger(__name__)

# transformers' Trainer's private names this module overrides or reads, each with the parameters we rely on (checked
# against the installed TRL by tests/test_trl_private_names.py: an upgrade that renames or reshapes one fails there, in
# one place).
TRL_PRIVATE_METHODS = {
    "_save_checkpoint": "(self, model, trial)",  # wrapped: saves go to a staging dir, then an atomic rename
    "_get_output_dir": "(self, trial)",  # where the Trainer puts checkpoints
}
TRL_PRIVATE_ATTRIBUTES = ()


COMPLETE_MARKER = "smolalign_complete.json"
STAGING_PREFIX = ".tmp-"
LAYOUTS = ("trainer", "loop")
_NAMES = {"trainer": re.compile(r"^checkpoint-(\d+)$"), "loop": re.compile(r"^step_(\d+)$")}
_LEGACY_STAGING = ".tmp_step_"  # the loop's staging name before it shared this module's
DS_TAG = "ds"  # the DeepSpeed engine's own checkpoint inside a loop checkpoint
_FRESH = {"no", "false", "none", "never", "fresh", "0"}
_AUTO = {"", "auto", "yes", "true", "latest", "1"}


# ----------------------------------------------------------------------------- names


def _root(output_dir: str | os.PathLike, layout: str) -> Path:
    return Path(output_dir) / "checkpoints" if layout == "loop" else Path(output_dir)


def checkpoint_path(output_dir: str | os.PathLike, step: int, layout: str = "trainer") -> str:
    """Where the checkpoint of `step` lives: output_dir/checkpoint-N (trainer) or output_dir/checkpoints/step_N."""
    name = f"checkpoint-{step}" if layout == "trainer" else f"step_{step:07d}"
    return str(_root(output_dir, layout) / name)


def _layout_of(path: Path) -> str | None:
    return next((layout for layout, pattern in _NAMES.items() if pattern.match(path.name)), None)


def is_complete(path: str | os.PathLike) -> bool:
    """True for a checkpoint written to the end: its trainer state and the completion marker (a loop checkpoint
    written before the marker existed is whole by its name: it was renamed into place only when finished)."""
    p = Path(path)
    if not (p / "trainer_state.json").is_file():
        return False
    return (p / COMPLETE_MARKER).is_file() or _layout_of(p) == "loop"


def list_checkpoints(
    output_dir: str | os.PathLike, complete_only: bool = True, layouts: Iterable[str] = ("trainer",)
) -> list[Path]:
    """The checkpoints of output_dir in the given layouts, oldest step first (partial ones left out unless asked)."""
    found = []
    for layout in layouts:
        root = _root(output_dir, layout)
        if not root.is_dir():
            continue
        for p in root.iterdir():
            m = _NAMES[layout].match(p.name)
            if m and p.is_dir() and (not complete_only or is_complete(p)):
                found.append((int(m.group(1)), p))
    return [p for _, p in sorted(found)]


def latest_checkpoint(output_dir: str | os.PathLike, layouts: Iterable[str] = LAYOUTS) -> str | None:
    """The latest COMPLETE checkpoint of output_dir (resume_from_checkpoint=True semantics, torn ones skipped)."""
    layouts = tuple(layouts)
    for p in list_checkpoints(output_dir, complete_only=False, layouts=layouts):
        if not is_complete(p):
            logger.warning("ignoring %s: no completion marker (a save that did not finish); it will not be loaded", p)
    done = list_checkpoints(output_dir, layouts=layouts)
    return str(done[-1]) if done else None


def resolve_resume(value, output_dir: str | os.PathLike, layout: str = "trainer", unset: str = "auto") -> str | None:
    """A `resume_from_checkpoint` value -> the checkpoint to load, or None for a fresh start (see the module doc).
    `unset` says what None means: "auto" (the HF stages) or "no" (pretraining)."""
    if value is None:
        value = unset
    if value is True or (isinstance(value, str) and value.strip().lower() in _AUTO):
        path = latest_checkpoint(output_dir, (layout,))
        if path:
            logger.info("resuming from %s (the latest complete checkpoint in %s)", path, output_dir)
        return path
    if value is False or (isinstance(value, str) and value.strip().lower() in _FRESH):
        return None
    p = Path(str(value)).expanduser()
    if not p.is_dir():
        raise FileNotFoundError(
            f"resume_from_checkpoint={value!r} does not exist; use 'auto' (the latest complete checkpoint in "
            "output_dir), 'no' (start fresh) or an existing checkpoint directory"
        )
    if not is_complete(p):
        raise ValueError(
            f"resume_from_checkpoint={value!r} is a partial checkpoint (no {COMPLETE_MARKER}: its save did not "
            "finish); use 'auto' to take the latest complete one"
        )
    return str(p)


def resume_checkpoint(training_args) -> str | None:
    """What to pass to `trainer.train(resume_from_checkpoint=...)` (see the module doc)."""
    return resolve_resume(getattr(training_args, "resume_from_checkpoint", None), training_args.output_dir)


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


def write_json_atomic(path: str | os.PathLike, data: dict, indent: int = 1) -> None:
    """Write a JSON file whole or not at all (hidden tmp name, fsync, rename): readers, and a rerun after a kill, see
    the old file or the new one, never half of one. Markers, manifests, stage reports and round reports use it."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    with open(tmp, "w") as f:
        json.dump(data, f, indent=indent, default=str)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def write_marker(path: str, step: int) -> None:
    """Write the completion marker of a checkpoint directory."""
    files = {
        os.path.relpath(os.path.join(r, f), path): os.path.getsize(os.path.join(r, f))
        for r, _, fs in os.walk(path)
        for f in fs
    }
    write_json_atomic(os.path.join(path, COMPLETE_MARKER), {"step": step, "time": time.time(), "files": files})


def staging_path(final: str) -> str:
    """The directory a checkpoint is written into before it gets its name."""
    return os.path.join(os.path.dirname(final), STAGING_PREFIX + os.path.basename(final))


def commit(staged: str, final: str, step: int) -> None:
    """Make a fully written staging directory the checkpoint `final`: fsync, marker, rename (replacing a torn one)."""
    _fsync_tree(staged)
    write_marker(staged, step)
    if os.path.exists(final):  # a torn save of the same step, or a re-save: replace it
        shutil.rmtree(final)
    os.rename(staged, final)
    _fsync_dir(os.path.dirname(final))


def rotate(output_dir: str, keep: int | None, best: str | None = None, layout: str = "trainer") -> list[str]:
    """Delete all but the last `keep` complete checkpoints (the best one is kept too); return what was deleted."""
    if not keep or keep <= 0:
        return []
    done = list_checkpoints(output_dir, layouts=(layout,))
    doomed = [p for p in done[:-keep] if not (best and os.path.abspath(best) == os.path.abspath(p))]
    for p in doomed:
        shutil.rmtree(p, ignore_errors=True)
    return [str(p) for p in doomed]


def clean_staging(output_dir: str, layout: str = "trainer") -> None:
    """Remove staging directories a killed run left behind (they were never complete)."""
    root = _root(output_dir, layout)
    if root.is_dir():
        for p in [*root.glob(f"{STAGING_PREFIX}*"), *root.glob(f"{_LEGACY_STAGING}*")]:
            logger.warning("removing %s: a checkpoint save interrupted by a crash", p)
            shutil.rmtree(p, ignore_errors=True)


def _atomic_save(trainer, original):
    def save_checkpoint(self, model, trial=None):
        args, state = self.args, self.state
        run_dir = self._get_output_dir(trial=trial)
        final = checkpoint_path(run_dir, state.global_step)
        name, staging_root = os.path.basename(final), staging_path(final)
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
        _save_resume_state(self, os.path.join(staging_root, name))
        self.accelerator.wait_for_everyone()
        if args.should_save:
            staged = os.path.join(staging_root, name)
            if state.best_model_checkpoint and state.best_model_checkpoint.startswith(staging_root):
                state.best_model_checkpoint = final
                state.save_to_json(os.path.join(staged, "trainer_state.json"))
            commit(staged, final, state.global_step)
            shutil.rmtree(staging_root, ignore_errors=True)
            deleted = rotate(run_dir, args.save_total_limit, state.best_model_checkpoint)
            logger.info("saved %s atomically%s", final, f"; deleted {deleted}" if deleted else "")
        self.accelerator.wait_for_everyone()

    return types.MethodType(save_checkpoint, trainer)


# What a trainer keeps outside the Trainer's own state and RNG files, per rank: the rollout sampler's call count
# (each generation's seed comes from it), a dynamic-sampling refill stream. A trainer that has such state defines
# `resume_state() -> dict` (JSON) and `load_resume_state(dict)`; every checkpoint then holds one file per rank.
RESUME_STATE = "smolalign_rank{rank}.json"


def _save_resume_state(trainer, checkpoint_dir: str) -> None:
    if not callable(getattr(trainer, "resume_state", None)):
        return
    os.makedirs(checkpoint_dir, exist_ok=True)
    path = os.path.join(checkpoint_dir, RESUME_STATE.format(rank=trainer.accelerator.process_index))
    with open(path, "w") as f:
        json.dump(trainer.resume_state(), f)
        f.flush()
        os.fsync(f.fileno())


class _EngineResync(TrainerCallback):
    """After a resume: the trainer's own per-rank state back from the checkpoint (`RESUME_STATE`), so the
    generations after the resume are the ones an uninterrupted run makes, and the restored weights pushed to its
    rollout engine before the first step."""

    def __init__(self, trainer):
        self.trainer = trainer

    def on_train_begin(self, args, state, control, **kwargs):
        if state.global_step <= 0:
            return
        if callable(getattr(self.trainer, "load_resume_state", None)):
            path = os.path.join(
                checkpoint_path(args.output_dir, state.global_step),
                RESUME_STATE.format(rank=self.trainer.accelerator.process_index),
            )
            if os.path.isfile(path):
                with open(path) as f:
                    self.trainer.load_resume_state(json.load(f))
            else:
                logger.warning(
                    "resumed at step %d without %s: generation seeds restart (the samples after the "
                    "resume differ from an uninterrupted run's)",
                    state.global_step,
                    path,
                )
        if callable(getattr(self.trainer, "sync_engine", None)):
            self.trainer.sync_engine()
            logger.info("resumed at step %d: rollout engine weights synced", state.global_step)


class FinishedAtResume(Exception):
    """Raised inside `trainer.train()` when it resumed from the run's last step (`max_steps`), before a step is taken:
    the HF Trainer's loop takes one optimizer step before its first `global_step >= max_steps` check, so re-running
    a run killed after its final checkpoint (during the final save or evaluation) would train a step past the end.
    align.stage.train catches it: the checkpoint's weights, loaded by then, are the final model."""


class _NoStepPastTheEnd(TrainerCallback):
    def on_step_begin(self, args, state, control, **kwargs):
        if state.max_steps > 0 and state.global_step >= state.max_steps:
            raise FinishedAtResume(state.global_step)


# A stage stopped by SIGTERM (Slurm preemption, scancel, a spot instance, the pipeline stopping it) exits with this
# code after saving: 128 + SIGTERM, what a shell reports for a process the signal ended.
PREEMPTED_EXIT_CODE = 143


class SigtermFlag:
    """SIGTERM as a flag a loop reads at a safe point (a step's end, a batch's end) instead of dying mid-write.
    `install()` (main thread only; elsewhere it is a no-op) and `restore()` put the previous handler back;
    `agreed(device)` is True on every rank once any rank got the signal (a one-number all-reduce: call it at the
    same point on every rank), `requested` on this rank alone."""

    def __init__(self, what: str = "finishing this step, saving a checkpoint, then stopping (re-run to resume)"):
        self.requested, self.previous, self.what = False, None, what

    def _handler(self, signum, frame):
        self.requested = True
        logger.warning("SIGTERM: %s", self.what)

    def install(self) -> SigtermFlag:
        import signal
        import threading

        if threading.current_thread() is threading.main_thread():
            self.previous = signal.signal(signal.SIGTERM, self._handler)
        return self

    def restore(self) -> None:
        import signal

        if self.previous is not None:
            signal.signal(signal.SIGTERM, self.previous)
            self.previous = None

    def agreed(self, device=None) -> bool:
        stop = self.requested
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            flag = torch.tensor([1.0 if stop else 0.0], device=device)
            torch.distributed.all_reduce(flag, op=torch.distributed.ReduceOp.MAX)
            stop = bool(flag.item())
        return stop


class _SaveOnSigterm(TrainerCallback):
    """SIGTERM during training: finish the current optimizer step, save a checkpoint (atomically, as every save) and
    stop; the stage then exits with PREEMPTED_EXIT_CODE and the same command resumes from that checkpoint. On several
    ranks the ranks agree at each step end (SigtermFlag.agreed) so that all of them save the same step."""

    def __init__(self, trainer):
        self.trainer, self.flag = trainer, SigtermFlag()

    def on_train_begin(self, args, state, control, **kwargs):
        self.flag.install()

    def on_step_end(self, args, state, control, **kwargs):
        if self.flag.agreed(self.trainer.accelerator.device):
            control.should_save = control.should_training_stop = True
            self.trainer._smolalign_preempted = True

    def on_train_end(self, args, state, control, **kwargs):
        self.flag.restore()


def exit_if_preempted(trainer) -> None:
    """After `trainer.train()`: a run stopped by SIGTERM (its checkpoint saved) ends here, with PREEMPTED_EXIT_CODE,
    before the stage saves a final model or evaluates what is only part of the training."""
    if getattr(trainer, "_smolalign_preempted", False):
        logger.warning(
            "stopped by SIGTERM at step %d; checkpoint saved in %s: run the same command to resume",
            trainer.state.global_step,
            trainer.args.output_dir,
        )
        raise SystemExit(PREEMPTED_EXIT_CODE)


def install(trainer, script_args=None) -> NonFiniteGuard:
    """Atomic checkpoints, engine resync after resume, the non-finite guard, save-on-SIGTERM and no step past
    `max_steps` after a resume on an HF/TRL trainer."""
    if getattr(trainer, "_smolalign_checkpoint_installed", False):
        return trainer._smolalign_guard
    trainer._save_checkpoint = _atomic_save(trainer, trainer._save_checkpoint)
    if trainer.args.should_save:
        clean_staging(trainer.args.output_dir)
    policy = getattr(script_args, "on_nonfinite", "stop") or "stop"
    factor = getattr(script_args, "grad_explosion_factor", 100.0)
    guard = NonFiniteGuard(
        trainer,
        policy,
        100.0 if factor is None else factor,
        checkpoint_path=lambda step: checkpoint_path(trainer.args.output_dir, step),
    )
    trainer.add_callback(guard)
    trainer.add_callback(_EngineResync(trainer))
    trainer.add_callback(_NoStepPastTheEnd())
    trainer.add_callback(_SaveOnSigterm(trainer))
    trainer._smolalign_checkpoint_installed, trainer._smolalign_guard = True, guard
    return guard


# ----------------------------------------------------------------------------- the loop layout (pretraining)


def is_deepspeed(accelerator) -> bool:
    return getattr(accelerator.state, "deepspeed_plugin", None) is not None


def _rng_state() -> dict:
    return {"torch": torch.get_rng_state(), "python": random.getstate()}


def save_loop_checkpoint(output_dir: str, step: int, acc, model, optimizer, state: dict, tokenizer, keep: int) -> str:
    """Write output_dir/checkpoints/step_N atomically; keep the last `keep`. Every rank calls it.

    Plain / DDP: rank 0 writes the weights (model.safetensors, also a loadable HF model), optimizer and RNG.
    DeepSpeed: the engine writes its sharded model and optimizer state from every rank (`ds/`), each rank its
    RNG; rank 0 adds the gathered weights as model.safetensors. Only then is the directory renamed."""
    final = checkpoint_path(output_dir, step, "loop")
    tmp = staging_path(final)
    deepspeed = is_deepspeed(acc)
    if acc.is_main_process:
        shutil.rmtree(tmp, ignore_errors=True)
        os.makedirs(tmp)
    acc.wait_for_everyone()
    raw = acc.unwrap_model(model)
    weights = acc.get_state_dict(model) if deepspeed else None  # collective under ZeRO-3
    if deepspeed:
        model.save_checkpoint(tmp, tag=DS_TAG)  # collective: each rank its shards of weights and optimizer
        torch.save(_rng_state(), os.path.join(tmp, f"rng_{acc.process_index}.pt"))
    if acc.is_main_process:
        raw.save_pretrained(tmp, safe_serialization=True, state_dict=weights)
        tokenizer.save_pretrained(tmp)
        if not deepspeed:
            torch.save(optimizer.state_dict(), os.path.join(tmp, "optimizer.pt"))
            torch.save(_rng_state(), os.path.join(tmp, "rng.pt"))
        with open(os.path.join(tmp, "trainer_state.json"), "w") as f:
            json.dump(state, f)
    acc.wait_for_everyone()
    if acc.is_main_process:
        commit(tmp, final, step)
        rotate(output_dir, keep, layout="loop")
    acc.wait_for_everyone()
    return final


def load_loop_checkpoint(path: str, acc, model, optimizer) -> dict:
    """Restore weights, optimizer and RNG in place; return the loop's state (step, data position, history)."""
    if is_deepspeed(acc):
        if not os.path.isdir(os.path.join(path, DS_TAG)):
            raise ValueError(
                f"checkpoint {path} has no DeepSpeed state ({DS_TAG}/): it was written without DeepSpeed; "
                "resume it with the same launch it was written with"
            )
        model.load_checkpoint(path, tag=DS_TAG)  # collective: module and optimizer shards
        rng_file = os.path.join(path, f"rng_{acc.process_index}.pt")
    else:
        raw = acc.unwrap_model(model)
        weights = load_file(os.path.join(path, "model.safetensors"))
        raw.load_state_dict(weights, strict=False)  # tied head is absent from the file by design
        raw.tie_weights()
        optimizer.load_state_dict(torch.load(os.path.join(path, "optimizer.pt"), weights_only=False))
        rng_file = os.path.join(path, "rng.pt")
    if os.path.isfile(rng_file):
        rng = torch.load(rng_file, weights_only=False)
        torch.set_rng_state(rng["torch"])
        random.setstate(rng["python"])
    with open(os.path.join(path, "trainer_state.json")) as f:
        return json.load(f)
