"""SFT's config: TRL's SFTConfig plus the assistant-mask method and the batch layout."""

from __future__ import annotations

import logging
from dataclasses import dataclass, field

import torch
import trl

from align.config import StageArgs
from align.runtime.device import apply_device_defaults
from align.sft.batches import resolve_packing_layout

logger = logging.getLogger(__name__)


MASK_METHODS = ("auto", "markers", "sentinel")


@dataclass
class SFTConfig(StageArgs, trl.SFTConfig):
    """TRL's SFTConfig + our fields. `assistant_only_loss` works for any chat template (see align.data.chat)."""

    mask_method: str = field(
        default="auto",
        metadata={
            "help": "Assistant masks: auto (template {% generation %} markers if present, else sentinel), "
            "markers, or sentinel (template-independent)."
        },
    )
    length_bucketing: bool = field(
        default=False,
        metadata={
            "help": "Without packing: batch rows of similar length together (batch order shuffled each "
            "epoch): padding drops to a few percent, but a batch then holds one kind of row when lengths "
            "follow the source (the preflight data-order check says so)."
        },
    )
    packing_layout: str = field(
        default="auto",
        metadata={
            "help": "With packing: 'rows' keeps [batch, max_length] rows with per-document attention (fast "
            "with sdpa/CPU); 'flat' is TRL's single flattened row (for flash-attention varlen kernels); "
            "'auto' (default): rows on a CPU, flat on a GPU."
        },
    )
    document_attention: bool = field(
        default=True,
        metadata={
            "help": "With packing_layout rows: attend within each document by gathering documents into "
            "right-padded batches for causal sdpa (align/modeling/document_attention.py) instead of a block-diagonal "
            "mask over the whole row."
        },
    )
    bucket_batches: int = field(
        default=64, metadata={"help": "Length buckets are sorted within pools of this many batches (randomness)."}
    )
    sft_eval_max_new_tokens: int = field(
        default=96, metadata={"help": "Generation budget per held-out prompt in the before/after evaluation."}
    )

    def __post_init__(self):
        apply_device_defaults(self)
        if self.mask_method not in MASK_METHODS:
            raise ValueError(f"mask_method={self.mask_method!r}; choose from {list(MASK_METHODS)}")
        self.packing_layout = resolve_packing_layout(self.packing_layout, torch.cuda.is_available())
        if self.bucket_batches < 1:
            raise ValueError(f"bucket_batches must be >= 1, got {self.bucket_batches}")
        if self.use_liger_kernel and not torch.cuda.is_available():
            # One clear line instead of Liger's "0 active drivers" crash on the first kernel.
            logger.warning("use_liger_kernel: Liger kernels need a CUDA GPU; training on CPU without them")
            self.use_liger_kernel = False
        super().__post_init__()
