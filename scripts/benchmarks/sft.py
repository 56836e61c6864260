"""SFT throughput: our SFT stage vs TRL's SFTTrainer with its default settings, same model, same data.

    python scripts/benchmark.py sft [--quick]

Model: the tiny world's default base shape (pretrain.model.ModelArguments(), ~3.4M params) with a 4k BPE
trained on the task text; data: `builtin:tasks` conversations (think and no_think mixed), tokenized ONCE
with align.data.chat's assistant masks, so both trainers see identical token ids and labels.

- trl-default: trl.SFTTrainer + trl.SFTConfig() defaults, except what a CPU needs to start at all
  (bf16=False: TRL's default bf16 refuses to start on a CPU; gradient_checkpointing=False, which only
  makes the baseline faster): padded batches of 8 in random order, fp32.
- ours: align.sft.trainer.SFTTrainer + align.sft.config.SFTConfig defaults (bf16 autocast on CPU) with the layout under
  test: `rows` = bfd packing into [8, max_length] rows with per-document attention (RowPackedCollator +
  align/modeling/document_attention.py), or `bucket` = length-bucketed batches of 8.
- plain-loop: the batches ours builds, fed to a hand-written loop (autocast, the same attention, forward with
  labels, backward, clip, AdamW): the Trainer's own overhead is the difference.

Reported: non-padding tokens/s (timed optimizer steps after the first), the padding share of the batches,
peak RSS growth during training, and the loss: held-out eval loss of the SAME initial weights under each
trainer (identical data; the gap is bf16 rounding), and after the timed steps.
"""

from __future__ import annotations

import statistics
import tempfile
import time

import torch

from align.data.chat import tokenize_sft_dataset
from align.modeling.loading import load_model
from align.sft.config import SFTConfig
from align.sft.trainer import SFTTrainer
from benchmarks.common import alternate, current_rss_mb, summary_line
from data_gen.tasks import tasks_dataset
from pretrain.model import ModelArguments, build_model
from pretrain.tokenizer import train_tokenizer

TARGET = 1.5  # >= 1.5x TRL's defaults
PLAIN_TARGET = 0.9  # >= 0.9x a plain PyTorch loop over the same batches, precision and attention
LAYOUTS = {"rows": dict(packing=True, packing_layout="rows", max_length=512), "bucket": dict(length_bucketing=True)}


def _setup(num_rows: int) -> dict:

    train_raw = tasks_dataset(split="train", num=num_rows, mode="mixed", seed=0)
    test_raw = tasks_dataset(split="test", num=64, mode="mixed", seed=0)
    texts = [m["content"] for r in train_raw for m in r["messages"]]
    tokenizer = train_tokenizer(texts, vocab_size=4096)
    out = tempfile.mkdtemp(prefix="sft-bench-")
    build_model(ModelArguments(), vocab_size=len(tokenizer)).save_pretrained(out)
    tokenizer.save_pretrained(out)
    return {
        "model_dir": out,
        "tokenizer": tokenizer,
        "train": tokenize_sft_dataset(train_raw, tokenizer),
        "test": tokenize_sft_dataset(test_raw, tokenizer, name="test"),
    }


class _Meter:
    """Counts real vs padded positions of every batch the collator builds, and times optimizer steps."""

    def __init__(self, trainer):
        from transformers import TrainerCallback

        self.steps, self.tokens, self.positions, self.rss = [], [], [], []
        inner, meter = trainer.data_collator, self

        def collate(examples):
            batch = inner(examples)
            meter.tokens.append(sum(len(e["input_ids"]) for e in examples))
            meter.positions.append(batch["input_ids"].numel())
            return batch

        trainer.data_collator = collate

        class Timer(TrainerCallback):
            def on_step_begin(self, args, state, control, **kw):
                meter._t = time.perf_counter()

            def on_step_end(self, args, state, control, **kw):
                meter.steps.append(time.perf_counter() - meter._t)
                meter.rss.append(current_rss_mb())

        trainer.add_callback(Timer())


def _trainer(kind: str, data: dict, num_steps: int, layout: str):
    import trl

    common = dict(
        output_dir=tempfile.mkdtemp(prefix="sft-bench-run-"),
        max_steps=num_steps,
        seed=0,
        report_to="none",
        logging_steps=10_000,
        save_strategy="no",
        disable_tqdm=True,
        dataloader_drop_last=True,
    )
    model = load_model(data["model_dir"], dtype="float32")
    if kind == "trl":
        args = trl.SFTConfig(**common, bf16=False, use_cpu=True, gradient_checkpointing=False)
        cls = trl.SFTTrainer
    else:
        args = SFTConfig(**common, **LAYOUTS[layout])
        cls = SFTTrainer
    return cls(
        model=model,
        args=args,
        train_dataset=data["train"],
        eval_dataset=data["test"],
        processing_class=data["tokenizer"],
    )


def _run(kind: str, data: dict, num_steps: int, layout: str) -> dict:
    trainer = _trainer(kind, data, num_steps, layout)
    initial_loss = trainer.evaluate()["eval_loss"]
    meter = _Meter(trainer)
    rss0 = current_rss_mb()
    trainer.train()
    n = len(meter.steps)
    # the dataloader may prefetch a batch beyond the last step: count the batches the timed steps consumed
    tokens, positions = meter.tokens[:n], meter.positions[:n]
    return {
        "tok_per_s": sum(tokens[1:]) / sum(meter.steps[1:]),
        "padding": 1 - sum(tokens) / sum(positions),
        "tokens_per_step": statistics.mean(tokens),
        "rss_growth_mb": max(meter.rss) - rss0,
        "initial_eval_loss": initial_loss,
        "final_eval_loss": trainer.evaluate()["eval_loss"],
    }


def _plain(data: dict, num_steps: int, layout: str) -> dict:
    """A plain PyTorch loop over the SAME batches our trainer builds (its dataloader and collator), at the same
    precision (bf16 autocast) with the same attention: forward with labels, backward, clip, AdamW; no Trainer."""
    from contextlib import nullcontext

    trainer = _trainer("ours", data, num_steps, layout)
    model, counted = trainer.model, []
    inner = trainer.data_collator

    def collate(examples):
        counted.append(sum(len(e["input_ids"]) for e in examples))
        return inner(examples)

    trainer.data_collator = collate
    batches = iter(trainer.get_train_dataloader())
    optimizer = torch.optim.AdamW(model.parameters(), lr=trainer.args.learning_rate)
    model.train()
    steps, tokens = [], []
    for _ in range(num_steps):
        batch = next(batches)
        tokens.append(counted[-1] if len(counted) == len(tokens) + 1 else counted[len(tokens)])
        t = time.perf_counter()
        with trainer._attention(model) if trainer.per_document else nullcontext():
            with torch.autocast("cpu", dtype=torch.bfloat16):
                loss = model(**batch, use_cache=False).loss
            loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), trainer.args.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        steps.append(time.perf_counter() - t)
    return {"tok_per_s": sum(tokens[1:]) / sum(steps[1:])}


def run(quick: bool = False, layout: str = "rows") -> dict:
    torch.set_num_threads(2)
    data = _setup(num_rows=600 if quick else 2000)
    reps, num_steps = (2, 8) if quick else (3, 20)
    runs = {k: (lambda k=k: _run(k, data, num_steps, layout)) for k in ("ours", "trl")}
    runs["plain"] = lambda: _plain(data, num_steps, layout)
    results = alternate(runs, reps)
    med = {k: {m: statistics.median(r[m] for r in v) for m in v[0]} for k, v in results.items()}
    rows = [{"stack": f"ours[{layout}]" if k == "ours" else "trl-default", **med[k]} for k in ("ours", "trl")]
    rows.append({"stack": f"plain-loop[{layout}]", **med["plain"]})
    ratio = med["ours"]["tok_per_s"] / med["trl"]["tok_per_s"]
    plain_ratio = med["ours"]["tok_per_s"] / med["plain"]["tok_per_s"]
    gap = abs(med["ours"]["initial_eval_loss"] - med["trl"]["initial_eval_loss"]) / med["trl"]["initial_eval_loss"]
    per_rep = {k: [r["tok_per_s"] for r in v] for k, v in results.items()}
    summary = [
        summary_line(
            "sft",
            "ours/trl-default",
            "non-pad-tokens-per-s",
            ratio,
            TARGET,
            [a / b for a, b in zip(per_rep["ours"], per_rep["trl"])],
        ),
        summary_line(
            "sft",
            "ours/plain-loop",
            "non-pad-tokens-per-s",
            plain_ratio,
            PLAIN_TARGET,
            [a / b for a, b in zip(per_rep["ours"], per_rep["plain"])],
        ),
        f"sft: padding ours {med['ours']['padding']:.1%} vs trl-default {med['trl']['padding']:.1%} (target < 5%)",
        f"sft: same-weights eval loss ours {med['ours']['initial_eval_loss']:.4f} vs trl-default "
        f"{med['trl']['initial_eval_loss']:.4f} (relative gap {gap:.2%}); after {num_steps} steps "
        f"{med['ours']['final_eval_loss']:.4f} vs {med['trl']['final_eval_loss']:.4f}",
    ]
    return {"rows": rows, "summary": summary}


if __name__ == "__main__":  # exploring layouts: PYTHONPATH=scripts python scripts/benchmarks/sft.py [rows|bucket]
    import sys

    out = run(quick="--quick" in sys.argv, layout=next((a for a in sys.argv[1:] if a in LAYOUTS), "rows"))
    print(*out["rows"], *out["summary"], sep="\n")
