"""The resumable side of pair generation (data_gen/preferences.py): work goes batch by batch into
`output_dir/.work/` (pairs, then a progress line naming the batch's prompt ids), one pair of files per rank; a rerun
skips finished batches and drops pairs of an unfinished one; the ranks' pairs are merged back in prompt order."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import time
from pathlib import Path

from align.runtime.checkpoint import PREEMPTED_EXIT_CODE, SigtermFlag
from align.runtime.distributed import barrier, rank_seed, shard, world

logger = logging.getLogger(__name__)


def row_id(row: dict) -> str:
    if row.get("id") is not None:
        return str(row["id"])
    return hashlib.sha256(json.dumps(row["prompt"], sort_keys=True).encode()).hexdigest()[:16]


def _read_jsonl(path: Path) -> list[dict]:
    if not path.exists():
        return []
    out = []
    for line in path.read_text().splitlines():
        try:
            out.append(json.loads(line))
        except json.JSONDecodeError:  # a line cut by an interruption: its batch is redone
            break
    return out


def _append(path: Path, rows: list[dict]) -> None:
    with open(path, "a") as f:
        f.write("".join(json.dumps(r) + "\n" for r in rows))
        f.flush()
        os.fsync(f.fileno())


def _work_files(work: Path, split: str, rank: int, size: int) -> tuple[Path, Path]:
    """This rank's pairs and progress files (one pair of files per rank under `accelerate launch`)."""
    tag = split if size == 1 else f"{split}.rank{rank}-of-{size}"
    return work / f"{tag}.pairs.jsonl", work / f"{tag}.progress.jsonl"


def _merged(work: Path, split: str, size: int, kind: str) -> list[dict]:
    """Every rank's pairs (kind 0) or progress lines (kind 1) of a split."""
    return [r for rank in range(size) for r in _read_jsonl(_work_files(work, split, rank, size)[kind])]


def generate_split(split: str, rows: list[dict], make_batch, cfg) -> dict:
    """Pairs for one split, batch by batch into output_dir/.work; finished batches are skipped on rerun.

    Under `accelerate launch --num_processes N` each rank makes the pairs of every N-th row into files of its own
    (sampling seeded per rank); every rank returns the counts over all ranks. Resume needs the same N."""
    from tqdm.auto import tqdm

    rank, size = world()
    work = Path(cfg.output_dir) / ".work"
    work.mkdir(parents=True, exist_ok=True)
    pairs_path, progress_path = _work_files(work, split, rank, size)
    progress = _read_jsonl(progress_path)
    done = {i for p in progress for i in p["ids"]}
    # pairs written by a batch whose progress line never landed are dropped; that batch runs again
    pairs = [p for p in _read_jsonl(pairs_path) if p["id"] in done]
    pairs_path.write_text("".join(json.dumps(p) + "\n" for p in pairs))
    progress_path.write_text("".join(json.dumps(p) + "\n" for p in progress))
    mine = shard(rows, rank, size)
    batches = [mine[i : i + cfg.batch_size] for i in range(0, len(mine), cfg.batch_size)]
    max_pairs = None if cfg.max_pairs is None else -(-cfg.max_pairs // size)  # each rank its share of the cap
    bar = tqdm(total=len(batches), desc=f"pairs/{split}", unit="batch", initial=len(progress), disable=rank != 0)
    # preemption: finish the batch in hand (its pairs and progress line land), then exit PREEMPTED_EXIT_CODE; each
    # rank on its own (ranks may hold different numbers of batches left, so no collective here)
    sigterm = SigtermFlag("finishing this batch, then stopping (re-run the same command to resume)").install()
    try:
        _generate_batches(batches, done, pairs, pairs_path, progress_path, make_batch, cfg, max_pairs, bar, sigterm)
    finally:
        sigterm.restore()
    bar.close()
    barrier()  # every rank's files are complete before anyone counts or exports them
    totals: dict[str, float] = {}
    lines = _merged(work, split, size, 1)
    for p in lines:
        for key, v in p["counts"].items():
            totals[key] = totals.get(key, 0) + v
        totals["seconds"] = totals.get("seconds", 0.0) + p["seconds"]
    totals["batches_resumed"] = len(progress)
    return totals


def _generate_batches(
    batches, done, pairs, pairs_path, progress_path, make_batch, cfg, max_pairs, bar, sigterm
) -> None:
    rank, size = world()
    start = time.perf_counter()
    for k, batch in enumerate(batches):
        if max_pairs is not None and len(pairs) >= max_pairs:
            break
        ids = [row_id(r) for r in batch]
        if all(i in done for i in ids):
            continue
        new, counts = make_batch(batch, cfg.seed + k if size == 1 else rank_seed(cfg.seed, k, rank=rank))
        if max_pairs is not None:
            counts["over_max_pairs"] = max(0, len(pairs) + len(new) - max_pairs)
            new = new[: max_pairs - len(pairs)]
        counts["kept"] = len(new)
        _append(pairs_path, new)
        _append(progress_path, [{"batch": k, "ids": ids, "counts": counts, "seconds": time.perf_counter() - start}])
        start = time.perf_counter()
        pairs += new
        bar.update(1)
        bar.set_postfix(kept=len(pairs))
        if sigterm.requested and k < len(batches) - 1:
            logger.warning(
                "stopped by SIGTERM after batch %d of %d; re-run the same command to resume", k + 1, len(batches)
            )
            raise SystemExit(PREEMPTED_EXIT_CODE)


def _export(cfg, data: dict[str, list[dict]]) -> dict[str, str]:
    import datasets

    out, work = Path(cfg.output_dir), Path(cfg.output_dir) / ".work"
    size, splits = world()[1], list(data)
    files = {}
    for s in splits:  # the ranks' pairs back in the prompts' order
        order = {row_id(r): i for i, r in enumerate(data[s])}
        files[s] = sorted(_merged(work, s, size, 0), key=lambda p: order.get(p["id"], len(order)))[: cfg.max_pairs]
    if cfg.output_format == "jsonl":
        for s, rows in files.items():
            (out / f"{s}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
        return {s: str(out / f"{s}.jsonl") for s in splits}
    if cfg.output_format == "parquet":
        for s, rows in files.items():
            datasets.Dataset.from_list(rows).to_parquet(str(out / f"{s}.parquet"))
        return {s: str(out / f"{s}.parquet") for s in splits}
    datasets.DatasetDict({s: datasets.Dataset.from_list(rows) for s, rows in files.items()}).save_to_disk(str(out))
    return {s: str(out) for s in splits}
