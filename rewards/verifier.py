r"""Per-row verifiers: each row is scored by the verifier its own ``reward`` (or ``family``) column names.

Why: a dataset mixes task families whose answers need different checks (``data_gen.tasks`` writes
``reward: math_reward`` on numeric rows and ``exact_match_reward`` on the sort family's ordered lists; a
code row needs ``code_reward``). Evaluation has always scored each row by its ``reward`` column; if training
scored every row with one recipe-wide verifier instead, the two would reward different things. Routing
every row the same way in GRPO, preference grading and evaluation gives one definition of correct.

``verifier_reward(completions, reward=..., family=..., **columns)`` picks each row's verifier:

1. the row's ``reward`` column (a registry key such as ``math_reward``, or a dotted/file path);
2. else ``family_verifiers[row's family]`` (a recipe mapping, e.g. ``{sort: exact_match_reward}``);
3. else ``default_verifier`` (``math_reward``).

It calls each verifier once on its rows, with those rows' columns (``verifier_kwargs[name]`` bound), and
returns the scores in row order. Inside GRPO it logs, through TRL's ``log_metric``, the mean score of each
verifier (``verifier/<name>/mean``) and, with a ``family`` column, of each family (``family/<name>/mean``).

``RoutedReward("math_reward")`` is the same routing under the default verifier's name, so that a recipe's
``reward_funcs: [math_reward]`` keeps its log name ``rewards/math_reward/mean`` while rows with another
``reward`` go to theirs; ``route_accuracy(funcs)`` applies it to the accuracy verifier of a reward list
(what GRPO's ``build_rewards`` and preference grading do).

    >>> verifier_reward(["\\boxed{7, 3, 9}", "\\boxed{3, 7, 9}", "\\boxed{42}"],
    ...                 reward=["exact_match_reward", "exact_match_reward", None], answer=["3, 7, 9", "3, 7, 9", "42"])
    [0.0, 1.0, 1.0]
"""

from __future__ import annotations

import inspect
from collections.abc import Callable, Sequence
from typing import Any

from rewards.registry import REWARDS, BoundReward, _run_coroutines, get_reward, reward_name

ACCURACY_VERIFIERS = ("math_reward", "exact_match_reward", "code_reward")
_HOOKS = ("log_extra", "log_metric")  # TRL's logging callbacks: for the router, not for the verifiers it calls


def _name_of(row: dict[str, Any], default_verifier: str, family_verifiers: dict[str, str]) -> str:
    name = row.get("reward")
    if name is not None and str(name).strip():
        return str(name).strip()
    family = row.get("family")
    if family is not None and family in family_verifiers:
        return family_verifiers[family]
    return default_verifier


def _call(func: Callable, completions: list, columns: dict[str, Any]) -> list:
    out = func(completions=completions, **columns)
    if inspect.isawaitable(out):
        out = _run_coroutines([out])[0]
    return list(out)


def _log_means(log_metric: Callable, prefix: str, keys: Sequence, scores: list) -> None:
    by: dict[str, list[float]] = {}
    for key, s in zip(keys, scores):
        if key is not None and s is not None:
            by.setdefault(str(key), []).append(float(s))
    for key, values in sorted(by.items()):
        log_metric(f"{prefix}/{key}/mean", sum(values) / len(values))


def verifier_reward(
    completions: list,
    reward: list[str | None] | None = None,
    family: list[str | None] | None = None,
    default_verifier: str = "math_reward",
    family_verifiers: dict[str, str] | None = None,
    verifier_kwargs: dict[str, dict[str, Any]] | None = None,
    log_metric: Callable[[str, float], None] | None = None,
    **columns: Any,
) -> list[float | None]:
    r"""Score each row with the verifier its ``reward`` column (else ``family_verifiers[family]``, else
    ``default_verifier``) names; None where that verifier abstains.

    >>> verifier_reward(["\\boxed{3, 7, 9}", "\\boxed{7}"], family=["sort", "compare"],
    ...                 family_verifiers={"sort": "exact_match_reward"}, answer=["3, 7, 9", "7"])
    [1.0, 1.0]
    """
    n = len(completions)
    family_verifiers = dict(family_verifiers or {})
    verifier_kwargs = dict(verifier_kwargs or {})
    for label, col in (("reward", reward), ("family", family)):
        if col is not None and (isinstance(col, str) or len(col) != n):
            raise ValueError(f"verifier_reward: the {label!r} column must hold one entry per completion ({n})")
    rows = [{"reward": reward[i] if reward else None, "family": family[i] if family else None} for i in range(n)]
    names = [_name_of(r, default_verifier, family_verifiers) for r in rows]
    if "verifier_reward" in names:
        raise ValueError(
            "verifier_reward: a row's reward column names verifier_reward itself; name a verifier "
            "such as math_reward, exact_match_reward or code_reward"
        )
    passthrough = {k: v for k, v in columns.items() if k not in _HOOKS}
    if family is not None:
        passthrough["family"] = family
    scores: list[float | None] = [None] * n
    for name in dict.fromkeys(names):
        idx = [i for i, x in enumerate(names) if x == name]
        func = get_reward(name, **verifier_kwargs.get(name, {}))
        sub = {
            k: ([v[i] for i in idx] if isinstance(v, (list, tuple)) and len(v) == n else v)
            for k, v in passthrough.items()
        }
        out = _call(func, [completions[i] for i in idx], sub)
        if len(out) != len(idx):
            raise ValueError(f"verifier {name!r} returned {len(out)} scores for {len(idx)} completions")
        for i, s in zip(idx, out):
            scores[i] = s
    if log_metric is not None:
        _log_means(log_metric, "verifier", names, scores)
        if family is not None:
            _log_means(log_metric, "family", family, scores)
    return scores


class RoutedReward:
    """``verifier_reward`` with ``default_verifier`` fixed, under that verifier's own name (and signature, for
    the columns it needs); pickles by its arguments."""

    def __init__(
        self,
        default_verifier: str,
        kwargs: dict[str, Any] | None = None,
        verifier_kwargs: dict[str, dict[str, Any]] | None = None,
        family_verifiers: dict[str, str] | None = None,
    ):
        base = get_reward(default_verifier)
        self.default_verifier = default_verifier
        self.kwargs = dict(kwargs or {})  # the default verifier's own arguments (the recipe's reward_kwargs)
        self.verifier_kwargs = {**(verifier_kwargs or {}), default_verifier: self.kwargs}
        self.family_verifiers = dict(family_verifiers or {})
        self.__name__ = reward_name(base)
        self.__doc__ = base.__doc__
        self.__wrapped__ = getattr(base, "__wrapped__", base)

    def __call__(self, completions: list, **columns: Any) -> list[float | None]:
        return verifier_reward(
            completions,
            default_verifier=self.default_verifier,
            family_verifiers=self.family_verifiers,
            verifier_kwargs=self.verifier_kwargs,
            **columns,
        )

    def __reduce__(self):
        return RoutedReward, (self.default_verifier, self.kwargs, self.verifier_kwargs, self.family_verifiers)

    def __repr__(self) -> str:
        return f"RoutedReward({self.default_verifier!r}, {self.kwargs})"


def route_accuracy(funcs: Sequence[Callable]) -> list[Callable]:
    """Make the accuracy verifier among ``funcs`` (math_reward, exact_match_reward or code_reward, as resolved
    by ``rewards.get_rewards``) route rows by their ``reward`` column; the other rewards are returned as they are.

    >>> from rewards import get_rewards
    >>> funcs, _ = get_rewards(["math_reward", "soft_overlong_reward"],
    ...                        {"soft_overlong_reward": {"max_completion_len": 8, "soft_punish_cache": 2}})
    >>> [type(f).__name__ for f in route_accuracy(funcs)]
    ['RoutedReward', 'BoundReward']
    """

    def accuracy(f: Callable) -> tuple[str, dict] | None:
        for name in ACCURACY_VERIFIERS:
            if f is REWARDS[name]:
                return name, {}
            if isinstance(f, BoundReward) and f.func is REWARDS[name]:
                return name, f.kwargs
        return None

    found = [accuracy(f) for f in funcs]
    named = [a[0] for a in found if a is not None]
    if len(named) > 1:
        raise ValueError(
            f"reward_funcs names {len(named)} accuracy verifiers ({', '.join(named)}): name one. "
            "Each row is scored by the verifier its 'reward' column names "
            "(the one in reward_funcs scores rows without that column)"
        )
    return [RoutedReward(a[0], a[1]) if a is not None else f for f, a in zip(funcs, found)]
