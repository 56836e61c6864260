"""Greedy accuracy and pass@k per task family: where RL can learn (pass@k well above greedy) and where it cannot.

    python scripts/passk.py --model_name_or_path builtin:smollm2-135m-instruct --num_per_family 32 --k 8
    python scripts/passk.py --model_name_or_path outputs/smol135m/sft --families arithmetic sort --mode no_think

Each family's held-out prompts (`data_gen.tasks`, the dev split: where choices are made, never the sealed test) are
answered greedily once and sampled `k` times at `temperature`, through the shared rollout engine; answers are checked
by each row's verifier (align.eval.statistics). Prints a table (greedy accuracy with its 95% interval, pass@1 and
pass@k of the samples, mean length) and writes <output_dir>/passk.json. GRPO has a signal only where a group of k
samples holds both right and wrong answers.
"""

from __future__ import annotations

import json
import logging
from dataclasses import dataclass, field
from pathlib import Path

from align.cli import run
from align.config import rename_deprecated
from align.eval.generation import generate_and_score, greedy_params, pass_at_k
from align.eval.statistics import accuracy
from align.eval.verification import correct
from align.modeling.loading import load_tokenizer
from align.rollout import BACKENDS, SamplingParams, get_engine
from data_gen.tasks import DEFAULT_FAMILIES, make_tasks, prompt_messages


@dataclass
class PassKConfig:
    model_name_or_path: str = field(default="", metadata={"help": "Checkpoint: HF model dir, hub id or builtin:NAME."})
    families: list[str] | None = field(default=None, metadata={"help": "Task families (default: all of ours)."})
    num_per_family: int = field(default=32, metadata={"help": "Held-out prompts per family."})
    split: str = field(
        default="dev",
        metadata={"help": "The task split the prompts come from: dev (choices, e.g. GRPO's family) or validation."},
    )
    k: int = field(default=8, metadata={"help": "Samples per prompt for pass@k."})
    temperature: float = field(default=1.0, metadata={"help": "Sampling temperature for the k samples."})
    mode: str = field(default="no_think", metadata={"help": "think or no_think (the system flag of the prompts)."})
    system_prompt: str | None = field(default=None, metadata={"help": "Replaces the system turn (mode flag kept)."})
    max_new_tokens: int = field(default=128, metadata={"help": "Generation budget per answer."})
    rollout_backend: str = field(default="auto", metadata={"help": f"Rollout backend: one of {list(BACKENDS)}."})
    rollout_kwargs: dict | None = field(default=None, metadata={"help": "Engine knobs for align.rollout.get_engine."})
    seed: int = field(default=0, metadata={"help": "Seed of the prompts and the samples."})
    output_dir: str | None = field(default=None, metadata={"help": "Where passk.json goes (default: none)."})
    backend: str | None = field(default=None, metadata={"help": "Deprecated: the old name of rollout_backend."})

    def __post_init__(self):
        rename_deprecated(self, {"backend": "rollout_backend"})
        if not self.model_name_or_path:
            raise ValueError("model_name_or_path is empty: name the model to measure")
        if self.rollout_backend not in BACKENDS:
            raise ValueError(f"rollout_backend={self.rollout_backend!r}; choose from {list(BACKENDS)}")
        if self.k < 1 or self.num_per_family < 1:
            raise ValueError(f"k={self.k} and num_per_family={self.num_per_family} must be >= 1")
        if self.split not in ("dev", "validation"):
            raise ValueError(
                f"split={self.split!r}: choose dev or validation (the sealed test split is evaluated once, "
                "at the end of a chain, never to choose)"
            )
        if self.mode not in ("think", "no_think"):
            raise ValueError(f"mode={self.mode!r}: choose think or no_think")


def main(cfg: PassKConfig) -> dict:
    tokenizer = load_tokenizer(cfg.model_name_or_path)
    engine = get_engine(
        cfg.model_name_or_path, backend=cfg.rollout_backend, tokenizer=tokenizer, **(cfg.rollout_kwargs or {})
    )
    report: dict = {
        "model": cfg.model_name_or_path,
        "mode": cfg.mode,
        "k": cfg.k,
        "temperature": cfg.temperature,
        "families": {},
    }
    for family in cfg.families or DEFAULT_FAMILIES:
        rows = make_tasks([family], num=cfg.num_per_family, split=cfg.split, seed=cfg.seed)
        messages = []
        for r in rows:
            m = prompt_messages(r, cfg.mode)
            if cfg.system_prompt:
                m[0] = {"role": "system", "content": f"{cfg.system_prompt} /{cfg.mode}"}
            messages.append(m)
        texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in messages]
        ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
        decode = lambda c: tokenizer.decode(c, skip_special_tokens=True)  # noqa: E731
        greedy = generate_and_score(engine.generate, rows, ids, greedy_params(cfg.max_new_tokens), decode)
        sampled = SamplingParams(
            n=cfg.k, temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, logprobs=False
        )
        groups = engine.generate(ids, sampled)
        flags = correct(
            [decode(list(r.completion_ids)) for g in groups for r in g], [r for r in rows for _ in range(cfg.k)]
        )
        counts = [sum(flags[i * cfg.k : (i + 1) * cfg.k]) for i in range(len(rows))]
        report["families"][family] = {
            **accuracy([float(r["correct"]) for r in greedy], key="greedy"),
            "pass@1": sum(pass_at_k(cfg.k, c, 1) for c in counts) / len(counts),
            f"pass@{cfg.k}": sum(pass_at_k(cfg.k, c, cfg.k) for c in counts) / len(counts),
            "signal": sum(0 < c < cfg.k for c in counts) / len(counts),  # groups with right AND wrong answers
            "mean_length": sum(r["num_tokens"] for r in greedy) / len(greedy),
        }
        f = report["families"][family]
        print(
            f"{family:>16}: greedy {f['greedy']:.3f} [{f['ci_low']:.3f}, {f['ci_high']:.3f}] pass@1 "
            f"{f['pass@1']:.3f} pass@{cfg.k} {f[f'pass@{cfg.k}']:.3f} groups with signal {f['signal']:.2f} "
            f"(n={f['num']}, {f['mean_length']:.0f} tokens)",
            flush=True,
        )
    engine.close()
    if cfg.output_dir:
        Path(cfg.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(cfg.output_dir) / "passk.json").write_text(json.dumps(report, indent=2))
    return report


if __name__ == "__main__":
    logging.basicConfig(level=logging.WARNING)
    run(main, PassKConfig)
