"""Model merging (align/pipeline/merge.py, scripts/merge.py): soups and linear merges equal the formula, tied
embeddings stay tied, the output is an HF model (tokenizer, chat template, generation_config, YaRN) that transformers
and vLLM load, and MergeKit (when installed) computes the same tensors.

Run: pytest tests/test_merge.py -q   (~10 s; the vllm test ~60 s more: -m vllm)
"""

from __future__ import annotations

import os

import pytest
import torch
from cpu_substitutions import base_tokenizer, tiny_model

from align.data.chat import setup_chat_format
from align.pipeline.merge import MergeConfig, expand_models, merge

torch.set_num_threads(1)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    """Three tiny SmolLM3s (tied embeddings) with different random weights, saved like checkpoints of one run."""
    root = tmp_path_factory.mktemp("merge")
    tok = base_tokenizer()
    setup_chat_format(tok, "smollm3", "<|im_end|>")
    paths = []
    for step in (10, 2, 30):  # written out of order: the glob must sort by step
        path = root / "apo" / f"checkpoint-{step}"
        tiny_model(tok, seed=step).save_pretrained(path)
        tok.save_pretrained(path)
        paths.append(str(path))
    untied = []
    for seed in (1, 2):
        m = tiny_model(tok, seed=seed)
        m.config.tie_word_embeddings = False
        m.lm_head.weight = torch.nn.Parameter(m.lm_head.weight.detach().clone() * (seed + 1))
        m.save_pretrained(root / f"untied{seed}")
        tok.save_pretrained(root / f"untied{seed}")
        untied.append(str(root / f"untied{seed}"))
    return {"root": root, "checkpoints": sorted(paths, key=lambda p: int(p.rsplit("-", 1)[1])), "untied": untied}


def _state(path) -> dict[str, torch.Tensor]:
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(path, dtype=torch.float32).state_dict()


def test_a_soup_is_the_mean_and_a_linear_merge_is_the_weighted_sum(models, tmp_path):
    ckpts = models["checkpoints"]
    assert expand_models([str(models["root"] / "apo" / "checkpoint-*")]) == ckpts  # steps 2, 10, 30
    soup = merge(MergeConfig(models=[str(models["root"] / "apo" / "checkpoint-*")], output_dir=str(tmp_path / "soup")))
    assert soup["weights"] == pytest.approx([1 / 3] * 3)
    states = [_state(p) for p in ckpts]
    got = _state(tmp_path / "soup")
    for name, value in got.items():
        torch.testing.assert_close(value, sum(s[name] for s in states) / 3, rtol=0, atol=1e-6)
    linear = merge(
        MergeConfig(models=[str(tmp_path / "soup"), ckpts[0]], weights=[0.9, 0.1], output_dir=str(tmp_path / "linear"))
    )
    assert linear["weights"] == pytest.approx([0.9, 0.1])
    merged = _state(tmp_path / "linear")
    for name, value in merged.items():
        torch.testing.assert_close(value, 0.9 * got[name] + 0.1 * states[0][name], rtol=0, atol=1e-6)
    raw = merge(MergeConfig(models=ckpts[:2], weights=[2.0, 1.0], normalize=False, output_dir=str(tmp_path / "raw")))
    assert raw["weights"] == [2.0, 1.0]
    name = "model.layers.0.mlp.up_proj.weight"
    torch.testing.assert_close(
        _state(tmp_path / "raw")[name], 2 * states[0][name] + states[1][name], rtol=0, atol=1e-6
    )


def test_the_merged_model_is_a_complete_hf_model_with_tied_embeddings_and_yarn(models, tmp_path):
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    out = tmp_path / "final"
    yarn = {"rope_type": "yarn", "factor": 2.0}
    merge(
        MergeConfig(
            models=models["checkpoints"][:2],
            weights=[0.9, 0.1],
            rope_scaling=yarn,
            dtype="bfloat16",
            output_dir=str(out),
        )
    )
    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.lm_head.weight is model.model.embed_tokens.weight and model.dtype == torch.bfloat16
    config = AutoConfig.from_pretrained(out)
    assert config.rope_parameters["rope_type"] == "yarn" and config.max_position_embeddings == 2 * 65536
    tok = AutoTokenizer.from_pretrained(out)
    assert tok.eos_token == "<|im_end|>" and "/no_think" in tok.chat_template
    eos = GenerationConfig.from_pretrained(out).eos_token_id
    assert tok.convert_tokens_to_ids("<|end_of_text|>") in (eos if isinstance(eos, list) else [eos])
    assert (out / "merge_config.yaml").read_text().count("model: ") == 2


def test_untied_heads_are_merged_too(models, tmp_path):
    a, b = models["untied"]
    merge(MergeConfig(models=[a, b], output_dir=str(tmp_path / "u")))
    got, sa, sb = _state(tmp_path / "u"), _state(a), _state(b)
    torch.testing.assert_close(got["lm_head.weight"], (sa["lm_head.weight"] + sb["lm_head.weight"]) / 2)
    assert not torch.equal(got["lm_head.weight"], got["model.embed_tokens.weight"])


def test_bad_merges_name_the_problem(models, tmp_path):
    from pretrain.model import ModelArguments, build_model

    other = tmp_path / "wider"
    build_model(ModelArguments(num_layers=4, hidden_size=96, num_heads=4, num_kv_heads=1), 400).save_pretrained(other)
    ckpt = models["checkpoints"][0]
    with pytest.raises(ValueError, match="of shape .*merge models of one architecture and size"):
        merge(MergeConfig(models=[ckpt, str(other)], output_dir=str(tmp_path / "x")))
    with pytest.raises(ValueError, match="weights has 1 entries for 2 models"):
        merge(MergeConfig(models=[ckpt, ckpt], weights=[1.0], output_dir=str(tmp_path / "x")))
    with pytest.raises(FileNotFoundError, match="matches no directory"):
        merge(MergeConfig(models=[str(tmp_path / "nothing-*")], output_dir=str(tmp_path / "x")))
    with pytest.raises(ValueError, match="backend='x'"):
        MergeConfig(backend="x")


def test_a_hub_id_merges_as_its_directory_does(models, tmp_path, monkeypatch):
    """A model named by its hub id (SmolLM3's final merge takes the base model) is read from the HF cache's snapshot,
    served here offline from a repo in the cache's own layout: the same merge as naming its directory."""
    import huggingface_hub.constants as hub
    from hub_fixtures import cache_model

    monkeypatch.setattr(hub, "HF_HUB_CACHE", str(tmp_path / "cache"))
    monkeypatch.setattr(hub, "HF_HUB_OFFLINE", True)
    soup, base = models["checkpoints"][:2]
    snapshot = cache_model(tmp_path / "cache", "org/base", base)
    by_id = merge(
        MergeConfig(
            models=[soup, "org/base"], weights=[0.9, 0.1], base_model="org/base", output_dir=str(tmp_path / "by_id")
        )
    )
    merge(MergeConfig(models=[soup, base], weights=[0.9, 0.1], output_dir=str(tmp_path / "by_dir")))
    assert by_id["models"] == [soup, str(snapshot)] and by_id["base_model"] == str(snapshot)
    a, b = _state(tmp_path / "by_id"), _state(tmp_path / "by_dir")
    assert all(torch.equal(a[k], b[k]) for k in a)
    with pytest.raises(FileNotFoundError, match="model org/absent: the hub could not serve it.*hf download"):
        merge(MergeConfig(models=[soup, "org/absent"], output_dir=str(tmp_path / "x")))


def test_mergekit_computes_the_same_merge(models, tmp_path):
    pytest.importorskip("mergekit", reason="MergeKit is optional (pip install mergekit==0.1.5)")
    args = dict(models=models["checkpoints"], weights=[0.5, 0.3, 0.2])
    merge(MergeConfig(**args, output_dir=str(tmp_path / "ours")))
    merge(MergeConfig(**args, backend="mergekit", output_dir=str(tmp_path / "mergekit")))
    ours, theirs = _state(tmp_path / "ours"), _state(tmp_path / "mergekit")
    assert ours.keys() == theirs.keys()
    for name in ours:
        torch.testing.assert_close(ours[name], theirs[name], rtol=0, atol=1e-6)


@pytest.mark.vllm
def test_vllm_loads_the_merged_model_and_generates_what_transformers_does(models, tmp_path, vllm_engine):
    from align.rollout import SamplingParams, fix_vllm_patched_model

    out = tmp_path / "for_vllm"
    merge(MergeConfig(models=models["checkpoints"][:2], weights=[0.9, 0.1], output_dir=str(out)))
    engine = vllm_engine(str(out))
    prompts = [[5, 9, 11, 20], [7, 7, 30]]
    got = [
        r[0].completion_ids
        for r in engine.generate(prompts, SamplingParams(temperature=0, max_new_tokens=8, stop_token_ids=[]))
    ]
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32).eval()
    fix_vllm_patched_model(model)
    with torch.no_grad():
        want = [
            model.generate(
                torch.tensor([p]),
                max_new_tokens=8,
                min_new_tokens=8,
                do_sample=False,
                eos_token_id=None,
                pad_token_id=0,
            )[0, len(p) :].tolist()
            for p in prompts
        ]
    assert got == want and os.path.isdir(out)
