"""What a stage needs to run on many processes: full weights from sharded ones, rank-split evaluation, per-rank seeds.

Why: under DeepSpeed ZeRO-3 every rank holds a shard of every parameter (`p.data` is empty outside
`deepspeed.zero.GatheredParameters`), under FSDP2 parameters are DTensors, and anything collective (a gather, a
save) hangs when one rank skips it. Code that reads whole weights (a push to the rollout engine, generation with
the trained model, an evaluation, a LoRA merge) goes through these helpers, on EVERY rank:

    with full_model(trainer.model_wrapped, trainer.accelerator) as model:   # gathered under ZeRO-3
        mine = evaluate(model, shard(rows))                                  # each rank its share
    results = gather_shards(mine)                                            # every rank gets all, in order
    for name, tensor in iter_full_params(model, accelerator): ...            # one parameter at a time
    with zero3_init_disabled():                                              # a whole model on this process
        engine = VLLMEngine(path)

Without a process group every helper is the identity, so single-process code paths are unchanged.
"""

from __future__ import annotations

import contextlib
import functools
import hashlib
import os
from collections.abc import Iterator, Sequence
from typing import Any

import torch


def world() -> tuple[int, int]:
    """(rank, world size) of the default process group, (0, 1) without one."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def launched_world_size() -> int:
    """The world size the launcher announced (WORLD_SIZE), before any process group exists."""
    return int(os.environ.get("WORLD_SIZE", "1") or 1)


def is_zero3(accelerator: Any = None) -> bool:
    """DeepSpeed ZeRO-3 is on (parameters are partitioned across ranks)."""
    if accelerator is not None:
        plugin = getattr(accelerator.state, "deepspeed_plugin", None)
        return plugin is not None and getattr(plugin, "zero_stage", 0) == 3
    from transformers.integrations import is_deepspeed_zero3_enabled

    return is_deepspeed_zero3_enabled()


def fsdp_version(accelerator: Any) -> int | None:
    plugin = getattr(accelerator.state, "fsdp_plugin", None)
    return getattr(plugin, "fsdp_version", None) if plugin is not None else None


@contextlib.contextmanager
def zero3_init_disabled():
    """Build or load a WHOLE model on this process while ZeRO-3 is on (a rollout engine, an eval copy, a merge).

    transformers partitions every model it builds (`deepspeed.zero.Init`) while a ZeRO-3 config is registered;
    vLLM's model build then fails ("Cannot copy out of meta tensor") and a model loaded on rank 0 alone waits
    for the other ranks forever. The registration is a module-level weak reference: unset it, restore it."""
    from transformers.integrations import deepspeed as hf_ds

    saved = hf_ds._hf_deepspeed_config_weak_ref
    hf_ds._hf_deepspeed_config_weak_ref = None
    try:
        yield
    finally:
        hf_ds._hf_deepspeed_config_weak_ref = saved


@contextlib.contextmanager
def full_model(model: torch.nn.Module, accelerator: Any):
    """The unwrapped model with every parameter whole (ZeRO-3: gathered on all ranks, DeepSpeed's hooks off), in
    eval mode; training mode is restored after. Collective under ZeRO-3: every rank must enter.

    `model` is what the trainer wraps (`trainer.model_wrapped`; before training the plain model is fine). TRL's
    `unwrap_model_for_generation` does the gathering, as in its own trainers. `accelerator=None`: a model loaded
    but not yet given to a trainer (partitioned by transformers under ZeRO-3, no hooks)."""
    from trl.models import unwrap_model_for_generation

    if accelerator is None:  # a model no trainer has wrapped yet (no DeepSpeed hooks): gather it whole
        gathered = _gatherer(any(hasattr(p, "ds_id") for p in model.parameters()))(list(model.parameters()))
    else:  # the checkpointing the trainer set (LoRA + ZeRO-3 wants TRL's use_reentrant=True) comes back unchanged
        inner = accelerator.unwrap_model(model)
        gathered = unwrap_model_for_generation(
            model, accelerator, gradient_checkpointing_kwargs=checkpointing_kwargs(inner)
        )
    with gathered as unwrapped:
        unwrapped = model if accelerator is None else unwrapped
        was_training = unwrapped.training
        unwrapped.eval()
        try:
            with torch.no_grad():
                yield unwrapped
        finally:
            unwrapped.train(was_training)


def checkpointing_kwargs(model: torch.nn.Module) -> dict | None:
    """The kwargs gradient checkpointing was enabled with (transformers keeps them in each layer's
    `_gradient_checkpointing_func` partial), None when it is off. TRL's `unwrap_model_for_generation` turns
    checkpointing off for generation and back on with the kwargs it is given: without them it falls back to
    transformers' default (`use_reentrant=False`), undoing what the trainer chose after the first generation."""
    if not getattr(model, "is_gradient_checkpointing", False):
        return None
    for module in model.modules():
        func = getattr(module, "_gradient_checkpointing_func", None)
        if isinstance(func, functools.partial):
            return dict(func.keywords)
    return None


def _hf_name(name: str) -> str:
    """A PEFT/FSDP/compile parameter name -> the base model's HF name."""
    name = name.replace("_checkpoint_wrapped_module.", "").replace("_fsdp_wrapped_module.", "")
    name = name.removeprefix("base_model.model.").replace(".base_layer", "")
    return name.replace(".modules_to_save.default", "")


def iter_full_params(model: torch.nn.Module, accelerator: Any = None) -> Iterator[tuple[str, torch.Tensor]]:
    """(HF name, whole tensor) for every parameter of the (unwrapped) model, one at a time; LoRA merged in.

    ZeRO-3: each parameter is gathered while it is yielded (a LoRA model is gathered whole, because merging
    needs base and adapter together); FSDP2: `full_tensor()`. The tensors are views into live storage that
    change after the generator moves on: a consumer copies what it keeps (the engines load them at once).
    Collective under ZeRO-3/FSDP: every rank must run the generator to the end."""
    zero3 = is_zero3(accelerator) if accelerator is not None else any(hasattr(p, "ds_id") for p in model.parameters())
    gather = _gatherer(zero3)
    if hasattr(model, "peft_config"):
        with gather(list(model.parameters())):
            model.merge_adapter()
            try:
                for name, p in model.named_parameters():
                    if "lora_" in name or "original_module" in name:
                        continue
                    yield _hf_name(name), _whole(p)
            finally:
                model.unmerge_adapter()
        return
    for name, p in model.named_parameters():
        with gather([p]):
            yield _hf_name(name), _whole(p)


def _gatherer(zero3: bool):
    if not zero3:
        return lambda params: contextlib.nullcontext()
    import deepspeed

    return lambda params: deepspeed.zero.GatheredParameters(params)


def _whole(p: torch.Tensor) -> torch.Tensor:
    data = p.data
    if hasattr(data, "full_tensor"):  # FSDP2 DTensor
        data = data.full_tensor()
    return data


def num_params(model: torch.nn.Module) -> int:
    """Parameter count that holds under ZeRO-3 (where `p.numel()` is the local shard's, often 0)."""
    return sum(getattr(p, "ds_numel", p.numel()) for p in model.parameters())


def param_ndim(p: torch.Tensor) -> int:
    """A parameter's real number of dimensions (ZeRO-3 shards are flat)."""
    shape = getattr(p, "ds_shape", None)
    return len(shape) if shape is not None else p.ndim


# ----------------------------------------------------------------------------- rank-split work


def shard(items: Sequence, rank: int | None = None, size: int | None = None) -> list:
    """This rank's share of `items`: every size-th one from its rank (so `gather_shards` restores the order)."""
    if rank is None or size is None:
        rank, size = world()
    return list(items[rank::size])


def gather_objects(obj: Any) -> list:
    """Every rank's `obj`, in rank order (a list of one without a process group)."""
    import torch.distributed as dist

    rank, size = world()
    if size == 1:
        return [obj]
    out: list = [None] * size
    dist.all_gather_object(out, obj)
    return out


def gather_shards(mine: list) -> list:
    """Undo `shard`: every rank's results merged back into the original item order, on every rank."""
    parts = gather_objects(list(mine))
    out = []
    for i in range(max((len(p) for p in parts), default=0)):
        out.extend(p[i] for p in parts if i < len(p))
    return out


def all_max(value: int) -> int:
    """The largest `value` over all ranks (every rank must call it)."""
    return max(gather_objects(int(value)))


def rank_seed(seed: int, *salt: int, rank: int | None = None) -> int:
    """A sampling seed that differs per rank and per call, and repeats for the same (seed, salt, rank).

    >>> rank_seed(0, 1, rank=0) != rank_seed(0, 1, rank=1), rank_seed(3, 2, rank=1) == rank_seed(3, 2, rank=1)
    (True, True)
    """
    if rank is None:
        rank = world()[0]
    # hashed, not seed + rank: engines derive seed + 1, seed + 2, ... for the n samples of a prompt, so consecutive
    # seeds on neighbouring ranks would hand two ranks the same samples
    digest = hashlib.blake2b(repr((int(seed), *map(int, salt), int(rank))).encode(), digest_size=8).digest()
    return int.from_bytes(digest, "little") % (2**31)  # numpy and vLLM take seeds below 2**32


def init_from_launcher() -> None:
    """Join the process group a launcher (`accelerate launch`, torchrun) announced, for scripts without a Trainer
    (evaluation, data generation): gloo on CPUs, NCCL on GPUs. A no-op in one plain process."""
    import torch.distributed as dist

    if launched_world_size() > 1 and dist.is_available() and not dist.is_initialized():
        if torch.cuda.is_available():
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        dist.init_process_group(backend="nccl" if torch.cuda.is_available() else "gloo")


def leave_launcher() -> None:
    """The end of a script that called `init_from_launcher`: every rank waits for the others, then the group is
    closed (a gloo group left open at exit can abort a rank whose peer has already gone); a launched CPU rank
    exits right there (`_exit_now`). Normal exits only."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        dist.barrier()
        if launched_world_size() > 1 and not torch.cuda.is_available():
            _exit_now()
        dist.destroy_process_group()


def _exit_now() -> None:
    """End a launched CPU rank here, after the last barrier: every rank's work is saved and flushed. Tearing the
    interpreter down normally sometimes aborts a rank ("terminate called without an active exception": a C++
    thread of a DeepSpeed/gloo extension destroyed while joinable), failing a stage that had finished (under
    load, in pretraining and APO under ZeRO-3). An open wandb run is finished first."""
    import logging
    import sys

    wandb = sys.modules.get("wandb")
    if wandb is not None and getattr(wandb, "run", None) is not None:
        wandb.finish()
    logging.shutdown()
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


def barrier() -> None:
    """Wait for every rank (a no-op without a process group)."""
    import torch.distributed as dist

    if world()[1] > 1:
        dist.barrier()


def release_accelerator_state() -> None:
    """Let the next round's trainer (distillation's or preference optimisation's rounds) build its own Accelerator,
    DeepSpeed engine included. accelerate keeps one process-wide `AcceleratorState`, and under DeepSpeed a second
    `Accelerator` may not bring a `deepspeed_plugin` ("You cannot pass in a `deepspeed_plugin` when creating a second
    `Accelerator`", accelerator.py), so round 2 of a ZeRO-3 launch would fail there. The round's trainer is gone by
    now (its engine with it, after the collection);
    clearing the accelerator's and the gradient accumulation's shared state (accelerate's `_reset_state`, what its
    and transformers' tests call between trainers) keeps `PartialState`, the process group the ranks share, so the
    next round joins the same group."""
    import gc

    from accelerate.state import AcceleratorState, GradientState

    gc.collect()
    if torch.cuda.is_available():  # GPU only: hand the last round's freed blocks back before the next engine loads
        torch.cuda.empty_cache()
    AcceleratorState._reset_state(reset_partial_state=False)
    GradientState._reset_state()
