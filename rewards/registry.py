r"""The reward registry and the machinery around it: name resolution, bound arguments, checked calls, scoring.

``REWARDS`` maps each of our rewards by its function name; the package (``rewards/__init__.py``) fills it when it
is imported, so the reward modules and ``rewards.verifier`` can use this machinery without importing the package
that imports them. ``get_reward`` also resolves a user's verifier by dotted or file path; ``checked`` makes a
reward's failures name it and the example; ``score`` sums several rewards with weights. The public names are
re-exported by ``rewards``: import them from there.

Run the examples: ``python -m pytest --doctest-modules rewards``.
"""

from __future__ import annotations

import asyncio
import difflib
import hashlib
import importlib
import importlib.util
import inspect
import math as _math
import os
import sys
import threading
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

from rewards.match import completion_text

RewardFunc = Callable[..., Any]

# name -> reward function; filled by rewards/__init__.py (ours) at import
REWARDS: dict[str, RewardFunc] = {}


def is_async(func: Callable) -> bool:
    """True when calling ``func`` returns a coroutine (async function, or an object with an async ``__call__``)."""
    while hasattr(func, "func") and isinstance(func, (BoundReward, CheckedReward)):
        func = func.func
    return inspect.iscoroutinefunction(func) or (callable(func) and inspect.iscoroutinefunction(func.__call__))


def reward_name(func: Callable) -> str:
    return getattr(func, "__name__", type(func).__name__)


# ----------------------------------------------------------------------------------------------- resolution


def _load_file_module(path: str):
    abspath = os.path.abspath(os.path.expanduser(path))
    if not os.path.isfile(abspath):
        raise FileNotFoundError(
            f"reward file {path!r} not found (resolved to {abspath}); give a path relative to the working "
            f"directory {os.getcwd()} or an absolute one, as 'path/to/file.py:function_reward'"
        )
    # One module per file, keyed by its absolute path, so two files named verifiers.py do not collide.
    digest = hashlib.sha1(abspath.encode()).hexdigest()[:10]
    mod_name = f"smolalign_user_rewards.{os.path.splitext(os.path.basename(abspath))[0]}_{digest}"
    if mod_name in sys.modules:
        return sys.modules[mod_name], abspath
    spec = importlib.util.spec_from_file_location(mod_name, abspath)
    if spec is None or spec.loader is None:
        raise ValueError(f"reward file {path!r} is not a Python module (expected a .py file)")
    module = importlib.util.module_from_spec(spec)
    sys.modules[mod_name] = module
    try:
        spec.loader.exec_module(module)
    except BaseException:
        del sys.modules[mod_name]
        raise
    return module, abspath


def _looks_like_file(module_part: str) -> bool:
    return module_part.endswith(".py") or "/" in module_part or os.sep in module_part


def _resolve(name: str) -> tuple[RewardFunc, str]:
    """Return (function, canonical spec) for a registry key, ``module:attr`` or ``file.py:attr``."""
    if name in REWARDS:
        return REWARDS[name], name
    if ":" in name:
        module_part, attr = name.rsplit(":", 1)
        if _looks_like_file(module_part):
            module, abspath = _load_file_module(module_part)
            spec = f"{abspath}:{attr}"
        else:
            try:
                module = importlib.import_module(module_part)
            except ModuleNotFoundError as e:
                raise ValueError(
                    f"reward {name!r}: cannot import module {module_part!r} ({e}). Put its directory on "
                    "PYTHONPATH, or name the file instead: 'path/to/file.py:function_reward'"
                ) from e
            spec = name
        func = getattr(module, attr, None)
        if not callable(func):
            found = sorted(n for n, v in vars(module).items() if callable(v) and n.endswith("_reward"))
            raise ValueError(
                f"reward {name!r}: {module_part!r} has no function {attr!r}; its *_reward functions: {found}"
            )
        return func, spec
    close = difflib.get_close_matches(name, list(REWARDS), n=2, cutoff=0.75)
    hint = f" Did you mean {' or '.join(repr(c) for c in close)}?" if close else ""
    raise ValueError(
        f"unknown reward {name!r}.{hint} Registered rewards: {sorted(REWARDS)}. A verifier of your own is named "
        "by dotted path ('my_lab.verifiers:palindrome_reward') or file path ('./verifiers.py:palindrome_reward')."
    )


def _check_kwargs(func: RewardFunc, name: str, kwargs: dict[str, Any]) -> None:
    """Reject misspelt reward kwargs: a typo swallowed by ``**kwargs`` would silently change nothing."""
    try:
        params = inspect.signature(func).parameters
    except (TypeError, ValueError):  # builtins and some callables have no signature
        return
    named = [p for p, v in params.items() if v.kind not in (v.VAR_KEYWORD, v.VAR_POSITIONAL)]
    takes_any = any(v.kind == v.VAR_KEYWORD for v in params.values())
    strict = func in REWARDS.values() or not takes_any
    unknown = [k for k in kwargs if k not in named]
    if strict and unknown:
        bad = unknown[0]
        close = difflib.get_close_matches(bad, named, n=1)
        hint = f" Did you mean {close[0]!r}?" if close else ""
        raise ValueError(f"reward {name!r} has no argument {bad!r}.{hint} Its arguments: {named}")


class BoundReward:
    """A reward with some keyword arguments fixed; keeps the reward's name and pickles by its spec string."""

    def __init__(self, func: RewardFunc, spec: str, kwargs: dict[str, Any]):
        self.func, self.spec, self.kwargs = func, spec, dict(kwargs)
        self.__name__ = reward_name(func)
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def __call__(self, *args: Any, **columns: Any) -> Any:
        # Bound kwargs are configuration and win over a dataset column of the same name.
        return self.func(*args, **{**columns, **self.kwargs})

    def __reduce__(self):
        return _rebuild, (self.spec, self.kwargs)

    def __repr__(self) -> str:
        return f"{type(self).__name__}({self.spec!r}, {self.kwargs})"


class AsyncBoundReward(BoundReward):
    async def __call__(self, *args: Any, **columns: Any) -> Any:
        return await self.func(*args, **{**columns, **self.kwargs})


def _rebuild(spec: str, kwargs: dict[str, Any]) -> RewardFunc:
    return get_reward(spec, **kwargs)


def get_reward(name: str | RewardFunc, **kwargs: Any) -> RewardFunc:
    r"""Resolve a reward by registry key, ``module:function`` or ``path/file.py:function``; bind ``kwargs``.

    >>> get_reward("math_reward")(["\\boxed{4}"], answer=["4"])
    [1.0]
    >>> r = get_reward("soft_overlong_reward", max_completion_len=10, soft_punish_cache=5)
    >>> r.__name__, r(["a b c d e f g h"])
    ('soft_overlong_reward', [-0.6])
    >>> get_reward("math_rewrd")  # doctest: +ELLIPSIS
    Traceback (most recent call last):
    ...
    ValueError: unknown reward 'math_rewrd'. Did you mean 'math_reward'...? Registered rewards: [...]...
    """
    if callable(name):
        func, spec = name, f"{getattr(name, '__module__', '?')}:{reward_name(name)}"
    elif isinstance(name, str) and name.strip():
        func, spec = _resolve(name.strip())
    else:
        raise ValueError(f"reward name must be a non-empty string or a callable, got {name!r}")
    if not kwargs and not (isinstance(name, str) and _looks_like_file(spec.rsplit(":", 1)[0])):
        return func
    # Functions loaded from a file are wrapped even without kwargs: they then pickle by their path.
    _check_kwargs(func, reward_name(func), kwargs)
    cls = AsyncBoundReward if is_async(func) else BoundReward
    return cls(func, spec, kwargs)


def get_rewards(
    names: str | Sequence[str | RewardFunc],
    reward_kwargs: dict[str, dict[str, Any]] | None = None,
    weights: Sequence[float] | None = None,
) -> tuple[list[RewardFunc], list[float]]:
    """Resolve several rewards (recipe ``reward_funcs``), each with its ``reward_kwargs[name]``; return
    (functions, weights). ``reward_kwargs`` is keyed by the name as written or by the function name.

    >>> funcs, w = get_rewards(["math_reward", "repetition_penalty_reward"],
    ...                        {"repetition_penalty_reward": {"ngram_size": 2}}, [1.0, 0.5])
    >>> [f.__name__ for f in funcs], w
    (['math_reward', 'repetition_penalty_reward'], [1.0, 0.5])
    """
    if isinstance(names, str):
        names = [names]
    names = list(names)
    if not names:
        raise ValueError("reward_funcs is empty: name at least one reward, e.g. reward_funcs: [math_reward]")
    reward_kwargs = dict(reward_kwargs or {})
    funcs, used = [], set()
    for n in names:
        key = n if isinstance(n, str) else reward_name(n)
        short = key.rsplit(":", 1)[-1]
        kw_key = key if key in reward_kwargs else short if short in reward_kwargs else None
        kwargs = reward_kwargs.get(kw_key, {}) if kw_key else {}
        if not isinstance(kwargs, dict):
            raise ValueError(f"reward_kwargs[{kw_key!r}] must be a mapping of argument -> value, got {kwargs!r}")
        used.add(kw_key)
        funcs.append(get_reward(n, **kwargs))
    stray = [k for k in reward_kwargs if k not in used]
    if stray:
        raise ValueError(f"reward_kwargs names {stray} which are not among reward_funcs {names}")
    if weights is None:
        weights = [1.0] * len(funcs)
    weights = [float(w) for w in weights]
    if len(weights) != len(funcs):
        raise ValueError(f"reward_weights has {len(weights)} entries but reward_funcs has {len(funcs)}: {names}")
    return funcs, weights


# ----------------------------------------------------------------------------------------------- validation


def _slice_columns(columns: dict[str, Any], i: int, n: int) -> dict[str, Any]:
    return {k: ([v[i]] if isinstance(v, (list, tuple)) and len(v) == n else v) for k, v in columns.items()}


def _validate(name: str, out: Any, n: int) -> list[float | None]:
    if isinstance(out, (str, bytes)) or not isinstance(out, Sequence):
        if hasattr(out, "tolist"):  # numpy arrays / tensors
            out = out.tolist()
        else:
            raise ValueError(f"reward {name!r} must return a list of floats (or None), got {type(out).__name__}")
    if len(out) != n:
        raise ValueError(f"reward {name!r} returned {len(out)} scores for {n} completions (expected {n})")
    scores: list[float | None] = []
    for i, s in enumerate(out):
        if s is None:
            scores.append(None)
        elif isinstance(s, (int, float)) or hasattr(s, "__float__"):
            scores.append(float(s))
        else:
            raise ValueError(f"reward {name!r} returned a {type(s).__name__} at index {i}; expected float or None")
    return scores


def _failure(name: str, exc: BaseException, index: int | None, completions: Sequence) -> RuntimeError:
    if index is None:
        where = f"on a batch of {len(completions)} (no single example reproduces it)"
    else:
        text = completion_text(completions[index])
        where = f"on example {index} (completion: {text[:200]!r})"
    return RuntimeError(f"reward {name!r} raised {type(exc).__name__}: {exc} {where}")


class CheckedReward:
    """A reward whose failures name the reward and the example; see ``checked``."""

    def __init__(self, func: RewardFunc):
        self.func = func
        self.__name__ = reward_name(func)
        self.__doc__ = func.__doc__
        self.__wrapped__ = func

    def _locate(self, completions: Sequence, columns: dict[str, Any], exc: Exception) -> RuntimeError:
        n = len(completions)
        for i in range(n):
            try:
                self.func(completions=[completions[i]], **_slice_columns(columns, i, n))
            except Exception:
                return _failure(self.__name__, exc, i, completions)
        return _failure(self.__name__, exc, None, completions)

    def __call__(self, completions: Sequence, **columns: Any) -> list[float | None]:
        try:
            out = self.func(completions=completions, **columns)
        except Exception as e:
            raise self._locate(completions, columns, e) from e
        return _validate(self.__name__, out, len(completions))


class AsyncCheckedReward(CheckedReward):
    async def __call__(self, completions: Sequence, **columns: Any) -> list[float | None]:
        try:
            out = await self.func(completions=completions, **columns)
        except Exception as e:
            n = len(completions)
            for i in range(n):
                try:
                    await self.func(completions=[completions[i]], **_slice_columns(columns, i, n))
                except Exception:
                    raise _failure(self.__name__, e, i, completions) from e
            raise _failure(self.__name__, e, None, completions) from e
        return _validate(self.__name__, out, len(completions))


def checked(func: RewardFunc) -> RewardFunc:
    """Wrap a reward so that TRL's GRPOTrainer (or anyone) gets clear errors: an exception is re-raised as
    RuntimeError naming the reward and the failing example index, a wrong number of scores as ValueError
    naming the reward, expected and got. Sync stays sync, async stays async; ``__name__`` is kept.

    >>> bad = checked(lambda completions, **kw: [1.0])
    >>> bad(["a", "b"])
    Traceback (most recent call last):
    ...
    ValueError: reward '<lambda>' returned 1 scores for 2 completions (expected 2)
    """
    if isinstance(func, CheckedReward):
        return func
    return AsyncCheckedReward(func) if is_async(func) else CheckedReward(func)


# ----------------------------------------------------------------------------------------------- scoring


@dataclass
class Scores:
    """Per-example weighted totals and each reward's own scores (keyed by reward name; repeats get ``#2``)."""

    total: list[float | None]
    by_reward: dict[str, list[float | None]]


def _run_coroutines(coros: list) -> list:
    async def gather():
        return await asyncio.gather(*coros)

    try:
        asyncio.get_running_loop()
    except RuntimeError:
        return asyncio.run(gather())
    # Called from inside a running loop (a notebook, an async server): run ours on a helper thread.
    result: dict[str, Any] = {}

    def target():
        try:
            result["value"] = asyncio.run(gather())
        except BaseException as e:  # re-raised in the caller's thread
            result["error"] = e

    t = threading.Thread(target=target, daemon=True)
    t.start()
    t.join()
    if "error" in result:
        raise result["error"]
    return result["value"]


def score(
    funcs: Sequence[str | RewardFunc],
    completions: Sequence,
    weights: Sequence[float] | None = None,
    **columns: Any,
) -> Scores:
    r"""Call each reward on ``completions`` (async ones concurrently), validate, and sum with ``weights``.

    A row's total is the weighted sum of its non-None scores (TRL's nansum), None when every reward
    abstained.

    >>> s = score(["math_reward", "answer_format_reward"], ["\\boxed{4}", "four"], answer=["4", "4"])
    >>> s.total, s.by_reward["math_reward"]
    ([2.0, 0.0], [1.0, 0.0])
    """
    resolved = [get_reward(f) if isinstance(f, str) else f for f in funcs]
    if weights is None:
        weights = [1.0] * len(resolved)
    if len(weights) != len(resolved):
        raise ValueError(f"weights has {len(weights)} entries but {len(resolved)} rewards were given")
    wrapped = [checked(f) for f in resolved]
    results: list[list[float | None] | None] = [None] * len(wrapped)
    pending, pending_idx = [], []
    for i, f in enumerate(wrapped):
        if is_async(f):
            pending.append(f(completions=completions, **columns))
            pending_idx.append(i)
        else:  # sync rewards run here, in the caller's thread (math-verify's timeouts need the main thread)
            results[i] = f(completions=completions, **columns)
    if pending:
        for i, out in zip(pending_idx, _run_coroutines(pending)):
            results[i] = out
    by_reward: dict[str, list[float | None]] = {}
    for f, out in zip(wrapped, results):
        key, k = f.__name__, 2
        while key in by_reward:
            key, k = f"{f.__name__}#{k}", k + 1
        by_reward[key] = out
    total: list[float | None] = []
    for row in range(len(completions)):
        vals = [
            (w, out[row]) for w, out in zip(weights, results) if out[row] is not None and not _math.isnan(out[row])
        ]
        total.append(sum(w * v for w, v in vals) if vals else None)
    return Scores(total=total, by_reward=by_reward)
