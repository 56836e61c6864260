"""Streamed pretraining corpora (pretrain/data.py): hub-shaped sources read as IterableDatasets, a text column named in
the recipe, per-rank shards, held-out documents, exact resume, and a corpus never held whole in memory.

Run: pytest tests/test_pretrain_streaming.py -q   (~15 s; local fixture repos, no network)
"""

from __future__ import annotations

import json
import tracemalloc

import pytest
import torch
from hub_fixtures import text_rows, write_repo
from test_pretrain_helpers import synthetic_docs, tiny_config, tiny_model_args, tiny_tokenizer

from pretrain.data import PackedStream, StreamingDocumentSource, load_documents
from pretrain.train import train

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def tok():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """A hub-shaped code corpus: config "python", the text in a `content` column (as StarCoderData keeps it)."""
    rows = [{"content": d, "id": i} for i, d in enumerate(synthetic_docs("words", 120, seed=7))]
    return str(write_repo(tmp_path_factory.mktemp("hub") / "code", {"python": {"train": rows}}))


def source(corpus, **kw):
    return {"spec": corpus, "config": "python", "text_column": "content", "streaming": True, **kw}


def _docs(src: StreamingDocumentSource, num: int) -> list[str]:
    return [src._next_text() for _ in range(num)]


def test_streamed_source_reads_the_named_column_holds_out_documents_and_shards_by_rank(tok, corpus):
    docs = synthetic_docs("words", 120, seed=7)
    src = StreamingDocumentSource("code", source(corpus), tok, seq_len=32, seed=0, eval_docs=5)
    assert src.eval_texts == docs[:5]  # the first documents of the stream, the same on every rank
    assert _docs(src, 115) == docs[5:] and src.epoch == 0  # one pass: every other document, in order
    _docs(src, 1)
    assert src.epoch == 1  # then a second epoch begins
    ranks = [StreamingDocumentSource("code", source(corpus), tok, 32, 0, 5, rank=r, world_size=2) for r in (0, 1)]
    seen = [set(_docs(s, 57)) for s in ranks]  # (115 training documents, one shard = every other example)
    assert not seen[0] & seen[1] and len(seen[0] | seen[1]) == 114 and not (seen[0] | seen[1]) & set(docs[:5])
    with pytest.raises(ValueError, match="has no column 'text'.*set text_column"):
        StreamingDocumentSource("code", {"spec": corpus, "config": "python", "streaming": True}, tok, 32, 0)


def test_streamed_stream_resumes_exactly_through_json(tok, corpus):
    stages = [{"num_tokens": 10_000, "weights": {"code": 1, "math": 1}}]
    sources = {"code": source(corpus), "math": synthetic_docs("math", 50)}
    s = PackedStream(sources, stages, tok, seq_len=32, eval_docs=3)
    for _ in range(9):
        s.next_batch(3)
    state = json.loads(json.dumps(s.state_dict()))  # it goes into trainer_state.json
    expected = [s.next_batch(3)["input_ids"] for _ in range(8)]
    fresh = PackedStream(sources, stages, tok, seq_len=32, eval_docs=3)
    fresh.load_state_dict(state)
    assert all(torch.equal(e, fresh.next_batch(3)["input_ids"]) for e in expected)
    assert set(fresh.eval_batches(2)) == {"code", "math"}


def test_one_streamed_source_shards_the_whole_stream_per_rank(tok, corpus):
    stages = [{"num_tokens": 320, "weights": {"code": 1}}, {"num_tokens": 10_000, "weights": {"math": 1}}]
    math = [f"{i}. {d}" for i, d in enumerate(synthetic_docs("math", 40))]
    sources = {"code": source(corpus), "math": math}
    ranks = [PackedStream(sources, stages, tok, seq_len=32, rank=r, world_size=2) for r in (0, 1)]
    assert all(s.sharded for s in ranks)
    batches = [s.next_batch(5)["input_ids"] for s in ranks]  # 2 ranks x 5 rows x 32 = the stage's 320 tokens
    assert not {tuple(r) for r in batches[0].tolist()} & {tuple(r) for r in batches[1].tolist()}
    assert [s.tokens_emitted for s in ranks] == [320, 320]  # the global count: stage 2 starts on both ranks
    assert all(s.next_batch(1) is not None and s.stage_index == 1 for s in ranks)
    math_docs = [set(s.sources["math"].texts) for s in ranks]
    assert not math_docs[0] & math_docs[1] and len(math_docs[0] | math_docs[1]) == 40  # dealt out, every one
    with pytest.raises(ValueError, match="same sources and number of processes"):
        ranks[0].load_state_dict({"buffer": [], "sources": {}})


def test_a_streamed_corpus_is_never_held_whole(tok, tmp_path):
    import pyarrow as pa

    rows = text_rows(1500, "big", words=300)  # ~2 MB of text in 12 parquet files, as a hub corpus is sharded
    root = write_repo(tmp_path / "big", {"default": {"train": rows}}, num_files=12, rows_per_group=25)
    corpus_bytes = sum(len(r["text"]) for r in rows)
    del rows
    tracemalloc.start()
    src = StreamingDocumentSource("web", {"spec": str(root), "streaming": True}, tok, seq_len=4096, seed=0)
    arrow_peak = 0
    while src.epoch == 0:  # one full pass over the corpus
        src.next_chunk()
        arrow_peak = max(arrow_peak, pa.total_allocated_bytes())
    _, python_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert python_peak + arrow_peak < corpus_bytes / 3, (python_peak, arrow_peak, corpus_bytes)
    # the same corpus in memory (the tiny world's path) does hold it whole: the measurement can tell
    tracemalloc.start()
    texts = load_documents({"spec": str(root)})
    _, in_memory_peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    assert len(texts) == 1500 and in_memory_peak > corpus_bytes


def test_train_with_a_streamed_source_resumes_to_the_same_losses(tmp_path, corpus):
    sources = {"code": source(corpus), "math": synthetic_docs("math", 200)}
    stages = [{"num_tokens": 4000, "weights": {"code": 0.5, "math": 0.5}}]
    kw = dict(sources=sources, stages=stages, max_steps=6, eval_steps=0, save_total_limit=1)
    full = [h["loss"] for h in train(tiny_model_args(), tiny_config(tmp_path / "full", **kw))["history"]]
    train(tiny_model_args(), tiny_config(tmp_path / "cut", stop_after_steps=3, **kw))
    resumed = train(tiny_model_args(), tiny_config(tmp_path / "cut", resume_from_checkpoint="auto", **kw))
    assert [h["loss"] for h in resumed["history"]] == full


WORKER = """
import json, sys
sys.path[:0] = [{root!r}, {tests!r}]
import torch
torch.set_num_threads(1)
from accelerate import Accelerator
from hub_fixtures import write_repo
from test_pretrain_helpers import synthetic_docs, tiny_config, tiny_model_args
from pretrain.train import train
out = sys.argv[1]
acc = Accelerator(cpu=True)
if acc.is_main_process:
    write_repo(out + "/corpus", {{"python": {{"train": [{{"content": d}} for d in synthetic_docs("words", 200, 3)]}}}},
               num_files=2)
acc.wait_for_everyone()
src = {{"spec": out + "/corpus", "config": "python", "text_column": "content", "streaming": True}}
kw = dict(sources={{"code": src, "math": synthetic_docs("math", 100)}}, micro_batch_size=2, max_steps=6,
          stages=[{{"num_tokens": 4000, "weights": {{"code": 1, "math": 1}}}}], eval_steps=0, save_total_limit=1)
full = [h["loss"] for h in train(tiny_model_args(), tiny_config(out + "/full", **kw))["history"]]
train(tiny_model_args(), tiny_config(out + "/cut", stop_after_steps=3, **kw))
resumed = train(tiny_model_args(), tiny_config(out + "/cut", resume_from_checkpoint="auto", **kw))["history"]
if acc.is_main_process:
    json.dump({{"full": full, "resumed": [h["loss"] for h in resumed]}}, open(out + "/losses.json", "w"))
from align.runtime.distributed import leave_launcher
leave_launcher()  # how our scripts end under a launcher (a gloo group torn down at exit can abort a rank)
"""


@pytest.mark.slow
def test_two_ranks_stream_their_own_shards_and_resume_exactly(tmp_path):
    import os
    import subprocess
    import sys

    from launching import free_port

    tests = os.path.dirname(os.path.abspath(__file__))
    (tmp_path / "worker.py").write_text(WORKER.format(root=os.path.dirname(tests), tests=tests))
    cmd = [
        sys.executable,
        "-m",
        "torch.distributed.run",
        "--nproc_per_node",
        "2",
        "--master_port",
        str(free_port()),
        str(tmp_path / "worker.py"),
        str(tmp_path),
    ]
    proc = subprocess.run(cmd, env={**os.environ, "OMP_NUM_THREADS": "1"}, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stderr[-3000:]
    losses = json.loads((tmp_path / "losses.json").read_text())
    assert losses["resumed"] == losses["full"]  # every rank's stream position came back from the checkpoint
