"""Per-item outcomes of an evaluation: one compact JSONL line per item, so every paired test recomputes from files.

Why: a p-value in a report is only as good as the outcomes it was computed from. The eval suite writes
`<output_dir>/outcomes.jsonl` beside `eval_results.json`, the pipeline gathers every evaluation's (the stages' own
before/after ones too) into `<run_dir>/outcomes/`, and `scripts/compare.py` reads either file.

A line: `{"eval": <what was evaluated>, "item": <id of its prompt>, "family"?: ..., <outcome fields>}` with
- `gen/<set>/<mode>` (generative suite): `correct`, `formatted` (0/1) and `baseline` (0/1: the family's best trivial
  rule, align/eval/baselines.py), read as the shares `acc/<set>/<mode>`, `format/<set>/<mode>`,
  `baseline/<set>/<mode>`;
- `mc/<set>` (multiple choice): `cf`, `mcf` (0/1) -> `cf/<set>`, `mcf/<set>`;
- `tools/<mode>` (tool suite): `with_tools`, `without_tools`, `right_tool`, `format` -> `tools/<mode>/acc_with_tools`,
  `.../acc_without_tools`, `.../right_tool`, `.../format`;
- `loss/chat`: `loss` (a float: the item's mean token loss) -> `loss/chat`;
- anything else (a stage's own held-out evaluation, e.g. `grpo_eval`): `correct` -> `<eval>/accuracy`.
Two evaluations are paired on a share when it holds the same items in the same order (`OutcomeSet.key`).

    sets = outcome_sets("outputs/tiny/pipeline/eval/sft")        # {share: OutcomeSet(values, items, families)}
    write_lines(path, lines_from_details(results["details"]))
"""

from __future__ import annotations

import functools
import hashlib
import json
from dataclasses import dataclass
from pathlib import Path

OUTCOMES_FILE = "outcomes.jsonl"
RESULTS_FILE = "eval_results.json"

# (kind of `eval`, outcome field) -> the share's name, from the rest of `eval` ("tasks/think", "hellaswag", "think")
FIELDS: dict[tuple[str, str], str] = {
    ("gen", "correct"): "acc/{}",
    ("gen", "formatted"): "format/{}",
    ("gen", "baseline"): "baseline/{}",
    ("mc", "cf"): "cf/{}",
    ("mc", "mcf"): "mcf/{}",
    ("tools", "with_tools"): "tools/{}/acc_with_tools",
    ("tools", "without_tools"): "tools/{}/acc_without_tools",
    ("tools", "right_tool"): "tools/{}/right_tool",
    ("tools", "format"): "tools/{}/format",
    ("loss", "loss"): "loss/{}",
}
# The fields of a line that are not outcomes.
KEYS = ("eval", "item", "family")


def item_id(text: str) -> str:
    """A short stable id of an item's prompt (the same text gives the same id in every evaluation)."""
    return hashlib.sha256(text.encode()).hexdigest()[:12]


def digest(items: list[str]) -> str:
    return hashlib.sha256("\x00".join(items).encode()).hexdigest()[:16]


@dataclass(frozen=True)
class OutcomeSet:
    """One share's per-item outcomes (0/1, or a loss), the items' ids and families, in the evaluated order."""

    values: tuple
    items: tuple[str, ...]
    families: tuple | None = None

    @property
    def key(self) -> str:
        """What two evaluations must share to be paired: the same items in the same order."""
        return digest(list(self.items))

    def head(self, first: int | None) -> OutcomeSet:
        if first is None:
            return self
        return OutcomeSet(self.values[:first], self.items[:first], self.families[:first] if self.families else None)


def share_name(evaluated: str, field: str) -> str:
    kind, _, where = evaluated.partition("/")
    template = FIELDS.get((kind, field))
    if template is not None:
        return template.format(where)
    return f"{evaluated}/accuracy" if field == "correct" else f"{evaluated}/{field}"


def _ids(detail: dict, num: int) -> list[str]:
    items = detail.get("items")
    if items and len(items) == num:
        return list(items)
    # results written before items were recorded: the prompts' hash keeps two such results on the same items paired
    return [f"{detail.get('prompts_sha', '')}#{i}" for i in range(num)]


def _lines(evaluated: str, detail: dict, outcomes: dict[str, list]) -> list[dict]:
    num = max((len(v) for v in outcomes.values()), default=0)
    ids, families = _ids(detail, num), detail.get("families")
    out = []
    for i in range(num):
        line = {"eval": evaluated, "item": ids[i]}
        if families and len(families) == num and families[i] is not None:
            line["family"] = families[i]
        line.update({k: v[i] for k, v in outcomes.items() if len(v) == num})
        out.append(line)
    return out


def lines_from_details(details: dict) -> list[dict]:
    """The outcome lines of an eval suite's `details` (align/eval/suite.py writes them): generative sets, MC sets (from
    their picks), the tool suite and the chat loss."""
    lines = []
    for key, detail in (details or {}).items():
        if not isinstance(detail, dict):
            continue
        kind = key.split("/", 1)[0]
        if kind == "gen" and detail.get("outcomes"):
            outcomes = {k: detail["outcomes"][k] for k in ("correct", "formatted") if k in detail["outcomes"]}
            base = (details.get(f"baseline/{key.split('/')[1]}") or {}).get("outcomes")
            if base and len(base) == len(outcomes.get("correct", [])):
                outcomes["baseline"] = base
            lines += _lines(key, detail, outcomes)
        elif kind == "mc" and detail.get("picks"):
            picks = detail["picks"]
            lines += _lines(key, detail, {k: [int(p[k] == p["label"]) for p in picks] for k in ("cf", "mcf")})
        elif kind == "tools" and detail.get("outcomes"):
            lines += _lines(key, detail, dict(detail["outcomes"]))
        elif key == "loss/chat" and detail.get("items"):  # its `items` are the losses, `ids` the conversations'
            where = {"items": detail.get("ids"), "prompts_sha": detail.get("prompts_sha")}
            lines += _lines(key, where, {"loss": list(detail["items"])})
    return lines


def own_lines(name: str, report: dict, when: str) -> list[dict]:
    """A stage's own held-out evaluation (`grpo_eval.json`, `distill_eval.json`: `correct` per row under `before` and
    `after`) as outcome lines of `eval` `name`; the rows' ids when the report lists them, else their positions."""
    part = report.get(when) or {}
    correct = part.get("correct")
    if not correct:
        return []
    ids = part.get("items") if len(part.get("items") or []) == len(correct) else [f"#{i}" for i in range(len(correct))]
    families = part.get("families") if len(part.get("families") or []) == len(correct) else None
    return _lines(name, {"items": ids, "families": families}, {"correct": list(correct)})


def write_lines(path: str | Path, lines: list[dict]) -> Path:
    """The lines as JSONL, written whole (a reader never sees half a file)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".tmp")
    tmp.write_text("".join(json.dumps(line, separators=(",", ":")) + "\n" for line in lines))
    tmp.replace(path)
    return path


def sets_from_lines(lines: list[dict]) -> dict[str, OutcomeSet]:
    """{share name: its OutcomeSet}, in the order the lines hold them."""
    grouped: dict[str, list[tuple[str, object, object]]] = {}
    for line in lines:
        for field, value in line.items():
            if field not in KEYS:
                grouped.setdefault(share_name(line["eval"], field), []).append(
                    (line["item"], value, line.get("family"))
                )
    out = {}
    for name, rows in grouped.items():
        families = tuple(f for _, _, f in rows)
        out[name] = OutcomeSet(
            tuple(v for _, v, _ in rows),
            tuple(i for i, _, _ in rows),
            families if any(f is not None for f in families) else None,
        )
    return out


def read_lines(path: str | Path) -> list[dict]:
    lines = []
    for n, text in enumerate(Path(path).read_text().splitlines(), 1):
        if not text.strip():
            continue
        try:
            line = json.loads(text)
        except ValueError:
            raise ValueError(f"{path}: line {n} is not JSON: {text[:80]!r}") from None
        if not isinstance(line, dict) or "eval" not in line or "item" not in line:
            raise ValueError(f"{path}: line {n} is not an outcome line (it needs 'eval' and 'item'): {text[:80]!r}")
        lines.append(line)
    return lines


def outcomes_path(path: str | Path) -> Path:
    """The file holding an evaluation's outcomes: an outcomes .jsonl, an eval_results.json, or an eval output
    directory (its outcomes.jsonl, else its eval_results.json)."""
    path = Path(path)
    if path.is_dir():
        for name in (OUTCOMES_FILE, RESULTS_FILE):
            if (path / name).is_file():
                return path / name
        raise FileNotFoundError(
            f"no {OUTCOMES_FILE} or {RESULTS_FILE} in {path}: pass an eval output_dir "
            "(scripts/evaluate.py writes both there), one of those files, or an outcomes file"
        )
    if not path.is_file():
        raise FileNotFoundError(
            f"no eval results at {path}: pass an eval output_dir (scripts/evaluate.py writes "
            f"<output_dir>/{RESULTS_FILE} and {OUTCOMES_FILE}), one of those files, or an outcomes "
            "file"
        )
    return path


@functools.lru_cache(maxsize=64)
def _cached(path: str, mtime_ns: int) -> dict[str, OutcomeSet]:
    p = Path(path)
    if p.suffix == ".jsonl":
        return sets_from_lines(read_lines(p))
    return sets_from_lines(lines_from_details(json.loads(p.read_text()).get("details") or {}))


def outcome_sets(path: str | Path) -> dict[str, OutcomeSet]:
    """Every share with per-item outcomes in an evaluation's file (see `outcomes_path`)."""
    found = outcomes_path(path)
    return _cached(str(found), found.stat().st_mtime_ns)
