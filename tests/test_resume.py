"""align/runtime/checkpoint.py: atomic checkpoints, auto-resume that skips torn saves, SIGKILL-and-resume loss parity,
the non-finite guard (skip / stop with a checkpoint) and the engine resync after a resume."""

from __future__ import annotations

import json
import math
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from align.runtime.checkpoint import (
    COMPLETE_MARKER,
    install,
    is_complete,
    latest_checkpoint,
    list_checkpoints,
    resume_checkpoint,
    rotate,
    write_marker,
)
from align.runtime.nonfinite import NonFiniteError

REPO = Path(__file__).resolve().parents[1]

# The training job the kill test launches: a real TRL SFTTrainer with our checkpointing, printing each step.
DRIVER = r"""
import json, os, sys
import torch
torch.set_num_threads(1)
import datasets, trl
from transformers import AutoModelForCausalLM, AutoTokenizer, TrainerCallback
from align.runtime.checkpoint import exit_if_preempted, install, resume_checkpoint

model_dir, data, out, max_steps = sys.argv[1], sys.argv[2], sys.argv[3], int(sys.argv[4])

class Progress(TrainerCallback):
    def on_step_end(self, args, state, control, **kw):
        print(f"STEP {state.global_step}", flush=True)

args = trl.SFTConfig(output_dir=out, max_steps=max_steps, per_device_train_batch_size=4, learning_rate=3e-3,
                     lr_scheduler_type="cosine", warmup_steps=2, logging_steps=1, save_strategy="steps",
                     save_steps=3, save_total_limit=2, report_to="none", seed=0, use_cpu=True, bf16=False,
                     gradient_checkpointing=False, max_length=64, dataloader_num_workers=0, disable_tqdm=True)
tok = AutoTokenizer.from_pretrained(model_dir)
model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
ds = datasets.load_dataset("json", data_files=data, split="train")
trainer = trl.SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok, callbacks=[Progress()])
install(trainer)
resume = resume_checkpoint(args)
print(f"RESUME {resume}", flush=True)
trainer.train(resume_from_checkpoint=resume)
exit_if_preempted(trainer)
with open(os.path.join(out, "log_history.json"), "w") as f:
    json.dump(trainer.state.log_history, f)
"""


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_model):
    """A tiny random Llama (with dropout, so RNG restore matters) + our tokenizer, and a text SFT dataset."""
    from data_gen.tasks import assistant_text, make_tasks
    from pretrain.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("resume")
    rows = make_tasks(["arithmetic", "compare", "count_items"], num=40, split="train", seed=0)
    texts = [f"{r['prompt']}\n{assistant_text(r, 'no_think')}" for r in rows]
    tok = train_tokenizer(texts * 4, vocab_size=300)
    model = tiny_model(root / "model", tok, seed=0, max_position_embeddings=128, attention_dropout=0.1)
    (root / "data.jsonl").write_text("".join(json.dumps({"text": t}) + "\n" for t in texts))
    return {"root": root, "model": model, "data": str(root / "data.jsonl"), "tok": tok}


def _driver(tiny) -> str:
    path = tiny["root"] / "driver.py"
    path.write_text(DRIVER)
    return str(path)


def _launch(tiny, out, max_steps) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    return subprocess.Popen(
        [sys.executable, _driver(tiny), tiny["model"], tiny["data"], str(out), str(max_steps)],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env=env,
        cwd=REPO,
    )


def _losses(out) -> dict[int, float]:
    history = json.loads((Path(out) / "log_history.json").read_text())
    return {h["step"]: h["loss"] for h in history if "loss" in h}


@pytest.mark.slow
def test_sigkill_at_a_random_step_then_resume_gives_the_uninterrupted_losses(tiny, tmp_path):
    max_steps = 12  # 40 rows / 4 per batch = 10 steps an epoch: the resumed run crosses an epoch boundary
    ref = _launch(tiny, tmp_path / "ref", max_steps)
    out_ref, _ = ref.communicate(timeout=300)
    assert ref.returncode == 0, out_ref[-3000:]

    kill_at = random.Random().randint(4, max_steps - 2)  # after the first checkpoint (step 3)
    out = tmp_path / "killed"
    job = _launch(tiny, out, max_steps)
    seen = []
    for line in job.stdout:
        if m := re.search(r"STEP (\d+)", line):
            seen.append(int(m.group(1)))
            if seen[-1] >= kill_at:
                job.send_signal(signal.SIGKILL)
                break
    job.wait(timeout=60)
    assert job.returncode == -signal.SIGKILL, f"job ended by itself at step {seen[-1:]}"
    assert not (out / "log_history.json").exists()
    latest = latest_checkpoint(out)
    assert latest is not None and is_complete(latest)
    resumed_from = int(Path(latest).name.split("-")[1])
    assert 3 <= resumed_from <= kill_at

    again = _launch(tiny, out, max_steps)
    log, _ = again.communicate(timeout=300)
    assert again.returncode == 0, log[-3000:]
    assert f"RESUME {latest}" in log  # it did resume, from the latest complete checkpoint
    assert [int(s) for s in re.findall(r"STEP (\d+)", log)][0] == resumed_from + 1

    want, got = _losses(tmp_path / "ref"), _losses(out)
    assert sorted(got) == sorted(want) == list(range(1, max_steps + 1))
    for step in want:
        assert math.isclose(got[step], want[step], rel_tol=1e-5, abs_tol=1e-6), (step, got[step], want[step])
    # keep the last 2 complete checkpoints, no staging leftovers
    names = [p.name for p in list_checkpoints(out, complete_only=False)]
    assert names == [f"checkpoint-{s}" for s in (9, 12)], names  # the final step is saved too
    assert not list(out.glob(".tmp-*"))


@pytest.mark.slow
def test_sigterm_saves_the_step_it_stops_at_and_resumes_to_the_uninterrupted_losses_twice(tiny, tmp_path):
    """Preemption (Slurm's SIGTERM, scancel, the pipeline stopping a stage): the run finishes its step, saves a
    checkpoint of that step, exits with PREEMPTED_EXIT_CODE; the same command resumes there. SIGTERM once before the
    first periodic checkpoint (step 3) and once more in the resumed run, then a last run to the end: the per-step
    losses equal an uninterrupted run's."""
    from align.runtime.checkpoint import PREEMPTED_EXIT_CODE

    max_steps = 10
    ref = _launch(tiny, tmp_path / "ref", max_steps)
    out_ref, _ = ref.communicate(timeout=300)
    assert ref.returncode == 0, out_ref[-3000:]
    out = tmp_path / "preempted"
    first_stop = random.Random().randint(1, 2)  # before the first periodic checkpoint
    stops = []
    for stop_at in (first_stop, random.Random().randint(first_stop + 2, max_steps - 2)):
        job = _launch(tiny, out, max_steps)
        seen, log = [], []
        for line in job.stdout:
            log.append(line)
            if (m := re.search(r"STEP (\d+)", line)) and int(m.group(1)) >= stop_at and not seen:
                seen.append(int(m.group(1)))
                job.send_signal(signal.SIGTERM)
        job.wait(timeout=120)
        assert job.returncode == PREEMPTED_EXIT_CODE, "".join(log)[-3000:]
        latest = latest_checkpoint(out)
        assert latest is not None and is_complete(latest), "".join(log)[-3000:]
        stopped = int(Path(latest).name.split("-")[1])
        assert seen[0] <= stopped <= seen[0] + 1  # the step it was in when the signal came
        assert not (out / "log_history.json").exists()
        stops.append(stopped)
    last = _launch(tiny, out, max_steps)
    log, _ = last.communicate(timeout=300)
    assert last.returncode == 0, log[-3000:]
    assert [int(s) for s in re.findall(r"STEP (\d+)", log)][0] == stops[-1] + 1
    want, got = _losses(tmp_path / "ref"), _losses(out)
    assert sorted(got) == sorted(want) == list(range(1, max_steps + 1))
    for step in want:
        assert math.isclose(got[step], want[step], rel_tol=1e-5, abs_tol=1e-6), (step, got[step], want[step])


# ----------------------------------------------------------------------------- in-process: the helpers


def _fake_checkpoint(root: Path, step: int, complete: bool) -> Path:
    p = root / f"checkpoint-{step}"
    p.mkdir(parents=True)
    (p / "trainer_state.json").write_text(json.dumps({"global_step": step}))
    if complete:
        write_marker(str(p), step)
    return p


def test_latest_checkpoint_skips_partial_saves(tmp_path):
    assert latest_checkpoint(tmp_path / "nothing") is None
    _fake_checkpoint(tmp_path, 5, True)
    _fake_checkpoint(tmp_path, 10, True)
    _fake_checkpoint(tmp_path, 15, False)  # killed mid-save: no marker
    (tmp_path / ".tmp-checkpoint-20" / "checkpoint-20").mkdir(parents=True)
    assert latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-10")
    assert [p.name for p in list_checkpoints(tmp_path)] == ["checkpoint-5", "checkpoint-10"]
    marker = json.loads((tmp_path / "checkpoint-10" / COMPLETE_MARKER).read_text())
    assert marker["step"] == 10 and "trainer_state.json" in marker["files"]


@pytest.mark.parametrize(
    "value, expected",
    [
        (None, "checkpoint-10"),
        ("auto", "checkpoint-10"),
        (True, "checkpoint-10"),
        ("no", None),
        ("false", None),
        ("checkpoint-5", "checkpoint-5"),
    ],
)
def test_resume_checkpoint_semantics(tmp_path, value, expected):
    from types import SimpleNamespace

    _fake_checkpoint(tmp_path, 5, True)
    _fake_checkpoint(tmp_path, 10, True)
    _fake_checkpoint(tmp_path, 12, False)
    if value == "checkpoint-5":
        value = str(tmp_path / value)
    got = resume_checkpoint(SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=value))
    assert got == (str(tmp_path / expected) if expected else None)


def test_resume_from_a_partial_or_missing_checkpoint_is_refused(tmp_path):
    from types import SimpleNamespace

    partial = _fake_checkpoint(tmp_path, 12, False)
    with pytest.raises(ValueError, match="partial checkpoint"):
        resume_checkpoint(SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=str(partial)))
    with pytest.raises(FileNotFoundError, match="does not exist"):
        resume_checkpoint(SimpleNamespace(output_dir=str(tmp_path), resume_from_checkpoint=str(tmp_path / "x")))


def test_rotate_keeps_the_last_k_and_the_best(tmp_path):
    for s in (2, 4, 6, 8):
        _fake_checkpoint(tmp_path, s, True)
    _fake_checkpoint(tmp_path, 10, False)
    rotate(str(tmp_path), 2, best=str(tmp_path / "checkpoint-2"))
    assert sorted(p.name for p in tmp_path.iterdir()) == [
        "checkpoint-10",
        "checkpoint-2",
        "checkpoint-6",
        "checkpoint-8",
    ]


# ----------------------------------------------------------------------------- in-process: a real Trainer


class _Poison(torch.utils.data.Dataset):
    """Rows of a tiny LM dataset; the rows in `bad` get a NaN-making flag the model reads."""

    def __init__(self, n: int, bad: set[int]):
        self.n, self.bad = n, bad

    def __len__(self):
        return self.n

    def __getitem__(self, i):
        g = torch.Generator().manual_seed(i)
        ids = torch.randint(3, 50, (12,), generator=g)
        return {"input_ids": ids, "labels": ids.clone(), "poison": torch.tensor(float(i in self.bad))}


class _PoisonableLM(torch.nn.Module):
    """A tiny causal LM whose loss becomes NaN on poisoned rows (a stand-in for an overflow)."""

    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.emb = torch.nn.Embedding(50, 16)
        self.head = torch.nn.Linear(16, 50)

    def forward(self, input_ids, labels, poison):
        logits = self.head(self.emb(input_ids))
        loss = torch.nn.functional.cross_entropy(logits[:, :-1].reshape(-1, 50), labels[:, 1:].reshape(-1))
        return {
            "loss": loss * torch.where(poison.any(), torch.tensor(float("nan")), torch.tensor(1.0)),
            "logits": logits,
        }


def _trainer(tmp_path, bad: set[int], policy: str, callbacks=(), **kw):
    from types import SimpleNamespace

    from transformers import Trainer, TrainingArguments

    args = TrainingArguments(
        output_dir=str(tmp_path),
        per_device_train_batch_size=1,
        max_steps=8,
        learning_rate=1e-2,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        use_cpu=True,
        seed=0,
        data_seed=0,
        remove_unused_columns=False,
        train_sampling_strategy="sequential",
        **kw,
    )
    trainer = Trainer(model=_PoisonableLM(), args=args, train_dataset=_Poison(8, bad), callbacks=list(callbacks))
    guard = install(trainer, SimpleNamespace(on_nonfinite=policy, grad_explosion_factor=0))
    return trainer, guard


def test_nonfinite_skip_drops_the_update_and_trains_on(tmp_path):
    trainer, guard = _trainer(tmp_path, bad={3}, policy="skip")
    before = {}
    from transformers import TrainerCallback

    class Watch(TrainerCallback):
        def on_step_begin(self, args, state, control, **kw):
            before[state.global_step + 1] = {k: v.clone() for k, v in trainer.model.state_dict().items()}

    trainer.add_callback(Watch())
    trainer.train()
    assert [(e["step"], e["batch"]) for e in guard.events] == [(4, 3)]
    assert "non-finite loss" in guard.events[0]["reason"]
    after_4 = before[5]
    assert all(torch.equal(after_4[k], before[4][k]) for k in after_4)  # step 4's update was dropped
    assert not all(torch.equal(before[4][k], before[3][k]) for k in after_4)  # normal steps do update
    assert all(torch.isfinite(v).all() for v in trainer.model.state_dict().values())
    assert trainer.state.global_step == 8


def test_nonfinite_stop_saves_a_checkpoint_and_names_the_step(tmp_path):
    trainer, guard = _trainer(tmp_path, bad={5}, policy="stop")
    with pytest.raises(
        NonFiniteError,
        match=r"non-finite loss nan at step 6 \(batch 5\).*checkpoint saved at .*"
        r"checkpoint-6",
    ):
        trainer.train()
    assert latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-6")
    state = json.loads((tmp_path / "checkpoint-6" / "trainer_state.json").read_text())
    assert state["global_step"] == 6
    from safetensors.torch import load_file

    saved = load_file(tmp_path / "checkpoint-6" / "model.safetensors")
    assert all(torch.isfinite(v).all() for v in saved.values())


def test_gradient_explosion_is_detected():
    from align.runtime.nonfinite import NonFiniteGuard

    guard = object.__new__(NonFiniteGuard)
    guard.factor, guard.window, guard.norms, guard.bad_loss = 50.0, 20, [1.0] * 12, None
    guard.grad_norm = 49.0
    assert guard._reason() is None
    guard.grad_norm = 51.0
    assert "gradient explosion (norm 51 > 50 x recent median 1)" in guard._reason()
    guard.grad_norm = float("inf")
    assert "non-finite gradient norm" in guard._reason()


def test_resume_syncs_the_engine_and_restores_the_step(tmp_path):
    """A trainer with a rollout engine (GRPO's contract: sync_engine()) gets it called once after a resume."""
    from transformers import Trainer

    calls = []

    class EngineTrainer(Trainer):
        def sync_engine(self):
            calls.append(self.state.global_step)

    from transformers import TrainingArguments

    def make(max_steps):
        args = TrainingArguments(
            output_dir=str(tmp_path),
            per_device_train_batch_size=1,
            max_steps=max_steps,
            learning_rate=1e-2,
            save_strategy="steps",
            save_steps=2,
            report_to="none",
            use_cpu=True,
            seed=0,
            remove_unused_columns=False,
        )
        t = EngineTrainer(model=_PoisonableLM(), args=args, train_dataset=_Poison(8, set()))
        install(t)
        return t

    make(4).train(resume_from_checkpoint=resume_checkpoint(make(4).args))
    assert calls == [] and latest_checkpoint(tmp_path) == str(tmp_path / "checkpoint-4")
    t = make(6)
    t.train(resume_from_checkpoint=resume_checkpoint(t.args))
    assert calls == [4] and t.state.global_step == 6
    assert not list(tmp_path.glob(".tmp-*"))
