"""Log-probabilities only where the loss needs them, on a CPU too.

TRL's fused LM head (`trl.trainer.utils.add_fused_lm_head`, used by its SFT and GRPO trainers) projects the hidden
states through the LM head in vocabulary tiles, but on a device without its Triton kernels (a CPU) it does so for
EVERY position, prompt and padding included, and masks the results afterwards. Only its "compact" path, taken where
Triton runs, selects the scored positions first. On a CPU that selection costs one gather, so `compact_lm_head`
takes it there as well: a GRPO batch of SmolLM2-135M (64 x (~100 prompt + 64 completion) tokens, vocabulary 49k)
runs the head on 4k rows instead of 10k; SFT with assistant-only loss skips the user and system turns. The
log-probs and their gradients are the same (tests/test_sft.py checks both).

TRL decides this with a module-level `_use_triton(device)` it looks up at call time; the context manager answers
"yes" for CPU tensors while our trainer's forward runs, so TRL's own trainers, run beside ours, keep their path.
"""

from __future__ import annotations

import contextlib


@contextlib.contextmanager
def compact_lm_head():
    import trl.trainer.utils as trl_utils

    original = getattr(trl_utils, "_use_triton", None)
    if original is None:  # another TRL: its head decides for itself
        yield
        return
    trl_utils._use_triton = lambda device: device.type == "cpu" or original(device)
    try:
        yield
    finally:
        trl_utils._use_triton = original
