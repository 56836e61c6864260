"""Expert iteration for distillation's rejection-sampling teacher (`rejection_rounds`), and the stage's `main`.

One round is `align.distill.trainer.main`: the teacher samples `teacher_best_of` answers per prompt, the verifier
keeps the right ones, the student learns them. With `rejection_rounds: R > 1` the stage runs R rounds, each a whole
round on the same prompts and `max_steps`, and every round after the first takes as its student AND its teacher the
model the round before saved: the samples come from the improved student, so the lead it learns from moves with it
(expert iteration, as STaR and ReST). `rejection_round_student: start` keeps the teacher moving but trains the
stage's starting model again each round, on the newest round's answers (ReST-EM: the drift from the starting model,
e.g. in its chat answers, does not add up over rounds). Rounds before the last save to `output_dir/round-<k>`; the last
saves to `output_dir`. Its `distill_eval.json` spans the whole stage: `before` is round 1's (the stage's starting
model), `after` the last round's, the paired test between the two, and `rounds` each round's own before/after.

Held-out answers are made once per weights: a round whose student or teacher was measured already (round 1's teacher
is the student itself when it samples from its own weights; round 2's teacher is round 1's saved model, measured
after round 1; its student with `start` is round 1's) reads those greedy answers instead of generating them again
(`reused` in the round's report), and measures only its divergence.

Resume: a round whose `round-<k>/distill_eval.json` exists is done (it is written after the model is saved) and is
skipped; a round cut short resumes from its own checkpoints, as a one-round stage does.

    python scripts/distill.py recipes/smol135m/distill.yaml --rejection_rounds 2
"""

from __future__ import annotations

import copy
import json
import logging
import os

from accelerate import PartialState

from align.distill.trainer import main as one_round
from align.eval.statistics import paired_change
from align.runtime.checkpoint import write_json_atomic
from align.runtime.distributed import release_accelerator_state
from align.stage import round_dir

logger = logging.getLogger(__name__)


def main(script_args, training_args, model_args) -> dict:
    """The distillation stage: one round (`align.distill.trainer.main`), or `rejection_rounds` of expert iteration."""
    if training_args.rejection_rounds <= 1:
        return one_round(script_args, training_args, model_args)
    return expert_iteration(script_args, training_args, model_args)


def expert_iteration(script_args, args, model_args) -> dict:
    rounds, results = args.rejection_rounds, []
    # the rounds' greedy held-out answers: round 2's teacher is round 1's after, its student (start) round 1's before
    known: dict = {}
    start = model_args.model_name_or_path
    student, teacher = start, args.teacher_model_name_or_path
    for k in range(1, rounds + 1):
        out = round_dir(args.output_dir, k, rounds)
        report = os.path.join(out, "distill_eval.json")
        if k < rounds and os.path.exists(report):
            logger.info("expert iteration: round %d of %d is done (%s): skipped", k, rounds, out)
            with open(report) as f:
                results.append(json.load(f))
        else:
            logger.info(
                "expert iteration: round %d of %d: student %s, teacher %s -> %s", k, rounds, student, teacher, out
            )
            round_args, round_model = copy.copy(args), copy.copy(model_args)
            round_args.output_dir, round_args.rejection_rounds = out, 1
            round_args.teacher_model_name_or_path, round_model.model_name_or_path = teacher, student
            resume = getattr(args, "resume_from_checkpoint", None)
            if k < rounds and isinstance(resume, str) and os.path.isdir(resume):
                round_args.resume_from_checkpoint = (
                    None  # a checkpoint dir is the last round's: this one resumes its own
                )
            results.append(one_round(script_args, round_args, round_model, known))
            if k < rounds:
                release_accelerator_state()
        teacher = out  # the next round samples from what this one made
        student = start if args.rejection_round_student == "start" else out
    return whole_stage(results, args)


def whole_stage(results: list[dict], args) -> dict:
    """The last round's report with the stage's own before (round 1's) and the paired test across all rounds; each
    round's before/after accuracy and paired test under `rounds`. Rewrites `output_dir/distill_eval.json`."""
    first, last = results[0], results[-1]
    metrics = dict(last)
    metrics["rejection_rounds"] = len(results)
    metrics["rounds"] = [
        {
            "round": k,
            "teacher_best_of": r.get("teacher_best_of", {}).get("accuracy"),
            "before": r.get("before", {}).get("accuracy"),
            "after": r.get("after", {}).get("accuracy"),
            "paired": r.get("paired"),
        }
        for k, r in enumerate(results, start=1)
    ]
    if "before" in first:
        metrics["before"] = first["before"]
        if "teacher_best_of" in first:  # the lead the stage started from; each round's is under `rounds`
            metrics["teacher_best_of"] = first["teacher_best_of"]
        b, a = first["before"], last.get("after", {})
        if "correct" in b and "correct" in a:
            metrics["paired"] = paired_change(b["correct"], a["correct"])
            logger.info(
                "expert iteration: %d rounds, same prompts: accuracy %.3f -> %.3f, %d gained, %d lost, McNemar p=%.3g",
                len(results),
                b["accuracy"],
                a["accuracy"],
                metrics["paired"]["gained"],
                metrics["paired"]["lost"],
                metrics["paired"]["p_value"],
            )
    if PartialState().is_main_process:  # the pipeline reads it: replaced whole, never half written
        write_json_atomic(os.path.join(args.output_dir, "distill_eval.json"), metrics, indent=2)
    return metrics
