"""Asynchronous GRPO: the engine generates the batches of the next `max_staleness` steps while the trainer trains.

Why: synchronous GRPO takes turns (the engine generates step t's batch, then the trainer trains on it), so each
waits for the other: a step costs G + T. Here the engine runs in a process of its own (`align.rollout.worker`,
hf or vllm, with its share of the cores) and samples step t+1..t+k while the trainer trains step t, so a step
costs about max(G, T). The price is lag: a batch may come from weights up to `max_staleness` optimizer steps old.

    async_generation: true      # in a GRPO recipe
    max_staleness: 1            # k: a batch trained at step t was sampled by the weights of step t-k or later
    sync_every: 1               # push weights every n steps (n > k + 1 acts as k + 1: the bound forces a push)

How it keeps the bound and stays correct:
- Prompts come from the trainer's own data order: the training loop's batches are read up to k steps ahead
  (`get_batch_samples`), and each generation batch is queued on the engine with the version it needs at least
  (its step - k). The engine samples it with the newest weights pushed by then; the version travels with the
  batch, and a batch older than k (which cannot happen) stops the run rather than being trained on.
- Weights are pushed at the start of a generation step, after the optimizer step, every `sync_every` steps
  (collective under ZeRO-3: every rank gathers; each rank has its own engine process); the engine loads them
  between two generations. A batch queued for weights newer than the last push waits in the engine for the next
  one, and a push comes early when the step's own batch (or a refill behind the queue) would wait: so the bound
  holds for any `sync_every`, and a value above k + 1 pushes every k + 1 steps. Fewer pushes cost the engine idle
  time once it has run k steps ahead.
- The policy lag is corrected by importance sampling against the engine's own sampling log-probs
  (`vllm_importance_sampling_correction`, on: the ratio pi_trainer / pi_engine, capped, built from the loss
  pass, align/grpo/loss.py): the decoupled correction AReaL and verl's fully-async recipe use, with the
  current weights as the proximal policy (num_iterations is 1).
- Sampling seeds follow the batch's index, not the call order: `max_staleness: 0` samples what synchronous GRPO
  samples, and a resumed run regenerates the batches that were in flight when it stopped (none is half-used).
- Dynamic sampling: the step's first round is the batch generated ahead; a refill round (fresh prompts from the
  refill stream for the groups with no reward variance) cannot be known ahead, so it is queued on the engine
  behind the batches already in flight, with the same bound (sampled by step - k or later) and a seed of its
  own (step, round), and the trainer waits for it (`async/refill_s`).
- Tools (`tools`, `environment`): a batch's turn loop (align.tools.loop) runs in a thread of the trainer's process
  (one batch at a time, in order), each turn a job on the engine process within the same bound; the tool calls
  run in that thread (sandboxed tools in their own processes, as always). A trajectory's version is the oldest
  that sampled one of its turns; the tool replies stay out of the loss (`tool_mask`).
- A shared `vllm-server`: the server is already the engine's own process; the jobs run in a thread here
  (`align.rollout.worker.ServerWorker`), and a push pauses every rank's generation while the main process sends the
  weights (NCCL: GPU only), so no batch mixes two policies.
Not the trl backend (TRL's own generation).
"""

from __future__ import annotations

import copy
import os
import threading
import time
from collections import deque
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field

import torch

from align.grpo.prompts import prompt_groups
from align.runtime.distributed import rank_seed
from align.tools.grpo import system_text


@dataclass
class AsyncArgs:
    """The recipe keys of asynchronous generation (a part of align.grpo.config.GRPOConfig)."""

    async_generation: bool = field(
        default=False,
        metadata={
            "help": "Generate the next max_staleness steps' batches in an engine process of its own (hf, vllm) or "
            "on a vllm-server while the trainer trains; importance sampling corrects the lag."
        },
    )
    max_staleness: int = field(
        default=1,
        metadata={
            "help": "k: a batch trained at step t was sampled by the weights of step t-k or later (0: no "
            "overlap, the synchronous trainer's samples)."
        },
    )
    sync_every: int = field(
        default=1,
        metadata={
            "help": "Push the weights to the engine every n optimizer steps (fewer pushes; the engine "
            "waits for weights once max_staleness steps ahead). max_staleness holds: above "
            "max_staleness + 1 it pushes every max_staleness + 1 steps."
        },
    )
    engine_threads: int | None = field(
        default=None,
        metadata={
            "help": "Torch threads of the engine process; None: half of this rank's cores. The trainer keeps "
            "the other cores (torch.set_num_threads)."
        },
    )


def check_async_args(args) -> None:
    """One line per setting asynchronous generation cannot run with (after TRL set steps_per_generation)."""
    if not args.async_generation:
        return
    if args.max_staleness < 0:
        raise ValueError(f"max_staleness must be >= 0 (0 = synchronous samples), got {args.max_staleness}")
    if args.sync_every < 1:
        raise ValueError(f"sync_every must be >= 1, got {args.sync_every}")
    if args.rollout_backend not in ("auto", "hf", "vllm", "vllm-server"):
        raise ValueError(
            f"async_generation runs the engine in its own process or on a server: rollout_backend auto, "
            f"hf, vllm or vllm-server, not {args.rollout_backend!r}"
        )
    if args.num_iterations != 1:
        raise ValueError(
            f"async_generation needs num_iterations: 1 (the lag is corrected against the current "
            f"weights), got {args.num_iterations}"
        )
    if args.gradient_accumulation_steps % args.steps_per_generation:
        raise ValueError(
            f"async_generation needs gradient_accumulation_steps ({args.gradient_accumulation_steps}) "
            f"to be a multiple of steps_per_generation ({args.steps_per_generation})"
        )
    if not args.vllm_importance_sampling_correction:
        raise ValueError(
            "async_generation needs vllm_importance_sampling_correction: true (it corrects the policy "
            "lag with the engine's log-probs)"
        )


def split_threads(engine_threads: int | None, local_world_size: int = 1) -> tuple[int, int]:
    """(engine, trainer) torch threads for one rank: the rank's cores split between its engine and its trainer."""
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    mine = max(1, cores // max(1, local_world_size))
    engine = engine_threads or max(1, mine // 2)
    return engine, max(1, mine - engine)


class AsyncGeneration:
    """Mixed into align.grpo.trainer.GRPOTrainer (see the module doc). `async_log` keeps, per trained batch: the step,
    the version that sampled it, its staleness, and the seconds the trainer waited for it."""

    _lookahead: dict | None = None
    generation_round: int = 1  # dynamic sampling's round within a step (align.grpo.trainer): 1, then refills
    _async_next_job: int | None = None
    _async_published: int = -1

    def async_enabled(self) -> bool:
        return bool(getattr(self.args, "async_generation", False)) and self.sampler is not None

    def async_active(self) -> bool:
        return self.async_enabled() and self.model.training

    @property
    def async_log(self) -> list[dict]:
        if "_async_log" not in self.__dict__:
            self._async_log = []
        return self._async_log

    def async_summary(self) -> dict | None:
        """How stale the trained batches were and how long the trainer waited (None: synchronous run)."""
        log = self.async_log
        if not log:
            return None
        return {
            "max_staleness": self.args.max_staleness,
            "batches": len(log),
            "staleness_max": max(e["staleness"] for e in log),
            "staleness_mean": sum(e["staleness"] for e in log) / len(log),
            "trainer_wait_s": sum(e["trainer_wait_s"] for e in log),
            "generate_s": sum(e["generate_s"] for e in log),
        }

    @property
    def _async_jobs(self) -> deque:
        if "_async_queue" not in self.__dict__:
            self._async_queue = deque()
        return self._async_queue

    def _jobs_per_step(self) -> int:
        return self.args.gradient_accumulation_steps // self.args.steps_per_generation

    def get_batch_samples(self, epoch_iterator, num_batches, device):
        """The training loop's batches, read `max_staleness` steps ahead; each new generation batch is queued."""
        if not self.async_enabled():
            return super().get_batch_samples(epoch_iterator, num_batches, device)
        look = self._lookahead
        if look is None or look["iterator"] is not epoch_iterator:  # a new epoch (or a resumed one)
            look = self._lookahead = {"iterator": epoch_iterator, "items": deque(), "count": 0, "done": False}
        if self._async_next_job is None:  # a resumed run continues the batch numbering (and so the seeds)
            self._async_next_job = self.state.global_step * self._jobs_per_step()
        generate_every = self.args.steps_per_generation * self.num_iterations
        while len(look["items"]) < (self.args.max_staleness + 1) * num_batches and not look["done"]:
            try:
                item = next(epoch_iterator)
            except StopIteration:
                look["done"] = True
                break
            if look["count"] % generate_every == 0:  # TRL repeats a generation batch generate_every times
                self._submit(item)
            look["count"] += 1
            look["items"].append(item)
        taken = [look["items"].popleft() for _ in range(min(num_batches, len(look["items"])))]
        return super().get_batch_samples(iter(taken), num_batches, device)

    def _submit(self, rows: list[dict]) -> None:
        job = self._async_next_job
        self._async_next_job += 1
        step = job // self._jobs_per_step()
        if step >= self.state.max_steps:
            return  # past the end: never trained
        prompt_ids = self._tokenize_prompts(copy.deepcopy([x["prompt"] for x in rows]))[0]
        g, unique = prompt_groups(prompt_ids, self.num_generations)
        params = self.sampling_params(g, seed=rank_seed(self.args.seed, job + 1, rank=self.accelerator.process_index))
        min_version = max(0, step - self.args.max_staleness)
        if getattr(self, "tool_loop", None) is not None:  # the turn loop, in the tool thread (one batch at a time)
            starts = range(0, len(rows), g)
            handle = self._tool_thread().submit(
                self._tool_job,
                unique,
                params,
                [dict(rows[i]) for i in starts],
                [system_text(rows[i]["prompt"]) for i in starts],
                min_version,
            )
        else:
            handle = self.engine.submit(unique, params, min_version=min_version)
        self._async_jobs.append((handle, unique, g, step))

    def _tool_thread(self) -> ThreadPoolExecutor:
        if self.__dict__.get("_async_tools") is None:
            self._async_tools = ThreadPoolExecutor(max_workers=1, thread_name_prefix="smolalign-tool-loop")
            self._async_stop = threading.Event()
        return self._async_tools

    def _tool_job(self, prompts, params, rows, systems, min_version: int):
        """One batch's tool-use trajectories (in the tool thread): every turn is a job on the engine process."""
        stop, versions, spent = self._async_stop, [], {"generate_s": 0.0, "wait_s": 0.0}

        def generate(ids, p):
            job = self.engine.submit(ids, p, min_version=min_version)
            while True:
                if stop.is_set():
                    raise RuntimeError("async_generation: stopped while a tool-use batch was in flight")
                try:
                    groups, info = self.engine.result(job, timeout_s=1.0)
                    break
                except TimeoutError:
                    continue
            versions.append(info["version"])
            spent["generate_s"] += info["generate_s"]
            spent["wait_s"] += info["wait_s"]
            return groups

        groups = self.tool_loop.rollout(generate, prompts, params, rows=rows, systems=systems)
        return groups, {"version": min(versions), **spent}

    def _publish(self, behind_queue: bool = False) -> None:
        """Push this step's weights every `sync_every` steps, and sooner when a batch that must be sampled now needs
        newer weights than the engine holds: this step's (queued for step - max_staleness or later), or with
        `behind_queue` every queued one (a refill job waits behind them in the engine). Between pushes the batches
        queued for later steps wait in the engine for the next push, so each is still sampled within the bound."""
        step, k = self.state.global_step, self.args.max_staleness
        newest = max((s for _, _, _, s in self._async_jobs), default=step) if behind_queue else step
        due = self._async_published < 0 or step - self._async_published >= self.args.sync_every
        if due or newest - k > self._async_published:
            self.sync_engine()
            self._async_published = step

    def take_async_batch(self, prompt_ids, num_generations: int):
        """This step's batch, generated ahead: in TRL's `_generate_single_turn` form. A dynamic-sampling refill
        round (`generation_round` > 1) is generated now instead."""
        if self.generation_round > 1:
            return self._refill_batch(prompt_ids, num_generations)
        groups, g = self._take(prompt_ids, num_generations)
        return self.trl_completions(groups, g)

    def take_async_trajectories(self, prompt_ids, num_generations: int) -> list:
        """This step's tool-use trajectories (align.tools.grpo.tool_rollout), sampled ahead: one list per prompt."""
        return self._take(prompt_ids, num_generations)[0]

    def _take(self, prompt_ids, num_generations: int) -> tuple[list, int]:
        self._publish()
        step = self.state.global_step
        if not self._async_jobs:
            raise RuntimeError(f"async_generation: no batch was generated ahead for step {step}")
        handle, unique, g, job_step = self._async_jobs.popleft()
        if job_step != step or prompt_groups(prompt_ids, num_generations)[1] != unique:
            raise RuntimeError(
                f"async_generation: the batch generated for step {job_step} is not the one step {step} "
                "trains on (the data order changed under the lookahead)"
            )
        started = time.monotonic()
        groups, info = handle.result() if isinstance(handle, Future) else self.engine.result(handle)
        waited = time.monotonic() - started
        staleness = step - info["version"]
        if not 0 <= staleness <= self.args.max_staleness:
            raise RuntimeError(
                f"async_generation: step {step}'s batch was sampled by version {info['version']}, "
                f"{staleness} steps old (max_staleness {self.args.max_staleness})"
            )
        self.async_log.append(
            {
                "step": step,
                "version": info["version"],
                "staleness": staleness,
                "trainer_wait_s": waited,
                "engine_wait_s": info["wait_s"],
                "generate_s": info["generate_s"],
            }
        )
        metrics = self._metrics["train"]
        metrics["async/staleness"].append(float(staleness))
        metrics["async/trainer_wait_s"].append(waited)
        metrics["async/generate_s"].append(info["generate_s"])
        return groups, g

    def _refill_batch(self, prompt_ids, num_generations: int):
        """A dynamic-sampling refill round of this step: queued behind the batches in flight, waited for."""
        self._publish(behind_queue=True)  # the engine serves its jobs in order: none ahead may wait for weights
        step, k = self.state.global_step, self.args.max_staleness
        g, unique = prompt_groups(prompt_ids, num_generations)
        seed = rank_seed(self.args.seed, step + 1, self.generation_round, rank=self.accelerator.process_index)
        started = time.monotonic()
        groups, info = self.engine.result(
            self.engine.submit(unique, self.sampling_params(g, seed=seed), min_version=max(0, step - k))
        )
        waited = time.monotonic() - started
        if not 0 <= step - info["version"] <= k:
            raise RuntimeError(
                f"async_generation: step {step}'s refill was sampled by version {info['version']} (max_staleness {k})"
            )
        self._metrics["train"]["async/refill_s"].append(waited)
        return self.trl_completions(groups, g)

    def train(self, *args, **kwargs):
        try:
            return super().train(*args, **kwargs)
        finally:  # batches queued past a stop (the end, a signal, an error) are dropped, never half-used
            if self.async_enabled():
                self.engine.cancel_pending()
            tools = self.__dict__.pop("_async_tools", None)
            if tools is not None:  # a tool-use batch in flight stops at its next turn
                self._async_stop.set()
                tools.shutdown(wait=True, cancel_futures=True)
            self._async_jobs.clear()
            self._lookahead, self._async_next_job = None, None


def set_trainer_threads(threads: int) -> None:
    torch.set_num_threads(max(1, int(threads)))
