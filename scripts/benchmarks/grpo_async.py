"""Asynchronous vs synchronous GRPO on SmolLM2-135M: seconds per step with the cores split between engine and
trainer, the overlap it reaches against the ideal one, and held-out accuracy after the same steps.

    python scripts/benchmark.py grpo_async            # the SmolLM2-135M chain's APO (else SFT) model
    python scripts/benchmark.py grpo_async --quick    # fewer steps and prompts (a smoke run, not a result)

Three runs of the same GRPO (recipes/smol135m/grpo.yaml's task, loss and learning rate; 4 prompts x 8 completions
of up to 64 tokens a step; hf engine), one after the other in this process:
- `sync, all cores`: the synchronous trainer, its engine sharing the model, every core to each phase in turn;
- `split, max_staleness 0`: the engine in its own process with half the cores, the trainer with the rest, no
  overlap (each batch waits for the weights of its own step): G (the engine's seconds per batch) and T (the
  trainer's seconds per step outside its wait for the batch) are measured here;
- `split, max_staleness 1`: the same split, the engine a step ahead.
Ideal speedup of the overlap = (G + T) / max(G, T); reached = s/step(max_staleness 0) / s/step(max_staleness 1).
Summary: `grpo_async: async/ideal-overlap speedup ratio R` = reached / ideal (target >= 0.8). Also printed,
without a target: async (split cores) against the synchronous trainer with every core. Accuracy: greedy held-out
accuracy of both split runs' models on the same prompts, with the paired test (McNemar).
Results: docs/research/grpo.md. 4 idle minutes; the 135M chain's APO (or SFT) model when this checkout has one, else
the builtin SmolLM2-135M-Instruct.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch

from benchmarks.common import summary_line
from benchmarks.grpo_tta import FAMILIES, MAX_TOKENS, MODEL_CANDIDATES

TARGET = 0.8


def _model_dir() -> str:
    """The 135M chain's APO (else SFT) model when this checkout ran the chain, else the builtin SmolLM2-135M-Instruct:
    the overlap is the measure (a fresh clone's `make bench` has no chain), its accuracies then start near zero."""
    from pathlib import Path

    from align.modeling.loading import resolve_model_path

    for path in MODEL_CANDIDATES:
        if (Path(path) / "config.json").exists():
            return path
    print(
        "grpo_async: no SmolLM2-135M chain model here (outputs/smol135m/apo or sft): the builtin "
        "SmolLM2-135M-Instruct instead"
    )
    return resolve_model_path("builtin:smollm2-135m-instruct")


class _StepClock:
    def __init__(self):
        from transformers import TrainerCallback

        self.ends: list[float] = []
        clock = self

        class CB(TrainerCallback):
            def on_train_begin(self, args, state, control, **kw):
                clock.ends.append(time.perf_counter())

            def on_step_end(self, args, state, control, **kw):
                clock.ends.append(time.perf_counter())

        self.callback = CB()

    def per_step(self, skip: int = 1) -> list[float]:
        return [b - a for a, b in zip(self.ends, self.ends[1:])][skip:]


def _run(model_dir: str, mode: str, num_steps: int, rows, threads: int) -> dict:
    """One GRPO run in `mode`: sync (all `threads` for one process), split0 (engine and trainer on half the cores
    each, max_staleness 0) or async (split, max_staleness 1). Returns the seconds per step, the generation and
    training seconds per step (G, T), the staleness when async, and held-out accuracy when `rows` are given.

    Long because it is one timed run: the trainer, its sampler and the clocks around them are built, used and closed
    together, and the `finally` restores the threads and closes the sampler whatever happened."""
    from align import stage
    from align.grpo.async_generation import set_trainer_threads
    from align.grpo.config import GRPOConfig
    from align.grpo.prompts import prepare_prompts
    from align.grpo.reward_funcs import build_rewards
    from align.grpo.trainer import GRPOTrainer
    from align.modeling.loading import load_model, load_tokenizer
    from align.rollout.sampler import build_sampler
    from data_gen.tasks import tasks_dataset

    asynchronous = mode != "sync"
    args = GRPOConfig(
        output_dir=tempfile.mkdtemp(prefix="grpo-async-"),
        max_steps=num_steps,
        seed=0,
        report_to="none",
        per_device_train_batch_size=32,
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
        reward_funcs=["math_reward"],
        rollout_backend="hf",
        async_generation=asynchronous,
        max_staleness=1 if mode == "async" else 0,
    )
    tokenizer = load_tokenizer(model_dir)
    model = load_model(model_dir)
    train = prepare_prompts(tasks_dataset("train", FAMILIES, num=1200, mode="mixed"))
    engine = None
    if not asynchronous:
        set_trainer_threads(threads)
        from align.rollout import get_engine

        engine = get_engine(model, backend="hf", tokenizer=tokenizer)
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=build_rewards(args),
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        engine=engine,
    )
    if asynchronous:
        set_trainer_threads(threads // 2 or 1)
        trainer.sampler = build_sampler(
            "hf",
            {},
            model,
            model_dir,
            tokenizer,
            trainer.accelerator,
            seed=0,
            logprobs_kind="sampling",
            own_process=True,
            threads=threads // 2 or 1,
        )
    generate_s: list[float] = []
    if not asynchronous:  # the engine's share of a synchronous step
        sampler_generate = trainer.sampler.generate

        def timed(*a, **k):
            t = time.perf_counter()
            out = sampler_generate(*a, **k)
            generate_s.append(time.perf_counter() - t)
            return out

        trainer.sampler.generate = timed
    clock = _StepClock()
    trainer.add_callback(clock.callback)
    try:
        stage.train(trainer, args)
        log = trainer.async_log[1:]
        steps = clock.per_step()
        result = {"mode": mode, "s_per_step": statistics.median(steps), "steps": steps}
        if asynchronous:
            result["G"] = statistics.median(e["generate_s"] for e in log)
            result["T"] = statistics.median(s - e["trainer_wait_s"] for s, e in zip(steps, log))
            result["staleness_max"] = max(e["staleness"] for e in trainer.async_log)
        else:
            result["G"] = statistics.median(generate_s[1:])
            result["T"] = result["s_per_step"] - result["G"]
        if rows is not None:
            from align.grpo.heldout import heldout_accuracy
            from align.rollout import SamplingParams, get_engine

            judge = get_engine(trainer.model, backend="hf", tokenizer=tokenizer)
            set_trainer_threads(threads)
            trainer.model.eval()
            with stage.own_precision(trainer):
                result["eval"] = heldout_accuracy(
                    judge.generate,
                    tokenizer,
                    prepare_prompts(rows),
                    SamplingParams(temperature=0.0, max_new_tokens=MAX_TOKENS),
                    "math_reward",
                )
            judge.close()
        return result
    finally:
        trainer.sampler.close(trainer.model_wrapped)
        set_trainer_threads(threads)


def run(quick: bool = False) -> dict:
    from align.eval.statistics import paired_change
    from data_gen.tasks import tasks_dataset

    threads = min(2, torch.get_num_threads()) if quick else torch.get_num_threads()
    model_dir = _model_dir()
    num_steps, num_eval = (3, 8) if quick else (8, 128)
    rows = tasks_dataset("test", FAMILIES, num=num_eval, mode="mixed")
    sync = _run(model_dir, "sync", num_steps, None, threads)
    lagless = _run(model_dir, "split0", num_steps, rows, threads)
    lagged = _run(model_dir, "async", num_steps, rows, threads)
    ideal = (lagless["G"] + lagless["T"]) / max(lagless["G"], lagless["T"])
    reached = lagless["s_per_step"] / lagged["s_per_step"]
    paired = paired_change(lagless["eval"]["correct"], lagged["eval"]["correct"])
    names = {"sync": "sync, all cores", "split0": "split, max_staleness 0", "async": "split, max_staleness 1"}
    table = [
        {
            "run": names[r["mode"]],
            "s/step": round(r["s_per_step"], 2),
            "G (s)": round(r["G"], 2),
            "T (s)": round(r["T"], 2),
            "held-out acc": (round(r["eval"]["accuracy"], 3) if "eval" in r else "-"),
        }
        for r in (sync, lagless, lagged)
    ]
    table.append(
        {
            "run": "overlap",
            "s/step": f"reached {reached:.2f}x, ideal {ideal:.2f}x",
            "G (s)": "",
            "T (s)": "",
            "held-out acc": f"max_staleness 1 vs 0: {paired['gained']} gained, {paired['lost']} lost, "
            f"p={paired['p_value']:.2g}",
        }
    )
    # one run a side: its timed steps, paired in order, show its noise
    per_step = [a / b / ideal for a, b in zip(lagless["steps"], lagged["steps"])]
    summary = [
        summary_line("grpo_async", "async/ideal-overlap", "speedup", reached / ideal, TARGET, per_step),
        f"grpo_async: async (split cores) / sync (all cores) s-per-step speedup "
        f"{sync['s_per_step'] / lagged['s_per_step']:.2f} (no target: {threads} cores)",
    ]
    return {
        "rows": table,
        "summary": summary,
        "paired": paired,
        "ideal": ideal,
        "reached": reached,
        "model": model_dir,
    }
