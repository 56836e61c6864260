"""The trainer's side of the rollout engine: one sampler that GRPO and distillation share.

Why: a trainer that generates must (1) build its engine outside ZeRO-3's partitioning context, sized for the
recipe's lengths, (2) push its weights to an engine that holds its own copy (align/rollout/weight_sync.py),
(3) generate with whole weights when the engine IS the trained model (the hf backend), (4) seed each rank's sampling
differently and reproducibly, (5) let a colocated vLLM sleep while the trainer trains, and (6) sync a vLLM server from
the main process only. Each is easy to get wrong under ZeRO-3, so it is written once, here, for both.

    sampler = build_sampler("auto", {}, model, model_path, tokenizer, accelerator, seed=0, max_model_len=2048)
    sampler.sync(trainer.model_wrapped, step)                                 # every rank, after a step
    groups = sampler.generate(trainer.model_wrapped, prompt_ids, params)      # every rank, its own prompts

`model_wrapped` is what the trainer trains (the DeepSpeed engine, the DDP module, or the plain model before
training): the sampler unwraps and gathers it as the backend needs. Every method is collective under ZeRO-3 and
FSDP (all ranks call it, in the same order).
"""

from __future__ import annotations

import logging
from typing import Any

import torch

from align.rollout import SamplingParams, choose_backend, fix_vllm_patched_model, get_engine
from align.rollout.base import VLLM_OWN_KEYS
from align.rollout.weight_sync import WeightSync
from align.rollout.worker import EngineWorker, ServerWorker
from align.runtime.distributed import full_model, rank_seed, world, zero3_init_disabled

logger = logging.getLogger(__name__)

ROLLOUT_BACKENDS = ("auto", "hf", "vllm", "vllm-server", "trl")
# sampling knobs every engine has, under the names TRL's GRPOConfig, transformers and vLLM all use
SAMPLING_KNOBS = ("temperature", "top_p", "top_k", "min_p", "repetition_penalty")
# what the trainer sets itself: generation_kwargs may not (vLLM's name and transformers' -> the field that sets it)
TRAINER_SAMPLING = {
    "n": "num_generations",
    "max_tokens": "max_completion_length",
    "max_new_tokens": "max_completion_length",
    "seed": "seed",
    "stop_token_ids": "the tokenizer's EOS ids",
    "logprobs": "vllm_importance_sampling_correction",
    "detokenize": "none (the engine returns token ids)",
}
assert set(VLLM_OWN_KEYS) <= set(SAMPLING_KNOBS) | set(TRAINER_SAMPLING)


def split_generation_kwargs(generation_kwargs: dict | None, backend: str) -> tuple[dict, dict]:
    """TRL's `generation_kwargs` for the shared engine: (the sampling knobs they override, as TRL lets them, on every
    engine; the rest, passed to vLLM's SamplingParams by the vllm and vllm-server engines). `backend` "auto" checks
    what it can before the engine is chosen; "hf" refuses any argument beyond the knobs (its sampler has no more)."""
    kwargs = dict(generation_kwargs or {})
    if backend == "trl":  # TRL's own generation reads them itself
        return {}, {}
    owned = sorted(set(kwargs) & set(TRAINER_SAMPLING))
    if owned:
        raise ValueError(
            f"generation_kwargs {owned} are set by the trainer: use "
            f"{sorted({TRAINER_SAMPLING[k] for k in owned})} instead, and remove them"
        )
    knobs = {k: kwargs.pop(k) for k in SAMPLING_KNOBS if k in kwargs}
    if kwargs and backend == "hf":
        raise ValueError(
            f"generation_kwargs {sorted(kwargs)}: the hf engine samples with {list(SAMPLING_KNOBS)} only; "
            "set rollout_backend vllm or vllm-server (vLLM SamplingParams arguments) or trl "
            "(transformers' GenerationConfig)"
        )
    return knobs, kwargs


def trl_sampling(args, backend: str) -> dict:
    """A TRL config's sampling settings (temperature, top_p, top_k, min_p, repetition_penalty), overridden by its
    `generation_kwargs`, whose other keys become `vllm_kwargs`: SamplingParams arguments for `backend`'s engine."""
    knobs = dict(
        temperature=args.temperature,
        top_p=args.top_p,
        min_p=args.min_p or 0.0,
        repetition_penalty=args.repetition_penalty,
    )
    if args.top_k and args.top_k > 0:
        knobs["top_k"] = args.top_k
    overrides, vllm_kwargs = split_generation_kwargs(args.generation_kwargs, backend)
    return {**knobs, **overrides, "vllm_kwargs": vllm_kwargs}


class Sampler:
    """An engine plus what a trainer needs around it (see the module doc). `engine.model is model` means the
    engine generates with the trained model object itself (hf backend): no weight push, but a gather under ZeRO-3."""

    def __init__(self, engine: Any, accelerator: Any, seed: int = 0, sleep: bool = False):
        self.accelerator, self.seed = accelerator, seed
        self.weights = WeightSync(engine, accelerator)
        self.sleep_between = sleep and hasattr(engine, "sleep")
        self.num_calls = 0

    @property
    def engine(self) -> Any:
        """The engine: one object, which the weight pushes (`self.weights`) reach too."""
        return self.weights.engine

    @engine.setter
    def engine(self, engine: Any) -> None:  # a swapped engine (a server started later, a test's) gets the pushes
        self.weights.engine = engine

    @property
    def backend(self) -> str:
        return getattr(self.engine, "backend", "custom")

    def shares(self, model) -> bool:
        """The engine generates with this (unwrapped) model object: nothing to push."""
        return getattr(self.engine, "model", None) is _unwrap(model, self.accelerator)

    def samples_another_precision(self, model) -> bool:
        """The engine's samples come from another distribution than `model`'s forward gives the trainer: it holds
        weights of its own (vLLM, a copy in another dtype), or it shares the model but samples outside the
        trainer's mixed-precision autocast (the hf engine on a CPU: align.rollout.hf)."""
        if not self.shares(model):
            return True
        bypasses = getattr(self.engine, "bypasses_autocast", None)
        return bool(bypasses and bypasses())

    def state_dict(self) -> dict:
        """What a checkpoint keeps: the call count the next seeds continue from
        (align.runtime.checkpoint.RESUME_STATE)."""
        return {"num_calls": self.num_calls}

    def load_state_dict(self, state: dict) -> None:
        self.num_calls = int(state["num_calls"])

    def next_seed(self) -> int:
        """The sampling seed of the next generation call: per rank, per call, reproducible for (seed, world size)."""
        self.num_calls += 1
        return rank_seed(self.seed, self.num_calls, rank=self.accelerator.process_index if self.accelerator else None)

    # -- weights (align/rollout/weight_sync.py) ---------------------------------------------------------------

    @property
    def num_pushes(self) -> int:
        return self.weights.num_pushes

    def push(self, model, version: int | None = None) -> None:
        """Send the model's current weights to the engine (`WeightSync.push`)."""
        self.weights.push(_unwrap(model, self.accelerator), version=version)

    def sync(self, model, step: int) -> None:
        """Push when the engine holds its own copy and the weights changed (`WeightSync.sync`)."""
        self.weights.sync(_unwrap(model, self.accelerator), step, shares=self.shares(model))

    # -- generation --------------------------------------------------------------------------------------------

    def generate(self, model, prompts: list[list[int]], params: SamplingParams) -> list[list]:
        """One list of `params.n` rollouts per prompt. Call on every rank (an empty prompt list is fine: the rank
        still takes part in the ZeRO-3 gather). Dropout is off while sampling; a sleeping engine wakes up."""
        if self.shares(model):
            with full_model(model, self.accelerator):  # gathered under ZeRO-3, eval mode
                return self.engine.generate(prompts, params) if prompts else []
        unwrapped = _unwrap(model, self.accelerator)
        was_training = unwrapped.training
        unwrapped.eval()
        try:
            with torch.no_grad():
                out = self.engine.generate(prompts, params) if prompts else []
        finally:
            unwrapped.train(was_training)
        if self.sleep_between:
            # Level 2 drops the weights rather than copying them to host memory and back (level 1): the next
            # generation is preceded by a push of the trained weights anyway (sync sees `weights_discarded`).
            self.engine.sleep(level=2)
        return out

    def close(self, model=None) -> None:
        if model is None or not self.shares(model):
            self.engine.close()


def _unwrap(model, accelerator):
    if accelerator is None:
        return model
    return accelerator.unwrap_model(model)


def build_sampler(
    backend: str,
    knobs: dict | None,
    model,
    model_path: str,
    tokenizer,
    accelerator,
    *,
    seed: int = 0,
    max_model_len: int | None = None,
    logprobs_kind: str = "raw",
    own_process: bool = False,
    threads: int | None = None,
) -> Sampler | None:
    """The sampler for `backend` (None for `trl`: TRL's own generation). hf generates with the trained `model`
    itself; vllm (one engine per rank, in-process) loads `model_path` outside ZeRO-3's partitioning and gets the
    weights pushed; vllm-server talks to a `trl vllm-serve` server. `max_model_len` sizes vLLM's context (prompt
    + completion budget) unless the knobs set it; `logprobs_kind` "sampling" starts vLLM reporting the log-probs of
    the distribution it samples from (importance sampling needs them)."""
    if backend not in ROLLOUT_BACKENDS:
        raise ValueError(f"rollout_backend {backend!r} is not one of {list(ROLLOUT_BACKENDS)}")
    if backend == "trl":
        return None
    knobs = dict(knobs or {})
    if backend == "auto":
        backend = choose_backend(model)
    rank = accelerator.process_index if accelerator is not None else world()[0]
    if own_process and backend == "vllm-server":  # the server is the engine's own process: jobs in a thread here
        engine = ServerWorker(get_engine(model_path, backend="vllm-server", tokenizer=tokenizer, **knobs))
        logger.info("rollout engine: a vllm server, asynchronous jobs (rank %d)", rank)
        return Sampler(engine, accelerator, seed=seed)
    if own_process:
        if backend not in ("hf", "vllm"):
            raise ValueError(f"an engine in its own process runs the hf or vllm backend, not {backend!r}")
        if backend == "vllm":
            knobs.setdefault("seed", rank_seed(seed, rank=rank))
            if max_model_len:
                knobs.setdefault("max_model_len", max_model_len)
        else:
            knobs.setdefault("dtype", str(next(model.parameters()).dtype).removeprefix("torch."))
        engine = EngineWorker(model_path, backend=backend, knobs=knobs, threads=threads, logprobs_kind=logprobs_kind)
        logger.info(
            "rollout engine: %s in its own process, %d threads (rank %d)", backend, engine.info["threads"], rank
        )
        return Sampler(engine, accelerator, seed=seed)
    if backend == "vllm":
        knobs.setdefault("seed", rank_seed(seed, rank=rank))
        knobs.setdefault("logprobs_kind", logprobs_kind)
        if max_model_len:
            knobs.setdefault("max_model_len", max_model_len)
        with zero3_init_disabled():  # vLLM builds a whole model of its own on this rank
            engine = get_engine(model_path, backend="vllm", tokenizer=tokenizer, **knobs)
        fix_vllm_patched_model(model)  # vLLM's Transformers backend patches shared classes (SmolLM3): undo for ours
    elif backend == "hf":
        engine = get_engine(model, backend="hf", tokenizer=tokenizer, **knobs)
    else:
        engine = get_engine(model_path, backend="vllm-server", tokenizer=tokenizer, **knobs)
    logger.info("rollout engine: %s (rank %d)", backend, rank)
    return Sampler(
        engine, accelerator, seed=seed, sleep=bool(knobs.get("enable_sleep_mode")) and torch.cuda.is_available()
    )
