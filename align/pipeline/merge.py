"""Model merging as a stage: a soup (uniform or weighted average) of checkpoints, or a linear merge of models.

Why: SmolLM3's released model is a merge. APO lowered its long-context (RULER) scores, so a soup of APO
checkpoints was linearly merged with the mid-training checkpoint at 0.9 / 0.1, which recovered them up to 128k
(SmolLM3 blog, "Model merging"; they used MergeKit). Both steps are one formula:

    merged = sum_i w_i * theta_i        (w normalised to sum to 1 when `normalize`, MergeKit's default)

A soup is `weights: null` (uniform). Every tensor is accumulated in fp32, one at a time, from the models'
safetensors files (memory: one model plus one tensor); tied embeddings stay tied (the shared tensor is merged
once). The output is an HF model directory (config, generation_config and tokenizer with its chat template from
`base_model`, default the first model) that loads in transformers and vLLM, plus `merge_config.yaml` in
MergeKit's format, so `mergekit-yaml merge_config.yaml out/` reproduces it. `rope_scaling` (e.g. YaRN) is
written into the merged config, as SmolLM3's final model reads 128k.

MergeKit 0.1.5 installs beside our pins (`pip install --dry-run mergekit` adds only immutables and scipy) and
merges SmolLM3 (it infers the architecture); `backend: mergekit` runs it instead of the few lines here, and
tests/test_merge.py checks the two agree. How to run:

    python scripts/merge.py recipes/smollm3/merge.yaml
    python scripts/merge.py --models 'outputs/smollm3/apo/checkpoint-*' --output_dir outputs/smollm3/apo_soup
"""

from __future__ import annotations

import glob
import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path

import torch
import yaml

from align.modeling.loading import local_model_dir, write_rope_scaling

logger = logging.getLogger(__name__)

BACKENDS = ("torch", "mergekit")
DTYPES = ("float32", "bfloat16", "float16")


@dataclass
class MergeConfig:
    """The merge recipe (keys of the same names)."""

    models: list[str] = field(
        default_factory=list,
        metadata={
            "help": "Models to merge: directories, hub ids (org/name[@revision], read from the HF cache) or "
            "glob patterns, which expand in step order (e.g. 'apo/checkpoint-*')."
        },
    )
    weights: list[float] | None = field(
        default=None, metadata={"help": "One weight per model (after globs expand); null: a uniform soup."}
    )
    normalize: bool = field(default=True, metadata={"help": "Divide the weights by their sum (MergeKit's default)."})
    base_model: str | None = field(
        default=None, metadata={"help": "Config, generation_config and tokenizer come from here; default: models[0]."}
    )
    output_dir: str = field(default="outputs/merge", metadata={"help": "Where the merged HF model is written."})
    dtype: str = field(default="float32", metadata={"help": f"Saved dtype, one of {DTYPES} (math is fp32)."})
    rope_scaling: dict | None = field(
        default=None, metadata={"help": "Written into the merged config, e.g. {rope_type: yarn, factor: 2.0}."}
    )
    backend: str = field(
        default="torch", metadata={"help": f"One of {BACKENDS}: this module, or MergeKit's run_merge."}
    )

    def __post_init__(self):
        if self.backend not in BACKENDS:
            raise ValueError(f"backend={self.backend!r}: choose one of {BACKENDS}")
        if self.dtype not in DTYPES:
            raise ValueError(f"dtype={self.dtype!r}: choose one of {DTYPES}")


def expand_models(patterns: list[str]) -> list[str]:
    """Model dirs from paths, hub ids and glob patterns; a pattern's matches sorted by their step number."""
    out = []
    for pattern in patterns:
        if any(c in pattern for c in "*?["):
            hits = [p for p in glob.glob(pattern) if os.path.isdir(p)]
            if not hits:
                raise FileNotFoundError(f"models: the pattern {pattern!r} matches no directory")
            key = lambda p: [int(t) if t.isdigit() else t for t in re.split(r"(\d+)", p)]  # noqa: E731
            out += sorted(hits, key=key)
        else:
            out.append(local_model_dir(pattern))
    for path in out:
        if not (Path(path) / "config.json").is_file():
            raise FileNotFoundError(f"models: {path!r} is not a saved model directory (no config.json)")
    return out


def merge_weights(num: int, weights: list[float] | None, normalize: bool) -> list[float]:
    if weights is None:
        return [1.0 / num] * num
    if len(weights) != num:
        raise ValueError(f"weights has {len(weights)} entries for {num} models; give one per model (or null: a soup)")
    if normalize:
        total = sum(weights)
        if total <= 0:
            raise ValueError(f"weights {weights} sum to {total}; with normalize they must sum to > 0")
        return [w / total for w in weights]
    return [float(w) for w in weights]


class _Tensors:
    """Lazy name -> tensor access to a saved model's safetensors files (sharded or not)."""

    def __init__(self, path: str):
        from safetensors import safe_open

        index = Path(path) / "model.safetensors.index.json"
        if index.is_file():
            files = sorted(set(json.loads(index.read_text())["weight_map"].values()))
        elif (Path(path) / "model.safetensors").is_file():
            files = ["model.safetensors"]
        else:
            raise FileNotFoundError(f"models: {path!r} has no model.safetensors (save it with safe_serialization)")
        self.path, self.where = path, {}
        self.handles = [safe_open(str(Path(path) / f), framework="pt") for f in files]
        for h in self.handles:
            self.where.update({k: h for k in h.keys()})

    def get(self, name: str) -> torch.Tensor:
        return self.where[name].get_tensor(name)


def merge_state(paths: list[str], weights: list[float], base) -> None:
    """Overwrite `base`'s parameters in place with sum_i w_i * theta_i over the models' files (fp32 math)."""
    sources = [_Tensors(p) for p in paths]
    state = base.state_dict()
    names = sorted(sources[0].where)
    with torch.no_grad():
        for name in names:
            if name not in state:
                raise ValueError(f"{paths[0]}: tensor {name!r} is not a parameter of {type(base).__name__}")
            acc = torch.zeros(state[name].shape, dtype=torch.float32)
            for src, w in zip(sources, weights):
                if name not in src.where:
                    raise ValueError(f"models: {src.path} has no tensor {name!r}: merge models of one architecture")
                t = src.get(name)
                if t.shape != acc.shape:
                    raise ValueError(
                        f"models: {src.path} has {name!r} of shape {tuple(t.shape)}, "
                        f"not {tuple(acc.shape)}: merge models of one architecture and size"
                    )
                acc += w * t.float()
            state[name].copy_(acc)
        for src in sources[1:]:
            extra = sorted(set(src.where) - set(names))
            if extra:
                raise ValueError(f"models: {src.path} has tensors {extra[:3]} that {paths[0]} lacks")


def mergekit_config(paths: list[str], weights: list[float], normalize: bool, dtype: str) -> dict:
    """The same merge in MergeKit's YAML format (merge_method linear)."""
    return {
        "models": [{"model": p, "parameters": {"weight": w}} for p, w in zip(paths, weights)],
        "merge_method": "linear",
        "parameters": {"normalize": normalize},
        "dtype": dtype,
    }


def _run_mergekit(spec: dict, out: str) -> None:
    try:
        from mergekit.config import MergeConfiguration
        from mergekit.merge import MergeOptions, run_merge
    except ImportError as err:
        raise ImportError("backend: mergekit needs MergeKit: pip install mergekit==0.1.5") from err
    run_merge(MergeConfiguration.model_validate(spec), out, options=MergeOptions(copy_tokenizer=True))


def merge(cfg: MergeConfig) -> dict:
    """Merge `cfg.models` into `cfg.output_dir`; returns a summary (models, weights, output)."""
    from transformers import AutoModelForCausalLM, AutoTokenizer, GenerationConfig

    if not cfg.models:
        raise ValueError("models is empty: list the model directories (or glob patterns) to merge")
    paths = expand_models(cfg.models)
    weights = merge_weights(len(paths), cfg.weights, cfg.normalize)
    base_path = local_model_dir(cfg.base_model) if cfg.base_model else paths[0]
    spec = mergekit_config(paths, weights, False, cfg.dtype)  # weights already normalised here
    os.makedirs(cfg.output_dir, exist_ok=True)
    logger.info("merging %d models with weights %s into %s (%s)", len(paths), weights, cfg.output_dir, cfg.backend)
    if cfg.backend == "mergekit":
        _run_mergekit(spec, cfg.output_dir)
    else:
        model = AutoModelForCausalLM.from_pretrained(base_path, dtype=torch.float32)
        merge_state(paths, weights, model)
        model.to(getattr(torch, cfg.dtype)).save_pretrained(cfg.output_dir, safe_serialization=True)
    AutoTokenizer.from_pretrained(base_path).save_pretrained(cfg.output_dir)
    try:
        GenerationConfig.from_pretrained(base_path).save_pretrained(cfg.output_dir)
    except OSError:
        pass  # a base without generation_config.json: transformers' defaults apply
    summary = {"models": paths, "weights": weights, "base_model": base_path, "output_dir": cfg.output_dir}
    if cfg.rope_scaling:
        summary["rope_parameters"] = write_rope_scaling(cfg.output_dir, cfg.rope_scaling)
    with open(os.path.join(cfg.output_dir, "merge_config.yaml"), "w") as f:
        f.write("# mergekit-yaml merge_config.yaml <out>  reproduces this merge (written by align.pipeline.merge)\n")
        yaml.safe_dump(spec, f, sort_keys=False)
    return summary
