"""The transformers rollout backend: always available, and the fastest one on a CPU for small models.

A lean decode loop over the model's forward with a KV cache (transformers `DynamicCache`), not
`model.generate`: per decode step, generate() spends most of a small model's time in Python
(logits processors, stopping criteria, input preparation); this loop does only what rollouts need.
It keeps generate()'s numerics (left padding, position ids from the attention mask, the same
forward), so greedy ids equal `model.generate(..., do_sample=False)` (tests/test_rollout.py).

Batching: prompts are sorted by length (less padding) and decoded `batch_size` rows at a time.
With n > 1 the prompt is prefilled once and its cache copied n times. Rows that finished are
dropped from the batch, so one long completion does not keep every short one computing.

    engine = HFEngine("outputs/tiny/sft")              # or HFEngine(trainer.model): shares its weights
    out = engine.generate([[1, 5, 6]], SamplingParams(temperature=0))

A live model passed in is used in place (no copy): generation sees the trainer's current weights,
and `update_weights` with that model's own parameters costs nothing. On a CPU it samples in the weights' own
precision even when the trainer's mixed precision put bf16 autocast on that model's forward (`bypasses_autocast`):
per decode step autocast re-casts every weight and activation, which on the small models this backend serves costs
more than bf16 saves (about a fifth of a tiny model's rollout; on the 135M model, which `auto` gives vLLM,
autocast is the faster one). GRPO corrects the trainer/sampler difference with
importance sampling, as for any engine that samples in another precision.
"""

from __future__ import annotations

import contextlib
import copy
import gc
import logging
from collections.abc import Iterable
from typing import Any

import torch

from align.modeling.loading import has_autocast_forward, load_model, local_device, native_forward
from align.rollout.base import (
    Rollout,
    SamplingParams,
    check_prompts,
    default_stop_ids,
    normalize_param_name,
    release,
)
from align.rollout.hf_decode import fast_decode_attention, onednn_linears, preallocated_cache
from align.rollout.vllm_patch import fix_vllm_patched_model
from align.runtime.distributed import iter_full_params, zero3_init_disabled

logger = logging.getLogger(__name__)


def sample_next(
    logits: torch.Tensor, params: SamplingParams, generator: torch.Generator | None, seen: torch.Tensor | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """Next tokens (B,) and their log-probs (B,) from fp32 logits (B, V): RAW (the model's log-softmax), or, with
    `params.logprobs_kind == "sampling"`, under the distribution drawn from (0 when greedy). That distribution is
    vLLM's, in its order: the repetition penalty on the tokens `seen` (B, V) in the prompt or the completion, then
    temperature, min-p, top-k, top-p (a greedy pick takes the penalty too).

    Sampling is by inverse CDF with one uniform per row (the same distribution as `torch.multinomial(p, 1)`, ~30x
    cheaper on a CPU), in two levels (`_inverse_cdf`): a whole-vocabulary cumsum is a serial scan that cost 3.3 ms of a
    (64, 49k) step, a softmax and a logsumexp beside it as much again; block sums then one block's cumsum are 4x
    cheaper, and the unnormalised exponentials serve the log-probs too.
    """
    scores = logits
    if params.repetition_penalty != 1.0 and seen is not None:
        penalty = params.repetition_penalty
        scores = torch.where(seen, torch.where(scores > 0, scores / penalty, scores * penalty), scores)
    if params.greedy:
        tokens = scores.argmax(dim=-1)
        if params.logprobs_kind == "sampling":
            return tokens, torch.zeros(tokens.shape, dtype=logits.dtype, device=logits.device)  # greedy: certain
        return tokens, logits.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)
    scores = scores / params.temperature if params.temperature != 1.0 else scores
    if params.min_p > 0:
        probs = scores.softmax(dim=-1)
        scores = scores.masked_fill(probs < params.min_p * probs.amax(dim=-1, keepdim=True), float("-inf"))
    if 0 < params.top_k < scores.shape[-1]:
        kth = torch.topk(scores, params.top_k, dim=-1).values[:, -1:]
        scores = scores.masked_fill(scores < kth, float("-inf"))
    if params.top_p < 1.0:
        sorted_scores, idx = torch.sort(scores, dim=-1, descending=True)
        probs = sorted_scores.softmax(dim=-1)
        # drop a token when the mass BEFORE it already reaches top_p (the top token always stays)
        drop = (probs.cumsum(dim=-1) - probs) >= params.top_p
        scores = scores.scatter(-1, idx, sorted_scores.masked_fill(drop, float("-inf")))
    top = scores.amax(dim=-1, keepdim=True)  # (B, 1)
    weights = (scores - top).exp()  # (B, V) unnormalised probabilities; a masked token is exactly 0
    total = weights.sum(dim=-1)  # (B,)
    tokens = _inverse_cdf(weights, total, generator)
    picked = scores.gather(-1, tokens[:, None]).squeeze(-1)
    if params.logprobs_kind == "sampling" or scores is logits:  # (temperature 1, nothing masked: the same thing)
        return tokens, picked - top.squeeze(-1) - total.log()
    return tokens, logits.gather(-1, tokens[:, None]).squeeze(-1) - torch.logsumexp(logits, dim=-1)


def _inverse_cdf(
    weights: torch.Tensor, total: torch.Tensor, generator: torch.Generator | None, block: int = 256
) -> torch.Tensor:
    """One draw per row from unnormalised `weights` (B, V) with row sums `total` (B,), by inverse CDF over blocks of
    `block` tokens: u ~ U[0, total) picks the block whose cumulative mass passes it, then the token inside that block.
    A token of zero weight is never drawn (u is kept strictly below each cumulative bound it is searched in)."""
    num_rows, vocab = weights.shape
    pad = (-vocab) % block
    blocks = (
        torch.nn.functional.pad(weights, (0, pad)).view(num_rows, -1, block)
        if pad
        else weights.view(num_rows, -1, block)
    )  # (B, NB, block)
    block_mass = blocks.sum(dim=-1)  # (B, NB)
    block_cdf = block_mass.cumsum(dim=-1)
    u = torch.rand(num_rows, 1, generator=generator, device=weights.device) * total[:, None]
    u = torch.minimum(u, torch.nextafter(block_cdf[:, -1:], torch.zeros_like(u)))
    chosen = torch.searchsorted(block_cdf, u, right=True)  # (B, 1): a block of positive mass
    rows = torch.arange(num_rows, device=weights.device)
    inner_cdf = blocks[rows, chosen.squeeze(-1)].cumsum(dim=-1)  # (B, block)
    left = (u - (block_cdf.gather(-1, chosen) - block_mass.gather(-1, chosen))).clamp_(min=0)
    # the block's own cumsum may round a hair differently from its sum: rescale, and stay below its end
    left = left * inner_cdf[:, -1:] / block_mass.gather(-1, chosen)
    left = torch.minimum(left, torch.nextafter(inner_cdf[:, -1:], torch.zeros_like(left)))
    inside = torch.searchsorted(inner_cdf, left, right=True)
    return (chosen * block + inside).squeeze(-1)


def _sharded_across_ranks(model: Any) -> bool:
    """FSDP2 shards parameters as DTensors across ranks: each forward all-gathers them (collective)."""
    import torch.distributed as dist

    if not (dist.is_available() and dist.is_initialized() and dist.get_world_size() > 1):
        return False
    return any(hasattr(p, "full_tensor") for p in model.parameters())


def _copy_in_dtype(model: Any, dtype: torch.dtype) -> Any:
    """A copy of a live model in `dtype`, built empty from its config, then given the live model's buffers and whole
    parameters (`iter_full_params`: collective under ZeRO-3/FSDP2, where every rank builds its copy). Not a deepcopy:
    TRL's GRPOTrainer patches the policy's forward (`add_fused_lm_head`) with a closure over the policy's own bound
    forward, so a deep copy would run the live fp32 policy; FSDP2 refuses deepcopy (the copy fails its first
    forward on a GPU: "FSDP requires a single root module"); a ZeRO-3 copy would hold empty partitions."""
    from transformers import AutoModelForCausalLM

    with torch.device("meta"), zero3_init_disabled():
        clone = AutoModelForCausalLM.from_config(model.config, dtype=dtype)
    clone.to_empty(device=next(model.parameters()).device)
    clone.tie_weights()  # to_empty gave the tied head a tensor of its own
    clone.generation_config = copy.deepcopy(model.generation_config)  # its stop ids
    base = model.get_base_model() if hasattr(model, "get_base_model") else model  # PEFT: the base model's names
    live = {normalize_param_name(n): b for n, b in base.named_buffers()}
    with torch.no_grad():
        for name, buf in clone.named_buffers():
            if name not in live:
                raise ValueError(f"hf engine copy: the live model has no buffer {name!r} to copy")
            buf.copy_(live[name])
        params = dict(clone.named_parameters())
        for name, tensor in iter_full_params(model):
            name = normalize_param_name(name)
            if name in params:  # (a tied head is not a parameter of its own)
                params.pop(name).copy_(tensor)
    if params:
        raise ValueError(f"hf engine copy: the live model gave no weights for {sorted(params)[:3]}")
    return clone


def _reduce(value: int, op, model: Any) -> int:
    import torch.distributed as dist

    t = torch.tensor([value], device=model.device if dist.get_backend() == "nccl" else "cpu")
    dist.all_reduce(t, op=op)
    return int(t.item())


def _global_max(value: int, model: Any) -> int:
    import torch.distributed as dist

    return _reduce(value, dist.ReduceOp.MAX, model)


def _global_all(flag: bool, model: Any) -> bool:
    import torch.distributed as dist

    return bool(_reduce(int(flag), dist.ReduceOp.MIN, model))


class HFEngine:
    backend = "hf"

    def __init__(
        self,
        model: Any,
        tokenizer: Any = None,
        dtype: str = "auto",
        batch_size: int = 64,
        pad_token_id: int | None = None,
        onednn: bool = True,
        lockstep: bool | None = None,
    ):
        if batch_size < 1:
            raise ValueError(f"hf rollout batch_size={batch_size} must be >= 1")
        if isinstance(model, str):
            # on a GPU machine the rank's GPU (from_pretrained loads to the CPU): preference and answer generation
            # sampled on the CPU there before
            with zero3_init_disabled():  # its own whole model, also inside a ZeRO-3 stage (iterative APO's pairs)
                self.model = load_model(model, dtype=dtype).to(local_device())
            logger.info("hf engine: %s loaded on %s", model, self.model.device)
            self.owns_model = True
        elif dtype not in ("auto", None) and _torch_dtype(dtype) != model.dtype:
            # A live model in another dtype (e.g. bf16 rollouts of an fp32 policy): a copy in that dtype,
            # kept in step by update_weights (GRPO/distillation push the weights after every step).
            self.model = _copy_in_dtype(model, _torch_dtype(dtype))
            self.owns_model = True
        else:
            self.model = model
            self.owns_model = False
        self.model.eval()
        self.batch_size = batch_size
        self.onednn = onednn  # CPU: fp32 linears through prepacked oneDNN while generating (hf_decode.py)
        # FSDP: every forward all-gathers parameters, so every rank must run the same forwards: in lockstep, the
        # ranks decode as many batches (one with fewer runs empty ones) and as many steps (until every rank's rows
        # stopped); without it a rank that finished early left the others waiting in an all-gather (a hang)
        self.lockstep = _sharded_across_ranks(self.model) if lockstep is None else lockstep
        self.num_packed_linears = 0  # how many the last generate call multiplied through oneDNN
        self.tokenizer = tokenizer
        config = self.model.config
        self.vocab_size = config.vocab_size
        if pad_token_id is None:
            pad_token_id = getattr(config, "pad_token_id", None)
        # Any id works as padding (it is masked out); 0 keeps the embedding lookup in range.
        self.pad_token_id = int(pad_token_id) if pad_token_id is not None else 0
        stop = default_stop_ids(config, getattr(self.model, "generation_config", None))
        if not stop and tokenizer is not None and tokenizer.eos_token_id is not None:
            stop = [tokenizer.eos_token_id]
        self.default_stop = stop

    # ------------------------------------------------------------------ generate

    @torch.inference_mode()
    def generate(self, prompts: list[list[int]], params: SamplingParams) -> list[list[Rollout]]:
        check_prompts(prompts, self.vocab_size)
        if params.vllm_kwargs:
            raise ValueError(
                f"the hf engine samples with SamplingParams' own fields only; vllm_kwargs "
                f"{sorted(params.vllm_kwargs)} need the vllm or vllm-server engine"
            )
        fix_vllm_patched_model(self.model)  # a vLLM engine in this process may have patched its classes
        stop = self.default_stop if params.stop_token_ids is None else params.stop_token_ids
        # Greedy copies are identical: decode once, hand out n copies.
        copies = 1 if params.greedy else params.n
        generator = None
        if params.seed is not None and not params.greedy:
            generator = torch.Generator(device=self.model.device).manual_seed(params.seed)
        order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
        per_batch = max(1, self.batch_size // copies)
        results: dict[int, list[Rollout]] = {}
        was_training = self.model.training
        self.model.eval()
        cpu = self.model.device.type == "cpu"
        native = native_forward(self.model) if cpu else contextlib.nullcontext()
        batch_rows = min(self.batch_size, len(prompts) * copies)
        packed = onednn_linears(self.model, batch_rows) if cpu and self.onednn else contextlib.nullcontext()
        try:
            with native, fast_decode_attention(self.model), packed as num_packed:
                self.num_packed_linears = num_packed or 0
                starts = list(range(0, len(order), per_batch))
                # lockstep: agree on the number of batches first (collectives pair up in call order)
                total = _global_max(len(starts), self.model) if self.lockstep else len(starts)
                for b in range(total):
                    if b >= len(starts):  # this rank has fewer batches: an empty one keeps the others company
                        self._decode([[self.pad_token_id]], 1, params, stop, generator, ghost=True)
                        continue
                    chunk = order[starts[b] : starts[b] + per_batch]
                    rows = self._decode([list(prompts[i]) for i in chunk], copies, params, stop, generator)
                    for j, i in enumerate(chunk):
                        results[i] = rows[j * copies : (j + 1) * copies]
        finally:
            self.model.train(was_training)
        out = []
        for i in range(len(prompts)):
            rollouts = results[i]
            if copies != params.n:
                rollouts = [_copy(rollouts[0]) for _ in range(params.n)]
            out.append(rollouts)
        return out

    def bypasses_autocast(self) -> bool:
        """This engine samples in the weights' own precision while its (shared) model's forward carries a
        mixed-precision autocast: a trainer computing with that forward sees another distribution (module doc)."""
        return self.model.device.type == "cpu" and has_autocast_forward(self.model)

    def _decode(
        self,
        prompts: list[list[int]],
        copies: int,
        params: SamplingParams,
        stop: list[int],
        generator: torch.Generator | None,
        ghost: bool = False,
    ) -> list[Rollout]:
        device = self.model.device
        width = max(len(p) for p in prompts)
        ids = torch.tensor([[self.pad_token_id] * (width - len(p)) + p for p in prompts], device=device)  # (B, T)
        mask = torch.tensor([[0] * (width - len(p)) + [1] * len(p) for p in prompts], device=device)
        cache = preallocated_cache(self.model.config, width + params.max_new_tokens)
        positions = (mask.cumsum(-1) - 1).clamp(min=0)
        logits = self._forward(ids, mask, positions, cache)  # (B, V)
        if copies > 1:  # prefill once, then copy the prompt's cache for each rollout
            cache.batch_repeat_interleave(copies)
            logits = logits.repeat_interleave(copies, dim=0)
            mask = mask.repeat_interleave(copies, dim=0)
            positions = positions.repeat_interleave(copies, dim=0)
        num_rows = logits.shape[0]
        seen = None  # (rows, V): the tokens of each row's prompt and completion so far, for the repetition penalty
        if params.repetition_penalty != 1.0:
            seen = torch.zeros(logits.shape, dtype=torch.bool, device=device)
            for r, p in enumerate(p for p in prompts for _ in range(copies)):
                seen[r, p] = True
        stop_t = torch.tensor(stop or [-1], device=device)
        tokens = torch.full((num_rows, params.max_new_tokens), self.pad_token_id, dtype=torch.long)
        logps = torch.zeros(num_rows, params.max_new_tokens)
        lengths = torch.full((num_rows,), params.max_new_tokens, dtype=torch.long)
        stopped = torch.full((num_rows,), ghost, dtype=torch.bool)  # a ghost batch only keeps other ranks company
        alive = torch.arange(num_rows, device=device)  # original row of each row still in the batch
        last_pos = positions[:, -1:]
        for step in range(params.max_new_tokens):
            nxt, lp = sample_next(logits, params, generator, seen)
            if seen is not None:
                seen[torch.arange(nxt.shape[0], device=device), nxt] = True
            tokens[alive.cpu(), step] = nxt.cpu()
            logps[alive.cpu(), step] = lp.float().cpu()
            hit = torch.isin(nxt, stop_t)
            if self.lockstep:  # rows stay in the batch (their later tokens are dropped) until every rank is done
                hit &= ~stopped.to(hit.device)
                lengths[alive[hit].cpu()] = step + 1
                stopped[alive[hit].cpu()] = True
                if _global_all(bool(stopped.all()), self.model):
                    break
            elif hit.any():
                done = alive[hit].cpu()
                lengths[done] = step + 1
                stopped[done] = True
                keep = ~hit
                if not keep.any():
                    break
                # drop finished rows: the rest decode a smaller batch
                alive, nxt, mask, last_pos = alive[keep], nxt[keep], mask[keep], last_pos[keep]
                seen = seen[keep] if seen is not None else None
                cache.batch_select_indices(keep.nonzero().squeeze(-1))
            if step == params.max_new_tokens - 1:
                break
            mask = torch.cat([mask, mask.new_ones(mask.shape[0], 1)], dim=1)
            last_pos = last_pos + 1
            logits = self._forward(nxt[:, None], mask, last_pos, cache)
        prompt_rows = [p for p in prompts for _ in range(copies)]
        out = []
        for r in range(num_rows):
            n = int(lengths[r])
            out.append(
                Rollout(
                    prompt_ids=list(prompt_rows[r]),
                    completion_ids=tokens[r, :n].tolist(),
                    logprobs=logps[r, :n].tolist() if params.logprobs else None,
                    finish_reason="stop" if stopped[r] else "length",
                )
            )
        return out

    def _forward(self, ids: torch.Tensor, mask: torch.Tensor, positions: torch.Tensor, cache: Any) -> torch.Tensor:
        out = self.model(
            input_ids=ids,
            attention_mask=mask,
            position_ids=positions,
            past_key_values=cache,
            use_cache=True,
            logits_to_keep=1,
        )
        return out.logits[:, -1].float()  # (B, V)

    # ------------------------------------------------------------------ weights

    @torch.no_grad()
    def update_weights(self, named_params: Iterable[tuple[str, torch.Tensor]]) -> None:
        own = dict(self.model.named_parameters())
        head = self.model.get_output_embeddings()
        tied = head is not None and head.weight is self.model.get_input_embeddings().weight
        head_name = next((n for n, p in own.items() if head is not None and p is head.weight), None)
        unknown = []
        for name, tensor in named_params:
            name = normalize_param_name(name)
            if name not in own:
                if tied and name.endswith("lm_head.weight"):
                    continue  # the tied head IS the embedding, which is pushed under its own name
                unknown.append(name)
                continue
            param = own[name]
            if param.data_ptr() == tensor.data_ptr():
                continue  # the live model's own tensor: nothing to copy
            if param.shape != tensor.shape:
                raise ValueError(
                    f"update_weights: '{name}' has shape {tuple(tensor.shape)}, model has {tuple(param.shape)}"
                )
            param.copy_(tensor.detach())
        if unknown:
            raise ValueError(
                f"update_weights: {len(unknown)} names are not parameters of this model, e.g. {unknown[:3]}; "
                f"expected names like {list(own)[:2]} (head: {head_name})"
            )

    def close(self) -> None:
        release(self)
        if self.owns_model:
            self.model = None
            with contextlib.suppress(Exception):
                gc.collect()


def _torch_dtype(dtype: str | torch.dtype) -> torch.dtype:
    if isinstance(dtype, torch.dtype):
        return dtype
    names = {"bf16": "bfloat16", "fp16": "float16", "fp32": "float32", "half": "float16", "float": "float32"}
    value = getattr(torch, names.get(dtype, dtype), None)
    if not isinstance(value, torch.dtype):
        raise ValueError(f"hf rollout dtype {dtype!r} is not a torch dtype; use auto, float32, bfloat16 or float16")
    return value


def _copy(r: Rollout) -> Rollout:
    return Rollout(
        list(r.prompt_ids), list(r.completion_ids), None if r.logprobs is None else list(r.logprobs), r.finish_reason
    )
