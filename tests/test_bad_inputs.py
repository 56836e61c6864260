"""The bad-input corpus: every recipe in tests/fixtures/bad_inputs/ must end in ONE clear message naming the problem,
a non-zero exit code, and no output a re-run would mistake for finished work.

Each fixture is a recipe whose header says how it runs and what must happen:

    # python scripts/dpo.py tests/fixtures/bad_inputs/<name>.yaml     the stage (its script)
    # expect: <regex>                                                the one error line must match it
    # code: 1 | 2                                                    exit code (2: recipe/command line, 1: the run)
    # setup: <name>                                                  files the case needs (see SETUPS below)
    # args: --key value                                              extra command-line arguments
    # subprocess: true                                               run through the real script, not in-process

Placeholders: {model} a tiny random model dir, {pairs} / {prompts} valid preference / GRPO data dirs, {out} the
output dir, {dir} a scratch dir, {fixtures} this fixture dir. The same recipes without their defect pass the
preflight (test_valid_recipes_pass_the_preflight), so each case fails for its own reason.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from align.runtime.checkpoint import latest_checkpoint, write_marker

REPO = Path(__file__).resolve().parents[1]
FIXTURES = REPO / "tests" / "fixtures" / "bad_inputs"
CASES = sorted(p.stem for p in FIXTURES.glob("*.yaml"))


def _meta(name: str) -> dict:
    meta = {"code": "1", "args": "", "setup": "", "subprocess": "false", "nooutput": "false"}
    for line in (FIXTURES / f"{name}.yaml").read_text().splitlines():
        if not line.startswith("#"):
            break
        if m := re.match(r"#\s*python scripts/(\w+)\.py", line):
            meta["stage"] = m.group(1)
        elif m := re.match(r"#\s*(\w+):\s?(.*)$", line):
            meta[m.group(1)] = m.group(2)
    return meta


def _jsonl(path: Path, rows: list[dict]) -> str:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
    return str(path)


def _pair(q: str, good: str, bad: str) -> dict:
    return {
        "prompt": [{"role": "user", "content": q}],
        "chosen": [{"role": "assistant", "content": good}],
        "rejected": [{"role": "assistant", "content": bad}],
    }


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A tiny random Llama + our tokenizer, and valid preference and GRPO data dirs."""
    from transformers import LlamaConfig, LlamaForCausalLM

    from data_gen.tasks import assistant_text, make_tasks, prompt_messages
    from pretrain.tokenizer import train_tokenizer

    torch.set_num_threads(1)
    root = tmp_path_factory.mktemp("bad_inputs")
    tasks = make_tasks(["arithmetic", "compare", "count_items"], num=32, split="train", seed=0)
    pairs = [
        {
            "prompt": prompt_messages(r, "no_think"),
            "chosen": [{"role": "assistant", "content": assistant_text(r, "no_think")}],
            "rejected": [{"role": "assistant", "content": "I am not sure."}],
        }
        for r in tasks
    ]
    texts = [m["content"] for p in pairs for m in p["prompt"] + p["chosen"] + p["rejected"]]
    tok = train_tokenizer(texts * 4, vocab_size=300)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=32,
        intermediate_size=64,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=256,
        tie_word_embeddings=True,
        pad_token_id=tok.pad_token_id,
        eos_token_id=tok.eos_token_id,
    )
    torch.manual_seed(0)
    LlamaForCausalLM(config).save_pretrained(root / "model")
    tok.save_pretrained(root / "model")
    _jsonl(root / "pairs" / "train.jsonl", pairs)
    prompts = [{k: r[k] for k in ("prompt", "answer", "family", "reward")} for r in tasks]
    _jsonl(root / "prompts" / "train.jsonl", prompts)
    return {
        "model": str(root / "model"),
        "pairs": str(root / "pairs"),
        "prompts": str(root / "prompts"),
        "pair_rows": pairs,
        "prompt_rows": prompts,
    }


def _checkpoint(out: Path, world, complete: bool, optimizer: bytes | None = None, foreign: bool = False) -> None:
    from safetensors.torch import save_file
    from transformers import AutoModelForCausalLM

    ckpt = out / "checkpoint-2"
    ckpt.mkdir(parents=True)
    state = {
        k: v.contiguous()
        for k, v in AutoModelForCausalLM.from_pretrained(world["model"]).state_dict().items()
        if k != "lm_head.weight"
    }
    if foreign:
        state["model.embed_tokens.weight"] = torch.zeros(7, 5)
    save_file(state, ckpt / "model.safetensors")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 2, "log_history": []}))
    if optimizer is not None:
        (ckpt / "optimizer.pt").write_bytes(optimizer)
    if complete:
        write_marker(str(ckpt), 2)


def _sorted_pairs(world, d: Path, out: Path):
    rows = [
        _pair(f"What is {k} + {k}?", f"The answer is \\boxed{{{2 * k}}}." + " Indeed so." * k, "No.")
        for k in range(40)
    ]
    return _jsonl(d / "sorted.jsonl", rows)  # the k-th row is k phrases long: ordered by length


SETUPS = {
    "empty_dir": lambda w, d, out: (d / "empty_dir").mkdir(),
    "empty_jsonl": lambda w, d, out: (d / "empty.jsonl").write_text(""),
    "sft_rows": lambda w, d, out: _jsonl(
        d / "sft.jsonl", [{"messages": p["prompt"] + p["chosen"]} for p in w["pair_rows"]]
    ),
    "identical_pairs": lambda w, d, out: _jsonl(
        d / "identical.jsonl", [{**p, "rejected": p["chosen"]} for p in w["pair_rows"]]
    ),
    "mistyped_pairs": lambda w, d, out: _jsonl(d / "mistyped.jsonl", [{**p, "chosen": 5} for p in w["pair_rows"]]),
    "no_assistant": lambda w, d, out: _jsonl(
        d / "no_assistant.jsonl",
        [
            {**p, "chosen": [{**p["chosen"][0], "role": "user"}], "rejected": [{**p["rejected"][0], "role": "user"}]}
            for p in w["pair_rows"]
        ],
    ),
    "no_answer": lambda w, d, out: _jsonl(d / "no_answer.jsonl", [{"prompt": r["prompt"]} for r in w["prompt_rows"]]),
    "always_one": lambda w, d, out: _jsonl(
        d / "always_one.jsonl", [{**r, "reward": "always_one_reward"} for r in w["prompt_rows"]]
    ),
    "output_file": lambda w, d, out: (d / "a_file").write_text("not a directory"),
    "full_disk": lambda w, d, out: None,  # in-process: shutil.disk_usage reports 1 kB free (see the test)
    "partial_checkpoint": lambda w, d, out: _checkpoint(out, w, complete=False),
    "corrupt_checkpoint": lambda w, d, out: _checkpoint(out, w, complete=True, optimizer=b"\x00torn write"),
    "foreign_checkpoint": lambda w, d, out: _checkpoint(out, w, complete=True, foreign=True),
    "sorted_pairs": _sorted_pairs,
    "pairs_file": lambda w, d, out: _jsonl(d / "pairs.jsonl", w["pair_rows"]),
    "truncated_model": lambda w, d, out: _truncated_copy(w["model"], d / "truncated_model"),
}


def _truncated_copy(model: str, to: Path) -> None:
    """The model directory with its weights file cut in half (a copy that stopped, a full disk during a save)."""
    import shutil

    shutil.copytree(model, to)
    weights = to / "model.safetensors"
    data = weights.read_bytes()
    weights.write_bytes(data[: len(data) // 2])


def _materialize(name: str, world, tmp_path: Path) -> tuple[dict, str, Path]:
    meta = _meta(name)
    scratch, out = tmp_path / "scratch", tmp_path / "out"
    scratch.mkdir()
    if meta["setup"]:
        SETUPS[meta["setup"]](world, scratch, out)
    text = (FIXTURES / f"{name}.yaml").read_text()
    for key, value in {
        "model": world["model"],
        "pairs": world["pairs"],
        "prompts": world["prompts"],
        "out": str(out),
        "dir": str(scratch),
        "fixtures": str(FIXTURES),
    }.items():
        text = text.replace("{" + key + "}", value)
    recipe = tmp_path / f"{name}.yaml"
    recipe.write_text(text)
    return meta, str(recipe), out


def _types(stage: str):
    from align.config import ModelConfig, ScriptArguments

    if stage == "grpo":
        from align.grpo.config import GRPOConfig
        from align.grpo.trainer import main

        return main, (ScriptArguments, GRPOConfig, ModelConfig)
    from align.preference.config import DPOConfig
    from align.preference.trainer import main

    return main, (ScriptArguments, DPOConfig, ModelConfig)


def _check(meta: dict, code: int, err: str, out: Path, name: str) -> None:
    lines = [line for line in err.splitlines() if line.startswith("smolalign: error:")]
    assert code == int(meta["code"]), f"{name}: exit code {code}, expected {meta['code']}\n{err[-3000:]}"
    assert "Traceback" not in err, f"{name}: a traceback instead of one message\n{err[-3000:]}"
    assert len(lines) == 1, f"{name}: {len(lines)} error lines\n{err[-3000:]}"
    assert re.search(meta["expect"], lines[0]), f"{name}: {lines[0]!r} does not match {meta['expect']!r}"
    # nothing a re-run (or the pipeline) could take for finished work
    if out.is_dir():
        assert not (out / "config.json").exists() and not (out / "model.safetensors").exists(), name
        assert not list(out.glob("*_eval.json")), name
        assert latest_checkpoint(out) in (None, str(out / "checkpoint-2")), name  # only what the setup put there


# Known gaps, each a one-place fix in another module (strict: the test says so when the fix lands).
XFAIL: dict[str, str] = {}


def _param(name: str):
    if name in XFAIL:
        return pytest.param(name, marks=pytest.mark.xfail(reason=XFAIL[name], strict=True))
    return name


@pytest.mark.parametrize("name", [_param(c) for c in CASES if _meta(c)["subprocess"] != "true"])
def test_bad_input_in_process(name, world, tmp_path, capsys, monkeypatch):
    from align.cli import run

    meta, recipe, out = _materialize(name, world, tmp_path)
    if meta["setup"] == "full_disk":
        import shutil
        from collections import namedtuple

        usage = namedtuple("usage", "total used free")
        monkeypatch.setattr(shutil, "disk_usage", lambda path: usage(10**6, 10**6 - 1000, 1000))
    monkeypatch.chdir(tmp_path)
    main, types = _types(meta["stage"])
    with pytest.raises(SystemExit) as exc:
        run(main, *types, args=[recipe, *shlex.split(meta["args"])])
    _check(meta, exc.value.code, capsys.readouterr().err, out, name)


@pytest.mark.slow  # a fresh interpreter per case: ~10 s of imports each on an idle 2-core machine
@pytest.mark.parametrize("name", [c for c in CASES if _meta(c)["subprocess"] == "true"])
def test_bad_input_through_the_script(name, world, tmp_path):
    meta, recipe, out = _materialize(name, world, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("SMOLALIGN_DEBUG", None)
    proc = subprocess.run(
        [sys.executable, f"scripts/{meta['stage']}.py", recipe, *shlex.split(meta["args"])],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    _check(meta, proc.returncode, proc.stderr, out, name)


def test_the_corpus_is_big_and_covers_every_kind():
    assert len(CASES) >= 30
    metas = [_meta(c) for c in CASES]
    assert {m["stage"] for m in metas} == {"dpo", "grpo"}
    assert sum(m["subprocess"] == "true" for m in metas) >= 3
    assert all(m.get("expect") for m in metas)
    assert all(m["setup"] in SETUPS for m in metas if m["setup"])


def _valid_recipe(stage: str, world, tmp_path: Path) -> tuple[str, Path]:
    """The corpus' base recipe for `stage` without a defect."""
    name = {"dpo": "unknown_key", "grpo": "misspelled_dataset_key"}[stage]
    _, recipe, out = _materialize(name, world, tmp_path)
    text = Path(recipe).read_text()
    Path(recipe).write_text(
        "\n".join(line for line in text.splitlines() if not line.startswith(("learnin_rate", "datset_name"))) + "\n"
    )
    return recipe, out


PASSED = (
    r"preflight passed for stage '{}': output_dir, resume, tokenizer, chat_template, known_answer, data_order, "
    r"weights, seeds \(1 rank"
)


@pytest.mark.parametrize("stage", ["dpo", "grpo"])
def test_valid_recipes_pass_the_preflight(stage, world, tmp_path, capsys, monkeypatch):
    """Without its defect the base recipe passes every check and stops before training (exit 0, nothing saved),
    so each bad case above fails for its own reason."""
    from align.cli import run

    recipe, out = _valid_recipe(stage, world, tmp_path)
    monkeypatch.setenv("SMOLALIGN_PREFLIGHT_ONLY", "1")
    main, types = _types(stage)
    with pytest.raises(SystemExit) as exc:
        run(main, *types, args=[recipe])
    assert exc.value.code == 0
    assert re.search(PASSED.format(stage), capsys.readouterr().out)
    assert not (out / "model.safetensors").exists() and latest_checkpoint(out) is None


@pytest.mark.slow
def test_scripts_preflight_runs_the_stage_named_in_the_header(world, tmp_path):
    recipe, out = _valid_recipe("dpo", world, tmp_path)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    proc = subprocess.run(
        [sys.executable, "scripts/preflight.py", recipe],
        cwd=REPO,
        env=env,
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert re.search(PASSED.format("dpo"), proc.stdout)
    assert not (out / "model.safetensors").exists() and latest_checkpoint(out) is None
