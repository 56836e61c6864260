"""Held-out preference accuracy: over the test split's pairs, the share where the implicit reward of chosen beats
rejected, r(y) = log pi(y|x) - log pi_start(y|x) (ties count one half, so the start model scores 0.5).
`logp_accuracy` (pi(chosen) > pi(rejected), reference-free) is reported beside it.
"""

from __future__ import annotations

import torch

from align.eval.multiple_choice import sequence_logprobs
from align.eval.statistics import accuracy
from align.runtime.distributed import full_model


def _render_ids(tokenizer, messages, add_generation_prompt: bool, template_kwargs: dict) -> list[int]:
    text = tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=add_generation_prompt, **template_kwargs
    )
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def pair_token_ids(tokenizer, row: dict) -> tuple[list[int], list[int], list[int]]:
    """(prompt_ids, chosen_ids, rejected_ids) as TRL's DPO tokenizes a pair: chat template for conversational rows,
    plain text + eos otherwise; the completion starts where prompt and prompt+completion tokens diverge."""
    from trl.data_utils import extract_prompt, is_conversational

    if "prompt" not in row:
        row = {**row, **extract_prompt(row)}
    kwargs = dict(row.get("chat_template_kwargs") or {})
    if is_conversational(row):
        prompt = _render_ids(tokenizer, row["prompt"], True, kwargs)
        full = [_render_ids(tokenizer, row["prompt"] + row[k], False, kwargs) for k in ("chosen", "rejected")]
    else:
        eos = tokenizer.eos_token or ""
        prompt = tokenizer(row["prompt"], add_special_tokens=False)["input_ids"]
        full = [
            tokenizer(row["prompt"] + (row[k] if row[k].endswith(eos) else row[k] + eos), add_special_tokens=False)[
                "input_ids"
            ]
            for k in ("chosen", "rejected")
        ]
    n = min(len(prompt), *(next((i for i, (a, b) in enumerate(zip(prompt, f)) if a != b), len(f)) for f in full))
    return prompt[:n], full[0][n:], full[1][n:]


def completion_logps(
    model, sequences: list[tuple[list[int], list[int]]], batch_size: int = 8, collective: bool = False
) -> torch.Tensor:
    """Summed log-prob of each completion given its prompt: (N,) float32
    (`align.eval.multiple_choice.sequence_logprobs`)."""
    scored = sequence_logprobs(model, [(p + c, len(c)) for p, c in sequences], 0, batch_size, collective=collective)
    return torch.tensor([s for s, _ in scored], dtype=torch.float32)


def pair_logps(model, tokenizer, dataset, batch_size: int = 8, accelerator=None) -> tuple[torch.Tensor, torch.Tensor]:
    """(chosen_logps, rejected_logps) of `model` on the paired `dataset`.

    With an `accelerator`, `model` is what the trainer trains (`trainer.model_wrapped`) and the call is collective:
    every rank scores its share of the pairs on whole weights (gathered under ZeRO-3) and gets all the results."""
    ids = [pair_token_ids(tokenizer, row) for row in dataset]
    if accelerator is None:
        return _pair_logps(model, ids, batch_size, collective=False)
    with full_model(model, accelerator) as whole:
        return _pair_logps(whole, ids, batch_size, collective=True)


def _pair_logps(model, ids: list[tuple], batch_size: int, collective: bool) -> tuple[torch.Tensor, torch.Tensor]:
    chosen = completion_logps(model, [(p, c) for p, c, _ in ids], batch_size, collective)
    rejected = completion_logps(model, [(p, r) for p, _, r in ids], batch_size, collective)
    return chosen, rejected


def _share(margin: torch.Tensor) -> list[float]:
    """Per pair: 1 when the margin is positive, 0.5 on a tie, 0 otherwise."""
    return ((margin > 0).float() + 0.5 * (margin == 0).float()).tolist()


def preference_accuracy(
    chosen: torch.Tensor, rejected: torch.Tensor, ref_chosen: torch.Tensor, ref_rejected: torch.Tensor
) -> dict[str, float]:
    """Implicit-reward accuracy against the reference, the reference-free log-prob accuracy, and the mean margin."""
    margin = (chosen - ref_chosen) - (rejected - ref_rejected)
    pref = accuracy(_share(margin), "preference_accuracy")  # the one scorer's share, with its 95% interval
    del pref["num"]  # num_pairs below
    if not len(margin):
        pref["preference_accuracy"] = float("nan")
    return {
        **pref,
        "logp_accuracy": accuracy(_share(chosen - rejected))["accuracy"] if len(margin) else float("nan"),
        "mean_margin": float(margin.mean()) if len(margin) else float("nan"),
        "num_pairs": len(margin),
    }
