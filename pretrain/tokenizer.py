"""Our tokenizer: a byte-level BPE trained on the pretraining mixture, with SmolLM3's chat template.

Why our own: the tiny models' embedding table dominates their parameter count, so a ~4k vocabulary
trained on the text they will see beats a 49k/128k general-purpose one (fertility report below).
Digits are split one by one (as in SmolLM2/Llama) so arithmetic is learnable by a tiny model.

How to run: `python scripts/train_tokenizer.py recipes/tiny/tokenizer.yaml` (saves a HF tokenizer dir
that loads with `AutoTokenizer.from_pretrained`), or in Python:

    tok = train_tokenizer(texts, vocab_size=4096)
    tok.save_pretrained("outputs/tiny/tokenizer")
    print(format_report(fertility_report(tok, held_out_texts)))

Chat format: ChatML (`<|im_start|>role\\n...<|im_end|>\\n`) with SmolLM3's two reasoning modes. The mode
is "/think" unless the kwarg `enable_thinking=False` is passed; a "/think" or "/no_think" flag in the
system message overrides both (and is removed from the shown system text). The system turn is always
emitted but kept short (the mode flag plus any user system text) because tiny models have short contexts.
In no_think mode an empty `<think>\\n\\n</think>\\n` block opens every assistant turn (and the generation
prompt); assistant content plus its `<|im_end|>` sits inside `{% generation %}` so TRL's
`assistant_only_loss` masks work; earlier assistant turns have their `<think>` blocks stripped.
"""

from __future__ import annotations

import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from transformers import PreTrainedTokenizerFast

from align.data.chat import SMOLLM3_TEMPLATE

EOS = "<|endoftext|>"  # document separator in pretraining (also starts every packed document)
IM_START, IM_END, PAD = "<|im_start|>", "<|im_end|>", "<|pad|>"
THINK, END_THINK = "<think>", "</think>"
SPECIAL_TOKENS = [EOS, IM_START, IM_END, PAD, THINK, END_THINK]

# The chat template lives with the other builtin templates (align.data.chat.BUILTIN_TEMPLATES['smollm3']).
CHAT_TEMPLATE = SMOLLM3_TEMPLATE


def train_tokenizer(texts: Iterable[str], vocab_size: int = 4096, min_frequency: int = 2) -> PreTrainedTokenizerFast:
    """Train a byte-level BPE on `texts` and wrap it as a HF fast tokenizer with our chat template."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    if vocab_size < 256 + len(SPECIAL_TOKENS):
        raise ValueError(f"vocab_size={vocab_size} is below the 256 byte symbols + {len(SPECIAL_TOKENS)} specials")
    tok = Tokenizer(models.BPE())
    # Single digits first (numbers become digit sequences), then GPT-2's byte-level regex split.
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True), pre_tokenizers.ByteLevel(add_prefix_space=False)]
    )
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,  # ids 0..5, in this order
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tok.train_from_iterator(texts, trainer=trainer)
    return wrap_tokenizer(tok)


def wrap_tokenizer(tok) -> PreTrainedTokenizerFast:
    """A `tokenizers.Tokenizer` -> PreTrainedTokenizerFast with our special tokens and chat template."""
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tok,
        eos_token=IM_END,  # generation stops at the end of an assistant turn (SmolLM3 convention)
        pad_token=PAD,
        unk_token=None,
        bos_token=None,
        additional_special_tokens=[EOS, IM_START, THINK, END_THINK],
        model_max_length=131072,
        clean_up_tokenization_spaces=False,
    )
    fast.chat_template = CHAT_TEMPLATE
    return fast


def template_renderer() -> PreTrainedTokenizerFast:
    """An untrained tokenizer that only renders our chat template to text (to train the BPE on chat text)."""
    from tokenizers import Tokenizer, models

    return wrap_tokenizer(Tokenizer(models.BPE()))


def special_ids(tokenizer) -> dict[str, int]:
    """Ids of our special tokens; raises ValueError naming the missing ones (e.g. a foreign tokenizer)."""
    ids = {t: tokenizer.convert_tokens_to_ids(t) for t in SPECIAL_TOKENS}
    missing = [t for t, i in ids.items() if i is None or i == tokenizer.unk_token_id]
    if missing:
        raise ValueError(f"tokenizer lacks special tokens {missing}; train one with scripts/train_tokenizer.py")
    return ids


_WORD = re.compile(r"\S+")


def fertility_report(tokenizer, texts: list[str]) -> dict[str, float]:
    """Tokens per word and the share of words split into several tokens ("continued words") on `texts`.

    Words are whitespace-separated; each is encoded with a leading space as it would appear mid-text.
    """
    num_words = num_tokens = num_continued = 0
    words = [w for t in texts for w in _WORD.findall(t)]
    chars = sum(len(t) for t in texts)
    for start in range(0, len(words), 4096):
        batch = [" " + w for w in words[start : start + 4096]]
        for ids in tokenizer(batch, add_special_tokens=False)["input_ids"]:
            num_words += 1
            num_tokens += len(ids)
            num_continued += len(ids) > 1
    if num_words == 0:
        raise ValueError("fertility_report got no words: pass non-empty held-out texts")
    text_tokens = sum(len(x) for x in tokenizer(texts, add_special_tokens=False)["input_ids"])
    return {
        "vocab_size": float(len(tokenizer)),
        "fertility": num_tokens / num_words,
        "continued_words": num_continued / num_words,
        "chars_per_token": chars / max(text_tokens, 1),
    }


def format_report(reports: dict[str, dict[str, float]]) -> str:
    """A markdown table: one row per tokenizer name."""
    lines = ["| tokenizer | vocab | fertility (tok/word) | continued words | chars/token |", "|---|---|---|---|---|"]
    for name, r in reports.items():
        lines.append(
            f"| {name} | {int(r['vocab_size'])} | {r['fertility']:.3f} | {r['continued_words']:.1%} "
            f"| {r['chars_per_token']:.2f} |"
        )
    return "\n".join(lines)


@dataclass
class TokenizerConfig:
    """Recipe keys of scripts/train_tokenizer.py."""

    output_dir: str = field(default="outputs/tiny/tokenizer", metadata={"help": "Where the HF tokenizer is saved."})
    vocab_size: int = field(default=4096, metadata={"help": "BPE vocabulary incl. 256 bytes and 6 specials."})
    min_frequency: int = field(default=2, metadata={"help": "Merges need a pair seen at least this often."})
    sources: dict = field(
        default_factory=dict, metadata={"help": "{name: spec | {spec, formatter, ...}} as in pretrain recipes."}
    )
    max_chars: dict = field(
        default_factory=dict, metadata={"help": "{name: characters of that source to train on} (default 2M)."}
    )
    report_docs: int = field(default=200, metadata={"help": "Held-out documents per source for the report."})
    reference_tokenizer: str | None = field(
        default="builtin:smollm2-135m-instruct", metadata={"help": "Compared in the report; '' to skip."}
    )

    def __post_init__(self):
        import json

        for name in ("sources", "max_chars"):
            if isinstance(getattr(self, name), str) or getattr(self, name) is None:
                setattr(self, name, json.loads(getattr(self, name) or "{}"))
        if not self.sources:
            raise ValueError("sources is empty: give {name: spec} of the texts to train the tokenizer on")
