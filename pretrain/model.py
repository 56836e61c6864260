"""SmolLM3-style base models from a few knobs, with their parameter count and training FLOPs per token.

Why transformers' SmolLM3 and not our own module: the saved directory then loads anywhere
(`AutoModelForCausalLM.from_pretrained`, vLLM, TRL) with no custom code. SmolLM3's choices are the
defaults: GQA, RoPE removed in every 4th layer (NoPE), tied embeddings, RMSNorm eps 1e-6, no biases.
SmolLM3 has no QK-norm; `qk_norm=True` builds the same shape as a Qwen3 model (which has per-head
RMSNorm on queries and keys, and no NoPE layers), still a stock transformers/vLLM architecture.

How to use:

    cfg = ModelArguments(num_layers=6, hidden_size=192, num_heads=6, num_kv_heads=2)
    model = build_model(cfg, vocab_size=len(tokenizer))
    print(describe(model, seq_len=512))   # "3.41M params (2.62M non-embedding), 24.1 MFLOPs/token"
"""

from __future__ import annotations

from dataclasses import dataclass, field

import torch
from transformers import PretrainedConfig, PreTrainedModel


@dataclass
class ModelArguments:
    """The architecture knobs of a pretrained-from-scratch model (recipe keys of the same names)."""

    num_layers: int = field(default=6, metadata={"help": "Number of transformer blocks."})
    hidden_size: int = field(default=192, metadata={"help": "Residual stream width."})
    intermediate_size: int | None = field(
        default=None, metadata={"help": "MLP width (SwiGLU); default: about 8/3 * hidden, rounded to 64."}
    )
    num_heads: int = field(default=6, metadata={"help": "Query heads."})
    num_kv_heads: int = field(default=2, metadata={"help": "Key/value heads (GQA); must divide num_heads."})
    head_dim: int | None = field(default=None, metadata={"help": "Default: hidden_size // num_heads."})
    nope_interval: int = field(
        default=4, metadata={"help": "Remove RoPE from every Nth layer (SmolLM3: 4); 0 keeps RoPE everywhere."}
    )
    tie_embeddings: bool = field(default=True, metadata={"help": "Share input embedding and output head."})
    rope_theta: float | None = field(
        default=None, metadata={"help": "RoPE base; default 50k (SmolLM3), or init_from's (set it for long context)."}
    )
    max_position_embeddings: int | None = field(
        default=None, metadata={"help": "Context the config advertises; default 2048, or init_from's."}
    )
    rms_norm_eps: float = field(default=1e-6, metadata={"help": "RMSNorm epsilon."})
    init_std: float = field(default=0.02, metadata={"help": "Std of the normal init of linear/embedding weights."})
    qk_norm: bool = field(
        default=False, metadata={"help": "RMSNorm on queries/keys (builds a Qwen3-shaped model; no NoPE)."}
    )
    rope_scaling: dict | None = field(
        default=None,
        metadata={
            "help": "RoPE scaling written into the saved model's config for inference, after training, e.g. "
            "{rope_type: yarn, factor: 2.0} (SmolLM3: trained at 64k, read to 128k). Training never uses it."
        },
    )

    def __post_init__(self):
        if self.num_heads % self.num_kv_heads:
            raise ValueError(f"num_kv_heads={self.num_kv_heads} must divide num_heads={self.num_heads}")
        if self.head_dim is None and self.hidden_size % self.num_heads:
            raise ValueError(f"hidden_size={self.hidden_size} is not divisible by num_heads={self.num_heads}")
        if self.nope_interval < 0:
            raise ValueError(f"nope_interval={self.nope_interval} must be >= 0 (0 = RoPE in every layer)")
        if self.intermediate_size is None:
            self.intermediate_size = 64 * round(self.hidden_size * 8 / 3 / 64)


def model_config(args: ModelArguments, vocab_size: int, special: dict[str, int] | None = None) -> PretrainedConfig:
    """The transformers config for `args` (SmolLM3Config, or Qwen3Config when qk_norm)."""
    special = special or {}
    head_dim = args.head_dim or args.hidden_size // args.num_heads
    common = dict(
        vocab_size=vocab_size,
        hidden_size=args.hidden_size,
        intermediate_size=args.intermediate_size,
        num_hidden_layers=args.num_layers,
        num_attention_heads=args.num_heads,
        num_key_value_heads=args.num_kv_heads,
        head_dim=head_dim,
        max_position_embeddings=args.max_position_embeddings or 2048,
        rms_norm_eps=args.rms_norm_eps,
        initializer_range=args.init_std,
        tie_word_embeddings=args.tie_embeddings,
        rope_parameters={"rope_type": "default", "rope_theta": args.rope_theta or 50_000.0},
        pad_token_id=special.get("<|pad|>"),
        bos_token_id=special.get("<|endoftext|>"),
        # A base model ends a document with <|endoftext|>, a chat model a turn with <|im_end|>.
        eos_token_id=[i for i in (special.get("<|im_end|>"), special.get("<|endoftext|>")) if i is not None] or None,
    )
    if args.qk_norm:
        from transformers import Qwen3Config

        return Qwen3Config(**common)
    from transformers import SmolLM3Config

    # no_rope_layers[i] == 1 means layer i USES RoPE (transformers' convention); 0 = NoPE.
    n = args.nope_interval
    no_rope_layers = [int(n == 0 or (i + 1) % n != 0) for i in range(args.num_layers)]
    return SmolLM3Config(no_rope_layers=no_rope_layers, **common)


def build_model(
    args: ModelArguments,
    vocab_size: int,
    special: dict[str, int] | None = None,
    seed: int = 0,
    attn_implementation: str = "sdpa",
):
    """A freshly initialised causal LM (fp32; sdpa attention unless told). Same seed -> same weights on every rank."""
    from transformers import AutoModelForCausalLM

    config = model_config(args, vocab_size, special)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = AutoModelForCausalLM.from_config(config, attn_implementation=attn_implementation, dtype=torch.float32)
    if model.generation_config is not None and config.eos_token_id is not None:
        model.generation_config.eos_token_id = config.eos_token_id
        model.generation_config.pad_token_id = config.pad_token_id
    return model


def count_params(model: torch.nn.Module) -> tuple[int, int]:
    """(all parameters, non-embedding parameters); tied weights are counted once."""
    total = sum(p.numel() for p in model.parameters())  # .parameters() already dedups tied tensors
    emb = model.get_input_embeddings().weight.numel()
    head = model.get_output_embeddings()
    untied_head = head is not None and head.weight is not model.get_input_embeddings().weight
    return total, total - emb - (head.weight.numel() if untied_head else 0)


def flops_per_token(config: PretrainedConfig, seq_len: int) -> float:
    """Training FLOPs per token (forward + backward = 3x forward), PaLM appendix B style.

    6 * (matmul params, output head included, input embedding lookup excluded)
    + 12 * layers * heads * head_dim * seq_len for attention scores (full causal square, as is usual).
    """
    h, L = config.hidden_size, config.num_hidden_layers
    hd = getattr(config, "head_dim", None) or h // config.num_attention_heads
    q = config.num_attention_heads * hd
    kv = config.num_key_value_heads * hd
    per_layer = h * q + 2 * h * kv + q * h + 3 * h * config.intermediate_size
    matmul_params = L * per_layer + h * config.vocab_size
    return 6.0 * matmul_params + 12.0 * L * q * seq_len


def describe(model: PreTrainedModel, seq_len: int) -> str:
    """One line: parameter counts and training FLOPs per token."""
    total, non_emb = count_params(model)
    flops = flops_per_token(model.config, seq_len)
    return f"{total / 1e6:.2f}M params ({non_emb / 1e6:.2f}M non-embedding), {flops / 1e6:.1f} MFLOPs/token"


def grow_depth(model: PreTrainedModel, factor: int) -> PreTrainedModel:
    """A model `factor` times deeper that computes exactly what `model` computes (depth up-scaling).

    Each block is followed by `factor - 1` copies of itself whose output projections (attention `o_proj`,
    MLP `down_proj`) start at zero: a zeroed copy adds nothing to the residual stream, so the grown model's
    logits equal the original's, and training then grows the copies into new capacity. This is how the tiny
    world gets a teacher that is stronger than the student without paying for a second pretraining run
    (the idea of SOLAR's depth up-scaling and of function-preserving growth, e.g. Net2Net).
    Per-layer config lists (`no_rope_layers`, `layer_types`) are repeated with their layers.
    """
    from transformers import AutoModelForCausalLM

    if factor < 1:
        raise ValueError(f"grow_depth={factor} must be >= 1 (1 = keep the model as it is)")
    if factor == 1:
        return model
    layers = getattr(getattr(model, "model", None), "layers", None)
    if layers is None or not all(
        hasattr(x, "self_attn") and hasattr(x.self_attn, "o_proj") and hasattr(getattr(x, "mlp", None), "down_proj")
        for x in layers
    ):
        raise ValueError(
            f"grow_depth supports decoder models with model.layers[i].self_attn.o_proj and "
            f".mlp.down_proj (SmolLM3, Qwen3, Llama); {type(model).__name__} has another layout"
        )
    config = model.config.__class__.from_dict(model.config.to_dict())
    n = config.num_hidden_layers
    config.num_hidden_layers = n * factor
    for key in ("no_rope_layers", "layer_types"):
        value = getattr(config, key, None)
        if isinstance(value, list) and len(value) == n:
            setattr(config, key, [v for v in value for _ in range(factor)])
    grown = AutoModelForCausalLM.from_config(config, attn_implementation="sdpa", dtype=torch.float32)
    old_layers = layers
    state = {k: v for k, v in model.state_dict().items() if not k.startswith("model.layers.")}
    missing = grown.load_state_dict(state, strict=False)
    if [k for k in missing.missing_keys if not k.startswith("model.layers.")] or missing.unexpected_keys:
        raise ValueError(f"grow_depth: {type(model).__name__} does not map onto its grown copy: {missing}")
    with torch.no_grad():
        for j, layer in enumerate(grown.model.layers):
            layer.load_state_dict(old_layers[j // factor].state_dict())
            if j % factor:
                layer.self_attn.o_proj.weight.zero_()
                layer.mlp.down_proj.weight.zero_()
    if model.generation_config is not None:
        grown.generation_config = model.generation_config
    return grown
