"""The multi-turn tool loop above the rollout engine (the engine stays token ids in, token ids out).

Each rollout: generate a turn (it ends at the model's end-of-turn token); if the turn calls tools, run them
(`align.tools.runner`), append the tool messages as tokens rendered by the chat template, and generate the next
turn from the whole sequence; stop at a turn without calls, after `max_turns` turns, or when the rollout's total
completion tokens (policy and tool) reach `max_tokens`.

The trajectory is the exact ids the engine sampled plus the inserted tool ids, never re-tokenized from text (a
template that drops earlier think blocks, or a tokenizer that merges differently, cannot change what is trained),
with `mask` 1 on the policy's tokens and 0 on the inserted ones: losses, importance ratios and SFT masks use it.

    loop = ToolLoop(tokenizer, ToolRunner(["calculator"]), max_turns=3)
    groups = loop.rollout(engine.generate, prompt_ids, SamplingParams(n=4, max_new_tokens=128), rows=rows)
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field

from align.rollout.base import Rollout, SamplingParams
from align.runtime.distributed import rank_seed
from align.tools.functions import PYTHON_TOOL
from align.tools.parse import parse_tool_calls, tools_system_text
from align.tools.runner import ToolResult, ToolRunner

_SENTINEL = "\u2063TOOLTURN\u2063"


@dataclass
class Trajectory:
    prompt_ids: list[int]
    completion_ids: list[int] = field(default_factory=list)
    mask: list[int] = field(default_factory=list)  # 1: sampled by the policy; 0: inserted tool tokens
    logprobs: list[float] = field(default_factory=list)  # the engine's, per completion token (nan where inserted)
    turns: int = 0
    calls: list[dict] = field(default_factory=list)  # {"turn", "name", "status", "arguments"} per call, in order
    finish_reason: str = "stop"  # stop | length (a turn hit the budget) | max_turns | budget (a tool answer did)
    policy_text: str = ""  # what the policy wrote, its turns decoded and joined: what rewards read
    answer_text: str = ""  # its last turn (the answer): what a mode's format is judged on, turn by turn templates
    env_reward: float | None = None

    @property
    def num_calls(self) -> int:
        return len(self.calls)

    def count(self, status: str) -> int:
        return sum(c["status"] == status for c in self.calls)


def with_tools(messages: list[dict], schemas: list[dict]) -> list[dict]:
    """The prompt with the tools described in its system turn (kept flags such as /think stay in it)."""
    if not schemas:
        return messages
    text = tools_system_text(schemas)
    if messages and messages[0]["role"] == "system":
        return [{"role": "system", "content": text + "\n" + messages[0]["content"]}, *messages[1:]]
    return [{"role": "system", "content": text}, *messages]


class ToolLoop:
    """See the module docstring. `system` is the prompt's system text and `chat_template_kwargs` the kwargs the
    prompts were rendered with: a mode flag in either decides what the template writes before the next assistant
    turn (e.g. an empty think block in no_think mode)."""

    def __init__(
        self,
        tokenizer,
        runner: ToolRunner,
        max_turns: int = 4,
        max_tokens: int | None = None,
        stop_token_ids: list[int] | None = None,
        chat_template_kwargs: dict | None = None,
    ):
        if max_turns < 1:
            raise ValueError(f"max_turns must be >= 1, got {max_turns}")
        self.tok, self.runner = tokenizer, runner
        # what the prompts were rendered with (GRPO's `chat_template_kwargs`, e.g. enable_thinking): the headers of
        # later turns must come from the same mode as the first one's
        self.chat_template_kwargs = dict(chat_template_kwargs or {})
        self.max_turns, self.max_tokens = max_turns, max_tokens
        self.python_tool = PYTHON_TOOL in runner.tools
        eos = stop_token_ids or [tokenizer.convert_tokens_to_ids("<|im_end|>"), tokenizer.eos_token_id]
        self.stop_ids = [i for i in eos if isinstance(i, int) and i != tokenizer.unk_token_id]
        self.end_text = tokenizer.decode([self.stop_ids[0]])
        self.suffix_ids([ToolResult("check", "ok", "ok")], system=None)  # refuses a template without a tool role

    @property
    def schemas(self) -> list[dict]:
        return [t.schema for t in {**self.runner.tools, **self.runner.env_tools}.values()]

    def suffix_ids(self, results: list[ToolResult], system: str | None) -> list[int]:
        """The tokens between the policy's end-of-turn token and its next turn: the tool messages and the next
        assistant header, as the chat template writes them."""
        head = ([{"role": "system", "content": system}] if system is not None else []) + [
            {"role": "user", "content": "q"},
            {"role": "assistant", "content": _SENTINEL},
        ]
        tools = [{"role": "tool", "name": r.name, "content": r.text} for r in results]
        try:
            text = self.tok.apply_chat_template(
                head + tools, tokenize=False, add_generation_prompt=True, **self.chat_template_kwargs
            )
        except Exception as e:  # noqa: BLE001 - a template that refuses the tool role
            raise ValueError(
                f"the chat template cannot render a tool message ({e}); use a template with a tool "
                "role (ChatML-style templates render any role)"
            ) from None
        cut = text.find(_SENTINEL)
        if cut < 0 or not text[cut + len(_SENTINEL) :].startswith(self.end_text):
            raise ValueError(
                "the chat template does not end an assistant turn with the stop token "
                f"{self.end_text!r}; set stop_token_ids to its end-of-turn token"
            )
        return self.tok(text[cut + len(_SENTINEL) + len(self.end_text) :], add_special_tokens=False)["input_ids"]

    def _decode(self, ids: list[int]) -> str:
        return self.tok.decode(ids, skip_special_tokens=False).replace(self.end_text, "").strip()

    def rollout(
        self,
        generate,
        prompt_ids: list[list[int]],
        params: SamplingParams,
        rows: list[dict] | None = None,
        systems: list[str | None] | None = None,
    ) -> list[list[Trajectory]]:
        """`params.n` trajectories per prompt. `generate` is an engine's generate (or a sampler's). `rows` feed the
        environment's reset; `systems` are the prompts' system texts (for the template's turn headers).

        Long because it is one turn loop whose steps (generate, parse the calls, run them, append the replies) extend
        the same trajectories under one token budget, and whose `finally` closes every environment however it ends."""
        budget = self.max_tokens or params.max_new_tokens
        rows = rows or [{} for _ in prompt_ids]
        systems = systems or [None] * len(prompt_ids)
        groups = [[Trajectory(list(p)) for _ in range(params.n)] for p in prompt_ids]
        flat = [(g, t) for g, group in enumerate(groups) for t in group]
        keys = {id(t): f"{g}.{k}" for g, group in enumerate(groups) for k, t in enumerate(group)}
        texts: dict[int, list[str]] = {id(t): [] for _, t in flat}
        for g, t in flat:  # environments start from their rows (the prompt already holds the task)
            self.runner.start(keys[id(t)], rows[g])
        active = list(flat)
        turn = 0
        try:
            while active:
                turn += 1
                room = [budget - len(t.completion_ids) for _, t in active]
                if turn == 1:
                    outs = generate(
                        [group[0].prompt_ids for group in groups],
                        _with(params, max_new_tokens=min(params.max_new_tokens, budget)),
                    )
                    results = [r for group in outs for r in group]
                else:
                    results = []
                    for call, cap in enumerate(sorted(set(room))):  # one call per remaining budget
                        idx = [i for i, r in enumerate(room) if r == cap]
                        # An engine seeds a call, and row i of two calls with one seed draws the same noise: each
                        # call of the turn gets a seed of its own (params.seed already differs per rank and step)
                        seed = None if params.seed is None else rank_seed(params.seed, turn, call, rank=0)
                        out = generate(
                            [active[i][1].prompt_ids + active[i][1].completion_ids for i in idx],
                            _with(params, n=1, max_new_tokens=cap, seed=seed),
                        )
                        results += [(i, o[0]) for i, o in zip(idx, out)]
                    results = [r for _, r in sorted(results, key=lambda x: x[0])]
                still = []
                for (g, t), r in zip(active, results):
                    ids = list(r.completion_ids)
                    lps = list(r.logprobs) if r.logprobs is not None else [math.nan] * len(ids)
                    t.completion_ids += ids
                    t.mask += [1] * len(ids)
                    t.logprobs += lps + [math.nan] * (len(ids) - len(lps))
                    t.turns = turn
                    text = self._decode(ids)
                    texts[id(t)].append(text)
                    calls = parse_tool_calls(text, python_tool=self.python_tool)
                    if r.finish_reason != "stop" or not ids or ids[-1] not in self.stop_ids:
                        t.finish_reason = "length"
                        continue
                    if not calls:
                        t.finish_reason = "stop"
                        continue
                    if turn >= self.max_turns:  # no turn left to read an answer: the calls are not run
                        t.calls += [
                            {"turn": turn, "name": c.name, "status": "unanswered", "arguments": c.arguments}
                            for c in calls
                        ]
                        t.finish_reason = "max_turns"
                        continue
                    answers = [self.runner.call(keys[id(t)], c) for c in calls]
                    t.calls += [
                        {"turn": turn, "name": a.name, "status": a.status, "arguments": c.arguments}
                        for a, c in zip(answers, calls)
                    ]
                    suffix = self.suffix_ids(answers, systems[g])
                    if len(t.completion_ids) + len(suffix) >= budget:
                        t.finish_reason = "budget"
                        continue
                    t.completion_ids += suffix
                    t.mask += [0] * len(suffix)
                    t.logprobs += [math.nan] * len(suffix)
                    still.append((g, t))
                active = still
        finally:
            for _, t in flat:
                t.policy_text = "\n".join(texts[id(t)])
                t.answer_text = texts[id(t)][-1] if texts[id(t)] else ""
                t.env_reward = self.runner.finish(keys[id(t)])
        return groups

    def as_generate(self, generate):
        """An engine-shaped `generate(prompt_ids, params)` whose rollouts run the tool loop and hold only what the
        policy wrote (its turns' ids), for callers that score text: held-out accuracy, evaluation."""

        def run(prompt_ids: list[list[int]], params: SamplingParams) -> list[list[Rollout]]:
            systems = [self._system_of(ids) for ids in prompt_ids]
            groups = self.rollout(generate, prompt_ids, params, systems=systems)
            return [
                [
                    Rollout(
                        t.prompt_ids,
                        [i for i, m in zip(t.completion_ids, t.mask) if m],
                        None,
                        "length" if t.finish_reason == "length" else "stop",
                    )
                    for t in group
                ]
                for group in groups
            ]

        return run

    def _system_of(self, prompt_ids: list[int]) -> str | None:
        """The system text of a ChatML-style prompt (it decides the template's next assistant header)."""
        text = self.tok.decode(prompt_ids, skip_special_tokens=False)
        head = "<|im_start|>system\n"
        if head not in text:
            return None
        return text.split(head, 1)[1].split(self.end_text, 1)[0]

    @staticmethod
    def summary(trajectories: list[Trajectory]) -> dict[str, float]:
        """Per-batch tool metrics: calls per rollout, share of rollouts that called, statuses, turns, per tool."""
        n = max(len(trajectories), 1)
        calls = [c for t in trajectories for c in t.calls]
        out = {
            "tools/calls_per_rollout": len(calls) / n,
            "tools/rollouts_with_calls": sum(t.num_calls > 0 for t in trajectories) / n,
            "tools/turns_mean": sum(t.turns for t in trajectories) / n,
        }
        for status, k in Counter(c["status"] for c in calls).items():
            out[f"tools/status/{status}"] = k / n
        for name, k in Counter(c["name"] for c in calls if c["status"] != "malformed").items():
            out[f"tools/by_tool/{name}"] = k / n
        for turns, k in Counter(t.turns for t in trajectories).items():
            out[f"tools/turns/{turns}"] = k / n
        return out


def _with(params: SamplingParams, **changes) -> SamplingParams:
    from dataclasses import replace

    return replace(params, **changes)
