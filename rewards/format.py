r"""Format rewards: is the completion shaped the way our chat format asks?

Our assistant targets are ``<think>\n{reasoning}\n</think>\nThe answer is \boxed{answer}.`` in think mode
and ``The answer is \boxed{answer}.`` in no_think mode (see data_gen/tasks.py). ``think_format_reward``
checks the first shape, ``answer_format_reward`` only that one final ``\boxed{}`` answer is given (after the
reasoning, if any; ``rewards.answer.final_answer``). Both return 1.0 / 0.0. Small weights on them help a cold
policy find the format without swamping the correctness reward.

What they refuse (each a way to collect format credit without the format): an empty think block, or one
holding no word at all (``<think>...</think>``, zero-width spaces); a second think block or stray tags after
it; a think block that does not open the completion (tags inside a code block or after a preamble); no
boxed answer, an empty one, or several different ones.

Run the examples: ``python -m pytest --doctest-modules rewards/format.py``.
"""

from __future__ import annotations

import re
from typing import Any

from rewards.answer import completion_text, final_answer

# One think block at the very start, non-empty reasoning, then an answer part.
_THINK = re.compile(r"\A\s*<think>(?P<think>.*?)</think>(?P<answer>.*)\Z", re.DOTALL)
_WORD = re.compile(r"[^\W_]")  # a letter or digit: reasoning that says something


def think_format_reward(completions: list, think_in_prompt: bool = False, **kwargs: Any) -> list[float]:
    r"""1.0 for ``<think>reasoning</think>`` followed by an answer with ``\boxed{...}``, else 0.0.

    The reasoning must hold at least one word and there must be exactly one think block. Set ``think_in_prompt=True``
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
            and _WORD.search(m.group("think")) is not None
            and "<think>" not in m.group("think")
            and "<think>" not in m.group("answer")
            and "</think>" not in m.group("answer")
            and final_answer(m.group("answer")) is not None
        )
        scores.append(1.0 if ok else 0.0)
    return scores


def answer_format_reward(completions: list, **kwargs: Any) -> list[float]:
    r"""1.0 when the completion gives one non-empty ``\boxed{...}`` answer outside its reasoning, else 0.0.

    >>> answer_format_reward(["The answer is \\boxed{4}.", "\\boxed{}", "<think>\\boxed{4}</think> 4", "4",
    ...                       "\\boxed{3} \\boxed{4}"])
    [1.0, 0.0, 0.0, 0.0, 0.0]
    """
    return [1.0 if final_answer(completion_text(c)) is not None else 0.0 for c in completions]
