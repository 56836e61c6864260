"""Truncated importance sampling between the engine that sampled and the trainer that learns, without a pass of its own
(and the loss pass's other hooks: the LM head on completion tokens only, `padding_free` passes from
align/grpo/packing.py).

TRL corrects for the engine/trainer mismatch (`vllm_importance_sampling_correction`) with the ratio
pi_trainer(token) / pi_engine(token), and gets pi_trainer from an extra no-grad forward pass over every generation
batch (`old_per_token_logps`), even when generation and optimisation are aligned (`num_iterations` 1 and
`gradient_accumulation_steps` a multiple of `steps_per_generation`): then the weights that pass sees are the weights
the loss pass sees, and its log-probs are the loss pass's own, detached. On the SmolLM2-135M GRPO step that pass
was 18% of the step. When aligned, `align.grpo.trainer.GRPOTrainer` skips it and builds the same ratio here from the
loss pass's detached log-probs (the same numbers: same weights, same autocast); TRL's own pass stays for the
misaligned case, where it is needed.
"""

from __future__ import annotations

import math

import torch

from align.grpo.packing import packed_attention, packed_logps
from align.modeling.lm_head import compact_lm_head


def importance_ratio(
    trainer_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
    clip_min: float | None,
    clip_max: float | None,
) -> torch.Tensor:
    """The capped (truncate) or zeroed (mask) ratio pi_trainer / pi_engine, per token (B, T) or per sequence (B, 1),
    exactly as TRL 1.16 builds it in `_generate_and_score_completions`. A token without an engine log-prob (NaN)
    gets ratio 1."""
    diff = torch.nan_to_num((trainer_logps - sampling_logps) * mask, nan=0.0)
    if mode in ("sequence_mask", "sequence_truncate"):
        diff = diff.sum(dim=-1, keepdim=True)
    ratio = torch.exp(diff)
    if mode in ("sequence_truncate", "token_truncate"):
        return torch.clamp(ratio, min=clip_min, max=clip_max)
    if mode in ("sequence_mask", "token_mask"):
        low = -math.inf if clip_min is None else clip_min
        high = math.inf if clip_max is None else clip_max
        return ratio.masked_fill((ratio < low) | (ratio > high), 0.0)
    raise ValueError(
        f"vllm_importance_sampling_mode {mode!r} is not one of token_truncate, token_mask, "
        "sequence_truncate, sequence_mask"
    )


def log_importance_metrics(
    trainer,
    ratio: torch.Tensor,
    trainer_logps: torch.Tensor,
    sampling_logps: torch.Tensor,
    mask: torch.Tensor,
    mode: str,
) -> None:
    """The metrics TRL logs for the correction (`sampling/sampling_logp_difference/{mean,max}`,
    `sampling/importance_sampling_ratio/{min,mean,max}`), gathered over ranks (every rank calls this)."""
    gather, metrics = trainer.accelerator.gather, trainer._metrics["train" if trainer.model.training else "eval"]
    mask = mask.bool()
    delta = (trainer_logps - sampling_logps).abs()
    delta = delta[mask & ~torch.isnan(delta)]
    zero = torch.zeros((), device=ratio.device)
    metrics["sampling/sampling_logp_difference/mean"].append(
        gather(delta.mean() if delta.numel() else zero).mean().item()
    )
    metrics["sampling/sampling_logp_difference/max"].append(
        gather(delta.max() if delta.numel() else zero).max().item()
    )
    flat = ratio.flatten() if mode.startswith("sequence") else ratio[mask]
    if not flat.numel():
        flat = zero.view(1)
    metrics["sampling/importance_sampling_ratio/min"].append(gather(flat.min()).nan_to_num(math.inf).min().item())
    metrics["sampling/importance_sampling_ratio/mean"].append(gather(flat.mean()).nanmean().item())
    metrics["sampling/importance_sampling_ratio/max"].append(gather(flat.max()).nan_to_num(-math.inf).max().item())


class LossPassImportanceSampling:
    """A part of align.grpo.trainer.GRPOTrainer: when generation and optimisation are aligned, TRL's
    generate-and-score runs without its old-log-prob pass (`_score`), and the ratio is built from the loss pass's own
    log-probs (`expect_importance`, then `loss_pass_logps`), before TRL's loss reads it. The trainer's `_compute_loss`
    and `_get_per_token_logps_and_entropies` call these. `defer_importance_sampling = False` keeps TRL's pass (the
    tests compare both)."""

    defer_importance_sampling = True
    _pending_importance: dict | None = None

    def _importance_in_loss_pass(self) -> bool:
        generate_every = self.args.steps_per_generation * self.num_iterations
        return (
            self.defer_importance_sampling
            and self.use_vllm
            and self.args.vllm_importance_sampling_correction
            and self.args.gradient_accumulation_steps % generate_every == 0
        )

    def _score(self, batch):
        """One round of TRL's generate-and-score; when aligned, without its no-grad pass for the old log-probs."""
        if not self._importance_in_loss_pass():
            return super()._generate_and_score_completions(batch)
        self.vllm_importance_sampling_correction = (
            False  # TRL: no old-logps pass and no ratio; the loss pass builds it
        )
        try:
            return super()._generate_and_score_completions(batch)
        finally:
            self.vllm_importance_sampling_correction = True

    def expect_importance(self, inputs) -> None:
        """Before TRL's loss pass: when the ratio is to come from this pass (aligned generation), remember the batch
        so that the policy's log-prob pass below fills `importance_sampling_ratio` before TRL's loss reads it."""
        if (
            self.use_vllm
            and self.vllm_importance_sampling_correction
            and "importance_sampling_ratio" not in inputs
            and inputs.get("sampling_per_token_logps") is not None
        ):
            self._pending_importance = inputs

    def _padding_free(self, args: tuple, kwargs: dict) -> bool:
        """`padding_free: true` and a text-only batch (images and their fields take TRL's padded path)."""
        extra = {k: v for k, v in kwargs.items() if k not in ("batch_size", "compute_entropy", "compute_aux_loss")}
        return (
            bool(getattr(self.args, "padding_free", False))
            and not args
            and not kwargs.get("compute_aux_loss")
            and all(v is None for v in extra.values())
        )

    def training_step(self, model, inputs, *args, **kwargs):
        if not getattr(self.args, "padding_free", False):
            return super().training_step(model, inputs, *args, **kwargs)
        with packed_attention(self.accelerator.unwrap_model(model)):  # the backward's recomputed forwards too
            return super().training_step(model, inputs, *args, **kwargs)

    def loss_pass_logps(self, trl_logps, model, input_ids, attention_mask, logits_to_keep, args, kwargs):
        """The policy's per-token log-probs (and entropies): TRL's pass (`trl_logps`) or, with `padding_free`, one
        row of real tokens per chunk of rows, with the LM head on the completion tokens only; then, when expected
        (`expect_importance`), the importance ratio from these log-probs, detached."""
        with compact_lm_head():  # the LM head on the completion tokens only, on a CPU too (align/modeling/lm_head.py)
            if self._padding_free(args, kwargs):  # one row of real tokens per chunk of rows (align/grpo/packing.py)
                size = kwargs.get("batch_size") or input_ids.size(0)
                parts = []
                with packed_attention(model):
                    for start in range(0, input_ids.size(0), size):
                        parts.append(
                            packed_logps(
                                model,
                                input_ids[start : start + size],
                                attention_mask[start : start + size],
                                logits_to_keep,
                                compute_entropy=bool(kwargs.get("compute_entropy")),
                                autocast=self.accelerator.autocast,
                            )
                        )
                logps = torch.cat([p[0] for p in parts])
                out = (logps, torch.cat([p[1] for p in parts]) if kwargs.get("compute_entropy") else None, None)
            else:
                out = trl_logps(model, input_ids, attention_mask, logits_to_keep, *args, **kwargs)
        inputs, self._pending_importance = self._pending_importance, None
        if inputs is not None:
            logps, sampled = out[0].detach(), inputs["sampling_per_token_logps"]
            mask = (
                inputs["completion_mask"] * inputs["tool_mask"] if "tool_mask" in inputs else inputs["completion_mask"]
            )
            mode = self.vllm_importance_sampling_mode
            ratio = importance_ratio(
                logps,
                sampled,
                mask,
                mode,
                self.vllm_importance_sampling_clip_min,
                self.vllm_importance_sampling_clip_max,
            )
            inputs["importance_sampling_ratio"] = ratio
            log_importance_metrics(self, ratio, logps, sampled, mask, mode)
        return out
