"""Hub-shaped data (align/data/hub.py through align/data/loading.py): named configs, per-source splits picked and
weighted in a mixture, only the requested split read, one-line errors listing the real configs/splits, streaming, the
mirror.

Run: pytest tests/test_hub_data.py -q   (a few seconds; local fixture repos, no network)
"""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import datasets
import pytest
from hub_fixtures import chat_rows, write_repo

from align.data.hub import MIRROR_ENV, SplitNotFoundError
from align.data.loading import get_dataset, load_source


@pytest.fixture(scope="module")
def repo(tmp_path_factory) -> Path:
    """Two configs; the "SFT" one has per-source splits and no `train` split (like smoltalk2)."""
    root = tmp_path_factory.mktemp("hub") / "org" / "talk"
    return write_repo(
        root,
        {
            "SFT": {"alpha_no_think": chat_rows("alpha_no_think", 10), "beta_think": chat_rows("beta_think", 4)},
            "Mid": {"traces": [{"text": f"trace {i}"} for i in range(6)]},
        },
    )


def test_a_named_config_and_a_per_source_split_load(repo):
    ds = load_source(str(repo), split="beta_think", config="SFT")
    assert len(ds) == 4 and set(ds.column_names) == {"messages", "chat_template_kwargs"}
    assert ds[0]["chat_template_kwargs"] == {"enable_thinking": True}
    assert load_source(str(repo), split="traces", config="Mid")["text"][:2] == ["trace 0", "trace 1"]


def test_only_the_requested_split_is_prepared(repo, tmp_path):
    load_source(str(repo), split="beta_think", config="SFT", cache_dir=str(tmp_path))
    arrows = [p.name for p in tmp_path.rglob("*.arrow")]
    assert arrows and all("beta_think" in name for name in arrows), arrows  # alpha_no_think was never touched


@pytest.mark.parametrize(
    "split, config, error, message",
    [
        (
            "train",
            "SFT",
            SplitNotFoundError,
            r"config 'SFT' has no split 'train'; its splits: alpha_no_think, beta_think$",
        ),
        ("x", "Nope", ValueError, r"has no config 'Nope'; its configs: SFT, Mid$"),
        ("x", None, ValueError, r"several configs and none was chosen; .* one of: SFT, Mid$"),
    ],
)
def test_missing_split_or_config_is_one_line_listing_the_real_ones(repo, split, config, error, message):
    with pytest.raises(error, match=message) as err:
        load_source(str(repo), split=split, config=config)
    assert "\n" not in str(err.value)


def test_streaming_gives_an_iterable_dataset_for_every_kind_of_spec(repo, tmp_path):
    it = load_source(str(repo), split="alpha_no_think", config="SFT", streaming=True)
    assert isinstance(it, datasets.IterableDataset)
    assert [r["messages"][0] for r in it] == [r["messages"][0] for r in chat_rows("alpha_no_think", 10)]
    path = tmp_path / "rows.jsonl"
    datasets.Dataset.from_list([{"text": "a"}, {"text": "b"}]).to_json(str(path))
    assert [r["text"] for r in load_source(str(path), streaming=True)] == ["a", "b"]
    assert isinstance(load_source("builtin:gsm8k", streaming=True), datasets.IterableDataset)


def test_a_mixture_picks_and_weights_splits_like_the_alignment_handbook(repo):
    entries = [
        {"id": str(repo), "config": "SFT", "split": "alpha_no_think", "columns": ["messages"], "weight": 0.5},
        {"id": str(repo), "config": "SFT", "split": "beta_think", "columns": ["messages"], "weight": 1.0},
    ]
    args = SimpleNamespace(dataset_mixture={"datasets": entries, "seed": 3, "weighting": "fraction"})
    train = get_dataset(args)["train"]
    firsts = [m[0]["content"] for m in train["messages"]]
    alpha = {r["messages"][0]["content"] for r in chat_rows("alpha_no_think", 10)}
    assert len(train) == 5 + 4 and sum(f in alpha for f in firsts) == 5  # half of alpha's 10 rows, all of beta's
    assert get_dataset(args)["train"]["messages"] == train["messages"]  # same seed, same rows
    shares = SimpleNamespace(dataset_mixture={"datasets": entries, "seed": 3})  # our default: target shares
    assert len(get_dataset(shares)["train"]) == 2 + 4  # beta (4 rows at a 2/3 share) caps the mixture at 6
    with pytest.raises(ValueError, match="weighting='nope'"):
        get_dataset(SimpleNamespace(dataset_mixture={"datasets": entries, "weighting": "nope"}))


def test_a_hub_id_is_served_from_the_mirror(repo, monkeypatch):
    monkeypatch.setenv(MIRROR_ENV, str(repo.parent.parent))
    args = SimpleNamespace(dataset_name="org/talk", dataset_config="SFT", dataset_train_split="beta_think")
    dd = get_dataset(args)
    assert len(dd["train"]) == 4 and "test" not in dd  # "test" is optional: no such split, no test set
    with pytest.raises(SplitNotFoundError, match="'.*org/talk' config 'SFT' has no split 'nope'"):
        load_source("org/talk", split="nope", config="SFT")


def test_an_unreachable_hub_id_is_a_file_not_found_error(monkeypatch):
    def offline(*args, **kwargs):
        raise ConnectionError("Couldn't reach 'org/typo' on the Hub")

    monkeypatch.setattr(datasets, "load_dataset_builder", offline)
    with pytest.raises(FileNotFoundError, match="read as a hub id.*builtin:NAME"):
        load_source("org/typo")


def test_hub_splits_are_prepared_once_per_machine_not_once_per_job(monkeypatch):
    """Node-local caches: the first rank of each machine prepares, that machine's other ranks wait (accelerate's
    local_main_process_first), not the job's rank 0 alone."""
    import contextlib

    import accelerate
    import torch.distributed as dist

    from align.data import hub

    used = []

    class State:
        def local_main_process_first(self):
            used.append("local")
            return contextlib.nullcontext()

        def main_process_first(self):
            used.append("global")
            return contextlib.nullcontext()

    monkeypatch.setattr(dist, "is_initialized", lambda: True)
    monkeypatch.setattr(accelerate, "PartialState", State)
    with hub._main_process_first():
        pass
    assert used == ["local"]
