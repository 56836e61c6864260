"""Base-model chat setup (align.data.chat.setup_chat_format + the SFT stage): a tokenizer with no template gets
SmolLM3's think/no_think template or ChatML and <|im_end|> as EOS, on the tokenizer and in the saved model's config and
generation_config, so generate() and vLLM stop at the end of a turn in every later stage.

Run: pytest tests/test_chat_setup.py -q   (~15 s; a tiny random SmolLM3, no network)
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml
from cpu_substitutions import base_tokenizer, tiny_model

from align.data.chat import CHATML_TEMPLATE, SMOLLM3_TEMPLATE, load_chat_template, render, setup_chat_format

CONVERSATION = [{"role": "user", "content": "2+2?"}, {"role": "assistant", "content": "4"}]


def test_the_base_tokenizer_fixture_has_no_template_and_a_document_eos():
    tok = base_tokenizer()
    assert tok.chat_template is None and tok.eos_token == "<|end_of_text|>" and tok.pad_token is None
    assert {"<|im_start|>", "<|im_end|>"} <= set(tok.get_vocab())


@pytest.mark.parametrize(
    "name, kwargs, text",
    [
        ("chatml", {}, "<|im_start|>user\n2+2?<|im_end|>\n<|im_start|>assistant\n4<|im_end|>\n"),
        (
            "smollm3",
            {},
            "<|im_start|>system\n/think<|im_end|>\n<|im_start|>user\n2+2?<|im_end|>\n"
            "<|im_start|>assistant\n4<|im_end|>\n",
        ),
        (
            "smollm3",
            {"enable_thinking": False},
            "<|im_start|>system\n/no_think<|im_end|>\n<|im_start|>user\n"
            "2+2?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n4<|im_end|>\n",
        ),
    ],
)
def test_setup_installs_a_builtin_template_and_the_end_of_turn_eos(name, kwargs, text):
    tok = base_tokenizer()
    template = setup_chat_format(tok, name, "<|im_end|>")
    assert template == tok.chat_template == {"chatml": CHATML_TEMPLATE, "smollm3": SMOLLM3_TEMPLATE}[name]
    assert render(tok, CONVERSATION, **kwargs) == text
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|end_of_text|>"  # padding never hides the EOS


def test_setup_errors_name_the_key_and_the_fix(tmp_path):
    with pytest.raises(ValueError, match=r"eos_token='<\|eot_id\|>' is not a token of .*added tokens: .*<\|im_end\|>"):
        setup_chat_format(base_tokenizer(), "chatml", "<|eot_id|>")
    with pytest.raises(FileNotFoundError, match="chat_template_path 'nope.jinja' does not exist"):
        load_chat_template("nope.jinja")
    base_tokenizer().save_pretrained(tmp_path / "base")
    with pytest.raises(ValueError, match="that tokenizer has no chat template to clone"):
        load_chat_template(str(tmp_path / "base"))
    assert setup_chat_format(base_tokenizer()) is None  # nothing asked, nothing changed


def test_sft_of_a_base_model_saves_a_model_that_stops_at_im_end(tmp_path):
    from align.cli import parse
    from align.config import ModelConfig, ScriptArguments
    from align.sft.config import SFTConfig
    from align.sft.trainer import main

    torch.set_num_threads(1)
    tok = base_tokenizer()
    tiny_model(tok).save_pretrained(tmp_path / "base")
    tok.save_pretrained(tmp_path / "base")
    rows = [
        {"messages": [{"role": "user", "content": f"{i}+1?"}, {"role": "assistant", "content": str(i + 1)}]}
        for i in range(16)
    ]
    (tmp_path / "train.jsonl").write_text("\n".join(json.dumps(r) for r in rows))
    recipe = {
        "model_name_or_path": str(tmp_path / "base"),
        "dataset_name": str(tmp_path / "train.jsonl"),
        "output_dir": str(tmp_path / "sft"),
        "chat_template_path": "smollm3",
        "eos_token": "<|im_end|>",
        "assistant_only_loss": True,
        "max_steps": 2,
        "per_device_train_batch_size": 4,
        "bf16": False,
        "report_to": "none",
        "save_strategy": "no",
        "eval_strategy": "no",
        "eval_after": False,
        "max_length": 128,
    }
    (tmp_path / "r.yaml").write_text(yaml.safe_dump(recipe))
    main(*parse(ScriptArguments, SFTConfig, ModelConfig, args=[str(tmp_path / "r.yaml")]))

    from transformers import AutoConfig, AutoTokenizer, GenerationConfig

    out = Path(tmp_path / "sft")
    saved = AutoTokenizer.from_pretrained(out)
    im_end = saved.convert_tokens_to_ids("<|im_end|>")
    assert saved.chat_template == SMOLLM3_TEMPLATE and saved.eos_token == "<|im_end|>"
    assert AutoConfig.from_pretrained(out).eos_token_id == im_end
    eos = GenerationConfig.from_pretrained(out).eos_token_id
    assert (eos if isinstance(eos, list) else [eos])[0] == im_end  # generate() and vLLM stop at the end of a turn
