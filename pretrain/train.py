"""The pretraining loop: packed document-masked batches -> AdamW -> atomic checkpoints, in one readable file.

What `train(model_args, config)` does, in order, one function per phase:
  1. `_setup_accelerator`: the process (CPU allocator, bf16 fallback), DeepSpeed's `auto` values
     from the recipe, the Accelerator, threads and seeds;
  2. `_load_tokenizer`, `_build_model`: our tokenizer; a SmolLM3-style model (or continue from
     `init_from` for mid-training, with optional new `rope_theta` / `max_position_embeddings` for a
     long-context stage);
  3. `_build_stream`: the staged, document-masked data stream (pretrain/data.py); this rank takes
     its slice;
  4. `_prepare`, `_resume`: AdamW with no weight decay on embeddings, norms and biases, prepared by
     accelerate; a checkpoint restored when resuming;
  5. `_preflight`, `_start_logging`: the checks before the first step; tqdm and wandb (offline) or
     tensorboard;
  6. `_loop`, one `_train_step` per optimizer step: WSD / cosine / multi-step / constant learning
     rate computed from the step (`lr_at`, so a WSD run can be extended mid-run by raising
     max_steps); grad accumulation (no DDP sync until the last micro-batch), clipping, optional
     z-loss, a NaN/inf or loss-spike guard (`skip` the batch or `stop` with a checkpoint and a
     message naming the step); tokens/s + MFU + loss logged; held-out eval every `eval_steps`;
     atomic checkpoints every `save_steps` (keep the last `save_total_limit`); `stop_after_steps`
     and SIGTERM stop with a checkpoint;
  7. `_save_final`: an HF model dir (fp32 safetensors + tokenizer + chat template), metrics.json
     and loss_curve.png.

Resume is exact: model, optimizer, step, RNG and the data stream's position are restored, so the losses
after resuming equal those of an uninterrupted run. Distributed: accelerate (DDP, DeepSpeed ZeRO via
`accelerate launch`). How to run: `accelerate launch scripts/run_pretrain.py recipes/tiny/pretrain.yaml`.
"""

from __future__ import annotations

import json
import math
import os
import random
import time
from dataclasses import asdict, dataclass, field
from typing import Any, NamedTuple, NoReturn

import torch

import data_gen  # noqa: F401  (registers builtin:tasks, a source the pretraining recipes mix in)
from align.config import apply_global_batch, check_launch
from align.modeling.loading import resolve_attn_implementation
from align.runtime.checkpoint import (
    PREEMPTED_EXIT_CODE,
    SigtermFlag,
    clean_staging,
    is_deepspeed,
    load_loop_checkpoint,
    resolve_resume,
    save_loop_checkpoint,
)
from align.runtime.device import cpu_bf16_slower, setup_process
from align.runtime.distributed import param_ndim, zero3_init_disabled
from align.runtime.preflight import preflight_pretrain
from pretrain.data import PackedStream
from pretrain.loss import evaluate, lm_loss, to_device
from pretrain.model import ModelArguments, build_model, describe, flops_per_token, grow_depth
from pretrain.tokenizer import SPECIAL_TOKENS
from pretrain.tracking import Logger, plot_losses

SCHEDULES = ("wsd", "cosine", "multistep", "constant")
GUARD_POLICIES = ("skip", "stop", "ignore")


@dataclass
class PretrainConfig:
    """Everything the loop needs besides the architecture (recipe keys of the same names)."""

    output_dir: str = field(default="outputs/tiny/pretrain", metadata={"help": "Final model, checkpoints, logs."})
    tokenizer_path: str = field(default="outputs/tiny/tokenizer", metadata={"help": "Our trained tokenizer dir."})
    init_from: str | None = field(
        default=None, metadata={"help": "Continue from this model dir (mid-training): new data, fresh schedule."}
    )
    grow_depth: int = field(
        default=1,
        metadata={
            "help": "With init_from: stack each of its layers this many times, the copies starting as identity "
            "(function-preserving depth up-scaling; pretrain.model.grow_depth). 1 = continue it as it is."
        },
    )
    sources: dict = field(
        default_factory=dict,
        metadata={
            "help": "{name: spec | {spec, config, split, text_column, formatter, streaming, shuffle_buffer, "
            "**load_source args}} (JSON ok); streaming: true reads a corpus lazily, sharded per rank."
        },
    )
    stages: list[dict] = field(
        default_factory=list, metadata={"help": "[{name, num_tokens, weights: {source: share}}] (JSON ok)."}
    )
    budget_scale: float = field(
        default=1.0,
        metadata={"help": "Multiply every stage's num_tokens (0.25 = a quarter-length run, same curriculum)."},
    )
    document_separator: str = field(
        default="<|endoftext|>", metadata={"help": "Token that starts every packed document (and resets positions)."}
    )
    seq_len: int = field(default=512, metadata={"help": "Tokens per packed row."})
    micro_batch_size: int = field(default=8, metadata={"help": "Rows per forward pass per rank."})
    grad_accum_steps: int = field(default=1, metadata={"help": "Micro-batches per optimizer step."})
    global_batch_size: int | None = field(
        default=None,
        metadata={
            "help": "Rows of seq_len tokens per optimizer step over all ranks, as published runs state it "
            "(SmolLM3: 576 x 4,096 = 2.36M tokens). grad_accum_steps is then derived from it, micro_batch_size "
            "and the launched world size, so the recipe trains at the same batch on 8 GPUs or 192; it must "
            "divide."
        },
    )
    max_steps: int = field(default=0, metadata={"help": "Optimizer steps; 0 = the stages' total token budget."})
    learning_rate: float = field(default=3e-3, metadata={"help": "Peak learning rate."})
    min_lr_ratio: float = field(default=0.0, metadata={"help": "LR at the end of decay, as a fraction of peak."})
    lr_scheduler: str = field(default="wsd", metadata={"help": f"One of {SCHEDULES}."})
    warmup_steps: int = field(default=20, metadata={"help": "Linear warmup steps."})
    decay_fraction: float = field(default=0.2, metadata={"help": "WSD: share of max_steps spent decaying to min."})
    milestones: list[int] = field(default_factory=list, metadata={"help": "multistep: steps where LR *= gamma."})
    gamma: float = field(default=0.1, metadata={"help": "multistep: LR factor at each milestone."})
    weight_decay: float = field(default=0.1, metadata={"help": "AdamW decay on matmul weights only."})
    adam_beta1: float = 0.9
    adam_beta2: float = 0.95
    adam_epsilon: float = 1e-8
    max_grad_norm: float = field(default=1.0, metadata={"help": "Clip the global grad norm (0 = off)."})
    z_loss: float = field(default=0.0, metadata={"help": "Coefficient of the z-loss (logsumexp^2); off as SmolLM3."})
    loss_chunk_tokens: int = field(
        default=0,
        metadata={
            "help": "Compute the LM head and loss this many positions at a time (activation-checkpointed; 0 = all at "
            "once): a 64k row's fp32 logits over a 128k vocabulary are 33.6 GB whole (pretrain/loss.py)."
        },
    )
    gradient_checkpointing: bool = field(
        default=False,
        metadata={"help": "Recompute each decoder layer's activations in the backward (long context: 32k/64k rows)."},
    )
    attn_implementation: str = field(
        default="auto",
        metadata={
            "help": "auto: flash_attention_2 on a GPU with flash-attn installed (packed rows attend per document by "
            "their position ids, no T x T mask), else sdpa; or sdpa / flash_attention_2 explicitly."
        },
    )
    mixed_precision: str = field(default="bf16", metadata={"help": "'bf16' (autocast) or 'no' (fp32)."})
    seed: int = field(default=0, metadata={"help": "Seed of init and data order (same on every rank)."})
    eval_steps: int = field(default=50, metadata={"help": "Held-out eval every N steps (0 = only at the end)."})
    eval_rows: int = field(default=8, metadata={"help": "Held-out rows per source per eval."})
    eval_docs: int = field(default=20, metadata={"help": "Documents held out per source (never trained on)."})
    save_steps: int = field(default=0, metadata={"help": "Checkpoint every N steps (0 = none until the end)."})
    save_total_limit: int = field(default=2, metadata={"help": "Keep the last K checkpoints."})
    resume_from_checkpoint: str | None = field(
        default=None,
        metadata={
            "help": "A checkpoint dir, or 'auto' for the latest complete one in output_dir/checkpoints (unset: "
            "a fresh start; align/runtime/checkpoint.py)."
        },
    )
    logging_steps: int = field(default=10, metadata={"help": "Log every N steps."})
    report_to: str = field(default="wandb", metadata={"help": "'wandb' (offline by default), 'tensorboard', 'none'."})
    run_name: str | None = None
    nan_policy: str = field(default="stop", metadata={"help": f"On a NaN/inf loss or grad: one of {GUARD_POLICIES}."})
    spike_policy: str = field(default="skip", metadata={"help": f"On a loss spike: one of {GUARD_POLICIES}."})
    spike_factor: float = field(default=3.0, metadata={"help": "A spike is loss > factor * its running mean."})
    num_threads: int = field(
        default=0, metadata={"help": "torch CPU threads (0 = torch's default); 1 is faster on an oversubscribed CPU."}
    )
    peak_flops: float = field(default=0.0, metadata={"help": "Device peak FLOP/s for MFU; 0 = measure a matmul."})
    stop_after_steps: int = field(default=0, metadata={"help": "Stop (checkpointed) after N steps: tests/preemption."})
    skip_preflight: bool = field(default=False, metadata={"help": "Skip the preflight checks (logged loudly)."})

    def __post_init__(self):
        if isinstance(self.sources, str) or self.sources is None:
            self.sources = json.loads(self.sources) if self.sources else {}
        if isinstance(self.stages, str) or self.stages is None:
            self.stages = json.loads(self.stages) if self.stages else []
        if self.lr_scheduler not in SCHEDULES:
            raise ValueError(f"lr_scheduler={self.lr_scheduler!r}: choose one of {SCHEDULES}")
        if self.grow_depth < 1:
            raise ValueError(f"grow_depth={self.grow_depth} must be >= 1 (1 = continue init_from as it is)")
        if self.grow_depth > 1 and not self.init_from:
            raise ValueError(f"grow_depth={self.grow_depth} grows an existing model: set init_from to its directory")
        for name in ("nan_policy", "spike_policy"):
            if getattr(self, name) not in GUARD_POLICIES:
                raise ValueError(f"{name}={getattr(self, name)!r}: choose one of {GUARD_POLICIES}")
        if self.mixed_precision not in ("bf16", "no"):
            raise ValueError(f"mixed_precision={self.mixed_precision!r}: choose 'bf16' or 'no'")
        if self.budget_scale <= 0:
            raise ValueError(f"budget_scale={self.budget_scale} must be > 0")
        if not 0 <= self.decay_fraction <= 1:
            raise ValueError(f"decay_fraction={self.decay_fraction} must be in [0, 1]")


# Text the tokenizer must round-trip exactly (digits, LaTeX, think tags, non-ASCII), checked before training.
PREFLIGHT_TEXTS = [
    "Question: What is 12 + 30?\nAnswer: The answer is \\boxed{42}.",
    "<think>\n2 + 3 = 5\n</think>\nThe answer is \\boxed{5}.",
    "Shall I compare thee to a summer's day? Café, naïve, “quoted”.",
]


def lr_at(step: int, cfg: PretrainConfig, total_steps: int) -> float:
    """Learning rate of optimizer step `step` (0-based). Pure: the schedule's whole state is the step."""
    peak, floor = cfg.learning_rate, cfg.learning_rate * cfg.min_lr_ratio
    if step < cfg.warmup_steps:
        return peak * (step + 1) / cfg.warmup_steps
    if cfg.lr_scheduler == "constant":
        return peak
    if cfg.lr_scheduler == "multistep":
        return peak * cfg.gamma ** sum(step >= m for m in cfg.milestones)
    if cfg.lr_scheduler == "cosine":
        progress = min(1.0, (step - cfg.warmup_steps) / max(1, total_steps - cfg.warmup_steps))
        return floor + (peak - floor) * 0.5 * (1 + math.cos(math.pi * progress))
    # WSD: flat until the last decay_fraction of the run, then linear to the floor. Only the decay start
    # depends on total_steps, so raising max_steps before it extends the run without a restart.
    decay_steps = max(1, round(cfg.decay_fraction * total_steps))
    decay_start = total_steps - decay_steps
    if step < decay_start:
        return peak
    return peak + (floor - peak) * min(1.0, (step - decay_start + 1) / decay_steps)


def param_groups(model: torch.nn.Module, weight_decay: float) -> list[dict]:
    """AdamW groups: decay on matmul weights; none on embeddings (tied head included), norms and biases."""
    decay, no_decay = [], []
    emb = model.get_input_embeddings().weight
    for name, p in model.named_parameters():
        if not p.requires_grad:
            continue
        (no_decay if param_ndim(p) < 2 or p is emb or "embed" in name else decay).append(p)
    return [{"params": decay, "weight_decay": weight_decay}, {"params": no_decay, "weight_decay": 0.0}]


# Dense bf16/fp16 tensor-core peaks (spec sheets, SXM parts) by device-name fragment: the MFU denominator on a GPU.
GPU_PEAK_FLOPS = {"H200": 989e12, "H100": 989e12, "A100": 312e12, "L40S": 362e12, "A10G": 125e12, "L4": 121e12}


def peak_flops(dtype: torch.dtype, device: torch.device | str = "cpu") -> float:
    """The MFU denominator on the device the model trains on: a GPU's spec-sheet peak when its name is known (half
    precision; fp32 counts at half of it, TF32), else a measured matmul on that device (never the CPU's on
    a GPU machine: MFU would be against the wrong device)."""
    device = torch.device(device)
    if device.type == "cuda":
        name = torch.cuda.get_device_name(device)
        for fragment, flops in GPU_PEAK_FLOPS.items():
            if fragment in name:
                return flops if dtype in (torch.bfloat16, torch.float16) else flops / 2
    return measure_matmul_flops(dtype, device=device)


def measure_matmul_flops(
    dtype: torch.dtype = torch.float32, n: int = 1024, reps: int = 5, device: torch.device | str = "cpu"
) -> float:
    """Achievable matmul FLOP/s on `device` (the MFU denominator on machines without a spec-sheet peak)."""
    a, b = torch.randn(n, n, dtype=dtype, device=device), torch.randn(n, n, dtype=dtype, device=device)
    a @ b  # warm-up
    sync = torch.cuda.synchronize if torch.device(device).type == "cuda" else (lambda: None)
    sync()
    t = time.perf_counter()
    for _ in range(reps):
        a @ b
    sync()
    return 2 * n**3 * reps / (time.perf_counter() - t)


# ---- DeepSpeed -----------------------------------------------------------------------------------


def _fill_deepspeed_config(acc, cfg: PretrainConfig) -> None:
    """The DeepSpeed config's `auto` values, from the recipe: without an HF Trainer (or a dataloader handed to
    prepare()) nothing else fills them, and DeepSpeed fails on the literal 'auto'."""
    ds = acc.state.deepspeed_plugin.deepspeed_config
    ds["train_micro_batch_size_per_gpu"] = cfg.micro_batch_size
    ds["gradient_accumulation_steps"] = cfg.grad_accum_steps
    ds.pop("train_batch_size", None)  # DeepSpeed derives it: micro batch x accumulation x world size
    ds["gradient_clipping"] = cfg.max_grad_norm or 0.0
    for key in ("bf16", "fp16"):
        if isinstance(ds.get(key), dict) and ds[key].get("enabled") == "auto":
            ds[key]["enabled"] = (cfg.mixed_precision == "bf16") if key == "bf16" else False


# ---- the model -----------------------------------------------------------------------------------


def attention(name: str) -> str:
    """The attention kernel: 'auto' is flash_attention_2 on a GPU with flash-attn installed (packed rows then attend
    per document from their position ids, varlen, with no [B, 1, T, T] mask: 4.3 GB at 64k), else sdpa; the rule
    every stage shares (align.modeling.loading.resolve_attn_implementation)."""
    return resolve_attn_implementation(name)


def _load_or_build_model(model_args: ModelArguments, cfg: PretrainConfig, tokenizer, special: dict[str, int]):
    if not cfg.init_from:
        return build_model(
            model_args, len(tokenizer), special, seed=cfg.seed, attn_implementation=attention(cfg.attn_implementation)
        )
    from transformers import AutoModelForCausalLM

    if not os.path.isdir(cfg.init_from):
        raise FileNotFoundError(f"init_from={cfg.init_from!r} is not a model directory; pretrain it first")
    model = AutoModelForCausalLM.from_pretrained(
        cfg.init_from, dtype=torch.float32, attn_implementation=attention(cfg.attn_implementation)
    )
    # Long-context stage: a larger RoPE base (and advertised length) on the continued model.
    if model_args.rope_theta:
        model.config.rope_parameters["rope_theta"] = model_args.rope_theta
        model.model.rotary_emb.__init__(model.config)  # recompute inv_freq for the new base
    if model_args.max_position_embeddings:
        model.config.max_position_embeddings = model_args.max_position_embeddings
    if model.get_input_embeddings().weight.shape[0] < len(tokenizer):
        raise ValueError(f"init_from model has {model.config.vocab_size} tokens < tokenizer's {len(tokenizer)}")
    if cfg.grow_depth != 1:
        model = grow_depth(model, cfg.grow_depth)
    return model


# ---- the run's state -----------------------------------------------------------------------------


@dataclass
class _Run:
    """What the phases of `train` share: the prepared objects, and the progress a checkpoint saves
    (the step, the data stream's position, the loss history, the evals and the skipped steps)."""

    cfg: PretrainConfig
    acc: Any  # accelerate.Accelerator, imported lazily
    model: torch.nn.Module  # as prepare() wrapped it (DDP, a DeepSpeed engine)
    raw: torch.nn.Module  # unwrapped: its config, the preflight, save_pretrained
    optimizer: torch.optim.Optimizer
    stream: PackedStream
    tokenizer: Any
    total_steps: int
    tokens_per_step: int
    description: str
    step: int = 0
    history: list[dict] = field(default_factory=list)
    evals: list[dict] = field(default_factory=list)
    skipped: list[dict] = field(default_factory=list)
    running: float | None = None  # running mean of the applied steps' losses: the spike reference

    def checkpoint(self) -> str:
        """Save the current step. Every rank calls it: DeepSpeed saves collectively, a streamed
        source gathers its positions."""
        state = {
            "step": self.step,
            "data": self.stream.state_dict(),
            "history": self.history,
            "evals": self.evals,
            "skipped": self.skipped,
        }
        return save_loop_checkpoint(
            self.cfg.output_dir,
            self.step,
            self.acc,
            self.model,
            self.optimizer,
            state,
            self.tokenizer,
            self.cfg.save_total_limit,
        )


@dataclass
class _Throughput:
    """tokens/s and MFU over the steps since the last log line."""

    flops_per_token: float
    peak_flops: float  # of one device
    num_processes: int
    since: float = 0.0
    tokens: int = 0

    def restart(self) -> None:
        self.since, self.tokens = time.perf_counter(), 0

    def exclude(self, since: float) -> None:
        """Leave the time from `since` to now out of the rate (eval and checkpoints do not count
        against tokens/s)."""
        self.since += time.perf_counter() - since

    def rates(self) -> tuple[float, float]:
        tps = self.tokens / (time.perf_counter() - self.since)
        return tps, self.flops_per_token * tps / self.num_processes / self.peak_flops


class _StepOutcome(NamedTuple):
    loss: float  # mean over the micro-batches (and ranks)
    grad_norm: float  # before clipping; nan when the backend reports none
    problem: str | None  # what the guard found (a non-finite loss/grad, a loss spike), else None
    action: str  # "applied", "skipped" or "stop"


# ---- the phases of train(), in order -------------------------------------------------------------


def train(model_args: ModelArguments, cfg: PretrainConfig) -> dict:
    """Run (or resume) one pretraining/mid-training job; returns the final metrics (also in
    metrics.json), or {step, history, stopped: True} when `stop_after_steps` ends it early."""
    acc = _setup_accelerator(cfg)
    tokenizer, special = _load_tokenizer(cfg)
    model = _build_model(model_args, cfg, tokenizer, special)
    stream = _build_stream(cfg, acc, tokenizer)
    run = _prepare(cfg, acc, model, stream, tokenizer)
    _resume(run)
    eval_batches = _preflight(run)  # after the resume: the checks see the weights that will train
    run_config = {**asdict(model_args), **asdict(cfg), "total_steps": run.total_steps}
    log, meter = _start_logging(run, run_config)
    stopped = _loop(run, log, meter, eval_batches)
    return stopped if stopped is not None else _save_final(run, run_config)


def _setup_accelerator(cfg: PretrainConfig):
    """The process and the Accelerator: the launch check, CPU tuning, the bf16 fallback,
    DeepSpeed's `auto` values from the recipe, then threads and seeds (the same on every rank)."""
    from accelerate import Accelerator

    check_launch()  # FSDP on a CPU: one clear line
    apply_global_batch(cfg, per_device="micro_batch_size", accumulation="grad_accum_steps")
    setup_process()  # on a CPU: no page faults on every step's large tensors
    if not torch.cuda.is_available() and cpu_bf16_slower(cfg.mixed_precision == "bf16"):
        cfg.mixed_precision = "no"
    for key, value in (
        ("GRADIENT_ACCUMULATION_STEPS", cfg.grad_accum_steps),
        ("GRADIENT_CLIPPING", cfg.max_grad_norm),
    ):
        # an accelerate DeepSpeed config's `auto`: the recipe's value
        if os.environ.get(f"ACCELERATE_{key}") == "auto":
            os.environ[f"ACCELERATE_{key}"] = str(value)
    on_cpu = not torch.cuda.is_available()
    if on_cpu and os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() == "true":
        # As transformers' TrainingArguments does: the ranks join over gloo first, then the
        # Accelerator takes DeepSpeed (cpu=True would drop DeepSpeed; neither would leave every rank
        # believing it is rank 0 of 1).
        from accelerate import PartialState

        PartialState(cpu=True)
        on_cpu = False
    acc = Accelerator(
        mixed_precision=cfg.mixed_precision, cpu=on_cpu, gradient_accumulation_steps=cfg.grad_accum_steps
    )
    if cfg.num_threads:
        torch.set_num_threads(cfg.num_threads)
    torch.manual_seed(cfg.seed)
    random.seed(cfg.seed)
    return acc


def _load_tokenizer(cfg: PretrainConfig) -> tuple[Any, dict[str, int]]:
    """The tokenizer, and the ids of those of our special tokens it has."""
    from transformers import AutoTokenizer

    # mid-training reuses the model's own tokenizer by default
    tok_path = cfg.tokenizer_path or cfg.init_from
    try:
        tokenizer = AutoTokenizer.from_pretrained(tok_path)
    except (OSError, TypeError, ValueError) as e:
        raise FileNotFoundError(
            f"tokenizer_path={tok_path!r} is not a tokenizer dir or hub id ({e}); run scripts/train_tokenizer.py"
        ) from e
    # Our specials when present (a hub tokenizer may lack some: they are simply not set in the
    # config).
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    special = {t: i for t, i in ids.items() if i is not None and i != tokenizer.unk_token_id}
    return tokenizer, special


def _build_model(
    model_args: ModelArguments, cfg: PretrainConfig, tokenizer, special: dict[str, int]
) -> torch.nn.Module:
    # built whole (the same on every rank); DeepSpeed partitions it in prepare()
    with zero3_init_disabled():
        model = _load_or_build_model(model_args, cfg, tokenizer, special)
    if cfg.gradient_checkpointing:
        model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
    return model


def _build_stream(cfg: PretrainConfig, acc, tokenizer) -> PackedStream:
    """The staged data stream, its budget scaled; this rank takes its slice of each global batch."""
    stages = [{**s, "num_tokens": max(1, round(s["num_tokens"] * cfg.budget_scale))} for s in cfg.stages]
    return PackedStream(
        cfg.sources,
        stages,
        tokenizer,
        cfg.seq_len,
        cfg.seed,
        acc.process_index,
        acc.num_processes,
        cfg.eval_docs,
        cfg.document_separator,
    )


def _prepare(cfg: PretrainConfig, acc, model, stream: PackedStream, tokenizer) -> _Run:
    """The step count, AdamW, and the model and optimizer prepared by accelerate."""
    tokens_per_step = cfg.micro_batch_size * cfg.grad_accum_steps * acc.num_processes * cfg.seq_len
    total_steps = cfg.max_steps or math.ceil(stream.total_tokens / tokens_per_step)
    optimizer = torch.optim.AdamW(
        param_groups(model, cfg.weight_decay),
        lr=cfg.learning_rate,
        betas=(cfg.adam_beta1, cfg.adam_beta2),
        eps=cfg.adam_epsilon,
    )
    description = describe(model, cfg.seq_len)  # before prepare(): ZeRO-3 leaves each rank a shard
    if is_deepspeed(acc):
        _fill_deepspeed_config(acc, cfg)
    model, optimizer = acc.prepare(model, optimizer)
    return _Run(
        cfg,
        acc,
        model,
        acc.unwrap_model(model),
        optimizer,
        stream,
        tokenizer,
        total_steps,
        tokens_per_step,
        description,
    )


def _resume(run: _Run) -> None:
    """Continue from a checkpoint when asked: weights, optimizer, RNG, the stream's position and
    the progress."""
    cfg = run.cfg
    if run.acc.is_main_process:
        clean_staging(cfg.output_dir, layout="loop")  # a save a killed run left half-written
    resume = resolve_resume(cfg.resume_from_checkpoint, cfg.output_dir, layout="loop", unset="no")
    if resume:
        state = load_loop_checkpoint(resume, run.acc, run.model, run.optimizer)
        run.stream.load_state_dict(state["data"])
        run.step, run.history = state["step"], state["history"]
        run.evals, run.skipped = state["evals"], state["skipped"]
        run.acc.print(f"resumed from {resume} at step {run.step}")


def _preflight(run: _Run) -> dict:
    """The preflight checks (the tokenizer must round-trip the held-out text too); returns the
    held-out eval batches, on the device."""
    cfg = run.cfg
    eval_batches = run.stream.eval_batches(cfg.eval_rows)
    held_out = [run.tokenizer.decode(b["input_ids"][0][:128]) for b in eval_batches.values()]
    eval_batches = {name: to_device(b, run.acc.device) for name, b in eval_batches.items()}
    preflight_pretrain(
        run.raw,
        run.tokenizer,
        output_dir=cfg.output_dir,
        num_checkpoints=cfg.save_total_limit if cfg.save_steps else 0,
        texts=[*PREFLIGHT_TEXTS, *held_out],
        skip=cfg.skip_preflight,
    )
    return eval_batches


def _start_logging(run: _Run, run_config: dict) -> tuple[Logger, _Throughput]:
    """The progress bar and tracker (starting at the resumed step), and the MFU's terms."""
    cfg, acc = run.cfg, run.acc
    flops_tok = flops_per_token(run.raw.config, cfg.seq_len)
    dtype = torch.bfloat16 if cfg.mixed_precision == "bf16" else torch.float32
    peak = cfg.peak_flops or peak_flops(dtype, acc.device)
    acc.print(f"model: {run.description}; {run.total_steps} steps x {run.tokens_per_step} tokens")
    log = Logger(
        cfg.report_to, cfg.output_dir, cfg.run_name, acc.is_main_process, run.total_steps, run.step, run_config
    )
    return log, _Throughput(flops_tok, peak, acc.num_processes)


def _loop(run: _Run, log: Logger, meter: _Throughput, eval_batches: dict) -> dict | None:
    """The optimizer steps from `run.step` to the end. Returns the partial result when
    `stop_after_steps` ends the run early, else None; the guard's `stop` raises, and a SIGTERM the
    ranks agree on exits PREEMPTED_EXIT_CODE."""
    cfg = run.cfg
    meter.restart()
    # preemption: finish the step, checkpoint it, exit PREEMPTED_EXIT_CODE
    sigterm = SigtermFlag().install()
    run.model.train()
    while run.step < run.total_steps:
        lr = lr_at(run.step, cfg, run.total_steps)
        outcome = _train_step(run, lr)
        if outcome.action == "stop":
            _stop_on_bad_step(run, log, outcome.problem)
        run.step += 1
        meter.tokens += run.tokens_per_step
        run.history.append(
            {
                "step": run.step,
                "tokens": run.step * run.tokens_per_step,
                "loss": outcome.loss,
                "lr": lr,
                "time": time.perf_counter(),
            }
        )
        log.bar.update(1)
        if run.step % cfg.logging_steps == 0 or run.step == run.total_steps:
            _log_step(run, log, meter, outcome, lr)
        pause = time.perf_counter()
        if (cfg.eval_steps and run.step % cfg.eval_steps == 0) or run.step == run.total_steps:
            _eval_held_out(run, log, eval_batches)
        stopped = _checkpoint_or_stop(run, log, sigterm)
        if stopped is not None:
            return stopped
        if run.step % cfg.logging_steps == 0:
            meter.restart()
        else:
            meter.exclude(pause)
    log.close()
    sigterm.restore()
    return None


def _train_step(run: _Run, lr: float) -> _StepOutcome:
    """One optimizer step at learning rate `lr`, unless the guard objects: `skip` drops the update
    (the batch stays consumed), `stop` leaves the step to the caller, `ignore` applies it."""
    for group in run.optimizer.param_groups:
        group["lr"] = lr
    loss = _forward_backward(run)
    max_norm = run.cfg.max_grad_norm or float("inf")
    grad_norm = run.acc.clip_grad_norm_(run.model.parameters(), max_norm)
    grad_norm = float("nan") if grad_norm is None else float(grad_norm)
    problem, policy = _guard(run, loss, grad_norm)
    if problem and policy in ("stop", "skip"):
        run.optimizer.zero_grad(set_to_none=True)
        if policy == "stop":
            return _StepOutcome(loss, grad_norm, problem, "stop")
        # DeepSpeed stepped inside the last backward: too late to skip
        applied = is_deepspeed(run.acc)
        run.skipped.append(
            {"step": run.step, "reason": problem, **({"applied_by_deepspeed": True} if applied else {})}
        )
        run.acc.print(
            f"step {run.step}: {problem}; "
            + ("DeepSpeed already applied this update (logged only)" if applied else "batch skipped")
        )
        return _StepOutcome(loss, grad_norm, problem, "skipped")
    run.optimizer.step()
    run.optimizer.zero_grad(set_to_none=True)
    run.running = loss if run.running is None else 0.9 * run.running + 0.1 * loss
    return _StepOutcome(loss, grad_norm, problem, "applied")


def _forward_backward(run: _Run) -> float:
    """Gradients of one step's micro-batches; returns their mean loss (over the ranks too)."""
    cfg, acc = run.cfg, run.acc
    loss_sum = torch.zeros(())
    for _ in range(cfg.grad_accum_steps):
        batch = to_device(run.stream.next_batch(cfg.micro_batch_size), acc.device)
        # accumulate(): no DDP sync until the last micro-batch; backward() scales by
        # 1/grad_accum_steps (DeepSpeed scales itself, and steps its engine inside the last
        # backward: the guard sees that step after it)
        with acc.accumulate(run.model):
            loss = lm_loss(run.model, batch, cfg.z_loss, cfg.loss_chunk_tokens)
            acc.backward(loss)
        loss_sum += loss.detach().float().cpu() / cfg.grad_accum_steps
    return acc.reduce(loss_sum, "mean").item() if acc.num_processes > 1 else loss_sum.item()


def _guard(run: _Run, loss: float, grad_norm: float) -> tuple[str | None, str]:
    """(what is wrong with this step, the policy for it), or (None, 'ignore') for a sound step. A
    spike counts only after warmup, against the running mean of the applied steps."""
    cfg = run.cfg
    if not (math.isfinite(loss) and math.isfinite(grad_norm)):
        return "non-finite loss/grad", cfg.nan_policy
    after_warmup = run.running is not None and run.step >= cfg.warmup_steps
    if after_warmup and loss > cfg.spike_factor * run.running:
        spike = f"loss spike ({loss:.3f} > {cfg.spike_factor} x running mean {run.running:.3f})"
        return spike, cfg.spike_policy
    return None, "ignore"


def _stop_on_bad_step(run: _Run, log: Logger, problem: str) -> NoReturn:
    run.step += 1  # the bad batch is consumed: a resume continues after it
    path = run.checkpoint()
    log.close()
    raise RuntimeError(
        f"{problem} at step {run.step - 1}; checkpoint saved at {path}. "
        "Resume with --resume_from_checkpoint auto (the bad batch is skipped), "
        "or lower learning_rate / set nan_policy/spike_policy to 'skip'."
    )


def _log_step(run: _Run, log: Logger, meter: _Throughput, outcome: _StepOutcome, lr: float) -> None:
    tps, mfu = meter.rates()
    metrics = {
        "loss": outcome.loss,
        "lr": lr,
        "grad_norm": outcome.grad_norm,
        "tokens_per_s": tps,
        "mfu": mfu,
        "stage": run.stream.stage_index,
    }
    run.history[-1].update(tokens_per_s=tps, mfu=mfu)
    log.bar.set_postfix(loss=f"{outcome.loss:.3f}", tok_s=f"{tps:.0f}", mfu=f"{mfu:.1%}")
    log.log(metrics, run.step)


def _eval_held_out(run: _Run, log: Logger, eval_batches: dict) -> None:
    scores = evaluate(run.model, eval_batches, run.acc.autocast, run.cfg.loss_chunk_tokens)
    run.evals.append({"step": run.step, "tokens": run.step * run.tokens_per_step, **scores})
    log.log({k: v for k, v in run.evals[-1].items() if k.startswith("eval")}, run.step)


def _checkpoint_or_stop(run: _Run, log: Logger, sigterm: SigtermFlag) -> dict | None:
    """After a step: the periodic checkpoint, then an early stop. `stop_after_steps` checkpoints
    and returns the partial result; a SIGTERM checkpoints and exits. The last step saves in
    `_save_final` instead."""
    cfg, step, total_steps = run.cfg, run.step, run.total_steps
    if cfg.save_steps and step % cfg.save_steps == 0 and step < total_steps:
        run.checkpoint()
    if cfg.stop_after_steps and step >= cfg.stop_after_steps and step < total_steps:
        run.checkpoint()
        log.close()
        sigterm.restore()
        return {"step": step, "history": run.history, "stopped": True}
    # agreed() is a collective: every rank asks at every step's end, so all of them save this step
    if step < total_steps and sigterm.agreed(run.acc.device):
        path = run.checkpoint()
        log.close()
        run.acc.print(
            f"stopped by SIGTERM at step {step}; checkpoint saved at {path}: "
            "run the same command with --resume_from_checkpoint auto to resume"
        )
        raise SystemExit(PREEMPTED_EXIT_CODE)
    return None


def _save_final(run: _Run, run_config: dict) -> dict:
    """The final checkpoint (when checkpointing), then on rank 0 the HF model dir, metrics.json
    and the loss curve; returns the metrics."""
    cfg, acc = run.cfg, run.acc
    result = {
        "step": run.step,
        "total_tokens": run.step * run.tokens_per_step,
        "history": run.history,
        "evals": run.evals,
        "skipped": run.skipped,
        "final_eval": run.evals[-1] if run.evals else {},
        "model": run.description,
    }
    if cfg.save_steps:
        run.checkpoint()
    acc.wait_for_everyone()
    weights = acc.get_state_dict(run.model)  # collective under ZeRO-3: every rank, whole on rank 0
    if acc.is_main_process:
        os.makedirs(cfg.output_dir, exist_ok=True)
        run.raw.save_pretrained(cfg.output_dir, safe_serialization=True, state_dict=weights)
        run.tokenizer.save_pretrained(cfg.output_dir)
        with open(os.path.join(cfg.output_dir, "metrics.json"), "w") as f:
            json.dump({**result, "config": run_config}, f, indent=1, default=str)
        plot_losses(run.history, run.evals, os.path.join(cfg.output_dir, "loss_curve.png"))
    return result
