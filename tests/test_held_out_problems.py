"""No shipped recipe trains on a problem it is evaluated on: every recipe's training sets of our task families
regenerated and checked against every eval set, by canonical problem (data_gen.tasks.problem_key), not by prompt.

Read from every recipe under recipes/ (standalone, pipeline stages resolved with their overrides, ablation variants
planned): the training sets (`dataset_name` + `dataset_args`, `dataset_mixture` entries, `replay_data` +
`replay_args`, APO's `round_pairs_overrides`, pretraining `sources`) and the eval sets (the eval recipes' suites with
the pipelines' overrides, the stages' own held-out splits, pretraining's skill eval). Reasoning-gym rows cost ~2 ms
each, so those sets are checked on their first RG_ROWS rows, and a held-out set on its first HELD_OUT_ROWS (a test
row costs ten draws): make_tasks keeps the prefix, the first rows of a larger set are the same rows. No models.
"""

from __future__ import annotations

import json
from dataclasses import fields
from pathlib import Path

import yaml

from align.eval.suite import EvalConfig, eval_items
from align.pipeline.ablation import AblationConfig, plan
from align.pipeline.plan import PipelineConfig, read_yaml, resolve_stages
from data_gen.tasks import make_tasks, problem_key, training_problems
from data_gen.tool_tasks import canonical_problem as tool_problem
from data_gen.tool_tasks import make_tool_tasks

ROOT = Path(__file__).resolve().parents[1]
BUILTINS = ("builtin:tasks", "builtin:tool_tasks")
RG_ROWS = 300
HELD_OUT_ROWS = 5000
SKILL_SEED = 1234  # scripts/run_pretrain.py's skill eval draws its validation rows with this seed
HELD_OUT = "validation"  # the split a stage holds out when its recipe names none (align.data.loading.load_held_out)


def _builtin(spec) -> str | None:
    return spec if isinstance(spec, str) and spec in BUILTINS else None


def data_sets(config, out: set, cap: int | None = None) -> None:
    """Every builtin task set a config reads, walked through nested mappings and lists: (spec, split, args, role)
    with role "train" or "eval" (a stage's own held-out split, its `num` capped at `max_eval_samples` as the stage
    reads it) added to `out`."""
    if isinstance(config, list):
        for value in config:
            data_sets(value, out, cap)
        return
    if not isinstance(config, dict):
        return
    cap = config.get("max_eval_samples", cap)
    if spec := _builtin(config.get("dataset_name")):
        args = dict(config.get("dataset_args") or {})
        out.add((spec, config.get("dataset_train_split") or "train", json.dumps(args, sort_keys=True), "train"))
        held = {**args, "num": min(args.get("num", 1000), cap or 10**9)}
        out.add((spec, config.get("dataset_test_split") or HELD_OUT, json.dumps(held, sort_keys=True), "eval"))
        rounds = (config.get("round_pairs_overrides") or {}).get("dataset_args")
        if rounds:
            out.add((spec, "train", json.dumps(rounds, sort_keys=True), "train"))
            out.add((spec, HELD_OUT, json.dumps(rounds, sort_keys=True), "eval"))
    if spec := _builtin(config.get("replay_data")):
        out.add((spec, "train", json.dumps(config.get("replay_args") or {}, sort_keys=True), "train"))
    if spec := _builtin(config.get("id")):  # a mixture entry
        args = dict(config.get("args") or {})
        out.add((spec, config.get("split", "train"), json.dumps(args, sort_keys=True), "train"))
        held = {**args, "num": min(args.get("num", 1000), cap or 10**9)} if "num" in args or cap else args
        out.add((spec, config.get("test_split", HELD_OUT), json.dumps(held, sort_keys=True), "eval"))
    if spec := _builtin(config.get("spec")):  # a pretraining source
        args = {k: v for k, v in config.items() if k not in ("spec", "formatter", "text_column", "split", "config")}
        out.add((spec, config.get("split", "train"), json.dumps(args, sort_keys=True), "train"))
    for key, value in config.items():
        if key not in ("round_pairs_overrides",):
            data_sets(value, out, cap)


def generated(spec: str, split: str, args: dict) -> tuple:
    """What the builtin's rows depend on (its `mode` only formats them), with the row caps of the module doc."""
    families = args.get("families")
    if isinstance(families, str):
        families = [f.strip() for f in families.split(",") if f.strip()]
    num = args.get("num", 1000 if spec == "builtin:tasks" else 300)
    if any(f.startswith("rg:") for f in families or ()):
        num = min(num, RG_ROWS)
    if split != "train":
        num = min(num, HELD_OUT_ROWS)
    apart = json.dumps(args.get("exclude_problems_of"), sort_keys=True)
    return spec, split, tuple(families or ()), num, args.get("seed", 0), json.dumps(args.get("difficulty", 1)), apart


def rows_of(
    spec: str, split: str, families: tuple, num: int, seed: int, difficulty: str, apart: str = "null"
) -> list[dict]:
    if spec == "builtin:tool_tasks":
        return make_tool_tasks(list(families) or None, num=num, split=split, seed=seed)
    exclude = training_problems(json.loads(apart)) if split == "train" else frozenset()
    return make_tasks(
        list(families) or None, num=num, split=split, seed=seed, difficulty=json.loads(difficulty), exclude=exclude
    )


def problem(row: dict) -> tuple[str, str]:
    family = row["family"]
    key = tool_problem(family, row["prompt"]) if family.startswith("tool_") else problem_key(family, row["prompt"])
    return family, key


def shipped_configs() -> tuple[list[tuple[str, dict]], list[tuple[str, dict]]]:
    """(every config that trains or holds out data, every eval-suite config), named by where they come from."""
    configs, evals = [], []
    eval_keys = {f.name for f in fields(EvalConfig)}
    pipeline_keys, ablation_keys = set(PipelineConfig.__dataclass_fields__), set(AblationConfig.__dataclass_fields__)
    for path in sorted((ROOT / "recipes").rglob("*.yaml")):
        name = str(path.relative_to(ROOT))
        raw = yaml.safe_load(path.read_text()) or {}
        if not isinstance(raw, dict):
            continue
        pipelines = []
        if isinstance(raw.get("stages"), list) and all(isinstance(s, dict) and "script" in s for s in raw["stages"]):
            pipelines = [PipelineConfig(**{k: v for k, v in raw.items() if k in pipeline_keys})]
        elif "variants" in raw:
            ablation = AblationConfig(**{k: v for k, v in raw.items() if k in ablation_keys})
            ablation.run_dir = "/nonexistent/ablation"  # planned only: nothing is written for these variants
            pipelines = [PipelineConfig(**run.pipeline) for run in plan(ablation)]
        else:
            configs.append((name, raw))
            if {"gen_sets", "mc_sets", "suites"} & set(raw):
                evals.append((name, {k: v for k, v in raw.items() if k in eval_keys}))
        for pipe in pipelines:
            base = read_yaml(ROOT / pipe.eval_recipe, "eval_recipe") if pipe.eval_recipe else None
            for stage in resolve_stages(pipe):
                configs.append((f"{name}:{stage.name}", stage.config))
                if base is not None and stage.eval:
                    merged = {**base, **(pipe.eval_overrides or {}), **stage.eval_overrides}
                    evals.append((f"{name}:{stage.name}:eval", {k: v for k, v in merged.items() if k in eval_keys}))
    return configs, evals


def test_no_recipe_trains_on_a_problem_any_recipe_evaluates():
    configs, evals = shipped_configs()
    assert len(configs) > 30 and len(evals) > 10
    sets: set[tuple] = set()
    for _, config in configs:
        data_sets(config, sets)
        if config.get("skill_eval_num"):
            families = [f for f in str(config.get("skill_families") or "").split(",") if f.strip()] or None
            sets.add(
                (
                    "builtin:tasks",
                    HELD_OUT,
                    json.dumps(
                        {"families": families, "num": config["skill_eval_num"], "seed": SKILL_SEED}, sort_keys=True
                    ),
                    "eval",
                )
            )
    trained: dict[tuple[str, str], str] = {}
    evaluated: dict[tuple[str, str], str] = {}
    for role in ("train", "eval"):
        for key in sorted({generated(spec, split, json.loads(args)) for spec, split, args, r in sets if r == role}):
            for row in rows_of(*key):
                (trained if role == "train" else evaluated).setdefault(problem(row), str(key))
    seen_configs = set()
    for name, config in evals:
        key = json.dumps(config, sort_keys=True, default=str)
        if key in seen_configs:
            continue
        seen_configs.add(key)
        for split in ("dev", "test"):  # every choice is made on dev; the sealed test is evaluated at the chain's end
            cfg = EvalConfig(**{**config, "model_name_or_path": "unused", "eval_split": split})
            for set_name, rows in eval_items(cfg).items():
                for row in rows or []:
                    if isinstance(row.get("family"), str):
                        evaluated.setdefault(problem(row), f"{name} {set_name} ({split})")
    assert len(trained) > 50_000 and len(evaluated) > 2_000
    shared = sorted(set(trained) & set(evaluated))
    assert not shared, [(p, trained[p], evaluated[p]) for p in shared[:5]]


def test_the_walk_finds_every_kind_of_data_key():
    """The walker itself: a set read through each key is found, with its split (so the check above can fail)."""
    found: set = set()
    data_sets(
        {
            "dataset_name": "builtin:tasks",
            "dataset_args": {"num": 5},
            "dataset_train_split": "test",
            "replay_data": "builtin:tasks",
            "replay_args": {"seed": 5},
            "dataset_mixture": {"datasets": [{"id": "builtin:tool_tasks", "args": {"num": 3}}]},
            "stages": [{"sources": {"tasks": {"spec": "builtin:tasks", "num": 7, "formatter": "x"}}}],
            "round_pairs_overrides": {"dataset_args": {"num": 9}},
        },
        found,
    )
    assert found == {
        ("builtin:tasks", "test", '{"num": 5}', "train"),
        ("builtin:tasks", "validation", '{"num": 5}', "eval"),
        ("builtin:tasks", "train", '{"num": 9}', "train"),
        ("builtin:tasks", "validation", '{"num": 9}', "eval"),
        ("builtin:tasks", "train", '{"seed": 5}', "train"),
        ("builtin:tool_tasks", "train", '{"num": 3}', "train"),
        ("builtin:tool_tasks", "validation", '{"num": 3}', "eval"),
        ("builtin:tasks", "train", '{"num": 7}', "train"),
    }
    # a recipe that trains on the test split: its rows are the eval rows' problems
    rows = rows_of(*generated("builtin:tasks", "test", {"num": 20}))
    assert {problem(r) for r in rows} & {problem(r) for r in make_tasks(num=20, split="test")}


def sft_and_grpo_pairs() -> list[tuple[str, dict, dict]]:
    """(where, SFT config, GRPO config) of every shipped chain: each pipeline's GRPO stages with the SFT stage they
    descend from (through the recorded parents), and each folder's standalone `<x>grpo.yaml` with its `<x>sft.yaml`."""
    pairs = []
    for path in sorted((ROOT / "recipes").rglob("*grpo.yaml")):
        sft = path.with_name(path.name.replace("grpo", "sft"))
        if sft.is_file():
            pairs.append(
                (str(path.relative_to(ROOT)), yaml.safe_load(sft.read_text()), yaml.safe_load(path.read_text()))
            )
    keys = set(PipelineConfig.__dataclass_fields__)
    for path in sorted((ROOT / "recipes").rglob("*.yaml")):
        raw = yaml.safe_load(path.read_text()) or {}
        if not (
            isinstance(raw, dict)
            and isinstance(raw.get("stages"), list)
            and all(isinstance(s, dict) and "script" in s for s in raw["stages"])
        ):
            continue
        stages = {s.name: s for s in resolve_stages(PipelineConfig(**{k: v for k, v in raw.items() if k in keys}))}
        for stage in stages.values():
            node = stage
            while stage.script == "grpo" and node.parent:
                node = stages[node.parent]
                if node.script == "sft":
                    pairs.append((f"{path.relative_to(ROOT)}:{stage.name}", node.config, stage.config))
                    break
    return pairs


def training_problems_of(config: dict) -> set[tuple[str, str]]:
    """The problems of the builtin task rows a config trains on (its replay rows, SFT's own by design, left out)."""
    sets: set = set()
    data_sets({k: v for k, v in config.items() if k not in ("replay_data", "replay_args")}, sets)
    return {
        problem(row)
        for key in {generated(spec, split, json.loads(args)) for spec, split, args, role in sets if role == "train"}
        for row in rows_of(*key)
    }


def test_grpo_trains_on_problems_its_sft_stage_never_saw():
    """Different seeds of builtin:tasks draw the same problems (the same seed, the same rows): every shipped GRPO
    recipe draws its prompts apart from its SFT's by problem, or declares the reuse (`reuse_sft_prompts`)."""
    pairs = sft_and_grpo_pairs()
    names = [n for n, _, _ in pairs]
    assert {
        "recipes/tiny/grpo.yaml",
        "recipes/smol135m/grpo.yaml",
        "recipes/tiny/pipeline.yaml:grpo",
        "recipes/smol135m/pipeline.yaml:grpo",
        "recipes/tiny/micro_pipeline.yaml:grpo",
    } <= set(names), names
    for name, sft, grpo in pairs:
        shared = training_problems_of(sft) & training_problems_of(grpo)
        if grpo.get("reuse_sft_prompts"):
            continue
        assert not shared, (name, sorted(shared)[:5])
    # the check can fail: the tiny GRPO recipe without its exclusion holds SFT's count_letters problems
    sft, grpo = next((s, g) for n, s, g in pairs if n == "recipes/tiny/grpo.yaml")
    plain = {**grpo, "dataset_args": {k: v for k, v in grpo["dataset_args"].items() if k != "exclude_problems_of"}}
    assert len(training_problems_of(sft) & training_problems_of(plain)) > 100
