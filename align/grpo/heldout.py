"""GRPO's held-out accuracy: greedy answers to the held-out split's prompts (builtin:tasks: its validation split),
before and after training, with every row's outcome (`correct`, `items`, `families`) for the paired test.
"""

from __future__ import annotations

import json

from align.eval.generation import generate_and_score, summarize
from align.eval.outcomes import item_id
from align.grpo.prompts import row_mode
from rewards import mode_format_reward


def heldout_accuracy(
    generate,
    tokenizer,
    dataset,
    params,
    default_reward: str,
    template_kwargs: dict | None = None,
    chat_template: str | None = None,
) -> dict:
    """Greedy accuracy on held-out rows, from the one scorer (`align.eval.statistics`): each row checked by the
    verifier its `reward` column names (else `default_reward`), correct at a score >= 1, with its 95% interval.

    `generate(prompt_ids, params) -> [[Rollout]]` is the trainer's sampler (or an engine's `generate`). Collective:
    call it on every rank; each rank generates and scores its share of the rows, and every rank returns the report over
    all of them."""
    rows = [dict(r) for r in dataset]
    prompts = [
        tokenizer.apply_chat_template(
            r["prompt"],
            add_generation_prompt=True,
            tokenize=False,
            chat_template=chat_template,
            **(template_kwargs or {}),
        )
        for r in rows
    ]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    records = generate_and_score(
        generate,
        rows,
        ids,
        params,
        lambda c: tokenizer.decode(c, skip_special_tokens=True),
        default_verifier=default_reward,
        collective_generate=True,
    )
    families = [r.get("family") for r in rows] if "family" in dataset.column_names else None
    summary = summarize(records, families)  # task rows: which families moved
    modes = [row_mode(r) for r in rows]
    report = {
        "accuracy": summary["accuracy"],
        "num_prompts": summary["num"],
        "ci_low": summary["ci_low"],
        "ci_high": summary["ci_high"],
        "mean_completion_length": summary["mean_completion_length"],
        "sample": [r["text"] for r in records][:3],
        "correct": [int(r["correct"]) for r in records],  # per row, in row order: a paired before/after test
        "items": [item_id(json.dumps(r["prompt"], sort_keys=True, default=str)) for r in rows],
    }
    if families is not None:
        report["families"] = families
    if "by_family" in summary:
        report["by_family"] = summary["by_family"]
    if any(m is not None for m in modes):  # hybrid reasoning: accuracy and format per asked mode
        report["by_mode"] = {}
        for mode in sorted({m for m in modes if m is not None}):
            mine = [rec for rec, m in zip(records, modes) if m == mode]
            fmt = mode_format_reward([rec["text"] for rec in mine], mode=[mode] * len(mine))
            report["by_mode"][mode] = {
                "accuracy": sum(rec["correct"] for rec in mine) / len(mine),
                "num": len(mine),
                "format": sum(fmt) / len(fmt),
            }
    return report
