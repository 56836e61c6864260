r"""Format rewards: is the completion shaped the way our chat format asks?

Our assistant targets are ``<think>\n{reasoning}\n</think>\nThe answer is \boxed{answer}.`` in think mode
and ``The answer is \boxed{answer}.`` in no_think mode (see data_gen/tasks.py). ``think_format_reward``
checks the first shape, ``answer_format_reward`` only that one final ``\boxed{}`` answer is given (after the
reasoning, if any; ``rewards.extract.final_answer``), and ``mode_format_reward`` the shape each row's ASKED mode
wants (hybrid-reasoning RL: think rows need reasoning with real content, no_think rows none). All return 1.0 / 0.0.
Small weights on them help a cold policy find the format without swamping the correctness reward.

Each form is an allow-list, what the reply may be, never a list of spellings to refuse:

- **an answer** (``boxed_answer``): one final box that holds an answer (``rewards.visible.box_holds_answer``: a
  digit, a letter, a value, relation or operation command, a math symbol; not ``\boxed{\,}``, ``\boxed{?}``,
  ``\boxed{\ldots}``, ``\boxed{\text{N/A}}``), short enough to be compared;
- **think**: one ``<think>`` block opening the completion whose reasoning shows words (``rewards.markup.prose_words``:
  invisible characters, tags and LaTeX command names are no words), no think tag after it, then an answer;
- **no_think** (``no_think_format``): an answer and at most ``MAX_NO_THINK_WORDS`` words around it, where nothing
  but formatting markup holds a word outside the answer's wrapper (``rewards.markup.reply_shape``: a block under
  any tag name or bracket shape, a self-closing tag, a fence, a comment or an environment that holds a word is
  reasoning, whatever it is called); an empty think block may open it.

Run the examples: ``python -m pytest --doctest-modules rewards/format.py``.
"""

from __future__ import annotations

import re
from typing import Any

from rewards.extract import MAX_ANSWER_CHARS, completion_text, final_answer, strip_think
from rewards.length import prompt_mode
from rewards.markup import ANSWER_MARK, prose_words, reply_shape, shown_words
from rewards.verifier import verifier_reward
from rewards.visible import (  # noqa: F401  (DEFAULT_IGNORABLE, is_ignorable, box_is_visible: re-exported)
    DEFAULT_IGNORABLE,
    box_holds_answer,
    box_is_visible,
    box_prose,
    has_visible,
    is_ignorable,
    reasoning_words,
    visible_text,
)

# One think block at the very start, then an answer part.
_THINK = re.compile(r"\A\s*<think>(?P<think>.*?)</think>(?P<answer>.*)\Z", re.DOTALL)
# The no_think form's budget of words outside the answer: the longest standard closing line we know, Minerva's
# "Final Answer: The final answer is $X$. I hope it is correct." (11 words; our gold "The answer is \boxed{X}." has
# 3), rounded up. A sentence of justification fits ("5 + 4 = 9, so the answer is \boxed{9}." is 7); a derivation
# does not.
MAX_NO_THINK_WORDS = 12
# A no_think reply longer than this is no direct answer, whatever it holds: the longest answer that is compared
# (``MAX_ANSWER_CHARS``, 1,000) and the word budget with its markup fit with room to spare. It bounds what is read.
MAX_NO_THINK_CHARS = 4096
# More boxes than this in an answer part is no one final answer (it bounds what the answer's extractor reads).
MAX_ANSWER_BOXES = 16
_BOX_OR_BRACE = re.compile(r"\\boxed\s*\{|[{}]")


def boxed_answer(text: str) -> str | None:
    r"""The one final boxed answer (``rewards.extract.final_answer``) when it holds an answer (``box_holds_answer``:
    not ``\boxed{\,}``, ``\boxed{?}`` or ``\boxed{\ldots}``) and is short enough to be compared
    (``MAX_ANSWER_CHARS``), else None. An answer part with more than ``MAX_ANSWER_BOXES`` boxes, or with a box
    longer than ``MAX_ANSWER_CHARS``, has none (both bound what the extractor reads).

    >>> boxed_answer("The answer is \\boxed{4}."), boxed_answer("\\boxed{\\,}"), boxed_answer("\\boxed{\\text{?}}")
    ('4', None, None)
    """
    part = strip_think(text)
    boxes = part.count("\\boxed")
    if boxes == 0 or boxes > MAX_ANSWER_BOXES:  # no box, or too many to be one answer: nothing to read
        return None
    if any(b - a > MAX_ANSWER_CHARS + len("\\boxed{}") for a, b in answer_boxes(part)):
        return None  # a box too long to be compared is no answer, and no other box can be the one answer
    answer = final_answer(text)
    return answer if answer is not None and len(answer) <= MAX_ANSWER_CHARS and box_holds_answer(answer) else None


def answer_boxes(text: str) -> list[tuple[int, int]]:
    r"""The spans of the outermost complete ``\boxed{...}`` of ``text`` (nested boxes are inside them), in order; one
    scan over the braces.

    >>> answer_boxes("so \\boxed{\\boxed{1}} and \\boxed{2} \\boxed{")
    [(3, 20), (25, 34)]
    """
    spans: list[tuple[int, int]] = []
    depth, start, opened_at = 0, -1, 0
    first = text.find("\\boxed")
    if first < 0:
        return spans
    for m in _BOX_OR_BRACE.finditer(text, first):
        if m.group() == "}":
            depth = max(0, depth - 1)
            if start >= 0 and depth == opened_at:
                spans.append((start, m.end()))
                start = -1
            continue
        if start < 0 and m.group() != "{":
            start, opened_at = m.start(), depth
        depth += 1
    return spans


def _masked_reply(rest: str) -> tuple[str, int]:
    """``rest`` in visible form with every outermost box masked (``ANSWER_MARK``), and the words of the boxes'
    text-mode prose (``box_prose``)."""
    visible = visible_text(rest)
    pieces, box_words, pos = [], 0, 0
    for a, b in answer_boxes(visible):
        pieces += [visible[pos:a], ANSWER_MARK]
        content = visible[a:b]
        box_words += prose_words(box_prose(content[content.index("{") + 1 : -1]))
        pos = b
    pieces.append(visible[pos:])
    return "".join(pieces), box_words


def _think_parts(text: str, think_in_prompt: bool) -> tuple[str, str] | None:
    """(reasoning, answer part) of a completion in the think form: one think block opening it, no think tag after it,
    one boxed answer after it; else None."""
    if think_in_prompt and not text.lstrip().startswith("<think>"):
        text = "<think>" + text
    m = _THINK.match(text)
    if m is None:
        return None
    think, answer = m.group("think"), m.group("answer")
    if "<think>" in think or "<think>" in answer or "</think>" in answer or boxed_answer(answer) is None:
        return None
    return think, answer


def think_format_reward(completions: list, think_in_prompt: bool = False, **kwargs: Any) -> list[float]:
    r"""1.0 for ``<think>reasoning</think>`` followed by an answer with ``\boxed{...}``, else 0.0.

    The reasoning must hold at least one word (``rewards.markup.prose_words``: markup is no word, so
    ``<think><b></b></think>`` holds none) and there must be exactly one think block. Set ``think_in_prompt=True``
    when the generation prompt already ends with ``<think>`` (the completion then starts inside it).

    >>> think_format_reward([
    ...     "<think>\n2+2 is 4\n</think>\nThe answer is \\boxed{4}.",
    ...     "<think>\n\n</think>\nThe answer is \\boxed{4}.",
    ...     "<think>\nhmm\n</think>\nThe answer is 4.",
    ...     "The answer is \\boxed{4}.",
    ...     "<think>a</think><think>b</think>\\boxed{4}",
    ...     "<think><b></b><i></i></think>\\boxed{4}",
    ... ])
    [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    >>> think_format_reward(["2+2 is 4\n</think>\n\\boxed{4}"], think_in_prompt=True)
    [1.0]
    """
    scores = []
    for completion in completions:
        parts = _think_parts(completion_text(completion), think_in_prompt)
        scores.append(1.0 if parts is not None and prose_words(parts[0]) >= 1 else 0.0)
    return scores


def answer_format_reward(completions: list, **kwargs: Any) -> list[float]:
    r"""1.0 when the completion gives one ``\boxed{...}`` that holds an answer (``boxed_answer``) outside its
    reasoning, else 0.0.

    >>> answer_format_reward(["The answer is \\boxed{4}.", "\\boxed{}", "<think>\\boxed{4}</think> 4", "4",
    ...                       "\\boxed{3} \\boxed{4}", "\\boxed{\\ldots}"])
    [1.0, 0.0, 0.0, 0.0, 0.0, 0.0]
    """
    return [1.0 if boxed_answer(completion_text(c)) is not None else 0.0 for c in completions]


def mode_format_reward(
    completions: list,
    mode: list[str | None] | None = None,
    prompts: list | None = None,
    min_think_words: int = 3,
    think_in_prompt: bool = False,
    answer_text: list[str] | None = None,
    max_no_think_words: int = MAX_NO_THINK_WORDS,
    **kwargs: Any,
) -> list[float | None]:
    r"""1.0 when a completion has the shape its asked reasoning mode wants, else 0.0 (hybrid-reasoning RL):

    - think: one ``<think>`` block opening the completion with at least ``min_think_words`` words of reasoning
      (``rewards.markup.prose_words``: tags and LaTeX command names are no words), then one boxed answer
      (``think_format_reward``'s other rules). The default, 3, is the shortest gold trace of our task families
      (arithmetic: ``9 - 7 = 2``); set it to the shortest gold trace of the families trained (the counting families'
      hold 9 words or more; a floor of 8 on all seven scored arithmetic's and word_problem's gold form 0:
      docs/research/ablations/smol135m_grpo_words);
    - no_think: the no_think form (``no_think_format``): the answer and at most ``max_no_think_words`` words
      around it, no reasoning hidden in markup of any shape.

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
    if max_no_think_words < 0:
        raise ValueError(f"mode_format_reward: max_no_think_words must be >= 0, got {max_no_think_words}")
    if mode is not None and len(mode) != len(completions):
        raise ValueError(f"the mode column has {len(mode)} rows but there are {len(completions)} completions")
    if answer_text is not None and len(answer_text) != len(completions):
        raise ValueError(
            f"the answer_text column has {len(answer_text)} rows but there are {len(completions)} completions"
        )
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
            parts = _think_parts(text, think_in_prompt)
            scores.append(1.0 if parts is not None and prose_words(parts[0]) >= min_think_words else 0.0)
        else:
            scores.append(1.0 if no_think_format(text, max_no_think_words) else 0.0)
    return scores


def no_think_format(text: str, max_words: int = MAX_NO_THINK_WORDS) -> bool:
    r"""The no_think form, an allow-list: an optional empty think block (some templates open a no_think answer with
    one), then a reply of at most ``MAX_NO_THINK_CHARS`` characters that is one boxed answer (``boxed_answer``) and
    at most ``max_words`` words outside it (``MAX_NO_THINK_WORDS``; the words of the box's text-mode prose count
    too), where no markup other than formatting hides a word (``rewards.markup.reply_shape``: a block under any tag
    name and in any bracket shape, a fence, a comment, an environment, a structural tag's attributes) unless it
    wraps the answer. The one rule for the rewards (``mode_format_reward``) and the evaluations' format share
    (``align.eval.generative.is_formatted``).

    >>> [no_think_format(t) for t in ("The answer is \\boxed{9}.", "<think>\n\n</think>\nThe answer is \\boxed{9}.",
    ...  "<think>\n5 + 4 = 9\n</think>\n\\boxed{9}", "<no_think>\n5 + 4 = 9\n</no_think>\nThe answer is \\boxed{9}.",
    ...  "Since 3 < 5 > 1, the answer is \\boxed{3}.", "The answer is 9.", "The answer is <b>\\boxed{9}</b>.",
    ...  "<reasoning mode=\"x\">5 + 4 = 9</reasoning> \\boxed{9}", "[think]5 + 4 = 9[/think] \\boxed{9}",
    ...  "First add 5 and 4: that gives 9. Then check 9 - 4 = 5, which holds, so the answer is \\boxed{9}.")]
    [True, True, False, False, True, False, True, False, False, False]
    """
    m = _THINK.match(text)
    if m is not None and has_visible(m.group("think")):
        return False
    rest = text if m is None else m.group("answer")
    if len(rest) > MAX_NO_THINK_CHARS or "<think>" in rest or "</think>" in rest or boxed_answer(rest) is None:
        return False
    masked, box_words = _masked_reply(rest)
    if shown_words(masked) + box_words > max_words:  # over budget before any markup is read
        return False
    shape = reply_shape(masked)
    return not shape.hidden and shape.words + box_words <= max_words


def mode_math_reward(
    completions: list,
    answer: list[str | None],
    mode: list[str | None] | None = None,
    prompts: list | None = None,
    min_think_words: int = 3,
    think_in_prompt: bool = False,
    answer_text: list[str] | None = None,
    **kwargs: Any,
) -> list[float | None]:
    r"""The row's verifier (``verifier_reward``: its ``reward`` column, else ``math_reward``) paid only when the
    completion has its asked mode's form (``mode_format_reward`` is 1); a row without a mode is paid the verifier
    alone, a row the verifier abstains on (no gold answer) abstains (None).

    The product, not the sum: with ``math_reward + w * mode_format_reward`` a well-formed wrong answer earns ``w``
    on every prompt, more than a right answer that ran out of budget or a half-done tool chain. Tool GRPO on the
    135M model found that: in think mode the policy stopped the two-search chain after one search and answered at
    once, well-formed and wrong (docs/research/smol135m/tools.md). Here only a right answer in form pays, so the form
    is kept without a reward for giving up.

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
    right = verifier_reward(completions, answer=answer, prompts=prompts, **kwargs)  # prompts: units of the question
    form = mode_format_reward(
        completions,
        mode=mode,
        prompts=prompts,
        min_think_words=min_think_words,
        think_in_prompt=think_in_prompt,
        answer_text=answer_text,
    )
    return [None if r is None else r * (1.0 if f is None else f) for r, f in zip(right, form)]
