"""GRPO time to accuracy: wall-clock and steps until held-out accuracy reaches a stated target, ours vs TRL's
GRPOTrainer with its defaults, on the same model, task, seed and step budget.

    python scripts/benchmark.py grpo_tta            # the SmolLM2-135M chain's APO (else SFT) model
    python scripts/benchmark.py grpo_tta --quick    # fewer steps and prompts (a smoke run, not a result)

Both sides take recipes/smol135m/grpo.yaml's task, loss, learning rate and shapes (ours in our GRPOConfig, TRL in
trl.GRPOConfig); ours generates through the shared rollout engine (`rollout_backend: auto`), TRL through
`model.generate` on the padded batch (both built by the `grpo` suite's `build_trainer`). Every `EVAL_EVERY` steps
training pauses and the SAME evaluator (greedy, an hf engine on the live weights in their own fp32 precision, the
families' held-out prompts) measures accuracy; evaluation time is not counted. The target is the starting accuracy plus
`GAIN` (absolute). Summary: `grpo_tta: ours/trl-default seconds-to-target ratio R` = TRL's seconds / ours (a
speedup; a side that never reaches the target within the budget counts its whole budget, flagged in the rows).

Results: docs/research/results.md#grpo. ~7 idle minutes; needs the 135M chain's APO (or SFT) model; not in `all`.
"""

from __future__ import annotations

import tempfile
import time
from pathlib import Path

import torch

from benchmarks.common import summary_line

MODEL_CANDIDATES = ("outputs/smol135m/apo", "outputs/smol135m/sft")
FAMILIES = ["count_letters", "count_items"]
GAIN = 0.08  # absolute points above the start: beyond one 256-prompt measurement's noise (+-5.3 at 25%)
EVAL_EVERY = 2
MAX_TOKENS = 64  # these families' gold answers: median 37, p95 45 tokens (recipes/smol135m/grpo.yaml)
TARGET = 1.5


def _model_dir() -> str:
    for path in MODEL_CANDIDATES:
        if (Path(path) / "config.json").exists():
            return path
    raise SystemExit(  # one line, no traceback
        f"smolalign: error: grpo_tta needs the SmolLM2-135M chain's APO or SFT model (one of {MODEL_CANDIDATES}): "
        "run `python scripts/pipeline.py recipes/smol135m/pipeline.yaml --until apo` first"
    )


class _Clock:
    """Trainer callback: training wall-clock without the evaluations, and held-out accuracy every `every` steps
    (stops training once `target` is reached)."""

    def __init__(self, evaluate, every: int):
        from transformers import TrainerCallback

        self.points, self.target, self._evaluate, self._every = [], None, evaluate, every
        self.train_s, self._t = 0.0, None
        clock = self

        class CB(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                clock._t = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                if state.global_step % clock._every:
                    return
                clock.train_s += time.perf_counter() - clock._t
                acc = clock._evaluate()
                clock.points.append((state.global_step, round(clock.train_s, 2), acc))
                if clock.target is not None and acc >= clock.target:
                    control.should_training_stop = True
                clock._t = time.perf_counter()

            def on_train_end(self, args, state, control, **kw):  # steps after the last evaluation count too
                clock.train_s += time.perf_counter() - clock._t

        self.callback = CB()


def _run(kind: str, model_dir: str, num_steps: int, num_eval: int, target: float | None, every: int) -> dict:
    from align.grpo.heldout import heldout_accuracy
    from align.grpo.prompts import prepare_prompts
    from align.rollout import SamplingParams, get_engine
    from align.stage import own_precision
    from benchmarks.grpo import build_trainer
    from benchmarks.grpo import train as train_side
    from data_gen.tasks import tasks_dataset

    # recipes/smol135m/grpo.yaml's knobs on both sides (ours in our GRPOConfig, TRL in trl.GRPOConfig)
    common = dict(
        output_dir=tempfile.mkdtemp(prefix="grpo-tta-"),
        max_steps=num_steps,
        seed=0,
        report_to="none",
        per_device_train_batch_size=64,
        num_generations=8,
        max_completion_length=MAX_TOKENS,
        temperature=1.0,
        learning_rate=1e-5,
        lr_scheduler_type="constant_with_warmup",
        warmup_steps=3,
        loss_type="dapo",
        epsilon_high=0.28,
        beta=0.0,
        logging_steps=1,
        save_strategy="no",
        bf16=True,
        disable_tqdm=True,
    )
    train = prepare_prompts(tasks_dataset("train", FAMILIES, num=1200, mode="mixed"))
    rows = prepare_prompts(tasks_dataset("test", FAMILIES, num=num_eval, mode="mixed"))
    trainer = build_trainer(kind, model_dir, train, common)
    tokenizer = trainer.processing_class
    judge = get_engine(trainer.model, backend="hf", tokenizer=tokenizer)  # the same evaluator for both sides

    def evaluate() -> float:
        was = trainer.model.training
        trainer.model.eval()
        with own_precision(trainer):  # fp32 at every point: training leaves the forward in bf16 autocast
            acc = heldout_accuracy(
                judge.generate,
                tokenizer,
                rows,
                SamplingParams(temperature=0.0, max_new_tokens=MAX_TOKENS),
                "math_reward",
            )["accuracy"]
        trainer.model.train(was)
        return acc

    clock = _Clock(evaluate, every)
    start = evaluate()
    clock.target = start + GAIN if target is None else target
    trainer.add_callback(clock.callback)
    train_side(kind, trainer)
    reached = next(((step, s) for step, s, acc in clock.points if acc >= clock.target), None)
    return {
        "start": start,
        "target": clock.target,
        "curve": clock.points,
        "reached": reached is not None,
        "steps": reached[0] if reached else num_steps,
        "seconds": reached[1] if reached else clock.train_s,
    }


def run(quick: bool = False) -> dict:
    torch.set_num_threads(min(2, torch.get_num_threads()))
    model_dir = _model_dir()
    num_steps, num_eval, every = (4, 16, 2) if quick else (30, 256, EVAL_EVERY)
    ours = _run("ours", model_dir, num_steps, num_eval, None, every)
    trl = _run("trl", model_dir, num_steps, num_eval, ours["target"], every)  # the same stated target for both
    rows = [
        {
            "stack": k,
            "model": model_dir,
            "start_acc": r["start"],
            "target_acc": r["target"],
            "reached": r["reached"],
            "steps": r["steps"],
            "train_s": r["seconds"],
            "curve (step, s, acc)": "; ".join(f"{a}, {b:.0f}, {c:.2f}" for a, b, c in r["curve"]),
        }
        for k, r in (("ours", ours), ("trl-default", trl))
    ]
    ratio = trl["seconds"] / max(ours["seconds"], 1e-9) if ours["reached"] else 0.0
    return {
        "rows": rows,
        "summary": [summary_line("grpo_tta", "ours/trl-default", "seconds-to-target", ratio, TARGET)],
    }
