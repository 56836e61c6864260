r"""Evaluation suites that run on any checkpoint (an HF model directory, a hub id or builtin:NAME).

    python scripts/evaluate.py recipes/tiny_eval.yaml --model_name_or_path outputs/tiny/sft

Why: the pipeline evaluates after every stage, so the report can show base -> mid -> SFT -> APO -> GRPO ->
GOLD side by side, each stage moving the metric it targets. The suites (`suites` in the recipe):

- `loss`: held-out loss and perplexity per token on text the model never trained on (our task test split
  in its pretraining text form, plus any `loss_sources`).
- `mc`: multiple-choice items scored two ways. CF (cloze): the choice text whose log-likelihood per
  character, given the context, is highest. MCF: the choices are listed as "A. ... B. ..." and the letter
  with the highest log-prob after "Answer:" wins. Small models get signal from CF long before MCF rises
  above chance (the SmolLM3 playbook's point), so both are reported. Sets: builtin hellaswag / truthfulqa
  and our own task families turned into 4-way items (gold answer + near-miss distractors).
- `generative`: greedy answers through the shared rollout engine (`align.rollout.get_engine`), checked by
  the row's reward from `rewards/` (task families of the data_gen.tasks test split, gsm8k, humaneval code)
  in each of `modes`: `think` / `no_think` (chat template, SmolLM3's reasoning flag) and `plain` (the
  pretraining text form "Question: ...\nAnswer:", the only one a base model can follow). Per set and mode:
  accuracy, format rate (answered in the expected \boxed{} chat format), completion-length statistics and
  the share of completions cut at `max_new_tokens`.
- `vibe`: a fixed set of prompts (including a system-prompt instruction, the kind of thing SmolLM3's vibe
  test caught being dropped) whose answers go to a markdown file for a person to read.

Results: `<output_dir>/eval_results.json` = {"model", "stage", "metrics": {flat name: value}, "details",
"seconds"}; metric names are `loss/<set>`, `ppl/<set>`, `cf/<set>`, `mcf/<set>`, `acc/<set>/<mode>`,
`format/<set>/<mode>`, `len_mean/<set>/<mode>`, `truncated/<set>/<mode>`. Log-likelihoods are computed
with the model itself (the engine returns log-probs of generated tokens only); generation goes through the
engine, which shares the loaded model on the `hf` backend.
"""

from __future__ import annotations

import json
import logging
import math
import os
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from align.distributed import gather_objects, gather_shards, shard, world

logger = logging.getLogger(__name__)

SUITES = ("loss", "mc", "generative", "vibe")
MODES = ("think", "no_think", "plain")
MC_SETS = ("tasks", "hellaswag", "truthfulqa")
GEN_SETS = ("tasks", "gsm8k", "humaneval")
LETTERS = "ABCDEFGH"

VIBE_PROMPTS: list[list[dict]] = [
    [{"role": "user", "content": "What is 12 + 7?"}],
    [{"role": "user", "content": "Sort these numbers: 9, 2, 5."}],
    [{"role": "user", "content": "How many letters are in the word apple?"}],
    [{"role": "user", "content": "Tell me a short story about a cat."}],
    [{"role": "user", "content": "Who are you?"}],
    # A system instruction the answer must follow: lost system prompts show up here first.
    [{"role": "system", "content": "Answer in one word, in capital letters."}, {"role": "user", "content": "Name a fruit."}],
]


@dataclass
class EvalConfig:
    """What to evaluate and how much of it (recipe keys of the same names)."""

    model_name_or_path: str = field(default="", metadata={"help": "Checkpoint: HF model dir, hub id or builtin:NAME."})
    output_dir: str | None = field(default=None, metadata={"help": "Where results go; default <model dir>/eval."})
    stage: str | None = field(default=None, metadata={"help": "Label of the stage that made the model (report)."})
    suites: list[str] = field(default_factory=lambda: list(SUITES), metadata={"help": f"Any of {SUITES}."})
    loss_num_texts: int = field(default=32, metadata={"help": "Held-out task texts for the loss suite."})
    loss_sources: list[str] = field(
        default_factory=list, metadata={"help": "Extra held-out text sources 'spec[:num]' (column 'text')."}
    )
    loss_max_tokens: int = field(default=256, metadata={"help": "Truncate each held-out text to this many tokens."})
    mc_sets: list[str] = field(
        default_factory=lambda: ["tasks:32", "hellaswag:16", "truthfulqa:16"],
        metadata={"help": f"MC sets 'name[:num_items]' from {MC_SETS}."},
    )
    gen_sets: list[str] = field(
        default_factory=lambda: ["tasks:32", "gsm8k:8", "humaneval:4"],
        metadata={"help": f"Generative sets 'name[:num_items]' from {GEN_SETS}."},
    )
    task_families: list[str] | None = field(default=None, metadata={"help": "Task families (default: all ours)."})
    modes: list[str] = field(default_factory=lambda: ["think", "no_think"], metadata={"help": f"Any of {MODES}."})
    max_new_tokens: int = field(default=128, metadata={"help": "Generation budget per answer."})
    vibe_max_new_tokens: int = field(default=96, metadata={"help": "Generation budget per vibe answer."})
    backend: str = field(default="auto", metadata={"help": "Rollout backend: auto, hf, vllm or vllm-server."})
    batch_size: int = field(default=16, metadata={"help": "Sequences per forward pass when scoring."})
    dtype: str = field(default="float32", metadata={"help": "Model dtype for scoring: float32 or bfloat16."})
    seed: int = field(default=0, metadata={"help": "Seed of item sampling and distractors."})
    num_threads: int = field(
        default=0, metadata={"help": "torch CPU threads (0 = torch's default). Tiny models run best on 1."}
    )

    def __post_init__(self):
        if not self.model_name_or_path:
            raise ValueError("model_name_or_path is empty: name the checkpoint to evaluate (an HF model dir)")
        for name, values, valid in (("suites", self.suites, SUITES), ("modes", self.modes, MODES)):
            bad = [v for v in values if v not in valid]
            if bad:
                raise ValueError(f"{name}: unknown {bad}; choose from {list(valid)}")
        for name, specs, valid in (("mc_sets", self.mc_sets, MC_SETS), ("gen_sets", self.gen_sets, GEN_SETS)):
            for spec in specs:
                set_spec(spec, valid, name)


def set_spec(spec: str, valid: tuple[str, ...], field_name: str) -> tuple[str, int]:
    """'tasks:32' -> ('tasks', 32); a bare name means 16 items."""
    name, _, num = str(spec).partition(":")
    if name not in valid or (num and not num.isdigit()):
        raise ValueError(f"{field_name}: bad entry {spec!r}; write 'name[:num_items]' with name in {list(valid)}")
    return name, int(num) if num else 16


# ------------------------------------------------------------------------------------------ log-likelihoods


def _prefix_id(tokenizer) -> int | None:
    # Our pretraining documents start with <|endoftext|>: scoring with it in front matches training.
    tid = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(tid, int) and tid != tokenizer.unk_token_id:
        return tid
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


@torch.no_grad()
def sequence_logprobs(model, seqs: list[tuple[list[int], int]], pad_id: int = 0, batch_size: int = 16) -> list[tuple[float, int]]:
    """For each (token ids, n): sum of the log-probs of the last n tokens given the ones before, and n."""
    max_len = getattr(model.config, "max_position_embeddings", 2048)
    device = next(model.parameters()).device
    seqs = [(ids[-max_len:], min(n, len(ids[-max_len:]) - 1)) for ids, n in seqs]  # the first token has no prediction
    order = sorted(range(len(seqs)), key=lambda i: len(seqs[i][0]))  # similar lengths together: little padding
    out: list[tuple[float, int]] = [(0.0, 0)] * len(seqs)
    for start in range(0, len(seqs), batch_size):
        idx = order[start : start + batch_size]
        chunk = [seqs[i] for i in idx]
        width = max(len(ids) for ids, _ in chunk)
        input_ids = torch.tensor([ids + [pad_id] * (width - len(ids)) for ids, _ in chunk], device=device)
        mask = torch.tensor([[1] * len(ids) + [0] * (width - len(ids)) for ids, _ in chunk], device=device)
        logits = model(input_ids=input_ids, attention_mask=mask).logits.float()  # (B, T, V)
        logps = torch.log_softmax(logits[:, :-1], dim=-1).gather(-1, input_ids[:, 1:, None])[..., 0]  # (B, T-1)
        for row, (i, (ids, n)) in enumerate(zip(idx, chunk)):
            # token t is predicted at position t-1: the last n real tokens sit at logps[len-1-n : len-1]
            out[i] = (logps[row, len(ids) - 1 - n : len(ids) - 1].sum().item(), n)
    return out


def continuation_logprobs(model, tokenizer, pairs: list[tuple[str, str]], batch_size: int = 16) -> list[tuple[float, int]]:
    """Sum of log p(continuation | context) and its token count, for each (context, continuation) pair."""
    prefix = _prefix_id(tokenizer)
    seqs = []
    for context, continuation in pairs:
        ctx = tokenizer(context, add_special_tokens=False)["input_ids"] if context else []
        cont = tokenizer(continuation, add_special_tokens=False)["input_ids"]
        if not cont:
            raise ValueError(f"continuation {continuation!r} has no tokens: a choice cannot be empty")
        seqs.append((([prefix] if prefix is not None else []) + ctx + cont, len(cont)))
    return sequence_logprobs(model, seqs, _pad_id(tokenizer), batch_size)


@torch.no_grad()
def next_token_logprobs(model, tokenizer, pairs: list[tuple[str, str]], batch_size: int = 16) -> list[torch.Tensor]:
    """log p(next token | context) over the vocabulary after each context (the continuation is a placeholder)."""
    prefix = _prefix_id(tokenizer)
    rows = []
    for context, _ in pairs:
        ids = ([prefix] if prefix is not None else []) + tokenizer(context, add_special_tokens=False)["input_ids"]
        rows.append(ids[-getattr(model.config, "max_position_embeddings", 2048) :])
    device = next(model.parameters()).device
    out: list[torch.Tensor] = [None] * len(rows)
    order = sorted(range(len(rows)), key=lambda i: len(rows[i]))
    for start in range(0, len(rows), batch_size):
        idx = order[start : start + batch_size]
        width = max(len(rows[i]) for i in idx)
        pad = _pad_id(tokenizer)
        input_ids = torch.tensor([rows[i] + [pad] * (width - len(rows[i])) for i in idx], device=device)
        mask = torch.tensor([[1] * len(rows[i]) + [0] * (width - len(rows[i])) for i in idx], device=device)
        logits = model(input_ids=input_ids, attention_mask=mask).logits.float()  # (B, T, V)
        for row, i in enumerate(idx):
            out[i] = torch.log_softmax(logits[row, len(rows[i]) - 1], dim=-1).cpu()
    return out


def _pad_id(tokenizer) -> int:
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else 0


def heldout_loss(model, tokenizer, texts: list[str], max_tokens: int = 256, batch_size: int = 16) -> dict:
    """Mean next-token loss per token over `texts` (each truncated to `max_tokens`) and its perplexity."""
    prefix = _prefix_id(tokenizer)
    seqs = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
        if ids:
            seqs.append((([prefix] if prefix is not None else []) + ids, len(ids)))
    scored = sequence_logprobs(model, seqs, _pad_id(tokenizer), batch_size)
    total, count = -sum(s for s, _ in scored), sum(n for _, n in scored)
    loss = total / max(count, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count}


# --------------------------------------------------------------------------------------- multiple choice


def cloze_choice(scores: list[tuple[float, int]], choices: list[str]) -> int:
    """CF: index of the highest log-likelihood per character of the choice (lm-eval's acc_norm)."""
    norm = [s / max(len(c), 1) for (s, _), c in zip(scores, choices)]
    return max(range(len(norm)), key=norm.__getitem__)


def mc_prompt(question: str, choices: list[str]) -> str:
    lines = [question.strip()] + [f"{LETTERS[i]}. {c.strip()}" for i, c in enumerate(choices)]
    return "\n".join(lines) + "\nAnswer:"


def score_mc(model, tokenizer, items: list[dict], batch_size: int = 16) -> dict:
    """CF and MCF accuracy of items {"context", "choices", "label"}; also each item's picks."""
    cf_pairs = [(it["context"], " " + c.strip()) for it in items for c in it["choices"]]
    cf_scores = continuation_logprobs(model, tokenizer, cf_pairs, batch_size)
    letters = [tokenizer(f" {L}", add_special_tokens=False)["input_ids"] for L in LETTERS]
    if all(len(t) == 1 for t in letters):
        # every letter is one token: one forward pass per item scores all of them (the prompt is shared)
        prompts = [(mc_prompt(it["context"], it["choices"]), " A") for it in items]
        firsts = next_token_logprobs(model, tokenizer, prompts, batch_size)
        mcf_scores = [(row[letters[i][0]].item(), 1) for it, row in zip(items, firsts) for i in range(len(it["choices"]))]
    else:
        mcf_pairs = [(mc_prompt(it["context"], it["choices"]), f" {LETTERS[i]}") for it in items for i in range(len(it["choices"]))]
        mcf_scores = continuation_logprobs(model, tokenizer, mcf_pairs, batch_size)
    picks, k = [], 0
    for it in items:
        n = len(it["choices"])
        cf = cloze_choice(cf_scores[k : k + n], [" " + c.strip() for c in it["choices"]])
        mcf = max(range(n), key=lambda i: mcf_scores[k + i][0])
        picks.append({"cf": cf, "mcf": mcf, "label": it["label"]})
        k += n
    return mc_summary(items, picks)


def mc_summary(items: list[dict], picks: list[dict]) -> dict:
    """CF and MCF accuracy, the chance level, and the picks, of items scored in order."""
    num = max(len(items), 1)
    return {
        "cf": sum(p["cf"] == p["label"] for p in picks) / num,
        "mcf": sum(p["mcf"] == p["label"] for p in picks) / num,
        "chance": sum(1 / len(it["choices"]) for it in items) / num,
        "picks": picks,
    }


def _distractors(answer: str, pool: list[str], rng: random.Random, k: int = 3) -> list[str]:
    """Near misses: other numbers close to a numeric gold, else other answers of the same family."""
    out: list[str] = []
    if re.fullmatch(r"-?\d+", answer):
        gold = int(answer)
        for delta in rng.sample([1, -1, 2, -2, 10, -10, 3, 5], 8):
            if len(out) < k and str(gold + delta) not in out and gold + delta >= 0:
                out.append(str(gold + delta))
    others = [a for a in dict.fromkeys(pool) if a != answer and a not in out]
    rng.shuffle(others)
    out += others[: k - len(out)]
    return out[:k]


def task_mc_items(rows: list[dict], seed: int = 0) -> list[dict]:
    """Our task rows as 4-way cloze items: 'Question: q\\nAnswer: The answer is' + ' \\boxed{choice}.'."""
    rng = random.Random(seed)
    by_family: dict[str, list[str]] = {}
    for r in rows:
        by_family.setdefault(r["family"], []).append(r["answer"])
    items = []
    for r in rows:
        wrong = _distractors(r["answer"], by_family[r["family"]], rng)
        if not wrong:
            continue
        choices = [r["answer"], *wrong]
        rng.shuffle(choices)
        items.append(
            {
                "context": f"Question: {r['prompt']}\nAnswer: The answer is",
                "choices": [f"\\boxed{{{c}}}." for c in choices],
                "label": choices.index(r["answer"]),
            }
        )
    return items


def _task_rows(cfg: EvalConfig, num: int) -> list[dict]:
    from data_gen.tasks import make_tasks

    return make_tasks(cfg.task_families, num=num, split="test", seed=cfg.seed)


def mc_items(name: str, num: int, cfg: EvalConfig) -> list[dict]:
    if name == "tasks":
        return task_mc_items(_task_rows(cfg, num), cfg.seed)
    from align.data import load_source

    ds = load_source(f"builtin:{name}").select(range(num))
    key = "context" if name == "hellaswag" else "question"
    return [
        {"context": r[key] if name == "hellaswag" else f"Q: {r[key]}\nA:", "choices": r["choices"], "label": r["label"]}
        for r in ds
    ]


# ------------------------------------------------------------------------------------------- generation


def gen_rows(name: str, num: int, cfg: EvalConfig) -> list[dict]:
    """Rows {"prompt", "answer"?, "reward", reward columns...} of a generative set."""
    if name == "tasks":
        return _task_rows(cfg, num)
    from align.data import load_source

    ds = load_source(f"builtin:{name}").select(range(num))
    if name == "gsm8k":
        return [{"prompt": r["question"], "answer": r["answer"], "reward": "math_reward"} for r in ds]
    return [  # humaneval: the model writes the whole function in a ```python block
        {
            "prompt": f"Complete this Python function. Reply with the code in a ```python block.\n{r['prompt']}",
            "code_prompt": r["prompt"],
            "tests": r["test"],
            "entry_point": r["entry_point"],
            "reward": "code_reward",
        }
        for r in ds
    ]


def build_prompt(tokenizer, question: str, mode: str, system: str | None = None) -> str:
    """The text the model continues: chat template with the reasoning flag, or the pretraining form."""
    if mode == "plain" or not getattr(tokenizer, "chat_template", None):
        return f"Question: {question}\nAnswer:"
    flag = f"/{mode}"
    messages = [{"role": "system", "content": f"{system}\n{flag}" if system else flag}, {"role": "user", "content": question}]
    return tokenizer.apply_chat_template(
        messages, tokenize=False, add_generation_prompt=True, enable_thinking=mode == "think"
    )


def stop_ids(tokenizer) -> list[int]:
    ids = {tokenizer.eos_token_id}
    for tok in ("<|im_end|>", "<|endoftext|>"):
        tid = tokenizer.convert_tokens_to_ids(tok)
        if isinstance(tid, int) and tid != tokenizer.unk_token_id:
            ids.add(tid)
    return sorted(i for i in ids if i is not None)


def decode_completion(tokenizer, ids: list[int], mode: str) -> str:
    specials = set(stop_ids(tokenizer)) | {tokenizer.pad_token_id}
    while ids and ids[-1] in specials:
        ids = ids[:-1]
    text = tokenizer.decode(ids, skip_special_tokens=False)  # keep <think> tags: the format check reads them
    if mode == "plain":
        text = text.split("\n")[0]  # a base model runs on into the next line / document
    return text


def is_formatted(text: str, mode: str) -> bool:
    from rewards import answer_format_reward, think_format_reward

    if mode == "think":
        return think_format_reward([text])[0] == 1.0
    if mode == "no_think" and re.search(r"<think>\s*\S", text):
        return False  # no_think must not reason in a think block
    return answer_format_reward([text])[0] == 1.0


def _reward_completion(row: dict, text: str) -> str:
    if row["reward"] != "code_reward":
        return text
    from rewards.code import extract_code

    code = extract_code(text)
    if f"def {row['entry_point']}" not in code:  # the model wrote the body only
        code = row["code_prompt"] + code
    return f"```python\n{code}\n```"


def generate(engine, tokenizer, prompts: list[str], max_new_tokens: int, mode: str = "think") -> list:
    from align.rollout import SamplingParams

    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    stops = stop_ids(tokenizer)
    if mode == "plain":
        # a pretraining document starts with the separator token, and a plain answer is one line
        prefix = _prefix_id(tokenizer)
        ids = [([prefix] if prefix is not None else []) + x for x in ids]
        newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
        stops = sorted(set(stops) | set(newline[-1:] if len(newline) == 1 else []))
    params = SamplingParams(temperature=0.0, max_new_tokens=max_new_tokens, stop_token_ids=stops, seed=0)
    return [group[0] for group in engine.generate(ids, params)]


def score_generations(rows: list[dict], texts: list[str], lengths: list[int], finish: list[str], mode: str) -> dict:
    """Accuracy through each row's reward, format rate and length statistics of one set in one mode."""
    from rewards import get_reward

    correct = []
    for reward in dict.fromkeys(r["reward"] for r in rows):
        idx = [i for i, r in enumerate(rows) if r["reward"] == reward]
        columns = {k: [rows[i].get(k) for i in idx] for k in ("answer", "tests", "entry_point")}
        columns = {k: v for k, v in columns.items() if any(x is not None for x in v)}
        scores = get_reward(reward)([_reward_completion(rows[i], texts[i]) for i in idx], **columns)
        correct += [(i, s) for i, s in zip(idx, scores)]
    scored = [s for _, s in correct if s is not None]
    n = max(len(rows), 1)
    sorted_len = sorted(lengths)
    return {
        "acc": sum(scored) / max(len(scored), 1),
        "format": sum(is_formatted(t, mode) for t in texts) / n,
        "len_mean": sum(lengths) / n,
        "len_median": sorted_len[len(sorted_len) // 2] if sorted_len else 0,
        "len_max": max(lengths, default=0),
        "truncated": sum(f == "length" for f in finish) / n,
        "num": len(rows),
    }


def run_generative(engine, tokenizer, rows: list[dict], mode: str, max_new_tokens: int) -> tuple[dict, list[dict]]:
    """Greedy answers to `rows` in `mode`, scored. Collective when a process group exists: each rank generates its
    share of the rows and every rank returns the stats over all of them (in the rows' order)."""
    mine = shard(rows)
    prompts = [build_prompt(tokenizer, r["prompt"], mode) for r in mine]
    rollouts = generate(engine, tokenizer, prompts, max_new_tokens, mode) if mine else []
    parts = gather_shards([(decode_completion(tokenizer, list(r.completion_ids), mode), len(r.completion_ids),
                            r.finish_reason) for r in rollouts])
    texts, lengths, finish = [p[0] for p in parts], [p[1] for p in parts], [p[2] for p in parts]
    stats = score_generations(rows, texts, lengths, finish, mode)
    samples = [{"prompt": r["prompt"][:300], "answer": r.get("answer"), "completion": t} for r, t in zip(rows, texts)]
    return stats, samples


def vibe_markdown(engine, tokenizer, modes: list[str], max_new_tokens: int, title: str) -> str:
    chat_modes = [m for m in modes if m != "plain"] or ["no_think"]
    lines = [f"# Vibe check: {title}", "", "Greedy answers to fixed prompts, for a person to read.", ""]
    for mode in chat_modes:
        prompts = []
        for messages in VIBE_PROMPTS:
            system = next((m["content"] for m in messages if m["role"] == "system"), None)
            prompts.append(build_prompt(tokenizer, messages[-1]["content"], mode, system))
        rollouts = generate(engine, tokenizer, prompts, max_new_tokens, mode)
        lines += [f"## mode: {mode}", ""]
        for messages, r in zip(VIBE_PROMPTS, rollouts):
            text = decode_completion(tokenizer, list(r.completion_ids), mode)
            asked = " / ".join(f"**{m['role']}**: {m['content']}" for m in messages)
            lines += [f"### {asked}", "", "```text", text.strip() or "(empty)", "```", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ driver


def _loss_texts(cfg: EvalConfig) -> dict[str, list[str]]:
    from data_gen.tasks import to_pretrain_text

    sets = {"tasks": [to_pretrain_text(r) for r in _task_rows(cfg, cfg.loss_num_texts)]}
    from align.data import load_source

    for spec in cfg.loss_sources:
        src, _, num = spec.rpartition(":") if spec.rsplit(":", 1)[-1].isdigit() else (spec, "", "")
        ds = load_source(src)
        n = min(int(num or 16), len(ds))
        # the last rows: the pretraining recipes hold documents out from the end of each source
        sets[src.removeprefix("builtin:")] = ds.select(range(len(ds) - n, len(ds)))["text"]
    return sets


def evaluate(cfg: EvalConfig, model=None, tokenizer=None, engine=None) -> dict:
    """Run the configured suites on one checkpoint; write eval_results.json (and vibes.md); return results."""
    from align.models import load_model, load_tokenizer, resolve_model_path

    start = time.perf_counter()
    is_main = world()[0] == 0  # under `accelerate launch` every rank scores its share; rank 0 writes
    torch.manual_seed(cfg.seed)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    tokenizer = tokenizer or load_tokenizer(cfg.model_name_or_path)
    model = model or load_model(cfg.model_name_or_path, dtype=cfg.dtype)
    model.eval()
    out_dir = Path(cfg.output_dir or Path(cfg.model_name_or_path) / "eval")
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, float] = {}
    details: dict[str, object] = {}
    seconds: dict[str, float] = {}

    if "loss" in cfg.suites:
        t = time.perf_counter()
        for name, texts in _loss_texts(cfg).items():
            parts = gather_objects(heldout_loss(model, tokenizer, shard(texts), cfg.loss_max_tokens, cfg.batch_size))
            tokens = sum(p["tokens"] for p in parts)
            loss = sum(p["loss"] * p["tokens"] for p in parts) / max(tokens, 1)
            metrics[f"loss/{name}"], metrics[f"ppl/{name}"] = loss, math.exp(min(loss, 50.0))
        seconds["loss"] = time.perf_counter() - t
    if "mc" in cfg.suites:
        t = time.perf_counter()
        for spec in cfg.mc_sets:
            name, num = set_spec(spec, MC_SETS, "mc_sets")
            items = mc_items(name, num, cfg)
            picks = gather_shards(score_mc(model, tokenizer, shard(items), cfg.batch_size)["picks"])
            res = mc_summary(items, picks)
            metrics[f"cf/{name}"], metrics[f"mcf/{name}"] = res["cf"], res["mcf"]
            details[f"mc/{name}"] = {"chance": res["chance"], "picks": res["picks"]}
        seconds["mc"] = time.perf_counter() - t
    wants_engine = "generative" in cfg.suites or "vibe" in cfg.suites
    own_engine = engine is None and wants_engine
    if own_engine:
        from align.rollout import get_engine

        # hf shares the model already loaded; vllm (and auto, which may pick it) loads the directory itself
        source = model if cfg.backend == "hf" else resolve_model_path(cfg.model_name_or_path)
        engine = get_engine(source, backend=cfg.backend, tokenizer=tokenizer)
    try:
        if "generative" in cfg.suites:
            t = time.perf_counter()
            for spec in cfg.gen_sets:
                name, num = set_spec(spec, GEN_SETS, "gen_sets")
                rows = gen_rows(name, num, cfg)
                for mode in cfg.modes:
                    stats, samples = run_generative(engine, tokenizer, rows, mode, cfg.max_new_tokens)
                    for key in ("acc", "format", "len_mean", "truncated"):
                        metrics[f"{key}/{name}/{mode}"] = stats[key]
                    details[f"gen/{name}/{mode}"] = {**stats, "samples": samples[:8]}
            seconds["generative"] = time.perf_counter() - t
        if "vibe" in cfg.suites and is_main:  # fixed prompts for a person to read: one rank writes them
            t = time.perf_counter()
            md = vibe_markdown(engine, tokenizer, cfg.modes, cfg.vibe_max_new_tokens, cfg.stage or cfg.model_name_or_path)
            (out_dir / "vibes.md").write_text(md)
            seconds["vibe"] = time.perf_counter() - t
    finally:
        if own_engine and engine is not None:
            engine.close()
    seconds["total"] = time.perf_counter() - start
    results = {
        "model": cfg.model_name_or_path,
        "stage": cfg.stage,
        "metrics": metrics,
        "details": details,
        "seconds": seconds,
        "config": asdict(cfg),
    }
    if is_main:
        tmp = out_dir / "eval_results.json.tmp"
        tmp.write_text(json.dumps(results, indent=1, default=str))
        os.replace(tmp, out_dir / "eval_results.json")  # a reader never sees half a file
    return results


def format_metrics(metrics: dict[str, float]) -> str:
    width = max((len(k) for k in metrics), default=0)
    return "\n".join(f"{k:<{width}}  {v:.4f}" for k, v in sorted(metrics.items()))
