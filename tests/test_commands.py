"""align/commands.py, the `smolalign` command: its registry, its entry point, `smolalign recipes`, the launch split.

python -m pytest -q tests/test_commands.py                       # ~1 min; the 2-rank launches are marked slow
"""

from __future__ import annotations

import json
import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from launching import free_port, launch_env
from test_chat import build_tokenizer

from align import commands, recipes
from align.commands import COMMANDS, Command, main, split_launch

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


def test_the_console_script_is_the_entry_point():
    """pyproject's [project.scripts] names align.commands:main, so `pip install -e .` puts `smolalign` on the PATH."""
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    scripts = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["scripts"]
    module, _, name = scripts["smolalign"].partition(":")
    assert (module, name) == ("align.commands", "main") and callable(getattr(commands, name))


def test_every_command_runs_a_script_and_every_script_has_a_command():
    """The registry is the one map: no script of scripts/ without a command, no command without its script."""
    assert sorted(c.script for c in COMMANDS.values()) == sorted(p.stem for p in (ROOT / "scripts").glob("*.py"))
    assert {
        "sft",
        "dpo",
        "kto",
        "orpo",
        "grpo",
        "distill",
        "pretrain",
        "tokenizer",
        "preferences",
        "answers",
        "eval",
        "pipeline",
        "ablate",
        "merge",
        "compare",
        "preflight",
        "passk",
        "bench",
    } <= set(COMMANDS)
    assert all(c.help and c.section in commands.SECTIONS for c in COMMANDS.values())


def test_help_lists_every_command(capsys):
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: smolalign COMMAND [RECIPE.yaml]")
    for name, command in COMMANDS.items():
        assert f"  {name} " in out and command.help in out, name
    assert "  recipes " in out


def test_an_unknown_command_is_one_error_line(capsys):
    with pytest.raises(SystemExit) as exit_:
        main(["gpro", "recipes/tiny/grpo.yaml"])
    out = capsys.readouterr()
    assert exit_.value.code == 2 and out.out == ""
    assert out.err.splitlines() == [
        "smolalign: error: unknown command 'gpro'; did you mean 'grpo'? run `smolalign --help` for the list"
    ]


def test_a_command_help_shows_the_recipe_first_and_our_fields_before_trls(capsys):
    """`smolalign grpo --help`: the usage line names the command and the recipe; our classes' groups come first."""
    assert main(["grpo", "--help"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: smolalign grpo [RECIPE.yaml] [--key value ...]")
    headers = [line[:-1] for line in out.splitlines() if line.endswith("):") and not line.startswith(" ")]
    assert headers[:5] == [
        "ScriptArguments (smolalign)",
        "GRPOConfig (smolalign)",
        "StageArgs (smolalign)",
        "AsyncArgs (smolalign)",
        "ReplayArgs (smolalign)",
    ]
    assert headers[-1] == "TrainingArguments (transformers)" and "GRPOConfig (trl)" in headers
    assert out.index("--reward_funcs") < out.index("--replay_data") < out.index("GRPOConfig (trl):")
    assert out.index("GRPOConfig (trl):") < out.index("--num_generations") < out.index("--weight_decay")


# ----------------------------------------------------------------------------------------------- a stage through it


@pytest.fixture(autouse=True)
def _root_logging():
    """A script run in this process calls logging.basicConfig on the captured stream of its test: undo it."""
    handlers = logging.root.handlers[:]
    yield
    logging.root.handlers[:] = handlers


@pytest.fixture(scope="module")
def tiny_sft_recipe(tmp_path_factory, tiny_model):
    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("commands")
    model = tiny_model(
        root / "model",
        build_tokenizer("smollm3"),
        arch="smollm3",
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
    )
    recipe = {
        "model_name_or_path": model,
        "dataset_name": "builtin:tasks",
        "dataset_args": {"num": 16, "mode": "mixed", "families": ["arithmetic"]},
        "eval_after": False,
        "output_dir": str(root / "sft"),
        "max_steps": 3,
        "per_device_train_batch_size": 4,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "max_length": 256,
        "bf16": False,
        "assistant_only_loss": True,
        "logging_steps": 1,
    }
    path = root / "sft.yaml"
    path.write_text("# python scripts/sft.py sft.yaml\n" + yaml.safe_dump(recipe))
    return path


def test_smolalign_sft_runs_the_script_with_its_overrides(tiny_sft_recipe, tmp_path):
    """`smolalign sft RECIPE --max_steps 1 --output_dir D` is `python scripts/sft.py RECIPE ...`: it trains the
    override's one step (not the recipe's 3) and saves a loadable model where the override says."""
    out = tmp_path / "sft"
    assert main(["sft", str(tiny_sft_recipe), "--max_steps", "1", "--output_dir", str(out)]) == 0
    report = json.loads((out / "sft_eval.json").read_text())
    # an epoch of the 16 rows is 4 steps of 4: one step is a quarter of it (the recipe's 3 would be 0.75)
    assert report["train"]["epoch"] == 0.25 and report["world_size"] == 1
    assert (out / "config.json").is_file() and (out / "tokenizer.json").is_file()


def test_a_user_error_through_the_command_is_the_scripts_one_line(tiny_sft_recipe, capsys):
    assert main(["sft", str(tiny_sft_recipe), "--learnig_rate", "1e-4"]) == 2
    err = capsys.readouterr().err.splitlines()
    assert err == ["smolalign: error: unknown key 'learnig_rate' in the command line; did you mean 'learning_rate'?"]


# ----------------------------------------------------------------------------------------------- smolalign recipes


def test_recipes_lists_every_recipe_file_with_its_stage_scale_and_purpose(capsys):
    assert main(["recipes"]) == 0
    lines = capsys.readouterr().out.splitlines()
    files = sorted(p for p in RECIPES.rglob("*") if p.suffix in (".yaml", ".yml", ".slurm", ".sh"))
    listed = {line.split()[0]: line.split()[1:3] for line in lines[1:]}
    assert sorted(listed) == sorted(str(p.relative_to(ROOT)) for p in files)
    for r in recipes.find(RECIPES):
        stage, scale = listed[str(r.path.relative_to(ROOT))]
        if r.kind == "recipe":  # the stage is the command its header runs
            assert stage in COMMANDS, r.path
        assert r.purpose, f"{r.path}: no purpose line"
    assert listed["recipes/tiny/sft.yaml"] == ["sft", "tiny"]
    assert listed["recipes/smollm3/long_context_32k.yaml"] == ["pretrain", "smollm3"]
    assert listed["recipes/accelerate/zero3.yaml"] == ["accelerate", "any"]


def test_recipes_filters_by_stage_and_scale_and_refuses_an_unknown_word(capsys):
    assert main(["recipes", "grpo", "tiny"]) == 0
    assert [line.split()[0] for line in capsys.readouterr().out.splitlines()[1:]] == ["recipes/tiny/grpo.yaml"]
    with pytest.raises(SystemExit):
        main(["recipes", "grp"])
    assert "nothing is filed under 'grp'; did you mean 'grpo'?" in capsys.readouterr().err


@pytest.mark.parametrize(
    "layout, head, expected",
    [  # where a file lives and what its header says -> (stage, scale), in today's flat layout or in folders
        (("tiny", "sft.yaml"), "# python scripts/sft.py recipes/tiny/sft.yaml\n# SFT of x.\n", ("sft", "tiny")),
        (
            ("smollm3/pretrain.yaml",),
            "# accelerate launch --num_processes 8 scripts/run_pretrain.py r.yaml\n",
            ("pretrain", "smollm3"),
        ),
        (("ablations", "smol135m_pairs.yaml"), "# python scripts/ablate.py r.yaml\n", ("ablate", "smol135m")),
        (("smol135m", "apo.yaml"), "# smolalign dpo recipes/smol135m/apo.yaml\n", ("dpo", "smol135m")),
        (("x.yaml",), "# python scripts/preflight.py x.yaml, then python scripts/grpo.py x.yaml\n", ("grpo", "")),
        (("x.yaml",), "# smolalign does it all: smolalign grpo x.yaml\n", ("grpo", "")),
    ],
)
def test_stage_and_scale_come_from_the_header_and_the_place(tmp_path, layout, head, expected):
    path = tmp_path.joinpath(*layout)
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(head + "max_steps: 1\n")
    r = recipes.read(path, tmp_path)
    assert r.kind == "recipe" and (commands.stage_of(r).name, r.scale) == expected


@pytest.mark.parametrize(
    "lines, purpose",
    [
        (
            ["python scripts/sft.py r.yaml", "GRPO for the tiny world on 2 CPU cores (~2 min): the tiny model, think"],
            "GRPO for the tiny world on 2 CPU cores (~2 min)",
        ),
        (["cmd", "CPU: `--num_processes 2` works too. More."], "CPU: `--num_processes 2` works too"),
        (["cmd", "APO (apo_zero: a loss) on pairs; rest"], "APO (apo_zero: a loss) on pairs"),
        (["cmd", "Version 0.9 of it, see github.com/x/y.yaml"], "Version 0.9 of it, see github.com/x/y.yaml"),
        (["cmd", "first line", "goes on here.", "", "second paragraph"], "first line goes on here"),
        (["cmd", "prose", "purpose: what this recipe is for"], "what this recipe is for"),
        (["cmd", "word " * 40], ("word " * 20).strip() + "…"),
        (["cmd"], ""),
    ],
)
def test_purpose_is_the_purpose_line_or_the_first_clause(lines, purpose):
    assert recipes.purpose_of(lines) == purpose


# ----------------------------------------------------------------------------------------------- launching


SFT = COMMANDS["sft"]


@pytest.mark.parametrize(
    "args, launch, rest",
    [
        (["r.yaml", "--learning_rate", "1e-4"], [], ["r.yaml", "--learning_rate", "1e-4"]),
        (
            ["r.yaml", "--num_processes", "2", "--max_steps", "1"],
            ["--num_processes", "2"],
            ["r.yaml", "--max_steps", "1"],
        ),
        (
            ["r.yaml", "--num-processes=2", "--use_deepspeed", "--seed", "3"],
            ["--num-processes=2", "--use_deepspeed"],
            ["r.yaml", "--seed", "3"],
        ),
        # a key the stage's configs define stays the stage's, though accelerate knows the name too
        (
            ["r.yaml", "--gradient_accumulation_steps", "4", "--num_processes", "2"],
            ["--num_processes", "2"],
            ["r.yaml", "--gradient_accumulation_steps", "4"],
        ),
        (
            ["r.yaml", "--accelerate_config", "ddp", "--num_processes", "2"],
            ["--config_file", str(RECIPES / "accelerate" / "ddp.yaml"), "--num_processes", "2"],
            ["r.yaml"],
        ),
        (["r.yaml", "--num_processes", "2", "--help"], [], ["r.yaml", "--num_processes", "2", "--help"]),
    ],
)
def test_launch_options_split_from_the_stages_keys(args, launch, rest):
    assert split_launch(SFT, args) == (launch, rest)


def test_a_command_without_launch_keeps_every_key():
    """The pipeline launches its stages itself: its num_processes is its own key, never accelerate's."""
    args = ["r.yaml", "--num_processes", "2", "--config_file", "x.yaml"]
    assert split_launch(COMMANDS["pipeline"], args) == ([], args)
    assert split_launch(Command("x", "sft", "", "train"), args) == ([], args)


@pytest.mark.parametrize(
    "value, message",
    [
        ("zero4", "is neither a file nor one accelerate config"),
        ("tiny_sft", "is neither a file nor one accelerate config"),
    ],
)
def test_an_unknown_accelerate_config_names_the_valid_ones(value, message):
    with pytest.raises(ValueError, match=f"{message}.*'ddp'.*'zero3'"):
        split_launch(SFT, ["r.yaml", "--accelerate_config", value])


def test_launch_options_inside_a_launched_process_are_refused(monkeypatch):
    monkeypatch.setenv("LOCAL_RANK", "0")
    with pytest.raises(ValueError, match="started by a launcher"):
        split_launch(SFT, ["r.yaml", "--num_processes", "2"])


CONSOLE_SCRIPT = """import re
import sys
from align.commands import main
if __name__ == '__main__':
    sys.argv[0] = re.sub(r'(-script\\.pyw|\\.exe)?$', '', sys.argv[0])
    sys.exit(main())
"""


@pytest.mark.slow
@pytest.mark.distributed
@pytest.mark.parametrize("form", ["module", "console_script", "launch_options"])
def test_smolalign_sft_on_two_ranks(form, tiny_sft_recipe, tmp_path):
    """The three ways to run `smolalign sft` under accelerate on 2 CPU ranks (DDP over gloo) train on both:
    `accelerate launch -m align.commands sft`, `accelerate launch $(which smolalign) sft` (the file pip writes for
    [project.scripts]), and `smolalign sft ... --num_processes 2 --accelerate_config ddp`."""
    out = tmp_path / "sft"
    stage = ["sft", str(tiny_sft_recipe), "--max_steps", "2", "--output_dir", str(out)]
    launch = [
        "--config_file",
        str(RECIPES / "accelerate" / "ddp.yaml"),
        "--num_processes",
        "2",
        "--main_process_port",
        str(free_port()),
    ]
    accelerate = [sys.executable, "-m", "accelerate.commands.launch", *launch]
    if form == "module":
        cmd = [*accelerate, "-m", "align.commands", *stage]
    elif form == "console_script":
        (tmp_path / "smolalign").write_text(CONSOLE_SCRIPT)
        cmd = [*accelerate, str(tmp_path / "smolalign"), *stage]
    else:
        cmd = [
            sys.executable,
            "-m",
            "align.commands",
            *stage,
            "--accelerate_config",
            "ddp",
            "--num_processes",
            "2",
            "--main_process_port",
            str(free_port()),
        ]
    proc = subprocess.run(cmd, cwd=ROOT, env=launch_env(), capture_output=True, text=True, timeout=400)
    assert proc.returncode == 0, (proc.stdout[-2000:], proc.stderr[-4000:])
    report = json.loads((out / "sft_eval.json").read_text())
    assert report["world_size"] == 2 and report["distributed_type"].endswith("MULTI_CPU"), report
    assert report["train"]["epoch"] == 1.0  # 2 steps of 2 ranks x 4 rows: the 16 rows once
