r"""Trivial baselines: the best of a few rules that read the prompt alone, per task family, beside every score.

Why: a model's 40% means little when answering "1" to every letter count scores 40% too, or when the word "largest"
already says which number to pick. Each rule maps a prompt to an answer without a model; the rules that need a
value (the commonest answer) learn it from the family's TRAIN split, the best rule of each family is chosen on that
split too, and only then is it scored on the reported items, by the same verifier as the model's answers. The report
marks a family the model does not beat (the paired test on the same items) and counts the ones it does.

The rules (`RULES`), every one a function of the prompt and what was fitted:
- `constant`: the family's commonest training answer;
- `opening_constant`: the commonest training answer among prompts that open with the same three words (a length
  question and an occurrence question ask for different typical counts);
- `first_number`, `last_number`, `largest_number`, `smallest_number`: a number the prompt holds, echoed;
- `keyword_extreme`: the largest number when the prompt says largest / most / maximum (and the like), the smallest
  when it says smallest / least / minimum;
- `list_length`: how many items the prompt's comma-separated list holds;
- `numbers_as_given`: the prompt's numbers in the order written, as a list.

    fitted = fit_baselines(train_rows)                   # {family: Baseline(rule, value, train_accuracy)}
    answers = baseline_answers(rows, fitted)             # one answer (or None) per row: score them like a model's
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from align.eval.statistics import paired_change

_NUMBER = re.compile(r"\d+(?:\.\d+)?")
_WORD = re.compile(r"[A-Za-z]+")
_MAX_WORDS = re.compile(r"\b(largest|biggest|greatest|highest|most|maximum|max)\b", re.IGNORECASE)
_MIN_WORDS = re.compile(r"\b(smallest|lowest|least|fewest|minimum|min)\b", re.IGNORECASE)


def _numbers(prompt: str) -> list[str]:
    return _NUMBER.findall(prompt)


def _value(number: str) -> float:
    return float(number)


def opening(prompt: str) -> str:
    """The prompt's first three words, lowercased: what `opening_constant` keys its answers by."""
    return " ".join(w.lower() for w in _WORD.findall(prompt)[:3])


def _list_items(prompt: str) -> list[str]:
    """The comma-separated list the prompt ends with (after its last colon, when it has one)."""
    tail = prompt.rsplit(":", 1)[-1].strip().rstrip("?.!")
    items = [x.strip() for x in tail.split(",")]
    return items if len(items) >= 2 and all(items) else []


def _pick(numbers: list[str], largest: bool) -> str | None:
    return (max if largest else min)(numbers, key=_value) if numbers else None


def _keyword_extreme(prompt: str) -> str | None:
    if _MAX_WORDS.search(prompt):
        return _pick(_numbers(prompt), True)
    if _MIN_WORDS.search(prompt):
        return _pick(_numbers(prompt), False)
    return None


# name -> (answer(prompt, fitted value), fit(train prompts, train answers) -> the value it needs, or None)
Rule = tuple[Callable[[str, object], str | None], Callable[[list[str], list[str]], object] | None]


def _commonest(answers: list[str]) -> str:
    return Counter(answers).most_common(1)[0][0]


def _by_opening(prompts: list[str], answers: list[str]) -> dict:
    groups: dict[str, list[str]] = {}
    for p, a in zip(prompts, answers):
        groups.setdefault(opening(p), []).append(a)
    return {"by_opening": {k: _commonest(v) for k, v in groups.items()}, "else": _commonest(answers)}


RULES: dict[str, Rule] = {
    "constant": (lambda p, v: v, lambda prompts, answers: _commonest(answers)),
    "opening_constant": (lambda p, v: v["by_opening"].get(opening(p), v["else"]), _by_opening),
    "first_number": (lambda p, v: (_numbers(p) or [None])[0], None),
    "last_number": (lambda p, v: (_numbers(p) or [None])[-1], None),
    "largest_number": (lambda p, v: _pick(_numbers(p), True), None),
    "smallest_number": (lambda p, v: _pick(_numbers(p), False), None),
    "keyword_extreme": (lambda p, v: _keyword_extreme(p), None),
    "list_length": (lambda p, v: str(len(_list_items(p))) if _list_items(p) else None, None),
    "numbers_as_given": (lambda p, v: ", ".join(_numbers(p)) if len(_numbers(p)) >= 2 else None, None),
}


def normalized(answer: str | None) -> str | None:
    """An answer as the rules and golds are matched while fitting: spaces after commas, surrounding space."""
    return None if answer is None else re.sub(r"\s*,\s*", ", ", str(answer).strip())


@dataclass(frozen=True)
class Baseline:
    """A family's chosen rule, the value it was fitted to, and its accuracy on the training rows when fitted on the
    other fold (what it was chosen by)."""

    rule: str
    value: object
    train_accuracy: float

    def answer(self, prompt: str) -> str | None:
        return RULES[self.rule][0](prompt, self.value)


def _hits(name: str, value, prompts: list[str], golds: list[str]) -> int:
    return sum(normalized(RULES[name][0](p, value)) == g for p, g in zip(prompts, golds))


def fit_baselines(train_rows: Sequence[dict]) -> dict[str, Baseline]:
    """Per family of `train_rows` ({"prompt", "answer", "family"}): the rule that answers most training rows exactly
    when fitted on the other ones (two folds: fitted on the even rows and scored on the odd ones, and the other way
    round; first in RULES on a tie), then fitted on all of them. A rule that memorises its training rows (an
    opening of three words seen once) scores on its own rows but not on the other fold, so it is not chosen for that.
    Fitting and choosing read the training rows only."""
    by_family: dict[str, list[dict]] = {}
    for row in train_rows:
        by_family.setdefault(str(row["family"]), []).append(row)
    fitted = {}
    for family, rows in sorted(by_family.items()):
        prompts, golds = [r["prompt"] for r in rows], [normalized(r["answer"]) for r in rows]
        folds = [(prompts[i::2], golds[i::2]) for i in (0, 1)]
        best = None
        for name, (_, fit) in RULES.items():
            hits = 0
            for (fit_p, fit_g), (held_p, held_g) in (folds, folds[::-1]):
                hits += _hits(name, fit(fit_p, fit_g) if fit and fit_p else None, held_p, held_g)
            if best is None or hits > best[0]:
                best = (hits, name)
        name = best[1]
        fit = RULES[name][1]
        fitted[family] = Baseline(name, fit(prompts, golds) if fit else None, best[0] / len(rows))
    return fitted


def baseline_answers(rows: Sequence[dict], fitted: dict[str, Baseline]) -> list[str | None]:
    """Each row's answer by its family's chosen rule (None: a family without a fitted rule, or a rule with no answer
    for this prompt), to be checked by the row's verifier like a model's answer."""
    out = []
    for row in rows:
        baseline = fitted.get(str(row.get("family")))
        out.append(baseline.answer(row["prompt"]) if baseline else None)
    return out


def as_completion(answer: str | None) -> str:
    """A rule's answer written as a model's would be, for the verifier (no answer: an empty completion)."""
    return "" if answer is None else f"The answer is \\boxed{{{answer}}}."


def baseline_verdicts(model: Sequence[float], baseline: Sequence[float], families: Sequence[str]) -> dict:
    """The model against its families' baselines on the same items: per family the two accuracies and the exact
    McNemar test (`gained`: items the model answers and the rule does not); `beats` when the model is better at
    p < 0.05. {"families": {family: {...}}, "beaten": how many families it beats, "num_families"}."""
    if not len(model) == len(baseline) == len(families):
        raise ValueError(
            f"baseline_verdicts: {len(model)} model outcomes, {len(baseline)} baseline outcomes and "
            f"{len(families)} families: they must be the same items"
        )
    by: dict[str, list[int]] = {}
    for i, family in enumerate(families):
        by.setdefault(str(family), []).append(i)
    out = {}
    for family, idx in sorted(by.items()):
        m, b = [model[i] for i in idx], [baseline[i] for i in idx]
        p = paired_change(b, m)
        out[family] = {
            "num": len(idx),
            "model": sum(m) / len(idx),
            "baseline": sum(b) / len(idx),
            "gained": p["gained"],
            "lost": p["lost"],
            "p_value": p["p_value"],
            "beats": p["significant"] and p["gained"] > p["lost"],
        }
    return {"families": out, "beaten": sum(v["beats"] for v in out.values()), "num_families": len(out)}
