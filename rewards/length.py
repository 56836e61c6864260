r"""Length rewards: DAPO's soft overlong punishment (per reasoning mode) and a cosine-scaled length reward.

``soft_overlong_reward`` (DAPO, eq. 13): 0 while the completion is at most ``L_max - L_cache`` long, then
linear down to -1 at ``L_max``, and -1 beyond. SmolLM3's RL found that without it no_think completions
explode in length, and that each reasoning mode needs its own budget: think-mode completions are judged
against ``think_max_completion_len`` / ``think_soft_punish_cache`` (defaulting to the plain ones). The mode
of a row comes from what was asked, never from what was answered: the ``mode`` column ("think" /
"no_think"), else the prompt's ``/think`` or ``/no_think`` flag (TRL passes ``prompts``), and only when
neither exists from the completion itself (non-empty ``<think>`` content = think) — where a no_think answer
padded with a think block would get the think budget, so give think budgets a ``mode`` column or flags.

``cosine_length_reward`` ("Demystifying Long Chain-of-Thought Reasoning"): correct answers earn from
``max_value_correct`` (short) down to ``min_value_correct`` (at ``max_len``); wrong ones are penalised
from ``min_value_wrong`` (short) to ``max_value_wrong`` (long): a long wrong attempt is penalised less than
a short guess. Correctness is each row's verifier (``rewards.verifier``: its ``reward`` column, else
``math_reward`` or ``exact_match_reward`` as ``verifier`` says). Padding a wrong answer moves it towards the
long end (-0.5 rather than -1): that is the schedule's design (exploration), so pair it with
``repetition_penalty_reward`` when filler is a risk.

Lengths are in tokens when TRL passes ``completion_ids`` (it does for every reward function), else estimated by
``estimated_tokens``: the larger of the whitespace-separated words and the UTF-8 bytes of the text that is not
whitespace over ``BYTES_PER_TOKEN`` (4: byte-level BPE tokenizers average about 4 bytes a token on English). Words
alone can be gamed (a text without spaces is one word); bytes cannot (removing spaces removes no byte that counts),
and on ordinary English the two agree within a third (a word is about 5.5 bytes, 1.3 tokens). Invisible characters
count: they cost tokens all the same. Run the examples: ``python -m pytest --doctest-modules rewards/length.py``.
"""

from __future__ import annotations

import math
import re
from typing import Any

from rewards.match import completion_text
from rewards.verifier import verifier_reward

_THINK_CONTENT = re.compile(r"<think>(.*?)(?:</think>|\Z)", re.DOTALL)
_WORD = re.compile(r"\S+")
_SPACE = re.compile(r"\s+")
BYTES_PER_TOKEN = 4


def estimated_tokens(text: str) -> int:
    """A completion's length without its token ids: the larger of its whitespace-separated words and its UTF-8
    bytes outside whitespace over ``BYTES_PER_TOKEN`` (rounded up). Linear, and it keeps no list of the words.

    >>> estimated_tokens("w " * 5), estimated_tokens("the cat sat on the mat"), estimated_tokens("x" * 400)
    (5, 6, 100)
    >>> estimated_tokens("三加四等于七"), estimated_tokens("")
    (5, 0)
    """
    words = _WORD.subn("", text)[1]  # counted in C: no list of words, no match objects
    return max(words, -(-len(_SPACE.sub("", text).encode("utf-8", "surrogatepass")) // BYTES_PER_TOKEN))


def _lengths(completions: list, completion_ids: list | None) -> list[int]:
    if completion_ids is not None:
        if len(completion_ids) != len(completions):
            raise ValueError(
                f"completion_ids has {len(completion_ids)} rows but there are {len(completions)} completions"
            )
        return [len(ids) for ids in completion_ids]
    return [estimated_tokens(completion_text(c)) for c in completions]


def is_think_mode(text: str) -> bool:
    r"""True when the completion reasons in a non-empty ``<think>`` block.

    >>> is_think_mode("<think>\nlet me see\n</think>\n\\boxed{1}"), is_think_mode("<think>\n\n</think>\n\\boxed{1}")
    (True, False)
    """
    m = _THINK_CONTENT.search(text)
    return bool(m and m.group(1).strip())


def prompt_mode(prompt: Any) -> str | None:
    r"""The reasoning mode a prompt asks for: its ``/think`` or ``/no_think`` flag (system message or text).

    >>> prompt_mode([{"role": "system", "content": "/no_think"}, {"role": "user", "content": "2+2?"}])
    'no_think'
    >>> prompt_mode("What is 2+2?") is None
    True
    """
    if isinstance(prompt, str):
        texts = [prompt]
    elif isinstance(prompt, (list, tuple)):
        texts = [str(m.get("content") or "") for m in prompt if isinstance(m, dict) and m.get("role") == "system"]
    else:
        return None
    words = {w for t in texts for w in t.split()}
    if "/no_think" in words:
        return "no_think"
    return "think" if "/think" in words else None


def overlong_penalty(length: int, max_len: int, cache: int) -> float:
    """DAPO soft overlong punishment of one length.

    >>> [overlong_penalty(n, 100, 20) for n in (50, 80, 90, 100, 101)]
    [0.0, 0.0, -0.5, -1.0, -1.0]
    """
    if length <= max_len - cache:
        return 0.0
    if length <= max_len:
        return (max_len - cache - length) / cache
    return -1.0


def _check_budget(name: str, max_len: int | None, cache: int | None) -> tuple[int, int]:
    if max_len is None or cache is None:
        raise ValueError(
            f"soft_overlong_reward needs {name}max_completion_len and {name}soft_punish_cache; "
            "set them in the recipe, e.g. reward_kwargs: "
            "{soft_overlong_reward: {max_completion_len: 512, soft_punish_cache: 128}}"
        )
    if max_len <= 0 or not 0 <= cache <= max_len:
        raise ValueError(
            f"soft_overlong_reward: need 0 <= {name}soft_punish_cache <= {name}max_completion_len and a positive "
            f"max_completion_len, got max_completion_len={max_len}, soft_punish_cache={cache}"
        )
    return max_len, cache


def soft_overlong_reward(
    completions: list,
    completion_ids: list[list[int]] | None = None,
    max_completion_len: int | None = None,
    soft_punish_cache: int | None = None,
    think_max_completion_len: int | None = None,
    think_soft_punish_cache: int | None = None,
    mode: list[str | None] | None = None,
    prompts: list | None = None,
    **kwargs: Any,
) -> list[float]:
    r"""DAPO soft overlong punishment with separate budgets for think and no_think completions.

    >>> soft_overlong_reward(["w " * 5, "w " * 9, "w " * 12], max_completion_len=10, soft_punish_cache=4)
    [0.0, -0.75, -1.0]
    >>> soft_overlong_reward(["<think>\nw w w w w w w\n</think> \\boxed{1}", "w w w w w w w w w"],
    ...                      max_completion_len=8, soft_punish_cache=2,
    ...                      think_max_completion_len=20, think_soft_punish_cache=5)
    [0.0, -1.0]
    >>> soft_overlong_reward(["x", "x"], completion_ids=[[1] * 90, [1] * 10], max_completion_len=100,
    ...                      soft_punish_cache=20, mode=["no_think", "think"])
    [-0.5, 0.0]
    """
    budget = _check_budget("", max_completion_len, soft_punish_cache)
    think_budget = _check_budget(
        "think_",
        think_max_completion_len if think_max_completion_len is not None else max_completion_len,
        think_soft_punish_cache if think_soft_punish_cache is not None else soft_punish_cache,
    )
    lengths = _lengths(completions, completion_ids)
    if mode is not None and len(mode) != len(completions):
        raise ValueError(f"the mode column has {len(mode)} rows but there are {len(completions)} completions")
    scores = []
    for i, (completion, length) in enumerate(zip(completions, lengths)):
        row_mode = mode[i] if mode is not None else None
        if row_mode is None and prompts is not None and i < len(prompts):
            row_mode = prompt_mode(prompts[i])
        if row_mode not in (None, "think", "no_think"):
            raise ValueError(f"soft_overlong_reward: mode must be 'think' or 'no_think', got {row_mode!r} at row {i}")
        think = row_mode == "think" if row_mode is not None else is_think_mode(completion_text(completion))
        max_len, cache = think_budget if think else budget
        scores.append(overlong_penalty(length, max_len, cache))
    return scores


def cosine_length_reward(
    completions: list,
    answer: list[str | None],
    completion_ids: list[list[int]] | None = None,
    max_len: int = 1000,
    min_value_correct: float = 0.5,
    max_value_correct: float = 1.0,
    min_value_wrong: float = -1.0,
    max_value_wrong: float = -0.5,
    verifier: str = "math",
    reward: list[str | None] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    r"""Cosine-scaled correctness: shorter is better when right, longer is less bad when wrong.

    >>> cosine_length_reward(["\\boxed{4}", "\\boxed{4}", "\\boxed{5}", "\\boxed{5}"], answer=["4"] * 4,
    ...                      completion_ids=[[], [7] * 10, [], [7] * 10], max_len=10)
    [1.0, 0.5, -1.0, -0.5]
    """
    if max_len <= 0:
        raise ValueError(f"cosine_length_reward: max_len must be positive, got {max_len}")
    verifiers = ("math", "exact_match")
    if verifier not in verifiers:
        raise ValueError(f"cosine_length_reward: verifier must be one of {sorted(verifiers)}, got {verifier!r}")
    columns = {k: v for k, v in kwargs.items() if k not in ("log_extra", "log_metric")}
    correct = verifier_reward(
        completions,
        reward=reward,
        default_verifier=f"{verifier}_reward",
        answer=answer,
        completion_ids=completion_ids,
        **columns,
    )
    lengths = _lengths(completions, completion_ids)
    scores: list[float | None] = []
    for ok, length in zip(correct, lengths):
        if ok is None:
            scores.append(None)
            continue
        # progress 0 -> cos 1 (the "short" end), progress 1 -> cos -1 (the "long" end)
        cosine = math.cos(min(length / max_len, 1.0) * math.pi)
        lo, hi = (min_value_correct, max_value_correct) if ok else (max_value_wrong, min_value_wrong)
        scores.append(round(lo + 0.5 * (hi - lo) * (1.0 + cosine), 6))
    return scores
