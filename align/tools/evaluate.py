"""The tool-use eval suite (`suites: [tools]` in an eval recipe): BFCL's "multiple" category on our own items, and
task accuracy with the tools against without them, on the same prompts.

Each held-out `builtin:tool_tasks` row is asked greedily in each mode twice: once with all the tools described in the
system turn (the turn loop runs the calls), once without tools (one turn). Per mode:
- `tools/<mode>/called`: the first turn made a call; `parseable`: that call parsed (not malformed);
- `right_tool`: the first call named the row's tool (a trivial baseline beside it: `tools/majority_tool`, the share
  of rows whose tool is the commonest one, what always calling that tool scores);
- `right_args`: running the first call gives the gold answer (its reply holds it), among rows with the right tool;
  in a chain of calls (`tool_difference`), whose first reply cannot hold the answer: the first call is one of the
  gold first turn's calls;
- `acc_with_tools` / `acc_without_tools`: the final answer verified, and `paired_p`: the exact McNemar test of the
  two on the same rows (per-item outcomes in details, for the report's paired comparisons between stages);
- `format`: the answer turn with tools has its mode's form (`rewards.format.mode_format_reward`, the judgment GRPO's
  `mode/<m>/format` logs): think, a think block of reasoning then the boxed answer; no_think, no reasoning. A stage
  that keeps the accuracy but drops the think block shows here (tool GRPO did, before the format reward).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter

from align.eval.outcomes import item_id
from align.eval.statistics import paired_change, wilson_interval
from align.rollout.base import SamplingParams
from align.tools.functions import TOOLS
from align.tools.loop import ToolLoop, with_tools
from align.tools.runner import ToolRunner
from rewards.format import mode_format_reward
from rewards.math import math_reward

TOOL_NAMES = ["calculator", "python", "search"]


def _ids(tokenizer, messages) -> list[int]:
    text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
    return tokenizer(text, add_special_tokens=False)["input_ids"]


def _right_args(call: dict, row: dict) -> bool:
    turns = json.loads(row["calls"]) if row.get("calls") else None
    if turns and (len(turns) > 1 or len(turns[0]) > 1):
        return any(call.get("name") == g["name"] and call.get("arguments") == g["arguments"] for g in turns[0])
    try:
        reply = str(TOOLS[call["name"]](**(call.get("arguments") or {})))
    except Exception:  # noqa: BLE001 - a call that fails is not right
        return False
    return reply.strip() == row["answer"] or row["answer"] in re.findall(r"-?\d+", reply)


def tool_suite(engine, tokenizer, rows: list[dict], modes: list[str], max_new_tokens: int, max_turns: int = 3):
    """(metrics, stats, details) of the suite on `rows` (see the module docstring)."""
    loop = ToolLoop(tokenizer, ToolRunner(TOOL_NAMES), max_turns=max_turns, max_tokens=max_turns * max_new_tokens)
    params = SamplingParams(
        n=1, temperature=0.0, max_new_tokens=max_new_tokens, logprobs=False, stop_token_ids=loop.stop_ids
    )
    metrics, stats, details = {}, {}, {}
    tools = Counter(r["tool"] for r in rows)
    metrics["tools/majority_tool"] = tools.most_common(1)[0][1] / len(rows)
    try:
        for mode in modes:
            plain = [
                [{"role": "system", "content": f"/{mode}"}, {"role": "user", "content": r["prompt"]}] for r in rows
            ]
            offered = [with_tools(m, loop.schemas) for m in plain]
            groups = loop.rollout(
                engine.generate,
                [_ids(tokenizer, m) for m in offered],
                params,
                systems=[m[0]["content"] for m in offered],
            )
            trajectories = [g[0] for g in groups]
            bare = engine.generate([_ids(tokenizer, m) for m in plain], params)
            bare_texts = [tokenizer.decode(g[0].completion_ids, skip_special_tokens=True) for g in bare]
            answers = [r["answer"] for r in rows]
            with_ok = [int((s or 0) >= 1) for s in math_reward([t.policy_text for t in trajectories], answers)]
            without_ok = [int((s or 0) >= 1) for s in math_reward(bare_texts, answers)]
            form = [
                int((s or 0) >= 1)
                for s in mode_format_reward(
                    [t.policy_text for t in trajectories],
                    mode=[mode] * len(rows),
                    answer_text=[t.answer_text for t in trajectories],
                )
            ]
            first = [t.calls[0] if t.calls else None for t in trajectories]
            called = [int(c is not None) for c in first]
            parseable = [int(c is not None and c["status"] != "malformed") for c in first]
            right_tool = [int(c is not None and c["name"] == r["tool"]) for c, r in zip(first, rows)]
            right_args = [int(_right_args(c, r)) for c, r, ok in zip(first, rows, right_tool) if ok]
            shares = {
                "called": called,
                "parseable": parseable,
                "right_tool": right_tool,
                "right_args": right_args,
                "acc_with_tools": with_ok,
                "acc_without_tools": without_ok,
                "format": form,
            }
            for key, values in shares.items():
                name = f"tools/{mode}/{key}"
                metrics[name] = sum(values) / len(values) if values else 0.0
                low, high = wilson_interval(sum(values), len(values)) if values else (0.0, 0.0)
                stats[name] = {"num": len(values), "ci_low": low, "ci_high": high}
            paired = paired_change(without_ok, with_ok)
            metrics[f"tools/{mode}/paired_p"] = paired["p_value"]
            details[f"tools/{mode}"] = {
                "paired_without_vs_with": paired,
                "families": [r["family"] for r in rows],
                "prompts_sha": hashlib.sha256("\x00".join(r["prompt"] for r in rows).encode()).hexdigest()[:16],
                "items": [item_id(r["prompt"]) for r in rows],
                "outcomes": {
                    "with_tools": with_ok,
                    "without_tools": without_ok,
                    "right_tool": right_tool,
                    "format": form,
                },
                "samples": [
                    {"prompt": r["prompt"], "policy": t.policy_text[:400], "calls": t.calls}
                    for r, t in list(zip(rows, trajectories))[:6]
                ],
            }
    finally:
        loop.runner.close()
    return metrics, stats, details
