r"""Exact-match verification of a final boxed answer.

Task families whose answers are not mathematical expressions (sorted lists, words, yes/no) are checked by
``exact_match_reward``: the completion must give a box, and every answer candidate of its answer part
(``rewards.answer.judge`` with ``exact=True``: every box spelling and answer phrase, as for ``math_reward``; an
answer only inside ``<think>`` does not count) must equal the gold ``answer`` after normalising whitespace, case,
a trailing period and ``$...$`` / ``\text{...}`` wrappers. Comma-separated lists are compared element by element,
in order; a gold in set braces (``\{a, b\}``) as a set; a lettered-choice gold by its letter. Numbers are compared
as text (``3.0`` is not ``3``: use ``math_reward`` for that).

The text helpers every reward shares (``completion_text``, ``strip_think``, ``last_boxed``, ...) live in
``rewards.extract`` and are importable from here too.

Run the examples: ``python -m pytest --doctest-modules rewards/match.py``.
"""

from __future__ import annotations

from typing import Any

from rewards.answer import (  # noqa: F401  (re-exported: the other reward modules import them from here)
    all_boxed,
    answer_matches,
    completion_text,
    final_answer,
    judge,
    last_boxed,
    normalize_answer,
    prompt_text,
    strip_think,
)


def answers_match(predicted: str, gold: str) -> bool:
    r"""True when two answers are equal after normalisation; comma lists are compared element-wise, in order.

    >>> answers_match("2,5, 9", "2, 5, 9"), answers_match("9, 5, 2", "2, 5, 9")
    (True, False)
    """
    return bool(answer_matches(predicted, gold, exact=True))


def exact_match_reward(
    completions: list, answer: list[str | None], prompts: list | None = None, **kwargs: Any
) -> list[float | None]:
    r"""1.0 when the completion's boxed answer equals the gold ``answer`` after normalisation, else 0.0;
    None (abstain) for a row without a gold answer.

    >>> exact_match_reward(
    ...     ["The answer is \\boxed{2, 5, 9}.", "\\boxed{9, 5, 2}", "no box", "\\boxed{YES}.",
    ...      "\\boxed{2} \\boxed{yes}"],
    ...     answer=["2, 5, 9", "2, 5, 9", "2, 5, 9", "yes", "yes"])
    [1.0, 0.0, 0.0, 1.0, 0.0]
    """
    scores: list[float | None] = []
    for i, (completion, gold) in enumerate(zip(completions, answer, strict=True)):
        if gold is None or str(gold).strip() == "":
            scores.append(None)
            continue
        prompt = prompt_text(prompts[i]) if prompts is not None and i < len(prompts) else None
        right = judge(completion_text(completion), str(gold), prompt=prompt, exact=True, need_box=True)
        scores.append(1.0 if right else 0.0)
    return scores
