"""Tool-use rollouts for GRPO: TRL's `rollout_func` hook, filled by our turn loop on the shared engine.

TRL 1.16 runs `rollout_func(prompts, trainer)` instead of its own generation and takes back prompt ids, completion
ids, log-probs and extra columns: `env_mask` becomes TRL's `tool_mask` (the loss, the importance ratios of
`align/grpo/loss.py` and the logged completion lengths count only the policy's tokens), the rest are handed to the
reward functions as columns (`tool_calls`, `env_reward`: rewards/tools.py). The completion the rewards read is
what the policy wrote (its turns, never a tool's reply: a tool that prints `\\boxed{}` pays nothing).
"""

from __future__ import annotations

from typing import Any

from align.runtime.distributed import gather_objects
from align.tools.loop import ToolLoop, Trajectory, with_tools
from align.tools.runner import ToolRunner
from rewards.extract import completion_text


def build_tool_loop(args, tokenizer) -> ToolLoop | None:
    """The recipe's tools/environment as a loop (None without them); bad tools fail here, at start."""
    if not (args.tools or args.environment):
        return None
    runner = ToolRunner(
        args.tools, environment=args.environment, timeout_s=args.tool_timeout_s, memory_mb=args.tool_memory_mb
    )
    return ToolLoop(tokenizer, runner, max_turns=args.max_turns, max_tokens=args.max_completion_length)


def add_tools_to_prompts(dataset, loop: ToolLoop):
    """Describe the tools in each prompt's system turn (rows whose prompt already lists them are kept)."""

    def add(row):
        prompt = row["prompt"]
        if isinstance(prompt, list) and not any("<tools>" in str(m.get("content")) for m in prompt):
            row["prompt"] = with_tools(prompt, loop.schemas)
        return row

    return dataset.map(add)


def system_text(prompt: Any) -> str | None:
    """A conversational prompt's system turn (None without one)."""
    if isinstance(prompt, list) and prompt and prompt[0].get("role") == "system":
        return prompt[0]["content"]
    return None


def tool_rollout(prompts: list, trainer) -> dict:
    """`rollout_func` for `align.grpo.trainer.GRPOTrainer` with a tool loop (TRL repeats each prompt num_generations
    times in a row; one loop call samples the group's n trajectories)."""
    loop: ToolLoop = trainer.tool_loop
    prompt_ids, _, _ = trainer._tokenize_prompts(prompts)
    n = trainer.num_generations if trainer.model.training else trainer.num_generations_eval
    if trainer.async_active():  # sampled ahead, turn loop and all, while earlier steps trained
        groups = trainer.take_async_trajectories(prompt_ids, n)
    else:
        g = (
            n
            if len(prompt_ids) % n == 0
            and all(list(prompt_ids[i]) == list(prompt_ids[i - i % n]) for i in range(len(prompt_ids)))
            else 1
        )
        rows = list(getattr(trainer, "_tool_rows", None) or [{} for _ in prompts])
        starts = range(0, len(prompt_ids), g)
        trainer.sync_engine()
        params = trainer.sampling_params(g, seed=trainer.sampler.next_seed())

        def generate(ids, p):
            return trainer.sampler.generate(trainer.model_wrapped, ids, p)

        groups = loop.rollout(
            generate,
            [list(prompt_ids[i]) for i in starts],
            params,
            rows=[rows[i] if i < len(rows) else {} for i in starts],
            systems=[system_text(prompts[i]) for i in starts],
        )
    flat: list[Trajectory] = [t for group in groups for t in group]
    log_tool_metrics(trainer, flat)
    return {
        "prompt_ids": [t.prompt_ids for t in flat],
        "completion_ids": [t.completion_ids for t in flat],
        "logprobs": [t.logprobs for t in flat] if trainer.importance_sampling else None,
        "env_mask": [t.mask for t in flat],
        "policy_text": [t.policy_text for t in flat],
        "answer_text": [t.answer_text for t in flat],
        "tool_calls": [t.calls for t in flat],
        "env_reward": [t.env_reward for t in flat],
        "turns": [t.turns for t in flat],
    }


def log_tool_metrics(trainer, trajectories: list[Trajectory]) -> None:
    """tools/* metrics over every rank's rollouts (calls per rollout, statuses, turns, per tool)."""
    mode = "train" if trainer.model.training else "eval"
    parts = gather_objects([Trajectory([], turns=t.turns, calls=t.calls) for t in trajectories])
    for key, value in ToolLoop.summary([t for part in parts for t in part]).items():
        trainer._metrics[mode][key].append(value)


def policy_completions(completions: list, policy_text: list[str]) -> list:
    """TRL decoded the whole trajectory (tool replies included); rewards read only what the policy wrote."""
    if completions and isinstance(completions[0], list):
        return [[{"role": "assistant", "content": text}] for text in policy_text]
    return list(policy_text)


class ToolUse:
    """A part of align.grpo.trainer.GRPOTrainer: with a tool loop, TRL's `rollout_func` runs it and rewards read the
    policy's text (`tool_generation`)."""

    tool_loop: ToolLoop | None = None

    def use_tools(self, loop: ToolLoop) -> None:
        if self.sampler is None:
            raise ValueError("tools need the shared rollout engine (rollout_backend auto/hf/vllm/vllm-server)")
        self.tool_loop, self.rollout_func = loop, tool_rollout

    def _score(self, batch):
        self._tool_rows = batch  # the environment of each rollout resets from its row
        return super()._score(batch)

    def tool_generation(self, out: tuple) -> tuple:
        """TRL's `_generate` output with tools: the rewards read the policy's own text (`policy_text`), the format
        metric the answer turn. Called by the trainer's `_generate`."""
        if self.tool_loop is None:
            return out
        prompt_ids, completion_ids, tool_mask, completions, logprobs, extra, images, tool_images = out
        policy_text = extra.pop("policy_text")
        self._answer_turns = dict(zip(policy_text, extra.get("answer_text", policy_text)))  # stays a reward column
        completions = policy_completions(completions, policy_text)
        return prompt_ids, completion_ids, tool_mask, completions, logprobs, extra, images, tool_images

    def format_view(self, completion) -> str:
        """The text a mode's format metric judges: with tools, the trajectory's last turn (each turn of a multi-turn
        answer opens its own think block in think mode, so the joined turns never have the one-block form)."""
        text = completion_text(completion)
        return getattr(self, "_answer_turns", {}).get(text, text) if self.tool_loop is not None else text
