"""Assistant-token masks for arbitrary chat templates (align/data/chat.py), checked token by token.

Each case renders a conversation with one of the template fixtures in tests/fixtures/templates/ and compares
the runs of trained tokens, decoded, with hand-written strings: the assistant contents plus their end-of-turn
token, nothing of the system/user/tool turns or the template scaffolding.
"""

from __future__ import annotations

import functools
from pathlib import Path

import pytest

from align.data.chat import (
    assistant_masks,
    completion_mask,
    has_generation_markers,
    render,
    strip_generation_markers,
    tokenize_sft_dataset,
)

TEMPLATES = Path(__file__).parent / "fixtures" / "templates"
SPECIAL = [
    "<|im_start|>",
    "<|im_end|>",
    "<|begin_of_text|>",
    "<|start_header_id|>",
    "<|end_header_id|>",
    "<|eot_id|>",
    "<bos>",
    "<start_of_turn>",
    "<end_of_turn>",
    "<s>",
    "</s>",
    "[INST]",
    "[/INST]",
    "<pad>",
]
# bos/eos per template style, as the real tokenizers of those families set them
STYLE_TOKENS = {
    "chatml": ("<|im_start|>", "<|im_end|>"),
    "chatml_default_system": ("<|im_start|>", "<|im_end|>"),
    "llama3": ("<|begin_of_text|>", "<|eot_id|>"),
    "gemma": ("<bos>", "<end_of_turn>"),
    "mistral": ("<s>", "</s>"),
    "smollm3": ("<|im_start|>", "<|im_end|>"),
}
_CORPUS_WORDS = (
    "the answer is what how many apples does she have left you are a helpful assistant hello hi there "
    "sure think step by step add subtract multiply boxed sum of and plus minus equals please compute "
    "question user system model tool result weather today is sunny knowledge cutoff date reasoning mode "
    "custom instructions metadata june cutting december"
).split()


@functools.cache
def _backend():
    """A byte-level BPE trained in milliseconds on synthetic lines, with every template's special tokens."""
    import random

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    rng = random.Random(0)
    lines = [
        " ".join(rng.choice(_CORPUS_WORDS) for _ in range(rng.randint(4, 12))) + f" {rng.randint(0, 999)}."
        for _ in range(400)
    ]
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=600, special_tokens=SPECIAL, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    tok.train_from_iterator(lines, trainer)
    return tok


def build_tokenizer(style: str = "chatml", template: str | None = None):
    """A transformers tokenizer of `style` (bos/eos as that family sets them) with its fixture template."""
    from transformers import PreTrainedTokenizerFast

    bos, eos = STYLE_TOKENS[style]
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=_backend().__class__.from_str(_backend().to_str()),
        bos_token=bos,
        eos_token=eos,
        pad_token="<pad>",
    )
    tokenizer.chat_template = template or (TEMPLATES / f"{style}.jinja").read_text()
    return tokenizer


def trained_runs(tokenizer, out) -> list[str]:
    """The maximal runs of trained tokens, decoded."""
    runs, cur = [], []
    for tid, m in zip(out["input_ids"], out["assistant_masks"]):
        if m:
            cur.append(tid)
        elif cur:
            runs.append(cur)
            cur = []
    if cur:
        runs.append(cur)
    return [tokenizer.decode(r) for r in runs]


SYSTEM = {"role": "system", "content": "You are a helpful assistant."}
MULTI = [
    {"role": "user", "content": "How many apples does she have left?"},
    {"role": "assistant", "content": "The answer is \\boxed{3}."},
    {"role": "user", "content": "And plus 4?"},
    {"role": "assistant", "content": "The answer is \\boxed{7}."},
]
THINK = [
    {"role": "user", "content": "What is 2 plus 3?"},
    {"role": "assistant", "content": "<think>\nadd 2 and 3\n</think>\nThe answer is \\boxed{5}."},
    {"role": "user", "content": "Multiply it by 2."},
    {"role": "assistant", "content": "<think>\n5 times 2 is 10\n</think>\nThe answer is \\boxed{10}."},
]

# (style, messages, template kwargs, the full render by hand, the trained runs by hand)
CASES = [
    (
        "chatml",
        MULTI,
        {},
        "<|im_start|>user\nHow many apples does she have left?<|im_end|>\n<|im_start|>assistant\n"
        "The answer is \\boxed{3}.<|im_end|>\n<|im_start|>user\nAnd plus 4?<|im_end|>\n"
        "<|im_start|>assistant\nThe answer is \\boxed{7}.<|im_end|>\n",
        ["The answer is \\boxed{3}.<|im_end|>", "The answer is \\boxed{7}.<|im_end|>"],
    ),
    (
        "chatml_default_system",
        MULTI[:2],
        {},
        "<|im_start|>system\nYou are a helpful assistant.<|im_end|>\n<|im_start|>user\n"
        "How many apples does she have left?<|im_end|>\n<|im_start|>assistant\nThe answer is \\boxed{3}.<|im_end|>\n",
        ["The answer is \\boxed{3}.<|im_end|>"],
    ),
    (
        "chatml_default_system",
        [
            {"role": "system", "content": "Think step by step."},
            *MULTI[:2],
            {"role": "tool", "content": "weather today is sunny"},
            {"role": "assistant", "content": "It is sunny."},
        ],
        {},
        "<|im_start|>system\nThink step by step.<|im_end|>\n<|im_start|>user\nHow many apples does she have left?"
        "<|im_end|>\n<|im_start|>assistant\nThe answer is \\boxed{3}.<|im_end|>\n<|im_start|>tool\n"
        "weather today is sunny<|im_end|>\n<|im_start|>assistant\nIt is sunny.<|im_end|>\n",
        ["The answer is \\boxed{3}.<|im_end|>", "It is sunny.<|im_end|>"],
    ),
    (
        "llama3",
        [SYSTEM, *MULTI],
        {},
        "<|begin_of_text|><|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: December 2023\n"
        "Today Date: 26 Jul 2024\n\nYou are a helpful assistant.<|eot_id|><|start_header_id|>user<|end_header_id|>"
        "\n\nHow many apples does she have left?<|eot_id|><|start_header_id|>assistant<|end_header_id|>\n\n"
        "The answer is \\boxed{3}.<|eot_id|><|start_header_id|>user<|end_header_id|>\n\nAnd plus 4?<|eot_id|>"
        "<|start_header_id|>assistant<|end_header_id|>\n\nThe answer is \\boxed{7}.<|eot_id|>",
        ["The answer is \\boxed{3}.<|eot_id|>", "The answer is \\boxed{7}.<|eot_id|>"],
    ),
    (
        "gemma",
        [SYSTEM, *MULTI],
        {},
        "<bos><start_of_turn>user\nYou are a helpful assistant.\n\nHow many apples does she have left?<end_of_turn>\n"
        "<start_of_turn>model\nThe answer is \\boxed{3}.<end_of_turn>\n<start_of_turn>user\nAnd plus 4?"
        "<end_of_turn>\n<start_of_turn>model\nThe answer is \\boxed{7}.<end_of_turn>\n",
        ["The answer is \\boxed{3}.<end_of_turn>", "The answer is \\boxed{7}.<end_of_turn>"],
    ),
    (
        # the system prompt lands in the LAST user turn, so prefix renders differ from the full render
        "mistral",
        [SYSTEM, *MULTI],
        {},
        "<s>[INST] How many apples does she have left?[/INST] The answer is \\boxed{3}.</s>"
        "[INST] You are a helpful assistant.\n\nAnd plus 4?[/INST] The answer is \\boxed{7}.</s>",
        ["The answer is \\boxed{3}.</s>", "The answer is \\boxed{7}.</s>"],
    ),
    (
        # think mode: the earlier turn's <think> is stripped, the last turn keeps its trace
        "smollm3",
        THINK,
        {},
        "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: /think\n\n"
        "## Custom Instructions\n\nYou are a helpful AI assistant.\n\n<|im_end|>\n<|im_start|>user\nWhat is 2 plus 3?"
        "<|im_end|>\n<|im_start|>assistant\nThe answer is \\boxed{5}.<|im_end|>\n<|im_start|>user\n"
        "Multiply it by 2.<|im_end|>\n<|im_start|>assistant\n<think>\n5 times 2 is 10\n</think>\n"
        "The answer is \\boxed{10}.<|im_end|>\n",
        [
            "The answer is \\boxed{5}.<|im_end|>",
            "<think>\n5 times 2 is 10\n</think>\nThe answer is \\boxed{10}.<|im_end|>",
        ],
    ),
    (
        # no_think via the system flag: the empty think block is scaffolding (it is in the generation prompt too)
        "smollm3",
        [{"role": "system", "content": "Be brief. /no_think"}, *MULTI[:2]],
        {},
        "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: /no_think\n\n"
        "## Custom Instructions\n\nBe brief.\n\n<|im_end|>\n<|im_start|>user\nHow many apples does she have left?"
        "<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\nThe answer is \\boxed{3}.<|im_end|>\n",
        ["The answer is \\boxed{3}.<|im_end|>"],
    ),
    (
        "smollm3",
        MULTI[:2],
        {"enable_thinking": False},
        "<|im_start|>system\n## Metadata\n\nKnowledge Cutoff Date: June 2025\nReasoning Mode: /no_think\n\n"
        "## Custom Instructions\n\nYou are a helpful AI assistant.\n\n<|im_end|>\n<|im_start|>user\n"
        "How many apples does she have left?<|im_end|>\n<|im_start|>assistant\n<think>\n\n</think>\n"
        "The answer is \\boxed{3}.<|im_end|>\n",
        ["The answer is \\boxed{3}.<|im_end|>"],
    ),
]


@pytest.mark.parametrize("style,messages,kwargs,text,runs", CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)])
def test_masks_match_hand_checked_runs(style, messages, kwargs, text, runs):
    tokenizer = build_tokenizer(style)
    assert render(tokenizer, messages, **kwargs) == text
    out = assistant_masks(tokenizer, messages, **kwargs)
    assert tokenizer.decode(out["input_ids"]) == text  # the ids are the render, tokenized
    assert trained_runs(tokenizer, out) == runs
    # token by token: the untrained tokens are exactly the rest of the text (scaffolding, system, user turns)
    untrained = "".join(tokenizer.decode([t]) for t, m in zip(out["input_ids"], out["assistant_masks"]) if not m)
    rest = text
    for run in runs:
        rest = rest.replace(run, "", 1)
    assert untrained == rest


def test_mask_token_by_token_mistral():
    tokenizer = build_tokenizer("mistral")
    out = assistant_masks(
        tokenizer, [{"role": "user", "content": "hi there"}, {"role": "assistant", "content": "Sure."}]
    )
    pairs = [(tokenizer.decode([t]), m) for t, m in zip(out["input_ids"], out["assistant_masks"])]
    # the space the template writes before the answer is scaffolding; the eos that closes it is trained
    assert pairs == [
        ("<s>", 0),
        ("[INST]", 0),
        (" hi", 0),
        (" there", 0),
        ("[/INST]", 0),
        (" ", 0),
        ("S", 1),
        ("u", 1),
        ("re", 1),
        (".", 1),
        ("</s>", 1),
    ]


def test_markers_and_sentinel_methods_agree():
    tokenizer = build_tokenizer("chatml")
    assert has_generation_markers(tokenizer.chat_template)
    for messages in (MULTI, [SYSTEM, *MULTI], THINK):
        by_markers = assistant_masks(tokenizer, messages, method="markers")
        by_sentinel = assistant_masks(tokenizer, messages, method="sentinel")
        stripped = assistant_masks(
            tokenizer, messages, chat_template=strip_generation_markers(tokenizer.chat_template)
        )
        assert by_markers == by_sentinel == stripped


def test_all_zero_mask_names_template_and_example():
    tokenizer = build_tokenizer("chatml_default_system")
    with pytest.raises(ValueError, match=r"chat template [0-9a-f]{8}.*example 7.*all zeros"):
        assistant_masks(tokenizer, [{"role": "user", "content": "hi there"}], example_index=7)
    # markers that wrap nothing: the same error, not a silent zero mask
    marker_nothing = "{% for m in messages %}{{ m.content }}{% generation %}{% endgeneration %}{% endfor %}"
    with pytest.raises(ValueError, match="example 3.*all zeros"):
        assistant_masks(tokenizer, MULTI, chat_template=marker_nothing, example_index=3)


def test_dropped_assistant_content_is_an_error():
    tokenizer = build_tokenizer("chatml_default_system")
    # a template that never writes assistant content
    drops = "{% for m in messages %}{% if m.role != 'assistant' %}{{ m.content }}{% endif %}<|im_end|>{% endfor %}"
    with pytest.raises(ValueError, match=r"chat template .*example 5: assistant turn 1 .*cannot be located"):
        assistant_masks(tokenizer, MULTI, chat_template=drops, example_index=5)
    # a template that rewrites it beyond recognition
    rewrites = "{% for m in messages %}{{ m.content | upper }}<|im_end|>{% endfor %}"
    with pytest.raises(ValueError, match="cannot be located"):
        assistant_masks(tokenizer, MULTI, chat_template=rewrites, example_index=0)


def test_completion_mask_covers_completion_turns_only():
    tokenizer = build_tokenizer("chatml_default_system")
    out = completion_mask(tokenizer, MULTI[:3], MULTI[3:])
    assert trained_runs(tokenizer, {"input_ids": out["input_ids"], "assistant_masks": out["completion_mask"]}) == [
        "The answer is \\boxed{7}.<|im_end|>"
    ]
    text = completion_mask(tokenizer, "What is 2 plus 3?", " The answer is 5.")
    assert trained_runs(tokenizer, {"input_ids": text["input_ids"], "assistant_masks": text["completion_mask"]}) == [
        " The answer is 5.<|im_end|>"  # eos appended so the model learns to stop
    ]


def test_tokenize_sft_dataset_formats_for_trl():
    from datasets import Dataset

    tokenizer = build_tokenizer("smollm3")
    ds = Dataset.from_list(
        [
            {"messages": THINK[:2], "chat_template_kwargs": {"enable_thinking": True}},
            {"messages": MULTI[:2], "chat_template_kwargs": {"enable_thinking": False}},
        ]
    )
    out = tokenize_sft_dataset(ds, tokenizer)
    assert out.column_names == ["input_ids", "assistant_masks"]
    assert trained_runs(tokenizer, out[0]) == ["<think>\nadd 2 and 3\n</think>\nThe answer is \\boxed{5}.<|im_end|>"]
    assert "Reasoning Mode: /no_think" in tokenizer.decode(out[1]["input_ids"])
    pc = tokenize_sft_dataset(Dataset.from_list([{"prompt": MULTI[:1], "completion": MULTI[1:2]}]), tokenizer)
    assert pc.column_names == ["input_ids", "completion_mask"]
    with pytest.raises(ValueError, match="'messages' or 'prompt' \\+ 'completion'"):
        tokenize_sft_dataset(Dataset.from_list([{"text": "hello"}]), tokenizer)
    bad = Dataset.from_list([{"messages": MULTI[:2]}, {"messages": [MULTI[0]]}])
    with pytest.raises(ValueError, match="example 1"):
        tokenize_sft_dataset(bad, tokenizer)
