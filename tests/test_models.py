"""Model loading: the builtin SmolLM2-135M (GGUF -> cached HF dir) loads and answers; bad paths are clear."""

import os
import subprocess
import sys

import pytest
import torch

from align.modeling.loading import load_model, load_tokenizer, resolve_model_path


@pytest.fixture(scope="module")
def smollm2():
    return load_model("builtin:smollm2-135m-instruct"), load_tokenizer("builtin:smollm2-135m-instruct")


def test_builtin_model_converts_once_and_answers(smollm2):
    model, tokenizer = smollm2
    assert model.dtype == torch.float32
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6
    path = resolve_model_path("builtin:smollm2-135m-instruct")
    assert (torch.tensor(0) == 0) and path.endswith("smollm2-135m-instruct")
    messages = [{"role": "user", "content": "What is the capital of France?"}]
    inputs = tokenizer.apply_chat_template(messages, add_generation_prompt=True, return_tensors="pt", return_dict=True)
    out = model.generate(**inputs, max_new_tokens=12, do_sample=False)
    reply = tokenizer.decode(out[0, inputs["input_ids"].shape[1] :], skip_special_tokens=True)
    assert "Paris" in reply


def test_converted_dir_loads_with_plain_transformers():
    from transformers import AutoModelForCausalLM

    path = resolve_model_path("builtin:smollm2-135m-instruct")
    model = AutoModelForCausalLM.from_pretrained(path)
    assert getattr(model.config, "quantization_config", None) is None


@pytest.mark.parametrize(
    "name, error, message",
    [
        ("builtin:gpt-17", ValueError, "unknown builtin model 'gpt-17'; available: builtin:smollm2-135m-instruct"),
        ("./outputs/does-not-exist", FileNotFoundError, "does not exist"),
        ("/no/such/dir", FileNotFoundError, "does not exist"),
    ],
)
def test_bad_model_names(name, error, message):
    with pytest.raises(error, match=message):
        resolve_model_path(name)


def test_dir_without_config(tmp_path):
    with pytest.raises(FileNotFoundError, match="has no config.json"):
        resolve_model_path(str(tmp_path))


def test_a_hub_revision_is_downloaded_at_that_revision(monkeypatch, tmp_path):
    import huggingface_hub

    calls = []

    def fake_snapshot(repo, revision=None, **kwargs):
        calls.append((repo, revision))
        if revision == "missing":
            raise huggingface_hub.errors.RevisionNotFoundError("no such revision")
        return str(tmp_path)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", fake_snapshot)
    # SmolLM3's intermediate checkpoints live on branches of one repo (the published SFT starts from one)
    assert resolve_model_path("HuggingFaceTB/SmolLM3-3B-checkpoints@it-mid-training") == str(tmp_path)
    assert calls == [("HuggingFaceTB/SmolLM3-3B-checkpoints", "it-mid-training")]
    with pytest.raises(FileNotFoundError, match=r"could not serve revision 'missing'.*hf download org/m --revision"):
        resolve_model_path("org/m@missing")


def test_kept_freed_memory_means_a_training_step_does_not_fault_again():
    """glibc unmaps every freed block over 32 MB, so each training step faults every page of its large tensors
    again; with `keep_freed_memory` (every CPU stage) a step reuses the last one's blocks."""
    import subprocess

    code = (
        "import resource, sys, torch\n"
        "from align.runtime.memory import keep_freed_memory\n"
        "if sys.argv[1] == '1':\n    assert keep_freed_memory()\n"
        "faults = lambda: resource.getrusage(resource.RUSAGE_SELF).ru_minflt\n"
        "w = torch.randn(1024, requires_grad=True)\n"
        "def step():\n"
        "    x = torch.randn(16384, 1024)\n"  # 64 MB activations (and as much again for each saved or grad tensor)
        "    ((x * w).relu() * w).sum().backward()\n"
        "    w.grad = None\n"
        "for _ in range(6):\n    step()\n"  # the heap grows to the step's peak, then stays
        "counts = []\n"
        "for _ in range(8):\n    before = faults()\n    step()\n    counts.append(faults() - before)\n"
        "print(min(counts))\n"
    )
    # The least-faulting step: with glibc's default every step faults its 64 MB again; with the setting the steady
    # state faults nothing, and a one-off growth of the heap (fragmentation by small allocations, seen in a step or
    # three of a busy machine's run) is not the steady state.
    counts = {
        flag: int(
            subprocess.run(
                [sys.executable, "-c", code, flag], capture_output=True, text=True, check=True
            ).stdout.split()[-1]
        )
        for flag in "01"
    }
    pages = (64 << 20) // 4096
    assert counts["0"] > pages, counts  # glibc's default: unmapped on free, faulted again every step
    assert counts["1"] < pages // 20, counts


def test_kept_freed_memory_still_gives_back_blocks_above_its_ceiling():
    """Whole-vocabulary logits (a GB, a size that changes with every batch) kept in a heap that never shrinks left it
    fragmented and growing (the 135M APO reached 24 GB and was killed): blocks above the ceiling go back on free."""
    import subprocess

    code = (
        "import torch\n"
        "from align.runtime.memory import KEEP_FREED_CEILING, keep_freed_memory\n"
        "assert keep_freed_memory()\n"
        "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096\n"
        "before = rss()\n"
        "for extra in (1, 2, 3, 4):\n"  # ever larger: none fits a freed one
        "    big = torch.ones(KEEP_FREED_CEILING + (extra << 24), dtype=torch.uint8)\n"
        "    del big\n"
        "kept = torch.ones(KEEP_FREED_CEILING // 4, dtype=torch.uint8)\n"
        "del kept\n"
        "print(rss() - before)\n"
    )
    grown = int(
        subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()[-1]
    )
    assert grown < (128 << 20), grown  # the 64 MB block is kept; none of the four > 256 MB ones (1.1 GB together)


def test_kept_freed_memory_goes_back_when_the_machine_runs_low():
    """The safety valve every training stage runs after each step (align.stage.train): kept free memory stays while
    the machine has room, and goes back to the OS (malloc_trim) once less than a fifth of its memory is available."""
    import subprocess

    code = (
        "import torch\n"
        "import align.runtime.memory as c\n"
        "assert c.keep_freed_memory()\n"
        "rss = lambda: int(open('/proc/self/statm').read().split()[1]) * 4096\n"
        "big = torch.ones(200 << 20, dtype=torch.uint8)\n"  # under the ceiling: from the heap
        "pin = torch.ones(1 << 20, dtype=torch.uint8)\n"  # above it: the heap cannot shrink from its top
        "del big\n"
        "kept = rss()\n"
        "c._meminfo = lambda: (50, 100)\n"  # half the machine free: keep
        "roomy = c.trim_if_memory_low()\n"
        "after_roomy = rss()\n"
        "c._meminfo = lambda: (10, 100)\n"  # a tenth free: hand it back
        "low = c.trim_if_memory_low()\n"
        "print(roomy, low, kept - after_roomy, kept - rss())\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout.split()
    roomy, low, freed_roomy, freed_low = out[0] == "True", out[1] == "True", int(out[2]), int(out[3])
    assert not roomy and freed_roomy < (16 << 20)
    assert low and freed_low > (150 << 20), freed_low


# ------------------------------------------------------------------ first use on a machine: convert once, safely

_CONVERT = """
import sys, time
import transformers
if sys.argv[1] == "hang":  # write the weights, then stall before the rename: the test kills us here
    save = transformers.PreTrainedModel.save_pretrained
    def slow_save(self, *args, **kwargs):
        save(self, *args, **kwargs)
        time.sleep(600)
    transformers.PreTrainedModel.save_pretrained = slow_save
if sys.argv[1] == "rank1":  # as a launched rank other than 0 (transformers saves models on rank 0 only)
    import transformers.distributed.mixin as mixin
    mixin._is_torch_distributed_initialized = lambda: True
    mixin._get_torch_distributed_rank = lambda: 1
from align.modeling.loading import resolve_model_path
print(resolve_model_path("builtin:smollm2-135m-instruct"))
"""


def _converter(mode: str, cache) -> subprocess.Popen:
    env = {**os.environ, "SMOLALIGN_CACHE": str(cache), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(
        [sys.executable, "-c", _CONVERT, mode], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True
    )


@pytest.mark.slow
def test_a_killed_converter_leaves_no_lock_and_no_half_model_and_racers_convert_once(tmp_path):
    """SIGKILL a converter with its weights half-way to the cache (written, not renamed): no model appears; then
    two processes start at once on that cache: one converts (one line in conversions.log), the other waits for it,
    the killed one's temporary directory is gone, and the directory loads. The racers look like launched rank 1
    (transformers writes models on torch.distributed rank 0 only; the converter must write whatever its rank)."""
    import signal
    import time

    models = tmp_path / "models"
    victim = _converter("hang", tmp_path)
    deadline = time.time() + 300
    while not list(models.glob(".smollm2-135m-instruct-*/model.safetensors")) and time.time() < deadline:
        assert victim.poll() is None, victim.stderr.read()[-2000:]
        time.sleep(0.05)
    time.sleep(1.0)
    victim.send_signal(signal.SIGKILL)
    victim.wait()
    assert list(models.glob(".smollm2-135m-instruct-*")), "the killed converter left its temporary directory"
    assert not (models / "smollm2-135m-instruct").exists() and not (models / "conversions.log").exists()

    racers = [_converter("rank1", tmp_path) for _ in range(2)]
    outs = [p.communicate(timeout=600) for p in racers]
    assert [p.returncode for p in racers] == [0, 0], [err[-2000:] for _, err in outs]
    target = models / "smollm2-135m-instruct"
    assert {out.strip().splitlines()[-1] for out, _ in outs} == {str(target)}
    assert len((models / "conversions.log").read_text().splitlines()) == 1  # converted once, by one of them
    assert not list(models.glob(".smollm2-135m-instruct-*"))
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(target)
    assert 130e6 < sum(p.numel() for p in model.parameters()) < 140e6


@pytest.mark.parametrize(
    "name, flash_attn, cuda, expected",
    [
        ("auto", False, False, "sdpa"),
        ("auto", False, True, "sdpa"),  # a GPU without flash-attn: sdpa, not an import error
        ("auto", True, False, "sdpa"),  # flash-attn's kernels run on CUDA tensors only
        ("auto", True, True, "flash_attention_2"),
        (None, True, True, "flash_attention_2"),  # unset means auto
        ("sdpa", True, True, "sdpa"),  # a named kernel is kept
        ("eager", False, False, "eager"),
        ("flash_attention_2", True, True, "flash_attention_2"),
    ],
)
def test_auto_attention_takes_flash_attn_when_installed_on_cuda_else_sdpa(
    monkeypatch, name, flash_attn, cuda, expected
):
    import importlib.util

    from align.modeling import loading

    real = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda mod, *a: (object() if flash_attn else None) if mod == "flash_attn" else real(mod, *a),
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: cuda)
    monkeypatch.setattr(loading, "_attention_logged", [])
    assert loading.resolve_attn_implementation(name) == expected


def test_auto_attention_is_logged_once_and_a_missing_flash_attn_is_one_error(monkeypatch, caplog):
    import importlib.util
    import logging

    from align.modeling import loading

    assert importlib.util.find_spec("flash_attn") is None  # this machine has none: the real branch
    monkeypatch.setattr(loading, "_attention_logged", [])
    with caplog.at_level(logging.INFO, logger=loading.__name__):
        assert [loading.resolve_attn_implementation("auto") for _ in range(3)] == ["sdpa"] * 3
    assert [r.getMessage() for r in caplog.records] == ["attn_implementation auto -> sdpa (flash-attn not installed)"]
    with pytest.raises(
        ValueError,
        match="flash_attention_2 needs flash-attn.*pip install flash-attn --no-build-iso"
        "lation, or write attn_implementation: auto",
    ):
        loading.resolve_attn_implementation("flash_attention_2")
