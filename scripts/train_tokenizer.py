"""Train our byte-level BPE tokenizer on the pretraining sources and report fertility vs a reference.

    python scripts/train_tokenizer.py recipes/tiny/tokenizer.yaml [--vocab_size 8192]

Writes a HF tokenizer dir (AutoTokenizer-loadable, chat template attached) to `output_dir`, plus
`report.md`: tokens per word and share of continued words on held-out documents of every source, ours
side by side with `reference_tokenizer` (the builtin SmolLM2 one by default).
"""

from __future__ import annotations

import os
import time

import data_gen  # noqa: F401  (registers builtin:tasks, a source the tokenizer recipes read)
from align.cli import run
from pretrain.data import load_documents
from pretrain.tokenizer import (
    TokenizerConfig,
    fertility_report,
    format_report,
    template_renderer,
    train_tokenizer,
)

DEFAULT_MAX_CHARS = 2_000_000


def split_source(name: str, docs: list[str], max_chars: int, report_docs: int) -> tuple[list[str], list[str]]:
    """(training texts up to max_chars, held-out texts): the held-out ones are the last documents."""
    held = docs[-report_docs:] if len(docs) > report_docs else docs[-max(1, len(docs) // 10) :]
    train, total = [], 0
    for doc in docs[: len(docs) - len(held)]:
        if total >= max_chars:
            break
        train.append(doc[: max_chars - total])
        total += len(train[-1])
    if not train:
        raise ValueError(f"source {name!r} left no training text; lower report_docs or add documents")
    return train, held


def main(cfg: TokenizerConfig) -> dict:
    t0 = time.perf_counter()
    train_texts, held_out = [], {}
    for name, source in cfg.sources.items():
        docs = load_documents(source, template_renderer())
        train, held = split_source(name, docs, int(cfg.max_chars.get(name, DEFAULT_MAX_CHARS)), cfg.report_docs)
        train_texts += train
        held_out[name] = held
        print(f"{name}: {len(docs)} documents, {sum(map(len, train)):,} training characters, {len(held)} held out")
    tokenizer = train_tokenizer(train_texts, cfg.vocab_size, cfg.min_frequency)
    seconds = time.perf_counter() - t0
    tokenizer.save_pretrained(cfg.output_dir)
    print(f"trained a {len(tokenizer)}-token BPE in {seconds:.1f} s -> {cfg.output_dir}")

    tokenizers = {"ours": tokenizer}
    if cfg.reference_tokenizer:
        try:
            from align.modeling.loading import load_tokenizer

            tokenizers["reference"] = load_tokenizer(cfg.reference_tokenizer)
        except (ImportError, OSError, ValueError) as e:  # the report is a bonus; never fail training for it
            print(f"reference tokenizer {cfg.reference_tokenizer!r} unavailable ({e}); report has ours only")
    sections = []
    for name, texts in {**held_out, "all": [t for v in held_out.values() for t in v]}.items():
        table = format_report({k: fertility_report(t, texts) for k, t in tokenizers.items()})
        sections.append(f"### held-out {name}\n\n{table}\n")
    report = f"# tokenizer report ({cfg.reference_tokenizer or 'no reference'})\n\n" + "\n".join(sections)
    with open(os.path.join(cfg.output_dir, "report.md"), "w") as f:
        f.write(report)
    print(report)
    return {"seconds": seconds, "vocab_size": len(tokenizer)}


CONFIG_TYPES = (TokenizerConfig,)


if __name__ == "__main__":
    run(main, *CONFIG_TYPES)
