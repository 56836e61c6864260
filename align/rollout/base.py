"""The rollout interface every stage that generates shares: token ids in, token ids out.

This module holds the interface (SamplingParams, Rollout, RolloutEngine), the checks every backend runs and the
process-wide engine cache; it imports no backend. The backends (hf.py, vllm.py, vllm_server.py) build on it, and
`align.rollout.factory.get_engine` picks and starts one. Data generation, GRPO, on-policy distillation and
evaluation all take their engine from `get_engine`, so a speed-up or a weight-sync fix lands everywhere at once. Chat
templating stays with the caller; the engine knows nothing of tokenisation.

    from align.rollout import SamplingParams, get_engine
    engine = get_engine("outputs/tiny/sft", backend="auto")          # or a loaded transformers model
    rollouts = engine.generate([[1, 5, 6], [1, 9]], SamplingParams(n=4, temperature=1.0, seed=0))
    engine.update_weights(trainer_model.named_parameters())           # after an optimizer step
    engine.close()

Conventions every backend keeps:
- `completion_ids` include the stop token that ended a rollout (finish_reason "stop"), so a
  trainer learns to emit it; a rollout cut by `max_new_tokens` has finish_reason "length".
- `logprobs[i]` is log p(completion_ids[i]) under the RAW model (`logprobs_kind="raw"`, the default):
  log-softmax of the model's logits, before temperature, top-k or top-p. That is what a trainer
  recomputes with a plain forward pass, so the two can be compared. `logprobs_kind="sampling"`
  asks instead for the log-prob under the distribution the token was drawn from (repetition penalty,
  temperature, min-p, top-k and top-p applied, in vLLM's order; 0 for greedy): what importance sampling
  between engine and trainer needs.
- `stop_token_ids=None` means the model's own EOS ids (generation_config, then config); `[]`
  means stop only at `max_new_tokens`.
- One engine per (backend, model) per process, cached here (`ENGINES`): a second `get_engine` call returns
  the same engine; `close()` releases it (and its cache entry).
"""

from __future__ import annotations

import logging
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any, Protocol, runtime_checkable

import torch

logger = logging.getLogger(__name__)

BACKENDS = ("auto", "hf", "vllm", "vllm-server")
FINISH_REASONS = ("stop", "length")
LOGPROBS_KINDS = ("raw", "sampling")
# vLLM SamplingParams arguments that SamplingParams' own fields set (vLLM name -> our field): `vllm_kwargs` names
# none of them, so a field means the same thing on every engine
VLLM_OWN_KEYS = {
    "n": "n",
    "temperature": "temperature",
    "top_p": "top_p",
    "top_k": "top_k",
    "min_p": "min_p",
    "repetition_penalty": "repetition_penalty",
    "max_tokens": "max_new_tokens",
    "stop_token_ids": "stop_token_ids",
    "seed": "seed",
    "logprobs": "logprobs",
    "detokenize": "(always off: token ids out)",
}


@dataclass
class SamplingParams:
    """How to sample. temperature 0 is greedy (then top_p/top_k/seed are irrelevant)."""

    n: int = field(default=1, metadata={"help": "Rollouts per prompt."})
    temperature: float = field(default=1.0, metadata={"help": "0 = greedy."})
    top_p: float = field(default=1.0, metadata={"help": "Nucleus sampling mass in (0, 1]; 1 = off."})
    top_k: int = field(default=0, metadata={"help": "Keep the k most likely tokens; 0 = off."})
    min_p: float = field(
        default=0.0,
        metadata={
            "help": "Drop tokens less likely (after temperature) than min_p x the most likely one's "
            "probability, as vLLM does; 0 = off."
        },
    )
    repetition_penalty: float = field(
        default=1.0,
        metadata={
            "help": "Divide the positive logits (multiply the negative ones) of tokens already in the "
            "prompt or the completion by this, before temperature (vLLM's and transformers' "
            "penalty); 1 = off."
        },
    )
    max_new_tokens: int = field(default=256, metadata={"help": "Length budget of each completion."})
    stop_token_ids: list[int] | None = field(
        default=None, metadata={"help": "Token ids that end a completion; None = the model's EOS ids, [] = none."}
    )
    seed: int | None = field(default=None, metadata={"help": "Same seed + same prompts -> same rollouts."})
    logprobs: bool = field(default=True, metadata={"help": "Return per-token log-probs (see logprobs_kind)."})
    logprobs_kind: str = field(
        default="raw",
        metadata={
            "help": "raw: the model's log-softmax; sampling: the distribution sampled from (repetition "
            "penalty, temperature, min-p, top-k/p applied), for importance sampling."
        },
    )
    vllm_kwargs: dict[str, Any] = field(
        default_factory=dict,
        metadata={
            "help": "More vLLM SamplingParams arguments, passed as-is by the vllm and vllm-server engines "
            "(e.g. presence_penalty, bad_words); the hf engine refuses any. None of the fields above."
        },
    )

    def __post_init__(self):
        if self.n < 1:
            raise ValueError(f"SamplingParams.n={self.n} must be >= 1")
        if self.temperature < 0:
            raise ValueError(f"SamplingParams.temperature={self.temperature} must be >= 0 (0 = greedy)")
        if not 0 < self.top_p <= 1:
            raise ValueError(f"SamplingParams.top_p={self.top_p} must be in (0, 1] (1 = off)")
        if self.top_k < 0:
            raise ValueError(f"SamplingParams.top_k={self.top_k} must be >= 0 (0 = off)")
        if self.max_new_tokens < 1:
            raise ValueError(f"SamplingParams.max_new_tokens={self.max_new_tokens} must be >= 1")
        if self.stop_token_ids is not None:
            self.stop_token_ids = [int(t) for t in self.stop_token_ids]
        if self.logprobs_kind not in LOGPROBS_KINDS:
            raise ValueError(f"SamplingParams.logprobs_kind={self.logprobs_kind!r} must be one of {LOGPROBS_KINDS}")
        if not 0 <= self.min_p <= 1:
            raise ValueError(f"SamplingParams.min_p={self.min_p} must be in [0, 1] (0 = off)")
        if self.repetition_penalty <= 0:
            raise ValueError(f"SamplingParams.repetition_penalty={self.repetition_penalty} must be > 0 (1 = off)")
        owned = sorted(set(self.vllm_kwargs) & set(VLLM_OWN_KEYS))
        if owned:
            raise ValueError(
                f"SamplingParams.vllm_kwargs {owned} are SamplingParams fields: set "
                f"{[VLLM_OWN_KEYS[k] for k in owned]} instead"
            )

    @property
    def greedy(self) -> bool:
        return self.temperature == 0


@dataclass
class Rollout:
    """One completion of one prompt."""

    prompt_ids: list[int]
    completion_ids: list[int]
    logprobs: list[float] | None  # one per completion token (SamplingParams.logprobs_kind); None if not asked
    finish_reason: str  # "stop" | "length"


@runtime_checkable
class RolloutEngine(Protocol):
    backend: str

    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Rollout]]:
        """One list of `params.n` rollouts per prompt, in prompt order."""
        ...

    def update_weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> None:
        """Load a trained model's parameters (its HF names); the engine then generates what it would."""
        ...

    def close(self) -> None: ...


def check_prompts(prompts: list[list[int]], vocab_size: int | None = None) -> None:
    """User errors a backend would otherwise answer with a traceback from deep inside."""
    if isinstance(prompts, (str, bytes)) or not isinstance(prompts, (list, tuple)):
        raise ValueError(f"prompts must be a list of token-id lists, got {type(prompts).__name__}; tokenize first")
    for i, p in enumerate(prompts):
        if isinstance(p, str) or not len(p):
            raise ValueError(f"prompts[{i}] must be a non-empty list of token ids (tokenize text first), got {p!r}")
        if vocab_size is not None and (min(p) < 0 or max(p) >= vocab_size):
            raise ValueError(f"prompts[{i}] has token ids outside [0, {vocab_size}): min {min(p)}, max {max(p)}")


def default_stop_ids(config: Any, generation_config: Any = None) -> list[int]:
    """The model's EOS ids: generation_config first (chat models put <|im_end|> there), then config."""
    for source in (generation_config, config):
        eos = getattr(source, "eos_token_id", None) if source is not None else None
        if eos is not None:
            return [int(e) for e in (eos if isinstance(eos, (list, tuple)) else [eos])]
    return []


def normalize_param_name(name: str) -> str:
    """A trainer's parameter name -> the plain HF name (DDP, torch.compile, activation checkpointing wrappers)."""
    name = name.replace("_checkpoint_wrapped_module.", "")  # anywhere: it wraps inner modules
    while name.startswith(("module.", "_orig_mod.")):  # only as prefixes: "module." may end an inner name
        name = name.split(".", 1)[1]
    if "lora_" in name or name.startswith("base_model.model."):
        raise ValueError(
            f"update_weights got a PEFT adapter parameter '{name}': merge the adapter first "
            "(model.merge_and_unload(), or push merged weights) so the engine sees plain HF names"
        )
    return name


# ----------------------------------------------------------------------------- the process-wide engine cache

# (backend, model key) -> engine; filled by align.rollout.factory.get_engine, emptied by each engine's close()
ENGINES: dict[tuple[str, str], RolloutEngine] = {}


def release(engine: RolloutEngine) -> None:
    """Forget a closed engine (backends call this from close())."""
    key = getattr(engine, "_cache_key", None)
    if key is not None and ENGINES.get(key) is engine:
        del ENGINES[key]


def close_all() -> None:
    for engine in list(ENGINES.values()):
        engine.close()
