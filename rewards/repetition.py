r"""N-gram repetition penalty: discourages the loops a policy falls into under RL.

``repetition_penalty_reward`` = ``max_penalty * (1 - distinct n-grams / all n-grams)`` over the
lower-cased words of each completion (runs of letters and digits: ``Go, go. GO!`` is one word three times,
so case and punctuation do not disguise a loop): 0.0 for text without a repeated n-gram, approaching
``max_penalty`` (negative) as the text becomes one phrase repeated (the scheme of open-r1 and
"Demystifying Long Chain-of-Thought Reasoning"). Text shorter than one n-gram scores 0.0.

Run the examples: ``python -m pytest --doctest-modules rewards/repetition.py``.
"""

from __future__ import annotations

import re
from typing import Any

from rewards.match import completion_text

_WORD = re.compile(r"[^\W_]+")


def repetition_penalty_reward(
    completions: list, ngram_size: int = 3, max_penalty: float = -1.0, **kwargs: Any
) -> list[float]:
    r"""0.0 for no repeated ``ngram_size``-grams, down to ``max_penalty`` for pure repetition.

    >>> repetition_penalty_reward(["the cat sat on the mat", "go go go go go go", "Go, go. GO! go go; go", "hi"],
    ...                           ngram_size=2)
    [0.0, -0.8, -0.8, 0.0]
    """
    if ngram_size < 1:
        raise ValueError(f"repetition_penalty_reward: ngram_size must be >= 1, got {ngram_size}")
    if max_penalty > 0:
        raise ValueError(f"repetition_penalty_reward: max_penalty must be <= 0 (it is a penalty), got {max_penalty}")
    scores = []
    for completion in completions:
        words = _WORD.findall(completion_text(completion).lower())
        if len(words) < ngram_size:
            scores.append(0.0)
            continue
        ngrams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
        scores.append(round((1 - len(set(ngrams)) / len(ngrams)) * max_penalty, 6) + 0.0)
    return scores
