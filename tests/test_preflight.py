"""align/runtime/preflight.py: each check on tables of good and bad values, the whole preflight on a real Trainer
(passes, catches sorted data, leaves the RNG alone, skips loudly), and the collective checks on two real gloo ranks."""

from __future__ import annotations

import json
import random
from pathlib import Path

import pytest
import torch

from align.runtime.checkpoint import write_marker
from align.runtime.preflight import PreflightError, gather, preflight
from align.runtime.preflight_checks import (
    check_checkpoint,
    check_data_order,
    check_known_answer,
    check_masks,
    check_output_dir,
    check_roundtrip,
    check_same_weights,
    check_seeds,
    check_shuffled,
    estimate_checkpoint_bytes,
    spearman,
    weights_digest,
)
from rewards import math_reward

TEMPLATES = Path(__file__).resolve().parent / "fixtures" / "templates"


@pytest.fixture(scope="module")
def tok():
    from data_gen.tasks import make_tasks
    from pretrain.tokenizer import train_tokenizer

    rows = make_tasks(["arithmetic", "compare"], num=40, split="train", seed=0)
    return train_tokenizer([r["prompt"] + " " + r["answer"] for r in rows] * 3, vocab_size=300)


# ----------------------------------------------------------------------------- the pure checks


def test_same_weights_names_the_odd_rank():
    assert check_same_weights(["a", "a", "a"]) is None
    assert check_same_weights(["partitioned", "x"]) is None  # ZeRO-3: ranks hold different shards by design
    assert "ranks [1] start from different weights than rank 0" in check_same_weights(["a", "b", "a"])


@pytest.mark.parametrize(
    "prints, samples, dropout, problem",
    [
        (["s", "s"], True, 0.0, "completions sampled for the same prompt would be identical"),
        (["s", "s"], False, 0.1, "dropout (0.1) would drop the same units"),
        (["s", "s"], False, 0.0, None),  # no sampling, no dropout: nothing draws from the RNG
        (["s", "t"], True, 0.1, None),
        (["s"], True, 0.1, None),
    ],
)
def test_seeds(prints, samples, dropout, problem):
    got = check_seeds(prints, samples, dropout)
    assert (got is None) if problem is None else (problem in got)


def test_spearman():
    xs = list(range(50))
    assert spearman(xs, xs) == pytest.approx(1.0)
    assert spearman(xs, xs[::-1]) == pytest.approx(-1.0)
    assert spearman(xs, [1.0] * 50) == 0.0
    shuffled = xs[:]
    random.Random(0).shuffle(shuffled)
    assert abs(spearman(xs, shuffled)) < 0.3


@pytest.mark.parametrize(
    "orders, size, mult, capped, problem",  # batch size 1: at most one index per rank may be padding
    [
        ([[0, 2, 4], [1, 3, 5]], 6, 1, False, None),
        ([[0, 2, 4], [1, 3, 0]], 5, 1, False, None),  # the wrap-around padding that evens out the last batch
        ([[0, 1, 2], [0, 1, 2]], 6, 1, False, "ranks [0, 1] read the same rows (3 sample indices in common"),
        ([[0, 1, 1, 2]], 4, 1, False, "sample index 1 is read 2 times in one epoch"),
        ([[0, 0, 1, 1], [0, 0, 1, 1]], 2, 4, False, None),  # GRPO: each prompt num_generations times, across ranks
        ([[0, 1, 1]], 3, 1, True, "sample index 1 is read 2 times"),
    ],
)
def test_data_order(orders, size, mult, capped, problem):
    got = check_data_order(orders, size, mult, capped)
    assert (got is None) if problem is None else (problem in got), got


def test_shuffled_catches_length_and_source_order():
    lengths = [float(i % 37) for i in range(200)]
    random.Random(1).shuffle(lengths)
    assert check_shuffled(lengths) is None
    assert "sorted by length (Spearman rho=1.00" in check_shuffled(sorted(lengths))
    assert "sorted by length" in check_shuffled(sorted(lengths, reverse=True))
    sources = ["news"] * 100 + ["code"] * 100
    assert "grouped by source (99% of neighbouring rows share a source vs 50%" in check_shuffled(lengths, sources)
    random.Random(2).shuffle(sources)
    assert check_shuffled(lengths, sources) is None
    assert check_shuffled(sorted(lengths)[:10]) is None  # too few rows to judge


def test_disk_estimate_and_output_dir(tmp_path):
    model = torch.nn.Linear(10, 10)  # 110 fp32 params: 440 bytes of weights, 880 of Adam moments
    assert estimate_checkpoint_bytes(model, 2) == int(1.1 * (2 * (440 + 880) + 440))
    assert estimate_checkpoint_bytes(model, 2, save_only_model=True) == int(1.1 * (2 * 440 + 440))
    assert check_output_dir(str(tmp_path / "new" / "run"), 1000) is None
    assert not (tmp_path / "new").exists()  # checking writes nothing that stays
    assert "GiB are free" in check_output_dir(str(tmp_path), 10**18)
    (tmp_path / "f").write_text("x")
    assert "exists and is a file" in check_output_dir(str(tmp_path / "f"), 1)
    assert "is not writable" in check_output_dir("/proc/self/run", 1)


def test_checkpoint_readability(tmp_path):
    from safetensors.torch import save_file

    model = torch.nn.Linear(4, 3)
    ckpt = tmp_path / "checkpoint-1"
    ckpt.mkdir()
    save_file({k: v.contiguous() for k, v in model.state_dict().items()}, ckpt / "model.safetensors")
    (ckpt / "trainer_state.json").write_text(json.dumps({"global_step": 1}))
    torch.save({"state": {}}, ckpt / "optimizer.pt")
    write_marker(str(ckpt), 1)
    assert check_checkpoint(str(ckpt), model) is None
    assert "belongs to another model" in check_checkpoint(str(ckpt), torch.nn.Linear(4, 5))
    # under ZeRO-3 a rank's parameter is its shard (shape (0,)) and DeepSpeed keeps the full shape in `ds_shape`
    sharded = torch.nn.Linear(4, 3)
    for p in sharded.parameters():
        p.ds_shape, p.data = p.shape, torch.empty(0)
    assert check_checkpoint(str(ckpt), sharded) is None
    sharded.weight.ds_shape = torch.Size([5, 4])
    assert "has shape (3, 4) but the model's is (5, 4)" in check_checkpoint(str(ckpt), sharded)
    (ckpt / "optimizer.pt").write_bytes(b"torn")
    assert "optimizer.pt is corrupt" in check_checkpoint(str(ckpt), model)
    (ckpt / "trainer_state.json").write_text("{")
    assert "trainer_state.json is unreadable" in check_checkpoint(str(ckpt), model)


def test_tokenizer_roundtrip(tok):
    assert check_roundtrip(tok, ["What is 12 + 30?", "  spaced\n\ttabs and \\boxed{3/4}"]) is None
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    word = Tokenizer(models.WordLevel({"[UNK]": 0, "hello": 1}, unk_token="[UNK]"))
    word.pre_tokenizer = pre_tokenizers.Whitespace()
    lossy = PreTrainedTokenizerFast(tokenizer_object=word, unk_token="[UNK]")
    assert "does not round-trip 'hello world' -> 'hello [UNK]' (it maps characters to the unknown token)" in (
        check_roundtrip(lossy, ["hello world"])
    )


def test_masks_for_any_template(tok):
    conv = [{"role": "user", "content": "What is 2 + 2?"}, {"role": "assistant", "content": "The answer is 4."}]
    assert check_masks(tok, [{"messages": conv}]) is None
    llama3 = (TEMPLATES / "llama3.jinja").read_text()
    assert check_masks(tok, [{"messages": conv}], chat_template=llama3) is None  # no generation markers
    assert check_masks(tok, [{"prompt": conv[:1], "chosen": conv[1:]}]) is None
    assert check_masks(tok, [{"prompt": conv[:1], "answer": "4"}]) is None  # GRPO prompts render
    assert "all zeros" in check_masks(tok, [{"messages": conv[:1]}])
    assert "all zeros" in check_masks(tok, [{"input_ids": [1, 2], "assistant_masks": [0, 0]}])
    drops = (Path(__file__).parent / "fixtures" / "bad_inputs" / "drops_assistant.jinja").read_text()
    assert "cannot be located" in check_masks(tok, [{"messages": conv}], chat_template=drops)


def test_known_answer():
    rows = [{"prompt": "2+2?", "answer": "4", "reward": "math_reward"}, {"prompt": "1/2+1/4?", "answer": "3/4"}]
    assert check_known_answer([math_reward], rows) is None
    assert check_known_answer(None, []) is None  # the fixed item: \boxed{3/4} scores 1 with math_reward

    def always(completions, **kw):
        return [1.0] * len(completions)

    def short(completions, **kw):
        return [0.0]

    def boom(completions, **kw):
        raise KeyError("answer_text")

    rows2 = [{**r, "reward": "always"} for r in rows]
    assert "reward 'always' gives 1.0 to wrong answers too" in check_known_answer([always], rows2)
    assert "reward 'short' returned 1 scores for 2 completions" in check_known_answer([math_reward, short], rows)
    assert "reward 'boom' raised KeyError" in check_known_answer([boom], rows)

    def broken_math(completions, answer, **kw):
        return [0.0] * len(completions)

    broken_math.__name__ = "math_reward"
    assert "scores the gold answer '4' as 0.0 (expected 1.0)" in check_known_answer([broken_math], rows)


# ----------------------------------------------------------------------------- the whole preflight on a Trainer


def _trainer(tok, tmp_path, rows: int = 48, sort: bool = False, **kw):
    import datasets
    from transformers import DataCollatorForLanguageModeling, LlamaConfig, LlamaForCausalLM, Trainer, TrainingArguments

    texts = [f"What is {i} + {i}? " + "and more " * (i % 11) for i in range(rows)]
    if sort:
        texts.sort(key=len)
    ds = datasets.Dataset.from_dict({"input_ids": [tok(t)["input_ids"] for t in texts], "text": texts})
    torch.manual_seed(0)
    config = LlamaConfig(
        vocab_size=len(tok),
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=1,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=128,
    )
    args = TrainingArguments(
        output_dir=str(tmp_path / "out"),
        per_device_train_batch_size=4,
        max_steps=2,
        report_to="none",
        use_cpu=True,
        seed=0,
        save_strategy="steps",
        save_steps=1,
        save_total_limit=2,
        **kw,
    )
    return Trainer(
        model=LlamaForCausalLM(config),
        args=args,
        train_dataset=ds,
        processing_class=tok,
        data_collator=DataCollatorForLanguageModeling(tok, mlm=False),
    )


def test_preflight_passes_on_a_sound_setup_and_leaves_the_rng_alone(tok, tmp_path):
    trainer = _trainer(tok, tmp_path)
    state = torch.get_rng_state()
    checks = preflight(trainer, stage="sft")
    assert torch.equal(state, torch.get_rng_state())  # the run trains with exactly the RNG it would have had
    assert [c.name for c in checks] == [
        "output_dir",
        "resume",
        "tokenizer",
        "chat_template",
        "known_answer",
        "data_order",
        "weights",
        "seeds",
    ]
    assert all(c.ok for c in checks)


def test_preflight_catches_length_sorted_data_and_a_torn_resume(tok, tmp_path):
    trainer = _trainer(tok, tmp_path, sort=True, train_sampling_strategy="sequential")
    with pytest.raises(
        PreflightError,
        match=r"preflight failed for stage 'sft' \(1 check\(s\)\): data_order: the "
        r"training order is sorted by length \(Spearman rho=(0\.9|1\.0)",
    ):
        preflight(trainer, stage="sft")
    trainer = _trainer(tok, tmp_path)
    ckpt = Path(trainer.args.output_dir) / "checkpoint-5"
    ckpt.mkdir(parents=True)
    (ckpt / "trainer_state.json").write_text("{}")
    write_marker(str(ckpt), 5)
    with pytest.raises(PreflightError, match=r"resume: checkpoint .*checkpoint-5: trainer_state.json is unreadable"):
        preflight(trainer, stage="sft")


def test_skip_preflight_is_loud(tok, tmp_path, capsys):
    from types import SimpleNamespace

    trainer = _trainer(tok, tmp_path, sort=True, train_sampling_strategy="sequential")
    assert preflight(trainer, SimpleNamespace(skip_preflight=True), stage="sft") == []
    assert "PREFLIGHT SKIPPED for stage 'sft' (skip_preflight=true)" in capsys.readouterr().err


# ----------------------------------------------------------------------------- two real ranks (gloo)


def _rank_main(rank: int, world_size: int, init: str, out: str) -> None:
    import torch.distributed as dist
    from torch.utils.data import DistributedSampler, RandomSampler

    dist.init_process_group("gloo", init_method=init, rank=rank, world_size=world_size)
    torch.manual_seed(0)
    same = weights_digest(torch.nn.Linear(8, 8))
    torch.manual_seed(rank)  # the 1T-token bug: init seeded per rank
    differ = weights_digest(torch.nn.Linear(8, 8))
    data = list(range(10))
    sharded = list(DistributedSampler(data, num_replicas=world_size, rank=rank, shuffle=True, seed=0))
    unsharded = list(RandomSampler(data, generator=torch.Generator().manual_seed(0)))  # every rank reads it all
    torch.manual_seed(0)
    rng = str(torch.get_rng_state().sum().item())
    result = {
        "same": check_same_weights(gather(same)),
        "differ": check_same_weights(gather(differ)),
        "sharded": check_data_order(gather(sharded), len(data)),
        "unsharded": check_data_order(gather(unsharded), len(data)),
        "seeds": check_seeds(gather(rng), samples=True, dropout=0.0),
    }
    Path(out, f"rank{rank}.json").write_text(json.dumps(result))
    dist.destroy_process_group()


def test_collective_checks_on_two_gloo_ranks(tmp_path):
    # fork: the ranks start in milliseconds (spawn would re-import torch in each, ~30 s on a loaded machine); but a
    # test process that already ran an in-process vLLM engine (its threads, its process group) cannot be forked
    import sys

    import torch.multiprocessing as mp

    method = "spawn" if "vllm" in sys.modules else "fork"
    mp.start_processes(
        _rank_main, args=(2, f"file://{tmp_path / 'store'}", str(tmp_path)), nprocs=2, join=True, start_method=method
    )
    results = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in range(2)]
    assert results[0] == results[1]  # every rank sees every rank's values and decides alike
    r = results[0]
    assert r["same"] is None and r["sharded"] is None
    assert "ranks [1] start from different weights than rank 0" in r["differ"]
    assert "ranks [0, 1] read the same rows (10 sample indices in common" in r["unsharded"]
    assert "ranks [0, 1] share one RNG state" in r["seeds"]
