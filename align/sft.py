"""Supervised fine-tuning: TRL's SFTTrainer, with assistant masks for any chat template and fast CPU batches.

Why: SFT is the stage every user runs. TRL does the training; what we add is what it leaves to the user:

- assistant-only loss for ANY chat template (align.chat: `{% generation %}` markers when present, else a
  template-independent method), computed before the trainer sees the data, so a template without markers
  trains on the assistant's tokens and end-of-turn token instead of raising or silently masking nothing;
  prompt/completion rows train on the completion only;
- packed rows that stay rows (`packing: true`, `packing_layout: rows`): TRL's bfd packing, but a batch is
  [batch, max_length] rows with restarting position ids and per-document attention instead of TRL's single
  flattened [1, batch*max_length] row, whose attention spans the whole batch on CPU/sdpa (FACTS.md: ~3x
  slower). Padding is the tail of each bin, a few percent. `packing_layout: flat` keeps TRL's layout, the
  right one for flash-attention varlen kernels on GPUs. Without packing, `length_bucketing` batches rows of
  similar length (shuffled batch order) for the same padding savings;
- bf16 autocast on CPU (align.configs.apply_device_defaults) and LoRA/QLoRA through TRL's ModelConfig
  fields, merged into the base on save when `merge_lora_on_save` (the next stage loads a plain HF model);
- Liger kernels on GPUs only: a CPU run that asks for them logs one line and trains without;
- the number that says it worked: held-out task prompts answered in chat format (format rate) and correctly,
  before and after, written to `<output_dir>/sft_eval.json`.

How to run:
    python scripts/sft.py recipes/tiny_sft.yaml
    accelerate launch --config_file recipes/accelerate_configs/zero2.yaml --use_deepspeed --num_processes 2 \
        scripts/sft.py recipes/tiny_sft.yaml                                     # 2 CPU ranks, DeepSpeed ZeRO-2
    accelerate launch --config_file recipes/accelerate_configs/zero3.yaml scripts/sft.py recipes/smollm3_sft.yaml
"""

from __future__ import annotations

import contextlib
import json
import logging
import math
import os
from dataclasses import dataclass, field

import torch
import trl
from torch.utils.data import Sampler
from trl.trainer.sft_trainer import DataCollatorForLanguageModeling

from align.answers import run_generative
from align.chat import setup_chat_format, tokenize_sft_dataset
from align.checkpoint import install, resume_checkpoint
from align.configs import apply_device_defaults
from align.data import get_dataset
from align.distributed import full_model
from align.document_attention import document_attention
from align.models import load_model, load_tokenizer
from align.preflight import preflight
from align.rollout import get_engine
from align.stage import save_trained_model

logger = logging.getLogger(__name__)

MASK_METHODS = ("auto", "markers", "sentinel")


@dataclass
class SFTConfig(trl.SFTConfig):
    """TRL's SFTConfig + our fields. `assistant_only_loss` works for any chat template (see align.chat)."""

    mask_method: str = field(
        default="auto",
        metadata={"help": "Assistant masks: auto (template {% generation %} markers if present, else sentinel), "
                  "markers, or sentinel (template-independent)."},
    )
    length_bucketing: bool = field(
        default=False,
        metadata={"help": "Without packing: batch rows of similar length together (batch order shuffled each "
                  "epoch): padding drops to a few percent, but a batch then holds one kind of row when lengths "
                  "follow the source (the preflight data-order check says so)."},
    )
    packing_layout: str = field(
        default="rows",
        metadata={"help": "With packing: 'rows' keeps [batch, max_length] rows with per-document attention (fast "
                  "with sdpa/CPU); 'flat' is TRL's single flattened row (for flash-attention varlen kernels)."},
    )
    document_attention: bool = field(
        default=True,
        metadata={"help": "With packing_layout rows: attend within each document by gathering documents into "
                  "right-padded batches for causal sdpa (align/document_attention.py) instead of a block-diagonal "
                  "mask over the whole row."},
    )
    bucket_batches: int = field(
        default=64, metadata={"help": "Length buckets are sorted within pools of this many batches (randomness)."}
    )
    merge_lora_on_save: bool = field(
        default=True,
        metadata={"help": "With LoRA: save the merged model to output_dir (the adapter goes to output_dir/adapter)."},
    )
    sft_eval_max_new_tokens: int = field(
        default=96, metadata={"help": "Generation budget per held-out prompt in the before/after evaluation."}
    )

    def __post_init__(self):
        apply_device_defaults(self)
        if self.mask_method not in MASK_METHODS:
            raise ValueError(f"mask_method={self.mask_method!r}; choose from {list(MASK_METHODS)}")
        if self.packing_layout not in ("rows", "flat"):
            raise ValueError(f"packing_layout={self.packing_layout!r}; choose 'rows' or 'flat'")
        if self.bucket_batches < 1:
            raise ValueError(f"bucket_batches must be >= 1, got {self.bucket_batches}")
        if self.use_liger_kernel and not torch.cuda.is_available():
            # One clear line instead of Liger's "0 active drivers" crash on the first kernel.
            logger.warning("use_liger_kernel: Liger kernels need a CUDA GPU; training on CPU without them")
            self.use_liger_kernel = False
        super().__post_init__()


class LengthBucketSampler(Sampler[int]):
    """Indices such that each run of `batch_size` rows has similar lengths, in a shuffled batch order.

    Per epoch (seeded by seed + epoch, so a resume replays the same order): shuffle, cut into pools of
    `pool_batches` batches, sort each pool by length, cut it into batches, shuffle all batches. Unlike
    transformers' LengthGroupedSampler the order does not run long-to-short within a pool (the preflight
    data-order check and the loss curve both see a shuffled stream).
    """

    def __init__(self, lengths: list[int], batch_size: int, seed: int = 0, pool_batches: int = 64):
        self.lengths, self.batch_size, self.seed, self.pool_batches = list(lengths), batch_size, seed, pool_batches
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def batches(self) -> list[list[int]]:
        g = torch.Generator().manual_seed(self.seed + self.epoch)
        order = torch.randperm(len(self.lengths), generator=g).tolist()
        pool = self.batch_size * self.pool_batches
        batches = []
        for start in range(0, len(order), pool):
            chunk = sorted(order[start : start + pool], key=lambda i: self.lengths[i])
            batches += [chunk[i : i + self.batch_size] for i in range(0, len(chunk), self.batch_size)]
        return [batches[i] for i in torch.randperm(len(batches), generator=g).tolist()]

    def __iter__(self):
        for batch in self.batches():
            yield from batch


class RowPackedCollator(DataCollatorForLanguageModeling):
    """Packed rows kept as [B, max_length] rows (not flattened into one [1, B*max_length] row as TRL's padding-free
    collator does): position ids restart at every document and no attention mask is passed, so transformers
    builds a block-diagonal causal mask per row (document masking) and attention spans max_length, not the batch.
    """

    def torch_call(self, examples: list[dict]) -> dict:
        width = max(len(e["input_ids"]) for e in examples)
        ids = torch.full((len(examples), width), self.pad_token_id, dtype=torch.long)
        labels = torch.full_like(ids, -100)
        positions = torch.zeros_like(ids)
        for row, e in enumerate(examples):
            n = len(e["input_ids"])
            ids[row, :n] = torch.tensor(e["input_ids"])
            labels[row, :n] = torch.tensor(e.get("labels", e["input_ids"]))
            lengths = list(e.get("seq_lengths") or [n])
            if width > n:
                lengths.append(width - n)  # the tail padding is its own "document", never a label
            positions[row] = torch.cat([torch.arange(k) for k in lengths])
        labels[positions == 0] = -100  # a document's first token is never predicted from the previous document
        return {"input_ids": ids, "labels": labels, "position_ids": positions}


class SFTTrainer(trl.SFTTrainer):
    """TRL's SFTTrainer with a length-bucketed sampler (`length_bucketing`) and packed rows (`packing_layout`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        rows = self.args.packing and self.args.packing_layout == "rows"
        if rows:
            self.data_collator = RowPackedCollator(pad_token_id=self._tokenizer.pad_token_id)
        self.per_document = rows and self.args.document_attention

    def _attention(self, model):
        """Per-document attention for packed rows, around the forward AND backward (gradient checkpointing re-runs
        the forward inside backward); a no-op otherwise."""
        if not self.per_document:
            return contextlib.nullcontext()
        return document_attention(self.accelerator.unwrap_model(model))

    def training_step(self, model, inputs, *args, **kwargs):
        with self._attention(model):
            return super().training_step(model, inputs, *args, **kwargs)

    def prediction_step(self, model, inputs, *args, **kwargs):
        with self._attention(model):
            return super().prediction_step(model, inputs, *args, **kwargs)

    def _get_train_sampler(self, train_dataset=None):
        dataset = train_dataset if train_dataset is not None else self.train_dataset
        args = self.args
        if not getattr(args, "length_bucketing", False) or args.packing or "input_ids" not in dataset.column_names:
            return super()._get_train_sampler(train_dataset)
        lengths = [len(ids) for ids in dataset["input_ids"]]
        return LengthBucketSampler(lengths, args.per_device_train_batch_size, args.seed, args.bucket_batches)


# ----------------------------------------------------------------------------------------------- data


def prepare_sft_data(dataset, tokenizer, args: SFTConfig, chat_template: str | None = None, name: str = "train"):
    """Tokenize {"messages"} / {"prompt", "completion"} rows with our masks; TRL then builds labels from them."""
    if dataset is None:
        return None
    if "input_ids" in dataset.column_names:
        return dataset  # already tokenized by the user: TRL applies its mask columns as they are
    return tokenize_sft_dataset(
        dataset, tokenizer, assistant_only_loss=args.assistant_only_loss, chat_template=chat_template,
        num_proc=args.dataset_num_proc, name=name, method=args.mask_method,
    )


# ----------------------------------------------------------------------------------------------- evaluation


def heldout_chat_eval(model, accelerator, tokenizer, rows: list[dict], modes: list[str], max_new_tokens: int) -> dict:
    """Greedy answers to held-out task prompts per mode: accuracy, chat-format rate, lengths (align.evaluate).

    `model` is what the trainer trains (`trainer.model_wrapped`). Collective: every rank enters (ZeRO-3 gathers the
    weights), answers its share of the rows, and gets the stats over all of them."""
    with full_model(model, accelerator) as whole:
        engine = get_engine(whole, backend="hf", tokenizer=tokenizer)
        try:
            return {mode: run_generative(engine, tokenizer, rows, mode, max_new_tokens)[0] for mode in modes}
        finally:
            engine.close()


def _eval_rows(dataset, num: int) -> list[dict]:
    if dataset is None or not {"prompt", "answer", "reward"} <= set(dataset.column_names):
        return []
    rows = [dict(r) for r in dataset.select(range(min(num, len(dataset))))]
    return [r for r in rows if isinstance(r["prompt"], str)]


# ----------------------------------------------------------------------------------------------- main


def _load(model_args, args: SFTConfig):
    quantization = trl.get_quantization_config(model_args)
    kwargs = {}
    if quantization is not None:
        if not torch.cuda.is_available():
            raise ValueError("load_in_4bit / load_in_8bit (QLoRA) need a CUDA GPU and bitsandbytes; "
                             "on CPU use plain LoRA (use_peft: true) instead")
        kwargs.update(quantization_config=quantization, device_map=trl.get_kbit_device_map())
    return load_model(model_args.model_name_or_path, dtype=model_args.dtype or "auto",
                      attn_implementation=model_args.attn_implementation, **kwargs)


def main(script_args, training_args: SFTConfig, model_args) -> dict:
    """Train SFT; save an HF model + tokenizer (with chat template) to output_dir; return the eval report."""
    from transformers import set_seed

    set_seed(training_args.seed)
    if training_args.process_index == 0:
        logger.info("SFT stage: script=%s\nmodel=%s\ntraining=%s", script_args, model_args, training_args)
    if not model_args.model_name_or_path:
        raise ValueError("model_name_or_path is not set; point it at the base model (e.g. outputs/tiny/midtrain)")

    tokenizer = load_tokenizer(model_args.model_name_or_path)
    # A base model gets its chat template and end-of-turn EOS here (TRL mirrors eos_token onto the model configs).
    chat_template = setup_chat_format(tokenizer, training_args.chat_template_path, training_args.eos_token)
    training_args.chat_template_path = None  # applied here; TRL would try to clone it into the model again

    data = get_dataset(script_args)
    raw_train, raw_test = data["train"], data["test"] if "test" in data else None
    use_eval = raw_test is not None and len(raw_test) and training_args.eval_strategy != "no"
    with training_args.main_process_first(desc="tokenizing the SFT data"):  # rank 0 fills the cache, the rest read it
        train = prepare_sft_data(raw_train, tokenizer, training_args, chat_template, "train")
        test = prepare_sft_data(raw_test, tokenizer, training_args, chat_template, "test") if use_eval else None
    # The masks are in the data now: TRL builds labels from them (assistant_masks always, completion_mask when
    # completion_only_loss). Its own assistant_only_loss path needs {% generation %} markers, so it stays off.
    training_args.assistant_only_loss = False
    training_args.completion_only_loss = "completion_mask" in train.column_names

    model = _load(model_args, training_args)
    peft_config = trl.get_peft_config(model_args)
    trainer = SFTTrainer(model=model, args=training_args, train_dataset=train, eval_dataset=test,
                         processing_class=tokenizer, peft_config=peft_config)
    preflight(trainer, script_args, stage="sft", raw_train=raw_train, chat_template=chat_template)
    install(trainer, script_args)  # atomic checkpoints, non-finite guard

    report: dict = {"world_size": trainer.accelerator.num_processes,
                     "distributed_type": str(trainer.accelerator.distributed_type)}
    rows = _eval_rows(raw_test, script_args.eval_num_prompts) if script_args.eval_after else []
    modes = ["think", "no_think"]
    if rows:  # every rank: its share of the prompts, on whole weights
        report["before"] = heldout_chat_eval(trainer.model_wrapped, trainer.accelerator, tokenizer, rows,
                                             [*modes, "plain"], training_args.sft_eval_max_new_tokens)
        logger.info("held-out before SFT: %s", _summary(report["before"]))

    result = trainer.train(resume_from_checkpoint=resume_checkpoint(training_args))
    report["train"] = {k: float(v) for k, v in result.metrics.items() if isinstance(v, (int, float))}
    losses = [h["loss"] for h in trainer.state.log_history if "loss" in h]
    if losses:
        report["train"]["first_logged_loss"], report["train"]["last_logged_loss"] = losses[0], losses[-1]
    save_trained_model(trainer, tokenizer, training_args.output_dir, training_args.merge_lora_on_save)

    if rows:
        report["after"] = heldout_chat_eval(trainer.model_wrapped, trainer.accelerator, tokenizer, rows, modes,
                                            training_args.sft_eval_max_new_tokens)
        logger.info("held-out after SFT: %s", _summary(report["after"]))
    if trainer.accelerator.is_main_process:
        with open(os.path.join(training_args.output_dir, "sft_eval.json"), "w") as f:
            json.dump(report, f, indent=2, default=str)
    return report


def _summary(per_mode: dict) -> str:
    return ", ".join(f"{m}: acc {s['acc']:.3f} format {s['format']:.3f}" for m, s in per_mode.items()
                     if not math.isnan(s.get("acc", float("nan"))))
