"""Decontamination: a stage's training rows checked against every eval set before it trains, for any dataset.

Why: a score means little when the model trained on the items it is scored on, or on the same problem in other
words. Two rules find a training row that overlaps an eval item:

- **the same problem**: a row and an eval item that both belong to a task family with a canonical problem
  (`register_problems`: data_gen's families register theirs when it is imported) overlap exactly when they are the
  same family and the same canonical problem, whatever their names, items, direction or order. A row that names no
  family is read as every family whose form its prompt is in. For such a pair the problem decides alone: templated
  prompts share long n-grams across different problems, so n-grams would flag them.
- **n-gram overlap** (open-instruct's rule, as Tulu 3 decontaminated its data; OLMES checks its evals the same way):
  for every other pair, the eval item's tokens covered by 8-grams that also occur in the row's prompt; more than
  half of the item's tokens covered is an overlap. Tokens are lowercase words, numbers and operator signs (the rest
  separates them). An item shorter than 8 tokens counts as one n-gram of its own length (a row holding the whole
  item overlaps); n-grams found in more than `BOILERPLATE` distinct eval prompts (a shared instruction, a few-shot
  preamble, a template) identify no item and are left out, which also bounds the work per row: linear time in the
  rows' tokens, via a hash map of the eval n-grams.

The prompt of a row in any hub shape: `prompt` (a string or messages), `messages`, `chosen` (a whole conversation),
`question`, `problem`, `instruction` or `text`, the first present; of messages, the user turns. Modes: `warn` keeps
the rows (logged and reported), `drop` (the default) removes them, `refuse` stops the stage naming them.

    data, report = decontaminate(train, {"eval:gen/tasks": rows, "held-out:grpo": more}, mode="drop")
    report["sources"]["eval:gen/tasks"]   # {"rows", "by_problem", "by_ngram", "examples"}
"""

from __future__ import annotations

import logging
import re
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

import datasets

logger = logging.getLogger(__name__)

MODES = ("warn", "drop", "refuse")
NGRAM = 8  # open-instruct's n
THRESHOLD = 0.5  # share of an eval item's tokens the shared n-grams must cover (strictly more)
BOILERPLATE = 10  # an n-gram in more distinct eval prompts than this identifies none of them
MIN_TOKENS = 3  # an eval prompt shorter than this is matched by its problem only
EXAMPLES = 3  # examples kept per eval source in the report
PROMPT_COLUMNS = ("prompt", "messages", "chosen", "question", "problem", "instruction", "text")
_TOKEN = re.compile(r"[^\W_]+|[+\-*/=<>^%]")

# (family, prompt) -> canonical problem or None, each with the families it may recognise by form alone
_RESOLVERS: list[tuple[Callable[[str, str], str | None], tuple[str, ...]]] = []


def register_problems(resolver: Callable[[str, str], str | None], by_form: Iterable[str] = ()) -> None:
    """Add task families with canonical problems: `resolver(family, prompt)` returns the problem or None (not its
    family or not in its form). `by_form`: families whose prompts have a fixed form, so a row that names no family
    is tried as each of them."""
    _RESOLVERS.append((resolver, tuple(by_form)))


def problems_of(texts: list[str], family: str | None = None) -> frozenset[tuple[str, str]]:
    """The (family, canonical problem) pairs of a prompt (its user turns `texts`): as its named `family`, or, when it
    names none or is not in that family's form, as every family whose form a turn is in."""
    if family:
        found = {(family, p) for resolver, _ in _RESOLVERS for t in texts if (p := resolver(family, t)) is not None}
        if found:
            return frozenset(found)
    return frozenset(
        (f, p) for resolver, forms in _RESOLVERS for f in forms for t in texts if (p := resolver(f, t)) is not None
    )


def tokens(text: str) -> list[str]:
    """Lowercase words, numbers and operator signs; everything else separates them."""
    return _TOKEN.findall(text.lower())


def _content(content) -> str:
    if isinstance(content, str):
        return content
    if isinstance(content, list):  # multimodal parts: their text
        return "\n".join(p.get("text") or "" for p in content if isinstance(p, dict))
    return "" if content is None else str(content)


def prompt_texts(value) -> list[str]:
    """The prompt's text(s) from a column value: a string, or the user turns of a list of messages (every turn that
    is not the assistant's when there is no user turn)."""
    if isinstance(value, str):
        return [value]
    if isinstance(value, list) and all(isinstance(m, dict) for m in value):
        users = [_content(m.get("content")) for m in value if m.get("role") == "user"]
        return users or [_content(m.get("content")) for m in value if m.get("role") != "assistant"]
    if isinstance(value, list):
        return [str(v) for v in value]
    return [] if value is None else [str(value)]


def prompt_column(columns: Iterable[str], what: str = "training data") -> str:
    """The column that holds the prompt (the first of PROMPT_COLUMNS present); a ValueError naming the columns."""
    have = list(columns)
    for name in PROMPT_COLUMNS:
        if name in have:
            return name
    raise ValueError(
        f"decontamination: the {what} has no prompt column (one of {list(PROMPT_COLUMNS)}); it has "
        f"{have}: rename the prompt's column, or set decontamination: warn to skip the check"
    )


@dataclass
class _Item:
    text: str
    tokens: list[str]
    problems: frozenset
    sources: list[str] = field(default_factory=list)


class EvalIndex:
    """Every eval set's prompts, indexed once: their problems and their n-grams (boilerplate left out)."""

    def __init__(self, eval_sets: dict[str, list[dict]], ngram: int = NGRAM, threshold: float = THRESHOLD):
        self.ngram, self.threshold = ngram, threshold
        self.items: list[_Item] = []
        self.sizes: dict[str, int] = {}
        by_text: dict[str, int] = {}
        for source, rows in eval_sets.items():
            self.sizes[source] = len(rows)
            column = prompt_column(rows[0].keys(), f"eval set {source!r}") if rows else None
            for row in rows:
                texts = prompt_texts(row.get(column))
                text = "\n".join(texts)
                key = " ".join(text.lower().split())
                if key not in by_text:
                    by_text[key] = len(self.items)
                    family = row.get("family") if isinstance(row.get("family"), str) else None
                    self.items.append(_Item(text, tokens(text), problems_of(texts, family)))
                if source not in self.items[by_text[key]].sources:
                    self.items[by_text[key]].sources.append(source)
        self.by_problem: dict[tuple[str, str], list[int]] = {}
        grams: dict[tuple[str, ...], list[tuple[int, int]]] = {}
        for i, item in enumerate(self.items):
            for problem in item.problems:
                self.by_problem.setdefault(problem, []).append(i)
            size = min(ngram, len(item.tokens))
            if size < MIN_TOKENS:
                continue
            for start in range(len(item.tokens) - size + 1):
                grams.setdefault(tuple(item.tokens[start : start + size]), []).append((i, start))
        self.grams = {g: at for g, at in grams.items() if len({i for i, _ in at}) <= BOILERPLATE}
        self.gram_sizes = sorted({len(g) for g in self.grams})

    def matches(self, texts: list[str], problems: frozenset) -> dict[int, str]:
        """{eval item: how ("problem" or "ngram 0.83")} for one row's prompt."""
        found = {i: "problem" for p in problems for i in self.by_problem.get(p, ())}
        toks = tokens("\n".join(texts))
        covered: dict[int, int] = {}
        for size in self.gram_sizes:
            for start in range(len(toks) - size + 1):
                for i, at in self.grams.get(tuple(toks[start : start + size]), ()):
                    # both sides have a problem: the problem decided above, n-grams of templates would not
                    if not (problems and self.items[i].problems):
                        covered[i] = covered.get(i, 0) | (((1 << size) - 1) << at)
        for i, mask in covered.items():
            share = mask.bit_count() / len(self.items[i].tokens)
            if share > self.threshold and i not in found:
                found[i] = f"ngram {share:.2f}"
        return found


def _short(text: str, limit: int = 160) -> str:
    text = " ".join(text.split())
    return text if len(text) <= limit else text[: limit - 1] + "…"


def _overlaps(rows: datasets.Dataset, index: EvalIndex) -> tuple[list[int], dict[str, dict]]:
    """(the indices of the rows whose prompt overlaps an eval item, per eval source: the rows it overlaps, by problem
    and by n-gram, and the first `EXAMPLES` of them); a row overlapping several items of one source counts once."""
    column = prompt_column(rows.column_names)
    families = rows["family"] if "family" in rows.column_names else [None] * len(rows)
    sources: dict[str, dict] = {}
    flagged: list[int] = []
    for r, (value, family) in enumerate(zip(rows[column], families, strict=True)):
        texts = prompt_texts(value)
        family = family if isinstance(family, str) else None
        hits = index.matches(texts, problems_of(texts, family))
        if not hits:
            continue
        flagged.append(r)
        counted: set[str] = set()
        for i, how in hits.items():
            for source in index.items[i].sources:
                entry = sources.setdefault(source, {"rows": 0, "by_problem": 0, "by_ngram": 0, "examples": []})
                if source in counted:
                    continue
                counted.add(source)
                entry["rows"] += 1
                entry["by_problem" if how == "problem" else "by_ngram"] += 1
                if len(entry["examples"]) < EXAMPLES:
                    entry["examples"].append(
                        {
                            "row": r,
                            "train": _short("\n".join(texts)),
                            "eval": _short(index.items[i].text),
                            "match": how,
                        }
                    )
    return flagged, sources


def decontaminate(
    rows: datasets.Dataset,
    eval_sets: dict[str, list[dict]],
    mode: str = "drop",
    ngram: int = NGRAM,
    threshold: float = THRESHOLD,
) -> tuple[datasets.Dataset, dict]:
    """(the rows to train on, the report): every row whose prompt overlaps an item of an eval set (its problem, or
    its n-grams), handled by `mode` (warn: kept; drop: removed; refuse: a ValueError naming them).

    Report: {"mode", "ngram", "threshold", "rows", "overlapping", "dropped", "eval_sets": {source: items},
    "sources": {source: {"rows", "by_problem", "by_ngram", "examples": [{"train", "eval", "match"}]}}}."""
    if mode not in MODES:
        raise ValueError(f"decontamination={mode!r}: choose one of {list(MODES)}")
    if ngram < 1 or not 0 <= threshold < 1:
        raise ValueError(
            f"decontamination_ngram={ngram} must be >= 1 and decontamination_threshold={threshold} in [0, 1)"
        )
    index = EvalIndex(eval_sets, ngram, threshold)
    flagged, sources = _overlaps(rows, index)
    report = {
        "mode": mode,
        "ngram": ngram,
        "threshold": threshold,
        "rows": len(rows),
        "overlapping": len(flagged),
        "dropped": len(flagged) if mode == "drop" else 0,
        "eval_sets": index.sizes,
        "sources": sources,
    }
    if not flagged:
        logger.info(
            "decontamination: none of %d training rows overlaps the %d eval sets (%d prompts)",
            len(rows),
            len(index.sizes),
            len(index.items),
        )
        return rows, report
    per_source = ", ".join(f"{s}: {e['rows']}" for s, e in sources.items())
    first = next(iter(sources.values()))["examples"][0]
    if mode == "refuse":
        raise ValueError(
            f"decontamination: {len(flagged)} of {len(rows)} training rows overlap an eval set "
            f"({per_source}); e.g. row {first['row']} {first['train']!r} ~ {first['eval']!r} "
            f"({first['match']}). Remove them from the data, or set decontamination: drop (removes "
            "them) or warn (keeps them)"
        )
    logger.warning(
        "decontamination: %d of %d training rows overlap an eval set (%s): %s",
        len(flagged),
        len(rows),
        per_source,
        "dropped" if mode == "drop" else "kept (decontamination: warn)",
    )
    if mode == "warn":
        return rows, report
    gone = set(flagged)
    kept = [r for r in range(len(rows)) if r not in gone]
    if not kept:
        raise ValueError(
            f"decontamination: every one of the {len(rows)} training rows overlaps an eval set "
            f"({per_source}): the stage has nothing left to train on; fix the data or the eval sets"
        )
    return rows.select(kept), report
