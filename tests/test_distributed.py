"""The distributed tier: every stage launched the way users launch it, on 2 CPU ranks.

Ranks talk over gloo (DDP) or through DeepSpeed's CPU accelerator; ZeRO-3 (the strictest: every parameter is
sharded) is the default, and ddp.yaml / zero2.yaml run where the code differs between them (pretraining, SFT).
The models come from one run of the micro pipeline under ZeRO-3 with `launcher: accelerate` (the session fixture
`micro`, which is itself the pipeline's test); every other test starts from its outputs. Each test asserts what
the launch computed (equal losses, equal weights, equal metrics, a resumed step), not only that it exited 0.

    python -m pytest -m distributed tests/test_distributed.py       # ~10 min on 2 cores (first run builds a
                                                                    # DeepSpeed op, ~25 s)
FSDP is GPU-only (accelerate runs it as plain DDP on a CPU): its test is skipped here and says so.
"""

from __future__ import annotations

import json
import math
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import torch
import yaml
from launching import free_port
from launching import launch_env as _env

ROOT = Path(__file__).resolve().parents[1]
CONFIGS = ROOT / "recipes" / "accelerate"
pytestmark = [pytest.mark.distributed, pytest.mark.slow]


def launch(script: str, *args: str, config: str = "zero3", nproc: int = 2, timeout: int = 400):
    """`accelerate launch --config_file recipes/accelerate/<config>.yaml --num_processes <nproc> script ...`"""
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(CONFIGS / f"{config}.yaml"),
        "--num_processes",
        str(nproc),
        "--main_process_port",
        str(free_port()),
        script,
        *map(str, args),
    ]
    return subprocess.run(cmd, cwd=ROOT, env=_env(), capture_output=True, text=True, timeout=timeout)


def python(script: str, *args: str, timeout: int = 300, **env: str):
    return subprocess.run(
        [sys.executable, script, *map(str, args)],
        cwd=ROOT,
        env={**_env(), **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )


def ok(proc) -> None:
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])


def error_lines(proc) -> list[str]:
    return [line for line in (proc.stdout + proc.stderr).splitlines() if line.startswith("smolalign: error:")]


def log_history(output_dir: Path) -> list[dict]:
    """The trainer's log of its last checkpoint (the full-precision losses)."""
    last = sorted(output_dir.glob("checkpoint-*"), key=lambda p: int(p.name.split("-")[1]))[-1]
    return json.loads((last / "trainer_state.json").read_text())["log_history"]


def losses(output_dir: Path) -> list[float]:
    return [h["loss"] for h in log_history(output_dir) if "loss" in h]


# ----------------------------------------------------------------------------------------------- the models
# `micro` (conftest.py): recipes/tiny/micro_pipeline.yaml under ZeRO-3 on 2 ranks, shared with the kill tier.


def test_micro_pipeline_under_zero3_on_two_ranks(micro):
    manifest = json.loads((micro / "manifest.json").read_text())
    assert [s["status"] for s in manifest["stages"]] == ["done"] * len(manifest["stages"])
    trainer_stages = [s for s in manifest["stages"] if s["script"] not in ("train_tokenizer", "tokenizer")]
    assert all(
        "accelerate.commands.launch" in " ".join(s["command"]) and "zero3.yaml" in " ".join(s["command"])
        for s in trainer_stages
    )
    # every stage ran on two DeepSpeed ranks (each writes what it ran on)
    reports = {
        "sft": "sft_eval.json",
        "apo": "preference_eval.json",
        "grpo": "grpo_eval.json",
        "gold": "distill_eval.json",
    }
    for stage, name in reports.items():
        assert json.loads((micro / stage / name).read_text())["world_size"] == 2, stage
    assert json.loads((micro / "sft" / "sft_eval.json").read_text())["distributed_type"].endswith("DEEPSPEED")
    # pretraining wrote DeepSpeed's sharded state beside the loadable weights; the final model loads whole
    assert (micro / "pretrain_small" / "checkpoints" / "step_0000002" / "ds").is_dir()
    from transformers import AutoModelForCausalLM

    for stage in ("pretrain_small", "sft", "apo", "grpo", "gold"):
        model = AutoModelForCausalLM.from_pretrained(micro / stage)
        assert all(p.numel() > 0 and torch.isfinite(p).all() for p in model.parameters()), stage
    pairs = (micro / "preferences" / "train.jsonl").read_text().splitlines()
    assert len(pairs) == 24  # every prompt, from both ranks
    evaluated = [s for s in manifest["stages"] if s.get("metrics")]
    assert evaluated and all("acc/tasks/think" in s["metrics"] for s in evaluated)


def test_gold_under_zero3_converts_the_builtin_teacher_once_on_an_empty_cache(micro):
    """A fresh machine's first GOLD run under ZeRO-3: one of the two ranks converted builtin:smollm2-135m-instruct
    (whole, outside ZeRO-3's partitioned init), the other waited for it, and the stage trained on both ranks."""
    conversions = (micro.parent / "cache" / "models" / "conversions.log").read_text().splitlines()
    assert len(conversions) == 1 and "builtin:smollm2-135m-instruct" in conversions[0], conversions
    assert "(launched rank 0)" in conversions[0] or "(launched rank 1)" in conversions[0], conversions
    manifest = json.loads((micro / "manifest.json").read_text())
    gold = next(s for s in manifest["stages"] if s["name"] == "gold")
    assert "zero3.yaml" in " ".join(gold["command"])
    report = json.loads((micro / "gold" / "distill_eval.json").read_text())
    assert report["world_size"] == 2


def test_apo_with_replay_rows_under_zero3(micro, tmp_path):
    """`replay_data` as users launch APO (2 ZeRO-3 ranks): the replay conversations join the pairs on both ranks and
    the NLL term makes their answers likelier than in the SFT model it started from."""
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from align.preference.accuracy import pair_logps
    from align.preference.data import replay_pairs

    chats = [("Who are you?", "I am a small assistant."), ("Say hello.", "Hello there!")]
    rows = [
        {
            "messages": [
                {"role": "system", "content": "/no_think"},
                {"role": "user", "content": q},
                {"role": "assistant", "content": a},
            ]
        }
        for q, a in chats * 8
    ]
    replay = tmp_path / "replay.jsonl"
    replay.write_text("".join(json.dumps(r) + "\n" for r in rows))
    out = tmp_path / "apo"
    proc = launch(
        "scripts/dpo.py",
        micro / "configs" / "apo.yaml",
        "--output_dir",
        out,
        "--replay_data",
        replay,
        "--loss_type",
        "apo_zero",
        "sft",
        "--loss_weights",
        "1.0",
        "1.0",
        "--learning_rate",
        "1e-3",
        "--max_steps",
        "4",
        "--save_steps",
        "4",
    )
    ok(proc)
    assert "replay: 16 conversations" in proc.stdout + proc.stderr
    assert json.loads((out / "preference_eval.json").read_text())["world_size"] == 2
    tok = AutoTokenizer.from_pretrained(micro / "sft")
    pairs = replay_pairs([{"messages": r["messages"]} for r in rows[:2]])
    start, trained = (
        pair_logps(AutoModelForCausalLM.from_pretrained(m), tok, pairs, 2, None)[0] for m in (micro / "sft", out)
    )
    assert (trained > start).all(), (start, trained)


def test_iterative_apo_samples_each_rounds_pairs_from_the_round_before_under_zero3(micro, tmp_path):
    """`preference_rounds: 2` as users launch APO (2 ZeRO-3 ranks): round 1 trains on the stage's pairs, round 2's
    pairs are sampled by round 1's saved model inside the stage (the ranks split the prompts) and round 2 trains that
    model; a rerun skips the finished round and its pairs."""
    import torch
    from safetensors.torch import load_file

    verifier = tmp_path / "verifier.py"  # micro models answer nothing right: a score that varies from sample to sample
    verifier.write_text(
        "def e_share_reward(completions, **kwargs):\n"
        "    texts = [c if isinstance(c, str) else c[-1]['content'] for c in completions]\n"
        "    return [t.count('e') / (len(t) + 1) for t in texts]\n"
    )
    recipe = tmp_path / "pairs.yaml"
    recipe.write_text(
        json.dumps(
            {
                "dataset_name": "builtin:tasks",
                "dataset_args": {"num": 16, "seed": 1, "mode": "think"},
                "max_eval_samples": 8,
                "method": "graded",
                "policy_model": "set-by-the-round",
                "num_samples": 3,
                "temperature": 1.0,
                "max_new_tokens": 16,
                "rewards": [f"{verifier}:e_share_reward"],
                "verify_chosen": False,
                "mode_format": False,
                "batch_size": 8,
                "seed": 4,
                "rollout_backend": "hf",
                "output_dir": "set-by-the-round",
            }
        )
    )
    out = tmp_path / "apo"
    args = [
        "scripts/dpo.py",
        micro / "configs" / "apo.yaml",
        "--output_dir",
        out,
        "--max_steps",
        "2",
        "--save_steps",
        "2",
        "--preference_rounds",
        "2",
        "--round_pairs_recipe",
        recipe,
        "--round_pairs_overrides",
        '{"dataset_args": {"num": 16, "seed": 3, "mode": "think"}}',
    ]
    ok(launch(*args))
    card = json.loads((out / "pairs-round-2" / "card.json").read_text())
    assert card["models"]["policy"].startswith(str(out / "round-1")), card["models"]
    assert card["config"]["seed"] == 5 and card["counts"]["train"]["kept"] > 0  # the recipe's seed + 1; pairs made
    assert card["source"] == "builtin:tasks" and card["config"]["policy_model"] == str(out / "round-1")
    assert sorted((out / "pairs-round-2" / ".work").glob("train.rank*-of-2.pairs.jsonl"))  # both ranks sampled
    report = json.loads((out / "preference_eval.json").read_text())
    assert report["preference_rounds"] == 2 and report["world_size"] == 2
    assert [r["model"] for r in report["rounds"]] == [str(micro / "sft"), str(out / "round-1")]
    assert report["rounds"][1]["pairs"] == str(out / "pairs-round-2") and report["rounds"][1]["kept"]["train"] > 0
    weights = [load_file(d / "model.safetensors") for d in (micro / "sft", out / "round-1", out)]
    for before, after in zip(weights, weights[1:]):  # each round trained the model the round before saved
        assert any(not torch.equal(before[k], after[k]) for k in before)
    stamp = (out / "round-1" / "model.safetensors").stat().st_mtime_ns
    again = launch(*args)
    ok(again)
    log = again.stdout + again.stderr
    assert "round 1 of 2 is done" in log and "pairs from" not in log
    assert (out / "round-1" / "model.safetensors").stat().st_mtime_ns == stamp


# ----------------------------------------------------------------------------------------------- pretraining


def _pretrain_args(micro: Path, out: Path, **extra) -> list[str]:
    args = [
        micro / "configs" / "pretrain_small.yaml",
        "--output_dir",
        out,
        "--max_steps",
        "4",
        "--save_steps",
        "2",
        "--mixed_precision",
        "no",
    ]
    for k, v in extra.items():
        args += [f"--{k}", str(v)]
    return [str(a) for a in args]


def _pretrain_losses(out: Path) -> list[float]:
    return [h["loss"] for h in json.loads((out / "metrics.json").read_text())["history"]]


def test_pretrain_ddp_equals_one_process_and_resumes(micro, tmp_path):
    """2 ranks x micro batch 2 == 1 process x micro batch 4, step for step, across a stop and a resume."""
    ok(python("scripts/run_pretrain.py", *_pretrain_args(micro, tmp_path / "one", micro_batch_size=4)))
    ddp = tmp_path / "ddp"
    ok(
        launch(
            "scripts/run_pretrain.py",
            *_pretrain_args(micro, ddp, micro_batch_size=2, stop_after_steps=2),
            config="ddp",
        )
    )
    resumed = launch(
        "scripts/run_pretrain.py",
        *_pretrain_args(micro, ddp, micro_batch_size=2, resume_from_checkpoint="auto"),
        config="ddp",
    )
    ok(resumed)
    assert "resumed from" in resumed.stdout + resumed.stderr
    assert _pretrain_losses(ddp) == pytest.approx(_pretrain_losses(tmp_path / "one"), rel=1e-5)


def test_pretrain_zero2_resumes_exactly(micro, tmp_path):
    """DeepSpeed ZeRO-2: a run stopped after step 2 and resumed gives the uninterrupted run's losses exactly."""
    whole, parts = tmp_path / "whole", tmp_path / "parts"
    ok(launch("scripts/run_pretrain.py", *_pretrain_args(micro, whole), config="zero2"))
    ok(launch("scripts/run_pretrain.py", *_pretrain_args(micro, parts, stop_after_steps=2), config="zero2"))
    assert not (parts / "metrics.json").exists()  # stopped after step 2: no final model yet
    ok(launch("scripts/run_pretrain.py", *_pretrain_args(micro, parts, resume_from_checkpoint="auto"), config="zero2"))
    assert (parts / "checkpoints" / "step_0000002" / "ds").is_dir()  # DeepSpeed's own sharded state
    assert _pretrain_losses(parts) == _pretrain_losses(whole)


# ----------------------------------------------------------------------------------------------- SFT


def _sft(micro: Path, out: Path, *extra: str) -> list[str]:
    return [
        str(micro / "configs" / "sft.yaml"),
        "--output_dir",
        str(out),
        "--logging_steps",
        "1",
        "--bf16",
        "false",
        "--save_steps",
        "3",
        "--max_steps",
        "3",
        *extra,
    ]


def test_sft_two_ddp_ranks_equal_one_process_with_twice_the_batch(micro, tmp_path):
    ok(python("scripts/sft.py", *_sft(micro, tmp_path / "one", "--per_device_train_batch_size", "4")))
    ok(launch("scripts/sft.py", *_sft(micro, tmp_path / "ddp", "--per_device_train_batch_size", "2"), config="ddp"))
    one, two = losses(tmp_path / "one"), losses(tmp_path / "ddp")
    assert len(one) == 3 and two == pytest.approx(one, rel=1e-4)


def test_sft_zero2_evaluates_on_every_rank(micro, tmp_path):
    out = tmp_path / "z2"
    ok(launch("scripts/sft.py", *_sft(micro, out, "--eval_after", "true", "--eval_num_prompts", "4"), config="zero2"))
    report = json.loads((out / "sft_eval.json").read_text())
    assert report["world_size"] == 2 and report["distributed_type"].endswith("DEEPSPEED")
    assert report["before"]["think"]["num"] == report["after"]["think"]["num"] == 4  # both ranks' prompts counted


def test_sft_lora_under_zero3_saves_the_merged_model(micro, tmp_path):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    out = tmp_path / "lora"
    ok(
        launch(
            "scripts/sft.py",
            *_sft(
                micro,
                out,
                "--use_peft",
                "true",
                "--lora_r",
                "4",
                "--lora_target_modules",
                "all-linear",
                "--learning_rate",
                "1e-2",
            ),
        )
    )
    load = lambda path: AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32)  # noqa: E731
    merged = load(out).state_dict()
    reference = (
        PeftModel.from_pretrained(load(micro / "pretrain_reasoning"), out / "adapter").merge_and_unload().state_dict()
    )
    base_state = load(micro / "pretrain_reasoning").state_dict()
    assert set(merged) == set(reference)
    assert all(torch.allclose(merged[k], reference[k], atol=1e-6) for k in merged)  # base + the trained adapter
    assert any(not torch.equal(merged[k], base_state[k]) for k in merged)  # and the adapter did train


# ----------------------------------------------------------------------------------------------- preference


@pytest.mark.parametrize("stage", ["kto", "orpo"])
def test_kto_and_orpo_under_zero3(micro, tmp_path, stage):
    out = tmp_path / stage
    ok(
        launch(
            f"scripts/{stage}.py",
            ROOT / "recipes" / "tiny" / f"{stage}.yaml",
            "--model_name_or_path",
            micro / "sft",
            "--dataset_name",
            micro / "preferences",
            "--dataset_args",
            "null",
            "--output_dir",
            out,
            "--max_steps",
            "2",
            "--per_device_train_batch_size",
            "2",
            "--max_length",
            "128",
            "--report_to",
            "none",
            "--save_strategy",
            "no",
            "--eval_strategy",
            "no",
            "--learning_rate",
            "1e-3",
        )
    )
    metrics = json.loads((out / "preference_eval.json").read_text())
    assert metrics["world_size"] == 2
    assert metrics["before"]["num_pairs"] == metrics["after"]["num_pairs"] == 8  # the test pairs of both ranks
    assert metrics["before"]["preference_accuracy"] == 0.5  # against itself: every margin is 0


# ----------------------------------------------------------------------------------------------- GRPO


def _grpo_worker(micro: Path, out: Path, *extra: str):
    return launch(
        "tests/workers/grpo_sync.py",
        out,
        micro / "configs" / "grpo.yaml",
        "--output_dir",
        out / "train",
        "--bf16",
        "false",
        "--save_strategy",
        "no",
        "--learning_rate",
        "1e-3",
        "--report_to",
        "none",
        *extra,
    )


def _check_sync(out: Path) -> dict:
    result = json.loads((out / "result.json").read_text())
    assert result["world_size"] == 2 and result["distributed_type"].endswith("DEEPSPEED")
    for rank in result["ranks"]:
        assert rank["engine_ids"] == rank["model_ids"]  # after the push the engine answers as the trained model
        assert rank["draws"][0] == rank["draws"][1]  # same seed, same rank, same world size: same samples
    first, second = (set(map(tuple, r["draws"][0])) for r in result["ranks"])
    assert not first & second  # the ranks sample the same prompt differently
    assert result["saved_max_abs_diff"] == 0.0 and not result["missing_in_saved"]  # saved == gathered weights
    return result


@pytest.mark.vllm
def test_grpo_vllm_under_zero3_pushes_gathered_weights(micro, tmp_path):
    pytest.importorskip("vllm")
    ok(_grpo_worker(micro, tmp_path, "--rollout_backend", "vllm", "--rollout_kwargs", "{kv_cache_gib: 0.25}"))
    result = _check_sync(tmp_path)
    assert all(r["backend"] == "vllm" and r["pushes"] >= 2 for r in result["ranks"])
    # vLLM reports the log-probs it sampled with; in fp32 they equal the trainer's: importance weights of 1
    assert result["is_ratio_mean"] and all(abs(r - 1) < 1e-4 for r in result["is_ratio_mean"])
    assert all(r["is_in_loss_pass"] and r["no_grad_passes"] == 0 for r in result["ranks"])  # no extra old-logps pass


@pytest.mark.vllm
def test_grpo_bf16_vllm_under_zero3_corrects_in_the_loss_pass(micro, tmp_path, keep_bf16):
    """`scripts/grpo.py` under bf16 with a vLLM engine on CPU ranks: the engine samples in bf16
    (align.grpo.trainer.rollout_knobs), and the trainer corrects the engine/trainer mismatch with truncated importance
    sampling built from its own loss pass, on every rank, without TRL's extra no-grad pass."""
    pytest.importorskip("vllm")
    ok(
        _grpo_worker(
            micro, tmp_path, "--rollout_backend", "vllm", "--rollout_kwargs", "{kv_cache_gib: 0.25}", "--bf16", "true"
        )
    )
    result = _check_sync(tmp_path)
    for rank in result["ranks"]:
        assert rank["engine_dtype"] == "bfloat16" and rank["is_in_loss_pass"]
        assert rank["no_grad_passes"] == 0 and rank["loss_passes"] >= 2
    ratios, diffs = result["is_ratio_mean"], result["logp_diff_max"]
    assert len(ratios) == len(diffs) >= 2
    assert all(abs(r - 1) < 0.05 for r in ratios)  # a correction near 1: the engine samples (nearly) the policy
    assert max(diffs) > 1e-4  # but not exactly: bf16 sampling differs from the trainer's log-probs, which is corrected


@pytest.mark.vllm
def test_grpo_lora_vllm_under_zero3_pushes_the_merged_adapter(micro, tmp_path):
    pytest.importorskip("vllm")
    ok(
        _grpo_worker(
            micro,
            tmp_path,
            "--rollout_backend",
            "vllm",
            "--rollout_kwargs",
            "{kv_cache_gib: 0.25}",
            "--use_peft",
            "true",
            "--lora_r",
            "4",
            "--lora_target_modules",
            "all-linear",
            "--learning_rate",
            "5e-2",
            # the micro model's completions all run to the length cap (one reward for all): a reward with variance
            "--reward_funcs",
            "[./tests/workers/varied_reward.py:text_hash_reward]",
            "--reward_weights",
            "[1.0]",
            "--reward_kwargs",
            "{}",
        )
    )
    _check_sync(tmp_path)
    from transformers import AutoModelForCausalLM

    trained = AutoModelForCausalLM.from_pretrained(tmp_path / "model").state_dict()
    start = AutoModelForCausalLM.from_pretrained(micro / "apo").state_dict()
    assert any(not torch.equal(trained[k], start[k]) for k in trained)  # the engine was checked on moved weights


def test_grpo_bf16_hf_copy_of_a_zero3_policy_is_built_whole_and_kept_in_step(micro, tmp_path):
    """hf rollouts in bf16 of an fp32 ZeRO-3 policy: the engine's copy is built from the gathered weights (a deepcopy
    of the partitioned model held empty tensors: the first push failed), and after training it holds the trained
    weights rounded to bf16 (tests/test_rollout.py checks such a copy under FSDP2)."""
    ok(_grpo_worker(micro, tmp_path, "--rollout_backend", "hf", "--rollout_kwargs", "{dtype: bfloat16}"))
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["saved_max_abs_diff"] == 0.0
    for rank in result["ranks"]:
        assert rank["backend"] == "hf" and rank["pushes"] >= 2
        assert rank["copy_rounded_diff"] == 0.0 and 0 < rank["copy_diff"] < 0.01  # bf16 of the trained weights


def test_grpo_hf_engine_with_dynamic_sampling_under_zero3(micro, tmp_path):
    out = tmp_path / "ds"
    ok(
        launch(
            "scripts/grpo.py",
            micro / "configs" / "grpo.yaml",
            "--output_dir",
            out,
            "--rollout_backend",
            "hf",
            "--dynamic_sampling",
            "true",
            "--dynamic_sampling_max_rounds",
            "2",
            "--max_steps",
            "2",
            "--save_steps",
            "2",
            "--eval_after",
            "true",
            "--eval_num_prompts",
            "4",
        )
    )
    history = log_history(out)
    rounds = [h["dynamic_sampling/rounds"] for h in history if "dynamic_sampling/rounds" in h]
    assert rounds and all(1 <= r <= 2 for r in rounds)
    report = json.loads((out / "grpo_eval.json").read_text())
    assert report["world_size"] == 2 and report["before"]["num_prompts"] == report["after"]["num_prompts"] == 4


def test_dynamic_sampling_under_zero3_takes_trls_global_token_mean(tmp_path, tiny_model):
    """One dapo step on 2 ZeRO-3 ranks holding 16 and 7 completion tokens, through TRL's generate-and-score and
    through dynamic sampling's merged batch of the same rows (tests/workers/grpo_token_mean.py): both count every
    rank's tokens (23), so the per-rank losses and the SGD step (the ranks' averaged gradients) are TRL's."""
    from pretrain.tokenizer import train_tokenizer

    tok = train_tokenizer([f"question {i} answer {i * 7}" for i in range(200)], vocab_size=300)
    model_dir = tiny_model(tmp_path / "model", tok, seed=0)
    ok(launch("tests/workers/grpo_token_mean.py", tmp_path, model_dir, timeout=300))
    result = json.loads((tmp_path / "result.json").read_text())
    trl_ranks, merged_ranks = result["trl"]["ranks"], result["merged"]["ranks"]
    assert [r[0]["tokens"] for r in trl_ranks] == [16, 7]
    assert [r[0]["num_items_in_batch"] for r in trl_ranks] == [23, 23]  # TRL: gathered over the ranks
    assert result["trl"]["kept_ratio"] == [] and result["merged"]["kept_ratio"] == [1.0]  # merged: every group kept
    for ours, theirs in zip(merged_ranks, trl_ranks, strict=True):
        assert ours[0]["tokens"] == theirs[0]["tokens"] and ours[0]["num_items_in_batch"] == 23
        assert ours[0]["loss"] == pytest.approx(theirs[0]["loss"], rel=1e-5, abs=1e-7)
    assert result["moved"] > 1e-3 and result["weights_diff"] <= 1e-6  # the same gradient step


def test_async_grpo_under_zero3_keeps_the_staleness_bound_and_resumes(micro, tmp_path):
    """`async_generation: true` on 2 ZeRO-3 ranks (each rank's hf engine in a process of its own, the gathered weights
    pushed every step) with dynamic sampling (the micro model's groups are mostly flat: refill rounds, generated
    by the engine processes when needed): every trained batch is at most max_staleness steps old, and a rerun with
    more steps resumes from the checkpoint, regenerating the batches that were in flight."""
    out = tmp_path / "async"
    args = [
        micro / "configs" / "grpo.yaml",
        "--output_dir",
        out,
        "--rollout_backend",
        "hf",
        "--async_generation",
        "true",
        "--max_staleness",
        "1",
        "--save_steps",
        "2",
        "--eval_after",
        "true",
        "--eval_num_prompts",
        "4",
        "--dynamic_sampling",
        "true",
        "--dynamic_sampling_max_rounds",
        "2",
    ]
    ok(launch("scripts/grpo.py", *args, "--max_steps", "4"))
    first = json.loads((out / "grpo_eval.json").read_text())["async"]
    assert first["batches"] == 4 and first["staleness_max"] == 1  # the engine ran a step ahead
    ok(launch("scripts/grpo.py", *args, "--max_steps", "6"))
    report = json.loads((out / "grpo_eval.json").read_text())
    assert report["world_size"] == 2 and report["async"]["batches"] == 2 and report["async"]["staleness_max"] <= 1
    history = log_history(out)
    steps = [h["step"] for h in history if "async/staleness" in h]
    assert steps == [1, 2, 3, 4, 5, 6]  # one log, resumed: steps 5 and 6 continue the first run's
    rounds = [h["dynamic_sampling/rounds"] for h in history if "dynamic_sampling/rounds" in h]
    assert len(rounds) == 6 and max(rounds) == 2  # refill rounds ran (and no more than the cap)
    assert sum("async/refill_s" in h for h in history) == sum(r > 1 for r in rounds)


@pytest.mark.vllm
def test_async_grpo_lora_with_a_vllm_engine_process_under_zero3(micro, tmp_path):
    """The vllm engine in a process of its own, fed the merged LoRA weights gathered from 2 ZeRO-3 ranks."""
    pytest.importorskip("vllm")
    out = tmp_path / "async_lora"
    ok(
        launch(
            "scripts/grpo.py",
            micro / "configs" / "grpo.yaml",
            "--output_dir",
            out,
            "--rollout_backend",
            "vllm",
            "--rollout_kwargs",
            "{kv_cache_gib: 0.25}",
            "--async_generation",
            "true",
            "--max_staleness",
            "1",
            "--use_peft",
            "true",
            "--lora_r",
            "4",
            "--lora_target_modules",
            "all-linear",
            "--max_steps",
            "3",
            "--save_steps",
            "3",
            "--learning_rate",
            "5e-2",
        )
    )
    report = json.loads((out / "grpo_eval.json").read_text())
    assert report["async"]["batches"] == 3 and report["async"]["staleness_max"] <= 1
    ratios = [
        h["sampling/importance_sampling_ratio/mean"]
        for h in log_history(out)
        if "sampling/importance_sampling_ratio/mean" in h
    ]
    assert len(ratios) == 3 and all(abs(r - 1) < 0.2 for r in ratios)  # the engine samples (nearly) the policy


def test_grpo_padding_free_under_zero3_trains_as_the_padded_pass(micro, tmp_path):
    """`padding_free: true` on 2 ZeRO-3 ranks (the packed row through DeepSpeed's gathered layers, per-sequence
    attention in the forward and the backward): the same samples (hf engine, same seeds) give the padded run's
    first-step loss and rewards."""
    args = [micro / "configs" / "grpo.yaml", "--rollout_backend", "hf", "--max_steps", "1", "--save_steps", "1"]
    ok(launch("scripts/grpo.py", *args, "--output_dir", tmp_path / "padded"))
    ok(launch("scripts/grpo.py", *args, "--padding_free", "true", "--output_dir", tmp_path / "packed"))
    padded, packed = (next(h for h in log_history(tmp_path / d) if "loss" in h) for d in ("padded", "packed"))
    assert packed["reward"] == padded["reward"]
    assert packed["loss"] == pytest.approx(padded["loss"], rel=1e-4, abs=1e-6)


@pytest.mark.parametrize(
    "lora, asynchronous", [(False, False), (True, False), (False, True)], ids=["full", "lora", "async"]
)
def test_tool_use_grpo_under_zero3(micro, tmp_path, lora, asynchronous):
    """Tool-use GRPO on 2 ZeRO-3 ranks (tests/workers/tools_grpo.py): scripted first turns call the calculator, the
    sharded model writes the turns after the tool's reply (async: each rank's engine process, fed the gathered
    weights, writes them in the tool thread, a step ahead); half the rollouts called on every rank, the tool tokens
    are masked, the losses are finite. LoRA runs with replay rows (align/grpo/replay.py): each rank's NLL logged."""
    extra = ["--use_peft", "true", "--lora_r", "4", "--lora_target_modules", "all-linear"] if lora else []
    if lora:
        extra += ["--replay_data", "builtin:tool_tasks", "--replay_args", "{families: [tool_arithmetic], num: 8}"]
    if asynchronous:
        extra += [
            "--async_generation",
            "true",
            "--max_staleness",
            "1",
            "--vllm_importance_sampling_correction",
            "true",
        ]
    ok(
        launch(
            "tests/workers/tools_grpo.py",
            tmp_path,
            micro / "configs" / "grpo.yaml",
            "--output_dir",
            tmp_path / "train",
            "--bf16",
            "false",
            "--save_strategy",
            "no",
            "--report_to",
            "none",
            "--max_steps",
            "2",
            "--tools",
            "[calculator]",
            "--max_turns",
            "2",
            "--max_completion_length",
            "128",
            "--dynamic_sampling",
            "false",
            *extra,
        )
    )
    result = json.loads((tmp_path / "result.json").read_text())
    assert result["world_size"] == 2 and result["distributed_type"].endswith("DEEPSPEED") and result["lora"] == lora
    assert result["calls_per_rollout"] and all(c == 0.5 for c in result["calls_per_rollout"])
    assert all(1.0 < t <= 1.5 for t in result["turns_mean"])  # callers took a second turn, the others one
    for rank in result["ranks"]:  # on every rank: callers have tool tokens masked, direct answers none
        for batch in rank["inserted_tokens"]:
            assert [n > 0 for n in batch] == [k % 2 == 0 for k in range(len(batch))]
    assert result["losses"] and all(math.isfinite(x) for x in result["losses"])
    assert len(result["replay_nll"]) == (2 if lora else 0) and all(math.isfinite(x) for x in result["replay_nll"])
    if asynchronous:
        assert len(result["staleness"]) == 2 and all(0 <= s <= 1 for s in result["staleness"])


# ----------------------------------------------------------------------------------------------- distillation


def test_distill_under_zero3_measures_what_one_process_measures(micro, tmp_path):
    args = [
        ROOT / "recipes" / "tiny/distill.yaml",
        "--model_name_or_path",
        micro / "pretrain_reasoning",
        "--teacher_model_name_or_path",
        micro / "sft_strong",
        "--max_steps",
        "1",
        "--per_device_train_batch_size",
        "2",
        "--max_completion_length",
        "16",
        "--max_length",
        "128",
        "--distill_eval_max_new_tokens",
        "16",
        "--eval_num_prompts",
        "6",
        "--save_strategy",
        "steps",
        "--save_steps",
        "1",
        "--logging_steps",
        "1",
        "--report_to",
        "none",
        "--dataset_args",
        "{num: 32, mode: mixed, seed: 0}",
    ]
    ok(python("scripts/distill.py", *args, "--output_dir", tmp_path / "one"))
    ok(launch("scripts/distill.py", *args, "--output_dir", tmp_path / "two"))
    one, two = (json.loads((tmp_path / d / "distill_eval.json").read_text()) for d in ("one", "two"))
    assert two["world_size"] == 2 and two["engine_calls"] >= 1
    for key in ("divergence", "forward_kl", "accuracy", "num_tokens"):
        assert two["before"][key] == pytest.approx(one["before"][key], rel=1e-4, abs=1e-6), key
    assert two["teacher_accuracy"] == one["teacher_accuracy"]
    # loss_chunk_tokens under ZeRO-3: the heads applied outside the model's forward, a few positions at a time,
    # give the first step's loss of the whole-logits pass (same samples: same seeds, same weights)
    ok(launch("scripts/distill.py", *args, "--loss_chunk_tokens", "5", "--output_dir", tmp_path / "chunked"))
    whole, chunked = (next(h["loss"] for h in log_history(tmp_path / d) if "loss" in h) for d in ("two", "chunked"))
    assert chunked == pytest.approx(whole, rel=1e-4)


def launch_distill_rounds(micro, tmp_path, out, *args):
    """tests/workers/distill_rounds.py on 2 ZeRO-3 ranks: rejection sampling from the micro SFT model (its own
    teacher), 16 mixed-mode prompts, 2 steps; `args` add to or override the recipe's."""
    return launch(
        "tests/workers/distill_rounds.py",
        tmp_path,
        ROOT / "recipes" / "tiny/distill.yaml",
        "--model_name_or_path",
        micro / "sft",
        "--teacher_model_name_or_path",
        micro / "sft",
        "--loss",
        "rejection_sampling",
        "--teacher_best_of",
        "2",
        "--max_steps",
        "2",
        "--per_device_train_batch_size",
        "2",
        "--learning_rate",
        "1e-3",
        "--distill_eval_max_new_tokens",
        "8",
        "--eval_num_prompts",
        "4",
        "--report_to",
        "none",
        "--dataset_args",
        "{num: 16, mode: mixed, seed: 0}",
        "--output_dir",
        out,
        *args,
    )


def test_expert_iteration_rounds_under_zero3_each_build_their_own_engine(micro, tmp_path):
    """`rejection_rounds: 2` on 2 ZeRO-3 ranks (tests/workers/distill_rounds.py: the teacher's sampler answers with
    the rows' gold answers, micro models answer nothing right). Round 2 used to fail building its trainer
    (accelerate: "You cannot pass in a `deepspeed_plugin` when creating a second `Accelerator`"); now each round
    trains under its own DeepSpeed engine, and round 2 samples from round 1's saved model."""
    import torch
    from safetensors.torch import load_file

    out = tmp_path / "out"
    ok(launch_distill_rounds(micro, tmp_path, out, "--rejection_rounds", "2"))
    round_1 = out / "round-1"
    # round 1: training prompts then held-out ones from the starting model; round 2 from round 1's saved model
    assert json.loads((tmp_path / "teachers.json").read_text()) == [str(micro / "sft")] * 2 + [str(round_1)] * 2
    stage, first = (json.loads((d / "distill_eval.json").read_text()) for d in (out, round_1))
    for report in (stage, first):
        assert report["distributed_type"] == "DEEPSPEED" and report["world_size"] == 2
    assert stage["rejection_rounds"] == 2 and [r["round"] for r in stage["rounds"]] == [1, 2]
    assert stage["before"] == first["before"]
    # held-out answers made once per weights under ZeRO-3 too: round 1's teacher is its student; round 2's teacher
    # and student ('previous') are round 1's saved model, answered in round 1's after
    assert first["reused"] == {"before": {"teacher": str((micro / "sft").resolve())}}
    assert stage["reused"] == {"before": {"student": str(round_1.resolve()), "teacher": str(round_1.resolve())}}
    assert stage["teacher_accuracy"] == first["after"]["accuracy"]
    start, one, two = (load_file(str(d / "model.safetensors")) for d in (micro / "sft", round_1, out))
    moved = [n for n in start if not torch.equal(start[n], one[n])]
    assert moved and any(not torch.equal(one[n], two[n]) for n in one)  # both rounds trained ('previous')


def test_teacher_thinks_under_zero3_shows_the_teacher_think_prompts_and_the_student_learns_conclusions(
    micro, tmp_path
):
    """`teacher_thinks` (recipes/smol135m/distill.yaml) the way users launch it, on 2 ZeRO-3 ranks
    (tests/workers/distill_rounds.py's oracle answers each prompt in the mode it was shown): every prompt the teacher
    samples, training and held-out, carries /think; the student learns its no_think prompts (flag kept) with the
    conclusion alone and its think prompts with the reasoning."""
    import torch
    from safetensors.torch import load_file

    from data_gen.tasks import assistant_text, tasks_dataset
    from rewards.length import prompt_mode

    out = tmp_path / "out"
    ok(launch_distill_rounds(micro, tmp_path, out, "--teacher_thinks", "true"))
    train = {r["prompt"]: r for r in tasks_dataset(split="train", num=16, mode="mixed", seed=0).to_list()}
    asked = {p: prompt_mode(r["prompt_messages"]) for p, r in train.items()}
    assert sorted(set(asked.values())) == ["no_think", "think"]  # both modes among the training prompts
    views = [v for rank in (0, 1) for v in json.loads((tmp_path / f"teacher_views-rank{rank}.json").read_text())]
    assert {v["prompt"] for v in views} >= set(train) and {v["mode"] for v in views} == {"think"}
    learned = json.loads((tmp_path / "learned-1.json").read_text())
    assert len(learned) == len(train)  # the oracle's answers are all right: none dropped
    for messages in learned:
        prompt = next(m["content"] for m in messages if m["role"] == "user")
        mode = asked[prompt]
        assert prompt_mode(messages) == mode  # the student's prompt keeps the flag it was asked with
        assert messages[-1] == {"role": "assistant", "content": assistant_text(train[prompt], mode)}
        assert ("<think>" in messages[-1]["content"]) == (mode == "think")
    report = json.loads((out / "distill_eval.json").read_text())
    assert report["distributed_type"] == "DEEPSPEED" and report["world_size"] == 2
    assert report["teacher_best_of"]["by_mode"] == {"no_think": 1.0, "think": 1.0}
    start, end = (load_file(str(d / "model.safetensors")) for d in (micro / "sft", out))
    assert any(not torch.equal(start[n], end[n]) for n in start)


# ----------------------------------------------------------------------------------------------- data and eval


def test_evaluation_on_two_ranks_equals_one_process(micro, tmp_path):
    args = [
        ROOT / "recipes" / "tiny/eval.yaml",
        "--model_name_or_path",
        micro / "sft",
        "--loss_num_texts",
        "6",
        "--mc_sets",
        "tasks:5",
        "--gen_sets",
        "tasks:5",
        "--max_new_tokens",
        "8",
        "--backend",
        "hf",
        "--suites",
        "loss",
        "mc",
        "generative",
    ]
    ok(python("scripts/evaluate.py", *args, "--output_dir", tmp_path / "one"))
    ok(launch("scripts/evaluate.py", *args, "--output_dir", tmp_path / "two"))
    one, two = (json.loads((tmp_path / d / "eval_results.json").read_text())["metrics"] for d in ("one", "two"))
    assert set(one) == set(two) and all(two[k] == pytest.approx(one[k], rel=1e-6) for k in one)


def test_preference_generation_splits_prompts_across_ranks(micro, tmp_path):
    out = tmp_path / "pairs"
    ok(launch("scripts/generate_preferences.py", micro / "configs" / "preferences.yaml", "--output_dir", out))
    rows = [json.loads(x) for x in (out / "train.jsonl").read_text().splitlines()]
    reference = [json.loads(x) for x in (micro / "preferences" / "train.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == [r["id"] for r in reference]  # every prompt once, in the data's order
    assert sorted((out / ".work").glob("train.rank*-of-2.pairs.jsonl"))  # each rank wrote its own share


# ----------------------------------------------------------------------------------------------- several machines


def _wait_for(path_glob: Path, pattern: str, timeout: float) -> None:
    start = time.time()
    while not [p for p in path_glob.glob(pattern) if (p / "smolalign_complete.json").exists()]:
        assert time.time() - start < timeout, f"no {pattern} in {path_glob} after {timeout} s"
        time.sleep(0.1)


def test_two_machines_on_one_host_run_a_pipeline_and_resume_after_a_kill(micro, tmp_path):
    """Two pipeline processes (machine 0 and 1, one rank each, rendezvous on 127.0.0.1) train one stage; both are
    killed after its first checkpoint; the same two commands then resume it from that checkpoint."""
    recipe = {
        "name": "two-machines",
        "run_dir": str(tmp_path / "run"),
        "launcher": "accelerate",
        "eval_recipe": None,
        "tracking": "none",
        "accelerate_config": str(CONFIGS / "ddp.yaml"),
        "num_processes": 2,
        "stages": [
            {
                "name": "sft",
                "script": "sft",
                "recipe": str(micro / "configs" / "sft.yaml"),
                "overrides": {
                    "output_dir": str(tmp_path / "run" / "sft"),
                    "max_steps": 60,
                    "save_steps": 2,
                    "save_total_limit": 40,
                    "logging_steps": 1,
                },
            }
        ],
    }
    path = tmp_path / "pipe.yaml"
    path.write_text(yaml.safe_dump(recipe))
    port = free_port()

    def start(rank: int) -> subprocess.Popen:
        cmd = [
            sys.executable,
            "scripts/pipeline.py",
            str(path),
            "--num_machines",
            "2",
            "--machine_rank",
            str(rank),
            "--main_process_ip",
            "127.0.0.1",
            "--main_process_port",
            str(port),
        ]
        return subprocess.Popen(
            cmd,
            cwd=ROOT,
            env=_env(),
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            start_new_session=True,
        )

    first = [start(0), start(1)]
    _wait_for(tmp_path / "run" / "sft", "checkpoint-*", 240)
    for p in first:  # a preemption (Slurm sends SIGTERM first): each pipeline stops the ranks it launched
        os.kill(p.pid, signal.SIGTERM)
    assert [p.wait(timeout=120) for p in first] == [130, 130]
    assert not (tmp_path / "run" / "sft" / ".smolalign_stage.json").exists()
    killed_at = max(
        int(p.name.split("-")[1])
        for p in (tmp_path / "run" / "sft").glob("checkpoint-*")
        if (p / "smolalign_complete.json").exists()
    )
    second = [start(0), start(1)]
    outs = [p.communicate(timeout=400)[0] for p in second]
    assert [p.returncode for p in second] == [0, 0], outs
    assert "resuming from" in outs[0]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert manifest["stages"][0]["status"] == "done" and manifest["stages"][0]["resumed_from"].endswith(
        f"-{killed_at}"
    )
    history = log_history(tmp_path / "run" / "sft")
    assert history[-1]["step"] == 60 and min(h["step"] for h in history) == 1  # one history, the killed part kept
    sft_log = (tmp_path / "run" / "logs" / "sft.log").read_text()
    assert "--num_machines 2" in sft_log and "--machine_rank 0" in sft_log


# ----------------------------------------------------------------------------------------------- bad launches


def test_launches_a_stage_cannot_honour_end_in_one_line(micro, tmp_path):
    """FSDP on a CPU, num_generations that do not divide the global batch, a server that does not answer: one
    `smolalign: error:` line naming the fix, a non-zero exit, and no rank left waiting (the launch returns)."""
    fsdp = launch("scripts/sft.py", *_sft(micro, tmp_path / "fsdp"), config="fsdp2", timeout=180)
    assert fsdp.returncode != 0 and len(error_lines(fsdp)) == 1 and "ddp.yaml" in error_lines(fsdp)[0]
    groups = launch(
        "scripts/grpo.py",
        micro / "configs" / "grpo.yaml",
        "--output_dir",
        tmp_path / "g",
        "--per_device_train_batch_size",
        "2",
        "--num_generations",
        "3",
        timeout=180,
    )
    assert groups.returncode != 0 and len(error_lines(groups)) == 1 and "num_generations" in error_lines(groups)[0]
    server = launch(
        "scripts/grpo.py",
        micro / "configs" / "grpo.yaml",
        "--output_dir",
        tmp_path / "s",
        "--rollout_backend",
        "vllm-server",
        "--rollout_kwargs",
        "{base_url: 'http://127.0.0.1:9', timeout: 2}",
        timeout=180,
    )
    assert server.returncode != 0 and len(error_lines(server)) == 1 and "vllm-serve" in error_lines(server)[0]
    assert not (tmp_path / "s" / "model.safetensors").exists()


def test_multi_node_pipeline_without_an_address_is_refused(tmp_path):
    proc = python(
        "scripts/pipeline.py",
        ROOT / "recipes" / "tiny/micro_pipeline.yaml",
        "--num_machines",
        "2",
        "--run_dir",
        tmp_path / "run",
        timeout=60,
    )
    assert proc.returncode == 2 and len(error_lines(proc)) == 1 and "main_process_ip" in error_lines(proc)[0]
    assert not (tmp_path / "run").exists()


@pytest.mark.gpu
def test_fsdp2_runs_on_gpus():
    if not torch.cuda.is_available() or torch.cuda.device_count() < 2:
        pytest.skip(
            "FSDP needs CUDA GPUs: accelerate runs an FSDP config as plain DDP on a CPU, so a CPU run "
            "would prove nothing (recipes/accelerate/fsdp2.yaml is for GPU machines)"
        )
    ok(launch("scripts/sft.py", ROOT / "recipes" / "tiny/sft.yaml", "--max_steps", "2", config="fsdp2"))
