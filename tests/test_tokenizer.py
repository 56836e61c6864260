"""Our tokenizer: byte-level round trip, special tokens, the SmolLM3 think/no_think chat template and its
{% generation %} assistant masks, HF save/load, and the fertility report."""

from __future__ import annotations

import pytest
from test_pretrain_helpers import tiny_tokenizer

from pretrain.tokenizer import SPECIAL_TOKENS, fertility_report, format_report, special_ids, train_tokenizer


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.mark.parametrize(
    "text",
    ["the cat sat on the mat.", "  two  spaces\nand\ttabs ", "Ünïcödé ✓ 日本語 emoji 🙂", "x = 12345 * 67", ""],
)
def test_round_trip_is_lossless(tok, text):
    ids = tok(text, add_special_tokens=False)["input_ids"]
    assert tok.decode(ids) == text


def test_digits_are_single_tokens_and_specials_are_atomic(tok):
    assert tok.tokenize("12345")[-5:] == ["1", "2", "3", "4", "5"]
    ids = special_ids(tok)
    assert list(ids) == SPECIAL_TOKENS and sorted(ids.values()) == list(range(len(SPECIAL_TOKENS)))
    for t in SPECIAL_TOKENS:
        assert tok(f"a{t}b", add_special_tokens=False)["input_ids"][1:-1] == [ids[t]] or t in tok.tokenize(f"a{t}b")
    assert tok.eos_token == "<|im_end|>" and tok.pad_token == "<|pad|>"


def test_tiny_vocab_is_respected_and_too_small_is_a_value_error():
    tok = train_tokenizer(["hello world"] * 20, vocab_size=270)
    assert len(tok) <= 270
    with pytest.raises(ValueError, match="vocab_size"):
        train_tokenizer(["x"], vocab_size=100)


CONV = [
    {"role": "user", "content": "What is 2 + 3?"},
    {"role": "assistant", "content": "<think>\n2 + 3 = 5\n</think>\nThe answer is \\boxed{5}."},
    {"role": "user", "content": "And 4 + 4?"},
    {"role": "assistant", "content": "<think>\n4 + 4 = 8\n</think>\nThe answer is \\boxed{8}."},
]


def render(tok, messages, **kw):
    return tok.apply_chat_template(messages, tokenize=False, **kw)


def test_think_mode_is_default_and_earlier_think_blocks_are_stripped(tok):
    text = render(tok, CONV)
    assert text.startswith("<|im_start|>system\n/think<|im_end|>\n<|im_start|>user\nWhat is 2 + 3?<|im_end|>\n")
    # first assistant turn lost its reasoning, the last one keeps it
    assert "<|im_start|>assistant\nThe answer is \\boxed{5}.<|im_end|>\n" in text
    assert text.endswith("<|im_start|>assistant\n<think>\n4 + 4 = 8\n</think>\nThe answer is \\boxed{8}.<|im_end|>\n")
    assert text.count("<think>") == 1


@pytest.mark.parametrize(
    "messages,kwargs,mode",
    [
        (CONV[:1], {}, "/think"),
        (CONV[:1], {"enable_thinking": False}, "/no_think"),
        ([{"role": "system", "content": "/no_think"}, *CONV[:1]], {}, "/no_think"),
        # the system flag wins over the kwarg (SmolLM3's precedence)
        ([{"role": "system", "content": "Be brief. /think"}, *CONV[:1]], {"enable_thinking": False}, "/think"),
    ],
)
def test_mode_switch_by_flag_or_kwarg(tok, messages, kwargs, mode):
    text = render(tok, messages, add_generation_prompt=True, **kwargs)
    system = text.split("<|im_end|>")[0]
    assert system.endswith(mode) and system.count("/") == 1  # flag shown once, removed from user text
    if mode == "/no_think":
        assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\n")
    else:
        assert text.endswith("<|im_start|>assistant\n")
    if messages[0]["role"] == "system" and "Be brief" in messages[0]["content"]:
        assert system == "<|im_start|>system\nBe brief.\n/think"


NO_THINK_CONV = [{**m, "content": m["content"].split("</think>\n")[-1]} for m in CONV]


@pytest.mark.parametrize("enable_thinking", [True, False])
def test_generation_markers_cover_exactly_assistant_content_and_im_end(tok, enable_thinking):
    conv = CONV if enable_thinking else NO_THINK_CONV
    out = tok.apply_chat_template(
        conv, tokenize=True, return_dict=True, return_assistant_tokens_mask=True, enable_thinking=enable_thinking
    )
    ids, mask = out["input_ids"], out["assistant_masks"]
    trained = tok.decode([i for i, m in zip(ids, mask) if m])
    assert trained == "The answer is \\boxed{5}.<|im_end|>" + conv[3]["content"] + "<|im_end|>"
    # the prompt side (system, user turns, assistant headers, the empty no_think block) is never trained on
    masked_out = tok.decode([i for i, m in zip(ids, mask) if not m])
    assert "<|im_start|>assistant\n" in masked_out and "What is 2 + 3?" in masked_out
    assert ("<think>\n\n</think>" in masked_out) == (not enable_thinking)
    # single turn: training text == generation prompt + completion (so SFT and generation agree)
    prompt = render(tok, conv[:1], add_generation_prompt=True, enable_thinking=enable_thinking)
    assert render(tok, conv[:2], enable_thinking=enable_thinking) == prompt + conv[1]["content"] + "<|im_end|>\n"


def test_no_think_training_text_has_empty_think_block(tok):
    conv = [CONV[0], {"role": "assistant", "content": "The answer is \\boxed{5}."}]
    text = render(tok, conv, enable_thinking=False)
    assert text.endswith("<|im_start|>assistant\n<think>\n\n</think>\nThe answer is \\boxed{5}.<|im_end|>\n")


def test_saved_dir_loads_with_autotokenizer(tok, tmp_path):
    from transformers import AutoTokenizer

    tok.save_pretrained(tmp_path)
    again = AutoTokenizer.from_pretrained(tmp_path)
    assert again("the cat 42")["input_ids"] == tok("the cat 42")["input_ids"]
    assert render(again, CONV) == render(tok, CONV)


def test_fertility_report_counts_words_and_continuations(tok):
    r = fertility_report(tok, ["the the the", "cat"])
    n_the, n_cat = len(tok(" the", add_special_tokens=False)["input_ids"]), len(tok(" cat")["input_ids"])
    assert r["fertility"] == pytest.approx((3 * n_the + n_cat) / 4)
    assert r["continued_words"] == pytest.approx((3 * (n_the > 1) + (n_cat > 1)) / 4)
    assert "| ours | 320 |" in format_report({"ours": r})
    with pytest.raises(ValueError, match="no words"):
        fertility_report(tok, [" "])
