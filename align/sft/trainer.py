r"""Supervised fine-tuning: TRL's SFTTrainer, with assistant masks for any chat template and fast CPU batches.

Why: SFT is the stage every user runs. TRL does the training; what we add is what it leaves to the user:

- assistant-only loss for ANY chat template (align.data.chat: `{% generation %}` markers when present, else a
  template-independent method), computed before the trainer sees the data, so a template without markers
  trains on the assistant's tokens and end-of-turn token instead of raising or silently masking nothing;
  prompt/completion rows train on the completion only;
- packed rows that stay rows (`packing: true`, `packing_layout: rows`): TRL's bfd packing, but a batch is
  [batch, max_length] rows with restarting position ids and per-document attention instead of TRL's single
  flattened [1, batch*max_length] row, whose attention spans the whole batch on CPU/sdpa (FACTS.md: ~3x
  slower). Padding is the tail of each bin, a few percent. `packing_layout: flat` keeps TRL's layout, the
  right one for flash-attention varlen kernels on GPUs. Without packing, `length_bucketing` batches rows of
  similar length (shuffled batch order) for the same padding savings;
- bf16 autocast on CPU (align.runtime.device.apply_device_defaults) and LoRA/QLoRA through TRL's ModelConfig
  fields, merged into the base on save when `merge_lora_on_save` (the next stage loads a plain HF model);
- Liger kernels on GPUs only: a CPU run that asks for them logs one line and trains without;
- the number that says it worked: held-out task prompts answered in chat format (format rate) and correctly,
  before and after, written to `<output_dir>/sft_eval.json`.

How to run:
    python scripts/sft.py recipes/tiny/sft.yaml
    accelerate launch --config_file recipes/accelerate/zero2.yaml --use_deepspeed --num_processes 2 \
        scripts/sft.py recipes/tiny/sft.yaml  # 2 CPU ranks, DeepSpeed ZeRO-2
    accelerate launch --config_file recipes/accelerate/zero3.yaml scripts/sft.py recipes/smollm3/sft.yaml
"""

from __future__ import annotations

import contextlib
import logging
import math

import trl

from align import stage
from align.data.chat import tokenize_sft_dataset
from align.eval.generative import run_generative
from align.modeling.document_attention import document_attention
from align.modeling.lm_head import compact_lm_head
from align.rollout import get_engine
from align.runtime.distributed import full_model
from align.sft.batches import LengthBucketSampler, RowPackedCollator
from align.sft.config import SFTConfig

logger = logging.getLogger(__name__)

# TRL's private names this module overrides or reads, each with the parameters we rely on (checked against the
# installed TRL by tests/test_trl_private_names.py: an upgrade that renames or reshapes one fails there, in one place).
TRL_PRIVATE_METHODS = {
    "_get_train_sampler": "(self, train_dataset=None)",  # the length-bucketed sampler
}
TRL_PRIVATE_ATTRIBUTES = (
    "_tokenizer",  # the processing class TRL resolved (its pad id for the packed-row collator)
)


class SFTTrainer(trl.SFTTrainer):
    """TRL's SFTTrainer with a length-bucketed sampler (`length_bucketing`) and packed rows (`packing_layout`)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        rows = self.args.packing and self.args.packing_layout == "rows"
        if rows:
            self.data_collator = RowPackedCollator(pad_token_id=self._tokenizer.pad_token_id)
        self.per_document = rows and self.args.document_attention

    @contextlib.contextmanager
    def _attention(self, model):
        """Per-document attention for packed rows, around the forward AND backward (gradient checkpointing re-runs
        the forward inside backward), and the LM head only on the scored positions (align/modeling/lm_head.py)."""
        with compact_lm_head():
            if not self.per_document:
                yield
                return
            with document_attention(self.accelerator.unwrap_model(model)):
                yield

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


def prepare_sft_data(dataset, tokenizer, args: SFTConfig, chat_template: str | None = None, name: str = "train"):
    """Tokenize {"messages"} / {"prompt", "completion"} rows with our masks; TRL then builds labels from them."""
    if dataset is None:
        return None
    if "input_ids" in dataset.column_names:
        return dataset  # already tokenized by the user: TRL applies its mask columns as they are
    return tokenize_sft_dataset(
        dataset,
        tokenizer,
        assistant_only_loss=args.assistant_only_loss,
        chat_template=chat_template,
        num_proc=args.dataset_num_proc,
        name=name,
        method=args.mask_method,
    )


def heldout_chat_eval(model, accelerator, tokenizer, rows: list[dict], modes: list[str], max_new_tokens: int) -> dict:
    """Greedy answers to held-out task prompts per mode: accuracy, chat-format rate, lengths (align.eval.suite).

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


def main(script_args, training_args: SFTConfig, model_args) -> dict:
    """Train SFT; save an HF model + tokenizer (with chat template) to output_dir; return the eval report."""
    stage.start("sft", script_args, training_args, model_args)
    # A base model gets its chat template and end-of-turn EOS here (TRL mirrors eos_token onto the model configs).
    tokenizer, chat_template = stage.load_tokenizer(model_args, training_args)

    data = stage.load_data(script_args, training_args.output_dir)
    raw_train, raw_test = data["train"], data["test"] if "test" in data else None
    use_eval = raw_test is not None and len(raw_test) and training_args.eval_strategy != "no"
    with training_args.main_process_first(desc="tokenizing the SFT data"):  # rank 0 fills the cache, the rest read it
        train = prepare_sft_data(raw_train, tokenizer, training_args, chat_template, "train")
        test = prepare_sft_data(raw_test, tokenizer, training_args, chat_template, "test") if use_eval else None
    # The masks are in the data now: TRL builds labels from them (assistant_masks always, completion_mask when
    # completion_only_loss). Its own assistant_only_loss path needs {% generation %} markers, so it stays off.
    training_args.assistant_only_loss = False
    training_args.completion_only_loss = "completion_mask" in train.column_names

    model = stage.load_model(model_args)
    trainer = SFTTrainer(
        model=model,
        args=training_args,
        train_dataset=train,
        eval_dataset=test,
        processing_class=tokenizer,
        peft_config=stage.peft_config(model_args),
    )
    stage.prepare(trainer, script_args, "sft", raw_train=raw_train, chat_template=chat_template)

    report: dict = {
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type),
    }
    rows = _eval_rows(raw_test, script_args.eval_num_prompts) if script_args.eval_after else []
    modes = ["think", "no_think"]
    if rows:  # every rank: its share of the prompts, on whole weights
        report["before"] = heldout_chat_eval(
            trainer.model_wrapped,
            trainer.accelerator,
            tokenizer,
            rows,
            [*modes, "plain"],
            training_args.sft_eval_max_new_tokens,
        )
        logger.info("held-out before SFT: %s", _summary(report["before"]))
    report["train"] = stage.train(trainer, training_args)
    stage.save(trainer, tokenizer, training_args)
    if rows:
        with stage.own_precision(trainer):  # as "before": the model's dtype, not the training autocast
            report["after"] = heldout_chat_eval(
                trainer.model_wrapped,
                trainer.accelerator,
                tokenizer,
                rows,
                modes,
                training_args.sft_eval_max_new_tokens,
            )
        logger.info("held-out after SFT: %s", _summary(report["after"]))
    stage.write_report(trainer, training_args.output_dir, "sft_eval.json", report)
    return report


def _summary(per_mode: dict) -> str:
    return ", ".join(
        f"{m}: acc {s['acc']:.3f} format {s['format']:.3f}"
        for m, s in per_mode.items()
        if not math.isnan(s.get("acc", float("nan")))
    )
