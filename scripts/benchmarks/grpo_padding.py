"""GRPO's loss pass, padding-free (`padding_free: true`, align/grpo/packing.py) vs TRL's padded pass, tokens per
second.

    python scripts/benchmark.py grpo_padding [--quick]

SmolLM2-135M-Instruct (fp32), a GRPO micro-batch of 8 sequences: prompts of 48-96 tokens (left-padded), completions
of uniform 16-512 tokens (right-padded; `--quick`: 16-256), as TRL lays them out. One pass = the policy's per-token
log-probs and entropies of the completion tokens and the backward of a loss built from them, both sides with the LM
head on the completion tokens only (what our trainer runs).
- padded (TRL): `trl.GRPOTrainer._get_per_token_logps_and_entropies` on the (rows, longest prompt + longest
  completion) batch.
- ours: `align.grpo.packing.packed_logps` under `packed_attention`: one row of the real tokens, per-sequence attention.
Tokens/s counts the real (non-pad) tokens for both; passes alternate, medians compared. The loss of both is
printed and compared (relative difference).
Summary: `grpo_padding: ours/padded tokens-per-s ratio R (target >= 1.3)`.
"""

from __future__ import annotations

import contextlib
import statistics
import time
import types

import torch

from benchmarks.common import alternate, summary_line

TARGET = 1.3


def _batch(vocab: int, longest: int, seed: int = 0):
    g = torch.Generator().manual_seed(seed)
    prompts = torch.randint(48, 97, (8,), generator=g).tolist()
    completions = torch.randint(16, longest + 1, (8,), generator=g).tolist()
    pw, cw = max(prompts), max(completions)
    ids = torch.randint(3, vocab, (8, pw + cw), generator=g)
    mask = torch.zeros_like(ids)
    for b, (p, c) in enumerate(zip(prompts, completions, strict=True)):
        mask[b, pw - p : pw + c] = 1
    return ids.masked_fill(mask == 0, 0), mask, cw


def run(quick: bool = False) -> dict:
    import trl
    from trl.trainer import utils as trl_utils

    from align.grpo.packing import packed_attention, packed_logps
    from align.modeling.lm_head import compact_lm_head
    from align.modeling.loading import load_model, resolve_model_path

    torch.manual_seed(0)
    model = load_model(resolve_model_path("builtin:smollm2-135m-instruct"), dtype="float32")
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    model.train()
    ids, mask, keep = _batch(model.config.vocab_size, 256 if quick else 512)
    scored = mask[:, -keep:].float()
    real = int(mask.sum())
    padded_pass = getattr(
        trl.GRPOTrainer._get_per_token_logps_and_entropies,
        "__wrapped__",
        trl.GRPOTrainer._get_per_token_logps_and_entropies,
    )
    fake = types.SimpleNamespace(accelerator=types.SimpleNamespace(autocast=contextlib.nullcontext))
    losses: dict[str, float] = {}

    def once(name: str) -> float:
        model.zero_grad(set_to_none=True)
        t = time.perf_counter()
        with compact_lm_head():
            if name == "ours":
                with packed_attention(model):
                    logps, ent = packed_logps(model, ids, mask, keep, compute_entropy=True)
                    loss = -(logps * scored).sum() / scored.sum() - 0.01 * (ent * scored).sum() / scored.sum()
                    loss.backward()
            else:
                logps, ent, _ = padded_pass(fake, model, ids, mask, keep, compute_entropy=True)
                loss = -(logps * scored).sum() / scored.sum() - 0.01 * (ent * scored).sum() / scored.sum()
                loss.backward()
        seconds = time.perf_counter() - t
        losses[name] = loss.item()
        return real / seconds

    once("ours"), once("padded")  # warm-up
    results = alternate({"ours": lambda: once("ours"), "padded": lambda: once("padded")}, reps=2 if quick else 4)
    ours, padded = statistics.median(results["ours"]), statistics.median(results["padded"])
    ratio = ours / padded
    rel = abs(losses["ours"] - losses["padded"]) / abs(losses["padded"])
    width = ids.shape[1]
    rows = [
        {"pass": "padded (TRL)", "tokens in the pass": 8 * width, "real tokens": real, "tokens/s": round(padded)},
        {"pass": "padding-free (ours)", "tokens in the pass": real, "real tokens": real, "tokens/s": round(ours)},
    ]
    return {
        "rows": rows,
        "loss_rel_diff": rel,
        "losses": losses,
        "summary": [
            summary_line(
                "grpo_padding",
                "ours/padded",
                "tokens-per-s",
                ratio,
                TARGET,
                [a / b for a, b in zip(results["ours"], results["padded"])],
            )
            + f" [same loss to {rel:.1e}; {real} real of {8 * width} padded tokens]"
        ],
    }
