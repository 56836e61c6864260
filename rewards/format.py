r"""Format rewards: is the completion shaped the way our chat format asks?

Our assistant targets are ``<think>\n{reasoning}\n</think>\nThe answer is \boxed{answer}.`` in think mode
and ``The answer is \boxed{answer}.`` in no_think mode (see data_gen/tasks.py). ``think_format_reward``
checks the first shape, ``answer_format_reward`` only that a non-empty ``\boxed{}`` answer is given (after
the reasoning, if any). Both return 1.0 / 0.0. Small weights on them help a cold policy find the format
without swamping the correctness reward.

Run the examples: ``python -m pytest --doctest-modules rewards/format.py``.
"""

from __future__ import annotations

import re
from typing import Any

from rewards.match import completion_text, last_boxed, strip_think

# One think block at the very start, non-empty reasoning, then an answer part.
_THINK = re.compile(r"\A\s*<think>(?P<think>.*?)</think>(?P<answer>.*)\Z", re.DOTALL)


def think_format_reward(completions: list, think_in_prompt: bool = False, **kwargs: Any) -> list[float]:
    r"""1.0 for ``<think>reasoning</think>`` followed by an answer with ``\boxed{...}``, else 0.0.

    The reasoning must be non-empty and there must be exactly one think block. Set ``think_in_prompt=True``
    when the generation prompt already ends with ``<think>`` (the completion then starts inside it).

    >>> think_format_reward([
    ...     "<think>\n2+2 is 4\n</think>\nThe answer is \\boxed{4}.",
    ...     "<think>\n\n</think>\nThe answer is \\boxed{4}.",
    ...     "<think>\nhmm\n</think>\nThe answer is 4.",
    ...     "The answer is \\boxed{4}.",
    ...     "<think>a</think><think>b</think>\\boxed{4}",
    ... ])
    [1.0, 0.0, 0.0, 0.0, 0.0]
    >>> think_format_reward(["2+2 is 4\n</think>\n\\boxed{4}"], think_in_prompt=True)
    [1.0]
    """
    scores = []
    for completion in completions:
        text = completion_text(completion)
        if think_in_prompt and not text.lstrip().startswith("<think>"):
            text = "<think>" + text
        m = _THINK.match(text)
        ok = (
            m is not None
            and m.group("think").strip() != ""
            and "<think>" not in m.group("think")
            and "<think>" not in m.group("answer")
            and "</think>" not in m.group("answer")
            and bool((last_boxed(m.group("answer")) or "").strip())
        )
        scores.append(1.0 if ok else 0.0)
    return scores


def answer_format_reward(completions: list, **kwargs: Any) -> list[float]:
    r"""1.0 when the completion gives a non-empty ``\boxed{...}`` answer outside its reasoning, else 0.0.

    >>> answer_format_reward(["The answer is \\boxed{4}.", "\\boxed{}", "<think>\\boxed{4}</think> 4", "4"])
    [1.0, 0.0, 0.0, 0.0]
    """
    return [1.0 if (last_boxed(strip_think(completion_text(c))) or "").strip() else 0.0 for c in completions]
