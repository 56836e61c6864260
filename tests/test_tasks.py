"""data_gen/tasks.py: gold answers are right, splits are disjoint by problem, output is deterministic and well
formed, every family's canonical problem forgets what it should and keeps what it should."""

import itertools
import random
import re
from collections import Counter

import pytest

from data_gen import tasks as tasks_module
from data_gen.tasks import (
    DEFAULT_FAMILIES,
    FAMILIES,
    SMALL_SPACE,
    SPLIT_BUCKETS,
    SPLITS,
    TaskFamily,
    assistant_text,
    canonical_problem,
    make_tasks,
    problem_key,
    problem_space,
    prompt_messages,
    split_for,
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


def test_splits_share_no_problem_for_any_seed():
    """Train, validation, dev and test hold disjoint problems (not only prompts), whatever the seed and the
    difficulty: the stages' own held-out sets (validation) and the eval suite's (dev) never share one either."""
    problems = {}
    for split, num in (("train", 2000), ("validation", 400), ("dev", 400), ("test", 400)):
        rows = [
            r for seed in (0, 1) for d in (1, 2) for r in make_tasks(num=num, split=split, seed=seed, difficulty=d)
        ]
        assert all(split_of(r["family"], r["prompt"]) == split for r in rows)
        problems[split] = {(r["family"], problem_key(r["family"], r["prompt"])) for r in rows}
    for a, b in itertools.combinations(SPLITS, 2):
        assert not problems[a] & problems[b], (a, b)


def test_split_buckets_are_fixed_and_cover_the_hash():
    assert SPLITS == ("train", "validation", "dev", "test")
    assert {k: (r.start, r.stop) for k, r in SPLIT_BUCKETS.items()} == {
        "test": (0, 10),
        "dev": (10, 20),
        "validation": (20, 30),
        "train": (30, 100),
    }
    shares = Counter(split_for("arithmetic", str(i)) for i in range(20_000))
    for split in ("test", "dev", "validation"):
        assert abs(shares[split] / 20_000 - 0.1) < 0.01, split
    # the family is part of what is hashed: one problem string may fall in different splits in two families
    assert {split_for(f"family{i}", "1,2,3") for i in range(100)} == set(SPLITS)


# (family, prompt, prompt): the same canonical problem in other words (names, items, letter, direction, order)
SAME_PROBLEM = [
    ("arithmetic", "What is 3 + 5 - 2?", "What is 5 - 2 + 3?"),
    ("arithmetic", "What is (4 + 1) * 2?", "What is 2 * (1 + 4)?"),
    ("arithmetic", "What is (3 + 5) * 2 - 4?", "What is 2 * (5 + 3) - 4?"),
    (
        "word_problem",
        "Tom has 15 apples and gets 3 more. How many apples does Tom have now?",
        "Ann has 3 pens and gets 15 more. How many pens does Ann have now?",
    ),
    (
        "word_problem",
        "Tom has 9 cups and gives away 4. How many cups are left?",
        "Zoe has 9 eggs and gives away 4. How many eggs are left?",
    ),
    (
        "word_problem",
        "Sam has 8 coins, buys 5 more and loses 2. How many coins does Sam have?",
        "Mia has 5 cards, buys 8 more and loses 2. How many cards does Mia have?",
    ),
    (
        "word_problem",
        "Leo has 3 boxes with 7 balls in each box. How many balls is that?",
        "Ivy has 7 boxes with 3 pens in each box. How many pens is that?",
    ),
    (
        "count_letters",
        'How many times does the letter "a" appear in "abcab"?',
        'How many times does the letter "c" appear in "abcab"?',
    ),
    (
        "count_items",
        "How many words are in this list: cat, dog, cat?",
        "How many times does dog appear in: dog, cat, cat?",
    ),
    ("sort", "Sort in ascending order: 3, 41, 7.", "Sort in descending order: 41, 7, 3."),
    ("convert", "How many minutes are in 3 hours?", "How many hours are 180 minutes?"),
    ("compare", "Which number is the largest: 4, 9, 2?", "Which number is the smallest: 2, 4, 9?"),
    (
        "rg:gsm_symbolic",
        "Tom buys 3 apples for 2 dollars each. What does he pay?",
        "Ann buys 3 pears for 2 euros each. What does she pay?",
    ),
]
# (family, prompt, prompt): other problems, however alike the words
OTHER_PROBLEM = [
    ("arithmetic", "What is 3 + 5 - 2?", "What is 3 - 5 + 2?"),
    ("arithmetic", "What is (4 + 1) * 2?", "What is 4 + 1 * 2?"),
    (
        "word_problem",
        "Tom has 15 apples and gets 3 more. How many apples does Tom have now?",
        "Tom has 15 apples and gives away 3. How many apples are left?",
    ),
    (
        "word_problem",
        "Tom has 9 cups and gives away 4. How many cups are left?",
        "Tom has 4 cups and gives away 4. How many cups are left?",
    ),
    (
        "count_letters",
        'How many times does the letter "a" appear in "abcab"?',
        'How many times does the letter "a" appear in "abcba"?',
    ),
    ("count_items", "How many words are in this list: cat, dog, cat?", "How many words are in this list: cat, dog?"),
    ("sort", "Sort in ascending order: 3, 41, 7.", "Sort in ascending order: 3, 41, 7, 7."),
    ("convert", "How many minutes are in 3 hours?", "How many seconds are in 3 minutes?"),
    ("convert", "How many minutes are in 3 hours?", "How many minutes are in 3 hours and 5 minutes?"),
    ("compare", "Which number is the largest: 4, 9, 2?", "Which number is the largest: 4, 9, 3?"),
]


@pytest.mark.parametrize("family, a, b", SAME_PROBLEM, ids=[f"{c[0]}-{i}" for i, c in enumerate(SAME_PROBLEM)])
def test_rewordings_are_one_problem(family, a, b):
    assert canonical_problem(family, a) is not None
    assert canonical_problem(family, a) == canonical_problem(family, b)
    assert split_of(family, a) == split_of(family, b)


@pytest.mark.parametrize("family, a, b", OTHER_PROBLEM, ids=[f"{c[0]}-{i}" for i, c in enumerate(OTHER_PROBLEM)])
def test_other_problems_stay_apart(family, a, b):
    assert None not in (canonical_problem(family, a), canonical_problem(family, b))
    assert canonical_problem(family, a) != canonical_problem(family, b)


@pytest.mark.parametrize(
    "family, prompt",
    [
        ("arithmetic", "What is 3 +?"),
        ("arithmetic", "What is ((((3))?"),
        ("arithmetic", "Compute 3 + 4."),
        ("word_problem", "Tom has many apples."),
        ("count_letters", "How many letters are in the word apple?"),
        ("convert", "How many parsecs are in 3 hours?"),
        ("convert", "How many hours are 7 minutes?"),
        ("sort", "Sort these numbers: 9, 2, 5."),
        ("nope", "What is 3 + 5?"),
        ("rg:gsm_symbolic", "Tom has 3 apples."),
    ],
)
def test_prompts_out_of_form_have_no_canonical_problem(family, prompt):
    assert canonical_problem(family, prompt) is None
    assert problem_key(family, prompt) == "text:" + " ".join(prompt.lower().split())


@pytest.mark.parametrize("family", sorted(CHECKS))
@pytest.mark.parametrize("difficulty", [1, 2, 3])
def test_every_generated_prompt_is_in_its_familys_form(family, difficulty):
    rng = random.Random(f"form:{family}:{difficulty}")
    for _ in range(300):
        prompt = FAMILIES[family].sample(rng, difficulty)[0]
        assert canonical_problem(family, prompt) is not None, prompt


def test_the_deepest_expression_is_refused_not_a_recursion_error():
    assert canonical_problem("arithmetic", "What is " + "(" * 5000 + "1" + ")" * 5000 + "?") is None
    assert canonical_problem("arithmetic", "What is " + " + ".join(["1"] * 5000) + "?") is None


def _problems_seen(family: str, difficulty: int, draws: int = 20_000) -> set[str]:
    rng = random.Random(0)
    return {canonical_problem(family, FAMILIES[family].sample(rng, difficulty)[0]) for _ in range(draws)}


def test_the_small_problem_spaces_were_widened():
    """One-step word problems had 380 ("gets") and 209 ("gives") distinct problems at difficulty 1, the simple
    conversions 360 (720 prompts: both directions), lists 434: each now has at least SMALL_SPACE."""
    words = Counter(p.split(":")[0] for p in _problems_seen("word_problem", 1))
    assert words["a+b"] >= SMALL_SPACE and words["a-b"] >= SMALL_SPACE
    simple = {p for p in _problems_seen("convert", 1) if "+" not in p}
    assert len(simple) >= SMALL_SPACE
    assert all(problem_space(f, 1, 5_000) >= SMALL_SPACE for f in DEFAULT_FAMILIES)


def test_problem_space_is_exact_on_a_space_it_exhausts(monkeypatch):
    def sample(rng, difficulty):
        a, b = rng.randint(1, 10), rng.randint(1, 5 * difficulty)
        return f"What is {a} + {b}?", str(a + b), ""

    fake = TaskFamily("tiny_sums", sample, "math_reward", "sums", FAMILIES["arithmetic"].canonical)
    monkeypatch.setitem(tasks_module.FAMILIES, "tiny_sums", fake)
    problem_space.cache_clear()
    # unordered pairs {a, b}: a in 1..10, b in 1..5 -> 40 (10 x 5 = 50 ordered, 10 pairs counted twice)
    assert problem_space("tiny_sums", 1) == len({tuple(sorted((a, b))) for a in range(1, 11) for b in range(1, 6)})
    problem_space.cache_clear()


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
    row = {
        "prompt": "What is 2 + 3?",
        "answer": "5",
        "family": "arithmetic",
        "think": "2 + 3 = 5",
        "reward": "math_reward",
    }
    assert assistant_text(row, "think") == "<think>\n2 + 3 = 5\n</think>\nThe answer is \\boxed{5}."
    assert assistant_text(row, "no_think") == "The answer is \\boxed{5}."
    msgs = to_messages(row, "no_think")
    assert [m["role"] for m in msgs] == ["system", "user", "assistant"]
    assert msgs[0]["content"] == "/no_think" and msgs[1]["content"] == row["prompt"]
    assert prompt_messages(row, "think") == [
        {"role": "system", "content": "/think"},
        {"role": "user", "content": "What is 2 + 3?"},
    ]
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
        assert split_of(row["family"], row["prompt"]) == "test"


def test_a_training_set_drawn_apart_from_another_shares_none_of_its_problems():
    """`exclude_problems_of` (GRPO's prompts apart from SFT's): the same seed draws the same problems, so without it
    the second set holds the first one's; with it none, still `num` rows; held-out splits are not drawn apart."""
    sft = {"num": 140, "mode": "mixed", "seed": 0}

    def problems(ds):
        return {(r["family"], problem_key(r["family"], r["prompt"])) for r in ds}

    first = problems(tasks_dataset(**sft))
    assert first <= problems(tasks_dataset(num=700, mode="think"))  # the same seed: every SFT problem again
    apart = tasks_dataset(num=700, mode="think", exclude_problems_of=sft)
    assert len(apart) == 700 and not problems(apart) & first
    two = tasks_dataset(
        families="count_items",
        num=50,
        seed=3,
        exclude_problems_of=[sft, {"families": ["count_items"], "num": 60, "seed": 3}],
    )
    assert not problems(two) & (first | problems(tasks_dataset(families="count_items", num=60, seed=3)))
    held = tasks_dataset(split="validation", num=20, exclude_problems_of=sft)
    assert held["prompt"] == tasks_dataset(split="validation", num=20)["prompt"]
    with pytest.raises(ValueError, match="exclude_problems_of\\[0\\] must be a mapping"):
        tasks_dataset(num=5, exclude_problems_of=["builtin:tasks"])


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
        ({"split": "heldout"}, "split must be one of"),
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
