"""Verifiable synthetic tasks: the tiny world's questions with gold answers and the reward that checks them.

Why: SFT, preference generation, GRPO and evaluation all need prompts whose answers a program can check.
These families are written for tiny models (a ~4k BPE vocab, 3-12M params): short prompts, a small
vocabulary, integer answers, and a short worked `think` trace a model can imitate after a few minutes of
CPU training. Adapters map reasoning-gym generators (gsm_symbolic, basic_arithmetic, any `rg:<task>`) onto
the same row shape for larger models.

Row shape (shared convention): {"prompt", "answer", "family", "think", "reward"}; `reward` is a key of
`rewards.REWARDS` ("math_reward" for numbers, "exact_match_reward" for strings/lists).

Splits are decided by a hash of the prompt (about 10% of all possible prompts are "test"), so no test prompt
can ever appear in train, whatever the seed, the number of rows or the difficulty.

How to use:
    from data_gen.tasks import make_tasks, to_messages
    rows = make_tasks(["arithmetic", "sort"], num=100, split="test", seed=0, difficulty=1)
    to_messages(rows[0], mode="no_think")
    # as a dataset source (importing this module registers it with align.data.loading by name):
    align.data.loading.load_source("builtin:tasks", split="train", num=2000, mode="mixed")
"""

from __future__ import annotations

import functools
import hashlib
import random
from collections.abc import Callable
from dataclasses import dataclass, field

import datasets

from align.data.sources import register_builtin

# Percent of the prompt-hash space that belongs to the test split.
TEST_PERCENT = 10
SPLITS = ("train", "test")
MODES = ("think", "no_think", "mixed")

NAMES = ["Tom", "Ann", "Sam", "Mia", "Ben", "Eva", "Max", "Zoe", "Leo", "Ivy"]
ITEMS = ["apples", "pens", "books", "cups", "eggs", "stamps", "cards", "shells", "coins", "balls"]
NOUNS = ["cat", "dog", "sun", "cup", "hat", "pen", "box", "egg", "car", "bed", "map", "fox"]
LETTERS = "abcdefghij"
# (big unit, small unit, factor): 1 big = factor small; all conversions stay integral.
UNITS = [
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("km", "m", 1000),
    ("m", "cm", 100),
    ("kg", "g", 1000),
    ("dollars", "cents", 100),
    ("dozens", "items", 12),
    ("years", "months", 12),
    ("feet", "inches", 12),
    ("yards", "feet", 3),
]


@dataclass(frozen=True)
class TaskFamily:
    """A generator of verifiable items. `sample(rng, difficulty)` returns (prompt, answer, think)."""

    name: str
    sample: Callable[[random.Random, int], tuple[str, str, str]]
    reward: str
    description: str
    max_difficulty: int = 3
    tags: tuple[str, ...] = field(default_factory=tuple)


def _max_value(difficulty: int) -> int:
    return {1: 20, 2: 99, 3: 999}.get(difficulty, 10 ** min(difficulty, 6) - 1)


def _arithmetic(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    num_terms = rng.randint(2, 2 + difficulty)
    hi = _max_value(difficulty)
    ops = ["+", "-"] + (["*"] if difficulty >= 3 else [])
    terms = [rng.randint(1, hi)]
    expr, steps, value = str(terms[0]), [], terms[0]
    for _ in range(num_terms - 1):
        op = rng.choice(ops)
        # keep products small so the answer stays a few digits
        term = rng.randint(2, 9) if op == "*" else rng.randint(1, hi)
        new = {"+": value + term, "-": value - term, "*": value * term}[op]
        steps.append(f"{value} {op} {term} = {new}")
        # left-to-right evaluation must equal the written expression: parenthesise before a product
        expr = f"({expr}) {op} {term}" if op == "*" and " " in expr else f"{expr} {op} {term}"
        value = new
    return f"What is {expr}?", str(value), "\n".join(steps)


def _word_problem(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    hi = _max_value(difficulty)
    a = rng.randint(2, hi)
    kind = rng.randrange(4 if difficulty >= 2 else 3)
    if kind == 0:
        b = rng.randint(1, hi)
        return (f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
                str(a + b), f"{a} + {b} = {a + b}")
    if kind == 1:
        b = rng.randint(1, a)
        return (f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
                str(a - b), f"{a} - {b} = {a - b}")
    if kind == 2:
        b, c = rng.randint(1, hi), rng.randint(1, a)
        return (f"{name} has {a} {item}, buys {b} more and loses {c}. How many {item} does {name} have?",
                str(a + b - c), f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}")
    b = rng.randint(2, 9)
    return (f"{name} has {b} boxes with {a} {item} in each box. How many {item} is that?",
            str(a * b), f"{b} * {a} = {a * b}")


def _count_letters(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    alphabet = LETTERS[: 3 + 2 * difficulty]
    word = "".join(rng.choice(alphabet) for _ in range(rng.randint(3 + difficulty, 4 + 2 * difficulty)))
    letter = rng.choice(word) if rng.random() < 0.9 else rng.choice(alphabet)
    count, lines = 0, []
    for ch in word:
        if ch == letter:
            count += 1
        lines.append(f"{ch} {count}" if ch == letter else ch)
    think = " ".join(lines) + f"\nSo {letter} appears {count} times."
    return f'How many times does the letter "{letter}" appear in "{word}"?', str(count), think


def _count_items(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    n = rng.randint(2 + difficulty, 3 + 2 * difficulty)
    pool = NOUNS[: 4 + 2 * difficulty]
    items = [rng.choice(pool) for _ in range(n)]
    if rng.random() < 0.5:
        numbered = ", ".join(f"{w} {i}" for i, w in enumerate(items, 1))
        return f"How many words are in this list: {', '.join(items)}?", str(n), f"{numbered}\nSo there are {n}."
    target = rng.choice(items)
    count, marks = 0, []
    for w in items:
        count += w == target
        marks.append(f"{w} {count}" if w == target else w)
    think = ", ".join(marks) + f"\nSo {target} appears {count} times."
    return f"How many times does {target} appear in: {', '.join(items)}?", str(count), think


def _sort(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    hi = _max_value(difficulty + 1) if difficulty > 1 else 50
    nums = [rng.randint(1, hi) for _ in range(rng.randint(3, 3 + difficulty))]
    descending = rng.random() < 0.5
    ordered = sorted(nums, reverse=descending)
    answer = ", ".join(map(str, ordered))
    word = "largest" if descending else "smallest"
    order = "descending" if descending else "ascending"
    think = f"Take the {word} first: " + " then ".join(map(str, ordered)) + "."
    return f"Sort in {order} order: {', '.join(map(str, nums))}.", answer, think


def _convert(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    big, small, factor = rng.choice(UNITS)
    one = f"1 {big[:-1] if big.endswith('s') else big} is {factor} {small}."
    n = rng.randint(1, 30 if difficulty == 1 else _max_value(difficulty))
    kind = rng.randrange(3)
    if kind == 0:
        return f"How many {small} are in {n} {big}?", str(n * factor), f"{one}\n{n} * {factor} = {n * factor}"
    if kind == 1:
        return f"How many {big} are {n * factor} {small}?", str(n), f"{one}\n{n * factor} / {factor} = {n}"
    # two steps: "2 hours and 15 minutes" in minutes
    rest = rng.randint(1, factor - 1)
    total = n * factor + rest
    return (f"How many {small} are in {n} {big} and {rest} {small}?", str(total),
            f"{one}\n{n} * {factor} = {n * factor}\n{n * factor} + {rest} = {total}")


def _compare(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    nums = rng.sample(range(1, _max_value(difficulty + 1) + 1), rng.randint(3, 3 + difficulty))
    largest = rng.random() < 0.5
    best, word = (max(nums), "largest") if largest else (min(nums), "smallest")
    steps, cur = [], nums[0]
    for x in nums[1:]:
        cur = max(cur, x) if largest else min(cur, x)
        steps.append(str(cur))
    think = f"Keep the {word} so far: {nums[0]}, " + ", ".join(steps) + "."
    return f"Which number is the {word}: {', '.join(map(str, nums))}?", str(best), think


# ---- reasoning-gym adapters -------------------------------------------------------------------------------

# Difficulty knob -> reasoning-gym config kwargs, for the adapters we ship by name.
RG_DIFFICULTY: dict[str, Callable[[int], dict]] = {
    "basic_arithmetic": lambda d: {"min_terms": 2, "max_terms": 1 + d, "min_digits": 1, "max_digits": d,
                                   "operators": ("+", "-") if d == 1 else ("+", "-", "*"),
                                   "allow_parentheses": d > 1, "allow_negation": d > 1},
    "gsm_symbolic": lambda d: {},  # reasoning-gym 0.1.25 supports only its difficulty 1.0
}
RG_SIZE = 10**7  # reasoning-gym items are generated per index, so a huge virtual size costs nothing


@functools.lru_cache(maxsize=16)
def _rg_dataset(task: str, difficulty: int):
    import reasoning_gym  # lazy: loading its templates takes ~1.5 s for gsm_symbolic

    kwargs = RG_DIFFICULTY.get(task, lambda d: {})(difficulty)
    try:
        return reasoning_gym.create_dataset(task, size=RG_SIZE, seed=0, **kwargs)
    except (KeyError, ValueError, AssertionError) as exc:
        raise ValueError(f"family 'rg:{task}': reasoning-gym has no task {task!r} ({exc})") from exc


def _is_number(text: str) -> bool:
    try:
        float(text.replace(",", ""))
    except ValueError:
        return False
    return True


def _rg_think(item: dict) -> str:
    meta = item.get("metadata", {})
    cot = meta.get("answer_cot")
    if cot:  # gsm_symbolic ends its trace with "#### <answer>"; the boxed line replaces it
        return "\n".join(line for line in cot.strip().splitlines() if not line.startswith("####")).strip()
    if "expression" in meta:
        return f"{meta['expression']} = {item['answer']}"
    return f"Working it through gives {item['answer']}."


def rg_family(task: str) -> TaskFamily:
    """An adapter that draws items from reasoning-gym's `task` generator (offline)."""

    def sample(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
        item = _rg_dataset(task, difficulty)[rng.randrange(RG_SIZE)]
        return item["question"], str(item["answer"]), _rg_think(item)

    # math_reward for numeric answers is decided per row in make_tasks; this is the family default
    return TaskFamily(f"rg:{task}", sample, "math_reward", f"reasoning-gym {task}", max_difficulty=5, tags=("rg",))


FAMILIES: dict[str, TaskFamily] = {
    f.name: f
    for f in [
        TaskFamily("arithmetic", _arithmetic, "math_reward", "multi-step + and - (and * at difficulty 3)"),
        TaskFamily("word_problem", _word_problem, "math_reward", "templated one/two-step word problems"),
        TaskFamily("count_letters", _count_letters, "math_reward", "occurrences of a letter in a string"),
        TaskFamily("count_items", _count_items, "math_reward", "length of a list or occurrences of a word"),
        TaskFamily("sort", _sort, "exact_match_reward", "sort numbers ascending or descending"),
        TaskFamily("convert", _convert, "math_reward", "unit conversion with integer results"),
        TaskFamily("compare", _compare, "math_reward", "largest or smallest of a list"),
        rg_family("basic_arithmetic"),
        rg_family("gsm_symbolic"),
    ]
}
# Our own families: the default mixture (the reasoning-gym ones are too hard for the tiny models).
DEFAULT_FAMILIES = [name for name, f in FAMILIES.items() if "rg" not in f.tags]


def get_family(name: str) -> TaskFamily:
    if name in FAMILIES:
        return FAMILIES[name]
    if name.startswith("rg:"):
        return rg_family(name[3:])
    raise ValueError(f"families: unknown task family {name!r}; choose from {sorted(FAMILIES)} or 'rg:<task>'")


def split_of(prompt: str) -> str:
    """The split a prompt belongs to, fixed forever by a hash of its text."""
    bucket = int.from_bytes(hashlib.sha256(prompt.encode()).digest()[:8], "big") % 100
    return "test" if bucket < TEST_PERCENT else "train"


def prompt_id(prompt: str) -> str:
    """A stable short id for a prompt (used to resume generation without duplicates)."""
    return hashlib.sha256(prompt.encode()).hexdigest()[:16]


def _difficulty_for(name: str, difficulty: int | dict[str, int]) -> int:
    d = difficulty.get(name, 1) if isinstance(difficulty, dict) else difficulty
    if not isinstance(d, int) or d < 1:
        raise ValueError(f"difficulty for {name!r} must be an int >= 1, got {d!r}")
    return d


def make_tasks(
    families: list[str] | None = None,
    num: int = 1000,
    split: str = "train",
    seed: int = 0,
    difficulty: int | dict[str, int] = 1,
) -> list[dict]:
    """`num` rows drawn round-robin from `families` (default: all our own), only prompts of `split`.

    Deterministic under `seed`; prompts are unique within the result. `difficulty` is one int for all
    families or a {family: int} dict (missing families get 1).
    """
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    if num < 0:
        raise ValueError(f"num must be >= 0, got {num}")
    names = list(families) if families else list(DEFAULT_FAMILIES)
    fams = [get_family(n) for n in names]
    levels = [_difficulty_for(n, difficulty) for n in names]
    # One rng per family so adding a family does not change the items of the others.
    rngs = [random.Random(f"{seed}:{n}") for n in names]
    rows: list[dict] = []
    seen: set[str] = set()
    while len(rows) < num:
        k = len(rows) % len(fams)  # round-robin over accepted rows: families stay balanced
        # test is ~10% of the space, so ~10 misses per hit is normal; thousands mean the space is exhausted
        for _ in range(5000):
            prompt, answer, think = fams[k].sample(rngs[k], levels[k])
            if split_of(prompt) == split and prompt not in seen:
                break
        else:
            raise ValueError(f"family {names[k]!r} at difficulty {levels[k]} has too few distinct {split} "
                             f"prompts for num={num}; ask for fewer rows or raise its difficulty")
        seen.add(prompt)
        reward = fams[k].reward
        if "rg" in fams[k].tags and not _is_number(answer):
            reward = "exact_match_reward"
        rows.append({"prompt": prompt, "answer": answer, "family": names[k], "think": think, "reward": reward})
    return rows


def assistant_text(row: dict, mode: str = "think") -> str:
    """The assistant target text of the shared convention."""
    if mode == "think":
        return f"<think>\n{row['think']}\n</think>\nThe answer is \\boxed{{{row['answer']}}}."
    if mode == "no_think":
        return f"The answer is \\boxed{{{row['answer']}}}."
    raise ValueError(f"mode must be 'think' or 'no_think', got {mode!r}")


def prompt_messages(row: dict, mode: str = "think") -> list[dict]:
    """System flag + user question: the conversational prompt for GRPO / preference generation."""
    if mode not in ("think", "no_think"):
        raise ValueError(f"mode must be 'think' or 'no_think', got {mode!r}")
    return [{"role": "system", "content": f"/{mode}"}, {"role": "user", "content": row["prompt"]}]


def to_messages(row: dict, mode: str = "think") -> list[dict]:
    """System flag, user question and the assistant target: one SFT conversation."""
    return prompt_messages(row, mode) + [{"role": "assistant", "content": assistant_text(row, mode)}]


def to_pretrain_text(row: dict) -> str:
    """Plain-text form for pretraining / mid-training (no chat template)."""
    think = " ".join(line.strip() for line in row["think"].splitlines() if line.strip())
    return f"Question: {row['prompt']}\nAnswer: {think} The answer is \\boxed{{{row['answer']}}}."


def _mode_of(row: dict, mode: str, seed: int) -> str:
    if mode == "mixed":  # half think, half no_think, fixed per prompt and seed
        return "think" if int(prompt_id(f"{seed}:{row['prompt']}"), 16) % 2 == 0 else "no_think"
    return mode


def tasks_dataset(
    split: str | None = "train",
    families: list[str] | str | None = None,
    num: int = 1000,
    seed: int = 0,
    difficulty: int | dict[str, int] = 1,
    mode: str = "think",
):
    """`builtin:tasks` source: task rows + `messages` (SFT) + `prompt_messages` (GRPO / pair generation)."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(families, str):
        families = [f.strip() for f in families.split(",") if f.strip()]
    rows = make_tasks(families, num=num, split=split or "train", seed=seed, difficulty=difficulty)
    for row in rows:
        m = _mode_of(row, mode, seed)
        row["messages"] = to_messages(row, m)
        row["prompt_messages"] = prompt_messages(row, m)
    return datasets.Dataset.from_list(rows)


register_builtin("tasks", tasks_dataset)
