"""smolalign core: recipe CLI, data and model loading, chat masks, the rollout engine, and one
`main()` per post-training stage (sft, preference, grpo, distill). Heavy optional imports (vllm,
deepspeed, liger_kernel) are lazy so `import align` stays fast."""

__version__ = "0.1.0"
