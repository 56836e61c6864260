"""Distillation's held-out measurement inside the stage: `align.distill.metrics` on whole weights (ZeRO-3 gathers
them), the teacher's own accuracy beside it, and the greedy answers a process has already made, so that expert
iteration's rounds do not answer the same prompts with the same weights twice (`answers_key` says when two passes
answer alike).

    metrics["before"] = held_out_metrics(trainer, tok, tok, rows, mode="same", args=args, teacher_prompts={},
                                         with_teacher_accuracy=True, known={}, student_path=model_path)
"""

from __future__ import annotations

import hashlib
import json
import os

from align.distill.config import DistillConfig
from align.distill.metrics import evaluate, teacher_accuracy
from align.eval.generation import summarize
from align.modeling.loading import has_autocast_forward, native_forward, resolve_model_path
from align.runtime.distributed import full_model


def held_out_metrics(
    trainer,
    student_tok,
    teacher_tok,
    rows: list[dict],
    *,
    mode: str,
    args: DistillConfig,
    teacher_prompts: dict[str, str],
    with_teacher_accuracy: bool = False,
    known: dict | None = None,
    student_path: str | None = None,
) -> dict:
    """`distill_metrics.evaluate` (and the teacher's own accuracy) on whole weights: each rank answers and measures
    its share of the rows and every rank gets the result over all of them. Collective.

    `known` (with `student_path`, where the student's weights were loaded from or saved to): greedy answers already
    made in this process, by `answers_key`. The student's answers found there are not generated again (only the
    divergence to this teacher is measured), the ones made are added; the teacher's accuracy is read from there when
    the teacher is weights already answered (round 1: the student's own; round 2: round 1's saved model). What was
    read is listed under `reused`."""
    acc = trainer.accelerator
    with full_model(trainer.model_wrapped, acc) as student, full_model(trainer.teacher_model, acc) as teacher:
        skey = None if known is None or student_path is None else answers_key(student_path, student, rows, args)
        records, keep = (known or {}).get(skey), []
        out = evaluate(
            student,
            teacher,
            student_tok,
            teacher_tok,
            rows,
            mode=mode,
            max_new_tokens=args.distill_eval_max_new_tokens,
            uld_args=args,
            teacher_prompts=teacher_prompts,
            records=records,
            keep=keep,
        )
        reused = {"student": skey[0]} if records is not None else {}
        if skey is not None:
            known[skey] = keep
        if with_teacher_accuracy and "accuracy" in out:
            # in the teacher's own precision, as the student's and scripts/evaluate.py's answers (the trainer wraps
            # the teacher's forward in mixed precision's autocast for the loss)
            with native_forward(teacher):
                plain = known is not None and not teacher_prompts and not args.teacher_quantization
                tkey = answers_key(args.teacher_model_name_or_path, teacher, rows, args) if plain else None
                if tkey in (known or {}):
                    out["teacher_accuracy"] = summarize(known[tkey])["accuracy"]
                    reused["teacher"] = tkey[0]
                else:
                    out["teacher_accuracy"] = teacher_accuracy(
                        teacher, student_tok, rows, args.distill_eval_max_new_tokens, teacher_prompts=teacher_prompts
                    )
    if reused:
        out["reused"] = reused
    return out


def answers_key(path: str, model, rows: list[dict], args: DistillConfig) -> tuple:
    """What makes two greedy passes over the held-out rows answer alike: the same saved weights (the resolved
    directory), in the same dtype and forward precision (accelerate's autocast wrapper or the weights' own), on the
    same prompts with the same budget."""
    where = resolve_model_path(path)
    where = os.path.realpath(where) if os.path.isdir(where) else where
    prompts = hashlib.sha1(json.dumps([r["prompt_messages"] for r in rows], sort_keys=True).encode()).hexdigest()
    precision = "autocast" if has_autocast_forward(model) else "own"
    return where, str(next(model.parameters()).dtype), precision, prompts, args.distill_eval_max_new_tokens
