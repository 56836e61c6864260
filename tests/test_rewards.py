"""Rewards: the registry and name resolution, validated scoring, and each verifier's table of cases."""

from __future__ import annotations

import asyncio
import doctest
import importlib
import inspect
import pickle
import sys
import threading
import time
from pathlib import Path

import pytest

import rewards
from rewards import (
    REWARDS,
    answer_format_reward,
    checked,
    completion_text,
    cosine_length_reward,
    exact_match_reward,
    get_reward,
    get_rewards,
    math_reward,
    repetition_penalty_reward,
    route_accuracy,
    score,
    soft_overlong_reward,
    think_format_reward,
    verifier_reward,
)
from rewards.answer import answer_kind, answer_matches, final_answer

FIXTURES = Path(__file__).parent / "fixtures"
MODULES = [
    "rewards.registry",
    "rewards.answer",
    "rewards.extract",
    "rewards.numbers",
    "rewards.latex",
    "rewards.units",
    "rewards.grammar",
    "rewards.match",
    "rewards.math",
    "rewards.code",
    "rewards.judge",
    "rewards.sandbox",
    "rewards.limits",
    "rewards.checks",
    "rewards.wire",
    "rewards.verifier",
    "rewards.format",
    "rewards.visible",
    "rewards.markup",
    "rewards.confusables",
    "rewards.length",
    "rewards.repetition",
    "rewards.tools",
]


@pytest.mark.parametrize("name", MODULES)
def test_doctests(name):
    result = doctest.testmod(importlib.import_module(name), optionflags=doctest.ELLIPSIS)
    assert result.attempted > 0, f"{name} has no >>> example"
    assert result.failed == 0


# ----------------------------------------------------------------------------------------------- registry


def test_registry_keys_are_function_names():
    assert set(REWARDS) == {
        "math_reward",
        "exact_match_reward",
        "code_reward",
        "think_format_reward",
        "answer_format_reward",
        "mode_format_reward",
        "mode_math_reward",
        "soft_overlong_reward",
        "cosine_length_reward",
        "repetition_penalty_reward",
        "verifier_reward",
        "tool_call_reward",
        "environment_reward",
    }
    for key, func in REWARDS.items():
        assert key == func.__name__ and key.endswith("_reward")


def test_every_reward_accepts_what_trl_passes():
    """TRL calls reward_func(prompts=, completions=, completion_ids=, **columns, trainer_state=, log_extra=, ...)."""
    trl_extras = {
        "prompts": ["q1", "q2"],
        "completion_ids": [[1, 2, 3], [4] * 50],
        "trainer_state": object(),
        "log_extra": lambda *a, **k: None,
        "log_metric": lambda *a, **k: None,
    }
    columns = {"answer": ["4", "5"], "tests": ["assert True", None], "entry_point": [None, None]}
    config = {"soft_overlong_reward": {"max_completion_len": 40, "soft_punish_cache": 10}}
    for name in REWARDS:
        func = get_reward(name, **config.get(name, {}))
        out = checked(func)(completions=["The answer is \\boxed{4}.", "\\boxed{4}"], **trl_extras, **columns)
        assert len(out) == 2, name
    assert get_reward("soft_overlong_reward", **config["soft_overlong_reward"])(
        completions=["a", "b"], **trl_extras
    ) == [0.0, -1.0]  # token lengths 3 and 50 were used, not words


def test_unknown_reward_lists_registered_and_suggests():
    with pytest.raises(ValueError) as e:
        get_reward("math_rewad")
    msg = str(e.value)
    assert "Did you mean 'math_reward'" in msg and "code_reward" in msg and "palindrome_reward" in msg


def test_bound_kwargs_keep_name_and_reject_typos():
    r = get_reward("repetition_penalty_reward", ngram_size=1)
    assert r.__name__ == "repetition_penalty_reward"
    assert r(["a a a a"]) == [-0.75]
    with pytest.raises(ValueError, match="has no argument 'ngram_sise'. Did you mean 'ngram_size'"):
        get_reward("repetition_penalty_reward", ngram_sise=2)


def test_bound_reward_pickles_by_name():
    r = get_reward("soft_overlong_reward", max_completion_len=4, soft_punish_cache=2)
    r2 = pickle.loads(pickle.dumps(r))
    assert r2.__name__ == "soft_overlong_reward" and r2(["a b c"]) == [-0.5]


# ----------------------------------------------------------------------------------------------- plug-ins


def test_outside_verifier_by_relative_file_path(monkeypatch):
    monkeypatch.chdir(FIXTURES.parent)
    r = get_reward("./fixtures/my_verifiers.py:palindrome_reward")
    assert r.__name__ == "palindrome_reward"
    assert r(["Never odd or even", "hello"]) == [1.0, 0.0]
    # file-path rewards pickle by their absolute path (TRL forwards rewards to spawned workers)
    assert pickle.loads(pickle.dumps(r))(["abba"]) == [1.0]


def test_outside_verifier_by_absolute_path_with_kwargs():
    r = get_reward(f"{FIXTURES / 'my_verifiers.py'}:palindrome_reward", min_length=5)
    assert r(["abba", "racecar"]) == [0.0, 1.0]
    with pytest.raises(ValueError, match="no function 'nope_reward'.*palindrome_reward"):
        get_reward(f"{FIXTURES / 'my_verifiers.py'}:nope_reward")
    with pytest.raises(FileNotFoundError, match="missing.py"):
        get_reward("./missing.py:palindrome_reward")


def test_outside_verifier_by_dotted_path(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    r = get_reward("my_verifiers:palindrome_reward")
    assert r([[{"role": "assistant", "content": "A man, a plan, a canal: Panama"}]]) == [1.0]
    with pytest.raises(ValueError, match="cannot import module 'my_lab.nowhere'"):
        get_reward("my_lab.nowhere:palindrome_reward")


def test_get_rewards_binds_per_reward_kwargs_and_weights(monkeypatch):
    monkeypatch.syspath_prepend(str(FIXTURES))
    funcs, weights = get_rewards(
        ["math_reward", "my_verifiers:palindrome_reward"],
        reward_kwargs={"palindrome_reward": {"min_length": 10}},
        weights=[1.0, 0.5],
    )
    assert [f.__name__ for f in funcs] == ["math_reward", "palindrome_reward"] and weights == [1.0, 0.5]
    assert funcs[1](["racecar"]) == [0.0]  # min_length=10 was bound
    with pytest.raises(ValueError, match=r"reward_kwargs names \['code_reward'\]"):
        get_rewards(["math_reward"], reward_kwargs={"code_reward": {}})
    with pytest.raises(ValueError, match="reward_weights has 1 entries but reward_funcs has 2"):
        get_rewards(["math_reward", "code_reward"], weights=[1.0])


# ----------------------------------------------------------------------------------------------- validation


def _raises_on_second(completions, **kw):
    if any("boom" in completion_text(c) for c in completions):
        raise KeyError("boom")
    return [0.0] * len(completions)


def test_checked_names_the_reward_and_the_failing_example():
    with pytest.raises(RuntimeError, match=r"reward '_raises_on_second' raised KeyError.*on example 1 .*'boom'"):
        checked(_raises_on_second)(["fine", "boom", "fine"], answer=["1", "2", "3"])


def test_checked_wrong_count_and_wrong_type():
    def short_reward(completions, **kw):
        return [1.0]

    def text_reward(completions, **kw):
        return ["high"] * len(completions)

    with pytest.raises(ValueError, match="reward 'short_reward' returned 1 scores for 3 completions"):
        checked(short_reward)(["a", "b", "c"])
    with pytest.raises(ValueError, match="reward 'text_reward' returned a str at index 0"):
        checked(text_reward)(["a"])


def test_checked_keeps_async_and_name_for_trl():
    # TRL's is_async_callable / get_callable_name look at iscoroutinefunction(f.__call__) and f.__name__
    # (importing trl here would cost the test budget, so the same checks are spelt out).
    get_reward(f"{FIXTURES / 'my_verifiers.py'}:palindrome_reward")  # loads the module
    mod = next(m for n, m in sys.modules.items() if n.startswith("smolalign_user_rewards.my_verifiers"))
    wrapped = checked(mod.async_palindrome_reward)
    assert inspect.iscoroutinefunction(wrapped.__call__) and wrapped.__name__ == "async_palindrome_reward"
    assert asyncio.run(wrapped(completions=["abba", "abc"])) == [1.0, 0.0]
    sync = checked(math_reward)
    assert not inspect.iscoroutinefunction(sync.__call__) and sync.__name__ == "math_reward"
    bound = get_reward(mod.async_palindrome_reward, min_length=4)
    assert inspect.iscoroutinefunction(bound.__call__) and asyncio.run(bound(["aba", "abba"])) == [0.0, 1.0]


def test_score_runs_async_rewards_concurrently_and_weights_totals():
    spans: dict[str, tuple[float, float]] = {}

    def make(name, value):
        async def judge(completions, **kw):
            start = time.monotonic()
            await asyncio.sleep(0.2)
            spans[name] = (start, time.monotonic())
            return [value] * len(completions)

        judge.__name__ = name
        return judge

    s = score(
        [make("a_reward", 1.0), make("b_reward", 2.0), "math_reward"],
        ["\\boxed{4}", "\\boxed{5}"],
        weights=[1.0, 0.5, 10.0],
        answer=["4", None],
    )
    # each started before the other finished: they ran at the same time
    assert spans["a_reward"][0] < spans["b_reward"][1] and spans["b_reward"][0] < spans["a_reward"][1]
    assert s.by_reward["math_reward"] == [1.0, None]
    assert s.total == [1.0 + 1.0 + 10.0, 1.0 + 1.0]  # None abstains, it does not count as 0


def test_score_inside_a_running_event_loop():
    async def main():
        return score(["exact_match_reward"], ["\\boxed{yes}"], answer=["Yes"])

    assert asyncio.run(main()).total == [1.0]


def test_score_reports_async_failure_with_index():
    async def flaky_reward(completions, **kw):
        if "bad" in completions:
            raise ValueError("cannot judge")
        return [1.0] * len(completions)

    with pytest.raises(RuntimeError, match="reward 'flaky_reward' raised ValueError: cannot judge on example 2"):
        score([flaky_reward], ["ok", "ok", "bad"])


def test_completion_text_forms():
    assert completion_text("x") == "x"
    assert completion_text([{"role": "assistant", "content": "y"}]) == "y"
    with pytest.raises(ValueError, match="completion must be a str"):
        completion_text(42)


# ----------------------------------------------------------------------------------------------- verifiers

MATH_CASES = [
    ("The answer is \\boxed{42}.", "42", 1.0),
    ("\\boxed{\\frac{3}{4}}", "3/4", 1.0),
    ("\\boxed{0.75}", "\\frac{3}{4}", 1.0),
    ("\\boxed{42 \\text{ cm}}", "42", 1.0),
    ("\\boxed{12 dollars}", "12", 1.0),
    ("\\boxed{\\$1,000}", "1000", 1.0),
    ("\\boxed{50\\%}", "0.5", 1.0),
    ("The final answer is $-3$", "-3", 1.0),
    ("\\boxed{41}", "42", 0.0),
    ("I think it is 42", "42", 0.0),  # no anchored answer, fallback off
    ("<think>\nclearly \\boxed{42}\n</think>\nThe answer is \\boxed{41}.", "42", 0.0),  # reasoning ignored
    ("<think>\nthe answer is \\boxed{42}", "42", 0.0),  # truncated inside the reasoning: no answer
    ("\\boxed{2, 5, 9}", "2, 5, 9", 1.0),
    ("\\boxed{42}", None, None),
    ("\\boxed{42}", "", None),
]


@pytest.mark.parametrize(("completion", "gold", "expected"), MATH_CASES)
def test_math_reward(completion, gold, expected):
    assert math_reward([completion], answer=[gold]) == [expected]


def test_math_reward_last_number_fallback_and_conversational():
    assert math_reward(["first 7, then 42"], answer=["42"], last_number_fallback=True) == [1.0]
    assert math_reward(["first 42, then 7"], answer=["42"], last_number_fallback=True) == [0.0]
    assert math_reward([[{"role": "assistant", "content": "\\boxed{4}"}]], answer=["4"]) == [1.0]


def test_math_reward_outside_the_main_thread():
    out = {}
    t = threading.Thread(
        target=lambda: out.setdefault("r", math_reward(["\\boxed{4}", "\\boxed{5}"], answer=["4"] * 2))
    )
    t.start()
    t.join()
    assert out["r"] == [1.0, 0.0]


def test_math_reward_unparseable_gold_abstains_with_warning():
    from rewards.math import _warn_gold

    _warn_gold.cache_clear()  # warned once per gold per process: another test may have warned about this one
    with pytest.warns(UserWarning, match="cannot parse the gold answer"):
        assert math_reward(["\\boxed{4}"], answer=["}{"]) == [None]


@pytest.mark.parametrize(
    ("completion", "gold", "expected"),
    [
        ("The answer is \\boxed{2, 5, 9}.", "2, 5, 9", 1.0),
        ("\\boxed{2,5,9}", "2, 5, 9", 1.0),
        ("\\boxed{9, 5, 2}", "2, 5, 9", 0.0),  # order matters for lists
        ("\\boxed{ Paris. }", "paris", 1.0),
        ("\\boxed{\\text{Yes}}", "yes", 1.0),
        ("\\boxed{1} then \\boxed{2}", "2", 0.0),  # two different answers: none
        ("\\boxed{2}, so \\boxed{2}", "2", 1.0),  # repeated, the same answer
        ("the answer is 2", "2", 0.0),
        ("\\boxed{x}", None, None),
    ],
)
def test_exact_match_reward(completion, gold, expected):
    assert exact_match_reward([completion], answer=[gold]) == [expected]


@pytest.mark.parametrize(
    ("completion", "think", "answer"),
    [
        ("<think>\n3 + 4 = 7\n</think>\nThe answer is \\boxed{7}.", 1.0, 1.0),
        ("The answer is \\boxed{7}.", 0.0, 1.0),
        ("<think>\n\n</think>\nThe answer is \\boxed{7}.", 0.0, 1.0),  # empty reasoning
        ("<think>\n3 + 4\n</think>\nThe answer is 7.", 0.0, 0.0),
        ("<think>\n3 + 4 = \\boxed{7}", 0.0, 0.0),  # never closed
        ("<think>a</think>\\boxed{7}</think>", 0.0, 0.0),  # stray closing tag: the answer part is empty
        ("preamble <think>a</think>\\boxed{7}", 0.0, 1.0),  # reasoning must come first
        ("\\boxed{}", 0.0, 0.0),
    ],
)
def test_format_rewards(completion, think, answer):
    assert think_format_reward([completion]) == [think]
    assert answer_format_reward([completion]) == [answer]


OVERLONG = {"max_completion_len": 10, "soft_punish_cache": 4}


@pytest.mark.parametrize(
    ("n_words", "think", "expected"),
    [
        (6, False, 0.0),
        (8, False, -0.5),
        (10, False, -1.0),
        (30, False, -1.0),
        (8, True, 0.0),
        (16, True, -0.5),
    ],  # + 2 tag words,
)
def test_soft_overlong_reward_per_mode_budgets(n_words, think, expected):
    body = " ".join(["w"] * n_words)
    text = f"<think>\n{body}\n</think>" if think else body
    budgets = {**OVERLONG, "think_max_completion_len": 20, "think_soft_punish_cache": 4}
    assert soft_overlong_reward([text], **budgets) == [pytest.approx(expected)]


def test_soft_overlong_reward_tokens_mode_column_and_errors():
    ids = [[0] * 8, [0] * 8]
    # the mode column overrides detection; token lengths override word counts
    out = soft_overlong_reward(["a", "a"], completion_ids=ids, mode=["no_think", "think"], **OVERLONG,
                               think_max_completion_len=100, think_soft_punish_cache=10)  # fmt: skip
    assert out == [-0.5, 0.0]
    with pytest.raises(ValueError, match="needs max_completion_len and soft_punish_cache"):
        soft_overlong_reward(["a"])
    with pytest.raises(ValueError, match="soft_punish_cache <= max_completion_len"):
        soft_overlong_reward(["a"], max_completion_len=4, soft_punish_cache=8)
    with pytest.raises(ValueError, match="mode must be 'think' or 'no_think', got 'fast'"):
        soft_overlong_reward(["a"], mode=["fast"], **OVERLONG)


def test_cosine_length_reward_orders_short_right_over_long_right_over_long_wrong_over_short_wrong():
    ids = [[0] * 5, [0] * 95, [0] * 95, [0] * 5]
    completions = ["\\boxed{4}", "\\boxed{4}", "\\boxed{3}", "\\boxed{3}"]
    short_right, long_right, long_wrong, short_wrong = cosine_length_reward(
        completions, answer=["4"] * 4, completion_ids=ids, max_len=100
    )
    assert short_right > long_right > 0 > long_wrong > short_wrong
    assert cosine_length_reward(["\\boxed{4}"], answer=[None]) == [None]
    assert cosine_length_reward(["\\boxed{yes}"], answer=["Yes"], verifier="exact_match", max_len=10) == [
        pytest.approx(0.896946, abs=1e-6)  # 11 bytes, 3 estimated tokens of 10: cos(0.3 pi) (one word, unspaced)
    ]


@pytest.mark.parametrize(
    ("text", "ngram_size", "expected"),
    [
        ("the cat sat on the mat", 3, 0.0),
        ("a b a b a b", 2, -0.6),  # 5 bigrams, 2 distinct
        ("go " * 20, 3, -0.944444),
        ("short", 3, 0.0),
        ("", 3, 0.0),
    ],
)
def test_repetition_penalty_reward(text, ngram_size, expected):
    assert repetition_penalty_reward([text], ngram_size=ngram_size) == [pytest.approx(expected, abs=1e-6)]


def test_repetition_penalty_rejects_positive_penalty():
    with pytest.raises(ValueError, match="max_penalty must be <= 0"):
        repetition_penalty_reward(["a"], max_penalty=0.5)


def test_code_reward_rows_entry_points_and_abstain():
    good = "```python\ndef inc(x):\n    return x + 1\n```"
    out = rewards.code_reward(
        [good, good, [{"role": "assistant", "content": good}]],
        tests=["def check(f):\n    assert f(1) == 2", None, "assert inc(2) == 3"],
        entry_point=["inc", None, None],
    )
    assert out == [1.0, None, 1.0]
    assert inspect.signature(rewards.code_reward).parameters["tests"].default is inspect.Parameter.empty


def test_data_error_and_calculator_parse_safely_from_many_threads():
    """CPython 3.11 counts the AST constructor's recursion per interpreter, not per thread (python/cpython#106905):
    a parse that lets another thread run mid-way (here a finalizer that sleeps, run by the garbage collector; in
    CI the code reward's subprocess objects) made the other thread's ``ast.parse`` raise ``SystemError: AST
    constructor recursion depth mismatch`` (stop 57's CI lost the red team's code fixture to it). Without
    ``rewards.checks.parse_source``'s lock this fails every time on 3.11.7."""
    import gc
    from concurrent.futures import ThreadPoolExecutor

    from align.tools.functions import calculator
    from rewards.checks import data_error

    class Sleeper:  # cyclic garbage whose finalizer releases the GIL
        def __init__(self):
            self.me = self

        def __del__(self):
            time.sleep(0.0001)

    tests = "def check(candidate):\n" + "".join(
        f"    assert candidate({i}) == [[[{i}]]] and (1 + (2 * (3 - {i})))\n" for i in range(30)
    )

    def work(k):
        out = []
        for _ in range(100):
            Sleeper()
            out.append(data_error(tests, "f") if k % 2 else calculator("((1 + 2) * (3 - 4)) ** 2 + 48213 * 907"))
        return out

    threshold = gc.get_threshold()
    gc.set_threshold(50, 1, 1)
    try:
        with ThreadPoolExecutor(4) as pool:
            results = list(pool.map(work, range(8)))
    finally:
        gc.set_threshold(*threshold)
    assert all(r == [None] * 100 for r in results[1::2])
    assert all(r == [str(9 + 48213 * 907)] * 100 for r in results[0::2])


# ----------------------------------------------------------------------------------------------- answers


@pytest.mark.parametrize(
    ("pred", "gold", "expected"),
    [
        ("42", "42", True),
        ("42.0", "42", True),
        ("\\frac{84}{2}", "42", False),  # a reducible fraction is a division (84 / 2), not a stated number
        ("x = 42", "42", True),
        ("42 cm", "42", True),  # a unit of measure
        ("42 apples", "42", False),  # a counted noun is a unit only when the question counts it (the prompt)
        ("41", "42", False),
        ("6 * 7", "42", False),  # an expression is not a stated number
        ("42 or 43", "42", False),
        ("forty-two", "42", False),
        ("3, 3, 7, 9", "3, 3, 7, 9", True),
        ("[3, 3, 7, 9]", "3, 3, 7, 9", True),
        ("3, 3, 7, 9.0", "3, 3, 7, 9", True),
        ("3, 7, 9", "3, 3, 7, 9", False),
        ("9, 7, 3, 3", "3, 3, 7, 9", False),
        ("\\{3, 2\\}", "\\{2, 3\\}", True),
        ("2, 3, 4", "\\{2, 3\\}", False),
        ("Paris", "paris", True),
        ("Paris or Rome", "paris", False),
    ],
)
def test_answer_matches_by_kind(pred, gold, expected):
    assert answer_matches(pred, gold) is expected


def test_answer_kinds_and_final_answer():
    assert [answer_kind(g) for g in ("-3.5", "3/4", "1, 2", "\\{1\\}", "yes", "x^2")] == [
        "number", "number", "list", "set", "text", "expression"]  # fmt: skip
    assert final_answer("The answer is \\boxed{4}. So \\boxed{4}.") == "4"
    assert final_answer("\\boxed{4} and \\boxed{5}") is None
    assert final_answer("The answer is 4.") is None and final_answer("The answer is 4.", anchors=True) == "4"


# ----------------------------------------------------------------------------------------------- routing


def test_verifier_reward_routes_each_row_and_logs_means():
    logged = []
    code_row = "```python\ndef inc(x):\n    return x + 1\n```"
    out = verifier_reward(
        ["\\boxed{3, 7, 9}", "\\boxed{7, 3, 9}", "\\boxed{4}", code_row, "\\boxed{yes}"],
        reward=["exact_match_reward", "exact_match_reward", None, "code_reward", None],
        family=["sort", "sort", "compare", "code", "yes_no"],
        family_verifiers={"yes_no": "exact_match_reward"},
        answer=["3, 7, 9", "3, 7, 9", "4", None, "Yes"],
        tests=[None, None, None, "assert inc(1) == 2", None],
        log_metric=lambda name, value: logged.append((name, value)),
        log_extra=lambda *a: pytest.fail("the router keeps TRL's hooks to itself"),
    )
    assert out == [1.0, 0.0, 1.0, 1.0, 1.0]
    assert dict(logged) == {
        "verifier/exact_match_reward/mean": 2 / 3, "verifier/math_reward/mean": 1.0, "verifier/code_reward/mean": 1.0,
        "family/sort/mean": 0.5, "family/compare/mean": 1.0, "family/code/mean": 1.0, "family/yes_no/mean": 1.0,
    }  # fmt: skip


def test_verifier_reward_binds_kwargs_and_rejects_bad_columns():
    out = verifier_reward(
        ["7 then 42"], answer=["42"], verifier_kwargs={"math_reward": {"last_number_fallback": True}}
    )
    assert out == [1.0]
    with pytest.raises(ValueError, match="names verifier_reward itself"):
        verifier_reward(["x"], reward=["verifier_reward"], answer=["1"])
    with pytest.raises(ValueError, match="one entry per completion"):
        verifier_reward(["x", "y"], reward=["math_reward"], answer=["1", "2"])
    with pytest.raises(ValueError, match="unknown reward 'math_rewrd'"):
        verifier_reward(["x"], reward=["math_rewrd"], answer=["1"])


def test_route_accuracy_keeps_name_columns_kwargs_and_pickles():
    from align.grpo.reward_funcs import required_reward_columns

    funcs, _ = get_rewards(
        ["math_reward", "repetition_penalty_reward"], {"math_reward": {"last_number_fallback": True}}
    )
    routed = route_accuracy(funcs)
    assert [f.__name__ for f in routed] == ["math_reward", "repetition_penalty_reward"]
    assert required_reward_columns(checked(routed[0])) == ["answer"]
    again = pickle.loads(pickle.dumps(routed[0]))
    assert again(["so 7, then 42", "\\boxed{7, 3}"], answer=["42", "3, 7"], reward=[None, "exact_match_reward"]) == [
        1.0, 0.0]  # fmt: skip
    with pytest.raises(ValueError, match="names 2 accuracy verifiers"):
        route_accuracy(get_rewards(["math_reward", "code_reward"])[0])


# ------------------------------------------------------------------------------------- hybrid reasoning format


@pytest.mark.parametrize(
    "completion, mode, expected",
    [
        ("<think>\nThe word has r at 3, 7 and 9, so three.\n</think>\nThe answer is \\boxed{3}.", "think", 1.0),
        ("<think>\nthree\n</think>\nThe answer is \\boxed{3}.", "think", 0.0),  # one word: no real reasoning
        (
            "<think>\n\u3164 \u3164 \u3164 \u3164 \u3164 \u3164 \u3164 \u3164\n</think>\n\\boxed{3}",
            "think",
            0.0,
        ),  # blank letters
        ("The answer is \\boxed{3}.", "think", 0.0),  # asked to think, did not
        ("The answer is \\boxed{3}.", "no_think", 1.0),
        ("<think>\n\n</think>\nThe answer is \\boxed{3}.", "no_think", 1.0),  # an empty block is no reasoning
        (
            "<think>\nI count one two three here ok\n</think>\n\\boxed{3}",
            "no_think",
            0.0,
        ),  # reasoned when asked not to
        ("The answer is 3.", "no_think", 0.0),  # no boxed answer
        ("\\boxed{3} </think>", "no_think", 0.0),
        # a think block renamed (what APO learned on the 135M chain): reasoning all the same
        ("<no_think>\n5 + 4 = 9\n</no_think>\nThe answer is \\boxed{9}.", "no_think", 0.0),
        ("<reasoning>4 + 5</reasoning> \\boxed{9}", "no_think", 0.0),
        ("Since 3 < 5 and 9 > 2, the answer is \\boxed{3}.", "no_think", 1.0),  # comparisons are no tags
    ],
)
def test_mode_format_reward_pays_the_shape_the_asked_mode_wants(completion, mode, expected):
    from rewards import mode_format_reward

    assert mode_format_reward([completion], mode=[mode]) == [expected]
    # the mode from the prompt's flag when there is no mode column; neither: abstain
    prompt = [{"role": "system", "content": f"/{mode}"}, {"role": "user", "content": "count"}]
    assert mode_format_reward([completion], prompts=[prompt]) == [expected]
    assert mode_format_reward([completion], prompts=[[{"role": "user", "content": "count"}]]) == [None]


def test_mode_format_reward_min_think_words_and_bad_input():
    from rewards import mode_format_reward

    text = "<think>\none two three\n</think>\n\\boxed{3}"
    assert mode_format_reward([text], mode=["think"], min_think_words=3) == [1.0]
    assert mode_format_reward([text], mode=["think"], min_think_words=4) == [0.0]
    with pytest.raises(ValueError, match="min_think_words"):
        mode_format_reward([text], mode=["think"], min_think_words=0)
    with pytest.raises(ValueError, match="mode must be"):
        mode_format_reward([text], mode=["deep"])
