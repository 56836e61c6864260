"""Shared helpers of the pretrain tests (no tests here): synthetic documents, a tiny tokenizer, tiny configs."""

from __future__ import annotations

import os
import random

ASSETS = os.path.join(os.path.dirname(__file__), "assets")
TOKENIZER_DIR = os.path.join(ASSETS, "tiny_tokenizer")
WORDS = "the a cat dog sat ran on under mat log big small red blue and then it was very happy sad".split()


def synthetic_docs(name: str, num: int, seed: int = 0) -> list[str]:
    """Deterministic little documents: word salad ('words') or arithmetic lines ('math')."""
    rng = random.Random(f"{name}-{seed}")
    docs = []
    for _ in range(num):
        if name == "math":
            a, b = rng.randint(0, 20), rng.randint(0, 20)
            docs.append(f"Question: What is {a} + {b}?\nAnswer: The answer is \\boxed{{{a + b}}}.")
        else:
            docs.append(" ".join(rng.choice(WORDS) for _ in range(rng.randint(5, 60))) + ".")
    return docs


def tiny_tokenizer():
    """Our tokenizer trained on the synthetic docs (cached in tests/assets so the golden loss stays put)."""
    from transformers import AutoTokenizer

    if not os.path.isdir(TOKENIZER_DIR):
        from pretrain.tokenizer import train_tokenizer

        train_tokenizer(synthetic_docs("words", 300) + synthetic_docs("math", 300), vocab_size=320).save_pretrained(
            TOKENIZER_DIR
        )
    return AutoTokenizer.from_pretrained(TOKENIZER_DIR)


def tiny_model_args(**overrides):
    from pretrain.model import ModelArguments

    kw = dict(num_layers=2, hidden_size=32, num_heads=4, num_kv_heads=2, intermediate_size=64, nope_interval=2)
    return ModelArguments(**{**kw, **overrides})


def tiny_config(output_dir: str, **overrides):
    from pretrain.train import PretrainConfig

    kw = dict(
        output_dir=str(output_dir),
        tokenizer_path=TOKENIZER_DIR,
        sources={"words": synthetic_docs("words", 200), "math": synthetic_docs("math", 200)},
        stages=[
            {"name": "a", "num_tokens": 2000, "weights": {"words": 0.8, "math": 0.2}},
            {"name": "b", "num_tokens": 2000, "weights": {"words": 0.2, "math": 0.8}},
        ],
        seq_len=32,
        micro_batch_size=4,
        max_steps=20,
        learning_rate=1e-2,
        warmup_steps=3,
        mixed_precision="no",
        eval_steps=10,
        eval_rows=2,
        eval_docs=5,
        logging_steps=5,
        report_to="none",
        peak_flops=1e11,
        num_threads=1,  # tiny ops: one thread avoids OpenMP spin-waits on a busy 2-core machine
    )
    return PretrainConfig(**{**kw, **overrides})
