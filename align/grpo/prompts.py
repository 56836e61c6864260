"""GRPO's prompts: a reasoning mode per prompt, the groups a batch holds, and the completion budget.

Plain functions of a dataset and a tokenizer (no trainer), testable without building a GRPOTrainer:

    from align.grpo.prompts import prepare_prompts
    train = prepare_prompts(dataset, prompt_mode="think")
"""

from __future__ import annotations

import logging

from data_gen.tasks import assistant_text
from data_gen.tool_tasks import trace_messages
from rewards.code import CODE_ROW_COLUMNS, check_code_rows
from rewards.length import prompt_mode

logger = logging.getLogger(__name__)


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
    `question` (wrapped as one user message). The SFT `messages` column (it holds the gold answer) is dropped. Code
    rows are checked (`rewards.code.check_code_rows`): human-eval style tests without an entry point are refused.
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

    if "tests" in columns:  # a code row no solution can be judged by fails here, before any model loads
        check_code_rows(
            dataset.select_columns([c for c in CODE_ROW_COLUMNS if c in columns]), "code_reward", "the GRPO dataset"
        )
    drop = [c for c in ("messages", "prompt_messages") if c in columns]
    return dataset.map(convert, remove_columns=drop)


def row_mode(row: dict) -> str | None:
    """The reasoning mode a GRPO row asks for: its `mode` column, else its prompt's flag."""
    return row.get("mode") or prompt_mode(row.get("prompt"))


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
            logger.warning(
                "completion budget: the 'calls' column is not builtin:tool_tasks' (a JSON list of turns, "
                "each a list of {name, arguments}): %s; checking the answers alone",
                err,
            )
    if lengths is None:
        texts = [assistant_text({"think": r.get("think", ""), "answer": r["answer"]}, mode) for r in rows]
        lengths = sorted(len(tokenizer(t, add_special_tokens=False)["input_ids"]) + 1 for t in texts)  # +1: stop
    stats = {
        "mode": mode,
        "median": lengths[len(lengths) // 2],
        "p95": lengths[int(0.95 * (len(lengths) - 1))],
        "max": lengths[-1],
        "max_completion_length": max_completion_length,
    }
    if stats["median"] > max_completion_length:
        raise ValueError(
            f"max_completion_length={max_completion_length} is below the median gold {mode}-mode answer "
            f"({stats['median']} tokens, p95 {stats['p95']}): almost every completion would be cut and score 0. "
            f"Raise max_completion_length to at least {stats['p95']}"
        )
    if stats["p95"] > max_completion_length:
        logger.warning(
            "max_completion_length=%d cuts over 5%% of gold %s-mode answers (p95 %d tokens)",
            max_completion_length,
            mode,
            stats["p95"],
        )
    return stats


def _trace_length(row: dict, mode: str, tokenizer) -> int:
    """Tokens of a tool row's gold trajectory after its prompt: each turn's calls, the replies, the answer."""
    if not isinstance(row["prompt"], str):  # prepared rows hold the prompt as messages: the user's question
        row = {**row, "prompt": next(m["content"] for m in reversed(row["prompt"]) if m["role"] == "user")}
    prompt, trace = trace_messages({"think": "", **row}, mode, [])
    start = tokenizer.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
    return len(
        tokenizer(tokenizer.apply_chat_template(trace, tokenize=False), add_special_tokens=False)["input_ids"]
    ) - len(tokenizer(start, add_special_tokens=False)["input_ids"])


def engine_context_length(args, prompts, tokenizer, chat_template: str | None = None) -> int:
    """The rollout engine's context: TRL's `vllm_max_model_length` when set, else the longest prompt (of the first
    1,000, rendered) plus `max_completion_length`."""
    if args.vllm_max_model_length:
        return args.vllm_max_model_length
    rows = prompts.select(range(min(len(prompts), 1000)))
    texts = [
        tokenizer.apply_chat_template(
            r["prompt"],
            add_generation_prompt=True,
            tokenize=False,
            chat_template=chat_template,
            **(args.chat_template_kwargs or {}),
        )
        for r in rows
    ]
    longest = max((len(ids) for ids in tokenizer(texts, add_special_tokens=False)["input_ids"]), default=0)
    return longest + args.max_completion_length + 8  # a few spare tokens: a template may add a suffix


def prompt_groups(prompt_ids: list, num_generations: int) -> tuple[int, list[list[int]]]:
    """TRL repeats each prompt `num_generations` times in a row: (n, the unique prompts) so the engine is asked for
    n samples of each once and can share the prompt's prefill; (1, every prompt) when the rows are not so grouped."""
    g = num_generations if len(prompt_ids) % num_generations == 0 else 1
    unique = [list(prompt_ids[i]) for i in range(0, len(prompt_ids), g)]
    if any(list(prompt_ids[i + j]) != unique[i // g] for i in range(0, len(prompt_ids), g) for j in range(g)):
        return 1, [list(p) for p in prompt_ids]
    return g, unique
