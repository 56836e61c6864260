"""Dataset loading for every stage: hub ids, local files, `builtin:NAME` sources, weighted mixtures, splits.

Why: stages, pretraining and evaluation all need the same answer to "give me rows from X". X may be a hub id
(for users with the hub), a local file or directory, or a source that ships inside an installed pip package
(`builtin:NAME`), so the tiny world runs with no network. Mixtures give several sources target shares of one
training set, deterministic under a seed.

Specs (`load_source(spec, split=None, config=None, streaming=False, **args)`):
    data/train.jsonl | .json | .parquet | .csv     a local file (a single "train" split)
    data/my_set/                                   a `save_to_disk` directory, a directory of such files (datasets
                                                   names splits by file name: train*.jsonl, test*.jsonl), or a
                                                   hub-shaped repo (data/<config>/<split>-*.parquet + README configs)
    HuggingFaceTB/smoltalk2                        a hub id: named config, per-source splits (align/data/hub.py: only
                                                   the requested split is read; a missing config/split lists the real
                                                   ones)
    builtin:news | shakespeare | kjv | gsm8k | hellaswag | truthfulqa | humaneval | rg:<task> | tasks
`streaming=True` returns a `datasets.IterableDataset` (rows read lazily) for any spec.

Builtins are read from installed packages (align/data/sources.py, with the registry); their row order is stable (file
order), so a row count or an index means the same thing on every machine. Sources with one split serve it as "train"
(also for split=None); another split name raises `SplitNotFoundError`. `register_builtin(name, fn)` adds sources:
`fn(split=None, **args)` returns a `datasets.Dataset`. Sources made by code above the core register themselves by
name when their package is imported: `builtin:tasks` comes from `data_gen` (`import data_gen`; every stage and
script that loads data does), so this module never imports data_gen.

How to use:
    from align.data.loading import load_source, get_dataset, require_columns
    ds = load_source("builtin:shakespeare")                 # {"text", "title"}, chunks of <= 4,000 chars
    ds = load_source("builtin:rg:basic_arithmetic", size=100, seed=1)
    ds = load_source("HuggingFaceTB/smoltalk2", split="OpenHermes_2.5_no_think", config="SFT")
    dd = get_dataset(script_args)                           # DatasetDict: "train" (+ "test")
"""

from __future__ import annotations

import logging
import math
import os
import random
import re
from pathlib import Path

import datasets

from align.data.hub import SplitNotFoundError, load_split
from align.data.sources import BUILTIN_PREFIX, call_builtin, register_builtin

logger = logging.getLogger(__name__)

__all__ = [
    "SplitNotFoundError",
    "load_source",
    "get_dataset",
    "held_out_splits",
    "require_columns",
    "register_builtin",
]

LOCAL_SUFFIXES = {".jsonl": "json", ".json": "json", ".parquet": "parquet", ".csv": "csv"}
MIXTURE_KEYS = {"datasets", "seed", "test_split_size", "num_samples", "weighting"}
ENTRY_KEYS = {"id", "config", "args", "split", "test_split", "columns", "weight"}
WEIGHTINGS = ("share", "fraction")

# ----------------------------------------------------------------------------- local files and hub ids


def _looks_local(spec: str) -> bool:
    return (
        spec.startswith(("/", "./", "../", "~"))
        or Path(spec).suffix.lower() in LOCAL_SUFFIXES
        or os.path.exists(os.path.expanduser(spec))
    )


def _pick(dd: datasets.DatasetDict, split: str | None, spec: str) -> datasets.Dataset:
    split = split or "train"
    if split not in dd:
        raise SplitNotFoundError(f"{spec!r} has no split {split!r}; available: {', '.join(dd)}")
    return dd[split]


def _load_local(spec: str, split: str | None, args: dict) -> datasets.Dataset:
    path = Path(os.path.expanduser(spec))
    if not path.exists():
        raise FileNotFoundError(f"dataset file or directory not found: {path} (a hub id has no file suffix)")
    streaming = args.pop("streaming", False)
    if path.is_file():
        if path.stat().st_size == 0:
            raise ValueError(f"dataset file {path} is empty (0 rows): regenerate it or point dataset_name elsewhere")
        builder = LOCAL_SUFFIXES.get(path.suffix.lower())
        if builder is None:
            raise ValueError(f"{path}: unsupported file type {path.suffix!r}; use one of {', '.join(LOCAL_SUFFIXES)}")
        if (split or "train") != "train":
            raise SplitNotFoundError(f"{spec!r} has no split {split!r}; available: train")
        return datasets.load_dataset(
            builder, data_files={"train": str(path)}, split="train", streaming=streaming, **args
        )
    if (path / "dataset_dict.json").exists():
        return _streamed(_pick(datasets.load_from_disk(str(path)), split, spec), streaming)
    if (path / "dataset_info.json").exists() and (path / "state.json").exists():  # a saved single Dataset
        return _streamed(_pick(datasets.DatasetDict(train=datasets.load_from_disk(str(path))), split, spec), streaming)
    if not any(p.suffix.lower() in LOCAL_SUFFIXES for p in path.rglob("*") if p.is_file()):
        raise FileNotFoundError(
            f"{path} holds no {'/'.join(LOCAL_SUFFIXES)} files and is not a save_to_disk directory"
        )
    # A hub-shaped repo, or a directory of files (datasets names splits by file name): the hub id's code path.
    return load_split(str(path), split or "train", args.pop("config", None), streaming, **args)


def _streamed(ds: datasets.Dataset, streaming: bool):
    return ds.to_iterable_dataset() if streaming else ds


def load_source(spec: str, split: str | None = None, **args) -> datasets.Dataset:
    """One split of a source (hub id, local file/dir or builtin:NAME) as a Dataset; split=None means "train".

    `config` names a hub config; `streaming=True` returns an IterableDataset; other args go to the loader.
    """
    if not isinstance(spec, str) or not spec:
        raise ValueError(f"dataset spec must be a non-empty string, got {spec!r}")
    args = dict(args)
    if spec.startswith(BUILTIN_PREFIX):
        streaming = args.pop("streaming", False)
        return _streamed(call_builtin(spec[len(BUILTIN_PREFIX) :], split, args), streaming)
    try:
        if _looks_local(spec):
            return _load_local(spec, split, dict(args))
        config, streaming = args.pop("config", None), args.pop("streaming", False)
        return load_split(spec, split or "train", config, streaming, **args)
    except TypeError as err:  # datasets' loaders take no unknown keyword: a builtin's dataset_args left in a recipe
        bad = re.search(r"unexpected keyword argument '(\w+)'", str(err))
        if bad is None:
            raise
        raise ValueError(
            f"dataset_args key {bad.group(1)!r} is not an argument of the loader of {spec!r}: dataset_args go to the "
            f"loader of dataset_name (builtin sources take their own, e.g. num and mode for builtin:tasks); drop it "
            f"(`--dataset_args null` on the command line) or name an argument that loader takes"
        ) from None


def load_replay_conversations(spec: str, limit: int | None = None, **args) -> datasets.Dataset:
    """`replay_data` (APO's and GRPO's): the train split's conversations, the first `limit` of them; a source
    without a `messages` column is one line naming its columns."""
    rows = load_source(spec, "train", **args)
    if "messages" not in rows.column_names:
        raise ValueError(
            f"replay_data {spec!r} has no `messages` column (it has {rows.column_names}): point it at "
            "conversations, e.g. builtin:tool_tasks or the output of scripts/generate_answers.py"
        )
    return rows if limit is None else rows.select(range(min(limit, len(rows))))


def _load_optional(spec: str, split: str | None, args: dict) -> datasets.Dataset | None:
    try:
        return load_source(spec, split=split, **args)
    except SplitNotFoundError:
        return None


# The split a stage holds out when its recipe names none, first found first: `validation` is what a source keeps
# for choices made while training (early stopping, a stage's own before/after checks); `test` is the next best.
HELD_OUT_SPLITS = ("validation", "test")


def load_held_out(spec: str, split: str | None, args: dict, cap: int | None = None) -> datasets.Dataset | None:
    """The split of `spec` a stage holds out: `split` when named, else the first of HELD_OUT_SPLITS the source
    has (builtin:tasks and builtin:tool_tasks: `validation`, whose problems neither the eval suite's dev split nor
    the sealed test split holds); None when it has none. `cap` (max_eval_samples) caps a builtin's `num` too: a
    builtin makes its rows in a fixed order, so the first rows of a larger set are the same rows, and a held-out
    split need not hold as many rows as the training split asks for."""
    if cap is not None and spec.startswith(BUILTIN_PREFIX) and isinstance(args.get("num"), int):
        args = {**args, "num": min(args["num"], cap)}
    for name in [split] if split else HELD_OUT_SPLITS:
        found = _load_optional(spec, name, args)
        if found is not None:
            return found
    return None


# ----------------------------------------------------------------------------- columns, splits, mixtures


def require_columns(ds: datasets.Dataset | datasets.DatasetDict, columns: list[str], stage: str) -> None:
    """Raise a one-line ValueError when `ds` (every split of a DatasetDict) lacks any of `columns`."""
    splits = ds.values() if isinstance(ds, datasets.DatasetDict) else [ds]
    for part in splits:
        missing = [c for c in columns if c not in part.column_names]
        if missing:
            raise ValueError(
                f"{stage} needs column(s) {', '.join(repr(c) for c in missing)} but the dataset has: "
                f"{', '.join(part.column_names)}. Rename the column(s) in your data (Dataset.rename_column), "
                f"or set dataset_name / dataset_mixture to a source in {stage}'s format."
            )


def _test_size(value: float | int) -> float | int:
    """A fraction (< 1) or a row count (>= 1), as datasets' train_test_split wants it."""
    if value <= 0:
        raise ValueError(f"test_split_size must be > 0 (a fraction or a row count), got {value}")
    return float(value) if value < 1 else int(value)


def _split_off(ds: datasets.Dataset, test_size: float | int, seed: int, what: str):
    size = _test_size(test_size)
    num_test = math.ceil(size * len(ds)) if isinstance(size, float) else size
    if len(ds) < 2 or num_test >= len(ds):
        raise ValueError(f"test_split_size={test_size} leaves no training rows for {what} ({len(ds)} rows)")
    parts = ds.train_test_split(test_size=size, seed=seed, shuffle=True)
    return parts["train"], parts["test"]


def _cap(ds: datasets.Dataset | None, num: int | None) -> datasets.Dataset | None:
    return ds.select(range(min(num, len(ds)))) if ds is not None and num is not None else ds


def _quotas(sizes: list[int], weights: list[float] | None, num_samples: int | None) -> list[int]:
    """Rows to take from each source so that shares follow `weights` (largest-remainder rounding)."""
    if weights is None:  # no weights: concatenate every row once (natural shares)
        weights = [float(n) for n in sizes]
    total_w = sum(weights)
    shares = [w / total_w for w in weights]
    if num_samples is None:
        # The largest mixture in which no source repeats a row: the scarcest source (relative to its share) caps it.
        num_samples = int(min(n / s for n, s in zip(sizes, shares) if s > 0) + 1e-9)
    exact = [s * num_samples for s in shares]
    quotas = [int(x) for x in exact]
    by_remainder = sorted(range(len(exact)), key=lambda i: (quotas[i] - exact[i], i))
    for i in by_remainder[: num_samples - sum(quotas)]:
        quotas[i] += 1
    return quotas


def _sample(ds: datasets.Dataset, num: int, rng: random.Random) -> list[int]:
    """`num` row indices: whole passes over the rows (repetition) plus a seeded random subset."""
    passes, rest = divmod(num, len(ds))
    order = list(range(len(ds)))
    rng.shuffle(order)
    return list(range(len(ds))) * passes + sorted(order[:rest])


def _field(obj, key: str, default=None):
    return obj.get(key, default) if isinstance(obj, dict) else getattr(obj, key, default)


def _check_mixture(mixture) -> list[dict]:
    if isinstance(mixture, dict) and (unknown := set(mixture) - MIXTURE_KEYS):
        raise ValueError(f"dataset_mixture: unknown key(s) {sorted(unknown)}; valid keys: {sorted(MIXTURE_KEYS)}")
    entries = _field(mixture, "datasets") or []
    if not entries:
        raise ValueError("dataset_mixture needs a non-empty 'datasets' list, e.g. {datasets: [{id: builtin:tasks}]}")
    for i, e in enumerate(entries):
        if not isinstance(e, dict) or "id" not in e:
            raise ValueError(
                f"dataset_mixture.datasets[{i}] must be a mapping with an 'id' (a dataset spec), got {e!r}"
            )
        if unknown := set(e) - ENTRY_KEYS:
            raise ValueError(
                f"dataset_mixture.datasets[{i}]: unknown key(s) {sorted(unknown)}; valid: {sorted(ENTRY_KEYS)}"
            )
        if "weight" in e and not (isinstance(e["weight"], int | float) and e["weight"] > 0):
            raise ValueError(f"dataset_mixture.datasets[{i}].weight must be a number > 0, got {e['weight']!r}")
    weighting = _field(mixture, "weighting", None) or "share"
    if weighting not in WEIGHTINGS:
        raise ValueError(f"dataset_mixture.weighting={weighting!r}: choose 'share' (target shares) or 'fraction'")
    if weighting == "fraction" and _field(mixture, "num_samples", None):
        raise ValueError(
            "dataset_mixture: num_samples needs weighting 'share'; with 'fraction' each weight sets a size"
        )
    weighted = ["weight" in e for e in entries]
    if weighting == "share" and any(weighted) and not all(weighted):
        raise ValueError(
            "dataset_mixture: give every dataset a 'weight' (target shares) or none (concatenate all rows)"
        )
    return entries


def _concat(parts: list[datasets.Dataset], ids: list[str]) -> datasets.Dataset:
    cols = "; ".join(f"{i}: {', '.join(f'{k} ({v})' for k, v in p.features.items())}" for i, p in zip(ids, parts))
    msg = (
        f"dataset_mixture sources do not share columns/types ({cols}); select common columns with 'columns' "
        "and give them one type"
    )
    # datasets would fill a column one source lacks with nulls: a silent hole in the data, so refuse instead.
    if len({frozenset(p.column_names) for p in parts}) > 1:
        raise ValueError(msg)
    try:
        return datasets.concatenate_datasets(parts)
    except ValueError as err:
        raise ValueError(msg) from err


def _mixture(script_args, mixture) -> datasets.DatasetDict:
    entries = _check_mixture(mixture)
    seed = _field(mixture, "seed", None)
    seed = _seed(script_args) if seed is None else int(seed)
    test_size = _field(mixture, "test_split_size", None) or getattr(script_args, "test_split_size", None)
    num_samples = _field(mixture, "num_samples", None)
    default_train = getattr(script_args, "dataset_train_split", None) or "train"
    default_test = getattr(script_args, "dataset_test_split", None)
    trains, tests, ids = [], [], []
    for i, e in enumerate(entries):
        spec, args = e["id"], dict(e.get("args") or {})
        if e.get("config"):
            args["config"] = e["config"]
        train = load_source(spec, split=e.get("split", default_train), **args)
        test = load_held_out(
            spec, e.get("test_split", default_test), args, getattr(script_args, "max_eval_samples", None)
        )
        if test is None and test_size:
            # Split each source before sampling, so a repeated training row can never also be a test row.
            train, test = _split_off(train, test_size, seed + i, f"dataset_mixture.datasets[{i}] ({spec})")
        if e.get("columns"):
            require_columns(train, list(e["columns"]), f"dataset_mixture.datasets[{i}] ({spec})")
            train = train.select_columns(list(e["columns"]))
            test = test.select_columns(list(e["columns"])) if test is not None else None
        if len(train) == 0:
            raise ValueError(f"dataset_mixture.datasets[{i}] ({spec}) has no training rows")
        trains.append(train)
        tests.append(test)
        ids.append(spec + "".join(f"[{e[k]}]" for k in ("config", "split") if e.get(k)))
    if _field(mixture, "weighting", None) == "fraction":
        # alignment-handbook's mixer: each source keeps weight x its rows (a seeded subset; > 1 repeats rows).
        quotas = [int(len(t) * float(e.get("weight", 1.0))) for t, e in zip(trains, entries)]
    else:
        weights = [float(e["weight"]) for e in entries] if "weight" in entries[0] else None
        quotas = _quotas([len(t) for t in trains], weights, num_samples)
    picked = []
    for i, (train, quota) in enumerate(zip(trains, quotas)):
        if quota > len(train):
            logger.warning(
                "dataset_mixture: %s repeats its %d rows to fill %d (its weight)", ids[i], len(train), quota
            )
        picked.append(train.select(_sample(train, quota, random.Random(f"{seed}:{i}"))))
    if not sum(quotas):
        raise ValueError("dataset_mixture: the weights leave no training rows; raise them or add data")
    out = datasets.DatasetDict(train=_concat(picked, ids).shuffle(seed=seed).flatten_indices())
    # The test split holds every held-out row once (not weighted): evaluation should see all of it.
    if any(t is not None for t in tests):
        have = [(t, s) for t, s in zip(tests, ids) if t is not None]
        out["test"] = _concat([t for t, _ in have], [s for _, s in have])
    return out


def held_out_splits(config: dict) -> tuple[dict[str, datasets.Dataset], list[str]]:
    """The held-out split of each source a stage's data keys name (`dataset_name` + `dataset_args`,
    `dataset_config`, `dataset_test_split`, or `dataset_mixture`), read without their training splits: {spec: the
    first `max_eval_samples` rows of its own held-out split (`load_held_out`)}, as the stage reads it. A source
    without one is left out (a `test_split_size` split needs the training rows: the stage checks its own). Returns
    (found, the specs of local paths not made yet)."""
    cap = config.get("max_eval_samples")
    default_test = config.get("dataset_test_split")
    if config.get("dataset_mixture"):
        entries = [
            (
                e["id"],
                dict(e.get("args") or {}, **({"config": e["config"]} if e.get("config") else {})),
                e.get("test_split", default_test),
            )
            for e in _check_mixture(config["dataset_mixture"])
        ]
    elif config.get("dataset_name"):
        args = dict(config.get("dataset_args") or {})
        if config.get("dataset_config"):
            args.setdefault("config", config["dataset_config"])
        entries = [(config["dataset_name"], args, default_test)]
    else:
        entries = []
    out, missing = {}, []
    for spec, args, split in entries:
        try:
            test = _cap(load_held_out(spec, split, args, cap), cap)
        except FileNotFoundError:
            missing.append(spec)
            continue
        if test is not None:
            out[spec if spec not in out else f"{spec}#{len(out)}"] = test
    return out, missing


def _seed(script_args) -> int:
    seed = getattr(script_args, "seed", None)
    return 0 if seed is None else int(seed)


def get_dataset(script_args) -> datasets.DatasetDict:
    """The stage's data as a DatasetDict with "train" and, when available, "test".

    From `dataset_mixture` ({datasets: [{id, config, args, split, test_split, columns, weight}], seed, weighting,
    test_split_size, num_samples}) or else `dataset_name` (+ dataset_config, dataset_args, dataset_train_split,
    dataset_test_split). Test split (what the stage holds out): the source's own, `dataset_test_split` or unset its
    `validation` split, else its `test` split (`load_held_out`), else `test_split_size` rows held out under the
    seed, else none. Mixtures (`weighting: share`, the default): weights are target shares of the training
    rows. Without `num_samples` the mixture is as large as it can be with no row repeated (the scarcest source relative
    to its weight sets the size); with `num_samples` a source with too few rows is repeated (whole passes, then a
    seeded subset), with a warning. No weights means every row of every source once. `weighting: fraction` is the
    alignment-handbook's rule (its published SmolLM3 recipes use it): each source keeps weight x its rows (int, a
    seeded subset; no weight = all rows). The train split is shuffled under the seed; same seed, same rows.
    `max_train_samples` / `max_eval_samples` keep the first rows of each split.
    """
    mixture = getattr(script_args, "dataset_mixture", None)
    if mixture:
        out = _mixture(script_args, mixture)
    else:
        spec = getattr(script_args, "dataset_name", None)
        if not spec:
            raise ValueError("set dataset_name (a hub id, a local file/dir or builtin:NAME) or dataset_mixture")
        args = dict(getattr(script_args, "dataset_args", None) or {})
        if getattr(script_args, "dataset_config", None):
            args.setdefault("config", script_args.dataset_config)
        train = load_source(spec, split=getattr(script_args, "dataset_train_split", None) or "train", **args)
        test = load_held_out(
            spec,
            getattr(script_args, "dataset_test_split", None),
            args,
            getattr(script_args, "max_eval_samples", None),
        )
        test_size = getattr(script_args, "test_split_size", None)
        if test is None and test_size:
            train, test = _split_off(train, test_size, _seed(script_args), f"dataset_name={spec}")
        out = datasets.DatasetDict(train=train)
        if test is not None:
            out["test"] = test
    out["train"] = _cap(out["train"], getattr(script_args, "max_train_samples", None))
    if "test" in out:
        out["test"] = _cap(out["test"], getattr(script_args, "max_eval_samples", None))
    return out
