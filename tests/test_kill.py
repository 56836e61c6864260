"""The kill tier: every stage, launched as users launch it (`python scripts/<stage>.py <recipe>`), SIGKILLed at a
random step after its first checkpoint, then re-run with the same command, ends with the uninterrupted run's
per-step losses (GRPO: losses and rewards), bitwise, in one process; preference generation, killed between batches,
ends with the uninterrupted run's rows, none twice and none lost.

The models and stage recipes are the micro chain's (the session fixture `micro` in conftest.py, shared with the
distributed tier). One uninterrupted reference run per stage; each stage's three runs take ~30-60 s on 2 cores.
A kill during a checkpoint write is covered in tests/test_resume.py (a torn save is skipped, the previous one
loads); SIGTERM (preemption) on one and two ranks there and in tests/test_distributed.py.

    python -m pytest tests/test_kill.py
"""

from __future__ import annotations

import json
import os
import random
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from align.checkpoint import is_complete, latest_checkpoint

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow]
MAX_STEPS, SAVE_STEPS = 6, 2

ENV = {"OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false", "WANDB_MODE": "offline", "HF_HUB_OFFLINE": "1",
       "HF_DATASETS_OFFLINE": "1", "TRANSFORMERS_OFFLINE": "1", "VLLM_CPU_KVCACHE_SPACE": "1", "PYTHONUNBUFFERED": "1"}

# How each stage says it finished a step on its console: the trainer's per-step log line (logging_steps 1), or
# the pretraining loop's progress bar.
TRAINER_STEP = re.compile(r"[{ ]'loss': ")
PRETRAIN_STEP = re.compile(r"pretrain:\s+\d+%\|[^|]*\|\s*(\d+)/\d+")


def _env() -> dict:
    env = {**os.environ, **ENV}
    env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(ROOT), env.get("PYTHONPATH")]))
    env.pop("SMOLALIGN_DEBUG", None)
    return env


def _run(cmd: list[str], timeout: int = 400) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return proc.stdout + proc.stderr


def _kill_at(cmd: list[str], step_seen, kill_at: int, timeout: int = 400) -> tuple[int, str]:
    """Start `cmd` in a session of its own, read its console as it comes (\\r or \\n ends a piece), SIGKILL the
    whole session once `step_seen(text)` (the steps finished so far) reaches `kill_at`; return (exit code,
    console)."""
    job = subprocess.Popen(cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                           start_new_session=True)
    console, piece = [], b""
    try:
        while True:
            ch = job.stdout.read(1)
            if not ch:
                break
            piece += ch
            if ch in (b"\n", b"\r"):
                console.append(piece.decode(errors="replace"))
                piece = b""
                if step_seen("".join(console)) >= kill_at:
                    os.killpg(job.pid, signal.SIGKILL)  # the launcher and every rank it started, as a node dies
                    break
        return job.wait(timeout=timeout), "".join(console)
    finally:
        if job.poll() is None:
            os.killpg(job.pid, signal.SIGKILL)
        job.stdout.close()


def _trainer_steps(console: str) -> int:
    return len(TRAINER_STEP.findall(console))


def _pretrain_steps(console: str) -> int:
    seen = [int(s) for s in PRETRAIN_STEP.findall(console)]
    return max(seen, default=0)


def _history(out: Path) -> list[dict]:
    """The trainer's per-step logs, as the last checkpoint holds them (the final step is saved)."""
    last = latest_checkpoint(str(out))
    assert last is not None, f"no checkpoint in {out}"
    return [h for h in json.loads((Path(last) / "trainer_state.json").read_text())["log_history"] if "loss" in h]


def _killed_then_resumed(cmd: list[str], out: Path, step_seen) -> int:
    """SIGKILL `cmd` at a random step after its first checkpoint, check what it left, re-run it to the end;
    return the step it resumed from."""
    kill_at = random.Random().randint(SAVE_STEPS + 1, MAX_STEPS - 1)
    code, console = _kill_at(cmd, step_seen, kill_at)
    assert code == -signal.SIGKILL, f"the run ended by itself (code {code}) before step {kill_at}:\n{console[-3000:]}"
    latest = latest_checkpoint(str(out))
    assert latest is not None and is_complete(latest), console[-3000:]
    resumed_from = int(re.search(r"(\d+)$", Path(latest).name).group(1))
    assert SAVE_STEPS <= resumed_from <= kill_at + 1
    _run(cmd)
    return resumed_from


# ----------------------------------------------------------------------------------------------- TRL stages


def _trl_args(out: Path) -> list[str]:
    return ["--output_dir", str(out), "--max_steps", str(MAX_STEPS), "--save_strategy", "steps", "--save_steps",
            str(SAVE_STEPS), "--save_total_limit", "2", "--logging_steps", "1", "--report_to", "none",
            "--disable_tqdm", "false"]


def _stage_command(micro: Path, stage: str, out: Path) -> list[str]:
    configs = micro / "configs"
    if stage == "sft":
        return [sys.executable, "scripts/sft.py", str(configs / "sft.yaml"), *_trl_args(out), "--eval_after", "false"]
    if stage == "apo":
        return [sys.executable, "scripts/dpo.py", str(configs / "apo.yaml"), *_trl_args(out),
                "--per_device_train_batch_size", "2"]
    if stage.startswith("grpo"):
        engine = stage.split("_")[1]
        extra = ["--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "2"]  # micro groups are all wrong:
        extra += ["--rollout_kwargs", "{kv_cache_gib: 0.25}"] if engine == "vllm" else []  # refills every step
        return [sys.executable, "scripts/grpo.py", str(configs / "grpo.yaml"), *_trl_args(out), "--rollout_backend",
                engine, "--eval_after", "false", *extra]
    if stage == "distill":
        return [sys.executable, "scripts/distill.py", str(ROOT / "recipes" / "tiny_distill.yaml"),
                "--model_name_or_path", str(micro / "midtrain"), "--teacher_model_name_or_path",
                str(micro / "sft_strong"), "--per_device_train_batch_size", "2", "--max_completion_length", "16",
                "--max_length", "128", "--eval_after", "false", "--dataset_args", "{num: 32, mode: mixed, seed: 0}",
                *_trl_args(out)]
    raise KeyError(stage)


TRL_STAGES = ["sft", "apo", "grpo_hf", pytest.param("grpo_vllm", marks=pytest.mark.vllm), "distill"]


@pytest.mark.parametrize("stage", TRL_STAGES)
def test_sigkill_at_a_random_step_then_rerun_gives_the_uninterrupted_run(micro, tmp_path, stage):
    if stage == "grpo_vllm":
        pytest.importorskip("vllm")
    _run(_stage_command(micro, stage, tmp_path / "whole"))
    want = _history(tmp_path / "whole")
    assert [h["step"] for h in want] == list(range(1, MAX_STEPS + 1))
    if stage.startswith("grpo"):  # the refill stream was used, so its state had to survive the kill
        assert max(h["dynamic_sampling/rounds"] for h in want) == 2

    out = tmp_path / "killed"
    resumed_from = _killed_then_resumed(_stage_command(micro, stage, out), out, _trainer_steps)
    got = _history(out)
    assert [h["step"] for h in got] == list(range(1, MAX_STEPS + 1))
    keys = ["loss"] + (["reward", "reward_std"] if stage.startswith("grpo") else [])
    for w, g in zip(want, got):
        assert {k: g[k] for k in keys} == {k: w[k] for k in keys}, (f"resumed from step {resumed_from}", w, g)
    assert not list(out.glob(".tmp-*"))  # no staging left behind by the kill


# ----------------------------------------------------------------------------------------------- pretraining


def test_pretraining_sigkill_then_rerun_gives_the_uninterrupted_losses(micro, tmp_path):
    def command(out: Path) -> list[str]:
        return [sys.executable, "scripts/run_pretrain.py", str(micro / "configs" / "pretrain_small.yaml"),
                "--output_dir", str(out), "--max_steps", str(MAX_STEPS), "--save_steps", str(SAVE_STEPS),
                "--mixed_precision", "no", "--resume_from_checkpoint", "auto"]

    def losses(out: Path) -> list[float]:
        return [h["loss"] for h in json.loads((out / "metrics.json").read_text())["history"]]

    _run(command(tmp_path / "whole"))
    out = tmp_path / "killed"
    kill_at = random.Random().randint(SAVE_STEPS + 1, MAX_STEPS - 1)
    code, console = _kill_at(command(out), _pretrain_steps, kill_at)
    assert code == -signal.SIGKILL, console[-3000:]
    assert not (out / "metrics.json").exists()
    rerun = _run(command(out))
    assert "resumed from" in rerun
    assert len(losses(out)) == MAX_STEPS and losses(out) == losses(tmp_path / "whole")


# ----------------------------------------------------------------------------------------------- preference pairs


def test_preference_generation_sigkill_then_rerun_writes_every_row_once(micro, tmp_path):
    def command(out: Path) -> list[str]:
        return [sys.executable, "scripts/generate_preferences.py", str(micro / "configs" / "preferences.yaml"),
                "--output_dir", str(out), "--batch_size", "4"]

    def rows(out: Path, split: str) -> list[dict]:
        return [json.loads(x) for x in (out / f"{split}.jsonl").read_text().splitlines()]

    _run(command(tmp_path / "whole"))
    out = tmp_path / "killed"
    progress = out / ".work" / "train.progress.jsonl"
    kill_after = random.Random().randint(1, 3)  # batches of 4 of the 24 train prompts

    def batches_done(_console: str) -> int:
        return len(progress.read_text().splitlines()) if progress.exists() else 0

    code, console = _kill_at(command(out), batches_done, kill_after)
    assert code == -signal.SIGKILL, console[-3000:]
    assert not (out / "train.jsonl").exists()
    _run(command(out))
    for split in ("train", "test"):
        want, got = rows(tmp_path / "whole", split), rows(out, split)
        assert len({r["id"] for r in got}) == len(got)  # none twice
        assert got == want, split  # none lost, each as the uninterrupted run made it


# ----------------------------------------------------------------------------------------------- two ranks


def _launched(cmd: list[str], config: str) -> list[str]:
    """`python scripts/x.py ...` as `accelerate launch --config_file <config>.yaml --num_processes 2 ...`."""
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    return [sys.executable, "-m", "accelerate.commands.launch", "--config_file",
            str(ROOT / "recipes" / "accelerate_configs" / f"{config}.yaml"), "--num_processes", "2",
            "--main_process_port", str(port), *cmd[1:]]


@pytest.mark.distributed
@pytest.mark.parametrize("stage", ["sft", "apo", "grpo_hf", "distill"])
def test_sigkill_on_two_zero3_ranks_then_rerun_gives_the_uninterrupted_run(micro, tmp_path, stage):
    """The same on 2 DeepSpeed ZeRO-3 ranks: the launcher and both ranks killed at once (a node lost), the same
    `accelerate launch` command re-run; per-step losses (GRPO: and rewards) within 1e-6 of the uninterrupted run."""
    _run(_launched(_stage_command(micro, stage, tmp_path / "whole"), "zero3"))
    want = _history(tmp_path / "whole")
    out = tmp_path / "killed"
    kill_at = random.Random().randint(SAVE_STEPS + 1, MAX_STEPS - 1)
    code, console = _kill_at(_launched(_stage_command(micro, stage, out), "zero3"), _trainer_steps, kill_at)
    assert code == -signal.SIGKILL, console[-3000:]
    latest = latest_checkpoint(str(out))
    assert latest is not None and is_complete(latest), console[-3000:]
    assert sorted(p.name for p in Path(latest).glob("smolalign_rank*.json")) == (
        ["smolalign_rank0.json", "smolalign_rank1.json"] if stage in ("grpo_hf", "distill") else [])
    _run(_launched(_stage_command(micro, stage, out), "zero3"))
    got = _history(out)
    assert [h["step"] for h in got] == [h["step"] for h in want] == list(range(1, MAX_STEPS + 1))
    keys = ["loss"] + (["reward", "reward_std"] if stage.startswith("grpo") else [])
    for w, g in zip(want, got):
        for k in keys:
            assert g[k] == pytest.approx(w[k], rel=1e-6, abs=1e-6), (k, w, g)


@pytest.mark.distributed
def test_pretraining_sigkill_on_two_zero2_ranks_then_rerun_gives_the_uninterrupted_losses(micro, tmp_path):
    def command(out: Path) -> list[str]:
        return _launched([sys.executable, "scripts/run_pretrain.py", str(micro / "configs" / "pretrain_small.yaml"),
                          "--output_dir", str(out), "--max_steps", str(MAX_STEPS), "--save_steps", str(SAVE_STEPS),
                          "--micro_batch_size", "2", "--mixed_precision", "no", "--resume_from_checkpoint", "auto"],
                         "zero2")

    def losses(out: Path) -> list[float]:
        return [h["loss"] for h in json.loads((out / "metrics.json").read_text())["history"]]

    _run(command(tmp_path / "whole"))
    out = tmp_path / "killed"
    code, console = _kill_at(command(out), _pretrain_steps, random.Random().randint(SAVE_STEPS + 1, MAX_STEPS - 1))
    assert code == -signal.SIGKILL, console[-3000:]
    _run(command(out))
    assert losses(out) == pytest.approx(losses(tmp_path / "whole"), rel=1e-6, abs=1e-6)
