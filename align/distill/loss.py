"""The distillation divergence over chunks of positions, without batch x length x vocabulary logits.

Why: TRL's GOLD/GKD loss takes the student's and the teacher's whole logits, and its generalized JSD then builds
log-softmaxes, a mixture and a KL of the same size: for SmolLM2-135M (vocabulary 49,152) 4 sequences of 2,048
tokens are 1.6 GB per fp32 tensor, several alive at once, more than the model. `loss_chunk_tokens: N` runs both
models' bodies with the LM head skipped (their final hidden states come back where the logits would), keeps the
positions that carry loss (the completion tokens: prompts and padding never reach a head), and applies both heads
and TRL's own `generalized_jsd_loss` to N positions at a time under activation checkpointing: the forward keeps
one chunk's logits, the backward recomputes them from the hidden states. Same loss and gradients as the whole path
(summation order aside; tests/test_distill.py checks both), at the cost of one more student-head pass.

    with hidden_states_as_logits(model) as head:          # model(...).logits are the final hidden states
        hidden = model(input_ids=ids, attention_mask=mask).logits
    total = chunked_jsd(hidden[sel], teacher_hidden[sel], head, teacher_head, beta=0.5, temperature=1.0, chunk=512)

The same-tokenizer path only: GOLD's cross-tokenizer ULD loss aligns token spans across the two sequences before
it compares sorted probabilities, which needs the whole rows (`loss_chunk_tokens` with ULD is refused at start).
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils.checkpoint import checkpoint

_SCALED_HEADS = ("final_logit_softcapping", "logit_scale", "logits_scaling", "output_multiplier", "lm_head_multiplier")


def check_plain_head(model) -> None:
    """Chunking applies the LM head as a plain projection: refuse models whose forward scales or caps the logits."""
    config = model.config.get_text_config() if hasattr(model.config, "get_text_config") else model.config
    scaled = [k for k in _SCALED_HEADS if getattr(config, k, None) not in (None, 1, 1.0)]
    if scaled:
        raise ValueError(
            f"loss_chunk_tokens needs a plain LM head, but {type(model).__name__} sets {scaled[0]}; "
            f"set loss_chunk_tokens: 0 for this model"
        )


@contextlib.contextmanager
def hidden_states_as_logits(model):
    """Inside, `model(...)` skips the LM head: its `.logits` are the final hidden states. The call still goes through
    the model's wrapper (DDP, DeepSpeed ZeRO-3 hooks, PEFT); yields the head, to be applied with `chunked_jsd`."""
    base = model
    while hasattr(base, "module") and not hasattr(base, "get_output_embeddings"):  # DDP / DeepSpeed engines
        base = base.module
    head = base.get_output_embeddings()
    head.forward = _identity  # an instance attribute: the module's hooks (ZeRO-3's gather) still run around it
    try:
        yield head
    finally:
        del head.forward


def _identity(hidden: torch.Tensor) -> torch.Tensor:
    return hidden


def chunked_jsd(
    student_hidden: torch.Tensor,
    teacher_hidden: torch.Tensor,
    student_head,
    teacher_head,
    *,
    beta: float,
    temperature: float,
    chunk: int,
) -> torch.Tensor:
    """Summed generalized JSD (TRL's definition: beta=0 forward KL, 1 reverse KL) of (N, H) student and (N, H')
    teacher hidden states at the same N positions, `chunk` positions' logits at a time. Divide by the token count
    (or TRL's `num_items_in_batch`) for the mean the whole-logits loss returns."""
    total = student_hidden.sum() * 0.0  # stays connected to the graph when no position carries loss
    for start in range(0, student_hidden.size(0), chunk):
        part = checkpoint(
            _chunk_jsd,
            student_hidden[start : start + chunk],
            teacher_hidden[start : start + chunk],
            student_head,
            teacher_head,
            beta,
            temperature,
            use_reentrant=False,
        )
        total = total + part
    return total


def _chunk_jsd(student_hidden, teacher_hidden, student_head, teacher_head, beta, temperature) -> torch.Tensor:
    from trl.experimental.gold import GOLDTrainer

    student_logits = student_head(student_hidden)[None]  # (1, n, V): the only logits alive at once
    with torch.no_grad():
        teacher_logits = teacher_head(teacher_hidden)[None].to(student_logits.device, student_logits.dtype)
    return GOLDTrainer.generalized_jsd_loss(
        student_logits, teacher_logits, beta=beta, temperature=temperature, reduction="sum"
    )
