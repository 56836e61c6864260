"""Pretrain (or mid-train) a SmolLM3-style base model with our loop, then measure its task skill.

    accelerate launch scripts/pretrain.py recipes/tiny_pretrain.yaml
    accelerate launch scripts/pretrain.py recipes/tiny_midtrain.yaml          # continues pretrain_small
    python scripts/pretrain.py recipes/tiny_pretrain.yaml --max_steps 20 --report_to none   # quick look

After training, rank 0 checks the skill a base model can show: greedy completions of held-out task
questions (data_gen.tasks test split, never in training) in the pretraining text form
"Question: ...\\nAnswer:", scored by exact match of the last \\boxed{...}. Results go to
`<output_dir>/skill.json` and stdout (per family; chance is ~0 for these open-ended answers).
"""

from __future__ import annotations

import json
import os
import re
import sys
from dataclasses import dataclass, field

# This file is named like the `pretrain` package; drop its own folder from the path so imports find the package.
sys.path = [p for p in sys.path if os.path.abspath(p or ".") != os.path.dirname(os.path.abspath(__file__))]

import torch  # noqa: E402

from align.cli import run  # noqa: E402
from pretrain.model import ModelArguments  # noqa: E402
from pretrain.train import PretrainConfig, train  # noqa: E402

BOXED = re.compile(r"\\boxed\{([^{}]*)\}")


@dataclass
class SkillArguments:
    skill_eval_num: int = field(default=0, metadata={"help": "Held-out task questions to answer greedily (0 = skip)."})
    skill_families: str = field(default="", metadata={"help": "Comma-separated task families (default: all ours)."})
    skill_max_new_tokens: int = field(default=64, metadata={"help": "Generation budget per answer."})


@torch.no_grad()
def task_accuracy(model, tokenizer, rows: list[dict], max_new_tokens: int = 64, batch_size: int = 32) -> dict:
    """Greedy accuracy of `model` on task rows in the plain pretraining form, overall and per family."""
    eos = [tokenizer.convert_tokens_to_ids(t) for t in ("<|endoftext|>", "<|im_end|>")]
    # "\n" ends an answer line; the base model has no chat format yet.
    newline = tokenizer("\n", add_special_tokens=False)["input_ids"]
    tokenizer.padding_side = "left"
    model.eval()
    hits: dict[str, list[int]] = {}
    samples = []
    for start in range(0, len(rows), batch_size):
        batch = rows[start : start + batch_size]
        prompts = [f"<|endoftext|>Question: {r['prompt']}\nAnswer:" for r in batch]
        enc = tokenizer(prompts, return_tensors="pt", padding=True, add_special_tokens=False)
        out = model.generate(
            **enc,
            max_new_tokens=max_new_tokens,
            do_sample=False,
            eos_token_id=eos + newline[-1:],
            pad_token_id=tokenizer.pad_token_id,
        )
        for r, ids in zip(batch, out[:, enc["input_ids"].shape[1] :]):
            text = tokenizer.decode(ids, skip_special_tokens=True)
            found = BOXED.findall(text)
            ok = int(bool(found) and found[-1].strip() == r["answer"].strip())
            hits.setdefault(r["family"], []).append(ok)
            if len(samples) < 12:
                samples.append({"prompt": r["prompt"], "gold": r["answer"], "completion": text.strip(), "ok": ok})
    per_family = {f: sum(v) / len(v) for f, v in sorted(hits.items())}
    total = [x for v in hits.values() for x in v]
    return {
        "accuracy": sum(total) / max(len(total), 1),
        "num": len(total),
        "per_family": per_family,
        "samples": samples,
    }


def main(model_args: ModelArguments, cfg: PretrainConfig, skill: SkillArguments) -> dict:
    result = train(model_args, cfg)
    if result.get("stopped") or int(os.environ.get("RANK", "0")) != 0:
        return result
    if model_args.rope_scaling:  # e.g. YaRN: the saved model reads past its trained context at inference
        from align.models import write_rope_scaling

        result["rope_parameters"] = write_rope_scaling(cfg.output_dir, model_args.rope_scaling)
    if not skill.skill_eval_num:
        return result
    from transformers import AutoModelForCausalLM, AutoTokenizer

    from data_gen.tasks import make_tasks

    families = [f.strip() for f in skill.skill_families.split(",") if f.strip()] or None
    rows = make_tasks(families, num=skill.skill_eval_num, split="test", seed=1234)
    model = AutoModelForCausalLM.from_pretrained(cfg.output_dir, dtype=torch.float32)
    tokenizer = AutoTokenizer.from_pretrained(cfg.output_dir)
    acc = task_accuracy(model, tokenizer, rows, skill.skill_max_new_tokens)
    with open(os.path.join(cfg.output_dir, "skill.json"), "w") as f:
        json.dump(acc, f, indent=1)
    fam = ", ".join(f"{k} {v:.0%}" for k, v in acc["per_family"].items())
    print(f"held-out task skill (greedy, plain form): {acc['accuracy']:.1%} of {acc['num']} ({fam})")
    final = result.get("final_eval", {})
    print("final held-out loss: " + ", ".join(f"{k} {v:.3f}" for k, v in final.items() if k.startswith("eval_")))
    return {**result, "skill": acc}


CONFIG_TYPES = (ModelArguments, PretrainConfig, SkillArguments)


if __name__ == "__main__":
    run(main, *CONFIG_TYPES)
