r"""Greedy answers to questions, checked by the one scorer: the generative eval suite's steps.

Why a module of its own: the eval suites (`align/eval/suite.py`), SFT's held-out check before and after training and
pretraining's skill check all ask a model the same kind of question and score the answer the same way, so the
prompt forms, the stop tokens, the decoding, the format check and the run live here, below the stages that use them.

- `build_prompt`: the chat template with SmolLM3's reasoning flag (`think` / `no_think`), or the pretraining text
  form "Question: ...\nAnswer:" (`plain`, the only one a base model can follow);
- `run_generative(generate, tokenizer, rows, mode, max_new_tokens)`: greedy answers through the shared engine,
  each checked by the verifier the row's `reward` column names (`align.eval.statistics`), with accuracy, format rate
  (answered in the expected \boxed{} chat format) and completion-length statistics.

    from align.eval.generative import run_generative
    stats, samples = run_generative(engine, tokenizer, rows, "no_think", max_new_tokens=128)
"""

from __future__ import annotations

from align.eval.generation import generate_and_score, greedy_params, summarize
from align.eval.statistics import accuracy
from rewards.code import extract_code
from rewards.format import answer_format_reward, no_think_format, think_format_reward


def document_start_id(tokenizer) -> int | None:
    """The token our pretraining documents start with (<|endoftext|>), else BOS, else EOS."""
    # Our pretraining documents start with <|endoftext|>: scoring with it in front matches training.
    tid = tokenizer.convert_tokens_to_ids("<|endoftext|>")
    if isinstance(tid, int) and tid != tokenizer.unk_token_id:
        return tid
    return tokenizer.bos_token_id if tokenizer.bos_token_id is not None else tokenizer.eos_token_id


def build_prompt(tokenizer, question: str, mode: str, system: str | None = None) -> str:
    """The text the model continues: chat template with the reasoning flag, or the pretraining form."""
    if mode == "plain" or not getattr(tokenizer, "chat_template", None):
        return f"Question: {question}\nAnswer:"
    flag = f"/{mode}"
    messages = [
        {"role": "system", "content": f"{system}\n{flag}" if system else flag},
        {"role": "user", "content": question},
    ]
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
    if mode == "think":
        return think_format_reward([text])[0] == 1.0
    if mode == "no_think":
        return no_think_format(text)  # no reasoning block, under any tag name, then one boxed answer
    return answer_format_reward([text])[0] == 1.0


def _reward_completion(row: dict, text: str) -> str:
    """A code answer as the code verifier reads it: the function header added when the model wrote the body only."""
    if row.get("reward") != "code_reward":
        return text
    code = extract_code(text, [row["entry_point"]])
    if f"def {row['entry_point']}" not in code:  # the model wrote the body only
        code = row["code_prompt"] + code
    return f"```python\n{code}\n```"


def prompt_ids(tokenizer, prompts: list[str], mode: str) -> list[list[int]]:
    """Token ids of the prompts; a plain prompt starts with the document-start token, as pretraining documents do."""
    ids = [tokenizer(p, add_special_tokens=False)["input_ids"] for p in prompts]
    prefix = document_start_id(tokenizer) if mode == "plain" else None
    return [[prefix, *x] for x in ids] if prefix is not None else ids


def sampling_params(tokenizer, max_new_tokens: int, mode: str):
    """Greedy, stopping at the end-of-turn / end-of-text tokens (and at the end of the line in plain mode: a plain
    answer is one line)."""
    stops = stop_ids(tokenizer)
    if mode == "plain":
        newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
        stops = sorted(set(stops) | set(newline[-1:] if len(newline) == 1 else []))
    return greedy_params(max_new_tokens, stops)


def generation_stats(records: list[dict], mode: str, families: list[str | None] | None = None) -> dict:
    """Accuracy (the one scorer's, with its interval; per family when given), format rate and length statistics of one
    set in one mode."""
    summary = summarize(records, families)
    fmt = accuracy([float(is_formatted(r["text"], mode)) for r in records], "format")
    return {
        "acc": summary["accuracy"],
        "acc_ci": [summary["ci_low"], summary["ci_high"]],
        "format": fmt["format"],
        "format_ci": [fmt["ci_low"], fmt["ci_high"]],
        "len_mean": summary["mean_completion_length"],
        "len_median": summary["median_completion_length"],
        "len_max": summary["max_completion_length"],
        "truncated": summary["truncated"],
        "num": summary["num"],
        **({"by_family": summary["by_family"]} if "by_family" in summary else {}),
    }


def run_generative(
    generate, tokenizer, rows: list[dict], mode: str, max_new_tokens: int, collective_generate: bool = False
) -> tuple[dict, list[dict]]:
    """Greedy answers to `rows` in `mode`, checked by the one scorer (`align.eval.generation.generate_and_score`).
    `generate` is an engine (or its `generate`, or a trainer sampler's). Collective: call on every rank with all the
    rows; each rank answers its share and every rank returns the stats over all of them (in the rows' order)."""
    generate = getattr(generate, "generate", generate)
    ids = prompt_ids(tokenizer, [build_prompt(tokenizer, r["prompt"], mode) for r in rows], mode)
    records = generate_and_score(
        generate,
        rows,
        ids,
        sampling_params(tokenizer, max_new_tokens, mode),
        lambda c: decode_completion(tokenizer, c, mode),
        to_verifier=_reward_completion,
        collective_generate=collective_generate,
    )
    stats = generation_stats(records, mode, [r.get("family") for r in rows])
    samples = [
        {"prompt": r["prompt"][:300], "answer": r.get("answer"), "completion": rec["text"], "correct": rec["correct"]}
        for r, rec in zip(rows, records)
    ]
    return stats, samples
