"""Preflight: cheap checks that run before any long job, so a setup bug costs seconds instead of a run.

Why: the SmolLM3 team lost a 1T-token run to ranks that shared a random seed; users of other frameworks lose runs
to all-zero assistant masks, sorted data, full disks and resumes that cannot load. Every stage's `main()` calls
`preflight(trainer, script_args, stage=...)` after building its trainer and before `trainer.train()`:

    output_dir     writable, with free disk for the checkpoints the recipe will write
                   (params x bytes per param (weights + Adam moments) x checkpoints kept, + the final model)
    resume         the checkpoint a resume would load (align.runtime.checkpoint.resume_checkpoint) is complete and
                   readable: trainer state parses, weight names/shapes match the model, optimizer/scheduler/RNG
                   files intact
    tokenizer      decode(encode(text)) == text on the first examples
    chat_template  non-empty assistant/completion masks on the first examples (align.data.chat, any template)
    known_answer   the accuracy reward scores the gold answer 1.0 and a wrong one below 1; every reward runs on it
                   and returns one score per completion (no rewards: math_reward on a fixed item)
    data_order     per rank, one epoch of sampler indices: no index read twice (across ranks: disjoint shards),
                   not sorted by length (|Spearman(position, length)| small) nor grouped by source column
    weights        every data-parallel rank starts from identical weights (parameter hashes all-gathered)
    seeds          sampling/dropout RNG differs across ranks where the stage samples or uses dropout

Each failure is one line naming the check, the value and the fix; all failures of all ranks are gathered and
raised as one `PreflightError` (a ValueError: the CLI prints it and exits 1). `--skip_preflight true` skips the
checks with a loud warning. `SMOLALIGN_PREFLIGHT_ONLY=1` (what `scripts/preflight.py recipe.yaml` sets) stops
the stage with exit code 0 right after the checks pass, before any training.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import math
import os
import random
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch

from align.runtime.checkpoint import resume_checkpoint
from align.runtime.preflight_checks import (
    _is_conversation,
    check_checkpoint,
    check_data_order,
    check_known_answer,
    check_masks,
    check_output_dir,
    check_roundtrip,
    check_same_weights,
    check_seeds,
    check_shuffled,
    estimate_checkpoint_bytes,
    weights_digest,
)

logger = logging.getLogger(__name__)

PREFLIGHT_ONLY_ENV = "SMOLALIGN_PREFLIGHT_ONLY"
NUM_EXAMPLES = 4  # first examples checked for round-trip, masks and known answers
MAX_ORDER = 20_000  # sampler indices per rank read for the order checks
SOURCE_COLUMNS = ("source", "family", "dataset", "task", "origin")
SAMPLING_STAGES = ("grpo", "online_dpo", "distill", "gkd")


class PreflightError(ValueError):
    """One or more preflight checks failed; the message lists each as one line."""


class PreflightPassed(SystemExit):
    """Raised after the checks pass when only the preflight was asked for (exit code 0)."""


@dataclass
class Check:
    name: str
    ok: bool = True
    message: str = ""
    skipped: bool = False


# ----------------------------------------------------------------------------- collective helpers


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def gather(obj) -> list:
    """Every rank's `obj`, in rank order (a list of one without a process group)."""
    import torch.distributed as dist

    rank, size = world()
    if size == 1:
        return [obj]
    out = [None] * size
    dist.all_gather_object(out, obj)
    return out


@contextlib.contextmanager
def preserved_rng():
    """Checks that draw random numbers (a sampler's shuffle) must not shift the training run's RNG."""
    import numpy as np

    states = (random.getstate(), np.random.get_state(), torch.get_rng_state())
    cuda = torch.cuda.get_rng_state_all() if torch.cuda.is_available() else None
    try:
        yield
    finally:
        random.setstate(states[0])
        np.random.set_state(states[1])
        torch.set_rng_state(states[2])
        if cuda is not None:
            torch.cuda.set_rng_state_all(cuda)


# ----------------------------------------------------------------------------- reading a trainer


def _rows(dataset, n: int = NUM_EXAMPLES) -> list[dict]:
    if dataset is None:
        return []
    try:
        return [dict(dataset[i]) for i in range(min(n, len(dataset)))]
    except TypeError:  # an IterableDataset
        return [dict(r) for _, r in zip(range(n), dataset)]


def _texts(rows: Sequence[dict]) -> list[str]:
    out = []
    for row in rows:
        for key in ("text", "prompt", "completion", "chosen", "rejected", "messages", "question"):
            value = row.get(key)
            if isinstance(value, str) and value:
                out.append(value)
            elif _is_conversation(value):
                out.extend(m["content"] for m in value if isinstance(m.get("content"), str) and m["content"])
    return out


def _row_length(row: dict) -> float:
    ids = [v for k, v in row.items() if k.endswith("input_ids") and isinstance(v, (list, torch.Tensor))]
    if ids:
        return float(sum(len(v) for v in ids))
    return float(sum(len(t) for t in _texts([row])))


def _rank_order(trainer) -> tuple[list[int], int, bool, int] | None:
    """(this rank's sampler indices for epoch 0, expected repeats per index, capped, batch size) from the real
    dataloader."""
    with preserved_rng():
        known = list(getattr(trainer.accelerator, "_dataloaders", []))
        dl = trainer.get_train_dataloader()
        if hasattr(trainer.accelerator, "_dataloaders"):
            trainer.accelerator._dataloaders[:] = known  # ours was for reading the order only
        batch_sampler = getattr(dl, "batch_sampler", None)
        if batch_sampler is None:
            return None
        inner = getattr(batch_sampler, "batch_sampler", batch_sampler)
        sampler = getattr(inner, "sampler", None)
        repeats = getattr(sampler, "mini_repeat_count", 1) * getattr(sampler, "repeat_count", 1)
        order: list[int] = []
        batch_size = 1
        for batch in batch_sampler:
            order.extend(int(i) for i in batch)
            batch_size = max(batch_size, len(batch))
            if len(order) >= MAX_ORDER:
                return order[:MAX_ORDER], repeats, True, batch_size
    return order, repeats, False, batch_size


def _first_seen(order: Sequence[int]) -> list[int]:
    seen, out = set(), []
    for i in order:
        if i not in seen:
            seen.add(i)
            out.append(i)
    return out


def _rng_fingerprint(trainer) -> str:
    h = hashlib.sha1(torch.get_rng_state().numpy().tobytes())
    if torch.cuda.is_available():
        h.update(torch.cuda.get_rng_state().numpy().tobytes())
    engine_seed = getattr(getattr(trainer, "engine", None), "seed", None)
    return f"{h.hexdigest()}:{engine_seed}"


def _dropout(model) -> float:
    config = getattr(model, "config", None)
    values = [v for k, v in vars(config).items() if "dropout" in k and isinstance(v, float)] if config else []
    return max(values, default=0.0)


def _num_checkpoints(args, dataset_size: int, world_size: int) -> int:
    strategy = str(getattr(args, "save_strategy", "no")).split(".")[-1].lower()
    if strategy == "no":
        return 1  # on_nonfinite=stop still writes one
    if args.save_total_limit:
        return args.save_total_limit + (1 if args.load_best_model_at_end else 0)
    per_step = max(1, args.per_device_train_batch_size * args.gradient_accumulation_steps * world_size)
    steps = args.max_steps if args.max_steps > 0 else math.ceil(args.num_train_epochs * dataset_size / per_step)
    if strategy == "steps":
        every = args.save_steps if args.save_steps >= 1 else max(1, round(args.save_steps * steps))
        return max(1, steps // every)
    return max(1, math.ceil(args.num_train_epochs))


# ----------------------------------------------------------------------------- the entry point


def _skip_loudly(stage: str) -> None:
    banner = "!" * 78
    message = (
        f"{banner}\n!! PREFLIGHT SKIPPED for stage '{stage}' (skip_preflight=true): seeds, masks, data "
        f"order, disk and resume state are NOT checked. Use for debugging only.\n{banner}"
    )
    logger.warning(message)
    print(message, file=sys.stderr, flush=True)


def _run(name: str, fn: Callable[[], str | None]) -> Check:
    try:
        problem = fn()
    except (ValueError, FileNotFoundError) as e:
        problem = " ".join(str(e).split())
    return Check(name, ok=problem is None, message=problem or "")


def _conclude(checks: list[Check], stage: str) -> list[Check]:
    """Gather every rank's failures into one PreflightError; log success; stop here in preflight-only mode."""
    rank, size = world()
    failures = [
        f"[rank {r}] {c.name}: {c.message}" if size > 1 else f"{c.name}: {c.message}"
        for r, rank_checks in enumerate(gather([c for c in checks if not c.ok]))
        for c in rank_checks
    ]
    if failures:
        raise PreflightError(
            f"preflight failed for stage '{stage}' ({len(failures)} check(s)): " + " | ".join(failures)
        )
    if rank == 0:
        logger.info("preflight passed for stage '%s': %s", stage, ", ".join(c.name for c in checks))
    if os.environ.get(PREFLIGHT_ONLY_ENV, "") not in ("", "0"):
        if rank == 0:
            print(
                f"preflight passed for stage '{stage}': {', '.join(c.name for c in checks)} ({size} rank(s))",
                flush=True,
            )
        raise PreflightPassed(0)
    return checks


def preflight(
    trainer,
    script_args=None,
    *,
    stage: str,
    raw_train=None,
    reward_funcs: Sequence[Callable] | None = None,
    chat_template: str | None = None,
) -> list[Check]:
    """Run every check on an HF/TRL trainer before `train()`; raise PreflightError listing the failures.

    Call it on every rank (it gathers). raw_train: the dataset before the trainer's tokenization (conversational
    rows for the mask and round-trip checks); reward_funcs: the stage's rewards (the known-answer check).
    """
    if getattr(script_args, "skip_preflight", False):
        _skip_loudly(stage)
        return []

    args, model = trainer.args, trainer.model
    tokenizer = getattr(trainer, "processing_class", None)
    tokenizer = getattr(tokenizer, "tokenizer", tokenizer)  # a processor wraps its tokenizer
    rank, size = world()
    train = trainer.train_dataset
    raw_rows = _rows(raw_train) or _rows(train)
    num_rows = len(train) if train is not None and hasattr(train, "__len__") else 0
    peft = hasattr(model, "peft_config")
    checks: list[Check] = []

    if args.should_save:
        required = estimate_checkpoint_bytes(model, _num_checkpoints(args, num_rows, size), args.save_only_model, peft)
        checks.append(_run("output_dir", lambda: check_output_dir(args.output_dir, required)))

    def resume():
        path = resume_checkpoint(args)
        return check_checkpoint(path, model) if path else None

    checks.append(_run("resume", resume))
    if tokenizer is not None and hasattr(tokenizer, "decode"):
        checks.append(_run("tokenizer", lambda: check_roundtrip(tokenizer, _texts(raw_rows))))
        checks.append(_run("chat_template", lambda: check_masks(tokenizer, raw_rows, chat_template)))
    checks.append(_run("known_answer", lambda: check_known_answer(reward_funcs, raw_rows)))

    # Collective checks: every rank computes its part, then all see all ranks' values.
    order = None
    try:
        order = _rank_order(trainer) if num_rows else None
    except (ValueError, TypeError) as e:
        checks.append(Check("data_order", ok=False, message=f"the training dataloader cannot be built: {e}"))
    orders = gather(order)
    if order is not None:
        head = _first_seen(order[0])[:512]
        lengths = [_row_length(dict(train[i])) for i in head]
        source_ds = raw_train if raw_train is not None and len(raw_train) == num_rows else train
        col = next((c for c in SOURCE_COLUMNS if c in getattr(source_ds, "column_names", [])), None)
        sources = [source_ds[i][col] for i in head] if col else None
        checks.append(
            _run(
                "data_order",
                lambda: (
                    check_data_order([o[0] for o in orders], num_rows, *order[1:]) or check_shuffled(lengths, sources)
                ),
            )
        )
    digests = gather(weights_digest(model))
    checks.append(_run("weights", lambda: check_same_weights(digests)))
    fingerprints = gather(_rng_fingerprint(trainer))
    samples = stage in SAMPLING_STAGES
    checks.append(_run("seeds", lambda: check_seeds(fingerprints, samples, _dropout(model))))

    return _conclude(checks, stage)


def preflight_pretrain(
    model, tokenizer, *, output_dir: str, num_checkpoints: int, texts: Sequence[str], skip: bool = False
) -> list[Check]:
    """The checks that apply to the pretraining loop (pretrain/train.py), which has no HF Trainer: ranks hold
    identical weights, the tokenizer round-trips the training text, its chat template (when it has one) gives
    non-empty assistant masks, and the output dir takes the checkpoints (a resumed checkpoint has loaded by then).
    Disjoint data across ranks holds by construction there (every rank builds the global batch, keeps its
    slice) and is tested in tests/test_pretrain_ddp.py."""
    if skip:
        _skip_loudly("pretrain")
        return []
    checks = [
        _run("output_dir", lambda: check_output_dir(output_dir, estimate_checkpoint_bytes(model, num_checkpoints)))
    ]
    checks.append(_run("tokenizer", lambda: check_roundtrip(tokenizer, list(texts)[:NUM_EXAMPLES])))
    if getattr(tokenizer, "chat_template", None):
        row = {
            "messages": [
                {"role": "user", "content": "What is 2 + 3?"},
                {"role": "assistant", "content": "The answer is \\boxed{5}."},
            ]
        }
        checks.append(_run("chat_template", lambda: check_masks(tokenizer, [row])))
    digests = gather(weights_digest(model))
    checks.append(_run("weights", lambda: check_same_weights(digests)))
    return _conclude(checks, "pretrain")
