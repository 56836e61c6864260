"""Preflight: cheap checks that run before any long job, so a setup bug costs seconds instead of a run.

Why: the SmolLM3 team lost a 1T-token run to ranks that shared a random seed; users of other frameworks lose runs
to all-zero assistant masks, sorted data, full disks and resumes that cannot load. Every stage's `main()` calls
`preflight(trainer, script_args, stage=...)` after building its trainer and before `trainer.train()`:

    output_dir     writable, with free disk for the checkpoints the recipe will write
                   (params x bytes per param (weights + Adam moments) x checkpoints kept, + the final model)
    resume         the checkpoint a resume would load (align.checkpoint.resume_checkpoint) is complete and readable:
                   trainer state parses, weight names/shapes match the model, optimizer/scheduler/RNG files intact
    tokenizer      decode(encode(text)) == text on the first examples
    chat_template  non-empty assistant/completion masks on the first examples (align.chat, any template)
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
import shutil
import sys
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path

import torch

logger = logging.getLogger(__name__)

PREFLIGHT_ONLY_ENV = "SMOLALIGN_PREFLIGHT_ONLY"
NUM_EXAMPLES = 4  # first examples checked for round-trip, masks and known answers
MAX_ORDER = 20_000  # sampler indices per rank read for the order checks
SOURCE_COLUMNS = ("source", "family", "dataset", "task", "origin")
ADAM_BYTES_PER_PARAM = 8  # two fp32 moments per trainable parameter
DISK_MARGIN = 1.1
SAMPLING_STAGES = ("grpo", "online_dpo", "distill", "gkd")
ACCURACY_REWARDS = ("math_reward", "exact_match_reward")


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


# ----------------------------------------------------------------------------- pure checks (tested with tables)


def weights_digest(model: torch.nn.Module) -> str:
    """sha256 of every parameter's name and bytes ("partitioned" under ZeRO-3, where ranks hold different shards)."""
    h = hashlib.sha256()
    for name, p in sorted(model.named_parameters(), key=lambda kv: kv[0]):
        if hasattr(p, "ds_numel"):
            return "partitioned"
        h.update(name.encode())
        h.update(p.detach().cpu().contiguous().view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def check_same_weights(digests: Sequence[str]) -> str | None:
    if "partitioned" in digests or len(set(digests)) <= 1:
        return None
    differ = [r for r, d in enumerate(digests) if d != digests[0]]
    return (
        f"ranks {differ} start from different weights than rank 0 (parameter hashes differ): build the model after "
        "the same set_seed(seed) on every rank, or load it from one checkpoint"
    )


def check_seeds(fingerprints: Sequence[str], samples: bool, dropout: float) -> str | None:
    """Sampling stages and models with dropout need different RNG streams per rank (init agreement: weights)."""
    if len(fingerprints) < 2 or len(set(fingerprints)) == len(fingerprints):
        return None
    if samples:
        why = "the completions sampled for the same prompt would be identical on every rank"
    elif dropout > 0:
        why = f"dropout ({dropout}) would drop the same units on every rank"
    else:
        return None
    same = [r for r, f in enumerate(fingerprints) if fingerprints.count(f) > 1]
    return f"ranks {same} share one RNG state: {why}; seed sampling/dropout per rank (seed + process_index)"


def spearman(xs: Sequence[float], ys: Sequence[float]) -> float:
    """Spearman rank correlation (average ranks for ties); 0.0 when either side is constant."""

    def ranks(v):
        order = sorted(range(len(v)), key=lambda i: v[i])
        r = [0.0] * len(v)
        i = 0
        while i < len(order):
            j = i
            while j + 1 < len(order) and v[order[j + 1]] == v[order[i]]:
                j += 1
            for k in range(i, j + 1):
                r[order[k]] = (i + j) / 2
            i = j + 1
        return r

    rx, ry = ranks(xs), ranks(ys)
    mx, my = sum(rx) / len(rx), sum(ry) / len(ry)
    cov = sum((a - mx) * (b - my) for a, b in zip(rx, ry))
    vx, vy = sum((a - mx) ** 2 for a in rx), sum((b - my) ** 2 for b in ry)
    return cov / math.sqrt(vx * vy) if vx and vy else 0.0


def check_data_order(
    orders: Sequence[Sequence[int]],
    dataset_size: int,
    multiplicity: int = 1,
    capped: bool = False,
    batch_size: int = 1,
) -> str | None:
    """One epoch of sampler indices per rank: no index more than `multiplicity` times over all ranks (beyond the
    wrap-around padding, under one global batch, that evens out the last batches), i.e. ranks read disjoint
    shards and nothing repeats."""
    counts = Counter(i for order in orders for i in order)
    extra = sum(c - multiplicity for c in counts.values() if c > multiplicity)
    overflow = max(0, sum(map(len, orders)) - dataset_size * multiplicity)
    padding = 0 if capped else min(overflow, len(orders) * batch_size * multiplicity)
    if extra <= padding:
        return None
    index, times = counts.most_common(1)[0]
    readers = [r for r, order in enumerate(orders) if index in order]
    if len(orders) > 1 and len(readers) > 1:
        shared = len(set(orders[0]) & set(orders[readers[1]]))
        return (
            f"ranks {readers} read the same rows ({shared} sample indices in common, e.g. index {index} {times} "
            "times in one epoch): each rank needs its own shard; let the Trainer/accelerate build the dataloader "
            "(no per-rank DataLoader, no sampler without the rank)"
        )
    return (
        f"sample index {index} is read {times} times in one epoch ({extra} repeated reads): the sampler repeats "
        "rows; use the default random sampler (or deduplicate the dataset's indices)"
    )


def check_shuffled(lengths: Sequence[float], sources: Sequence | None = None) -> str | None:
    """The order one rank trains in must not follow length or source (needs >= 20 rows to judge)."""
    n = len(lengths)
    if n < 20:
        return None
    rho = spearman(list(range(n)), lengths)
    if abs(rho) > max(0.3, 4 / math.sqrt(n - 1)):
        return (
            f"the training order is sorted by length (Spearman rho={rho:.2f} between position and length over the "
            f"first {n} rows): shuffle the data (train_sampling_strategy: random, not sequential on sorted data)"
        )
    if sources and len(set(sources)) > 1:
        shares = Counter(sources)
        expected = sum((c / n) ** 2 for c in shares.values())  # P(two neighbours share a source) if shuffled
        same = sum(a == b for a, b in zip(sources, sources[1:])) / (n - 1)
        if same > expected + 0.5 * (1 - expected):
            return (
                f"the training order is grouped by source ({same:.0%} of neighbouring rows share a source vs "
                f"{expected:.0%} if shuffled, over the first {n} rows): shuffle the data or the mixture"
            )
    return None


def estimate_checkpoint_bytes(
    model: torch.nn.Module, num_checkpoints: int, save_only_model: bool = False, peft: bool = False
) -> int:
    """Disk the run will write: num_checkpoints x (saved weights + Adam moments) + the final model, + 10%."""
    params = list(model.parameters())
    all_bytes = sum(p.numel() * p.element_size() for p in params)
    trainable = [p for p in params if p.requires_grad]
    saved = sum(p.numel() * p.element_size() for p in trainable) if peft else all_bytes
    optimizer = 0 if save_only_model else sum(p.numel() for p in trainable) * ADAM_BYTES_PER_PARAM
    return int(DISK_MARGIN * (num_checkpoints * (saved + optimizer) + all_bytes))


def check_output_dir(output_dir: str, required_bytes: int) -> str | None:
    """Writable (a file can be created where the run will write) with `required_bytes` free."""
    path = Path(output_dir).expanduser().absolute()
    if path.exists() and not path.is_dir():
        return f"output_dir {output_dir!r} exists and is a file: point output_dir at a directory"
    existing = path
    while not existing.exists():
        existing = existing.parent
    if not existing.is_dir():
        return f"output_dir {output_dir!r} cannot be created: {existing} is a file"
    try:
        fd, probe = tempfile.mkstemp(prefix=".preflight-", dir=existing)
        os.close(fd)
        os.unlink(probe)
    except OSError as e:
        return f"output_dir {output_dir!r} is not writable ({existing}: {e.strerror}): choose a writable directory"
    free = shutil.disk_usage(existing).free
    if free < required_bytes:
        gib = 1024**3
        return (
            f"output_dir {output_dir!r}: the run needs ~{required_bytes / gib:.2f} GiB (checkpoints x (weights + "
            f"optimizer) + final model) but {free / gib:.2f} GiB are free on {existing}: lower save_total_limit, "
            "set save_only_model, or use a bigger disk"
        )
    return None


def _zip_ok(path: Path) -> bool:
    try:
        with zipfile.ZipFile(path) as zf:
            return zf.testzip() is None
    except (zipfile.BadZipFile, OSError):
        return False


def check_checkpoint(path: str, model: torch.nn.Module | None) -> str | None:
    """The files a resume loads parse, and the saved weights fit the model (names and shapes)."""
    import json

    p = Path(path)
    try:
        state = json.loads((p / "trainer_state.json").read_text())
        int(state["global_step"])
    except (OSError, ValueError, KeyError) as e:
        return f"checkpoint {path}: trainer_state.json is unreadable ({e}); delete the checkpoint or resume: 'no'"
    weight_files = sorted(p.glob("*.safetensors"))
    if not weight_files and not any(p.glob("global_step*")) and not any(p.glob("*.bin")):
        return f"checkpoint {path} has no model weights (*.safetensors); delete it or set resume_from_checkpoint: no"
    if weight_files and model is not None:
        from safetensors import safe_open

        expected = {k: tuple(v.shape) for k, v in model.state_dict().items()}
        expected.update({k.removeprefix("base_model.model."): s for k, s in list(expected.items())})
        for f in weight_files:
            try:
                with safe_open(str(f), framework="pt") as sf:
                    for key in sf.keys():
                        shape = tuple(sf.get_slice(key).get_shape())
                        if key in expected and expected[key] != shape:
                            return (
                                f"checkpoint {path}: weight {key} has shape {shape} but the model's is "
                                f"{expected[key]}: the checkpoint belongs to another model; use another output_dir"
                            )
            except Exception as e:  # noqa: BLE001 - a torn file raises many kinds of errors
                return f"checkpoint {path}: {f.name} is unreadable ({type(e).__name__}: {e}); delete the checkpoint"
    for name in ("optimizer.pt", "scheduler.pt", "scaler.pt", *(x.name for x in p.glob("rng_state*.pth"))):
        if (p / name).exists() and not _zip_ok(p / name):
            return f"checkpoint {path}: {name} is corrupt (bad zip archive); delete the checkpoint or resume: 'no'"
    return None


def check_roundtrip(tokenizer, texts: Sequence[str]) -> str | None:
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"]
        back = tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        if back != text and " ".join(back.split()) != " ".join(text.split()):
            unk = getattr(tokenizer, "unk_token_id", None)
            hint = " (it maps characters to the unknown token)" if unk is not None and unk in ids else ""
            return (
                f"tokenizer {getattr(tokenizer, 'name_or_path', '')!r} does not round-trip {text[:60]!r} -> "
                f"{back[:60]!r}{hint}: use a tokenizer that covers the data (byte-level BPE) or clean the data"
            )
    return None


def _is_conversation(value) -> bool:
    return isinstance(value, list) and bool(value) and all(isinstance(m, dict) and "role" in m for m in value)


def check_masks(tokenizer, rows: Sequence[dict], chat_template: str | None = None) -> str | None:
    """Assistant/completion masks of the first rows are non-empty (raw conversational rows) / rendered prompts."""
    from align.chat import assistant_masks, completion_mask, render

    for i, row in enumerate(rows):
        kw = dict(row.get("chat_template_kwargs") or {})
        try:
            if _is_conversation(row.get("messages")):
                assistant_masks(tokenizer, row["messages"], chat_template=chat_template, example_index=i, **kw)
            elif _is_conversation(row.get("prompt")):
                target = next((row[k] for k in ("completion", "chosen") if _is_conversation(row.get(k))), None)
                if target is not None:
                    completion_mask(tokenizer, row["prompt"], target, chat_template=chat_template,
                                    example_index=i, **kw)
                elif not render(tokenizer, row["prompt"], chat_template=chat_template, add_generation_prompt=True,
                                **kw).strip():
                    return f"the chat template renders prompt {i} as empty text: check the template and the data"
            for col in ("assistant_masks", "completion_mask"):  # already tokenized rows (TRL's own masks)
                if col in row and row[col] is not None and not any(row[col]):
                    return f"example {i}: '{col}' is all zeros, nothing would be trained: check roles and template"
        except ValueError as e:
            return " ".join(str(e).split())
        except Exception as e:  # noqa: BLE001 - a template error (jinja) is a user error here
            return f"the chat template fails on example {i}: {type(e).__name__}: {e}"
    return None


def gold_completion(answer: str) -> str:
    """The tiny world's no_think assistant target for a gold answer."""
    return f"The answer is \\boxed{{{answer}}}."


def check_known_answer(reward_funcs: Sequence[Callable] | None, rows: Sequence[dict]) -> str | None:
    """Gold answers score 1.0 and a wrong answer below 1 with the accuracy reward; every reward runs cleanly."""
    from rewards import REWARDS, checked

    rows = [r for r in rows if r.get("answer") not in (None, "")]
    if not reward_funcs:
        keys = {r.get("reward") for r in rows if r.get("reward") in REWARDS} or {"math_reward"}
        reward_funcs = [REWARDS[k] for k in sorted(keys)]
        if not rows:
            rows = [{"answer": "3/4"}]
    if not rows:
        return None
    n = len(rows)
    columns = {k: [r.get(k) for r in rows] for k in rows[0] if k not in ("completion", "chosen", "rejected")}
    columns.setdefault("prompts", columns.pop("prompt", [None] * n))
    gold = [gold_completion(r["answer"]) for r in rows]
    wrong = [gold_completion(f"{r['answer']}7") for r in rows]
    for func in reward_funcs:
        name = getattr(func, "__name__", type(func).__name__)
        try:
            scores = checked(func)(gold, **columns)
            accuracy = name in ACCURACY_REWARDS or any(r.get("reward") == name for r in rows)
            if accuracy:
                if any(s != 1.0 for s in scores):
                    bad = next(i for i, s in enumerate(scores) if s != 1.0)
                    return (
                        f"reward {name!r} scores the gold answer {rows[bad]['answer']!r} as {scores[bad]} (expected "
                        f"1.0) on {gold[bad]!r}: the reward or the data's answer column is broken"
                    )
                low = checked(func)(wrong, **columns)
                if all(s == 1.0 for s in low):
                    return f"reward {name!r} gives 1.0 to wrong answers too ({wrong[0]!r}): it cannot tell right from wrong"
        except Exception as e:  # noqa: BLE001 - the checked wrapper already names the reward and the example
            return f"{type(e).__name__}: {' '.join(str(e).split())}"
    return None


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
    message = (f"{banner}\n!! PREFLIGHT SKIPPED for stage '{stage}' (skip_preflight=true): seeds, masks, data "
               f"order, disk and resume state are NOT checked. Use for debugging only.\n{banner}")
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
    failures = [f"[rank {r}] {c.name}: {c.message}" if size > 1 else f"{c.name}: {c.message}"
                for r, rank_checks in enumerate(gather([c for c in checks if not c.ok])) for c in rank_checks]
    if failures:
        raise PreflightError(f"preflight failed for stage '{stage}' ({len(failures)} check(s)): " + " | ".join(failures))
    if rank == 0:
        logger.info("preflight passed for stage '%s': %s", stage, ", ".join(c.name for c in checks))
    if os.environ.get(PREFLIGHT_ONLY_ENV, "") not in ("", "0"):
        if rank == 0:
            print(f"preflight passed for stage '{stage}': {', '.join(c.name for c in checks)} ({size} rank(s))",
                  flush=True)
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
    from align.checkpoint import resume_checkpoint

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
        checks.append(_run("data_order", lambda: check_data_order([o[0] for o in orders], num_rows, *order[1:])
                           or check_shuffled(lengths, sources)))
    digests = gather(weights_digest(model))
    checks.append(_run("weights", lambda: check_same_weights(digests)))
    fingerprints = gather(_rng_fingerprint(trainer))
    samples = stage in SAMPLING_STAGES
    checks.append(_run("seeds", lambda: check_seeds(fingerprints, samples, _dropout(model))))

    return _conclude(checks, stage)


def preflight_pretrain(model, tokenizer, *, output_dir: str, num_checkpoints: int, texts: Sequence[str],
                       skip: bool = False) -> list[Check]:
    """The checks that apply to the pretraining loop (pretrain/train.py), which has no HF Trainer: ranks hold
    identical weights, the tokenizer round-trips the training text, its chat template (when it has one) gives
    non-empty assistant masks, and the output dir takes the checkpoints (a resumed checkpoint has loaded by then).
    Disjoint data across ranks holds by construction there (every rank builds the global batch, keeps its
    slice) and is tested in tests/test_pretrain_ddp.py."""
    if skip:
        _skip_loudly("pretrain")
        return []
    checks = [_run("output_dir", lambda: check_output_dir(output_dir, estimate_checkpoint_bytes(model, num_checkpoints)))]
    checks.append(_run("tokenizer", lambda: check_roundtrip(tokenizer, list(texts)[:NUM_EXAMPLES])))
    if getattr(tokenizer, "chat_template", None):
        row = {"messages": [{"role": "user", "content": "What is 2 + 3?"},
                            {"role": "assistant", "content": "The answer is \\boxed{5}."}]}
        checks.append(_run("chat_template", lambda: check_masks(tokenizer, [row])))
    digests = gather(weights_digest(model))
    checks.append(_run("weights", lambda: check_same_weights(digests)))
    return _conclude(checks, "pretrain")
