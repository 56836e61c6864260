"""Run under `accelerate launch` (tests/test_distributed.py): one GRPO step (dapo loss, plain SGD) twice on the same
tokens, once through TRL's own generate-and-score (its count of every rank's loss tokens) and once through dynamic
sampling's merged batch (every group has signal, so it keeps the same rows). The ranks hold different numbers of
completion tokens. Rank 0 writes each run's per-rank losses and token counts, and how far the two runs' trained
weights (gathered from every rank) differ and moved, to <out>/result.json.

    accelerate launch --config_file recipes/accelerate/zero3.yaml --num_processes 2 \
        tests/workers/grpo_token_mean.py OUT MODEL_DIR
"""

import json
import os
import sys

import datasets
import torch

# completion lengths per rank: two groups of two, lengths differing inside each group (every group has signal), and
# 16 loss tokens on rank 0 against 7 on rank 1
LENGTHS = {0: [6, 3, 5, 2], 1: [2, 1, 3, 1]}


def length_reward(completion_ids, **kwargs):
    return [float(len(ids)) for ids in completion_ids]


class FixedEngine:
    """Completions of this rank's LENGTHS, the same tokens in every run; they end with the stop token."""

    def __init__(self, rank: int):
        self.rank = rank

    def generate(self, prompts, params):
        from align.rollout.base import Rollout

        lengths = iter(LENGTHS[self.rank] * len(prompts))
        groups = []
        for p in prompts:
            group = []
            for _ in range(params.n):
                n = next(lengths)
                ids = [10 + (7 * k + self.rank) % 50 for k in range(n - 1)] + [params.stop_token_ids[0]]
                group.append(Rollout(list(p), ids, None, "stop"))
            groups.append(group)
        return groups

    def update_weights(self, named_params):
        for _ in named_params:
            pass

    def close(self):
        pass


def run(out: str, model_dir: str, dynamic: bool) -> tuple[dict, dict]:
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from align.grpo.config import GRPOConfig
    from align.grpo.trainer import GRPOTrainer
    from align.runtime.distributed import gather_objects, iter_full_params

    args = GRPOConfig(
        output_dir=os.path.join(out, f"dynamic_{dynamic}"),
        max_steps=1,
        per_device_train_batch_size=4,
        num_generations=2,
        max_completion_length=8,
        loss_type="dapo",
        beta=0.0,
        optim="sgd",
        learning_rate=1.0,
        max_grad_norm=0.0,
        lr_scheduler_type="constant",
        bf16=False,
        seed=0,
        logging_steps=1,
        save_strategy="no",
        report_to="none",
        gradient_checkpointing=False,
        dynamic_sampling=dynamic,
        vllm_importance_sampling_correction=False,
    )
    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32)
    rows = datasets.Dataset.from_list([{"prompt": [{"role": "user", "content": f"question {i}"}]} for i in range(8)])
    trainer = GRPOTrainer(
        model=model,
        reward_funcs=[length_reward],
        args=args,
        train_dataset=rows,
        processing_class=tokenizer,
        engine=FixedEngine(int(os.environ.get("RANK", 0))),
    )
    seen = []
    inner = trainer.compute_loss

    def recorded(model, inputs, *a, **k):
        loss = inner(model, inputs, *a, **k)
        mask = inputs["completion_mask"]
        seen.append(
            {
                "loss": float(loss),
                "num_items_in_batch": int(inputs["num_items_in_batch"]),
                "tokens": int(mask.sum()),
                "rows": int(mask.size(0)),
            }
        )
        return loss

    trainer.compute_loss = recorded
    trainer.train()
    acc = trainer.accelerator
    weights = {n: t.detach().float().cpu().clone() for n, t in iter_full_params(acc.unwrap_model(trainer.model), acc)}
    kept = [h["dynamic_sampling/kept_ratio"] for h in trainer.state.log_history if "dynamic_sampling/kept_ratio" in h]
    return {"ranks": gather_objects(seen), "kept_ratio": kept}, weights


def main() -> None:
    out, model_dir = sys.argv[1], sys.argv[2]
    from transformers import AutoModelForCausalLM

    from align.runtime.distributed import zero3_init_disabled

    trl_run, trl_weights = run(out, model_dir, dynamic=False)
    merged_run, merged_weights = run(out, model_dir, dynamic=True)
    if int(os.environ.get("RANK", 0)) == 0:
        with zero3_init_disabled():
            start = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).state_dict()
        result = {
            "trl": trl_run,
            "merged": merged_run,
            "weights_diff": max(float((merged_weights[n] - w).abs().max()) for n, w in trl_weights.items()),
            "moved": max(float((w - start[n]).abs().max()) for n, w in trl_weights.items() if n in start),
        }
        with open(os.path.join(out, "result.json"), "w") as f:
            json.dump(result, f)


if __name__ == "__main__":
    main()
    from align.runtime.distributed import leave_launcher

    leave_launcher()
