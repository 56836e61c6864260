r"""The one scorer: what "correct" means, how an accuracy and its uncertainty are reported, how a model's answers are
generated for scoring, and how sequences and multiple-choice options are scored by log-likelihood.

Why one module: accuracy once had five implementations with three definitions (mean score, score >= 1, score > 0)
and two summed-log-prob functions. Now every accuracy in the codebase comes from here: pretraining's skill check,
SFT's and GRPO's held-out evaluations, distillation's, the eval suites (`align/evaluate.py`) and the report.

- **Correct** (`verify`, `correct`): each row is checked by the verifier its own ``reward`` column names
  (``rewards.verifier_reward``: the row's ``reward``, else its family's, else the default), and it is correct when
  that verifier scores it ``>= CORRECT_AT`` (1.0): a format bonus or partial credit is not a correct answer.
- **Accuracy** (`accuracy`): the share correct with its item count and a 95% Wilson interval, so a reader can
  tell 2 items in 48 from a real change (`overlaps` says when two results are within noise).
- **Before/after on the same items** (`paired_change`): the exact McNemar test on the items that changed, which
  two overlapping intervals under-power (their widths add the noise of items that did not change).
- **Generation** (`generate_and_score`): one path for greedy or sampled answers, through the shared rollout engine
  (an engine's or the trainer's `Sampler.generate`; `model_generate` wraps a loaded model in the hf engine).
- **Log-likelihood** (`sequence_logprobs`): the summed log-prob of the last n tokens of each sequence; preference
  log-probs, multiple-choice options and held-out loss all use it. `pair_ids` tokenizes (context, continuation)
  as lighteval does, so our option scores are the standard harness's.
- **Multiple choice** (`mc_picks`, `shuffle_choices`, `chance`): cloze (`cf`: the option text, normalised per
  character or not, lighteval's `LogProbCharNorm`) and letter (`mcf`: " A"/" B"/... after the listed options)
  picks; options shuffled under a seed (and the order recorded), the chance level beside every result.

Collective contract: a function here that generates or runs forward passes (`generate_and_score`, `mc_picks`,
`sequence_logprobs(..., collective=True)`) is called on EVERY rank with ALL the items; each rank does its share
(`align.distributed.shard`) and every rank gets the whole result back, in item order.

    from align.scoring import accuracy, generate_and_score, greedy_params, summarize
    records = generate_and_score(engine.generate, rows, prompt_ids, greedy_params(128), tokenizer.decode)
    summarize(records)   # {"accuracy", "num", "ci_low", "ci_high", "mean_completion_length", "truncated", ...}
"""

from __future__ import annotations

import math
import random
from collections.abc import Callable, Sequence
from typing import Any

import torch

from align.distributed import gather_shards, shard
from align.rollout import SamplingParams
from align.rollout.hf import HFEngine
from rewards import verifier_reward
from rewards.code import check_code_rows

CORRECT_AT = 1.0  # a verifier score at or above this is a correct answer
Z_95 = 1.959963984540054  # two-sided 95% normal quantile
LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"
# Row keys that are never verifier arguments (TRL passes the prompt and completion itself).
_NOT_COLUMNS = frozenset({"prompt", "completion", "completions"})

GenerateFn = Callable[[list[list[int]], Any], list[list[Any]]]


# ------------------------------------------------------------------------------------------------ correct


def is_correct(score: float | None) -> bool:
    """A verifier's score means a correct answer (None, an abstention, is not)."""
    return score is not None and score >= CORRECT_AT


def verify(completions: Sequence[str], rows: Sequence[dict], default_verifier: str = "math_reward",
           family_verifiers: dict[str, str] | None = None) -> list[float | None]:
    """Each completion scored by the verifier its row names (`rewards.verifier_reward`), with the row's columns."""
    if len(completions) != len(rows):
        raise ValueError(f"verify: {len(completions)} completions for {len(rows)} rows")
    if not rows:
        return []
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in _NOT_COLUMNS]
    columns = {k: [r.get(k) for r in rows] for k in keys}
    return verifier_reward(list(completions), default_verifier=default_verifier, family_verifiers=family_verifiers,
                           **columns)


def correct(completions: Sequence[str], rows: Sequence[dict], default_verifier: str = "math_reward",
            family_verifiers: dict[str, str] | None = None) -> list[bool]:
    """Whether each completion answers its row correctly (see the module doc)."""
    return [is_correct(s) for s in verify(completions, rows, default_verifier, family_verifiers)]


# ------------------------------------------------------------------------------------------- uncertainty


def wilson_interval(successes: float, num: int, z: float = Z_95) -> tuple[float, float]:
    """The Wilson score interval of a share `successes / num` (95% by default); (0, 1) without items.

    >>> [round(x, 3) for x in wilson_interval(24, 48)]
    [0.364, 0.636]
    """
    if num <= 0:
        return 0.0, 1.0
    p = min(max(successes / num, 0.0), 1.0)
    denom = 1 + z * z / num
    centre = (p + z * z / (2 * num)) / denom
    half = z * math.sqrt(p * (1 - p) / num + z * z / (4 * num * num)) / denom
    low = 0.0 if p == 0.0 else max(0.0, centre - half)  # exact at the ends (no rounding dust)
    high = 1.0 if p == 1.0 else min(1.0, centre + half)
    return low, high


def accuracy(flags: Sequence[float], key: str = "accuracy") -> dict[str, float]:
    """The share of `flags` (1 correct, 0 not; a tie may count 0.5), its item count and 95% Wilson interval."""
    num = len(flags)
    hits = float(sum(flags))
    low, high = wilson_interval(hits, num)
    return {key: hits / num if num else 0.0, "num": num, "ci_low": low, "ci_high": high}


def overlaps(a: tuple[float, float], b: tuple[float, float]) -> bool:
    """Two intervals share a point: the difference between their results is within noise."""
    return a[0] <= b[1] and b[0] <= a[1]


def paired_change(before: Sequence[float], after: Sequence[float], alpha: float = 0.05) -> dict:
    """Did a model get better or worse on the SAME items? The exact (binomial) McNemar test: of the items whose
    outcome changed, `gained` went wrong -> right and `lost` right -> wrong; with no real change either way is a fair
    coin, and `p_value` is the two-sided chance of a split at least this uneven. `significant`: p < `alpha`.

    >>> paired_change([0, 0, 0, 0, 0, 0, 1, 1], [1, 1, 1, 1, 1, 1, 1, 1])
    {'num': 8, 'gained': 6, 'lost': 0, 'p_value': 0.03125, 'significant': True}
    >>> paired_change([1, 0, 1, 0], [0, 1, 1, 0])["p_value"]
    1.0
    """
    if len(before) != len(after):
        raise ValueError(f"paired_change: {len(before)} items before, {len(after)} after: a paired test needs the same items")
    gained = sum(1 for b, a in zip(before, after) if a > b)
    lost = sum(1 for b, a in zip(before, after) if a < b)
    changed = gained + lost
    tail = sum(math.comb(changed, i) for i in range(min(gained, lost) + 1)) / 2**changed
    p_value = min(1.0, 2 * tail)
    return {"num": len(before), "gained": gained, "lost": lost, "p_value": p_value, "significant": p_value < alpha}


def paired_over_seeds(runs: Sequence[tuple[Sequence[float], Sequence[float]]], alpha: float = 0.05) -> dict:
    """A variant against a baseline on the same items, once per seed: `runs` = [(baseline outcomes, variant outcomes)
    for each seed]. Is the variant better over seeds?

    Per seed: the exact McNemar test (`paired_change`) and the accuracy difference d_s = (gained - lost) / n. Over
    seeds, stratified by seed: the difference is the pooled one, (all gained - all lost) / all items (every prompt of
    every seed weighs the same, as Mantel-Haenszel's), and its variance is the paired within-seed variance plus the
    spread of the seeds' differences beyond what their items explain (tau^2, DerSimonian-Laird's moment estimate with
    equal weights) over the number of seeds. Items are never pooled across seeds as if independent (the same prompt
    under three seeds is one prompt, not three), and seeds that disagree widen the interval instead of averaging into
    a confident verdict. With seeds that agree (tau^2 = 0) it is the pooled McNemar test's normal form
    (`pooled_p_value`, the exact one, is reported too). `verdict`: better / worse (p < alpha) or within noise.
    (Inverse-variance weights per seed were tried first: a seed where one or two prompts changed gets a near-zero
    variance and outweighs the others.)
    Simulated nulls (tests/test_ablation.py, 3 seeds x 128 prompts): 4.6% false verdicts when seeds differ only by
    item noise; with a real seed-to-seed spread (each model's logit moved by N(0, 0.3), about +-5 points) 12%,
    where pooling every (prompt, seed) pair as independent gives 21%: more seeds, fewer surprises. A +10-point
    variant (256 prompts, 3 seeds) is called better in 98% of draws."""
    if not runs:
        raise ValueError("paired_over_seeds: no runs")
    per_seed, diffs = [], []
    for before, after in runs:
        change = paired_change(before, after, alpha)
        if change["num"] == 0:
            raise ValueError("paired_over_seeds: a seed with no items")
        diffs.append((change["gained"] - change["lost"]) / change["num"])
        per_seed.append({**change, "difference": diffs[-1]})
    k = len(diffs)
    num = sum(r["num"] for r in per_seed)
    gained, lost = sum(r["gained"] for r in per_seed), sum(r["lost"] for r in per_seed)
    estimate = (gained - lost) / num
    # variance of the pooled paired difference; floored at one discordant pair so nothing-changed is not certainty
    within = max(((gained + lost) / num - estimate**2) / num, 1.0 / num**2)
    spread = sum((d - estimate) ** 2 for d in diffs) / (k - 1) if k > 1 else 0.0
    tau2 = max(0.0, spread - k * within)  # a seed's own variance is k x the pooled one (n = num / k items)
    se = math.sqrt(within + tau2 / k)
    p_value = math.erfc(abs(estimate) / se / math.sqrt(2))
    pooled = paired_change([0] * gained + [1] * lost, [1] * gained + [0] * lost)["p_value"]
    verdict = "within noise" if p_value >= alpha else ("better" if estimate > 0 else "worse")
    return {"difference": estimate, "ci_low": estimate - Z_95 * se, "ci_high": estimate + Z_95 * se,
            "p_value": p_value, "verdict": verdict, "num_seeds": k, "tau": math.sqrt(tau2), "gained": gained,
            "lost": lost, "pooled_p_value": pooled, "per_seed": per_seed}


# Two-sided 95% quantiles of Student's t by degrees of freedom (1..30); beyond 30 the normal's is within 4%.
_T_975 = (12.706, 4.303, 3.182, 2.776, 2.571, 2.447, 2.365, 2.306, 2.262, 2.228, 2.201, 2.179, 2.160, 2.145, 2.131,
          2.120, 2.110, 2.101, 2.093, 2.086, 2.080, 2.074, 2.069, 2.064, 2.060, 2.056, 2.052, 2.048, 2.045, 2.042)


def mean_over_seeds(shares: Sequence[float], nums: Sequence[int]) -> dict:
    """A metric's mean over seeds with a 95% interval: Student's t over the seeds' values (the seed-to-seed spread,
    never narrower than the items' own binomial noise); one seed: its Wilson interval.

    >>> r = mean_over_seeds([0.25, 0.30, 0.35], [256, 256, 256]); round(r["mean"], 3), round(r["ci_high"], 3)
    (0.3, 0.424)
    """
    k = len(shares)
    if k == 0:
        raise ValueError("mean_over_seeds: no values")
    mean = sum(shares) / k
    if k == 1:
        low, high = wilson_interval(mean * nums[0], nums[0])
        return {"mean": mean, "ci_low": low, "ci_high": high, "num_seeds": 1}
    spread = sum((x - mean) ** 2 for x in shares) / (k - 1)
    binomial = sum(x * (1 - x) / max(n, 1) for x, n in zip(shares, nums)) / k
    half = (_T_975[k - 2] if k - 1 <= len(_T_975) else Z_95) * math.sqrt(max(spread, binomial) / k)
    return {"mean": mean, "ci_low": mean - half, "ci_high": mean + half, "num_seeds": k}


# ---------------------------------------------------------------------------------------------- generation


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


def generate_and_score(generate: GenerateFn, rows: Sequence[dict], prompt_ids: Sequence[list[int]], params: Any,
                       decode: Callable[[list[int]], str], *, default_verifier: str = "math_reward",
                       family_verifiers: dict[str, str] | None = None,
                       to_verifier: Callable[[dict, str], str] | None = None,
                       collective_generate: bool = False, check: bool = True) -> list[dict]:
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
    mine = [{"text": t, "completion_ids": list(r.completion_ids), "num_tokens": len(r.completion_ids),
             "finish_reason": r.finish_reason, "score": s, "correct": is_correct(s)}
            for t, r, s in zip(texts, rollouts, scores)]
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
    out = {**accuracy([float(r["correct"]) for r in records]),
           "mean_completion_length": sum(lengths) / num,
           "median_completion_length": lengths[len(lengths) // 2] if lengths else 0,
           "max_completion_length": lengths[-1] if lengths else 0,
           "truncated": sum(r["finish_reason"] == "length" for r in records) / num}
    if families is not None and any(f is not None for f in families):
        by: dict[str, list[float]] = {}
        for f, r in zip(families, records):
            by.setdefault(str(f), []).append(float(r["correct"]))
        out["by_family"] = {f: sum(v) / len(v) for f, v in sorted(by.items())}
    return out


# ------------------------------------------------------------------------------------------ log-likelihood


@torch.no_grad()
def sequence_logprobs(model: torch.nn.Module, seqs: Sequence[tuple[list[int], int]], pad_id: int = 0,
                      batch_size: int = 16, collective: bool = False) -> list[tuple[float, int]]:
    """For each (token ids, n): the sum of the log-probs of the last n tokens given the ones before, and n (the first
    token has no prediction, so n is at most len - 1; sequences longer than the model's context keep their end).

    Batches of similar lengths, right-padded and masked. `collective=True`: every rank passes all the sequences,
    scores its share and gets all the results (see the module doc)."""
    if collective:
        return gather_shards(sequence_logprobs(model, shard(list(seqs)), pad_id, batch_size))
    max_len = getattr(model.config, "max_position_embeddings", 2048)
    device = next(model.parameters()).device
    seqs = [(list(ids)[-max_len:], min(n, len(list(ids)[-max_len:]) - 1)) for ids, n in seqs]
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))  # similar lengths together: little padding
    out: list[tuple[float, int]] = [(0.0, 0)] * len(seqs)
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(seqs), batch_size):
            idx = order[start : start + batch_size]
            chunk = [seqs[i] for i in idx]
            width = max(len(ids) for ids, _ in chunk)
            input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in chunk], device=device)
            mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in chunk], device=device)
            logits = model(input_ids=input_ids, attention_mask=mask).logits.float()  # (B, T, V)
            logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]  # (B, T-1)
            for row, (i, (ids, n)) in enumerate(zip(idx, chunk)):
                # token t is predicted at position t-1: the last n real tokens sit at logps[len-1-n : len-1]
                out[i] = (logps[row, len(ids) - 1 - n : len(ids) - 1].sum().item(), n)
    finally:
        model.train(was_training)
    return out


def pad_id(tokenizer: Any) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def pair_ids(tokenizer: Any, context: str, continuation: str) -> tuple[list[int], list[int]]:
    """(context ids, continuation ids) as lighteval tokenizes a loglikelihood request: trailing whitespace of the
    context moves to the continuation, the context gets the tokenizer's own special tokens (no trailing EOS), the
    continuation is tokenized on its own."""
    spaces = len(context) - len(context.rstrip())
    if spaces:
        context, continuation = context[:-spaces], context[-spaces:] + continuation
    ctx = tokenizer(context, add_special_tokens=True)["input_ids"] if context else []
    if ctx and ctx[-1] == tokenizer.eos_token_id:
        ctx = ctx[:-1]
    cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
    if not cont:
        raise ValueError(f"continuation {continuation!r} has no tokens: a choice cannot be empty")
    return ctx, cont


# ------------------------------------------------------------------------------------------ multiple choice


def shuffle_choices(items: Sequence[dict], rng: random.Random) -> list[dict]:
    """The items with their options shuffled and the gold answer's position balanced: among items with n options the
    gold is dealt positions from a shuffled deck of 0..n-1 (a new deck when it runs out), so it sits at every
    position about equally often and a scorer that always picks one position scores chance whatever the seed; the
    other options are shuffled uniformly. `order[i]` is the source index of the option now at i."""
    decks: dict[int, list[int]] = {}
    out = []
    for item in items:
        n = len(item["choices"])
        deck = decks.setdefault(n, [])
        if not deck:
            deck.extend(range(n))
            rng.shuffle(deck)
        position = deck.pop()
        others = [i for i in range(n) if i != item["label"]]
        rng.shuffle(others)
        order = others[:position] + [item["label"]] + others[position:]
        out.append({**item, "choices": [item["choices"][i] for i in order], "label": position, "order": order})
    return out


def chance(items: Sequence[dict]) -> float:
    """The accuracy of a uniform guess: the mean of 1 / (number of options)."""
    return sum(1 / len(it["choices"]) for it in items) / max(len(items), 1)


def letter_prompt(context: str, choices: Sequence[str]) -> str:
    """The letter (MCF) form: the context, the options as "A. ..." lines, then "Answer:"."""
    lines = [context.strip()] + [f"{LETTERS[i]}. {c.strip()}" for i, c in enumerate(choices)]
    return "\n".join(lines) + "\nAnswer:"


def cloze_pick(logprobs: Sequence[float], continuations: Sequence[str], norm: str | None = "char") -> int:
    """The option with the highest log-likelihood, per character of its continuation text when norm="char"
    (lighteval's LogProbCharNorm, lm-eval's acc_norm), raw when None (TruthfulQA MC1). Ties: the first."""
    scores = [lp / len(c) for lp, c in zip(logprobs, continuations)] if norm == "char" else list(logprobs)
    return max(range(len(scores)), key=scores.__getitem__)


@torch.no_grad()
def _letter_logprobs(model, tokenizer, prompts: list[str], num_choices: list[int], batch_size: int) -> list[list[float]]:
    """log p(" A"), log p(" B"), ... after each prompt: one forward pass per prompt when each letter is one token."""
    letters = [tokenizer(f" {L}", add_special_tokens=False)["input_ids"] for L in LETTERS[: max(num_choices, default=0)]]
    if any(len(t) != 1 for t in letters):  # a tokenizer that splits " A": score each letter as a continuation
        pairs = [pair_ids(tokenizer, p, f" {LETTERS[i]}") for p, n in zip(prompts, num_choices) for i in range(n)]
        seqs = [(ctx + cont, len(cont)) for ctx, cont in pairs]
        flat = [s for s, _ in sequence_logprobs(model, seqs, pad_id(tokenizer), batch_size)]
        out, k = [], 0
        for n in num_choices:
            out.append(flat[k : k + n])
            k += n
        return out
    # each letter is the one token after the prompt: read them all from the last position's distribution
    rows = [pair_ids(tokenizer, p, " A")[0] for p in prompts]
    max_len = getattr(model.config, "max_position_embeddings", 2048)
    rows = [r[-max_len:] for r in rows]
    device = next(model.parameters()).device
    out: list[list[float]] = [[]] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    was_training = model.training
    model.eval()
    try:
        for start in range(0, len(rows), batch_size):
            idx = order[start : start + batch_size]
            width = max(len(rows[i]) for i in idx)
            pad = pad_id(tokenizer)
            ids = torch.tensor([rows[i] + [pad] * (width - len(rows[i])) for i in idx], device=device)
            mask = torch.tensor([[1] * len(rows[i]) + [0] * (width - len(rows[i])) for i in idx], device=device)
            logits = model(input_ids=ids, attention_mask=mask).logits.float()  # (B, T, V)
            for row, i in enumerate(idx):
                logp = torch.log_softmax(logits[row, len(rows[i]) - 1], dim=-1)
                out[i] = [logp[letters[j][0]].item() for j in range(num_choices[i])]
    finally:
        model.train(was_training)
    return out


def option_logprobs(model: torch.nn.Module, tokenizer: Any, items: Sequence[dict],
                    batch_size: int = 16) -> tuple[list[list[float]], list[list[float]]]:
    """Per item: the summed log-likelihood of each option's text after the context (cloze) and of each letter after
    the letter prompt (MCF). Local: the caller's items, no gathering."""
    seqs, sizes = [], []
    for it in items:
        for c in it["choices"]:
            ctx, cont = pair_ids(tokenizer, it["context"], " " + c.strip())
            seqs.append((ctx + cont, len(cont)))
        sizes.append(len(it["choices"]))
    flat = [s for s, _ in sequence_logprobs(model, seqs, pad_id(tokenizer), batch_size)]
    cloze, k = [], 0
    for n in sizes:
        cloze.append(flat[k : k + n])
        k += n
    letters = _letter_logprobs(model, tokenizer, [letter_prompt(it["context"], it["choices"]) for it in items],
                               sizes, batch_size)
    return cloze, letters


def mc_picks(model: torch.nn.Module, tokenizer: Any, items: Sequence[dict], norm: str | None = "char",
             batch_size: int = 16) -> list[dict]:
    """Each item's cloze pick (`cf`, normalised by `norm`) and letter pick (`mcf`), with its label and the option
    log-likelihoods. Collective: every rank passes all items, scores its share and gets every item's pick."""
    mine = shard(list(items))
    cloze, letters = option_logprobs(model, tokenizer, mine, batch_size) if mine else ([], [])
    picks = []
    for it, c, lt in zip(mine, cloze, letters):
        conts = [" " + x.strip() for x in it["choices"]]
        picks.append({"cf": cloze_pick(c, conts, norm), "mcf": max(range(len(lt)), key=lt.__getitem__),
                      "label": it["label"], "cloze_logprobs": c, "letter_logprobs": lt})
    return gather_shards(picks)


def mc_summary(items: Sequence[dict], picks: Sequence[dict]) -> dict:
    """cf and mcf accuracy (each with its count and interval), the chance level, and the picks."""
    return {"cf": accuracy([float(p["cf"] == p["label"]) for p in picks], "cf"),
            "mcf": accuracy([float(p["mcf"] == p["label"]) for p in picks], "mcf"),
            "chance": chance(items), "picks": list(picks)}
