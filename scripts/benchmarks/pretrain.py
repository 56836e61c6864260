"""Pretraining throughput: our loop (pretrain.train.train) vs a plain PyTorch loop, same model/data/batch/optimizer.

    python scripts/benchmark.py pretrain [--quick]

Model: the tiny world's small base shape (pretrain.model.ModelArguments(), ~3.2M params, 4k vocab); data: the
task text + synthetic prose packed by pretrain.data (document-masked rows of 512 tokens, 8 rows a step).
- plain-torch: a batch from the same data stream -> model(input_ids, position_ids) -> cross-entropy -> backward ->
  clip -> AdamW step, under torch.autocast for bf16. No framework at all. Its batches are
  read inside the timed loop, as ours are (pre-built outside it, data reading would be charged to ours only).
- ours: `train()` end to end (accelerate, the live data stream, the LR schedule, the NaN/spike guard, logging),
  timed over the same optimizer steps (first step excluded as warm-up; model build and save are not timed).
Both run fp32 and bf16 autocast, alternating repetitions; medians. MFU = FLOPs/token x tokens/s / the matmul
peak measured here for that dtype. `loss_after` (same init, same data) shows what bf16 costs in quality.
"""

from __future__ import annotations

import os
import statistics
import sys
import tempfile
import time

import torch

from benchmarks.common import alternate, current_rss_mb, measure_matmul_peak, peak_rss_mb, summary_line
from data_gen.tasks import make_tasks, to_pretrain_text
from pretrain import data as data_mod
from pretrain import model as model_mod
from pretrain import tokenizer as tok_mod
from pretrain import train as train_mod

TARGET = 0.95
SEQ_LEN, ROWS = 512, 8


def _setup(out: str) -> dict:
    tasks = [to_pretrain_text(r) for r in make_tasks(num=3000, seed=0)]
    rng = __import__("random").Random(0)
    words = "the of and a to in is was he for it with as his on be at by had not are but from or have".split()
    prose = [" ".join(rng.choice(words) for _ in range(rng.randint(50, 400))) + "." for _ in range(400)]
    tokenizer = tok_mod.train_tokenizer(tasks + prose, vocab_size=4096)
    tokenizer.save_pretrained(os.path.join(out, "tok"))
    sources = {"tasks": tasks, "prose": prose}
    stages = [{"num_tokens": 10**9, "weights": {"tasks": 0.5, "prose": 0.5}}]
    return {
        "tok_dir": os.path.join(out, "tok"),
        "tokenizer": tokenizer,
        "sources": sources,
        "stages": stages,
        "stream": lambda: data_mod.PackedStream(sources, stages, tokenizer, SEQ_LEN, seed=0),
    }


def _ours(setup: dict, out: str, precision: str, steps: int, peak: float) -> dict:
    cfg = train_mod.PretrainConfig(
        output_dir=out,
        tokenizer_path=setup["tok_dir"],
        sources=setup["sources"],
        stages=setup["stages"],
        seq_len=SEQ_LEN,
        micro_batch_size=ROWS,
        max_steps=steps + 1,
        mixed_precision=precision,
        eval_steps=0,
        eval_docs=0,
        report_to="none",
        logging_steps=10**6,
        peak_flops=peak,  # measured once by run(): the loop's progress bar shows a real MFU
        warmup_steps=2,
        learning_rate=3e-3,
    )
    from accelerate.state import AcceleratorState

    AcceleratorState._reset_state(True)  # one process runs both precisions; accelerate's state is a singleton
    hist = train_mod.train(model_mod.ModelArguments(), cfg)["history"]
    return {"tps": steps * SEQ_LEN * ROWS / (hist[-1]["time"] - hist[0]["time"]), "loss": hist[-1]["loss"]}


def _plain(setup: dict, precision: str, steps: int) -> dict:
    import torch.nn.functional as F

    model = model_mod.build_model(model_mod.ModelArguments(), len(setup["tokenizer"]), seed=0)
    emb = model.get_input_embeddings().weight
    decay = [p for p in model.parameters() if p.ndim >= 2 and p is not emb]
    rest = [p for p in model.parameters() if p.ndim < 2 or p is emb]
    opt = torch.optim.AdamW(
        [{"params": decay, "weight_decay": 0.1}, {"params": rest, "weight_decay": 0.0}],
        lr=3e-3,
        betas=(0.9, 0.95),
        eps=1e-8,
    )
    stream = setup["stream"]()
    times = []
    for i in range(steps + 1):
        b = stream.next_batch(ROWS)  # read inside the timed loop, as ours does: both loops do the same work
        for g in opt.param_groups:  # same warmup as ours, so the losses are comparable
            g["lr"] = 3e-3 * min(1.0, (i + 1) / 2)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            logits = model(input_ids=b["input_ids"], position_ids=b["position_ids"], use_cache=False).logits
        loss = F.cross_entropy(logits.float().flatten(0, 1), b["targets"].flatten())
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad(set_to_none=True)
        times.append(time.perf_counter())
    return {"tps": steps * SEQ_LEN * ROWS / (times[-1] - times[0]), "loss": loss.item()}


def run(quick: bool = False) -> dict:
    steps, reps = (4, 2) if quick else (10, 3)
    out = tempfile.mkdtemp(prefix="pretrain-bench-")
    setup = _setup(out)
    flops = model_mod.flops_per_token(
        model_mod.build_model(model_mod.ModelArguments(), len(setup["tokenizer"])).config, SEQ_LEN
    )
    rows, summary = [], []
    for precision, dtype in (("no", torch.float32), ("bf16", torch.bfloat16)):
        results: dict[str, list[dict]] = {"ours": [], "plain-torch": []}

        peak = measure_matmul_peak(dtype)

        def once(name, precision=precision, results=results, peak=peak):
            r = _ours(setup, out, precision, steps, peak) if name == "ours" else _plain(setup, precision, steps)
            results[name].append(r)
            return r["tps"]

        tps = alternate({name: (lambda n=name: once(n)) for name in results}, reps)
        for name in results:
            med = statistics.median(tps[name])
            rows.append(
                {
                    "stack": name,
                    "precision": "fp32" if precision == "no" else "bf16",
                    "tokens_per_s": round(med),
                    "mfu": round(flops * med / peak, 4),
                    "matmul_peak_gflops": round(peak / 1e9, 1),
                    "loss_after": round(statistics.median(r["loss"] for r in results[name]), 4),
                    "rss_mb": round(current_rss_mb()),
                    "reps": tps[name],
                }
            )
        ratio = statistics.median(tps["ours"]) / statistics.median(tps["plain-torch"])
        label = "fp32" if precision == "no" else "bf16"
        per_rep = [a / b for a, b in zip(tps["ours"], tps["plain-torch"])]
        summary.append(summary_line("pretrain", "ours/plain-torch", f"tokens-per-s-{label}", ratio, TARGET, per_rep))
    summary.append(
        f"pretrain: peak RSS {peak_rss_mb():.0f} MiB; {flops / 1e6:.1f} MFLOPs/token; "
        f"{steps} timed steps x {reps} reps"
    )
    return {"rows": rows, "summary": summary}


if __name__ == "__main__":  # PYTHONPATH=scripts python scripts/benchmarks/pretrain.py [--quick]
    res = run(quick="--quick" in sys.argv)
    print(*res["rows"], *res["summary"], sep="\n")
