"""The rewards a GRPO run is given: built from the recipe by name, the columns they need, the accuracy verifier."""

from __future__ import annotations

import inspect
import logging
from collections.abc import Sequence

from rewards import checked, get_rewards, route_accuracy
from rewards.verifier import ACCURACY_VERIFIERS, verifier_reward

logger = logging.getLogger(__name__)


# Columns TRL passes to every reward itself; a reward's other required arguments must be dataset columns.
_TRL_REWARD_ARGS = {"completions", "prompts", "completion_ids", "trainer_state", "log_extra", "log_metric"}


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
        p.name
        for p in params
        if p.default is p.empty
        and p.kind in (p.POSITIONAL_OR_KEYWORD, p.KEYWORD_ONLY)
        and p.name not in _TRL_REWARD_ARGS
        and p.name not in bound
    ]


def build_rewards(args) -> list:
    """Resolve `reward_funcs` (+ `reward_kwargs`, `reward_weights`) and wrap each with `rewards.checked`.

    The accuracy verifier among them (math_reward, exact_match_reward or code_reward) routes each row by its
    `reward` column (`rewards.route_accuracy`), as held-out evaluation scores it: the named verifier scores the
    rows without one, and the per-verifier means are logged as `verifier/<name>/mean`."""
    funcs, weights = get_rewards(args.reward_funcs, args.reward_kwargs, args.reward_weights)
    args.reward_weights = weights
    return [checked(f) for f in route_accuracy(funcs)]


def accuracy_verifier(reward_funcs: Sequence[str]) -> str:
    """The verifier held-out accuracy falls back to for rows without a `reward` column: the recipe's accuracy
    reward (not a length or format one), else math_reward."""
    return next((name for name in reward_funcs if name in ACCURACY_VERIFIERS), "math_reward")
