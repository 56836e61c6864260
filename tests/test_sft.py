"""align/sft/trainer.py: the SFT stage trains on assistant tokens only, learns, saves a loadable model, merges LoRA.

A tiny random SmolLM3 and the byte-level BPE of tests/test_chat.py (SmolLM3-style template fixture, which has
no {% generation %} markers, so training goes through align.data.chat's template-independent masks).
"""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import yaml
from test_chat import MULTI, build_tokenizer

from align.cli import parse
from align.config import ModelConfig, ScriptArguments
from align.data.chat import tokenize_sft_dataset
from align.runtime.preflight_checks import check_shuffled
from align.sft.batches import LengthBucketSampler
from align.sft.config import SFTConfig
from align.sft.trainer import SFTTrainer, main

ROOT = Path(__file__).resolve().parents[1]
RECIPES = ROOT / "recipes"


@pytest.fixture(scope="module")
def tiny(tmp_path_factory, tiny_model):
    """A tiny random SmolLM3 + fixture tokenizer saved as one model dir."""
    torch.set_num_threads(1)  # a 2-thread pool on a loaded 2-core machine spins (see test_preference.py)
    root = tmp_path_factory.mktemp("sft")
    tok = build_tokenizer("smollm3")
    model = tiny_model(
        root / "model",
        tok,
        arch="smollm3",
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=512,
        bos_token_id=None,
    )
    return {"root": root, "model": model, "tokenizer": tok}


def _recipe(tmp: Path, name: str, **overrides) -> list:
    recipe = {
        "model_name_or_path": None,
        "dataset_name": "builtin:tasks",
        "dataset_args": {"num": 64, "mode": "mixed", "families": ["arithmetic", "compare"]},
        "max_eval_samples": 16,
        "eval_after": False,
        "output_dir": str(tmp / name),
        "max_steps": 12,
        "per_device_train_batch_size": 8,
        "learning_rate": 3e-3,
        "lr_scheduler_type": "constant",
        "logging_steps": 1,
        "save_strategy": "no",
        "eval_strategy": "no",
        "report_to": "none",
        "seed": 0,
        "max_length": 256,
        "bf16": False,
        "assistant_only_loss": True,
    }
    recipe.update(overrides)
    path = tmp / f"{name}.yaml"
    path.write_text(yaml.safe_dump(recipe))
    return parse(ScriptArguments, SFTConfig, ModelConfig, args=[str(path)])


def _state(path) -> dict:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path).state_dict()


def test_tiny_sft_run_loss_falls_params_change_and_saves_hf_model(tiny):
    from transformers import AutoTokenizer

    script, training, model = _recipe(tiny["root"], "full", model_name_or_path=tiny["model"])
    report = main(script, training, model)
    assert report["train"]["last_logged_loss"] < 0.8 * report["train"]["first_logged_loss"], report["train"]
    start, trained = _state(tiny["model"]), _state(training.output_dir)
    assert sorted(k for k in start if not torch.equal(start[k], trained[k])) == sorted(start)  # every weight moved
    saved_tok = AutoTokenizer.from_pretrained(training.output_dir)
    assert saved_tok.chat_template == tiny["tokenizer"].chat_template  # the template travels with the model
    assert json.loads((Path(training.output_dir) / "sft_eval.json").read_text())["train"]


def test_lora_merge_on_save_round_trip(tiny):
    from peft import PeftModel
    from transformers import AutoModelForCausalLM

    script, training, model = _recipe(
        tiny["root"],
        "lora",
        model_name_or_path=tiny["model"],
        use_peft=True,
        lora_r=4,
        lora_alpha=8,
        lora_target_modules=["q_proj", "v_proj", "up_proj"],
        max_steps=6,
        learning_rate=1e-2,
    )
    main(script, training, model)
    out = Path(training.output_dir)
    assert (out / "adapter" / "adapter_config.json").exists() and not (out / "adapter_config.json").exists()
    merged = AutoModelForCausalLM.from_pretrained(out).eval()  # a plain HF model: no peft needed to load it
    via_adapter = PeftModel.from_pretrained(AutoModelForCausalLM.from_pretrained(tiny["model"]), out / "adapter")
    base = AutoModelForCausalLM.from_pretrained(tiny["model"]).eval()
    ids = torch.tensor([tiny["tokenizer"]("What is 2 plus 3? The answer is 5.")["input_ids"]])
    with torch.no_grad():
        a, b, c = merged(ids).logits, via_adapter.eval()(ids).logits, base(ids).logits
    assert torch.allclose(a, b, atol=1e-5)  # merged == base + adapter
    assert (a - c).abs().max() > 1e-3  # and the adapter learned something (the merge is not a no-op)


def _grads(trainer, rows) -> torch.Tensor:
    model = trainer.model
    model.zero_grad()
    batch = trainer.data_collator(rows)
    trainer.compute_loss(model, batch).backward()
    return torch.cat([p.grad.flatten() for p in model.parameters() if p.grad is not None])


@pytest.mark.parametrize("assistant_only", [True, False])
def test_loss_ignores_user_tokens(tiny, tmp_path, assistant_only):
    """A user turn AFTER the assistant's answer changes no input the answer is predicted from (causal), so with
    assistant-only loss the gradient is bit-for-bit the same whatever that user turn says; with full-sequence
    loss (the control) it is not."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    tok = tiny["tokenizer"]
    convs = [MULTI[:3], [*MULTI[:2], {"role": "user", "content": "cutting december metadata tool result 42"}]]
    ds = tokenize_sft_dataset(
        Dataset.from_list([{"messages": c} for c in convs]), tok, assistant_only_loss=assistant_only
    )
    args = SFTConfig(output_dir=str(tmp_path), report_to="none", bf16=False, max_length=None)
    model = AutoModelForCausalLM.from_pretrained(tiny["model"])
    trainer = SFTTrainer(model=model, args=args, train_dataset=ds, processing_class=tok)
    rows = [trainer.train_dataset[i] for i in range(2)]
    if assistant_only:  # labels: exactly the assistant tokens (+ end-of-turn), -100 elsewhere
        for row, masked in zip(rows, ds):
            assert [lbl != -100 for lbl in row["labels"]] == [bool(m) for m in masked["assistant_masks"]]
    g0, g1 = _grads(trainer, [rows[0]]), _grads(trainer, [rows[1]])
    if assistant_only:
        assert torch.allclose(g0, g1, rtol=0, atol=1e-7), (g0 - g1).abs().max()
    else:
        assert (g0 - g1).abs().max() > 1e-4


@pytest.mark.parametrize("layout", ["rows", "flat"])
def test_packing_keeps_documents_apart(tiny, tmp_path, layout):
    """bfd packing: each document's loss is what it is unpacked (no attention across documents), whether the
    batch stays [rows, max_length] (ours) or is flattened into one row (TRL's padding-free layout)."""
    from datasets import Dataset
    from transformers import AutoModelForCausalLM

    tok = tiny["tokenizer"]
    convs = [MULTI[:2], MULTI, [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "Sure."}]]
    ds = tokenize_sft_dataset(Dataset.from_list([{"messages": c} for c in convs]), tok)
    lengths = sorted(len(r["input_ids"]) for r in ds)
    width = max(lengths[2], lengths[0] + lengths[1])  # the two shorter conversations share a bin
    model = AutoModelForCausalLM.from_pretrained(tiny["model"])
    common = dict(output_dir=str(tmp_path), report_to="none", bf16=False, max_length=width)
    packed = SFTTrainer(
        model=model,
        args=SFTConfig(**common, packing=True, packing_layout=layout),
        train_dataset=ds,
        processing_class=tok,
    )
    plain = SFTTrainer(model=model, args=SFTConfig(**common), train_dataset=ds, processing_class=tok)
    assert len(packed.train_dataset) == 2
    batch = packed.data_collator([packed.train_dataset[i] for i in range(2)])
    assert "attention_mask" not in batch  # documents are told apart by restarting position ids
    assert batch["input_ids"].shape[0] == (2 if layout == "rows" else 1)
    with torch.no_grad():
        loss_packed = packed.compute_loss(model, batch)
        rows = [plain.train_dataset[i] for i in range(3)]
        n = [sum(lbl != -100 for lbl in r["labels"][1:]) for r in rows]
        per_doc = [plain.compute_loss(model, plain.data_collator([r])) for r in rows]
    expected = sum(loss * k for loss, k in zip(per_doc, n)) / sum(n)  # token-weighted mean over the documents
    assert torch.allclose(loss_packed, expected, atol=1e-5), (loss_packed, expected)
    assert packed.per_document == (layout == "rows")
    if layout == "rows":  # what training_step runs: per-document attention, no mask
        with torch.no_grad(), packed._attention(model):
            loss_documents = packed.compute_loss(model, batch)
        assert torch.allclose(loss_documents, expected, atol=1e-5), (loss_documents, expected)


def test_length_bucket_sampler_low_padding_shuffled_and_deterministic():
    import random

    rng = random.Random(0)
    lengths = [int(min(700, max(20, rng.lognormvariate(5.0, 0.6)))) for _ in range(2000)]
    sampler = LengthBucketSampler(lengths, batch_size=8, seed=0)
    order = list(sampler)
    assert sorted(order) == list(range(2000))  # a permutation: every row once per epoch
    batches = [order[i : i + 8] for i in range(0, len(order), 8)]
    padded = sum(8 * max(lengths[i] for i in b) for b in batches)
    assert 1 - sum(lengths) / padded < 0.05  # < 5% padding (random batches: ~1/3)
    assert check_shuffled([lengths[i] for i in order[:512]]) is None  # the preflight sees no length order
    assert list(sampler) == order  # same epoch, same order (a resume replays it)
    sampler.set_epoch(1)
    assert list(sampler) != order


def test_liger_on_cpu_logs_one_line_and_trains_without(tmp_path, caplog):
    if torch.cuda.is_available():
        pytest.skip("GPU machine: Liger stays on")
    with caplog.at_level("WARNING", logger="align.sft.trainer"):
        args = SFTConfig(output_dir=str(tmp_path), report_to="none", use_liger_kernel=True)
    assert args.use_liger_kernel is False
    assert [r.message for r in caplog.records if "Liger" in r.message] == [
        "use_liger_kernel: Liger kernels need a CUDA GPU; training on CPU without them"
    ]


def test_sft_config_rejects_bad_mask_method(tmp_path):
    with pytest.raises(ValueError, match="mask_method='tokens'.*auto"):
        SFTConfig(output_dir=str(tmp_path), report_to="none", mask_method="tokens")


@pytest.mark.parametrize("name", ["tiny/sft", "tiny/sft_strong", "smol135m/sft", "smollm3/sft"])
def test_recipes_parse(name):
    path = RECIPES / f"{name}.yaml"
    assert path.read_text().startswith("# ")  # the first line says how to run it
    script, training, model = parse(ScriptArguments, SFTConfig, ModelConfig, args=[str(path)])
    assert training.assistant_only_loss and model.model_name_or_path
    if name == "smollm3/sft":  # SmolLM3's SFT (FACTS.md): LR 2e-5, 5 epochs, assistant-only, packing, Liger, bf16
        raw = yaml.safe_load(path.read_text())
        assert training.learning_rate == 2e-5 and training.num_train_epochs == 5
        assert training.packing and training.packing_strategy == "bfd"
        # the recipe asks for bf16 (a CPU without native bf16 trains it in fp32: configs.cpu_bf16_slower)
        assert raw["bf16"] is True and raw["use_liger_kernel"] is True and raw["gradient_checkpointing"] is True


@pytest.mark.slow
def test_two_process_zero2_on_cpu(tiny, tmp_path):
    """accelerate launch with DeepSpeed ZeRO-2 on 2 CPU ranks trains and saves one HF model."""
    pytest.importorskip("deepspeed")
    _, training, _ = _recipe(
        tmp_path, "zero2", model_name_or_path=tiny["model"], max_steps=4, per_device_train_batch_size=4
    )
    recipe = tmp_path / "zero2.yaml"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(ROOT)}
    cmd = [
        sys.executable,
        "-m",
        "accelerate.commands.launch",
        "--config_file",
        str(RECIPES / "accelerate" / "zero2.yaml"),
        "--num_processes",
        "2",
        str(ROOT / "scripts" / "sft.py"),
        str(recipe),
    ]
    proc = subprocess.run(cmd, cwd=ROOT, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads((Path(training.output_dir) / "sft_eval.json").read_text())
    assert report["world_size"] == 2 and "DEEPSPEED" in report["distributed_type"], report
    start, trained = _state(tiny["model"]), _state(training.output_dir)
    assert any(not torch.equal(start[k], trained[k]) for k in start)


def test_compact_lm_head_scores_only_labelled_positions_with_the_same_logprobs_and_grads(tiny):
    """align/modeling/lm_head.py: on a CPU, TRL's fused LM head runs on every position; ours only on the scored ones,
    with the same per-token log-probs and the same gradients."""
    from transformers import AutoModelForCausalLM
    from trl.trainer import utils as trl_utils

    from align.modeling.lm_head import compact_lm_head

    model = AutoModelForCausalLM.from_pretrained(tiny["model"])
    trl_utils.add_fused_lm_head(model, outputs=("log_probs", "entropy"))
    torch.manual_seed(0)
    ids = torch.randint(3, model.config.vocab_size, (4, 24))
    labels = ids.clone()
    labels[:, :16] = -100  # a prompt: not scored
    rows, inner = [], trl_utils._ChunkedLogProbFunction.apply

    def counted(hidden, *args):
        rows.append(hidden.shape[0])
        return inner(hidden, *args)

    def run(compact: bool):
        model.zero_grad()
        trl_utils._ChunkedLogProbFunction.apply = counted
        try:
            with compact_lm_head() if compact else contextlib.nullcontext():
                out = model(input_ids=ids, labels=labels, fused_lm_head=True)
        finally:
            trl_utils._ChunkedLogProbFunction.apply = inner
        (out.log_probs.sum() + out.entropy.sum()).backward()
        grads = {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}
        return out.log_probs.detach(), out.entropy.detach(), grads

    full_lp, full_ent, full_grads = run(False)
    compact_lp, compact_ent, compact_grads = run(True)
    assert rows == [4 * 23, 4 * 8]  # every shifted position vs the 8 scored ones per row
    assert torch.allclose(full_lp, compact_lp, atol=1e-5) and torch.allclose(full_ent, compact_ent, atol=1e-5)
    assert (full_lp[:, :15] == 0).all() and (full_lp[:, 15:] != 0).all()
    assert full_grads.keys() == compact_grads.keys()
    for name, grad in full_grads.items():
        assert torch.allclose(grad, compact_grads[name], atol=1e-5, rtol=1e-4), name


@pytest.mark.parametrize(
    "layout, cuda, expected",
    [
        ("auto", False, "rows"),
        ("auto", True, "flat"),
        ("rows", False, "rows"),
        ("rows", True, "rows"),
        ("flat", False, "flat"),
        ("flat", True, "flat"),
    ],
)
def test_packing_layout_auto_picks_by_device(layout, cuda, expected, caplog):
    """Per-document rows are the CPU's fast path; on a GPU flash-attention's varlen kernel wants the flat row (the
    rows' buckets cost host syncs there), so 'auto' picks by device and an explicit 'rows' on a GPU warns."""
    from align.sft.batches import resolve_packing_layout

    assert resolve_packing_layout(layout, cuda) == expected
    assert ("host syncs" in caplog.text) == (layout == "rows" and cuda)


def test_bad_packing_layout_names_the_choices():
    from align.sft.batches import resolve_packing_layout

    with pytest.raises(ValueError, match="choose 'auto', 'rows' or 'flat'"):
        resolve_packing_layout("packed", False)
