"""The non-finite guard: a NaN/inf loss or an exploding gradient is caught at the step it happens, before it reaches
the weights.

`NonFiniteGuard` checks every optimizer step of an HF/TRL trainer: a NaN/inf micro-batch loss, a non-finite
gradient norm, or a gradient norm above `explosion_factor` x the median of recent steps. The step is logged with
its step and batch index and handled per `on_nonfinite`: `skip` drops the update (gradients discarded, so neither
the weights nor the Adam moments move) and trains on; `stop` drops it, saves a checkpoint and raises
`NonFiniteError` naming the step (re-running the same command resumes after the bad batch). Decisions use the
all-reduced gradient norm, so every rank decides alike; under DeepSpeed the engine owns the gradients and the guard
only logs. `align.runtime.checkpoint.install` puts it on every stage's trainer, beside the atomic checkpoints.
"""

from __future__ import annotations

import logging
import math
import statistics
from collections.abc import Callable

from transformers import TrainerCallback

logger = logging.getLogger(__name__)

# transformers' Trainer's private names this module overrides or reads, each with the parameters we rely on (checked
# against the installed TRL by tests/test_trl_private_names.py: an upgrade that renames or reshapes one fails there, in
# one place).
TRL_PRIVATE_METHODS = {
    "_get_grad_norm": "(self, model, grad_norm=None)",  # wrapped: the pre-clip norm the guard reads
}
TRL_PRIVATE_ATTRIBUTES = ()


NONFINITE_POLICIES = ("skip", "stop")


class NonFiniteError(ValueError):
    """Training stopped on a NaN/inf loss or an exploding gradient (after saving a checkpoint)."""


def _finite(x) -> bool:
    try:
        return math.isfinite(float(x))
    except (TypeError, ValueError):
        return True


class NonFiniteGuard(TrainerCallback):
    """Detect NaN/inf losses and gradient explosions each optimizer step; skip the update or stop (module doc)."""

    def __init__(
        self,
        trainer,
        policy: str = "stop",
        explosion_factor: float = 100.0,
        window: int = 20,
        checkpoint_path: Callable[[int], str] | None = None,
    ):
        if policy not in NONFINITE_POLICIES:
            raise ValueError(f"on_nonfinite={policy!r}: choose one of {list(NONFINITE_POLICIES)}")
        if explosion_factor < 0:
            raise ValueError(f"grad_explosion_factor must be >= 0 (0 turns the check off), got {explosion_factor}")
        self.trainer, self.policy, self.factor, self.window = trainer, policy, explosion_factor, window
        self.checkpoint_path = checkpoint_path  # step -> where the checkpoint of that step is saved (the message)
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
        path = self.checkpoint_path(state.global_step) if self.checkpoint_path else args.output_dir
        raise NonFiniteError(
            f"{e['reason']} at step {e['step']} (batch {e['batch']}): training stopped (on_nonfinite=stop); "
            f"checkpoint saved at {path} without that update. Re-run the same command to resume after the bad "
            "batch, or lower learning_rate, or set on_nonfinite: skip"
        )
