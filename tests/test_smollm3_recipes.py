"""The recipes/smollm3/ recipes as a GPU user runs them, rehearsed on this CPU with only the substitutions of
tests/cpu_substitutions.py: every hub dataset split they name exists and the post-training pipeline plans its
stages from SFT on, one launch for all (fast), and each trains 2 steps and saves launched as its header says, on 2
CPU ranks, then both pipelines end to end (the `rehearsal` tier: ~35 min, not in `make test`).

Run: pytest tests/test_smollm3_recipes.py -q                  (fast part, ~10 s; in `make test`)
     pytest tests/test_smollm3_recipes.py -q -m rehearsal      (every recipe 2 steps on 2 CPU ranks under its own
                                                               accelerate config, then the pipelines: `make rehearsal`)
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml
from cpu_substitutions import build, command, overrides, script_of

from align.data.hub import MIRROR_ENV, load_split

ROOT = Path(__file__).resolve().parents[1]
RECIPES = sorted(p for p in (ROOT / "recipes" / "smollm3").glob("*.yaml") if not p.stem.endswith("pipeline"))
POST_TRAIN = ROOT / "recipes" / "smollm3" / "post_train_pipeline.yaml"
BASE_MODEL = "HuggingFaceTB/SmolLM3-3B-Base"
TRAINING = [p for p in RECIPES if script_of(p) != "merge"]


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def fixtures(tmp_path_factory):
    return build(tmp_path_factory.mktemp("cpu"))


def _hub_reads(recipe: Path) -> list[dict]:
    keys = yaml.safe_load(recipe.read_text())
    reads = [
        {"spec": e["id"], "config": e.get("config"), "split": e.get("split", "train")}
        for e in (keys.get("dataset_mixture") or {}).get("datasets", [])
    ]
    for src in (keys.get("sources") or {}).values():
        src = {"spec": src} if isinstance(src, str) else src
        reads.append(
            {
                "spec": src["spec"],
                "config": src.get("config"),
                "split": src.get("split", "train"),
                "data_dir": src.get("data_dir"),
            }
        )
    return [r for r in reads if not r["spec"].startswith("builtin:")]  # builtins ship in pip packages


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_every_dataset_split_a_recipe_names_exists(recipe, fixtures, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, fixtures["hub"])
    for read in _hub_reads(recipe):
        args = {"data_dir": read["data_dir"]} if read.get("data_dir") else {}
        ds = load_split(read["spec"], read["split"], read["config"], streaming=True, **args)
        assert next(iter(ds)), read


@pytest.mark.parametrize("recipe", RECIPES, ids=lambda p: p.stem)
def test_the_substitutions_touch_only_model_data_kernels_and_run_length(recipe, fixtures, tmp_path):
    allowed = {
        "model_name_or_path",
        "teacher_model_name_or_path",
        "teacher_device",
        "teacher_quantization",
        "tokenizer_path",
        "init_from",
        "num_layers",
        "hidden_size",
        "num_heads",
        "num_kv_heads",
        "head_dim",
        "intermediate_size",
        "use_liger_kernel",
        "rollout_backend",
        "rollout_kwargs",
        "seq_len",
        "max_position_embeddings",
        "max_steps",
        "output_dir",
        "report_to",
        "eval_after",
        "preference_eval",
        "distill_eval",
        "skill_eval_num",
        "eval_rows",
    }
    assert set(overrides(recipe, fixtures, tmp_path)) <= allowed


def test_the_post_training_pipeline_plans_sft_on_from_the_hub_base_on_one_launch(tmp_path):
    """Its dry run: SFT -> APO -> soup -> merge -> GRPO, SFT from the hub's base model, every training stage launched
    with ZeRO-3 on 8 processes and the merges in one process each; nothing written."""
    import io

    from rich.console import Console

    from align.cli import parse
    from align.pipeline.plan import PipelineConfig, resolve_stages
    from align.pipeline.run import run_pipeline

    (cfg,) = parse(PipelineConfig, args=[str(POST_TRAIN), "--dry_run", "true", "--run_dir", str(tmp_path / "run")])
    console = Console(file=io.StringIO(), width=1000)
    run_pipeline(cfg, console)
    lines = console.file.getvalue().splitlines()
    assert [line.split(":")[0] for line in lines] == ["sft", "apo", "apo_soup", "merge", "grpo"]
    launch = (
        f"-m accelerate.commands.launch --config_file recipes/accelerate/zero3.yaml --num_processes 8 {ROOT}/scripts/"
    )
    trained = [line for line in lines if not line.startswith(("apo_soup", "merge"))]
    assert all(launch in line for line in trained) and len(trained) == 3
    assert all("accelerate" not in line and "scripts/merge.py" in line for line in lines if line not in trained)
    stages = {s.name: s for s in resolve_stages(cfg)}
    assert stages["sft"].config["model_name_or_path"] == BASE_MODEL and stages["sft"].parent is None
    assert stages["merge"].config["models"] == [f"{tmp_path}/run/apo_soup", BASE_MODEL]
    assert [stages[n].parent for n in ("apo", "grpo")] == ["sft", "merge"]
    assert not (tmp_path / "run").exists()


def test_every_recipe_that_loads_a_model_asks_for_auto_attention():
    """flash-attn is optional: `auto` takes it when installed on CUDA, else sdpa, so no recipe fails without it (and
    the CPU rehearsal substitutes no attention kernel)."""
    loads = {p.stem: yaml.safe_load(p.read_text()).get("attn_implementation") for p in TRAINING}
    assert all(v in (None, "auto") for v in loads.values()), loads  # unset is auto for every script
    assert sum(v == "auto" for v in loads.values()) >= 7


@pytest.mark.rehearsal
@pytest.mark.parametrize("recipe", TRAINING, ids=lambda p: p.stem)
def test_each_recipe_trains_two_steps_and_saves_on_two_cpu_ranks(recipe, fixtures, tmp_path):
    """As its header launches it (its own accelerate config, ZeRO-2/3 here), with 2 CPU ranks."""
    argv, env = command(recipe, fixtures, tmp_path / "out", ranks=2, port=_free_port())
    proc = subprocess.run(argv, env=env, cwd=ROOT, capture_output=True, text=True, timeout=1200)
    assert proc.returncode == 0, proc.stderr[-3000:]
    out = tmp_path / "out"
    assert (out / "config.json").is_file() and (out / "model.safetensors").is_file()
    if script_of(recipe) == "run_pretrain":
        assert len(json.loads((out / "metrics.json").read_text())["history"]) == 2
    else:
        assert json.loads((out / "generation_config.json").read_text())["eos_token_id"]


@pytest.mark.rehearsal
def test_the_smollm3_pipeline_runs_end_to_end_on_two_cpu_ranks(fixtures, tmp_path):
    """pretrain -> long context x2 -> mid-training -> SFT -> APO -> soup -> merge -> GRPO -> distillation, each
    training stage on 2 CPU ranks under its recipe's accelerate config."""
    import sys

    from cpu_substitutions import pipeline_config

    config = pipeline_config(ROOT / "recipes" / "smollm3/pipeline.yaml", fixtures, tmp_path / "run", ranks=2)
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    _, env = command(RECIPES[0], fixtures, tmp_path / "unused")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "pipeline.py"), str(path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert [s["status"] for s in manifest["stages"]] == ["done"] * 10
    merged = json.loads((tmp_path / "run" / "merge" / "config.json").read_text())
    assert merged["rope_parameters"]["rope_type"] == "yarn"  # the final model reads past its trained context
    assert len(list((tmp_path / "run" / "apo").glob("checkpoint-*"))) == 2  # what the soup averaged


@pytest.mark.rehearsal
def test_the_post_training_pipeline_runs_from_the_hub_base_on_two_cpu_ranks(fixtures, tmp_path):
    """SFT -> APO -> soup -> merge -> GRPO from the base model's hub id (the tiny base in a hub-cache fixture, read
    by the hub client as on a GPU node), every training stage under the pipeline's ZeRO-3 launch on 2 CPU ranks."""
    import sys

    from cpu_substitutions import pipeline_config

    config = pipeline_config(POST_TRAIN, fixtures, tmp_path / "run", ranks=2)
    assert config["stages"][0]["overrides"]["model_name_or_path"] == BASE_MODEL  # the recipe's own hub id
    path = tmp_path / "pipeline.yaml"
    path.write_text(yaml.safe_dump(config, sort_keys=False))
    _, env = command(RECIPES[0], fixtures, tmp_path / "unused")
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "pipeline.py"), str(path)],
        env=env,
        cwd=ROOT,
        capture_output=True,
        text=True,
        timeout=3000,
    )
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert [(s["name"], s["status"]) for s in manifest["stages"]] == [
        (n, "done") for n in ("sft", "apo", "apo_soup", "merge", "grpo")
    ]
    launches = [s["command"] for s in manifest["stages"] if s["name"] in ("sft", "apo", "grpo")]
    assert all(c[c.index("--config_file") + 1].endswith("zero3.yaml") for c in launches)
    snapshot = Path(fixtures["hub_cache"]) / f"models--{BASE_MODEL.replace('/', '--')}" / "snapshots"
    merged = yaml.safe_load((tmp_path / "run" / "merged" / "merge_config.yaml").read_text())
    assert Path(merged["models"][1]["model"]).parent == snapshot  # the base, read from the hub cache
    config = json.loads((tmp_path / "run" / "merged" / "config.json").read_text())
    assert config["rope_parameters"]["rope_type"] == "yarn"
    assert (tmp_path / "run" / "grpo" / "model.safetensors").is_file()
