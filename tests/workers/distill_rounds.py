"""Run under `accelerate launch` (tests/test_distributed.py): distillation's expert iteration (`rejection_rounds`)
as `scripts/distill.py` runs it, with one thing replaced: the teacher's sampler answers every prompt with its row's
gold answer in the asked mode's form (micro models answer nothing right, and rejection sampling needs a verified
answer). Everything else is the stage's own path: each round builds its trainer (its DeepSpeed engine under
zero3.yaml), trains, saves, and the next round samples from what the last one saved. Rank 0 writes the weights each
sampling call was given to <out>/teachers.json and the conversations each round's student learns to
<out>/learned-<n>.json; each rank writes the mode each of its prompts was shown the teacher in (its system flag) to
<out>/teacher_views-rank<r>.json.

    accelerate launch --config_file recipes/accelerate/zero3.yaml --num_processes 2 \
        tests/workers/distill_rounds.py OUT RECIPE [--key value ...]
"""

import json
import os
import sys
from types import SimpleNamespace


def main() -> None:
    out, argv = sys.argv[1], sys.argv[2:]
    import align.distill.rejection as rejection
    import align.distill.trainer as trainer
    from align.cli import launch_rank, parse, run
    from align.config import ModelConfig, ScriptArguments
    from align.data.loading import get_dataset
    from align.distill import DistillConfig
    from align.distill import main as distill
    from data_gen.tasks import assistant_text

    script, _, _ = parse(ScriptArguments, DistillConfig, ModelConfig, args=argv)
    data = get_dataset(script)
    rows = {r["prompt"]: r for split in data for r in data[split].to_list()}
    teachers: list[str] = []
    views: list[dict] = []  # {"prompt", "mode"}: what the teacher was shown, every sampling call
    learned: list[list] = []

    def dump(name: str, obj) -> None:
        if launch_rank() == 0:
            with open(os.path.join(out, name), "w") as f:
                json.dump(obj, f)

    def oracle(model, tokenizer, *a, **kw):
        teachers.append(model.config.name_or_path)
        dump("teachers.json", teachers)

        def generate(prompt_ids, params):
            answers = []
            for ids in prompt_ids:
                text = tokenizer.decode(ids)
                row = rows[max((p for p in rows if p in text), key=len)]
                mode = "no_think" if "/no_think" in text else "think"
                views.append({"prompt": row["prompt"], "mode": mode})
                answer = assistant_text(row, mode)
                answer_ids = tokenizer(answer, add_special_tokens=False)["input_ids"] + [tokenizer.eos_token_id]
                answers.append([SimpleNamespace(completion_ids=answer_ids, finish_reason="stop")])
            with open(os.path.join(out, f"teacher_views-rank{launch_rank()}.json"), "w") as f:
                json.dump(views, f)  # each rank samples its share of the prompts
            return answers

        return generate

    def verified_answers(*a, **kw):
        train = learn(*a, **kw)
        learned.append([row["messages"] for row in train.to_list()])
        dump(f"learned-{len(learned)}.json", learned[-1])
        return train

    rejection.model_generate, learn = oracle, trainer.verified_answers
    trainer.verified_answers = verified_answers
    run(distill, ScriptArguments, DistillConfig, ModelConfig, args=argv)


if __name__ == "__main__":
    main()
