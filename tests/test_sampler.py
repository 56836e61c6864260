"""align/rollout/sampler.py and align/runtime/distributed.py in one process: when weights are pushed and what they are
(LoRA merged while the push reads them), per-rank seeds, a server synced from the main process only, rank-split work.
The same code on 2 ranks under ZeRO-3 is tested in tests/test_distributed.py."""

from __future__ import annotations

import copy
from types import SimpleNamespace

import pytest
import torch
from transformers import LlamaConfig, LlamaForCausalLM

from align.rollout.sampler import Sampler, build_sampler
from align.rollout.vllm_server import VLLMServerEngine
from align.runtime.distributed import gather_shards, iter_full_params, rank_seed, shard


def tiny_llama(seed: int = 0) -> LlamaForCausalLM:
    torch.manual_seed(seed)
    config = LlamaConfig(
        vocab_size=64,
        hidden_size=16,
        intermediate_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=1,
        max_position_embeddings=64,
        tie_word_embeddings=True,
    )
    return LlamaForCausalLM(config)


class RecordingEngine:
    """An engine with its own copy: records what each push sent (copied while the iterator holds it valid)."""

    backend = "vllm"
    model = None

    def __init__(self):
        self.pushed: list[dict[str, torch.Tensor]] = []
        self.slept = 0

    def update_weights(self, named):
        self.pushed.append({n: t.clone() for n, t in named})
        self.weights_discarded = False

    def generate(self, prompts, params):
        return [[SimpleNamespace(completion_ids=[1], finish_reason="stop")] for _ in prompts]

    def sleep(self, level: int = 1):
        self.slept += 1
        self.levels = [*getattr(self, "levels", []), level]
        self.weights_discarded = level >= 2

    def close(self):
        pass


def accelerator(main: bool = True, index: int = 0):
    waits = []
    acc = SimpleNamespace(
        is_main_process=main,
        process_index=index,
        unwrap_model=lambda m: m,
        wait_for_everyone=lambda: waits.append(1),
        state=SimpleNamespace(deepspeed_plugin=None),
    )
    return acc, waits


def test_sync_pushes_once_per_step_and_not_at_all_to_an_engine_sharing_the_model():
    model, engine = tiny_llama(), RecordingEngine()
    sampler = Sampler(engine, None, seed=0)
    for step in (0, 0, 1, 1, 1, 2):
        sampler.sync(model, step)
    assert len(engine.pushed) == 3 and sampler.num_pushes == 3
    assert set(engine.pushed[0]) == {n for n, _ in model.named_parameters()}
    engine.model = model  # the hf backend generates with the trained model itself
    sampler.sync(model, 3)
    assert len(engine.pushed) == 3


def test_an_engine_set_later_is_the_one_pushed_to():
    """The sampler holds one engine: one set after it was built (a server started later) gets the pushes, and
    generates, instead of the first."""
    model, first, later = tiny_llama(), RecordingEngine(), RecordingEngine()
    sampler = Sampler(first, None, seed=0)
    sampler.sync(model, 0)
    sampler.engine = later
    sampler.sync(model, 1)
    assert (len(first.pushed), len(later.pushed)) == (1, 1) and sampler.backend == later.backend
    assert sampler.weights.engine is later


def test_push_sends_the_merged_lora_weights_and_leaves_the_adapter_unmerged():
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj", "v_proj"], init_lora_weights=False))
    base_q = model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight.detach().clone()
    engine = RecordingEngine()
    Sampler(engine, None).push(model)
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    sent = engine.pushed[0]
    assert set(sent) == {n for n in reference if n != "lm_head.weight"}  # plain HF names, no lora_ entries
    assert all(torch.allclose(sent[n], reference[n]) for n in sent)
    q = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.allclose(sent[q], base_q)  # the adapter is in what was sent...
    assert torch.allclose(
        model.base_model.model.model.layers[0].self_attn.q_proj.base_layer.weight, base_q, atol=1e-6
    )  # ...and taken out again


def test_server_weight_stream_reads_the_tensors_while_they_are_valid():
    """The old bug: a list of views materialised after the generator unmerged the adapter sent base weights."""
    from peft import LoraConfig, get_peft_model

    model = get_peft_model(tiny_llama(), LoraConfig(r=2, target_modules=["q_proj"], init_lora_weights=False))
    reference = copy.deepcopy(model).merge_and_unload().state_dict()
    server = VLLMServerEngine.__new__(VLLMServerEngine)
    server.metadata = None
    for _ in range(2):  # the first push learns the metadata (copies), the second streams
        metadata, stream = server.weight_stream(iter_full_params(model))
        sent = {n: t.clone() for n, t in stream}  # TRL's broadcast reads each tensor as the iterator yields it
        assert [m[0] for m in metadata] == list(sent)
        assert all(torch.allclose(sent[n], reference[n]) for n in sent)


def test_a_server_is_pushed_from_the_main_process_only():
    model = tiny_llama()
    for main in (True, False):
        engine = RecordingEngine()
        engine.backend = "vllm-server"
        acc, waits = accelerator(main=main, index=0 if main else 1)
        Sampler(engine, acc).push(model)
        assert len(engine.pushed) == (1 if main else 0)
        assert waits == [1]  # nobody samples before the server has the new weights


def test_sampling_seeds_differ_per_rank_and_call_and_repeat_for_the_same_ones():
    seeds = {(rank, call): rank_seed(7, call, rank=rank) for rank in range(4) for call in range(1, 4)}
    assert len(set(seeds.values())) == len(seeds)
    assert all(abs(a - b) > 1_000 for a in seeds.values() for b in seeds.values() if a != b)  # not seed + j apart
    acc0, _ = accelerator(index=0)
    acc1, _ = accelerator(index=1)
    s0, s0_again, s1 = (
        Sampler(RecordingEngine(), acc0, 7),
        Sampler(RecordingEngine(), acc0, 7),
        Sampler(RecordingEngine(), acc1, 7),
    )
    first = [s0.next_seed(), s0.next_seed()]
    assert first == [s0_again.next_seed(), s0_again.next_seed()]
    assert not set(first) & {s1.next_seed(), s1.next_seed()}


def test_a_sleeping_engine_sleeps_after_each_generation():
    engine, model = RecordingEngine(), tiny_llama()
    sampler = Sampler(engine, None, sleep=True)
    from align.rollout import SamplingParams

    sampler.generate(model, [[1, 2]], SamplingParams(temperature=0))
    sampler.generate(model, [], SamplingParams(temperature=0))  # a rank with no prompts still takes part
    assert engine.slept == 2 and model.training
    # level 2: the weights are dropped, not copied to the host and back; the next sync pushes even at the same
    # step (several generations between two optimizer steps), so the engine never samples without weights
    assert engine.levels == [2, 2] and engine.weights_discarded
    sampler.sync(model, step=7)
    sampler.generate(model, [[1]], SamplingParams(temperature=0))
    sampler.sync(model, step=7)  # same step, but the engine slept at level 2 after generating: push again
    assert len(engine.pushed) == 2 and not engine.weights_discarded


def test_shards_gather_back_in_order():
    items = list(range(11))
    parts = [shard(items, r, 3) for r in range(3)]
    assert sorted(x for p in parts for x in p) == items and all(abs(len(p) - len(parts[0])) <= 1 for p in parts)
    assert gather_shards(shard(items)) == items  # one process: the identity


def test_build_sampler_refuses_an_unknown_backend_and_trl_means_none():
    with pytest.raises(ValueError, match="rollout_backend"):
        build_sampler("sglang", None, tiny_llama(), "", None, None)
    assert build_sampler("trl", None, tiny_llama(), "", None, None) is None


def test_full_model_gives_the_trainers_checkpointing_back_unchanged():
    """TRL's unwrap turns gradient checkpointing off for generation and back on with the kwargs it is handed; with
    none it re-enabled transformers' default (use_reentrant=False), undoing TRL's use_reentrant=True for LoRA +
    ZeRO-3 after the first hf-engine generation. full_model hands back what the trainer set."""
    from accelerate import Accelerator

    from align.runtime.distributed import checkpointing_kwargs, full_model

    model = tiny_llama()
    assert checkpointing_kwargs(model) is None
    model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": True})
    assert checkpointing_kwargs(model) == {"use_reentrant": True}
    accelerator = Accelerator(cpu=True)
    wrapped = accelerator.prepare(model)
    with full_model(wrapped, accelerator) as whole:
        assert not whole.is_gradient_checkpointing  # off while generating
    assert model.is_gradient_checkpointing and checkpointing_kwargs(model) == {"use_reentrant": True}
