"""Ablations (align/pipeline/ablation.py, align/pipeline/ablation_report.py, scripts/ablate.py): the verdict rule
against simulated nulls and a constructed +10-point variant; bad recipes fail before any run; the tiny ablation recipe
end to end on micro models, killed mid-run and resumed (finished runs skipped); the Slurm array file runs one run per
task."""

from __future__ import annotations

import json
import math
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import yaml

from align.eval.statistics import mean_over_seeds, paired_over_seeds
from align.pipeline.ablation import AblationConfig, plan

ROOT = Path(__file__).resolve().parents[1]
RECIPE = ROOT / "recipes" / "ablations" / "tiny_preference.yaml"


# ------------------------------------------------------------------------------------------------ the verdict


def _simulate(rng: random.Random, num_items: int, num_seeds: int, effect: float, seed_sd: float = 0.0):
    """Outcomes of a baseline and a variant on the same items under each seed: item i is solved with probability
    p_i (skewed low, like our held-out accuracies); `seed_sd` moves each trained model's logit (seed-to-seed spread);
    `effect` adds to the variant's probability (a real improvement)."""
    ps = [rng.betavariate(0.6, 1.4) for _ in range(num_items)]

    def model(shift: float) -> list[int]:
        offset = rng.gauss(0.0, seed_sd)
        out = []
        for p in ps:
            logit = math.log(max(p, 1e-4) / max(1 - p, 1e-4)) + offset
            q = min(1.0, max(0.0, 1 / (1 + math.exp(-logit)) + shift))
            out.append(int(rng.random() < q))
        return out

    return [(model(0.0), model(effect)) for _ in range(num_seeds)]


def _rate(verdicts: list[str], *words: str) -> float:
    return sum(v in words for v in verdicts) / len(verdicts)


def test_null_outcomes_give_a_verdict_in_about_five_percent_of_draws():
    rng = random.Random(0)
    verdicts = [paired_over_seeds(_simulate(rng, 128, 3, 0.0))["verdict"] for _ in range(1000)]
    assert _rate(verdicts, "better", "worse") <= 0.06
    assert _rate(verdicts, "better") <= 0.04 and _rate(verdicts, "worse") <= 0.04  # neither side favoured


def test_pooling_seeds_as_independent_items_would_not_hold_when_seeds_differ():
    """Why the seeds are a stratum with their own spread: with a seed-to-seed spread of a few points, a pooled
    McNemar over every (prompt, seed) pair calls "better"/"worse" far more often than 5%; ours stays near it."""
    rng = random.Random(1)
    draws = [_simulate(rng, 128, 3, 0.0, seed_sd=0.3) for _ in range(400)]
    ours = [paired_over_seeds(d) for d in draws]
    pooled = sum(r["pooled_p_value"] < 0.05 for r in ours) / len(ours)
    assert _rate([r["verdict"] for r in ours], "better", "worse") <= 0.14 < pooled


def test_a_ten_point_better_variant_is_better_and_a_worse_one_worse():
    rng = random.Random(2)
    better = [paired_over_seeds(_simulate(rng, 256, 3, 0.10)) for _ in range(50)]
    assert _rate([r["verdict"] for r in better], "better") >= 0.9
    assert (
        all(r["ci_low"] < 0.10 < r["ci_high"] for r in better[:10])
        or sum(r["ci_low"] < 0.10 < r["ci_high"] for r in better) >= 45
    )  # the interval covers the true gain
    one = paired_over_seeds(_simulate(random.Random(3), 256, 3, 0.10))
    assert one["verdict"] == "better" and len(one["per_seed"]) == 3 and one["gained"] > one["lost"]
    runs = _simulate(random.Random(4), 256, 3, 0.10)
    worse = paired_over_seeds([(v, b) for b, v in runs])  # the same runs with the roles swapped
    assert worse["verdict"] == "worse"


def test_paired_over_seeds_by_hand():
    # one seed, 10 items: 4 gained, 0 lost -> d = 0.4, var = (0.4 - 0.16) / 10
    r = paired_over_seeds([([0] * 4 + [1] * 6, [1] * 10)])
    assert r["difference"] == pytest.approx(0.4) and r["tau"] == 0.0
    se = math.sqrt((0.4 - 0.16) / 10)
    assert r["ci_high"] - r["ci_low"] == pytest.approx(2 * 1.959963984540054 * se)
    assert r["per_seed"][0]["p_value"] == 0.125  # exact McNemar: 2 * 0.5**4
    # two seeds that disagree: tau > 0 and a wider interval than either seed alone
    a, b = ([0] * 30 + [1] * 70, [1] * 100), ([1] * 100, [0] * 30 + [1] * 70)
    two = paired_over_seeds([a, b])
    assert two["tau"] > 0.2 and two["verdict"] == "within noise" and abs(two["difference"]) < 1e-9
    # a seed where nothing changed does not outweigh one where many prompts moved: every prompt weighs the same
    moved = ([0] * 20 + [1] * 5 + [0] * 75, [1] * 20 + [0] * 5 + [0] * 75)  # 20 gained, 5 lost
    still = ([1] * 30 + [0] * 70, [1] * 30 + [0] * 70)
    r = paired_over_seeds([moved, still, still])
    assert r["difference"] == pytest.approx(15 / 300) and r["per_seed"][0]["difference"] == pytest.approx(0.15)
    with pytest.raises(ValueError, match="same items"):
        paired_over_seeds([([0, 1], [1])])


def test_mean_over_seeds():
    r = mean_over_seeds([0.2, 0.3, 0.4], [100, 100, 100])
    assert r["mean"] == pytest.approx(0.3) and r["ci_high"] - r["mean"] == pytest.approx(4.303 * 0.1 / math.sqrt(3))
    same = mean_over_seeds([0.3, 0.3], [100, 100])  # seeds that agree: never narrower than the items' noise
    assert same["ci_high"] - same["mean"] == pytest.approx(12.706 * math.sqrt(0.21 / 100 / 2))
    one = mean_over_seeds([0.5], [48])
    assert (round(one["ci_low"], 3), round(one["ci_high"], 3)) == (0.364, 0.636)


# --------------------------------------------------------------------------------------------- recipe errors


def _cfg(**kw) -> AblationConfig:
    base = dict(
        name="x",
        base={"script": "apo", "recipe": "recipes/tiny/apo.yaml"},
        variants=[{"name": "a", "baseline": True}, {"name": "b", "overrides": {"beta": 0.2}}],
        seeds=[0, 1],
    )
    base.update(kw)
    return AblationConfig(**base)


@pytest.mark.parametrize(
    "kw, message",
    [
        ({"variants": [{"name": "a"}, {"name": "a"}]}, "names must be unique"),
        ({"variants": [{"name": "a", "baseline": True}, {"name": "b", "baseline": True}]}, "one baseline"),
        ({"variants": [{"name": "a", "overides": {}}]}, "unknown key(s) ['overides']"),
        ({"base": {"recipe": "x.yaml"}}, "base: give"),
        ({"seeds": [1, 1]}, "distinct seeds"),
        ({"executor": "k8s"}, "executor='k8s'"),
    ],
)
def test_bad_ablation_recipes_are_one_clear_error(kw, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(").replace(")", r"\)").replace("[", r"\[")):
        _cfg(**kw)


def test_plan_layers_overrides_and_seeds():
    cfg = _cfg(
        overrides={"max_steps": 3},
        variants=[
            {"name": "apo", "baseline": True, "overrides": {"max_steps": 5}},
            {"name": "kto", "script": "kto", "recipe": "recipes/tiny/kto.yaml"},
        ],
    )
    runs = plan(cfg)
    assert [r.name for r in runs] == ["apo-s0", "kto-s0", "apo-s1", "kto-s1"]  # seed-major
    stage = runs[0].pipeline["stages"][0]
    assert stage["overrides"]["max_steps"] == 5 and stage["overrides"]["seed"] == 0  # variant beats the common ones
    kto = runs[3].pipeline["stages"][0]
    assert kto["script"] == "kto" and kto["recipe"] == "recipes/tiny/kto.yaml" and kto["overrides"]["seed"] == 1
    assert kto["overrides"]["max_steps"] == 3 and runs[3].pipeline["tracking_group"] == "x"


def test_an_ablation_chooses_on_dev_and_refuses_the_sealed_test_unless_asked_by_name():
    runs = plan(_cfg())
    assert all(r.pipeline["sealed_test"] is False for r in runs)  # its runs never open the sealed test split
    with pytest.raises(
        ValueError,
        match="variant 'a', stage 'apo': eval_split='test' evaluates the sealed test split.*allow_sealed_test: true",
    ):
        plan(_cfg(eval_overrides={"eval_split": "test"}))
    asked = plan(_cfg(eval_overrides={"eval_split": "test"}, allow_sealed_test=True))
    assert len(asked) == 4


def test_a_variant_removes_keys_its_script_does_not_take(tmp_path):
    """ORPO has no loss_type: the variant's copy of the base recipe drops it, and the check passes."""
    from align.pipeline.ablation import check

    cfg = _cfg(
        run_dir=str(tmp_path / "abl"),
        overrides={"loss_type": ["apo_zero"]},
        variants=[
            {"name": "apo", "baseline": True},
            {"name": "orpo", "script": "orpo", "remove": ["loss_type", "precompute_ref_log_probs"]},
        ],
    )
    runs = plan(cfg)
    orpo = runs[1].pipeline["stages"][0]
    trimmed = yaml.safe_load(Path(orpo["recipe"]).read_text())
    assert "loss_type" not in trimmed and "loss_type" not in orpo["overrides"] and trimmed["beta"] == 0.1
    check(runs)
    with pytest.raises(ValueError, match="unknown key 'loss_type'"):
        check(
            plan(
                _cfg(
                    overrides={"loss_type": ["apo_zero"]},
                    variants=[{"name": "apo", "baseline": True}, {"name": "orpo", "script": "orpo"}],
                )
            )
        )


@pytest.mark.parametrize("path", sorted((ROOT / "recipes" / "ablations").glob("*.yaml")), ids=lambda p: p.name)
def test_every_ablation_recipe_plans_and_every_run_config_checks(path):
    from align.pipeline.ablation import check

    cfg = AblationConfig(**yaml.safe_load(path.read_text()))
    runs = plan(cfg)
    assert len(runs) == len(cfg.variants) * len(cfg.seeds)
    check(runs)  # every run's stage config against its script's dataclasses
    assert path.read_text().startswith(f"# python scripts/ablate.py recipes/ablations/{path.name}")


def _ablate(*args, **kw) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    return subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "ablate.py"), *map(str, args)],
        cwd=ROOT,
        env=env,
        capture_output=True,
        text=True,
        timeout=kw.get("timeout", 300),
    )


def test_a_bad_override_is_named_before_any_run(tmp_path):
    proc = _ablate(RECIPE, "--run_dir", tmp_path / "abl", "--overrides", "{learning_rte: 1.0e-5}")
    errors = [line for line in proc.stderr.splitlines() if line.startswith("smolalign: error:")]
    assert proc.returncode != 0 and len(errors) == 1, proc.stderr[-2000:]
    assert "unknown key 'learning_rte'" in errors[0] and "did you mean 'learning_rate'" in errors[0]
    assert not (tmp_path / "abl" / "runs").exists()  # nothing ran, nothing was written


# ------------------------------------------------------------------------------- the tiny ablation end to end


@pytest.fixture(scope="module")
def micro(tmp_path_factory, tiny_model):
    """A tiny random model with a chat template, and a directory of strong-vs-weak-shaped pairs."""
    from test_preference import _pairs

    from align.data.chat import setup_chat_format
    from pretrain.tokenizer import train_tokenizer

    root = tmp_path_factory.mktemp("ablation")
    train, test = _pairs("train", 32), _pairs("test", 8)
    texts = [m["content"] for row in train for m in row["prompt"] + row["chosen"] + row["rejected"]]
    tok = train_tokenizer(texts * 4, vocab_size=400)
    setup_chat_format(tok)
    model = tiny_model(root / "model", tok, seed=0)
    data = root / "pairs"
    data.mkdir()
    for name, rows in (("train", train), ("test", test)):
        (data / f"{name}.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    overrides = {
        "model_name_or_path": model,
        "dataset_name": str(data),
        "max_steps": 2,
        "per_device_train_batch_size": 8,
        "max_length": 128,
        "report_to": "none",
        "logging_steps": 1,
        "save_strategy": "steps",
        "save_steps": 1,
    }
    evals = {
        "suites": ["generative"],
        "gen_sets": ["tasks:8"],
        "modes": ["think"],
        "max_new_tokens": 8,
        "rollout_backend": "hf",
    }
    args = [
        "--overrides",
        yaml.safe_dump(overrides, default_flow_style=True).strip(),
        "--eval_overrides",
        yaml.safe_dump(evals, default_flow_style=True).strip(),
        "--tracking",
        "none",
        "--max_minutes",
        "null",
        "--variants",
        "[{name: apo_zero, baseline: true, overrides: {loss_type: [apo_zero]}}, {name: kto, script: "
        "kto, recipe: recipes/tiny/kto.yaml}]",
    ]
    return {"root": root, "args": args}


@pytest.mark.slow
def test_tiny_ablation_killed_mid_run_resumes_and_skips_finished_runs(micro):
    """recipes/ablations/tiny_preference.yaml on micro models (APO-zero vs KTO through scripts/kto.py, 2 seeds):
    SIGKILL the ablation once its first run finished, then run the same command: the finished run is skipped, the
    others run, and the table judges KTO against APO-zero on the same prompts per seed."""
    run_dir = micro["root"] / "abl"
    cmd = [sys.executable, str(ROOT / "scripts" / "ablate.py"), str(RECIPE), "--run_dir", str(run_dir), *micro["args"]]
    env = {**os.environ, "PYTHONPATH": str(ROOT), "WANDB_MODE": "offline", "OMP_NUM_THREADS": "1"}
    first = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    seen = []
    deadline = time.time() + 300
    for line in first.stdout:  # the first run finished and the second one started: kill it mid-run
        seen.append(line)
        if "kto-s0: running" in line or time.time() > deadline:
            break
    stage_log = run_dir / "runs" / "kto-s0" / "logs" / "apo.log"  # the ablated stage keeps its name
    while not stage_log.is_file() and time.time() < deadline:  # its stage is running (not only the pipeline)
        time.sleep(0.2)
    time.sleep(1.0)
    first.send_signal(signal.SIGKILL)  # the harshest stop: no handler runs in the ablation process
    first.wait()
    assert any("apo_zero-s0: done in" in line for line in seen), "".join(seen)[-3000:]
    import psutil

    def orphans() -> list:  # the running run's processes: it got SIGTERM from the kernel (parent death) and stops
        return [p for p in psutil.process_iter(["cmdline"]) if str(run_dir) in " ".join(p.info["cmdline"] or [])]

    for _ in range(240):
        if not orphans():
            break
        time.sleep(0.5)
    assert not orphans(), "a run outlived the killed ablation"
    log = (run_dir / "runs" / "kto-s0" / "ablation.log").read_text()
    assert "interrupted" in log, log[-2000:]  # stopped mid-run, not finished
    second = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert second.returncode == 0, second.stdout[-3000:] + second.stderr[-3000:]
    assert "apo_zero-s0: finished earlier (skipped)" in second.stdout
    assert "apo_zero-s0: running" not in second.stdout and "kto-s1: done in" in second.stdout
    result = json.loads((run_dir / "ablation.json").read_text())
    assert all(r["finished"] for r in result["runs"]) and len(result["runs"]) == 4
    kto = next(v for v in result["variants"] if v["variant"] == "kto")["metrics"]["acc/tasks/think"]
    assert kto["num_seeds"] == 2 and kto["vs_baseline"]["num_seeds"] == 2
    assert all(s["num"] == 8 for s in kto["vs_baseline"]["per_seed"])  # paired on the same 8 prompts per seed
    table = (run_dir / "ablation.md").read_text()
    assert "| **apo_zero** |" in table and "| kto | script kto, recipe recipes/tiny/kto.yaml |" in table
    assert (run_dir / "plots" / "metric.png").is_file() and (run_dir / "plots" / "curves.png").is_file()
    # every run's stage trained with its own seed and script
    kto_s1 = yaml.safe_load((run_dir / "runs" / "kto-s1" / "configs" / "apo.yaml").read_text())
    assert kto_s1["seed"] == 1 and kto_s1["loss_type"] == "kto"
    # a third call has nothing left to run
    third = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert third.stdout.count("finished earlier (skipped)") == 4 and "running" not in third.stdout

    # the Slurm array file: one task per run, in plan order; task i runs run i's pipeline (finished: it skips)
    slurm = _ablate(RECIPE, "--run_dir", run_dir, *micro["args"], "--executor", "slurm")
    assert slurm.returncode == 0, slurm.stderr[-2000:]
    path = run_dir / "slurm" / "ablation.sbatch"
    text = path.read_text()
    assert "#SBATCH --array=0-3\n" in text and "--requeue" in text and "--report_only true" in text
    assert subprocess.run(["bash", "-n", str(path)]).returncode == 0
    task = subprocess.run(
        ["bash", str(path)],
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=120,
        env={
            **env,
            "SLURM_ARRAY_TASK_ID": "1",
            "SLURM_SUBMIT_DIR": str(ROOT),
            "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ.get('PATH', '')}",
        },
    )
    assert task.returncode == 0, task.stdout[-2000:] + task.stderr[-2000:]
    assert "apo: skipped (finished earlier)" in task.stdout  # task 1 = kto at seed 0, already finished
    assert f'"{run_dir}/runs/kto-s0/pipeline.yaml"' in text.split("RUNS=(")[1].split(")")[0].split()[1]
    runs = plan(AblationConfig(**{**yaml.safe_load(RECIPE.read_text()), "run_dir": str(run_dir)}))
    assert [r.name for r in runs][:2] == ["apo_zero-s0", "dpo-s0"]  # the recipe's own plan: seed-major
