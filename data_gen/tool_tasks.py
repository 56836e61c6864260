"""Task families where a tool is the way to the answer, and tool-use SFT traces (`builtin:tool_tasks`).

A 135M model cannot do these in its head; with the right call they are one step:
- `tool_arithmetic`: a product or sum of 4-6 digit numbers -> `calculator`;
- `tool_count`: how many times a letter occurs in a 60-120 character string -> `python` (`print(s.count("a"))`);
- `tool_lookup`: a number from an offline table of made-up places (no model has seen them) -> `search`;
- `tool_difference` (two turns of calls): one place's number minus another's -> `search` twice in one turn, then
  `calculator` on the two replies: a chain where the second call needs what the first ones returned.
Rows have the `builtin:tasks` shape (prompt, answer, family, reward, think) plus `tools` (the tool names offered:
all three, so picking the right one is part of the task), `tool` and `call` (the right first tool and its call,
JSON), `calls` (every call, JSON: a list of turns, each a list of calls),
`prompt_messages` (system turn with the tools described, the mode flag, the question) and `messages`
(an SFT trace: the assistant's call, the tool's reply as a `tool` turn, the answer; the assistant-only loss mask
trains the calls and the answer, never the tool's reply). In think mode each family reasons in its own words (`PLANS`):
the first think block states the family's whole plan and each later turn opens differently, so no two families share
a turn opening that GRPO could pull one family's rollouts along (with one shared wording, GRPO drifted
tool_difference's second turn to the look-up's answer sentence, skipping the calculator).

    align.data.loading.load_source("builtin:tool_tasks", split="train", num=400, mode="mixed")
"""

from __future__ import annotations

import json
import random
import re
import string

from align.data.decontamination import register_problems
from align.data.sources import register_builtin
from align.tools.functions import FIELDS as _FIELDS
from align.tools.functions import TABLE, TOOLS, load_tools, search_documents  # noqa: F401  (the search tool's table)
from align.tools.loop import with_tools
from align.tools.parse import call_text
from data_gen.tasks import MODES, SPLITS, _mode_of, letters_problem, split_for

FAMILIES = {
    "tool_arithmetic": "calculator",
    "tool_count": "python",
    "tool_lookup": "search",
    "tool_difference": "search",
}  # the family's first tool
# Each family's think-mode words: the first turn's plan, each later turn's opening, the answer turn's sentence
# ({answer}).
PLANS = {
    "tool_arithmetic": (
        "Numbers this long are easy to get wrong by hand: one calculator call works it out.",
        (),
        "The calculator worked it out: {answer}.",
    ),
    "tool_count": (
        "Counting letters in a long string by eye is error-prone: one python call counts them.",
        (),
        "The python count printed {answer}.",
    ),
    "tool_lookup": (
        "This place's number is in the table: one search finds it, and its reply is the answer.",
        (),
        "The search reply lists it: {answer}.",
    ),
    "tool_difference": (
        "I need two numbers from the table: two searches now, then the calculator for their difference.",
        ("Both numbers are found: the calculator subtracts the second from the first.",),
        "The calculator gave the difference: {answer}.",
    ),
}
# A row of another family (a user's tool dataset, which has its own `think`): generic words.
_ANY_FAMILY = ("", ("Now I use the replies in the next call.",) * 8, "From the tool's reply, the answer is {answer}.")
# What `families` unset gives (the 135M tool chain's data); tool_difference, the harder chain, is asked for by name.
DEFAULT_FAMILIES = ["tool_arithmetic", "tool_count", "tool_lookup"]
# Buckets (of 100) of the hash of (family, canonical problem) each split owns, fixed. A fifth is test (not a tenth
# as in data_gen.tasks): tool_lookup has 240 places, and its sealed test set needs about 180 questions.
TOOL_SPLIT_BUCKETS = {"test": range(0, 20), "dev": range(20, 30), "validation": range(30, 40), "train": range(40, 100)}


def _arithmetic(rng: random.Random) -> tuple[str, str, str, dict]:
    a, b = rng.randint(1_000, 999_999), rng.randint(100, 99_999)
    op = rng.choice(["*", "+"])
    expr = f"{a} {op} {b}"
    q = f"What is {a} {'times' if op == '*' else 'plus'} {b}?"
    return q, str(a * b if op == "*" else a + b), "calculator", {"expression": expr}


def _count(rng: random.Random) -> tuple[str, str, str, dict]:
    letter = rng.choice(string.ascii_lowercase[:12])  # one of the string's letters: never a free 0
    s = "".join(rng.choice(string.ascii_lowercase[:12]) for _ in range(rng.randint(60, 120)))
    q = f'How many times does the letter "{letter}" appear in "{s}"?'
    return q, str(s.count(letter)), "python", {"code": f'print("{s}".count("{letter}"))'}


def _lookup(rng: random.Random) -> tuple[str, str, str, dict]:
    row, f = rng.choice(TABLE), rng.choice(_FIELDS)
    return f"What is the {f} of {row['name']}?", str(row[f]), "search", {"query": row["name"]}


_TOOL_SUM = re.compile(r"What is (\d+) (times|plus) (\d+)\?")
_FIELD = "|".join(re.escape(f) for f in _FIELDS)
_LOOKUP = re.compile(rf"What is the (?:{_FIELD}) of (\w+)\?")
_DIFFERENCE = re.compile(rf"What is the (?:{_FIELD}) of (\w+) minus the (?:{_FIELD}) of (\w+)\?")


def _arithmetic_problem(prompt: str) -> str | None:
    m = _TOOL_SUM.fullmatch(prompt)
    return f"{m.group(2)}:" + ",".join(sorted([m.group(1), m.group(3)], key=int)) if m else None


def _lookup_problem(prompt: str) -> str | None:
    """The place (every question about one place's row of the table is one problem)."""
    m = _LOOKUP.fullmatch(prompt)
    return m.group(1) if m else None


def _difference_problem(prompt: str) -> str | None:
    """The two places, in either order."""
    m = _DIFFERENCE.fullmatch(prompt)
    return ",".join(sorted(m.groups())) if m else None


# family -> its canonical problem of a prompt (what stays when the letter, the field asked and the order are left out)
PROBLEMS = {
    "tool_arithmetic": _arithmetic_problem,
    "tool_count": letters_problem,
    "tool_lookup": _lookup_problem,
    "tool_difference": _difference_problem,
}


def canonical_problem(family: str, prompt: str) -> str | None:
    """The canonical problem of a tool-task prompt of `family`, or None (another family, or not in its form)."""
    problem = PROBLEMS.get(family)
    return problem(prompt) if problem else None


def _difference(rng: random.Random) -> tuple[str, str, list[list[dict]]]:
    a, b = rng.sample(TABLE, 2)
    f = rng.choice(_FIELDS)
    q = f"What is the {f} of {a['name']} minus the {f} of {b['name']}?"
    turns = [
        [{"name": "search", "arguments": {"query": a["name"]}}, {"name": "search", "arguments": {"query": b["name"]}}],
        [{"name": "calculator", "arguments": {"expression": f"{a[f]} - {b[f]}"}}],
    ]
    return q, str(a[f] - b[f]), turns


def _one_call(maker):
    def make(rng: random.Random) -> tuple[str, str, list[list[dict]]]:
        q, answer, tool, args = maker(rng)
        return q, answer, [[{"name": tool, "arguments": args}]]

    return make


MAKERS = {
    "tool_arithmetic": _one_call(_arithmetic),
    "tool_count": _one_call(_count),
    "tool_lookup": _one_call(_lookup),
    "tool_difference": _difference,
}


def tool_reply(name: str, arguments: dict) -> str:
    """What the builtin tool answers (the SFT trace shows the real reply)."""
    return str(TOOLS[name](**arguments))


def split_of(family: str, prompt: str) -> str:
    """The split a tool-task prompt belongs to, fixed forever by its family and canonical problem."""
    return split_for(family, canonical_problem(family, prompt), TOOL_SPLIT_BUCKETS)


def make_tool_tasks(families=None, num: int = 300, split: str = "train", seed: int = 0) -> list[dict]:
    """`num` rows cycling over the families (unset: DEFAULT_FAMILIES), of one split (train, validation, dev or test:
    disjoint problems, TOOL_SPLIT_BUCKETS)."""
    families = list(families or DEFAULT_FAMILIES)
    unknown = sorted(set(families) - set(FAMILIES))
    if unknown:
        raise ValueError(f"unknown tool families {unknown}; choose from {sorted(FAMILIES)}")
    if split not in SPLITS:
        raise ValueError(f"split must be one of {SPLITS}, got {split!r}")
    rng = random.Random(f"{seed}:{split}")
    rows, seen, misses = [], set(), 0
    while len(rows) < num:
        fam = families[len(rows) % len(families)]
        q, answer, turns = MAKERS[fam](rng)
        if q in seen or split_of(fam, q) != split:
            misses += 1
            if misses > 50 * num + 5_000:  # tool_lookup has 4 questions per place of the table (960), no more
                raise ValueError(
                    f"builtin:tool_tasks has fewer than {num} distinct {split} prompts for "
                    f"{families} ({len(rows)} found); ask for fewer (num) or leave tool_lookup out"
                )
            continue
        seen.add(q)
        tool = turns[0][0]["name"]
        rows.append(
            {
                "prompt": q,
                "answer": answer,
                "family": fam,
                "reward": "math_reward",
                "tools": sorted(set(FAMILIES.values()) | {"calculator", "python"}),
                "tool": tool,
                "call": json.dumps(turns[0][0]),
                "calls": json.dumps(turns),
                "think": PLANS[fam][0],
            }
        )
    return rows


def trace_messages(row: dict, mode: str, schemas: list[dict]) -> tuple[list[dict], list[dict]]:
    """(prompt messages, SFT trace) for a row in `mode`: per turn of calls, the assistant's calls and one `tool`
    message per call (role/content only: mixes with other chats), then the answer."""
    prompt = with_tools(
        [{"role": "system", "content": f"/{mode}"}, {"role": "user", "content": row["prompt"]}], schemas
    )
    turns = json.loads(row["calls"]) if row.get("calls") else [[json.loads(row["call"])]]
    trace = list(prompt)
    _, later, said = PLANS.get(row.get("family"), _ANY_FAMILY)
    for k, calls in enumerate(turns):
        why = row["think"] if k == 0 else later[k - 1]
        think = f"<think>\n{why}\n</think>\n" if mode == "think" else ""
        trace.append(
            {"role": "assistant", "content": think + "\n".join(call_text(c["name"], c["arguments"]) for c in calls)}
        )
        trace += [{"role": "tool", "content": tool_reply(c["name"], c["arguments"])} for c in calls]
    answer = (
        f"<think>\n{said.format(answer=row['answer'])}\n</think>\n" if mode == "think" else ""
    ) + f"The answer is \\boxed{{{row['answer']}}}."
    return prompt, trace + [{"role": "assistant", "content": answer}]


def tool_tasks_dataset(split: str | None = "train", families=None, num: int = 300, seed: int = 0, mode: str = "mixed"):
    """`builtin:tool_tasks`: rows + `prompt_messages` (tools in the system turn) + `messages` (SFT traces)."""
    import datasets

    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if isinstance(families, str):
        families = [f.strip() for f in families.split(",") if f.strip()]
    rows = make_tool_tasks(families, num=num, split=split or "train", seed=seed)
    schemas = {name: t.schema for name, t in load_tools(sorted(set(FAMILIES.values()))).items()}
    for row in rows:
        m = _mode_of(row, mode, seed)
        row["prompt_messages"], row["messages"] = trace_messages(row, m, [schemas[t] for t in row["tools"]])
        row["mode"] = m
    return datasets.Dataset.from_list(rows)


register_builtin("tool_tasks", tool_tasks_dataset)
register_problems(canonical_problem, by_form=list(FAMILIES))
