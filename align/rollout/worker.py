"""A rollout engine in a process of its own: generation that runs while the trainer trains (asynchronous GRPO).

Why: the engines in this package run in the trainer's process (the hf engine even shares the trained model), so
generating and training take turns. Here the engine (hf or vllm, built by `get_engine` from a model path) lives
in a spawned child process with its own copy of the weights and its own torch threads; the trainer queues jobs
and collects them later, and pushes weights into shared memory that the child loads between two generations.

    worker = EngineWorker("outputs/smol135m/apo", backend="hf", threads=1)
    worker.update_weights(model.named_parameters(), version=0)          # every rank's own worker
    job = worker.submit(prompt_ids, SamplingParams(n=8, seed=1), min_version=0)
    groups, info = worker.result(job)                                   # info: the version that sampled, timings

Versions: every push carries a version (GRPO: the optimizer step of the weights). A job waits in the child until
a version >= its `min_version` is published, then samples with the newest one; `info["version"]` names it, so
the trainer can bound and log its staleness. The push copies into shared tensors under one lock that the child
also holds while it loads them: generation never stops longer than one copy of the weights. Jobs run in the
order submitted; `cancel_pending()` drops those not yet started (their results never come). A job that raises in
the child raises in `result()` with the child's traceback; a child that dies is reported, never waited on.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue
import threading
import time
import traceback
from collections import deque
from collections.abc import Iterable
from dataclasses import asdict

import torch

from align.rollout.base import Rollout, SamplingParams, normalize_param_name
from align.rollout.factory import get_engine

logger = logging.getLogger(__name__)


class EngineWorker:
    """The RolloutEngine interface (generate, update_weights, close) over an engine in a child process, plus the
    asynchronous calls (`submit`, `result`, `cancel_pending`). `backend` is the inner engine's."""

    versioned = True  # update_weights takes `version` (align.rollout.sampler.Sampler.push passes the trainer's step)

    def __init__(
        self,
        model_path: str,
        backend: str = "hf",
        knobs: dict | None = None,
        threads: int | None = None,
        logprobs_kind: str = "sampling",
        start_timeout_s: float = 900.0,
    ):
        if backend not in ("hf", "vllm"):
            raise ValueError(f"an engine in its own process runs the hf or vllm backend, not {backend!r}")
        ctx = mp.get_context("spawn")  # never fork a process that holds torch threads or a vLLM engine
        self.backend, self.logprobs_kind = backend, logprobs_kind
        self._inbox, self._outbox = ctx.Queue(), ctx.Queue()
        self._version = ctx.Value("q", -1)  # the newest published version; its lock guards the shared weights
        self._cancelled = ctx.Value("q", -1)  # jobs with an id up to this one are skipped
        self._stop = ctx.Event()
        knobs = dict(knobs or {})
        if backend == "vllm":
            knobs.setdefault("logprobs_kind", logprobs_kind)
        self._proc = ctx.Process(
            target=_serve,
            name=f"smolalign-{backend}-engine",
            daemon=True,
            args=(
                self._inbox,
                self._outbox,
                self._version,
                self._cancelled,
                self._stop,
                model_path,
                backend,
                knobs,
                threads,
                os.getpid(),
            ),
        )
        self._proc.start()
        self._buffers: dict[str, torch.Tensor] | None = None
        self._results: dict[int, tuple] = {}
        self._lock = threading.Lock()
        self._next_job = 0
        self.version = -1
        kind, payload = self._receive(None, start_timeout_s)[:2]
        if kind != "ready":
            raise RuntimeError(f"the {backend} engine process failed to start:\n{payload}")
        self.info = payload

    # -- weights -----------------------------------------------------------------------------------------------

    @torch.no_grad()
    def update_weights(self, named_params: Iterable[tuple[str, torch.Tensor]], version: int | None = None) -> None:
        """Copy the weights into shared memory and publish them as `version` (default: the last one + 1)."""
        version = self.version + 1 if version is None else int(version)
        if version < self.version:
            raise ValueError(f"update_weights: version {version} is older than the published {self.version}")
        first = self._buffers is None
        if first:
            self._buffers = {}
        with self._version.get_lock():
            for name, tensor in named_params:
                name = normalize_param_name(name)
                if first:
                    self._buffers[name] = tensor.detach().to("cpu", copy=True).contiguous().share_memory_()
                elif name not in self._buffers or self._buffers[name].shape != tensor.shape:
                    raise ValueError(f"update_weights: '{name}' {tuple(tensor.shape)} was not in the first push")
                else:
                    self._buffers[name].copy_(tensor.detach())
            if first:  # the child maps the shared tensors once; later pushes only copy into them
                self._inbox.put(("buffers", self._buffers))
            self._version.value = version
        self.version = version

    # -- generation --------------------------------------------------------------------------------------------

    def submit(self, prompts: list[list[int]], params: SamplingParams, min_version: int | None = None) -> int:
        """Queue a generation; it starts once a version >= `min_version` (default: the newest) is published."""
        with self._lock:  # the trainer's thread and a tool-loop thread (align.grpo.async_generation) may both submit
            job = self._next_job
            self._next_job += 1
            wanted = self.version if min_version is None else int(min_version)
            self._inbox.put(("job", job, [list(p) for p in prompts], asdict(params), wanted))
        return job

    def result(self, job: int, timeout_s: float | None = None) -> tuple[list[list[Rollout]], dict]:
        """The job's rollouts (one list per prompt, in order) and {"version", "generate_s", "wait_s"}: the
        version that sampled them, the seconds spent generating and waiting in the child for that version."""
        while job not in self._results:
            self._receive(job, timeout_s)
        with self._lock:
            kind, payload, info, prompts = self._results.pop(job)
        if kind == "error":
            raise RuntimeError(f"the {self.backend} engine process failed on a generation:\n{payload}")
        groups = [
            [Rollout(list(p), list(c), None if lp is None else list(lp), fr) for c, lp, fr in group]
            for p, group in zip(prompts, payload)
        ]
        return groups, info

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Rollout]]:
        """Synchronous: after the jobs already queued, with the newest published weights."""
        return self.result(self.submit(prompts, params))[0]

    def cancel_pending(self) -> None:
        """Jobs submitted so far and not yet started are skipped; their results are dropped."""
        with self._lock, self._cancelled.get_lock():
            self._cancelled.value = self._next_job - 1
            self._results.clear()

    def _receive(self, job: int | None, timeout_s: float | None) -> tuple:
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        while True:
            try:
                message = self._outbox.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._proc.is_alive():
                    raise RuntimeError(
                        f"the {self.backend} engine process died (exit code {self._proc.exitcode}) "
                        f"while job {job} was pending"
                    ) from None
                if deadline is not None and time.monotonic() > deadline:
                    raise TimeoutError(
                        f"the {self.backend} engine process gave no answer in {timeout_s:.0f} s"
                    ) from None
        if message[0] in ("done", "error"):
            with self._lock:
                self._results[message[1]] = (message[0], *message[2:])
        return message

    def close(self) -> None:
        if self._proc is None:
            return
        self._stop.set()
        self._inbox.put(("stop",))
        self._proc.join(timeout=30)
        if self._proc.is_alive():
            self._proc.kill()
            self._proc.join(timeout=10)
        self._proc = None


_LAUNCHER_ENV = (
    "RANK",
    "WORLD_SIZE",
    "LOCAL_RANK",
    "LOCAL_WORLD_SIZE",
    "GROUP_RANK",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "MASTER_ADDR",
    "MASTER_PORT",
    "TORCHELASTIC_RUN_ID",
    "ACCELERATE_USE_DEEPSPEED",
)


def _one_device(local_rank: int) -> None:
    """GPU (reviewed, not run here): the engine sees only its rank's device, as `cuda:0` (CUDA reads the variable
    when it starts, which has not happened yet in this fresh process)."""
    visible = os.environ.get("CUDA_VISIBLE_DEVICES")
    if visible is not None and visible.strip() == "":
        return  # no GPU visible: nothing to pick
    devices = [d.strip() for d in visible.split(",")] if visible else None
    if devices is None or local_rank < len(devices):
        os.environ["CUDA_VISIBLE_DEVICES"] = devices[local_rank] if devices else str(local_rank)


def _serve(
    inbox,
    outbox,
    version,
    cancelled,
    stop,
    model_path: str,
    backend: str,
    knobs: dict,
    threads: int | None,
    parent: int,
) -> None:
    """The child: build the engine, then run jobs in order, each with the newest weights it is allowed."""
    try:
        _one_device(int(os.environ.get("LOCAL_RANK", 0)))
        for name in _LAUNCHER_ENV:  # the engine is a world of one: not a rank of the trainer's launch
            os.environ.pop(name, None)
        if threads:
            torch.set_num_threads(int(threads))
        engine = get_engine(model_path, backend=backend, **knobs)  # hf: on the one visible GPU (HFEngine)
    except BaseException:  # noqa: BLE001 - every failure goes back to the parent as text
        outbox.put(("failed", traceback.format_exc()))
        return
    outbox.put(("ready", {"backend": backend, "threads": torch.get_num_threads()}))
    buffers, loaded, later = None, -1, deque()
    while not stop.is_set():
        if os.getppid() != parent:  # the trainer is gone (killed): nothing will collect our results
            return
        try:
            message = later.popleft() if later else inbox.get(timeout=1.0)
        except queue.Empty:
            continue
        if message[0] == "stop":
            return
        if message[0] == "buffers":
            buffers = message[1]
            continue
        _, job, prompts, params, min_version = message
        if job <= cancelled.value:
            continue
        started = time.monotonic()
        while version.value < min_version and job > cancelled.value:  # the staleness bound: new enough weights
            if stop.is_set() or os.getppid() != parent:
                return
            time.sleep(0.002)
        if job <= cancelled.value:  # cancelled while it waited
            continue
        waited = time.monotonic() - started
        while buffers is None and version.value >= 0:  # the first push's tensors were queued after this job
            message = inbox.get()
            if message[0] == "buffers":
                buffers = message[1]
            else:
                later.append(message)
        try:
            with version.get_lock():
                if version.value > loaded and buffers is not None:
                    engine.update_weights(buffers.items())
                    loaded = version.value
            started = time.monotonic()
            groups = engine.generate(prompts, SamplingParams(**params))
            payload = [[(r.completion_ids, r.logprobs, r.finish_reason) for r in group] for group in groups]
            info = {"version": loaded, "generate_s": time.monotonic() - started, "wait_s": waited}
            outbox.put(("done", job, payload, info, prompts))
        except BaseException:  # noqa: BLE001
            outbox.put(("error", job, traceback.format_exc(), None, prompts))


class ServerWorker:
    """EngineWorker's interface over a shared `vllm-server` engine (asynchronous GRPO on a generation server).

    The server already generates outside the trainer, so nothing is spawned: jobs run in order in a thread of the
    trainer's process, each once a version >= its `min_version` is published, and `info["version"]` names the
    weights the server held. A push must not change the server's weights under a generation in flight (the batch
    would mix two policies), and every rank shares the one server: `align.rollout.sampler.Sampler.push` holds
    `paused()` on every rank (each waits for its own generation in flight, none starts another), meets the other ranks,
    and only then does the main process send the weights (NCCL, GPU only); the version is published before the pause
    ends. Generation stops for one push, as with EngineWorker, plus the wait for the generation in flight."""

    versioned = True
    backend = "vllm-server"

    def __init__(self, engine):
        self.engine = engine
        self.logprobs_kind = getattr(engine, "logprobs_kind", "sampling")
        self.version = -1
        self.info = {"backend": self.backend, "threads": 0}
        self._cond = threading.Condition()
        self._generating = threading.Lock()  # held while a generation is on the server, and through a push
        self._jobs: deque = deque()
        self._results: dict[int, tuple] = {}
        self._next_job, self._cancelled, self._stop = 0, -1, False
        self._thread = threading.Thread(target=self._serve, name="smolalign-vllm-server-jobs", daemon=True)
        self._thread.start()

    def paused(self):
        """Hold generation: the job in flight finishes first, the next waits until the block ends."""
        return self._generating

    def update_weights(
        self, named_params: Iterable[tuple[str, torch.Tensor]], version: int | None = None, send: bool = True
    ) -> None:
        """Inside `paused()`: the main process sends the weights to the server (`send`), every rank publishes them
        as `version` (the others only run the iterator: its gathers are collective)."""
        version = self.version + 1 if version is None else int(version)
        if version < self.version:
            raise ValueError(f"update_weights: version {version} is older than the published {self.version}")
        if send:
            self.engine.update_weights(named_params)
        else:
            for _ in named_params:
                pass
        with self._cond:
            self.version = version
            self._cond.notify_all()

    def submit(self, prompts: list[list[int]], params: SamplingParams, min_version: int | None = None) -> int:
        with self._cond:
            job = self._next_job
            self._next_job += 1
            wanted = self.version if min_version is None else int(min_version)
            self._jobs.append((job, [list(p) for p in prompts], params, wanted))
            self._cond.notify_all()
        return job

    def result(self, job: int, timeout_s: float | None = None) -> tuple[list[list[Rollout]], dict]:
        with self._cond:
            if not self._cond.wait_for(lambda: job in self._results or not self._thread.is_alive(), timeout_s):
                raise TimeoutError(f"the vllm-server jobs gave no answer in {timeout_s:.0f} s")
            if job not in self._results:
                raise RuntimeError(f"the vllm-server job thread stopped while job {job} was pending")
            kind, payload, info = self._results.pop(job)
        if kind == "error":
            raise RuntimeError(f"a generation on the vllm server failed:\n{payload}")
        return payload, info

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Rollout]]:
        return self.result(self.submit(prompts, params))[0]

    def cancel_pending(self) -> None:
        with self._cond:
            self._cancelled = self._next_job - 1
            self._jobs.clear()
            self._results.clear()
            self._cond.notify_all()

    def _serve(self) -> None:
        while True:
            with self._cond:
                self._cond.wait_for(lambda: self._stop or self._jobs)
                if self._stop:
                    return
                job, prompts, params, wanted = self._jobs[0]
                started = time.monotonic()
                self._cond.wait_for(lambda j=job, w=wanted: self._stop or self.version >= w or j <= self._cancelled)
                if self._stop:
                    return
                if job <= self._cancelled or not self._jobs or self._jobs[0][0] != job:
                    continue  # cancelled while it waited
                self._jobs.popleft()
                waited = time.monotonic() - started
            with self._generating:  # a push in progress finishes (and publishes) first
                version, started = self.version, time.monotonic()
                try:
                    outcome = (
                        "done",
                        self.engine.generate(prompts, params),
                        {"version": version, "generate_s": time.monotonic() - started, "wait_s": waited},
                    )
                except BaseException:  # noqa: BLE001 - the trainer gets it from result()
                    outcome = ("error", traceback.format_exc(), None)
            with self._cond:
                if job > self._cancelled:
                    self._results[job] = outcome
                self._cond.notify_all()

    def close(self) -> None:
        with self._cond:
            self._stop = True
            self._cond.notify_all()
        self._thread.join(timeout=30)
        self.engine.close()
