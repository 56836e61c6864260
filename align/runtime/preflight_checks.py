"""Preflight's pure checks: each takes plain values (digests, sampler indices, lengths, a path, a tokenizer, rows)
and returns None when fine or one line naming the problem and the fix.

Why a module of its own: these are functions of values, not of a trainer, so the tests drive each with tables of
good and bad inputs; `align/runtime/preflight.py` reads a trainer, gathers the values across ranks and calls them.

    from align.runtime.preflight_checks import check_output_dir, estimate_checkpoint_bytes
    problem = check_output_dir("runs/x", estimate_checkpoint_bytes(model, num_checkpoints=3))
"""

from __future__ import annotations

import hashlib
import math
import os
import shutil
import tempfile
import zipfile
from collections import Counter
from collections.abc import Callable, Sequence
from pathlib import Path

import torch

from align.data.chat import assistant_masks, completion_mask, render
from rewards import REWARDS, checked

ADAM_BYTES_PER_PARAM = 8  # two fp32 moments per trainable parameter
DISK_MARGIN = 1.1
ACCURACY_REWARDS = ("math_reward", "exact_match_reward")


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

        # a ZeRO-3 parameter holds only its shard here (shape (0,)): its full shape is `ds_shape`
        expected = {k: tuple(getattr(v, "ds_shape", v.shape)) for k, v in model.named_parameters()}
        expected.update({k: tuple(v.shape) for k, v in model.named_buffers()})
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
    for i, row in enumerate(rows):
        kw = dict(row.get("chat_template_kwargs") or {})
        try:
            if _is_conversation(row.get("messages")):
                assistant_masks(tokenizer, row["messages"], chat_template=chat_template, example_index=i, **kw)
            elif _is_conversation(row.get("prompt")):
                target = next((row[k] for k in ("completion", "chosen") if _is_conversation(row.get(k))), None)
                if target is not None:
                    completion_mask(
                        tokenizer, row["prompt"], target, chat_template=chat_template, example_index=i, **kw
                    )
                elif not render(
                    tokenizer, row["prompt"], chat_template=chat_template, add_generation_prompt=True, **kw
                ).strip():
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
                    return (
                        f"reward {name!r} gives 1.0 to wrong answers too ({wrong[0]!r}): "
                        "it cannot tell right from wrong"
                    )
        except Exception as e:  # noqa: BLE001 - the checked wrapper already names the reward and the example
            return f"{type(e).__name__}: {' '.join(str(e).split())}"
    return None
