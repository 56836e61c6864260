"""Answers generated for scoring: one path for greedy or sampled answers, through the shared rollout engine.

`generate_and_score` takes an engine's (or the trainer's `Sampler.generate`) generate function; `model_generate`
wraps a loaded model in the hf engine; `summarize` turns the records into accuracy, lengths and truncation.

Collective contract: `generate_and_score` is called on EVERY rank with ALL the items; each rank does its share
(`align.runtime.distributed.shard`) and every rank gets the whole result back, in item order.

    from align.eval.generation import generate_and_score, greedy_params, summarize
    records = generate_and_score(engine.generate, rows, prompt_ids, greedy_params(128), tokenizer.decode)
    summarize(records)   # {"accuracy", "num", "ci_low", "ci_high", "mean_completion_length", "truncated", ...}
"""

from __future__ import annotations

import math
from collections.abc import Callable, Sequence
from typing import Any

import torch

from align.eval.statistics import accuracy
from align.eval.verification import is_correct, verify
from align.rollout import SamplingParams
from align.rollout.hf import HFEngine
from align.runtime.distributed import gather_shards, shard
from rewards.code import check_code_rows

GenerateFn = Callable[[list[list[int]], Any], list[list[Any]]]


def greedy_params(max_new_tokens: int, stop_token_ids: list[int] | None = None):
    """Greedy decoding with these stops (None: the model's own EOS ids)."""
    return SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=stop_token_ids, seed=0)


def model_generate(model: torch.nn.Module, tokenizer: Any = None, batch_size: int = 64) -> GenerateFn:
    """`generate(prompt_ids, params)` with a loaded model through the shared engine's hf decode loop, for callers that
    hold a model rather than an engine (pretraining's skill check, distillation's teacher). It is not the process's
    cached engine, so nothing a trainer's sampler holds is closed after it; the model's train/eval mode is kept."""
    was_training = model.training
    engine = HFEngine(model, tokenizer=tokenizer, batch_size=batch_size)
    model.train(was_training)
    return engine.generate


def generate_and_score(
    generate: GenerateFn,
    rows: Sequence[dict],
    prompt_ids: Sequence[list[int]],
    params: Any,
    decode: Callable[[list[int]], str],
    *,
    default_verifier: str = "math_reward",
    family_verifiers: dict[str, str] | None = None,
    to_verifier: Callable[[dict, str], str] | None = None,
    collective_generate: bool = False,
    check: bool = True,
) -> list[dict]:
    """Answer each row's prompt with `generate` (an engine's `generate`, or the trainer's sampler as
    `lambda ids, p: sampler.generate(model_wrapped, ids, p)`) and check the answers (`verify`).

    Collective: call on every rank with all the rows; each rank generates and checks its share, and every rank
    returns one record per row, in row order: {"text", "completion_ids", "num_tokens", "finish_reason", "score",
    "correct"}. `decode` turns completion ids into the text that is checked (and returned); `to_verifier(row, text)`
    may rewrite that text for the verifier (e.g. a code answer completed with its function header).
    `collective_generate=True` calls `generate` on a rank that has no rows too (a trainer's sampler takes part in a
    ZeRO-3 gather even then); an engine is called only with prompts. `check=False` only generates (rows without a
    gold answer): every score is None."""
    if len(rows) != len(prompt_ids):
        raise ValueError(f"generate_and_score: {len(prompt_ids)} prompts for {len(rows)} rows")
    if check:  # a code row no solution can be judged by fails before anything is generated
        check_code_rows(rows, default_verifier, "the scored rows")
    if getattr(params, "n", 1) != 1:
        raise ValueError(f"generate_and_score scores one answer per row; got SamplingParams.n={params.n}")
    mine_rows, mine_ids = shard(list(rows)), shard(list(prompt_ids))
    groups = generate(mine_ids, params) if mine_ids or collective_generate else []
    rollouts = [g[0] for g in groups]
    texts = [decode(list(r.completion_ids)) for r in rollouts]
    checked = [to_verifier(row, t) for row, t in zip(mine_rows, texts)] if to_verifier else texts
    scores = verify(checked, mine_rows, default_verifier, family_verifiers) if check else [None] * len(texts)
    mine = [
        {
            "text": t,
            "completion_ids": list(r.completion_ids),
            "num_tokens": len(r.completion_ids),
            "finish_reason": r.finish_reason,
            "score": s,
            "correct": is_correct(s),
        }
        for t, r, s in zip(texts, rollouts, scores)
    ]
    return gather_shards(mine)


def pass_at_k(n: int, c: int, k: int) -> float:
    """Unbiased pass@k from n samples of which c are correct (Chen et al. 2021): 1 - C(n-c, k) / C(n, k).

    >>> pass_at_k(8, 0, 4), pass_at_k(8, 8, 1), round(pass_at_k(8, 2, 4), 4)
    (0.0, 1.0, 0.7857)
    """
    if k > n:
        raise ValueError(f"pass@{k} needs at least {k} samples, got {n}")
    if n - c < k:
        return 1.0
    return 1.0 - math.prod((n - c - i) / (n - i) for i in range(k))


def summarize(records: Sequence[dict], families: Sequence[str | None] | None = None) -> dict:
    """Accuracy with its count and interval, completion lengths and the share cut at the budget, of scored records
    (and the accuracy per family when `families` is given)."""
    lengths = sorted(r["num_tokens"] for r in records)
    num = max(len(records), 1)
    out = {
        **accuracy([float(r["correct"]) for r in records]),
        "mean_completion_length": sum(lengths) / num,
        "median_completion_length": lengths[len(lengths) // 2] if lengths else 0,
        "max_completion_length": lengths[-1] if lengths else 0,
        "truncated": sum(r["finish_reason"] == "length" for r in records) / num,
    }
    if families is not None and any(f is not None for f in families):
        by: dict[str, list[float]] = {}
        for f, r in zip(families, records):
            by.setdefault(str(f), []).append(float(r["correct"]))
        out["by_family"] = {f: sum(v) / len(v) for f, v in sorted(by.items())}
    return out
