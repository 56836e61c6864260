"""Peak memory of one distillation loss pass: chunked (`loss_chunk_tokens`) vs TRL's whole-vocabulary logits.

    python scripts/benchmark.py distill_memory [--quick]

SmolLM2-135M-Instruct as the student and as a same-tokenizer teacher (fp32, vocabulary 49,152), 4 sequences of
2,048 tokens (a 256-token prompt, 1,792 completion tokens that carry loss; `--quick`: 512 tokens), one forward and
backward of the default loss (`reverse_kl`: TRL's generalized JSD at beta 1; the mixture at beta 0.5 keeps about
three times as many whole-logits tensors alive and does not fit this size in 24 GB), the student's layers under
gradient checkpointing (as rows this long are trained; otherwise its activations, not the logits, fill memory),
the teacher the same weights with 2% noise added.
- whole (TRL): both models' logits over the whole batch, `GOLDTrainer.generalized_jsd_loss` on them, as
  GOLDTrainer.compute_loss does.
- ours: `DistillTrainer.compute_loss` with `loss_chunk_tokens: 256` (align/distill/loss.py): the bodies' hidden
  states, then both heads and the same TRL loss 256 completion positions at a time under activation checkpointing.
Each pass runs in a fresh process, its peak read as the process's own high-water mark (VmHWM, reset through
/proc/self/clear_refs once the models are loaded, their memory-mapped weights read and the batch built) above what
it held then; the gradients of both are compared (max relative difference).
Summary: `distill_memory: ours/whole peak-MiB ratio R (target >= 2.0)`, R = whole's peak / ours.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile
from pathlib import Path

from benchmarks.common import summary_line

TARGET = 2.0
CHUNK = 256

_PASS = r"""
import json, sys, torch
from types import SimpleNamespace

def hwm():
    for line in open("/proc/self/status"):
        if line.startswith("VmHWM:"):
            return int(line.split()[1]) / 1024

def rss():
    for line in open("/proc/self/status"):
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024

from align.distill import DistillTrainer
from align.modeling.loading import load_model, resolve_model_path
from trl.experimental.gold import GOLDTrainer

mode, length, out = sys.argv[1], int(sys.argv[2]), sys.argv[3]
torch.manual_seed(0)
path = resolve_model_path("builtin:smollm2-135m-instruct")
student, teacher = load_model(path, dtype="float32"), load_model(path, dtype="float32")
teacher.requires_grad_(False)
with torch.no_grad():  # a teacher that differs from the student, so the loss and its gradients are not ~0
    for p in teacher.parameters():
        p.add_(torch.randn_like(p) * 0.02 * p.std())
student.gradient_checkpointing_enable({"use_reentrant": False})  # as for long rows: layer activations recomputed
student.config.use_cache = False
student.train()  # checkpointing is active in training mode only (SmolLM2 has no dropout)
ids = torch.randint(0, student.config.vocab_size, (4, length))
labels = ids.clone()
labels[:, : length // 8] = -100
batch = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
for p in list(student.parameters()) + list(teacher.parameters()):  # make the (memory-mapped) weights resident
    p.data.sum()
base = rss()
with open("/proc/self/clear_refs", "w") as f:  # reset the high-water mark to what is resident now
    f.write("5")
if mode == "whole":
    s_logits = student(input_ids=ids, attention_mask=batch["attention_mask"]).logits
    with torch.no_grad():
        t_logits = teacher(input_ids=ids, attention_mask=batch["attention_mask"]).logits
    loss = GOLDTrainer.generalized_jsd_loss(s_logits[:, :-1], t_logits[:, :-1], labels[:, 1:], beta=1.0)
else:
    fake = SimpleNamespace(teacher_model=teacher, beta=1.0, temperature=1.0, teacher_prompts={},
                           args=SimpleNamespace(loss_chunk_tokens=int(mode)))
    fake._chunked_loss = lambda *a: DistillTrainer._chunked_loss(fake, *a)
    loss = DistillTrainer.compute_loss(fake, student, batch)
loss.backward()
grads = {n: p.grad for n, p in student.named_parameters() if p.grad is not None}
torch.save({k: grads[k] for k in sorted(grads)[:: max(1, len(grads) // 12)]}, out)
print(json.dumps({"peak_mib": hwm() - base, "loss": loss.item(), "models_mib": base}))
"""


def _pass(mode: str, length: int, grads_path: str) -> dict:
    root = Path(__file__).resolve().parents[2]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(root), os.environ.get("PYTHONPATH", "")])}
    out = subprocess.run(
        [sys.executable, "-c", _PASS, mode, str(length), grads_path], capture_output=True, text=True, env=env, cwd=root
    )
    if out.returncode != 0:
        raise RuntimeError(f"distill_memory {mode} pass failed:\n{out.stderr[-3000:]}")
    return json.loads(out.stdout.strip().splitlines()[-1])


def run(quick: bool = False) -> dict:
    import torch

    length = 512 if quick else 2048
    tmp = tempfile.mkdtemp(prefix="distill-mem-")
    whole = _pass("whole", length, f"{tmp}/whole.pt")
    ours = _pass(str(CHUNK), length, f"{tmp}/ours.pt")
    g_whole, g_ours = torch.load(f"{tmp}/whole.pt"), torch.load(f"{tmp}/ours.pt")
    rel = max(float((g_whole[k] - g_ours[k]).abs().max() / g_whole[k].abs().max().clamp(min=1e-30)) for k in g_whole)
    ratio = whole["peak_mib"] / max(ours["peak_mib"], 1e-9)
    rows = [
        {"pass": "whole logits (TRL)", "peak MiB above the models": round(whole["peak_mib"]), "loss": whole["loss"]},
        {
            "pass": f"chunked ({CHUNK} positions)",
            "peak MiB above the models": round(ours["peak_mib"]),
            "loss": ours["loss"],
        },
    ]
    return {
        "rows": rows,
        "length": length,
        "grad_max_rel_diff": rel,
        "loss_rel_diff": abs(ours["loss"] - whole["loss"]) / abs(whole["loss"]),
        "summary": [
            summary_line("distill_memory", "ours/whole", "peak-MiB", ratio, TARGET) + f" [grads equal to {rel:.1e}]"
        ],
    }
