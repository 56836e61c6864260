"""Hub dataset repos, and local directories shaped like them: named configs, per-source splits, streaming.

Why: real post-training data is hub-shaped. `HuggingFaceTB/smoltalk2` config `SFT` has no `train` split: its
splits are named per source, and a recipe picks and weights them one by one. Asked for one split,
`datasets.load_dataset` downloads and prepares EVERY split of the config first (and only then complains about a
missing one). Here the configs come from the README's `configs:` block and the splits from the builder's
resolved `data_files` (file patterns matched, nothing downloaded); only the requested split's files are then
loaded, and a config or split that does not exist is one line listing the ones that do.

A local directory with `data/<config>/<split>-*.parquet` and a README whose YAML front matter has a `configs:`
block (config_name, data_files: [{split, path}]) goes through exactly the same code as a hub id: that is how
the tests (and CPU rehearsals of the smollm3 recipes) stand in for the hub.

`SMOLALIGN_DATA_MIRROR=<dir>`: a hub id `org/name` is read from `<dir>/org/name` when that directory exists (a
copy made with `hf download --repo-type dataset org/name --local-dir <dir>/org/name` on a shared
filesystem, or the test fixtures). Nothing else changes: configs, splits and columns are the hub's.

    from align.data.hub import load_split
    ds = load_split("HuggingFaceTB/smoltalk2", "OpenHermes_2.5_no_think", config="SFT")
    it = load_split("HuggingFaceFW/fineweb-edu", "train", config="sample-10BT", streaming=True)   # IterableDataset
"""

from __future__ import annotations

import contextlib
import os
from pathlib import Path

import datasets

MIRROR_ENV = "SMOLALIGN_DATA_MIRROR"
# Arguments of load_dataset that also shape the builder (which files, which revision).
BUILDER_KEYS = ("data_dir", "data_files", "revision", "cache_dir", "token")


class SplitNotFoundError(ValueError):
    """A source does not have the requested split (callers may treat a missing test split as 'none')."""


def mirror_path(spec: str) -> str:
    """`spec`, or its copy under $SMOLALIGN_DATA_MIRROR when one exists there."""
    root = os.environ.get(MIRROR_ENV)
    if root and spec.count("/") == 1 and (Path(root) / spec).is_dir():
        return str(Path(root) / spec)
    return spec


def _main_process_first():
    """Under torch.distributed, each machine's local rank 0 prepares a split while that machine's other ranks wait,
    then they read its cache. Per machine, not globally: HF caches are usually node-local, and a global rank 0
    warming only its own node's cache left every rank of the other nodes downloading and preparing at once."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        from accelerate import PartialState

        return PartialState().local_main_process_first()
    return contextlib.nullcontext()


def config_names(spec: str) -> list[str]:
    try:
        return list(datasets.get_dataset_config_names(spec))
    except Exception:  # a repo without a README block still has its "default" config
        return []


def _builder(spec: str, config: str | None, args: dict):
    try:
        return datasets.load_dataset_builder(spec, name=config, **{k: args[k] for k in BUILDER_KEYS if k in args})
    except (ConnectionError, datasets.exceptions.DatasetNotFoundError) as err:
        raise FileNotFoundError(
            f"{spec!r} is no local file or directory, so it was read as a hub id, and the hub could not serve it "
            f"({type(err).__name__}). Check the id, or the path, or use builtin:NAME"
        ) from err
    except ValueError as err:
        message = str(err)
        if "not found" not in message and "Config name is missing" not in message:
            raise
        names = ", ".join(config_names(spec)) or "(none found)"
        if config is None:
            raise ValueError(
                f"{spec!r} has several configs and none was chosen; set `config` (dataset_config, or config: in "
                f"a dataset_mixture entry or a pretraining source) to one of: {names}"
            ) from None
        raise ValueError(f"{spec!r} has no config {config!r}; its configs: {names}") from None


def split_names(builder) -> list[str]:
    """The splits a builder knows from its metadata (resolved data_files, else the README's dataset_info)."""
    files = builder.config.data_files
    if files:
        return [str(s) for s in files]
    return [str(s) for s in (builder.info.splits or {})]


def load_split(
    spec: str, split: str, config: str | None = None, streaming: bool = False, **args
) -> datasets.Dataset | datasets.IterableDataset:
    """One split of a hub id or hub-shaped directory; only that split's files are read (lazily when streaming)."""
    spec = mirror_path(spec)
    builder = _builder(spec, config, args)
    names = split_names(builder)
    where = f"{spec!r}" + (f" config {config!r}" if config else "")
    if names and split not in names:
        raise SplitNotFoundError(f"{where} has no split {split!r}; its splits: {', '.join(names)}")
    kwargs = dict(args)
    if "data_files" not in kwargs and builder.config.data_files and split in builder.config.data_files:
        kwargs["data_files"] = {split: list(builder.config.data_files[split])}
    if streaming:
        return datasets.load_dataset(spec, name=config, split=split, streaming=True, **kwargs)
    with _main_process_first():
        return datasets.load_dataset(spec, name=config, split=split, **kwargs)
