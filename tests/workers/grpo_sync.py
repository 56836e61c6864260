"""Run under `accelerate launch` (tests/test_distributed.py): GRPO with the shared sampler on the launch it is given.

After training it checks, on whole weights gathered from every rank:
  1. after a weight push the engine's greedy completions equal the trained model's own (transformers) ones;
  2. two ranks sampling the same prompt get different completions, and a fresh sampler with the same seed on the
     same rank gets the same ones again;
  3. the saved model loads with AutoModelForCausalLM and equals the gathered weights;
  4. which log-prob passes ran (with or without gradients) and the importance-sampling metrics logged.
Rank 0 writes what it saw to <out>/result.json.

    accelerate launch --config_file recipes/accelerate/zero3.yaml --num_processes 2 \
        tests/workers/grpo_sync.py OUT RECIPE [--key value ...]
"""

import json
import os
import sys

import torch


def gathered_before_save(model, acc):
    from align.runtime.distributed import iter_full_params

    return [(n, t.detach().float().cpu().clone()) for n, t in iter_full_params(model, acc)]


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    from trl import get_peft_config

    from align.cli import parse
    from align.config import ModelConfig, ScriptArguments
    from align.data.loading import get_dataset
    from align.grpo.config import GRPOConfig
    from align.grpo.prompts import engine_context_length, prepare_prompts
    from align.grpo.reward_funcs import build_rewards
    from align.grpo.trainer import GRPOTrainer, rollout_knobs
    from align.modeling.loading import load_model, load_tokenizer, resolve_model_path
    from align.rollout import SamplingParams
    from align.rollout.hf import HFEngine
    from align.rollout.sampler import Sampler, build_sampler
    from align.runtime.distributed import full_model, gather_objects, iter_full_params
    from align.stage import save_trained_model

    script_args, args, model_args = parse(ScriptArguments, GRPOConfig, ModelConfig, args=argv)
    tokenizer = load_tokenizer(model_args.model_name_or_path)
    train = prepare_prompts(get_dataset(script_args)["train"], args.prompt_mode)
    model = load_model(model_args.model_name_or_path, dtype="float32")
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=build_rewards(args),
        args=args,
        train_dataset=train,
        processing_class=tokenizer,
        peft_config=get_peft_config(model_args),
    )
    acc = trainer.accelerator
    policy = acc.unwrap_model(trainer.model)
    trainer.sampler = build_sampler(
        args.rollout_backend,
        rollout_knobs(args, policy),
        policy,
        resolve_model_path(model_args.model_name_or_path),
        tokenizer,
        acc,
        seed=args.seed,
        max_model_len=engine_context_length(args, train, tokenizer),
        logprobs_kind="sampling" if args.vllm_importance_sampling_correction else "raw",
    )
    passes, inner = [], trainer._get_per_token_logps_and_entropies

    def counted(*a, **k):  # every log-prob pass of the trainer: with gradients (the loss) or without (TRL's old-logps)
        passes.append(torch.is_grad_enabled())
        return inner(*a, **k)

    trainer._get_per_token_logps_and_entropies = counted
    trainer.train()
    sampler = trainer.sampler

    texts = [tokenizer.apply_chat_template(r["prompt"], add_generation_prompt=True, tokenize=False) for r in train]
    prompts = tokenizer(texts[:4], add_special_tokens=False)["input_ids"]
    greedy = SamplingParams(temperature=0.0, max_new_tokens=16, stop_token_ids=[])
    sampler.sync(trainer.model_wrapped, trainer.state.global_step)  # the trained weights reach the engine
    engine_ids = [g[0].completion_ids for g in sampler.generate(trainer.model_wrapped, prompts, greedy)]
    with full_model(trainer.model_wrapped, acc) as whole:
        model_ids = [g[0].completion_ids for g in HFEngine(whole, tokenizer=tokenizer).generate(prompts, greedy)]

    sampling = dict(n=4, temperature=1.0, max_new_tokens=16, stop_token_ids=[])
    draws = []
    for _ in range(2):  # two fresh samplers with one seed: the same draws on this rank
        fresh = Sampler(sampler.engine, acc, seed=args.seed)
        params = SamplingParams(seed=fresh.next_seed(), **sampling)
        draws.append([r.completion_ids for r in fresh.generate(trainer.model_wrapped, prompts[:1], params)[0]])

    model_dir = os.path.join(out, "model")
    save_trained_model(trainer, tokenizer, model_dir, merge_lora=True)
    gathered = {n: t.detach().float().cpu().clone() for n, t in iter_full_params(policy, acc)}  # every rank
    engine_model = getattr(sampler.engine, "model", None)  # an hf engine's own copy (another dtype): compare weights
    copy_diff = copy_rounded_diff = None
    if engine_model is not None and engine_model is not policy:
        own = dict(engine_model.named_parameters())
        pairs = [(own[n].float().cpu(), t) for n, t in gathered_before_save(policy, acc) if n in own]
        copy_diff = max(float((e - t).abs().max()) for e, t in pairs)
        # 0 when the copy holds the trained weights rounded to its own dtype
        copy_rounded_diff = max(float((e - t.to(engine_model.dtype).float()).abs().max()) for e, t in pairs)
    ranks = gather_objects(
        {
            "engine_ids": engine_ids,
            "model_ids": model_ids,
            "draws": draws,
            "copy_diff": copy_diff,
            "copy_rounded_diff": copy_rounded_diff,
            "backend": sampler.backend,
            "pushes": sampler.num_pushes,
            "engine_dtype": str(getattr(sampler.engine, "dtype", None)),
            "no_grad_passes": passes.count(False),
            "loss_passes": passes.count(True),
            "is_in_loss_pass": trainer._importance_in_loss_pass(),
        }
    )
    if acc.is_main_process:
        from transformers import AutoModelForCausalLM

        from align.runtime.distributed import zero3_init_disabled

        with (
            zero3_init_disabled()
        ):  # one rank loads a whole model: no ZeRO-3 partitioning (it would wait for the rest)
            saved = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
        state = saved.state_dict()
        diffs = {n: float((state[n] - t).abs().max()) for n, t in gathered.items() if n in state}
        missing = sorted(set(gathered) - set(state))
        result = {
            "ranks": ranks,
            "saved_max_abs_diff": max(diffs.values()),
            "missing_in_saved": missing,
            "num_params": len(gathered),
            "world_size": acc.num_processes,
            "is_ratio_mean": [
                h["sampling/importance_sampling_ratio/mean"]
                for h in trainer.state.log_history
                if "sampling/importance_sampling_ratio/mean" in h
            ],
            "logp_diff_max": [
                h["sampling/sampling_logp_difference/max"]
                for h in trainer.state.log_history
                if "sampling/sampling_logp_difference/max" in h
            ],
            "distributed_type": str(acc.distributed_type),
        }
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)
    acc.wait_for_everyone()
    if sampler.backend != "hf":
        sampler.close()


if __name__ == "__main__":
    main()
    from align.runtime.distributed import leave_launcher

    leave_launcher()  # how our scripts end under a launcher
