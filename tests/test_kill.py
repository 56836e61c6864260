"""The kill tier: every stage, launched as users launch it (`python scripts/<stage>.py <recipe>`, or `accelerate
launch` on 2 ranks), stopped at a random step and re-run with the same command, ends with the uninterrupted run's
per-step losses (GRPO: losses and rewards) — bitwise in one process, within 1e-6 on 2 ranks:
- SIGKILL after the first checkpoint (a lost node: the launcher and every rank at once);
- SIGTERM (preemption) before the first periodic checkpoint: the stage saves the step it is in and exits with
  PREEMPTED_EXIT_CODE. (A second SIGTERM in the resumed run is no longer sent: the resumed run takes the SIGKILL.)
Each stage takes both in one run (SIGTERM, then SIGKILL in the resumed run, then the finishing run), in one process
and on 2 ranks: three process starts per stage and rank count beside its reference run, where a run per signal took
five. GRPO with vLLM on 2 ranks takes SIGKILL alone.
Preference generation, stopped between batches either way, ends with the uninterrupted run's rows, none twice and
none lost. A kill during a checkpoint write: tests/test_resume.py (a torn save is skipped, the previous one loads).

The models and stage recipes are the micro chain's (the session fixture `micro` in conftest.py, shared with the
distributed tier); one uninterrupted reference run per stage and rank count serves both signals.

    python -m pytest tests/test_kill.py                      # ~10 min on 2 cores
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
from launching import free_port
from launching import launch_env as _env

from align.runtime.checkpoint import is_complete, latest_checkpoint

ROOT = Path(__file__).resolve().parents[1]
pytestmark = [pytest.mark.slow]
MAX_STEPS, SAVE_STEPS = 6, 2

# How each stage says it finished a step on its console: the trainer's per-step log line (logging_steps 1), or
# the pretraining loop's progress bar.
TRAINER_STEP = re.compile(r"[{ ]'loss': ")
PRETRAIN_STEP = re.compile(r"pretrain:\s+\d+%\|[^|]*\|\s*(\d+)/\d+")


def _run(cmd: list[str], timeout: int = 400) -> str:
    proc = subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    return proc.stdout + proc.stderr


def _signal_at(cmd: list[str], step_seen, at: int, sig: int, timeout: int = 400) -> tuple[int, str]:
    """Start `cmd` in a session of its own, read its console as it comes (\\r or \\n ends a piece), send `sig` to
    the whole session (the launcher and every rank, as a lost node or Slurm's notice reaches them) once
    `step_seen(text)` (the steps finished so far) reaches `at`; return (exit code, console)."""
    import select

    job = subprocess.Popen(
        cmd, cwd=ROOT, env=_env(), stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True
    )
    fd = job.stdout.fileno()
    console, piece, sent = [], b"", False

    def reached() -> bool:
        return not sent and step_seen("".join(console)) >= at

    try:
        while True:
            ready, _, _ = select.select([fd], [], [], 0.2)
            if not ready:  # quiet: progress kept in files (preference generation's ranks) is polled all the same
                if reached():
                    os.killpg(job.pid, sig)
                    sent = True
                    if sig == signal.SIGKILL:
                        break
                continue
            chunk = os.read(fd, 4096)
            if not chunk:
                break
            for ch in chunk:
                piece += bytes([ch])
                if ch in b"\n\r":
                    console.append(piece.decode(errors="replace"))
                    piece = b""
                    if reached():
                        os.killpg(job.pid, sig)
                        sent = True
            if sent and sig == signal.SIGKILL:
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


# ----------------------------------------------------------------------------------------------- the stages


def _trl_args(out: Path) -> list[str]:
    return [
        "--output_dir",
        str(out),
        "--max_steps",
        str(MAX_STEPS),
        "--save_strategy",
        "steps",
        "--save_steps",
        str(SAVE_STEPS),
        "--save_total_limit",
        "2",
        "--logging_steps",
        "1",
        "--report_to",
        "none",
        "--disable_tqdm",
        "false",
    ]


def _command(micro: Path, stage: str, out: Path) -> list[str]:
    """The stage's command as a user runs it in one process (`_launched` makes it an accelerate launch)."""
    configs = micro / "configs"
    if stage == "pretrain":
        return [
            sys.executable,
            "scripts/run_pretrain.py",
            str(configs / "pretrain_small.yaml"),
            "--output_dir",
            str(out),
            "--max_steps",
            str(MAX_STEPS),
            "--save_steps",
            str(SAVE_STEPS),
            "--micro_batch_size",
            "2",
            "--mixed_precision",
            "no",
            "--resume_from_checkpoint",
            "auto",
        ]
    if stage == "sft":
        return [sys.executable, "scripts/sft.py", str(configs / "sft.yaml"), *_trl_args(out), "--eval_after", "false"]
    if stage == "apo":
        return [
            sys.executable,
            "scripts/dpo.py",
            str(configs / "apo.yaml"),
            *_trl_args(out),
            "--per_device_train_batch_size",
            "2",
        ]
    if stage.startswith("grpo"):
        engine = stage.split("_")[1]
        extra = ["--dynamic_sampling", "true", "--dynamic_sampling_max_rounds", "2"]  # micro groups are all wrong:
        extra += ["--rollout_kwargs", "{kv_cache_gib: 0.25}"] if engine == "vllm" else []  # refills every step
        return [
            sys.executable,
            "scripts/grpo.py",
            str(configs / "grpo.yaml"),
            *_trl_args(out),
            "--rollout_backend",
            engine,
            "--eval_after",
            "false",
            *extra,
        ]
    if stage == "distill":
        return [
            sys.executable,
            "scripts/distill.py",
            str(ROOT / "recipes" / "tiny/distill.yaml"),
            "--model_name_or_path",
            str(micro / "pretrain_reasoning"),
            "--teacher_model_name_or_path",
            str(micro / "sft_strong"),
            "--per_device_train_batch_size",
            "2",
            "--max_completion_length",
            "16",
            "--max_length",
            "128",
            "--eval_after",
            "false",
            "--dataset_args",
            "{num: 32, mode: mixed, seed: 0}",
            *_trl_args(out),
        ]
    raise KeyError(stage)


def _launched(cmd: list[str], config: str) -> list[str]:
    """`python scripts/x.py ...` as `accelerate launch --config_file <config>.yaml --num_processes 2 ...`."""
    return [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(ROOT / "recipes" / "accelerate" / f"{config}.yaml"),
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
        *cmd[1:],
    ]


def _stage_command(micro: Path, stage: str, out: Path, ranks: int) -> list[str]:
    cmd = _command(micro, stage, out)
    return cmd if ranks == 1 else _launched(cmd, "zero2" if stage == "pretrain" else "zero3")


def _steps_seen(stage: str, resumed_at: int = 0):
    """The global step a run has finished, from its console (a resumed trainer logs only the steps it runs)."""
    if stage == "pretrain":
        return _pretrain_steps  # the bar starts at the resumed step
    return lambda console: resumed_at + _trainer_steps(console)


def _records(stage: str, out: Path) -> list[dict]:
    """Per step: the loss (GRPO: and the rewards), from the final metrics (pretraining) or the last checkpoint."""
    if stage == "pretrain":
        return [
            {"step": h["step"], "loss": h["loss"]} for h in json.loads((out / "metrics.json").read_text())["history"]
        ]
    keys = ["step", "loss"] + (["reward", "reward_std"] if stage.startswith("grpo") else [])
    return [{k: h[k] for k in keys} for h in _history(out)]


def _same_run(stage: str, got: list[dict], want: list[dict], ranks: int, what: str) -> None:
    assert [r["step"] for r in got] == [r["step"] for r in want] == list(range(1, MAX_STEPS + 1)), what
    for w, g in zip(want, got):
        if ranks == 1:  # bitwise
            assert g == w, (what, w, g)
        else:
            assert g == pytest.approx(w, rel=1e-6, abs=1e-6), (what, w, g)


@pytest.fixture(scope="module")
def reference(micro, tmp_path_factory):
    """One uninterrupted run per (stage, ranks), shared by the kill and the SIGTERM tests."""
    done: dict[tuple[str, int], list[dict]] = {}

    def get(stage: str, ranks: int) -> list[dict]:
        if (stage, ranks) not in done:
            out = tmp_path_factory.mktemp(f"whole_{stage}_{ranks}")
            _run(_stage_command(micro, stage, out, ranks))
            done[stage, ranks] = _records(stage, out)
            get.dirs[stage, ranks] = out
            if stage.startswith("grpo"):  # the refill stream was used, so its state has to survive a stop
                rounds = [h["dynamic_sampling/rounds"] for h in _history(out) if "dynamic_sampling/rounds" in h]
                assert max(rounds) == 2
        return done[stage, ranks]

    get.dirs = {}
    return get


STAGES = ["pretrain", "sft", "apo", "grpo_hf", pytest.param("grpo_vllm", marks=pytest.mark.vllm), "distill"]


def _needs(stage: str) -> None:
    if stage == "grpo_vllm":
        pytest.importorskip("vllm")


# ----------------------------------------------------------------------------------------------- SIGKILL


def _killed_at(cmd: list[str], out: Path, stage: str, ranks: int, kill_at: int, resumed_at: int = 0) -> int:
    """SIGKILL the run (launcher and ranks at once) once it finished step `kill_at`; the newest checkpoint is
    complete, with the sampler's state of every rank. Returns the step it holds."""
    code, console = _signal_at(cmd, _steps_seen(stage, resumed_at), kill_at, signal.SIGKILL)
    assert code == -signal.SIGKILL, f"the run ended by itself (code {code}) before step {kill_at}:\n{console[-3000:]}"
    latest = latest_checkpoint(str(out))
    assert latest is not None and is_complete(latest), console[-3000:]
    held = int(re.search(r"(\d+)$", Path(latest).name).group(1))
    assert max(SAVE_STEPS, resumed_at) <= held <= kill_at + 1, (resumed_at, kill_at, held)
    if stage in ("grpo_hf", "grpo_vllm", "distill"):  # the sampler's state, one file per rank
        assert sorted(p.name for p in Path(latest).glob("smolalign_rank*.json")) == [
            f"smolalign_rank{r}.json" for r in range(ranks)
        ]
    return held


def _rerun_after_a_kill(cmd: list[str], out: Path, stage: str) -> None:
    rerun = _run(cmd)
    if stage == "pretrain":
        assert "resumed from" in rerun and not list((out / "checkpoints").glob(".tmp-*"))
    else:
        assert not list(out.glob(".tmp-*"))  # no staging left behind by the kill


def _kill_and_rerun(micro, reference, tmp_path, stage: str, ranks: int) -> None:
    _needs(stage)
    want = reference(stage, ranks)
    out = tmp_path / "killed"
    cmd = _stage_command(micro, stage, out, ranks)
    kill_at = random.Random().randint(SAVE_STEPS + 1, MAX_STEPS - 1)
    resumed_from = _killed_at(cmd, out, stage, ranks, kill_at)
    _rerun_after_a_kill(cmd, out, stage)
    _same_run(stage, _records(stage, out), want, ranks, f"killed at step {kill_at}, resumed from {resumed_from}")


@pytest.mark.distributed
@pytest.mark.vllm
def test_sigkill_on_two_ranks_with_vllm_then_rerun_gives_the_uninterrupted_run(micro, reference, tmp_path):
    """GRPO generating with vLLM on 2 ranks: the launcher and both ranks killed at once (a node lost), the same
    `accelerate launch` command re-run: per-step losses and rewards within 1e-6 of the uninterrupted run's. (The
    other stages take SIGTERM then SIGKILL on 2 ranks below.)"""
    _kill_and_rerun(micro, reference, tmp_path, "grpo_vllm", ranks=2)


@pytest.mark.parametrize("stage", ["sft", "apo", "grpo_hf"])
def test_rerunning_a_finished_run_trains_nothing(micro, reference, stage):
    """A run killed after its final checkpoint (in the final save or evaluation) is re-run: it resumes at its last
    step and must not train past it (the HF Trainer's loop takes a step before it checks max_steps)."""
    want = reference(stage, 1)
    out = reference.dirs[stage, 1]
    final = (out / "model.safetensors").read_bytes()
    _run(_stage_command(micro, stage, out, 1))  # (SFT's 6 steps end an epoch: HF's loop would not step there)
    assert (out / "model.safetensors").read_bytes() == final
    assert sorted(p.name for p in out.glob("checkpoint-*")) == [
        f"checkpoint-{MAX_STEPS - SAVE_STEPS}",
        f"checkpoint-{MAX_STEPS}",
    ]
    assert _records(stage, out) == want


# ----------------------------------------------------------------------------------------------- SIGTERM


def _stopped_then_killed_then_finished(micro, reference, tmp_path, stage: str, ranks: int) -> None:
    """Both signals in one run: SIGTERM before the first periodic checkpoint (the stage saves the step it is in and
    exits: PREEMPTED_EXIT_CODE in one process, a failure of the launcher's own on 2 ranks), then SIGKILL in the
    resumed run at a random later step (the rerun resumes from the newest complete checkpoint), then the same
    command finishes."""
    from align.runtime.checkpoint import PREEMPTED_EXIT_CODE

    _needs(stage)
    want = reference(stage, ranks)
    out = tmp_path / "stopped"
    cmd = _stage_command(micro, stage, out, ranks)
    code, console = _signal_at(cmd, _steps_seen(stage), 1, signal.SIGTERM)
    assert code == PREEMPTED_EXIT_CODE if ranks == 1 else code != 0, (code, console[-3000:])
    latest = latest_checkpoint(str(out))
    assert latest is not None and is_complete(latest), console[-3000:]
    stopped = int(re.search(r"(\d+)$", Path(latest).name).group(1))
    assert stopped in (1, 2), stopped  # the step it was in when the signal came
    kill_at = random.Random().randint(SAVE_STEPS + 1, MAX_STEPS - 1)  # a step past the SIGTERM checkpoint
    held = _killed_at(cmd, out, stage, ranks, kill_at, resumed_at=stopped)
    _rerun_after_a_kill(cmd, out, stage)
    _same_run(
        stage, _records(stage, out), want, ranks, f"stopped at step {stopped}, killed at {kill_at} (held {held})"
    )


@pytest.mark.parametrize("stage", STAGES)
def test_sigterm_then_sigkill_then_rerun_gives_the_uninterrupted_run_bitwise(micro, reference, tmp_path, stage):
    """One process: SIGTERM, then SIGKILL in the resumed run, then the same command finishes: every step's loss
    (GRPO: and rewards) bitwise the uninterrupted run's."""
    _stopped_then_killed_then_finished(micro, reference, tmp_path, stage, ranks=1)


@pytest.mark.distributed
@pytest.mark.parametrize("stage", ["pretrain", "sft", "apo", "grpo_hf", "distill"])  # vllm: SIGKILL alone, above
def test_sigterm_then_sigkill_on_two_ranks_then_rerun_gives_the_uninterrupted_run(micro, reference, tmp_path, stage):
    """The same on 2 ranks (`accelerate launch`, ZeRO-3; ZeRO-2 for pretraining), SIGTERM sent to the launcher and
    both ranks: per-step losses within 1e-6 of the uninterrupted run's."""
    _stopped_then_killed_then_finished(micro, reference, tmp_path, stage, ranks=2)


# ----------------------------------------------------------------------------------------------- preference pairs


@pytest.mark.parametrize(
    "sig, ranks",
    [(signal.SIGKILL, 1), (signal.SIGTERM, 1), pytest.param(signal.SIGKILL, 2, marks=pytest.mark.distributed)],
    ids=["sigkill", "sigterm", "sigkill-2-ranks"],
)
def test_preference_generation_stopped_then_rerun_writes_every_row_once(micro, tmp_path, sig, ranks):
    """One process, or 2 ranks (each rank its own share and files; the launcher and both ranks killed at once)."""
    from align.runtime.checkpoint import PREEMPTED_EXIT_CODE

    def command(out: Path) -> list[str]:
        cmd = [
            sys.executable,
            "scripts/generate_preferences.py",
            str(micro / "configs" / "preferences.yaml"),
            "--output_dir",
            str(out),
            "--batch_size",
            "4",
        ]
        return cmd if ranks == 1 else _launched(cmd, "zero3")

    def rows(out: Path, split: str) -> list[dict]:
        return [json.loads(x) for x in (out / f"{split}.jsonl").read_text().splitlines()]

    _run(command(tmp_path / "whole"))
    out = tmp_path / "stopped"
    progress = [
        out / ".work" / ("train.progress.jsonl" if ranks == 1 else f"train.rank{r}-of-2.progress.jsonl")
        for r in range(ranks)
    ]
    stop_after = random.Random().randint(1, 3 if ranks == 1 else 2)  # batches of 4 of the 24 train prompts

    def batches_done(_console: str) -> int:  # the slowest rank's
        return min(len(p.read_text().splitlines()) if p.exists() else 0 for p in progress)

    code, console = _signal_at(command(out), batches_done, stop_after, sig)
    assert code == (-signal.SIGKILL if sig == signal.SIGKILL else PREEMPTED_EXIT_CODE), console[-3000:]
    if sig == signal.SIGTERM:  # the batch in hand finished: its pairs and progress line landed, no more
        assert batches_done("") in (stop_after, stop_after + 1)
    assert not (out / "train.jsonl").exists()
    _run(command(out))
    for split in ("train", "test"):
        want, got = rows(tmp_path / "whole", split), rows(out, split)
        assert len({r["id"] for r in got}) == len(got)  # none twice
        assert got == want, split  # none lost, each as the uninterrupted run made it
