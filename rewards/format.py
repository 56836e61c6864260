r"""Format rewards: is the completion shaped the way our chat format asks?

Our assistant targets are ``<think>\n{reasoning}\n</think>\nThe answer is \boxed{answer}.`` in think mode
and ``The answer is \boxed{answer}.`` in no_think mode (see data_gen/tasks.py). ``think_format_reward``
checks the first shape, ``answer_format_reward`` only that one final ``\boxed{}`` answer is given (after the
reasoning, if any; ``rewards.extract.final_answer``), and ``mode_format_reward`` the shape each row's ASKED mode
wants (hybrid-reasoning RL: think rows need reasoning with real content, no_think rows none). All return 1.0 / 0.0. Small weights on them help a cold
policy find the format without swamping the correctness reward.

What they refuse (each a way to collect format credit without the format): an empty think block, or one
holding no word at all (``<think>...</think>``, zero-width spaces, Hangul fillers); a second think block or stray
tags after it; a think block that does not open the completion (tags inside a code block or after a preamble); no
boxed answer, an empty-looking one (``\boxed{\,}``, ``\boxed{\phantom{3}}``), or several different ones.

What is visible is decided in ``rewards.visible`` (shared with ``final_answer`` and the repetition
penalty): invisible characters are not read, a word needs a letter or digit with ink (``reasoning_words``), and a
box holds an answer only if something in it prints (``box_is_visible``).

Run the examples: ``python -m pytest --doctest-modules rewards/format.py``.
"""

from __future__ import annotations

import re
from typing import Any

from rewards.extract import completion_text, final_answer
from rewards.length import prompt_mode
from rewards.verifier import verifier_reward
from rewards.visible import (  # noqa: F401  (DEFAULT_IGNORABLE, is_ignorable, visible_text: re-exported)
    DEFAULT_IGNORABLE,
    box_is_visible,
    has_visible,
    is_ignorable,
    reasoning_words,
    visible_text,
)

# One think block at the very start, non-empty reasoning, then an answer part.
_THINK = re.compile(r"\A\s*<think>(?P<think>.*?)</think>(?P<answer>.*)\Z", re.DOTALL)
# A block under any tag name (<no_think>...</no_think>, <reasoning>...</reasoning>): reasoning by another name.
_TAG_BLOCK = re.compile(r"<(?P<tag>[A-Za-z_][\w-]*)>.*?</(?P=tag)>", re.DOTALL)


def boxed_answer(text: str) -> str | None:
    r"""The one final boxed answer (``rewards.extract.final_answer``, which skips boxes that print nothing) when it
    is visible, else None (a box too long for ``final_answer`` to check is checked here).

    >>> boxed_answer("The answer is \\boxed{4}."), boxed_answer("\\boxed{\\,}"), boxed_answer("4")
    ('4', None, None)
    """
    answer = final_answer(text)
    return answer if answer is not None and box_is_visible(answer) else None


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
            and reasoning_words(m.group("think")) >= 1
            and "<think>" not in m.group("think")
            and "<think>" not in m.group("answer")
            and "</think>" not in m.group("answer")
            and boxed_answer(m.group("answer")) is not None
        )
        scores.append(1.0 if ok else 0.0)
    return scores


def answer_format_reward(completions: list, **kwargs: Any) -> list[float]:
    r"""1.0 when the completion gives one non-empty ``\boxed{...}`` answer outside its reasoning, else 0.0.

    >>> answer_format_reward(["The answer is \\boxed{4}.", "\\boxed{}", "<think>\\boxed{4}</think> 4", "4",
    ...                       "\\boxed{3} \\boxed{4}"])
    [1.0, 0.0, 0.0, 0.0, 0.0]
    """
    return [1.0 if boxed_answer(completion_text(c)) is not None else 0.0 for c in completions]


def mode_format_reward(completions: list, mode: list[str | None] | None = None, prompts: list | None = None,
                       min_think_words: int = 3, think_in_prompt: bool = False,
                       answer_text: list[str] | None = None, **kwargs: Any) -> list[float | None]:
    r"""1.0 when a completion has the shape its asked reasoning mode wants, else 0.0 (hybrid-reasoning RL):

    - think: one ``<think>`` block opening the completion with at least ``min_think_words`` words of reasoning
      (``reasoning_words``), then one boxed answer (``think_format_reward``'s other rules). The default, 3, is the
      shortest gold trace of our task families (arithmetic: ``9 - 7 = 2``); set it to the shortest gold trace of the
      families trained (the counting families' hold 9 words or more; a floor of 8 on all seven scored arithmetic's
      and word_problem's gold form 0: docs/ablations/smol135m_grpo_words);
    - no_think: no reasoning (no think block, or an empty one as some templates open a no_think answer with), then
      one boxed answer.

    With tools (``answer_text``, the column a tool rollout hands the rewards: each trajectory's last turn), the
    answer turn is judged instead of the joined turns: in think mode each turn opens its own think block, so the joined
    turns never have the one-block form, and a policy that drops the block from its answer turn is caught.

    The mode is what was asked, never what was answered: the ``mode`` column, else the prompt's ``/think`` or
    ``/no_think`` flag; a row with neither abstains (None). Without it a mixed-mode GRPO run pays a think prompt
    answered without reasoning like a no_think one, and dropping the think block becomes the cheapest way to the
    reward under a length penalty.

    >>> think = "<think>\nThere are 3 r's in the word, I counted each one.\n</think>\nThe answer is \\boxed{3}."
    >>> mode_format_reward([think, "The answer is \\boxed{3}.", "<think>\ncount\n</think>\n\\boxed{3}"],
    ...                    mode=["think", "think", "think"])
    [1.0, 0.0, 0.0]
    >>> mode_format_reward([think, "The answer is \\boxed{3}.", "<think>\n\n</think>\n\\boxed{3}", "\\boxed{3}"],
    ...                    mode=["no_think", "no_think", "no_think", None])
    [0.0, 1.0, 1.0, None]
    >>> call = '<think>\nI will look both up first.\n</think>\n<tool_call>{"name": "search"}</tool_call>'
    >>> mode_format_reward([call + "\n" + think, call + "\nThe answer is \\boxed{3}."], mode=["think", "think"],
    ...                    answer_text=[think, "The answer is \\boxed{3}."])
    [1.0, 0.0]
    """
    if min_think_words < 1:
        raise ValueError(f"mode_format_reward: min_think_words must be >= 1, got {min_think_words}")
    if mode is not None and len(mode) != len(completions):
        raise ValueError(f"the mode column has {len(mode)} rows but there are {len(completions)} completions")
    if answer_text is not None and len(answer_text) != len(completions):
        raise ValueError(f"the answer_text column has {len(answer_text)} rows but there are {len(completions)} "
                         "completions")
    scores: list[float | None] = []
    for i, completion in enumerate(completions):
        asked = mode[i] if mode is not None else None
        if asked is None and prompts is not None and i < len(prompts):
            asked = prompt_mode(prompts[i])
        if asked not in (None, "think", "no_think"):
            raise ValueError(f"mode_format_reward: mode must be 'think' or 'no_think', got {asked!r} at row {i}")
        text = answer_text[i] if answer_text is not None else completion_text(completion)
        if asked is None:
            scores.append(None)
        elif asked == "think":
            if think_in_prompt and not text.lstrip().startswith("<think>"):
                text = "<think>" + text
            m = _THINK.match(text)
            ok = (think_format_reward([text])[0] == 1.0 and m is not None
                  and reasoning_words(m.group("think")) >= min_think_words)
            scores.append(1.0 if ok else 0.0)
        else:
            scores.append(1.0 if no_think_format(text) else 0.0)
    return scores


def no_think_format(text: str) -> bool:
    r"""The no_think shape: no reasoning block (none, or an empty think block as some templates open a no_think answer
    with), no block under another tag name either (``<no_think>5 + 4 = 9</no_think>``: a think block renamed; the
    135M chain's two-round APO learned it for 516 of 1,024 held-out no_think prompts, docs/smol135m/report.md), then
    one visible boxed answer. The one rule for the rewards (``mode_format_reward``) and the evaluations'
    format share (``align.eval.generative.is_formatted``).

    >>> [no_think_format(t) for t in ("The answer is \\boxed{9}.", "<think>\n\n</think>\nThe answer is \\boxed{9}.",
    ...  "<think>\n5 + 4 = 9\n</think>\n\\boxed{9}", "<no_think>\n5 + 4 = 9\n</no_think>\nThe answer is \\boxed{9}.",
    ...  "Since 3 < 5 > 1, the answer is \\boxed{3}.", "The answer is 9.")]
    [True, True, False, False, True, False]
    """
    m = _THINK.match(text)
    rest = text if m is None else m.group("answer")
    empty = m is None or not has_visible(m.group("think"))
    return (empty and "<think>" not in rest and "</think>" not in rest and _TAG_BLOCK.search(rest) is None
            and boxed_answer(rest) is not None)


def mode_math_reward(completions: list, answer: list[str | None], mode: list[str | None] | None = None,
                     prompts: list | None = None, min_think_words: int = 3, think_in_prompt: bool = False,
                     answer_text: list[str] | None = None, **kwargs: Any) -> list[float | None]:
    r"""The row's verifier (``verifier_reward``: its ``reward`` column, else ``math_reward``) paid only when the
    completion has its asked mode's form (``mode_format_reward`` is 1); a row without a mode is paid the verifier
    alone, a row the verifier abstains on (no gold answer) abstains (None).

    The product, not the sum: with ``math_reward + w * mode_format_reward`` a well-formed wrong answer earns ``w``
    on every prompt, more than a right answer that ran out of budget or a half-done tool chain. Tool GRPO on the
    135M model found that: in think mode the policy stopped the two-search chain after one search and answered at
    once, well-formed and wrong (docs/smol135m/tools.md). Here only a right answer in form pays, so the form is kept
    without a reward for giving up.

    >>> think = "<think>\nI add the two numbers here.\n</think>\nThe answer is \\boxed{4}."
    >>> mode_math_reward([think, "The answer is \\boxed{4}.", think.replace("{4}", "{5}"), think],
    ...                  answer=["4", "4", "4", None], mode=["think"] * 4)
    [1.0, 0.0, 0.0, None]
    >>> mode_math_reward(["The answer is \\boxed{4}.", think], answer=["4", "4"], mode=["no_think", None])
    [1.0, 1.0]
    >>> mode_math_reward(["The answer is \\boxed{3.0}."] * 2, answer=["3", "3"], mode=["no_think"] * 2,
    ...                  reward=["math_reward", "exact_match_reward"])
    [1.0, 0.0]
    """
    right = verifier_reward(completions, answer=answer, **kwargs)
    form = mode_format_reward(completions, mode=mode, prompts=prompts, min_think_words=min_think_words,
                              think_in_prompt=think_in_prompt, answer_text=answer_text)
    return [None if r is None else r * (1.0 if f is None else f) for r, f in zip(right, form)]
