"""Log-likelihood scoring: sequences, and multiple-choice options.

- **Log-likelihood** (`sequence_logprobs`): the summed log-prob of the last n tokens of each sequence; preference
  log-probs, multiple-choice options and held-out loss all use it. `pair_ids` tokenizes (context, continuation)
  as lighteval does, so our option scores are the standard harness's.
- **Multiple choice** (`mc_picks`, `shuffle_choices`, `chance`): cloze (`cf`: the option text, normalised per
  character or not, lighteval's `LogProbCharNorm`) and letter (`mcf`: " A"/" B"/... after the listed options)
  picks; options shuffled under a seed (and the order recorded), the chance level beside every result.

Collective contract: `mc_picks` and `sequence_logprobs(..., collective=True)` are called on EVERY rank with ALL
the items; each rank does its share and every rank gets the whole result back, in item order.
"""

from __future__ import annotations

import random
from collections.abc import Sequence
from typing import Any

import torch

from align.eval.statistics import accuracy
from align.runtime.distributed import gather_shards, shard

LETTERS = "ABCDEFGHIJKLMNOPQRSTUVWXYZ"


@torch.no_grad()
def sequence_logprobs(
    model: torch.nn.Module,
    seqs: Sequence[tuple[list[int], int]],
    pad_id: int = 0,
    batch_size: int = 16,
    collective: bool = False,
) -> list[tuple[float, int]]:
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
def _letter_logprobs(
    model, tokenizer, prompts: list[str], num_choices: list[int], batch_size: int
) -> list[list[float]]:
    """log p(" A"), log p(" B"), ... after each prompt: one forward pass per prompt when each letter is one token."""
    letters = [
        tokenizer(f" {L}", add_special_tokens=False)["input_ids"] for L in LETTERS[: max(num_choices, default=0)]
    ]
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


def option_logprobs(
    model: torch.nn.Module, tokenizer: Any, items: Sequence[dict], batch_size: int = 16
) -> tuple[list[list[float]], list[list[float]]]:
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
    letters = _letter_logprobs(
        model, tokenizer, [letter_prompt(it["context"], it["choices"]) for it in items], sizes, batch_size
    )
    return cloze, letters


def mc_picks(
    model: torch.nn.Module, tokenizer: Any, items: Sequence[dict], norm: str | None = "char", batch_size: int = 16
) -> list[dict]:
    """Each item's cloze pick (`cf`, normalised by `norm`) and letter pick (`mcf`), with its label and the option
    log-likelihoods. Collective: every rank passes all items, scores its share and gets every item's pick."""
    mine = shard(list(items))
    cloze, letters = option_logprobs(model, tokenizer, mine, batch_size) if mine else ([], [])
    picks = []
    for it, c, lt in zip(mine, cloze, letters):
        conts = [" " + x.strip() for x in it["choices"]]
        picks.append(
            {
                "cf": cloze_pick(c, conts, norm),
                "mcf": max(range(len(lt)), key=lt.__getitem__),
                "label": it["label"],
                "cloze_logprobs": c,
                "letter_logprobs": lt,
            }
        )
    return gather_shards(picks)


def mc_summary(items: Sequence[dict], picks: Sequence[dict]) -> dict:
    """cf and mcf accuracy (each with its count and interval), the chance level, and the picks."""
    return {
        "cf": accuracy([float(p["cf"] == p["label"]) for p in picks], "cf"),
        "mcf": accuracy([float(p["mcf"] == p["label"]) for p in picks], "mcf"),
        "chance": chance(items),
        "picks": list(picks),
    }
