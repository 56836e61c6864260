r"""Verifiable rewards: the registry, name resolution, and validated scoring.

A reward is a plain function ``(completions, **columns) -> list[float | None]`` (None = abstain) that
serves GRPO, verifier-graded preference data and evaluation alike. ``REWARDS`` maps each of ours by its
function name; ``get_reward`` also resolves a user's verifier without touching our source:

    get_reward("math_reward")                                  # registry key
    get_reward("my_lab.verifiers:palindrome_reward")           # dotted path (module importable on sys.path)
    get_reward("./my_verifiers.py:palindrome_reward")          # file path, relative to the cwd, or absolute
    get_reward("soft_overlong_reward", max_completion_len=512, soft_punish_cache=128)   # kwargs bound

Each row may name its own verifier: ``verifier_reward`` scores a row with the verifier its ``reward`` column
names (``rewards.verifier``), and ``route_accuracy`` makes a recipe's accuracy verifier route rows the same way.

Bound rewards keep their ``__name__`` (TRL logs them as ``rewards/<name>``), stay async when the function
is async, and pickle by name, so TRL's spawned rollout workers can rebuild them. ``checked(f)`` wraps a
reward so that an exception names the reward and the failing example, and a wrong number of scores names
the reward, the expected and the returned count; ``score(funcs, completions, **columns)`` calls several
rewards that way (async ones concurrently) and sums them with weights.

The registry machinery lives in ``rewards/registry.py``; this package module registers our rewards in it.

Run the examples: ``python -m pytest --doctest-modules rewards``.
"""

from rewards.code import code_reward
from rewards.format import answer_format_reward, mode_format_reward, mode_math_reward, think_format_reward
from rewards.length import cosine_length_reward, soft_overlong_reward
from rewards.match import completion_text, exact_match_reward
from rewards.math import math_reward
from rewards.registry import (
    REWARDS,
    BoundReward,
    CheckedReward,
    RewardFunc,
    Scores,
    checked,
    get_reward,
    get_rewards,
    is_async,
    reward_name,
    score,
)
from rewards.repetition import repetition_penalty_reward
from rewards.tools import environment_reward, tool_call_reward
from rewards.verifier import RoutedReward, route_accuracy, verifier_reward

REWARDS.update(
    (f.__name__, f)
    for f in (
        math_reward,
        exact_match_reward,
        code_reward,
        think_format_reward,
        answer_format_reward,
        mode_format_reward,
        mode_math_reward,
        soft_overlong_reward,
        cosine_length_reward,
        repetition_penalty_reward,
        verifier_reward,
        tool_call_reward,
        environment_reward,
    )
)

__all__ = [
    "REWARDS",
    "BoundReward",
    "CheckedReward",
    "RewardFunc",
    "RoutedReward",
    "Scores",
    "checked",
    "completion_text",
    "get_reward",
    "get_rewards",
    "is_async",
    "reward_name",
    "route_accuracy",
    "score",
    *REWARDS,
]
