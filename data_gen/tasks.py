"""Verifiable synthetic tasks: the tiny world's questions with gold answers and the reward that checks them.

Why: SFT, preference generation, GRPO and evaluation all need prompts whose answers a program can check.
These families are written for tiny models (a ~4k BPE vocab, 3-12M params): short prompts, a small
vocabulary, integer answers, and a short worked `think` trace a model can imitate after a few minutes of
CPU training. Adapters map reasoning-gym generators (gsm_symbolic, basic_arithmetic, any `rg:<task>`) onto
the same row shape for larger models.

Row shape (shared convention): {"prompt", "answer", "family", "think", "reward"}; `reward` is a key of
`rewards.REWARDS` ("math_reward" for numbers, "exact_match_reward" for strings/lists).

Splits are decided by the problem, never by the wording: each family defines its canonical problem (what stays
when names, items, the letter asked about, direction and order are stripped: `TaskFamily.canonical`), and a hash
of the family and that problem puts it in `train` (70%), `validation` (10%: the stages' own held-out sets, early
stopping), `dev` (10%: the eval suite's, every choice between models: stage targets, ablations) or `test` (10%:
sealed, evaluated once at the end of a chain). The buckets are fixed (`SPLIT_BUCKETS`), so no problem of one split
appears in another, whatever the seed, the number of rows, the difficulty or the words; the stages' held-out sets
(validation) and the eval suite's (dev) never share a problem either.
`problem_space(family, difficulty)` says how many distinct problems a family has (below `SMALL_SPACE`: small).

How to use:
    from data_gen.tasks import make_tasks, to_messages
    rows = make_tasks(["arithmetic", "sort"], num=100, split="dev", seed=0, difficulty=1)
    to_messages(rows[0], mode="no_think")
    canonical_problem("arithmetic", "What is 5 + 3?")       # '+3+5': the same problem as "What is 3 + 5?"
    # as a dataset source (importing this module registers it with align.data.loading by name):
    align.data.loading.load_source("builtin:tasks", split="train", num=2000, mode="mixed")
"""

from __future__ import annotations

import functools
import hashlib
import random
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import datasets

from align.data.decontamination import register_problems
from align.data.sources import register_builtin

SPLITS = ("train", "validation", "dev", "test")
# Buckets (of 100) of the hash of (family, canonical problem) each split owns. Fixed: moving a bucket would move
# problems between splits and void every result measured on them.
SPLIT_BUCKETS = {"test": range(0, 10), "dev": range(10, 20), "validation": range(20, 30), "train": range(30, 100)}
# A family with fewer distinct problems than this at a difficulty is small: its test split holds under 100, and a
# training set of a few thousand rows repeats each of its training problems.
SMALL_SPACE = 1000
MODES = ("think", "no_think", "mixed")

NAMES = ["Tom", "Ann", "Sam", "Mia", "Ben", "Eva", "Max", "Zoe", "Leo", "Ivy"]
ITEMS = ["apples", "pens", "books", "cups", "eggs", "stamps", "cards", "shells", "coins", "balls"]
NOUNS = ["cat", "dog", "sun", "cup", "hat", "pen", "box", "egg", "car", "bed", "map", "fox"]
LETTERS = "abcdefghij"
# (big unit, small unit, factor): 1 big = factor small; all conversions stay integral. Every name is one word.
UNITS = [
    ("hours", "minutes", 60),
    ("minutes", "seconds", 60),
    ("days", "hours", 24),
    ("weeks", "days", 7),
    ("km", "m", 1000),
    ("m", "cm", 100),
    ("cm", "mm", 10),
    ("kg", "g", 1000),
    ("liters", "milliliters", 1000),
    ("pounds", "ounces", 16),
    ("gallons", "quarts", 4),
    ("dollars", "cents", 100),
    ("dozens", "items", 12),
    ("years", "months", 12),
    ("decades", "years", 10),
    ("centuries", "years", 100),
    ("feet", "inches", 12),
    ("yards", "feet", 3),
]
FACTORS = {(big, small): factor for big, small, factor in UNITS}
# Plurals that do not end in a plain "s" (the rest drop it: "hours" -> "hour"; "km" stays "km").
SINGULAR = {"feet": "foot", "centuries": "century"}


@dataclass(frozen=True)
class TaskFamily:
    """A generator of verifiable items. `sample(rng, difficulty)` returns (prompt, answer, think);
    `canonical(prompt)` returns the item's canonical problem (a string: what stays when names, items, the letter
    asked about, direction and order are stripped), or None for a prompt not in the family's form."""

    name: str
    sample: Callable[[random.Random, int], tuple[str, str, str]]
    reward: str
    description: str
    canonical: Callable[[str], str | None]
    max_difficulty: int = 3
    tags: tuple[str, ...] = field(default_factory=tuple)


def _max_value(difficulty: int) -> int:
    return {1: 20, 2: 99, 3: 999}.get(difficulty, 10 ** min(difficulty, 6) - 1)


def _numbers(text: str) -> list[int]:
    return [int(x) for x in text.split(", ")]


def _sorted_numbers(text: str) -> str:
    return ",".join(map(str, sorted(_numbers(text))))


# ---- arithmetic ----------------------------------------------------------------------------------------------


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


_EXPRESSION = re.compile(r"What is ([0-9+\-*() ]+)\?")
_MAX_TOKENS, _MAX_DEPTH = 200, 20


def expression_form(expr: str) -> str | None:
    """An expression of + - * and parentheses in a form that forgets the order of terms and factors:
    "3 + 5 - 2" and "5 - 2 + 3" give "+3+5-2", "(4 + 1) * 2" and "2 * (1 + 4)" give "+(+1+4)*2". A parenthesised
    sum standing alone as a term joins the sum around it. None when it does not parse. One pass over the tokens."""
    tokens = re.findall(r"\d+|[-+*()]|\S", expr)
    if not tokens or len(tokens) > _MAX_TOKENS:
        return None
    pos = 0

    def total(depth: int) -> list[str] | None:  # sum := term (('+' | '-') term)*  ->  its signed terms
        nonlocal pos
        terms, sign = [], "+"
        while True:
            factors = product(depth)
            if factors is None:
                return None
            if len(factors) == 1 and isinstance(factors[0], list):  # (a + b) alone: its terms join this sum
                flip = {"+": "+", "-": "-"} if sign == "+" else {"+": "-", "-": "+"}
                terms += [flip[t[0]] + t[1:] for t in factors[0]]
            else:
                terms.append(
                    sign
                    + "*".join(sorted(f if isinstance(f, str) else "(" + "".join(sorted(f)) + ")" for f in factors))
                )
            if pos < len(tokens) and tokens[pos] in "+-":
                sign, pos = tokens[pos], pos + 1
                continue
            return terms

    def product(depth: int) -> list | None:  # term := factor ('*' factor)*
        nonlocal pos
        factors = [factor(depth)]
        while factors[-1] is not None and pos < len(tokens) and tokens[pos] == "*":
            pos += 1
            factors.append(factor(depth))
        return None if factors[-1] is None else factors

    def factor(depth: int):  # factor := number | '(' sum ')'
        nonlocal pos
        if pos >= len(tokens):
            return None
        tok = tokens[pos]
        pos += 1
        if tok.isdigit():
            return str(int(tok))
        if tok != "(" or depth >= _MAX_DEPTH:
            return None
        inner = total(depth + 1)
        if inner is None or pos >= len(tokens) or tokens[pos] != ")":
            return None
        pos += 1
        return inner

    terms = total(0)
    return "".join(sorted(terms)) if terms is not None and pos == len(tokens) else None


def _arithmetic_problem(prompt: str) -> str | None:
    m = _EXPRESSION.fullmatch(prompt)
    return expression_form(m.group(1)) if m else None


# ---- word problems -------------------------------------------------------------------------------------------


def _word_problem(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    name, item = rng.choice(NAMES), rng.choice(ITEMS)
    hi = _max_value(difficulty)
    # one-step problems draw from at least 2..50: 2..20 holds only a few hundred distinct problems
    one_step = max(hi, 50)
    kind = rng.randrange(4 if difficulty >= 2 else 3)
    if kind == 0:
        a, b = rng.randint(2, one_step), rng.randint(1, one_step)
        return (
            f"{name} has {a} {item} and gets {b} more. How many {item} does {name} have now?",
            str(a + b),
            f"{a} + {b} = {a + b}",
        )
    if kind == 1:
        a = rng.randint(2, one_step)
        b = rng.randint(1, a)
        return (
            f"{name} has {a} {item} and gives away {b}. How many {item} are left?",
            str(a - b),
            f"{a} - {b} = {a - b}",
        )
    a = rng.randint(2, hi)
    if kind == 2:
        b, c = rng.randint(1, hi), rng.randint(1, a)
        return (
            f"{name} has {a} {item}, buys {b} more and loses {c}. How many {item} does {name} have?",
            str(a + b - c),
            f"{a} + {b} = {a + b}\n{a + b} - {c} = {a + b - c}",
        )
    b = rng.randint(2, 9)
    return (
        f"{name} has {b} boxes with {a} {item} in each box. How many {item} is that?",
        str(a * b),
        f"{b} * {a} = {a * b}",
    )


# Each form -> its problem from the numbers (names and items left out; a sum or product forgets its order).
_WORD_FORMS = [
    (
        re.compile(r"\w+ has (\d+) \w+ and gets (\d+) more\. How many \w+ does \w+ have now\?"),
        lambda a, b: "a+b:" + ",".join(sorted([a, b], key=int)),
    ),
    (re.compile(r"\w+ has (\d+) \w+ and gives away (\d+)\. How many \w+ are left\?"), lambda a, b: f"a-b:{a},{b}"),
    (
        re.compile(r"\w+ has (\d+) \w+, buys (\d+) more and loses (\d+)\. How many \w+ does \w+ have\?"),
        lambda a, b, c: "a+b-c:" + ",".join(sorted([a, b], key=int)) + f",{c}",
    ),
    (
        re.compile(r"\w+ has (\d+) boxes with (\d+) \w+ in each box\. How many \w+ is that\?"),
        lambda b, a: "a*b:" + ",".join(sorted([a, b], key=int)),
    ),
]


def _word_problem_problem(prompt: str) -> str | None:
    for form, problem in _WORD_FORMS:
        m = form.fullmatch(prompt)
        if m:
            return problem(*(str(int(g)) for g in m.groups()))
    return None


# ---- counting ------------------------------------------------------------------------------------------------


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


_LETTER_FORM = re.compile(r'How many times does the letter "\w" appear in "(\w+)"\?')


def letters_problem(prompt: str) -> str | None:
    """The string a letter is counted in (the letter asked about left out): one problem per string."""
    m = _LETTER_FORM.fullmatch(prompt)
    return m.group(1) if m else None


def _count_items(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    n = rng.randint(2 + difficulty, 3 + 2 * difficulty)
    # 8 words at difficulty 1 (6 gave 434 distinct lists, order left out), 2 more a level
    pool = NOUNS[: 6 + 2 * difficulty]
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


_LIST_FORMS = [
    re.compile(r"How many words are in this list: (\w+(?:, \w+)*)\?"),
    re.compile(r"How many times does \w+ appear in: (\w+(?:, \w+)*)\?"),
]


def _count_items_problem(prompt: str) -> str | None:
    """The list as a multiset (its order, the word asked about and the question asked left out)."""
    for form in _LIST_FORMS:
        m = form.fullmatch(prompt)
        if m:
            return ",".join(sorted(m.group(1).split(", ")))
    return None


# ---- numbers -------------------------------------------------------------------------------------------------


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


_SORT_FORM = re.compile(r"Sort in (?:ascending|descending) order: (\d+(?:, \d+)*)\.")


def _sort_problem(prompt: str) -> str | None:
    """The numbers as a multiset (their order and the direction asked left out)."""
    m = _SORT_FORM.fullmatch(prompt)
    return _sorted_numbers(m.group(1)) if m else None


def _singular(unit: str) -> str:
    return SINGULAR.get(unit, unit[:-1] if unit.endswith("s") else unit)


def _convert(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
    big, small, factor = rng.choice(UNITS)
    one = f"1 {_singular(big)} is {factor} {small}."
    # 1..60 at difficulty 1 (1..30 over 12 units gave 360 distinct simple conversions, direction left out)
    n = rng.randint(1, 60 if difficulty == 1 else _max_value(difficulty))
    kind = rng.randrange(3)
    if kind == 0:
        return f"How many {small} are in {n} {big}?", str(n * factor), f"{one}\n{n} * {factor} = {n * factor}"
    if kind == 1:
        return f"How many {big} are {n * factor} {small}?", str(n), f"{one}\n{n * factor} / {factor} = {n}"
    # two steps: "2 hours and 15 minutes" in minutes
    rest = rng.randint(1, factor - 1)
    total = n * factor + rest
    return (
        f"How many {small} are in {n} {big} and {rest} {small}?",
        str(total),
        f"{one}\n{n} * {factor} = {n * factor}\n{n * factor} + {rest} = {total}",
    )


_CONVERT_FORMS = (
    re.compile(r"How many (\w+) are in (\d+) (\w+) and (\d+) (\w+)\?"),
    re.compile(r"How many (\w+) are in (\d+) (\w+)\?"),
    re.compile(r"How many (\w+) are (\d+) (\w+)\?"),
)


def _convert_problem(prompt: str) -> str | None:
    """(units, how many of the big unit[, the rest]): a conversion and the same one asked the other way are one."""
    m = _CONVERT_FORMS[0].fullmatch(prompt)
    if m and m.group(1) == m.group(5) and (m.group(3), m.group(1)) in FACTORS:
        return f"{m.group(3)}>{m.group(1)}:{int(m.group(2))}+{int(m.group(4))}"
    m = _CONVERT_FORMS[1].fullmatch(prompt)
    if m and (m.group(3), m.group(1)) in FACTORS:
        return f"{m.group(3)}>{m.group(1)}:{int(m.group(2))}"
    m = _CONVERT_FORMS[2].fullmatch(prompt)
    factor = FACTORS.get((m.group(1), m.group(3))) if m else None
    if factor and int(m.group(2)) % factor == 0:
        return f"{m.group(1)}>{m.group(3)}:{int(m.group(2)) // factor}"
    return None


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


_COMPARE_FORM = re.compile(r"Which number is the (?:largest|smallest): (\d+(?:, \d+)*)\?")


def _compare_problem(prompt: str) -> str | None:
    """The numbers as a set (their order and max or min left out)."""
    m = _COMPARE_FORM.fullmatch(prompt)
    return _sorted_numbers(m.group(1)) if m else None


# ---- reasoning-gym adapters -------------------------------------------------------------------------------

# Difficulty knob -> reasoning-gym config kwargs, for the adapters we ship by name.
RG_DIFFICULTY: dict[str, Callable[[int], dict]] = {
    "basic_arithmetic": lambda d: {
        "min_terms": 2,
        "max_terms": 1 + d,
        "min_digits": 1,
        "max_digits": d,
        "operators": ("+", "-") if d == 1 else ("+", "-", "*"),
        "allow_parentheses": d > 1,
        "allow_negation": d > 1,
    },
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


_RG_TOKEN = re.compile(r"\d+(?:[.,]\d+)*|[-+*/^%()=]")


def numbers_problem(question: str) -> str | None:
    """A free-form question's numbers and operator signs in order, its words (names, items, units) left out; None
    with fewer than two numbers (then the words are the problem). The problem of a reasoning-gym item."""
    tokens = _RG_TOKEN.findall(question)
    if sum(t[0].isdigit() for t in tokens) < 2:
        return None
    return " ".join(tokens)


def rg_family(task: str) -> TaskFamily:
    """An adapter that draws items from reasoning-gym's `task` generator (offline)."""

    def sample(rng: random.Random, difficulty: int) -> tuple[str, str, str]:
        item = _rg_dataset(task, difficulty)[rng.randrange(RG_SIZE)]
        return item["question"], str(item["answer"]), _rg_think(item)

    # math_reward for numeric answers is decided per row in make_tasks; this is the family default
    return TaskFamily(
        f"rg:{task}", sample, "math_reward", f"reasoning-gym {task}", numbers_problem, max_difficulty=5, tags=("rg",)
    )


FAMILIES: dict[str, TaskFamily] = {
    f.name: f
    for f in [
        TaskFamily(
            "arithmetic", _arithmetic, "math_reward", "multi-step + and - (and * at difficulty 3)", _arithmetic_problem
        ),
        TaskFamily(
            "word_problem", _word_problem, "math_reward", "templated one/two-step word problems", _word_problem_problem
        ),
        TaskFamily(
            "count_letters", _count_letters, "math_reward", "occurrences of a letter in a string", letters_problem
        ),
        TaskFamily(
            "count_items",
            _count_items,
            "math_reward",
            "length of a list or occurrences of a word",
            _count_items_problem,
        ),
        TaskFamily("sort", _sort, "exact_match_reward", "sort numbers ascending or descending", _sort_problem),
        TaskFamily("convert", _convert, "math_reward", "unit conversion with integer results", _convert_problem),
        TaskFamily("compare", _compare, "math_reward", "largest or smallest of a list", _compare_problem),
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


# ---- problems and splits -------------------------------------------------------------------------------------


def canonical_problem(family: str, prompt: str) -> str | None:
    """The canonical problem of `prompt` as an item of `family` (ours or rg:<task>), or None when the family is
    unknown or the prompt is not in its form."""
    if family in FAMILIES:
        return FAMILIES[family].canonical(prompt)
    return numbers_problem(prompt) if family.startswith("rg:") else None


def normalized_text(text: str) -> str:
    """Lowercase, whitespace collapsed: the problem of an item whose family defines none for it."""
    return " ".join(text.lower().split())


def problem_key(family: str, prompt: str) -> str:
    """What the split hashes: the canonical problem, or the normalised prompt where the family defines none."""
    problem = canonical_problem(family, prompt)
    return problem if problem is not None else "text:" + normalized_text(prompt)


def split_for(family: str, problem: str, buckets: dict[str, range] = SPLIT_BUCKETS) -> str:
    """The split that owns (family, problem): a hash of both, read against fixed buckets of 100."""
    bucket = int.from_bytes(hashlib.sha256(f"{family}\n{problem}".encode()).digest()[:8], "big") % 100
    return next(name for name, owned in buckets.items() if bucket in owned)


def split_of(family: str, prompt: str) -> str:
    """The split an item of `family` belongs to, fixed forever by its problem (never by its wording)."""
    return split_for(family, problem_key(family, prompt))


@functools.lru_cache(maxsize=256)
def problem_space(family: str, difficulty: int = 1, draws: int | None = None) -> int:
    """How many distinct canonical problems `family` has at `difficulty`: estimated from `draws` samples (default
    20,000; 2,000 for reasoning-gym, whose items cost ~2 ms each) by Chao1 (the problems seen, plus
    f1 (f1 - 1) / (2 (f2 + 1)) for those drawn once, f1, and twice, f2); exact once every problem was drawn at
    least twice. Below SMALL_SPACE a family is small."""
    fam = get_family(family)
    rng = random.Random(f"space:{family}:{difficulty}")
    draws = draws or (2_000 if "rg" in fam.tags else 20_000)
    seen = Counter(problem_key(family, fam.sample(rng, difficulty)[0]) for _ in range(draws))
    once = sum(c == 1 for c in seen.values())
    twice = sum(c == 2 for c in seen.values())
    return len(seen) + once * (once - 1) // (2 * (twice + 1))


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
    exclude: set[tuple[str, str]] | frozenset = frozenset(),
) -> list[dict]:
    """`num` rows drawn round-robin from `families` (default: all our own), only problems of `split` (train,
    validation, dev or test), none of the (family, problem key) pairs in `exclude`.

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
        # dev and test are ~10% of the space each, so ~10 misses per hit is normal; thousands mean it is exhausted
        for _ in range(5000):
            prompt, answer, think = fams[k].sample(rngs[k], levels[k])
            if prompt in seen:
                continue
            key = problem_key(names[k], prompt)
            if split_for(names[k], key) == split and (names[k], key) not in exclude:
                break
        else:
            raise ValueError(
                f"family {names[k]!r} at difficulty {levels[k]} has too few distinct {split} "
                f"prompts for num={num}; ask for fewer rows or raise its difficulty"
            )
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


def _families(families: list[str] | str | None) -> list[str] | None:
    if isinstance(families, str):
        return [f.strip() for f in families.split(",") if f.strip()]
    return families


# The arguments of builtin:tasks that decide which problems its rows hold (`mode` only formats them).
PROBLEM_ARGS = ("families", "num", "seed", "difficulty")


def training_problems(args: dict | list[dict] | None) -> set[tuple[str, str]]:
    """The (family, problem key) pairs of the training rows that builtin:tasks makes with each of `args` (its
    `dataset_args`: families, num, seed, difficulty; other keys, such as mode, do not change the problems)."""
    out: set[tuple[str, str]] = set()
    for i, one in enumerate([args] if isinstance(args, dict) else list(args or [])):
        if not isinstance(one, dict):
            raise ValueError(
                f"exclude_problems_of[{i}] must be a mapping of builtin:tasks arguments (the other "
                f"stage's dataset_args, e.g. {{num: 6000, seed: 0}}), got {one!r}"
            )
        kept = {k: v for k, v in one.items() if k in PROBLEM_ARGS}
        kept["families"] = _families(kept.get("families"))
        out |= {(r["family"], problem_key(r["family"], r["prompt"])) for r in make_tasks(**kept, split="train")}
    return out


def tasks_dataset(
    split: str | None = "train",
    families: list[str] | str | None = None,
    num: int = 1000,
    seed: int = 0,
    difficulty: int | dict[str, int] = 1,
    mode: str = "think",
    exclude_problems_of: dict | list[dict] | None = None,
):
    """`builtin:tasks` source: task rows + `messages` (SFT) + `prompt_messages` (GRPO / pair generation).

    `exclude_problems_of`: the `dataset_args` of other builtin:tasks training sets (another stage's) whose problems
    this set's training rows must not share: GRPO's prompts drawn apart from SFT's, by problem, still `num` of them.
    Only the train split is drawn apart; the held-out splits share no problem with any training set anyway."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    families = _families(families)
    split = split or "train"
    exclude = training_problems(exclude_problems_of) if split == "train" else frozenset()
    rows = make_tasks(families, num=num, split=split, seed=seed, difficulty=difficulty, exclude=exclude)
    for row in rows:
        m = _mode_of(row, mode, seed)
        row["messages"] = to_messages(row, m)
        row["prompt_messages"] = prompt_messages(row, m)
    return datasets.Dataset.from_list(rows)


register_builtin("tasks", tasks_dataset)
register_problems(canonical_problem, by_form=DEFAULT_FAMILIES)
