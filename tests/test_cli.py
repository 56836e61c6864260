"""The recipe CLI: precedence, one-line errors, and every recipe in recipes/ parses."""

import importlib.util
import subprocess
import sys
from pathlib import Path

import pytest
from trl import SFTConfig

from align import recipes as recipe_files
from align.cli import PROG, RecipeError, _defining_class, _origin, load_recipe, parse
from align.commands import script_path, stage_of
from align.config import ModelConfig, ScriptArguments

ROOT = Path(__file__).resolve().parents[1]
TYPES = (ScriptArguments, SFTConfig, ModelConfig)


@pytest.fixture
def recipe(tmp_path):
    def write(text: str) -> str:
        p = tmp_path / "r.yaml"
        p.write_text(text)
        return str(p)

    return write


def test_precedence_defaults_yaml_cli(recipe, tmp_path):
    path = recipe(
        f"output_dir: {tmp_path}/o\nuse_cpu: true\nlearning_rate: 1e-5\n"
        "num_train_epochs: 3\ndataset_name: builtin:news\n"
    )
    s, t, m = parse(*TYPES, args=[path, "--num_train_epochs", "5"])
    assert t.learning_rate == 1e-5  # YAML beats the default (and '1e-5', a YAML string, became a float)
    assert t.num_train_epochs == 5  # the command line beats YAML
    assert t.weight_decay == SFTConfig.weight_decay  # untouched default
    assert s.dataset_name == "builtin:news"


@pytest.mark.parametrize(
    "text, args, message",
    [
        ("dataset_nme: x\n", [], "unknown key 'dataset_nme' in .*did you mean 'dataset_name'"),
        ("learning_rate: fast\n", [], "key 'learning_rate' .* has value 'fast' .*expected float"),
        ("num_train_epochs: [1, 2]\n", [], "key 'num_train_epochs'"),
        ("a: [1, 2\n", [], "not valid YAML at line"),
        ("- 1\n- 2\n", [], "must be a YAML mapping"),
        (
            "learning_rate: 1.0\n",
            ["--learnig_rate", "3"],
            "unknown key 'learnig_rate' in the command line.*learning_rate",
        ),
    ],
)
def test_recipe_errors_name_the_problem(recipe, text, args, message):
    with pytest.raises(RecipeError, match=message):
        parse(*TYPES, args=[recipe(text), *args])


def test_missing_recipe_file():
    with pytest.raises(RecipeError, match="recipe file 'nope.yaml' not found"):
        load_recipe("nope.yaml", TYPES)


def _script(args: list[str]) -> subprocess.CompletedProcess:
    code = (
        "from trl import SFTConfig\nfrom align.cli import run\nfrom align.config import ScriptArguments, ModelConfig\n"
        "run(lambda s, t, m: print('RAN', t.learning_rate), ScriptArguments, SFTConfig, ModelConfig)\n"
    )
    return subprocess.run([sys.executable, "-c", code, *args], capture_output=True, text=True, timeout=120)


def test_bad_key_is_one_line_and_nonzero(recipe):
    proc = _script([recipe("output_dir: /tmp/x\nuse_cpu: true\nlearning_rat: 1.0\n")])
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    lines = [line for line in proc.stderr.splitlines() if line.startswith("smolalign: error")]
    assert len(lines) == 1 and "did you mean 'learning_rate'" in lines[0]
    assert "RAN" not in proc.stdout


def test_help_lists_fields_with_help_text():
    proc = _script(["--help"])
    assert proc.returncode == 0
    assert "--dataset_mixture" in proc.stdout and "weighted mixture" in proc.stdout
    assert "--learning_rate" in proc.stdout


SCRIPTS = sorted(p for p in (ROOT / "scripts").glob("*.py"))


@pytest.mark.parametrize("script", SCRIPTS, ids=lambda p: p.name)
def test_every_script_help_lists_its_fields(script, monkeypatch, capsys):
    """`python scripts/<x>.py --help` (run as __main__, in this process for speed): exit 0, every config field listed.
    Help text that quotes `{% generation %}` once ended sft.py's --help in 'must be real number, not dict'."""
    import dataclasses
    import runpy

    monkeypatch.setattr(sys, "argv", [str(script), "--help"])
    monkeypatch.syspath_prepend(str(script.parent))  # as `python scripts/<x>.py` does (benchmark.py imports so)
    with pytest.raises(SystemExit) as exit_:
        runpy.run_path(str(script), run_name="__main__")
    out = capsys.readouterr()
    assert exit_.value.code in (0, None), out.err[-2000:]
    assert "error" not in out.err.lower(), out.err[-2000:]
    namespace = runpy.run_path(str(script))  # not as __main__: only its definitions
    types = namespace.get("CONFIG_TYPES") or tuple(
        v
        for k, v in namespace.items()
        if dataclasses.is_dataclass(v) and k.endswith("Config") and v.__module__ == "<run_path>"
    )
    fields = [f.name for t in types for f in dataclasses.fields(t) if f.init]
    assert out.out.strip() and all(f"--{name}" in out.out for name in fields), [
        n for n in fields if f"--{n}" not in out.out
    ]
    if namespace.get("CONFIG_TYPES"):  # a recipe script (align.cli.parse): the recipe first, our fields first
        usage = out.out.splitlines()[0]
        assert usage.startswith("usage: python ") and usage.endswith(f"{script.name} [RECIPE.yaml] [--key value ...]")
        ours = [f.name for t in types for f in dataclasses.fields(t) if _origin(_defining_class(t, f.name)) == PROG]
        theirs = [f.name for t in types for f in dataclasses.fields(t) if f.name not in ours]
        assert ours, f"{script.name}: no field of ours"
        if theirs:
            first = lambda names: min(out.out.index(f"\n  --{n} ") for n in names)  # noqa: E731
            assert first(ours) < first(theirs), f"{script.name}: a library's field is listed before ours"


def _recipes() -> list[Path]:
    """Every recipe of a stage under recipes/, in any folder (accelerate configs and launch templates are not)."""
    return [r.path for r in recipe_files.find(ROOT / "recipes") if r.kind == "recipe"]


def _script_for(path: Path) -> Path:
    """Each recipe starts with the command that runs it; the script named there parses it."""
    stage = stage_of(recipe_files.read(path, ROOT / "recipes"))
    assert stage, f"{path.name}: the first lines must be a comment with the command that runs it"
    return script_path(stage)


@pytest.mark.parametrize("path", _recipes(), ids=lambda p: p.name)
def test_every_recipe_parses(path, tmp_path):
    script = _script_for(path)
    assert script.exists(), f"{path.name} names {script.name}, which does not exist"
    spec = importlib.util.spec_from_file_location(f"_script_{script.stem}", script)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses with postponed annotations look their module up here
    spec.loader.exec_module(module)
    assert hasattr(module, "CONFIG_TYPES"), f"{script.name} must define CONFIG_TYPES (the dataclasses it parses)"
    configs = parse(*module.CONFIG_TYPES, args=[str(path)])
    assert len(configs) == len(module.CONFIG_TYPES)


def test_dict_fields_from_the_command_line(recipe, tmp_path):
    path = recipe(f"output_dir: {tmp_path}/o\nuse_cpu: true\ndataset_args: {{num: 3}}\n")
    s, t, _ = parse(*TYPES, args=[path, "--dataset_args", "{num: 10, mode: think}", "--lr_scheduler_kwargs={a: 2}"])
    assert s.dataset_args == {"num": 10, "mode": "think"}  # the command line beats YAML for dicts too
    assert t.lr_scheduler_kwargs == {"a": 2}
    with pytest.raises(RecipeError, match="not valid YAML"):
        parse(*TYPES, args=[path, "--dataset_args", "{num: [1"])


def test_null_on_the_command_line_unsets_an_optional_recipe_value(recipe, tmp_path):
    path = recipe(f"output_dir: {tmp_path}/o\nuse_cpu: true\ndataset_name: builtin:news\nchat_template_path: chatml\n")
    s, t, _ = parse(*TYPES, args=[path, "--chat_template_path", "null", "--dataset_name=null"])
    assert t.chat_template_path is None and s.dataset_name is None


@pytest.mark.parametrize(
    "args",
    [
        ["--suites", "[generative, mc]"],  # YAML flow syntax, quoted
        ["--suites", "generative", "mc"],  # space-separated
        ["--suites", "[generative,", "mc]"],  # flow syntax the shell split (unquoted)
        ["--suites=[generative, mc]"],
    ],
)
def test_list_fields_take_yaml_flow_or_space_separated_values(recipe, args):
    from align.eval.suite import EvalConfig

    path = recipe("model_name_or_path: m\nsuites: [loss]\nmodes: [think]\nmc_sets: truthfulqa:4\n")
    (cfg,) = parse(EvalConfig, args=[path, *args, "--modes", "[plain, no_think]", "--max_new_tokens", "7"])
    assert cfg.suites == ["generative", "mc"]  # the command line beats YAML
    assert cfg.modes == ["plain", "no_think"] and cfg.max_new_tokens == 7  # the next key is still read
    assert cfg.mc_sets == ["truthfulqa:4"]  # a YAML scalar is the one-element list


def test_list_fields_in_trl_configs_and_bad_lists(recipe, tmp_path):
    from align.grpo.config import GRPOConfig

    path = recipe(f"output_dir: {tmp_path}/o\nuse_cpu: true\n")
    _, t, _ = parse(
        ScriptArguments, GRPOConfig, ModelConfig, args=[path, "--reward_funcs", "[math_reward, think_format_reward]"]
    )
    assert t.reward_funcs == ["math_reward", "think_format_reward"]
    _, t, _ = parse(
        ScriptArguments, GRPOConfig, ModelConfig, args=[path, "--reward_funcs", "math_reward", "think_format_reward"]
    )
    assert t.reward_funcs == ["math_reward", "think_format_reward"]
    with pytest.raises(RecipeError, match="--reward_funcs .* is not a valid YAML list"):
        parse(ScriptArguments, GRPOConfig, ModelConfig, args=[path, "--reward_funcs", "[a, [b]"])


def test_old_key_names_still_load_as_the_new_ones_with_one_warning(recipe, caplog):
    """One name per knob (rollout_backend + rollout_kwargs in every stage); a recipe with the old names still runs."""
    from align.eval.suite import EvalConfig
    from data_gen.preferences import PreferenceDataConfig

    path = recipe("model_name_or_path: m\nbackend: hf\n")
    with caplog.at_level("WARNING", logger="align.config"):
        (cfg,) = parse(EvalConfig, args=[path])
    assert cfg.rollout_backend == "hf" and cfg.backend is None
    assert [r.message for r in caplog.records if "'backend' is deprecated, use 'rollout_backend'" in r.message]
    path = recipe("method: graded\npolicy_model: p\nbackend: hf\nengine_kwargs: {batch_size: 4}\n")
    _, cfg = parse(ScriptArguments, PreferenceDataConfig, args=[path])
    assert (cfg.rollout_backend, cfg.rollout_kwargs, cfg.backend, cfg.engine_kwargs) == (
        "hf",
        {"batch_size": 4},
        None,
        None,
    )
    with pytest.raises(ValueError, match="rollout_backend"):
        EvalConfig(model_name_or_path="m", rollout_backend="vlm")


@pytest.mark.parametrize("world, expected", [(1, 128), (8, 16), (64, 2)])
def test_global_batch_size_sets_accumulation_for_the_launched_world(world, expected, monkeypatch, tmp_path):
    """smollm3/sft.yaml states SmolLM3's global batch (128), not an accumulation for one topology: 8 nodes x 8 GPUs
    accumulate 2 steps, one 8-GPU node 16, one process 128, so all train at 128 sequences a step."""
    from types import SimpleNamespace

    from align.config import apply_global_batch
    from align.sft.config import SFTConfig as OurSFTConfig

    _, t, _ = parse(
        ScriptArguments,
        OurSFTConfig,
        ModelConfig,
        args=[str(ROOT / "recipes" / "smollm3/sft.yaml"), "--output_dir", str(tmp_path / "o")],
    )
    assert t.global_batch_size == 128 and t.gradient_accumulation_steps == 128  # this process: one rank
    monkeypatch.setenv("WORLD_SIZE", str(world))  # what the launcher announces to every rank
    args = SimpleNamespace(
        global_batch_size=t.global_batch_size, per_device_train_batch_size=1, gradient_accumulation_steps=1
    )
    apply_global_batch(args)
    assert args.gradient_accumulation_steps == expected and world * expected == 128
    monkeypatch.setenv("WORLD_SIZE", "3")
    with pytest.raises(ValueError, match=r"global_batch_size=128 is not a multiple of .* 1 x 3 = 3"):
        apply_global_batch(args)


@pytest.mark.parametrize(
    "recipe, world, accumulation",
    [
        ("pretrain", 8, 24),
        ("pretrain", 192, 1),
        ("long_context_32k", 8, 9),
        ("long_context_64k", 8, 4),
        ("long_context_64k", 16, 2),
    ],
)
def test_pretraining_states_its_global_batch_too(recipe, world, accumulation, monkeypatch):
    """SmolLM3's pretraining recipes name rows per step, not an accumulation for the published 192 or 12 ranks: the
    pipeline's one-node launch (8 processes) and a cluster's train at the same tokens a step."""
    import importlib.util
    import sys

    from align.config import apply_global_batch

    spec = importlib.util.spec_from_file_location("pretrain_script", ROOT / "scripts" / "run_pretrain.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules["pretrain_script"] = script
    spec.loader.exec_module(script)
    _, cfg, _ = parse(*script.CONFIG_TYPES, args=[str(ROOT / "recipes" / "smollm3" / f"{recipe}.yaml")])
    monkeypatch.setenv("WORLD_SIZE", str(world))
    apply_global_batch(cfg, per_device="micro_batch_size", accumulation="grad_accum_steps")
    assert cfg.grad_accum_steps == accumulation
    assert world * cfg.micro_batch_size * accumulation * cfg.seq_len in (2_359_296, 2_097_152)  # 64k: 32 rows


def test_a_launch_prints_one_error_line_rank_0s_and_another_rank_still_speaks_alone(monkeypatch, capsys, tmp_path):
    """Every rank failing alike: rank 0 prints and leaves a marker, rank 1 sees it and exits silently (no fixed sleep
    to race a loaded machine). Rank 1 failing alone (no marker): it prints its own line, tagged with its rank."""
    from align import cli

    monkeypatch.setenv("MASTER_PORT", f"{tmp_path.stat().st_ino % 60000}")  # one launch per test run
    monkeypatch.setattr(cli, "OTHER_RANK_ERROR_DELAY_S", 1.0)
    monkeypatch.setattr("tempfile.gettempdir", lambda: str(tmp_path))
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as alone:
        cli.fail("only rank 1 has this problem")
    assert (
        alone.value.code == 1
        and capsys.readouterr().err == "smolalign: error: [rank 1] only rank 1 has this problem\n"
    )

    monkeypatch.setenv("RANK", "0")
    with pytest.raises(SystemExit):
        cli.fail("every rank has this problem", code=2)
    assert capsys.readouterr().err == "smolalign: error: every rank has this problem\n"
    monkeypatch.setenv("RANK", "1")
    with pytest.raises(SystemExit) as silent:
        cli.fail("every rank has this problem", code=2)
    assert silent.value.code == 2 and capsys.readouterr().err == ""


@pytest.mark.parametrize(
    "text, args, expected",
    [
        ("", [], False),  # unset: off on a CPU
        ("gradient_checkpointing: true\n", [], True),  # the recipe asked: kept on a CPU (it was dropped)
        ("gradient_checkpointing: true\n", ["--gradient_checkpointing", "false"], False),
        ("", ["--gradient_checkpointing", "true"], True),
    ],
)
def test_gradient_checkpointing_a_recipe_asks_for_is_kept_on_a_cpu(text, args, expected, recipe, tmp_path):
    """Until 2026-11-28 every stage turned checkpointing off without CUDA, asked for or not: a rehearsal of the
    smollm3 recipes never ran the GPU's checkpointed path, and the 135M GRPO recipe could not trade compute for
    its ~21 GB peak. Unset, it follows the device (TRL's True on CUDA, off on a CPU: see the last case)."""
    from types import SimpleNamespace

    import torch

    from align.grpo.config import GRPOConfig
    from align.runtime.device import apply_device_defaults

    path = recipe(f"output_dir: {tmp_path}/o\nreward_funcs: [math_reward]\n{text}")
    _, t, _ = parse(ScriptArguments, GRPOConfig, ModelConfig, args=[path, *args])
    assert t.gradient_checkpointing is expected
    for cuda in (True, False):
        unset = SimpleNamespace(gradient_checkpointing=None, global_batch_size=None, bf16=False)
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr(torch.cuda, "is_available", lambda cuda=cuda: cuda)
            apply_device_defaults(unset)
        assert unset.gradient_checkpointing is cuda
