"""Parity with TRL's own reward functions (``trl.rewards``) where the semantics agree, so that a recipe moving
from TRL keeps its scores: accuracy (math-verify), reasoning accuracy, think format, DAPO's soft overlong
punishment, the cosine-scaled length reward and the n-gram repetition penalty.

Where we deliberately differ (each a reward hack TRL's versions pay for, see tests/test_red_team.py): an
arithmetic expression for a number (``\\boxed{3 + 4}`` for 7), an empty think block, a think block without
a boxed answer after it, a stray ``</think>`` after the answer. TRL's accuracy reward also cannot read a plain
LaTeX or comma-list gold (``\\sqrt{2}``, ``3, 3, 7, 9``) and skips or fails those rows; ours scores them.
"""

from __future__ import annotations

import pytest
from trl.rewards import (
    accuracy_reward,
    get_cosine_scaled_reward,
    get_repetition_penalty_reward,
    get_soft_overlong_punishment,
    reasoning_accuracy_reward,
)
from trl.rewards import think_format_reward as trl_think_format_reward

from rewards import (
    cosine_length_reward,
    math_reward,
    repetition_penalty_reward,
    soft_overlong_reward,
    think_format_reward,
)


def _conv(texts: list[str]) -> list[list[dict]]:
    return [[{"role": "assistant", "content": t}] for t in texts]


ACCURACY = [  # (completion, gold): TRL's accuracy_reward and our math_reward give the same score
    ("\\boxed{\\frac{1}{3}}", "\\frac{1}{3}"),
    ("\\boxed{\\frac{1}{2}}", "\\frac{1}{3}"),
    ("The answer is \\boxed{42}.", "42"),
    ("\\boxed{0.75}", "\\frac{3}{4}"),
    ("\\boxed{\\frac{3}{4}}", "0.75"),
    ("\\boxed{-0.5}", "-\\frac{1}{2}"),
    ("\\boxed{41}", "42"),
    ("The final answer is \\boxed{-3}", "-3"),
    ("\\boxed{50\\%}", "0.5"),
    ("\\boxed{42 \\text{ cm}}", "42"),
    ("\\boxed{1000}", "1,000"),
    ("$x = 5$ so \\boxed{5}", "5"),
    ("The answer is $\\frac{7}{2}$", "3.5"),
    ("no answer here", "42"),
    ("anything", "}{"),  # an unparseable gold: both abstain (None)
]


@pytest.mark.filterwarnings("ignore:math_reward cannot parse the gold answer")
def test_accuracy_matches_trl():
    completions, golds = zip(*ACCURACY)
    ours = math_reward(list(completions), answer=list(golds))
    assert ours == accuracy_reward(_conv(list(completions)), list(golds))
    assert ours.count(1.0) >= 8 and ours.count(0.0) >= 3 and None in ours  # both sides of the parity are tested


def test_reasoning_accuracy_matches_trl():
    completions = [
        "<think>\nmaybe \\boxed{3}\n</think>\nThe answer is \\boxed{4}.",
        "<think>\nsurely \\boxed{4}",  # never closed: no answer
        "<think>\nx\n</think>\n\\boxed{3}",
    ]
    golds = ["4"] * 3
    assert math_reward(completions, answer=golds) == reasoning_accuracy_reward(_conv(completions), golds) == [
        1.0, 0.0, 0.0]  # fmt: skip


def test_think_format_matches_trl():
    completions = [
        "<think>\nreason\n</think>\nThe answer is \\boxed{4}.",
        "no tags \\boxed{4}",
        "<think>a</think><think>b</think>\\boxed{4}",
        "<think>unclosed \\boxed{4}",
        "preamble <think>a</think>\\boxed{4}",
    ]
    assert think_format_reward(completions) == trl_think_format_reward(_conv(completions)) == [1.0, 0.0, 0.0, 0.0, 0.0]


@pytest.mark.parametrize(("max_len", "cache"), [(100, 20), (16, 4), (10, 0), (8, 8)])
def test_soft_overlong_matches_trl(max_len, cache):
    ids = [[1] * n for n in range(0, max_len + 6)]
    ours = soft_overlong_reward(["x"] * len(ids), completion_ids=ids, max_completion_len=max_len,
                                soft_punish_cache=cache)  # fmt: skip
    assert ours == get_soft_overlong_punishment(max_len, cache)(ids)


def test_cosine_length_matches_trl():
    completions = ["\\boxed{\\frac{1}{3}}", "\\boxed{\\frac{1}{2}}"] * 4
    ids = [[1] * n for n in (0, 0, 25, 25, 50, 50, 140, 140)]
    golds = ["\\frac{1}{3}"] * len(completions)
    trl = get_cosine_scaled_reward(max_len=100)(_conv(completions), golds, ids)
    ours = cosine_length_reward(completions, answer=golds, completion_ids=ids, max_len=100)
    assert ours == pytest.approx(trl, abs=1e-6)


@pytest.mark.parametrize("ngram_size", [1, 2, 3])
def test_repetition_penalty_matches_trl_on_one_token_words(ngram_size):
    texts = ["the cat sat on the mat", "go go go go go go", "a b a b a b c", "short", "x y z"]
    vocab: dict[str, int] = {}
    ids = [[vocab.setdefault(w, len(vocab)) for w in t.split()] for t in texts]
    trl = get_repetition_penalty_reward(ngram_size=ngram_size, max_penalty=-1.0)(ids)
    assert repetition_penalty_reward(texts, ngram_size=ngram_size) == pytest.approx(trl, abs=1e-6)
