"""Run under `accelerate launch` (tests/test_distributed.py): distillation's expert iteration (`rejection_rounds`)
as `scripts/distill.py` runs it, with one thing replaced: the teacher's sampler answers every prompt with its row's
gold answer in the asked mode's form (micro models answer nothing right, and rejection sampling needs a verified
answer). Everything else is the stage's own path: each round builds its trainer (its DeepSpeed engine under
zero3.yaml), trains, saves, and the next round samples from what the last one saved. Rank 0 writes the weights each
sampling call was given to <out>/teachers.json.

    accelerate launch --config_file recipes/accelerate_configs/zero3.yaml --num_processes 2 \
        tests/workers/distill_rounds.py OUT RECIPE [--key value ...]
"""

import json
import os
import sys
from types import SimpleNamespace


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    import align.distill.rejection as rejection
    from align.cli import launch_rank, parse, run
    from align.configs import ModelConfig, ScriptArguments
    from align.data import get_dataset
    from align.distill import DistillConfig
    from align.distill import main as distill
    from data_gen.tasks import assistant_text

    script, _, _ = parse(ScriptArguments, DistillConfig, ModelConfig, args=argv)
    data = get_dataset(script)
    rows = {r["prompt"]: r for split in data for r in data[split].to_list()}
    teachers: list[str] = []

    def oracle(model, tokenizer, *a, **kw):
        teachers.append(model.config.name_or_path)
        if launch_rank() == 0:
            with open(os.path.join(out, "teachers.json"), "w") as f:
                json.dump(teachers, f)

        def generate(prompt_ids, params):
            answers = []
            for ids in prompt_ids:
                text = tokenizer.decode(ids)
                row = rows[max((p for p in rows if p in text), key=len)]
                answer = assistant_text(row, "no_think" if "/no_think" in text else "think")
                answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                answers.append([SimpleNamespace(completion_ids=answer_ids, finish_reason="stop")])
            return answers

        return generate

    rejection.model_generate = oracle
    run(distill, ScriptArguments, DistillConfig, ModelConfig, args=argv)


if __name__ == "__main__":
    main()
