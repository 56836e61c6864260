"""Steps every training stage shares, as plain functions (no base trainer): saving the trained model.

    save_trained_model(trainer, tokenizer, output_dir, merge_lora=True)    # every rank calls it

Why here: saving is collective under DeepSpeed ZeRO-3 (`trainer.save_model` gathers the shards from all ranks;
calling it on rank 0 alone hangs), and a LoRA adapter must be merged so the next stage loads a plain HF model.
Merging a sharded PeftModel in place is not possible, so the adapter is saved first (collectively), then the main
process loads the base model whole, applies the saved adapter, merges and writes: the same on every launch.
"""

from __future__ import annotations

import logging
import os

import data_gen  # noqa: F401  (registers builtin:tasks with align.data for every stage's data)
from align.distributed import zero3_init_disabled
from align.models import load_model

logger = logging.getLogger(__name__)

ADAPTER_DIR = "adapter"


def save_trained_model(trainer, tokenizer, output_dir: str, merge_lora: bool = True) -> None:
    """The trained model as an HF directory that `AutoModelForCausalLM.from_pretrained` loads (+ tokenizer).

    With LoRA and `merge_lora`: the adapter goes to `output_dir/adapter`, the merged model to `output_dir`; without
    `merge_lora` the adapter alone is saved to `output_dir`. Call on every rank; rank 0 writes."""
    model = trainer.accelerator.unwrap_model(trainer.model)
    peft = hasattr(model, "peft_config")
    if peft and merge_lora:
        adapter_dir = os.path.join(output_dir, ADAPTER_DIR)
        trainer.save_model(adapter_dir)  # collective under ZeRO-3
        if trainer.accelerator.is_main_process:
            merge_adapter_dir(adapter_dir, output_dir)
    else:
        trainer.save_model(output_dir)
    if trainer.accelerator.is_main_process:
        tokenizer.save_pretrained(output_dir)  # the chat template travels with the tokenizer
    trainer.accelerator.wait_for_everyone()


def merge_adapter_dir(adapter_dir: str, output_dir: str) -> None:
    """Load the adapter's base model whole (outside ZeRO-3's partitioning), apply the adapter, merge, save."""
    from peft import PeftConfig, PeftModel

    base_path = PeftConfig.from_pretrained(adapter_dir).base_model_name_or_path
    with zero3_init_disabled():
        base = load_model(base_path, dtype="auto")
        merged = PeftModel.from_pretrained(base, adapter_dir).merge_and_unload()
    merged.save_pretrained(output_dir, safe_serialization=True)
    logger.info("LoRA adapter %s merged into %s -> %s", adapter_dir, base_path, output_dir)
