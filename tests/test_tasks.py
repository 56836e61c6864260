"""data_gen/tasks.py: gold answers are right, splits are disjoint, output is deterministic and well formed."""

import re

import pytest

from data_gen.tasks import (
    DEFAULT_FAMILIES,
    FAMILIES,
    assistant_text,
    make_tasks,
    prompt_messages,
    split_of,
    tasks_dataset,
    to_messages,
    to_pretrain_text,
)

ROW_KEYS = {"prompt", "answer", "family", "think", "reward"}


def _ints(text: str) -> list[int]:
    return [int(x) for x in re.findall(r"-?\d+", text)]


def _check_arithmetic(row):
    expr = re.fullmatch(r"What is (.+)\?", row["prompt"]).group(1)
    assert eval(expr, {"__builtins__": {}}) == int(row["answer"])  # expression is only digits and + - * ( )


def _check_word_problem(row):
    nums, p = _ints(row["prompt"]), row["prompt"]
    if "gets" in p:
        expected = nums[0] + nums[1]
    elif "gives away" in p:
        expected = nums[0] - nums[1]
    elif "loses" in p:
        expected = nums[0] + nums[1] - nums[2]
    else:
        expected = nums[0] * nums[1]
    assert expected == int(row["answer"])


def _check_count_letters(row):
    letter, word = re.fullmatch(r'How many times does the letter "(\w)" appear in "(\w+)"\?', row["prompt"]).groups()
    assert word.count(letter) == int(row["answer"])


def _check_count_items(row):
    p = row["prompt"]
    if p.startswith("How many words"):
        assert len(p.split(": ")[1].rstrip("?").split(", ")) == int(row["answer"])
    else:
        target, items = re.fullmatch(r"How many times does (\w+) appear in: (.+)\?", p).groups()
        assert items.split(", ").count(target) == int(row["answer"])


def _check_sort(row):
    nums = _ints(row["prompt"])
    assert row["answer"] == ", ".join(map(str, sorted(nums, reverse="descending" in row["prompt"])))


def _check_convert(row):
    from data_gen.tasks import UNITS

    nums = _ints(row["prompt"])
    n = nums[0]
    for big, small, factor in UNITS:
        if len(nums) == 2 and row["prompt"] == f"How many {small} are in {n} {big} and {nums[1]} {small}?":
            assert int(row["answer"]) == n * factor + nums[1] and nums[1] < factor
            return
        if row["prompt"] == f"How many {small} are in {n} {big}?":
            assert int(row["answer"]) == n * factor
            return
        if row["prompt"] == f"How many {big} are {n} {small}?":
            assert int(row["answer"]) * factor == n
            return
    raise AssertionError(f"unrecognised prompt {row['prompt']!r}")


def _check_compare(row):
    nums = _ints(row["prompt"])
    assert int(row["answer"]) == (max(nums) if "largest" in row["prompt"] else min(nums))


CHECKS = {
    "arithmetic": _check_arithmetic,
    "word_problem": _check_word_problem,
    "count_letters": _check_count_letters,
    "count_items": _check_count_items,
    "sort": _check_sort,
    "convert": _check_convert,
    "compare": _check_compare,
}


def test_every_own_family_has_a_checker():
    assert set(CHECKS) == set(DEFAULT_FAMILIES)
    assert len(DEFAULT_FAMILIES) >= 6


@pytest.mark.parametrize("family", sorted(CHECKS))
@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_gold_answers_are_correct(family, difficulty):
    rows = make_tasks([family], num=60, split="train", seed=3, difficulty=difficulty)
    assert len(rows) == 60 and len({r["prompt"] for r in rows}) == 60
    for row in rows:
        assert set(row) == ROW_KEYS and row["family"] == family
        assert row["reward"] == FAMILIES[family].reward
        CHECKS[family](row)
        assert row["think"].strip()


def test_arithmetic_think_trace_ends_at_the_answer():
    for row in make_tasks(["arithmetic", "word_problem", "convert"], num=60, seed=1, difficulty=2):
        assert _ints(row["think"])[-1] == int(row["answer"])


def test_difficulty_grows_numbers():
    easy = make_tasks(["arithmetic"], num=200, seed=0, difficulty=1)
    hard = make_tasks(["arithmetic"], num=200, seed=0, difficulty=3)
    assert max(max(_ints(r["prompt"])) for r in easy) <= 20
    assert max(max(_ints(r["prompt"])) for r in hard) > 100
    mixed = make_tasks(["arithmetic", "sort"], num=100, seed=0, difficulty={"arithmetic": 3})
    assert max(n for r in mixed if r["family"] == "sort" for n in _ints(r["prompt"])) <= 50


def test_splits_share_no_prompt_for_any_seed():
    train = {r["prompt"] for seed in (0, 1) for r in make_tasks(num=3000, split="train", seed=seed)}
    test = [r["prompt"] for seed in (0, 1) for r in make_tasks(num=500, split="test", seed=seed)]
    assert not train & set(test)
    assert all(split_of(p) == "test" for p in test) and all(split_of(p) == "train" for p in train)


def test_deterministic_under_seed_and_family_order_independent():
    assert make_tasks(num=50, seed=7) == make_tasks(num=50, seed=7)
    assert make_tasks(num=50, seed=7) != make_tasks(num=50, seed=8)
    # a family's items do not depend on which other families are mixed in
    alone = make_tasks(["sort"], num=10, seed=7)
    mixed = [r for r in make_tasks(["compare", "sort"], num=20, seed=7) if r["family"] == "sort"]
    assert alone == mixed


def test_round_robin_balances_families():
    rows = make_tasks(num=70, seed=0)
    counts = {f: sum(r["family"] == f for r in rows) for f in DEFAULT_FAMILIES}
    assert set(counts.values()) == {10}


def test_formats_follow_the_shared_convention():
    row = {"prompt": "What is 2 + 3?", "answer": "5", "family": "arithmetic", "think": "2 + 3 = 5",
           "reward": "math_reward"}
    assert assistant_text(row, "think") == "<think>\n2 + 3 = 5\n</think>\nThe answer is \\boxed{5}."
    assert assistant_text(row, "no_think") == "The answer is \\boxed{5}."
    msgs = to_messages(row, "no_think")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert msgs[0]["content"] == "/no_think" and msgs[1]["content"] == row["prompt"]
    assert prompt_messages(row, "think") == [{"role": "system", "content": "/think"},
                                            {"role": "user", "content": "What is 2 + 3?"}]
    assert to_pretrain_text(row) == "Question: What is 2 + 3?\nAnswer: 2 + 3 = 5 The answer is \\boxed{5}."


def test_tasks_dataset_columns_and_mixed_mode():
    ds = tasks_dataset(split="test", families="arithmetic,sort", num=40, seed=0, mode="mixed")
    assert ROW_KEYS | {"messages", "prompt_messages"} <= set(ds.column_names) and len(ds) == 40
    flags = [m[0]["content"] for m in ds["messages"]]
    assert 10 < flags.count("/think") < 30 and flags.count("/think") + flags.count("/no_think") == 40
    for row in ds:
        assert row["prompt_messages"] == row["messages"][:2]
        think = row["messages"][0]["content"] == "/think"
        assert row["messages"][2]["content"].startswith("<think>") == think
        assert split_of(row["prompt"]) == "test"


def test_reasoning_gym_adapters_map_to_the_row_shape():
    rows = make_tasks(["rg:basic_arithmetic"], num=5, split="test", seed=0)
    for row in rows:
        assert set(row) == ROW_KEYS and row["reward"] == "math_reward"
        expr = re.fullmatch(r"Calculate (.+)\.", row["prompt"]).group(1)
        assert eval(expr, {"__builtins__": {}}) == int(row["answer"])
    gsm = make_tasks(["rg:gsm_symbolic"], num=2, seed=0)
    assert all("####" not in r["think"] and r["answer"].lstrip("-").isdigit() for r in gsm)


@pytest.mark.parametrize(
    "kwargs, match",
    [
        ({"families": ["nope"]}, "unknown task family 'nope'"),
        ({"split": "dev"}, "split must be one of"),
        ({"difficulty": 0}, "difficulty for 'arithmetic' must be an int >= 1"),
        ({"families": ["rg:no_such_task"]}, "reasoning-gym has no task"),
    ],
)
def test_bad_arguments_name_the_field(kwargs, match):
    with pytest.raises(ValueError, match=match):
        make_tasks(num=3, **kwargs)


def test_answers_pass_the_registered_reward():
    rewards = pytest.importorskip("rewards")
    if not hasattr(rewards, "get_reward"):
        pytest.skip("rewards registry not built yet")
    rows = make_tasks(num=35, seed=0)
    for mode in ("think", "no_think"):
        for row in rows:
            fn = rewards.get_reward(row["reward"])
            assert fn([assistant_text(row, mode)], answer=[row["answer"]]) == [1.0], row
