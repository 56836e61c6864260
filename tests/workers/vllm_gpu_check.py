"""GPU-only checks of the vLLM engine (run by tests/workers/gpu_paths.sh; CPU versions: tests/test_rollout.py).

    python tests/workers/vllm_gpu_check.py MODEL_DIR

(1) Seeding the call, not each request: the same seeded call repeats after other calls, the caller's CUDA generator is
restored, and a decode step costs less than with a generator per request (vLLM's sampler serves those one at a time).
(2) head_dtype float32 on a bf16 engine: its log-probs are nearer a trainer's with TRL's fp32 head than a bf16 head's.
"""

import sys
import time

import torch
import torch.nn.functional as F


def main(model_dir: str) -> None:
    from transformers import AutoModelForCausalLM
    from vllm import SamplingParams as VSamplingParams
    from vllm.inputs import TokensPrompt

    from align.rollout.base import SamplingParams
    from align.rollout.vllm import VLLMEngine

    cuda = torch.cuda.is_available()  # the check is for a GPU; on a CPU it runs as a smoke test of this script
    dev = "cuda" if cuda else "cpu"
    rng_state = torch.cuda.get_rng_state if cuda else torch.get_rng_state
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    prompts = [[1 + (i * 7 + j) % 200 for j in range(24)] for i in range(64)]
    params = SamplingParams(n=4, temperature=1.0, max_new_tokens=128, seed=3, stop_token_ids=[], logprobs=False)
    engine = VLLMEngine(model_dir, dtype="bfloat16", gpu_memory_utilization=0.3)
    ids = lambda out: [[r.completion_ids for r in rs] for rs in out]  # noqa: E731
    state = rng_state()
    first = ids(engine.generate(prompts, params))
    engine.generate(prompts[:8], SamplingParams(**{**vars(params), "seed": 9}))
    print(
        "seeded call repeats:",
        ids(engine.generate(prompts, params)) == first,
        "| caller's generator restored:",
        torch.equal(rng_state(), state),
    )
    base = dict(n=4, temperature=1.0, max_tokens=128, ignore_eos=True, detokenize=False)
    toks = [TokensPrompt(prompt_token_ids=p) for p in prompts]
    for label, sampling in [
        ("one seed per call", VSamplingParams(**base)),
        ("a seed per request", [VSamplingParams(**base, seed=i * 4) for i in range(len(prompts))]),
    ]:
        engine.llm.generate(toks, sampling, use_tqdm=False)  # warm
        sync()
        t0 = time.perf_counter()
        for _ in range(3):
            engine.llm.generate(toks, sampling, use_tqdm=False)
        sync()
        print(f"{label}: {(time.perf_counter() - t0) / 3:.3f} s per call (256 sequences x 128 tokens)")
    engine.close()

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev).eval()
    seqs, gaps = None, {}
    for head in (None, "float32"):
        engine = VLLMEngine(model_dir, dtype="bfloat16", head_dtype=head, gpu_memory_utilization=0.3)
        if seqs is None:
            seqs = [r.prompt_ids + r.completion_ids for rs in engine.generate(prompts[:16], params) for r in rs]
        outs = engine.llm.generate(
            [TokensPrompt(prompt_token_ids=s) for s in seqs],
            VSamplingParams(max_tokens=1, prompt_logprobs=0, detokenize=False),
            use_tqdm=False,
        )
        lp = torch.tensor(
            [step[t].logprob for o, s in zip(outs, seqs) for step, t in zip(o.prompt_logprobs[1:], s[1:])]
        )
        ref = []
        for s in seqs:
            with torch.no_grad(), torch.autocast(dev, dtype=torch.bfloat16):
                h = model.model(torch.tensor([s], device=dev)).last_hidden_state
                with torch.autocast(dev, enabled=False):
                    logits = F.linear(h.float(), model.lm_head.weight.float())
            ref.append(logits[0, :-1].log_softmax(-1).gather(-1, torch.tensor(s[1:], device=dev)[:, None])[:, 0])
        gaps[head or "bfloat16"] = (lp - torch.cat(ref).cpu()).abs().mean().item()
        engine.close()
    print("mean |engine - trainer(fp32 head)| log-prob:", gaps)


if __name__ == "__main__":
    main(sys.argv[1])
