"""The smollm3_* recipes as a GPU user runs them, rehearsed on this CPU with only the substitutions of
tests/cpu_substitutions.py: every hub dataset split they name exists (fast), and each trains 2 steps and saves
launched as its header says, on 2 CPU ranks (the `rehearsal` tier: ~25 min, not in `make test`).

Run: pytest tests/test_smollm3_recipes.py -q                  (fast part, ~5 s; in `make test`)
     pytest tests/test_smollm3_recipes.py -q -m rehearsal      (every recipe 2 steps on 2 CPU ranks under its own
                                                               accelerate config, then the pipeline: `make rehearsal`)
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
RECIPES = sorted(p for p in (ROOT / "recipes" / "smollm3").glob("*.yaml") if p.stem != "pipeline")
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
    reads = [{"spec": e["id"], "config": e.get("config"), "split": e.get("split", "train")}
             for e in (keys.get("dataset_mixture") or {}).get("datasets", [])]
    for src in (keys.get("sources") or {}).values():
        src = {"spec": src} if isinstance(src, str) else src
        reads.append({"spec": src["spec"], "config": src.get("config"), "split": src.get("split", "train"),
                      "data_dir": src.get("data_dir")})
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
    allowed = {"model_name_or_path", "teacher_model_name_or_path", "teacher_device", "teacher_quantization",
               "tokenizer_path", "init_from", "num_layers", "hidden_size", "num_heads", "num_kv_heads", "head_dim",
               "intermediate_size", "attn_implementation", "use_liger_kernel", "rollout_backend", "rollout_kwargs",
               "seq_len", "max_position_embeddings", "max_steps", "output_dir", "report_to", "eval_after",
               "preference_eval", "distill_eval", "skill_eval_num", "eval_rows"}
    assert set(overrides(recipe, fixtures, tmp_path)) <= allowed


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
    proc = subprocess.run([sys.executable, str(ROOT / "scripts" / "pipeline.py"), str(path)], env=env, cwd=ROOT,
                          capture_output=True, text=True, timeout=3000)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    manifest = json.loads((tmp_path / "run" / "manifest.json").read_text())
    assert [s["status"] for s in manifest["stages"]] == ["done"] * 10
    merged = json.loads((tmp_path / "run" / "merge" / "config.json").read_text())
    assert merged["rope_parameters"]["rope_type"] == "yarn"  # the final model reads past its trained context
    assert len(list((tmp_path / "run" / "apo").glob("checkpoint-*"))) == 2  # what the soup averaged
