"""GRPO's data side: prompts in a reasoning mode, the rewards they need, the completion budget, held-out scoring,
and dynamic sampling's group filter and batch merge.

Why a module of its own: these are plain functions of a dataset and a tokenizer (no trainer), shared by
`align/grpo.py`, the GRPO benchmark and the tests, and each is testable without building a GRPOTrainer.

    from align.grpo_data import prepare_prompts, heldout_accuracy
    train = prepare_prompts(dataset, prompt_mode="think")
"""

from __future__ import annotations

import inspect
import logging
import math
from collections.abc import Callable, Sequence

import torch

from align.scoring import CORRECT_AT, generate_and_score, summarize
from data_gen.tasks import assistant_text
from data_gen.tool_tasks import trace_messages
from rewards import checked, get_rewards, mode_format_reward, route_accuracy
from rewards.length import prompt_mode
from rewards.verifier import ACCURACY_VERIFIERS, verifier_reward

logger = logging.getLogger(__name__)

# Columns TRL passes to every reward itself; a reward's other required arguments must be dataset columns.
_TRL_REWARD_ARGS = {"completions", "prompts", "completion_ids", "trainer_state", "log_extra", "log_metric"}


def _set_system(messages: list[dict], system_prompt: str | None, mode: str | None) -> list[dict]:
    messages = [dict(m) for m in messages]
    has_system = bool(messages) and messages[0].get("role") == "system"
    current = messages[0]["content"] if has_system else ""
    if mode is not None:  # replace the mode flag, keep the rest of the system message
        current = " ".join(w for w in current.split() if w not in ("/think", "/no_think"))
    content = system_prompt if system_prompt is not None else current
    if mode is not None:
        content = f"{content} /{mode}".strip()
    if has_system:
        messages[0]["content"] = content
    elif content:
        messages.insert(0, {"role": "system", "content": content})
    return messages


def _mode_of(messages: list[dict]) -> str | None:
    if messages and messages[0].get("role") == "system":
        words = messages[0]["content"].split()
        if "/no_think" in words:
            return "no_think"
        if "/think" in words:
            return "think"
    return None


def prepare_prompts(dataset, prompt_mode: str | None = None, system_prompt: str | None = None):
    """Rows -> TRL's conversational `prompt` (+ a `mode` column when the prompts carry a mode flag).

    The prompt comes from `prompt_messages` (builtin:tasks), a conversational `prompt`, or a plain-text `prompt` /
    `question` (wrapped as one user message). The SFT `messages` column (it holds the gold answer) is dropped.
    """
    columns = dataset.column_names
    if "prompt_messages" in columns:
        source = "prompt_messages"
    elif "prompt" in columns:
        source = "prompt"
    elif "question" in columns:
        source = "question"
    else:
        raise ValueError(
            f"GRPO needs a prompt: a 'prompt' (text or messages), 'prompt_messages' or 'question' column; the dataset "
            f"has {columns}. Rename the column that holds the question."
        )

    def convert(row: dict) -> dict:
        prompt = row[source]
        if isinstance(prompt, str):
            prompt = [{"role": "user", "content": prompt}]
        prompt = _set_system(prompt, system_prompt, prompt_mode)
        out = {"prompt": prompt}
        if source == "prompt_messages" or (source == "prompt" and isinstance(row["prompt"], str)):
            out["question"] = row["prompt"] if isinstance(row["prompt"], str) else row.get("question")
        mode = _mode_of(prompt)
        if mode is not None or "mode" in columns:
            out["mode"] = mode
        return out

    drop = [c for c in ("messages", "prompt_messages") if c in columns]
    return dataset.map(convert, remove_columns=drop)


def row_mode(row: dict) -> str | None:
    """The reasoning mode a GRPO row asks for: its `mode` column, else its prompt's flag."""
    return row.get("mode") or prompt_mode(row.get("prompt"))


def verifier_scores(inputs: list[dict], completions: list, names: Sequence[str]) -> list[float | None] | None:
    r"""Each row's own verifier score (`verifier_reward`), for `mode/<m>/accuracy` when no reward of the recipe is
    an accuracy verifier (a form-gated reward such as `mode_math_reward` pays 0 to a right answer out of form, so
    its share is not the accuracy); None when one is (`per_mode_metrics` reads its column) or rows hold no answer.

    >>> verifier_scores([{"answer": "4", "reward": "math_reward"}, {"answer": "4"}], ["\boxed{4}", "5"],
    ...                 ["mode_math_reward"])
    [1.0, 0.0]
    >>> verifier_scores([{"answer": "4"}], ["\boxed{4}"], ["math_reward", "mode_format_reward"]) is None
    True
    """
    if any(n in ACCURACY_VERIFIERS for n in names) or not inputs or "answer" not in inputs[0]:
        return None
    columns = {k: [x.get(k) for x in inputs] for k in inputs[0] if k not in ("prompt", "completion", "completion_ids")}
    try:
        return verifier_reward(completions, **columns)
    except Exception as e:  # a logged metric never stops a run: the rewards that train have run already
        logger.debug("mode/<m>/accuracy not logged: the rows' verifier failed: %s", e)
        return None


def per_mode_metrics(rows: list[tuple[str | None, int, object]], rewards_per_func: torch.Tensor, weights: torch.Tensor,
                     names: list[str], accuracy: list[float | None] | None = None) -> dict[str, float]:
    r"""Hybrid reasoning, logged per asked mode: `mode/<m>/reward` (the weighted total), `mode/<m>/<reward name>`,
    `mode/<m>/accuracy` (the accuracy verifier's share at >= 1; `accuracy`, one verifier score a row, when no reward
    is one: `verifier_scores`), `mode/<m>/format` (`mode_format_reward`'s share) and `mode/<m>/length` (completion
    tokens). `rows` = (mode, completion length, completion) per row of `rewards_per_func` (B, F); nothing for rows
    without a mode.

    >>> rows = [("think", 40, "<think>one two three four five six seven eight</think> \\boxed{1}"),
    ...         ("no_think", 6, "\\boxed{2}"), ("no_think", 8, "<think>hm</think> \\boxed{2}")]
    >>> m = per_mode_metrics(rows, torch.tensor([[1.0, 0.0], [0.0, -0.5], [1.0, -1.0]]), torch.tensor([1.0, 0.5]),
    ...                      ["math_reward", "soft_overlong_reward"])
    >>> m["mode/think/reward"], m["mode/no_think/reward"], m["mode/no_think/accuracy"], m["mode/no_think/format"]
    (1.0, 0.125, 0.5, 0.5)
    >>> m["mode/think/length"], m["mode/no_think/length"], m["mode/think/format"]
    (40.0, 7.0, 1.0)
    >>> per_mode_metrics(rows, torch.tensor([[1.0], [0.0], [0.0]]), torch.tensor([1.0]), ["mode_math_reward"],
    ...                  accuracy=[1.0, 1.0, 0.0])["mode/no_think/accuracy"]
    0.5
    """
    if len(rows) != rewards_per_func.shape[0]:
        raise ValueError(f"per_mode_metrics: {len(rows)} rows for {rewards_per_func.shape[0]} rewards")
    per_func = rewards_per_func.detach().float().cpu()
    total = (per_func * weights.float().cpu().unsqueeze(0)).nansum(dim=1)
    column = next((i for i, n in enumerate(names) if n in ACCURACY_VERIFIERS), None)
    if accuracy is not None and len(accuracy) != len(rows):
        raise ValueError(f"per_mode_metrics: {len(accuracy)} accuracy scores for {len(rows)} rows")
    out: dict[str, float] = {}
    for mode in sorted({m for m, _, _ in rows if m in ("think", "no_think")}):
        idx = [i for i, (m, _, _) in enumerate(rows) if m == mode]
        sel = torch.tensor(idx)
        out[f"mode/{mode}/reward"] = total[sel].mean().item()
        for j, name in enumerate(names):
            values = per_func[sel, j]
            if (~torch.isnan(values)).any():
                out[f"mode/{mode}/{name}"] = torch.nanmean(values).item()
        if accuracy is not None or column is not None:
            scored = torch.tensor([s for s in (accuracy[i] for i in idx) if s is not None], dtype=torch.float) \
                if accuracy is not None else per_func[sel, column][~torch.isnan(per_func[sel, column])]
            if scored.numel():
                out[f"mode/{mode}/accuracy"] = (scored >= CORRECT_AT).float().mean().item()
        fmt = mode_format_reward([rows[i][2] for i in idx], mode=[mode] * len(idx))
        out[f"mode/{mode}/format"] = sum(fmt) / len(fmt)
        out[f"mode/{mode}/length"] = sum(rows[i][1] for i in idx) / len(idx)
    return out


def required_reward_columns(func) -> list[str]:
    """Dataset columns a reward needs: its arguments without a default, other than what TRL passes itself."""
    bound = getattr(func, "kwargs", {})
    while hasattr(func, "__wrapped__"):
        bound = {**getattr(func, "kwargs", {}), **bound}
        func = func.__wrapped__
    try:
        params = inspect.signature(func).parameters.values()
    except (TypeError, ValueError):
        return []
    return [
        p.name for p in params
        if p.default is p.empty and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in _TRL_REWARD_ARGS and p.name not in bound
    ]


def build_rewards(args) -> list:
    """Resolve `reward_funcs` (+ `reward_kwargs`, `reward_weights`) and wrap each with `rewards.checked`.

    The accuracy verifier among them (math_reward, exact_match_reward or code_reward) routes each row by its
    `reward` column (`rewards.route_accuracy`), as held-out evaluation scores it: the named verifier scores the
    rows without one, and the per-verifier means are logged as `verifier/<name>/mean`."""
    funcs, weights = get_rewards(args.reward_funcs, args.reward_kwargs, args.reward_weights)
    args.reward_weights = weights
    return [checked(f) for f in route_accuracy(funcs)]


def check_completion_budget(dataset, tokenizer, max_completion_length: int, mode: str | None = None) -> dict | None:
    """Token lengths of the gold answers in `mode` (default: think when the rows have a `think` trace, and some
    prompts ask for it) against the budget. Raises ValueError when the median does not fit (every reward would
    be 0); warns when the p95 does not."""
    if "answer" not in dataset.column_names or len(dataset) == 0:
        return None

    rows = dataset.select(range(min(len(dataset), 256)))
    if mode is None:
        asks_think = "mode" not in rows.column_names or "think" in rows["mode"]
        mode = "think" if "think" in rows.column_names and asks_think else "no_think"
    lengths = None
    if "calls" in rows.column_names:  # tool use: every turn counts, the tools' replies too (as the turn loop does)
        try:
            lengths = sorted(_trace_length(dict(r), mode, tokenizer) for r in rows)
        except (KeyError, TypeError, ValueError, AttributeError) as err:  # not builtin:tool_tasks' shape
            logger.warning("completion budget: the 'calls' column is not builtin:tool_tasks' (a JSON list of turns, "
                           "each a list of {name, arguments}): %s; checking the answers alone", err)
    if lengths is None:
        texts = [assistant_text({"think": r.get("think", ""), "answer": r["answer"]}, mode) for r in rows]
        lengths = sorted(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts)  # +1: stop
    stats = {"mode": mode, "median": lengths[len(lengths) // 2], "p95": lengths[int(0.95 * (len(lengths) - 1))],
             "max": lengths[-1], "max_completion_length": max_completion_length}
    if stats["median"] > max_completion_length:
        raise ValueError(
            f"max_completion_length={max_completion_length} is below the median gold {mode}-mode answer "
            f"({stats['median']} tokens, p95 {stats['p95']}): almost every completion would be cut and score 0. "
            f"Raise max_completion_length to at least {stats['p95']}"
        )
    if stats["p95"] > max_completion_length:
        logger.warning("max_completion_length=%d cuts over 5%% of gold %s-mode answers (p95 %d tokens)",
                       max_completion_length, mode, stats["p95"])
    return stats


def _trace_length(row: dict, mode: str, tokenizer) -> int:
    """Tokens of a tool row's gold trajectory after its prompt: each turn's calls, the replies, the answer."""
    if not isinstance(row["prompt"], str):  # prepared rows hold the prompt as messages: the user's question
        row = {**row, "prompt": next(m["content"] for m in reversed(row["prompt"]) if m["role"] == "user")}
    prompt, trace = trace_messages({"think": "", **row}, mode, [])
    start = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return len(tokenizer(tokenizer.apply_chat_template(trace, tokenize=False), add_special_tokens=False)["input_ids"]) - \
        len(tokenizer(start, add_special_tokens=False)["input_ids"])


# ----------------------------------------------------------------------------------------------- evaluation


def heldout_accuracy(generate, tokenizer, dataset, params, default_reward: str, template_kwargs: dict | None = None,
                     chat_template: str | None = None) -> dict:
    """Greedy accuracy on held-out rows, from the one scorer (`align.scoring`): each row checked by the verifier its
    `reward` column names (else `default_reward`), correct at a score >= 1, with its 95% interval.

    `generate(prompt_ids, params) -> [[Rollout]]` is the trainer's sampler (or an engine's `generate`). Collective: call
    it on every rank; each rank generates and scores its share of the rows, and every rank returns the report over all
    of them."""
    rows = [dict(r) for r in dataset]
    prompts = [
        tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False,
                                      chat_template=chat_template, **(template_kwargs or {}))
        for r in rows
    ]
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    records = generate_and_score(generate, rows, ids, params, lambda c: tokenizer.decode(c, skip_special_tokens=True),
                                 default_verifier=default_reward, collective_generate=True)
    families = [r.get("family") for r in rows] if "family" in dataset.column_names else None
    summary = summarize(records, families)  # task rows: which families moved
    modes = [row_mode(r) for r in rows]
    report = {"accuracy": summary["accuracy"], "num_prompts": summary["num"], "ci_low": summary["ci_low"],
              "ci_high": summary["ci_high"], "mean_completion_length": summary["mean_completion_length"],
              "sample": [r["text"] for r in records][:3],
              "correct": [int(r["correct"]) for r in records]}  # per row, in row order: a paired before/after test
    if "by_family" in summary:
        report["by_family"] = summary["by_family"]
    if any(m is not None for m in modes):  # hybrid reasoning: accuracy and format per asked mode
        report["by_mode"] = {}
        for mode in sorted({m for m in modes if m is not None}):
            mine = [rec for rec, m in zip(records, modes) if m == mode]
            fmt = mode_format_reward([rec["text"] for rec in mine], mode=[mode] * len(mine))
            report["by_mode"][mode] = {"accuracy": sum(rec["correct"] for rec in mine) / len(mine), "num": len(mine),
                                       "format": sum(fmt) / len(fmt)}
    return report


# ----------------------------------------------------------------------------------------------- dynamic sampling


def group_has_signal(rewards: torch.Tensor, num_generations: int, atol: float = 1e-6) -> torch.Tensor:
    """(G,) bool: which groups of `num_generations` consecutive rewards (B,) vary (DAPO keeps only those).

    NaN rewards (every reward abstained) are ignored; a group with fewer than two scored completions has none.
    >>> group_has_signal(torch.tensor([1., 1., 0., 1., 0., 0., float("nan"), 1.]), 2).tolist()
    [False, True, False, False]
    """
    if rewards.numel() % num_generations:
        raise ValueError(f"{rewards.numel()} rewards do not split into groups of num_generations={num_generations}")
    grouped = rewards.view(-1, num_generations).float()
    valid = ~torch.isnan(grouped)
    hi = torch.where(valid, grouped, torch.full_like(grouped, -math.inf)).amax(dim=1)
    lo = torch.where(valid, grouped, torch.full_like(grouped, math.inf)).amin(dim=1)
    return (valid.sum(dim=1) >= 2) & ((hi - lo) > atol)


def _pad_cat(tensors: list[torch.Tensor], value: float, left: bool) -> torch.Tensor:
    """Concatenate (B_i, T_i) tensors along dim 0, padding dim 1 to the widest (left or right)."""
    width = max(t.size(1) for t in tensors)
    out = []
    for t in tensors:
        pad = width - t.size(1)
        if pad:
            filler = t.new_full((t.size(0), pad, *t.shape[2:]), value)
            t = torch.cat([filler, t] if left else [t, filler], dim=1)
        out.append(t)
    return torch.cat(out, dim=0)


def merge_batches(parts: list[tuple[dict, torch.Tensor]], pad_token_id: int,
                  gather: Callable[[torch.Tensor], torch.Tensor]) -> dict:
    """Rows `idx` of each scored batch, merged into one (prompt tensors left-padded, completion tensors right-padded).
    `num_items_in_batch` is recounted from the merged masks over every rank, as TRL counts it: `gather` is the
    trainer's `accelerator.gather` (every rank calls this), and TRL's dapo/cispo normaliser divides the count by the
    number of processes, so each rank's tokens weigh 1 / (every rank's tokens): one global token mean."""
    assert parts, "merge_batches needs at least one part"
    merged: dict = {}
    for key, first in parts[0][0].items():
        if key == "num_items_in_batch":
            continue
        if not isinstance(first, torch.Tensor):
            raise ValueError(f"dynamic_sampling cannot merge the batch field {key!r} (multimodal inputs are unsupported)")
        chunks = [batch[key][idx] for batch, idx in parts]
        if first.dim() == 1:
            merged[key] = torch.cat(chunks)
        else:
            value = pad_token_id if key in ("prompt_ids", "completion_ids") else (1 if key == "tool_mask" else 0)
            merged[key] = _pad_cat(chunks, value, left=key.startswith("prompt"))
    mask = merged["completion_mask"] * merged["tool_mask"] if "tool_mask" in merged else merged["completion_mask"]
    merged["num_items_in_batch"] = gather(mask.sum()).sum()
    return merged


def accuracy_verifier(reward_funcs: Sequence[str]) -> str:
    """The verifier held-out accuracy falls back to for rows without a `reward` column: the recipe's accuracy
    reward (not a length or format one), else math_reward."""
    return next((name for name in reward_funcs if name in ACCURACY_VERIFIERS), "math_reward")


def engine_context_length(args, prompts, tokenizer, chat_template: str | None = None) -> int:
    """The rollout engine's context: TRL's `vllm_max_model_length` when set, else the longest prompt (of the first
    1,000, rendered) plus `max_completion_length`."""
    if args.vllm_max_model_length:
        return args.vllm_max_model_length
    rows = prompts.select(range(min(len(prompts), 1000)))
    texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False,
                                           chat_template=chat_template, **(args.chat_template_kwargs or {}))
             for r in rows]
    longest = max((len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]), default=0)
    return longest + args.max_completion_length + 8  # a few spare tokens: a template may add a suffix


def mean_metric(log_history: Sequence[dict], key: str, last: int | None = None) -> float:
    """Mean of a logged metric over the training log (the last `last` entries when given)."""
    values = [h[key] for h in log_history if key in h]
    values = values[-last:] if last else values
    return sum(values) / len(values) if values else float("nan")


def prompt_groups(prompt_ids: list, num_generations: int) -> tuple[int, list[list[int]]]:
    """TRL repeats each prompt `num_generations` times in a row: (n, the unique prompts) so the engine is asked for
    n samples of each once and can share the prompt's prefill; (1, every prompt) when the rows are not so grouped."""
    g = num_generations if len(prompt_ids) % num_generations == 0 else 1
    unique = [list(prompt_ids[i]) for i in range(0, len(prompt_ids), g)]
    if any(list(prompt_ids[i + j]) != unique[i // g] for i in range(0, len(prompt_ids), g) for j in range(g)):
        return 1, [list(p) for p in prompt_ids]
    return g, unique
