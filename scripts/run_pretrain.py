"""Pretrain (or mid-train) a SmolLM3-style base model with our loop, then measure its task skill.

    accelerate launch scripts/run_pretrain.py recipes/tiny/pretrain.yaml
    accelerate launch scripts/run_pretrain.py recipes/tiny/pretrain_reasoning.yaml          # continues pretrain_small
    python scripts/run_pretrain.py recipes/tiny/pretrain.yaml --max_steps 20 --report_to none   # quick look

After training, every rank checks the skill a base model can show (its share of the questions, then all
gathered): greedy completions of held-out task questions (data_gen.tasks validation split, never in training) in
the pretraining text form "Question: ...\\nAnswer:", through the shared engine, checked by the one scorer
(`align.eval.statistics`: the row's verifier scores >= 1). Rank 0 writes `<output_dir>/skill.json` and prints the
accuracy with its 95% interval (per family; chance is ~0 for these open-ended answers).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass, field

import torch
from transformers import AutoModelForCausalLM, AutoTokenizer

from align.cli import run
from align.eval.generation import model_generate
from align.eval.generative import run_generative
from align.eval.suite import eval_device
from align.modeling.loading import write_rope_scaling
from align.runtime.distributed import barrier, world, zero3_init_disabled
from data_gen.tasks import make_tasks
from pretrain.model import ModelArguments
from pretrain.train import PretrainConfig, train


@dataclass
class SkillArguments:
    skill_eval_num: int = field(default=0, metadata={"help": "Held-out task questions to answer greedily (0 = skip)."})
    skill_families: str = field(default="", metadata={"help": "Comma-separated task families (default: all ours)."})
    skill_max_new_tokens: int = field(default=64, metadata={"help": "Generation budget per answer."})


def task_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int = 64) -> dict:
    """Greedy accuracy of `model` on task rows in the plain pretraining form, overall (with its 95% interval) and per
    family, from the one scorer. Collective: every rank passes all rows and gets the result over all of them."""
    stats, samples = run_generative(model_generate(model, tokenizer), tokenizer, rows, "plain", max_new_tokens)
    low, high = stats["acc_ci"]
    return {
        "accuracy": stats["acc"],
        "num": stats["num"],
        "ci_low": low,
        "ci_high": high,
        "per_family": stats.get("by_family", {}),
        "samples": [
            {
                "prompt": r["prompt"],
                "gold": r["answer"],
                "completion": s["completion"].strip(),
                "ok": int(s["correct"]),
            }
            for r, s in zip(rows[:12], samples[:12])
        ],
    }


def main(model_args: ModelArguments, cfg: PretrainConfig, skill: SkillArguments) -> dict:
    result = train(model_args, cfg)
    if result.get("stopped"):
        return result
    if model_args.rope_scaling and world()[0] == 0:  # e.g. YaRN: the saved model reads past its trained context
        result["rope_parameters"] = write_rope_scaling(cfg.output_dir, model_args.rope_scaling)
    if not skill.skill_eval_num:
        return result
    barrier()  # every rank reads the saved model: wait until it is written

    families = [f.strip() for f in skill.skill_families.split(",") if f.strip()] or None
    rows = make_tasks(families, num=skill.skill_eval_num, split="validation", seed=1234)
    with zero3_init_disabled():  # each rank scores its share with a whole copy of the saved model
        model = AutoModelForCausalLM.from_pretrained(cfg.output_dir, dtype=torch.float32).to(eval_device())
    tokenizer = AutoTokenizer.from_pretrained(cfg.output_dir)
    acc = task_accuracy(model, tokenizer, rows, skill.skill_max_new_tokens)
    if world()[0] != 0:
        return {**result, "skill": acc}
    with open(os.path.join(cfg.output_dir, "skill.json"), "w") as f:
        json.dump(acc, f, indent=1)
    fam = ", ".join(f"{k} {v:.0%}" for k, v in acc["per_family"].items())
    print(
        f"held-out task skill (greedy, plain form): {acc['accuracy']:.1%} of {acc['num']} "
        f"(95% CI {acc['ci_low']:.1%}-{acc['ci_high']:.1%}; {fam})"
    )
    final = result.get("final_eval", {})
    print("final held-out loss: " + ", ".join(f"{k} {v:.3f}" for k, v in final.items() if k.startswith("eval_")))
    return {**result, "skill": acc}


CONFIG_TYPES = (ModelArguments, PretrainConfig, SkillArguments)


if __name__ == "__main__":
    run(main, *CONFIG_TYPES)
