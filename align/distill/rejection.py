"""Distillation's rejection-sampling teacher (`loss: rejection_sampling`): a teacher whose lead is more samples and a
verifier. Before training it samples `teacher_best_of` answers to each prompt, the row's verifier keeps the first right
one in the shape its asked mode wants, and the student learns the kept answers (align/distill/trainer.py: the
next-token loss, `DistillTrainer._answer_nll`), with `replay_data` conversations beside them. The same sampling on
the held-out rows measures the teacher's own accuracy, per mode.

    answers = best_of_samples(teacher, teacher_tok, rows, conversations, args)     # None where no sample passed
    metrics["teacher_best_of"] = teacher_best_of_accuracy(conv, teacher, teacher_tok, args)
"""

from __future__ import annotations

import logging
from collections.abc import Sequence

from align.data.loading import load_replay_conversations
from align.distill.config import DistillConfig
from align.distill.metrics import _decode, render_prompts
from align.distill.teacher import FewShotPool, _prompt_part, _teacher_view, teacher_hints, thinking_view
from align.eval.generation import generate_and_score, model_generate
from align.rollout import SamplingParams
from align.runtime.distributed import full_model
from rewards.extract import strip_think
from rewards.format import mode_format_reward
from rewards.length import prompt_mode

logger = logging.getLogger(__name__)

SAMPLES_PER_LOG = 512  # rejection_sampling's progress line: one per this many teacher answers


def best_of_samples(
    teacher,
    teacher_tok,
    rows: Sequence[dict],
    conversations: Sequence[Sequence[dict]],
    args: DistillConfig,
    pool: FewShotPool | None = None,
    groups: Sequence | None = None,
    hints: Sequence[str] | None = None,
) -> list[str | None]:
    """rejection_sampling: `teacher_best_of` answers per prompt sampled at `temperature` (the teacher's own view of
    it), and the first that the row's verifier accepts (`align.eval.statistics`, as every accuracy here) in the shape
    its asked mode wants (`rewards.format.mode_format_reward`: a think block with reasoning in think mode, none in
    no_think); None where no sample is. The teacher's lead is its samples plus the verifier: the student sees
    neither the answer nor the verifier, only what they picked. A prompt is sampled until its first accepted
    answer, at most `teacher_best_of` times: the first accepted of up to n samples, as before, for fewer samples.

    Collective: every rank passes all rows and gets all answers; each samples its share of the copies."""
    n = args.teacher_best_of
    asked = [prompt_mode(m) for m in conversations]
    thinks = [args.teacher_thinks and mode == "no_think" for mode in asked]  # answered thinking, learned without it
    prompts = [
        _teacher_view(
            thinking_view(_prompt_part(m)) if thinks[i] else _prompt_part(m),
            args,
            pool,
            groups[i] if groups is not None else None,
            hints[i] if hints is not None else None,
        )
        for i, m in enumerate(conversations)
    ]
    if args.teacher_thinks:
        logger.info(
            "teacher_thinks: %d of %d no_think prompts answered thinking, learned without the think block",
            sum(thinks),
            len(thinks),
        )
    prompt_ids = render_prompts(teacher_tok, prompts, args.teacher_chat_template_kwargs)
    generate, out = model_generate(teacher, teacher_tok), [None] * len(rows)
    sampled = verified = 0
    for k in range(n):  # sample k of every prompt still without an accepted answer, side by side
        pending = [i for i in range(len(rows)) if out[i] is None]
        for start in range(
            0, len(pending), SAMPLES_PER_LOG
        ):  # the same chunks on every rank: collective calls pair up
            part = pending[start : start + SAMPLES_PER_LOG]
            # a seed of its own per chunk (the engine restarts its random stream at every call): the samples so far
            params = SamplingParams(
                temperature=args.temperature,
                max_new_tokens=args.max_completion_length,
                stop_token_ids=[teacher_tok.eos_token_id],
                seed=args.seed + sampled,
                logprobs=False,
            )
            records = generate_and_score(
                generate, [rows[i] for i in part], [prompt_ids[i] for i in part], params, _decode(teacher_tok)
            )
            for i, record in zip(part, records, strict=True):
                out[i] = _accepted(record, "think" if thinks[i] else asked[i], thinks[i])
            sampled, verified = sampled + len(part), verified + sum(r["correct"] for r in records)
            logger.info(
                "teacher best-of-%d: sample %d of each prompt still without one: %d answers sampled, %d "
                "verified, %d of %d prompts answered so far",
                n,
                k + 1,
                sampled,
                verified,
                sum(a is not None for a in out),
                len(rows),
            )
    return out


def _accepted(record: dict, shape: str, conclusion_only: bool) -> str | None:
    """The text the student learns from one checked sample, or None: it must pass the verifier in the `shape` it was
    asked for; with `conclusion_only` (teacher_thinks) the text after its think block, which must have the no_think
    shape."""
    if not record["correct"] or mode_format_reward([record["text"]], mode=[shape])[0] == 0.0:
        return None
    text = record["text"]  # the text that was checked: special tokens such as <think> kept, eos dropped
    if conclusion_only:  # the conclusion alone, in the shape the student was asked for
        text = strip_think(text).strip()
        if not text or mode_format_reward([text], mode=["no_think"])[0] == 0.0:
            return None
    return text


def verified_answers(conv: dict, teacher, teacher_tok, args: DistillConfig):
    """The training conversations with the teacher's verified best-of-`teacher_best_of` answers in place of the
    dataset's; prompts with none are dropped. Collective: every rank gets all the answers."""
    convs, groups, hints = list(conv["train"]["messages"]), conv["groups"], conv["hints"]
    with full_model(teacher, None) as whole:
        answers = best_of_samples(whole, teacher_tok, conv["rows"], convs, args, conv["pool"], groups, hints)
    kept = [i for i, a in enumerate(answers) if a is not None]
    logger.info(
        "rejection_sampling: the teacher's best of %d has a verified answer for %d of %d training prompts",
        args.teacher_best_of,
        len(kept),
        len(answers),
    )
    if not kept:
        raise ValueError(
            f"rejection_sampling: none of the teacher's {args.teacher_best_of} samples was accepted "
            f"by the verifier on any of the {len(answers)} training prompts; raise teacher_best_of, "
            "raise max_completion_length, or check the rows' answer and reward columns"
        )
    return (
        conv["train"]
        .select(kept)
        .map(
            lambda row, i: {
                "messages": _prompt_part(row["messages"]) + [{"role": "assistant", "content": answers[kept[i]]}]
            },
            with_indices=True,
        )
    )


def by_mode(rows: list[dict], flags: list) -> dict[str, float]:
    """The share of true flags among the rows of each asked reasoning mode (their prompt's /think or /no_think)."""
    out: dict[str, list] = {}
    for row, flag in zip(rows, flags, strict=True):
        out.setdefault(prompt_mode(row["prompt_messages"]) or "unflagged", []).append(float(flag))
    return {m: sum(v) / len(v) for m, v in sorted(out.items())}


def teacher_best_of_accuracy(conv: dict, teacher, teacher_tok, args: DistillConfig) -> dict:
    """rejection_sampling: the teacher's own accuracy on the held-out rows, without the answer: the share of prompts
    where one of its `teacher_best_of` samples passes the verifier (what it would hand the student), overall and
    per asked mode, with the per-row flags. Collective, like `teacher_answers`."""
    rows = conv["eval_rows"]
    hints = teacher_hints(rows, args.teacher_hint) if args.teacher_hint else None
    groups = None if conv["groups"] is None else [r.get(args.teacher_few_shot_group) for r in rows]
    with full_model(teacher, None) as whole:
        answers = best_of_samples(
            whole, teacher_tok, rows, [r["prompt_messages"] for r in rows], args, conv["pool"], groups, hints
        )
    flags = [int(a is not None) for a in answers]
    return {
        "n": args.teacher_best_of,
        "accuracy": sum(flags) / max(len(flags), 1),
        "num_prompts": len(flags),
        "by_mode": by_mode(rows, flags),
        "correct": flags,
    }


def add_replay_conversations(train, spec: str, limit: int | None = None):
    """rejection_sampling: the verified answers + `spec`'s conversations (`replay_data`), one `messages` column."""
    import datasets

    replay = load_replay_conversations(spec, limit)
    rows = []
    for i, messages in enumerate(replay["messages"]):
        turns = messages if isinstance(messages, list) else []
        if not (
            turns
            and all(isinstance(m, dict) and {"role", "content"} <= set(m) for m in turns)
            and turns[-1]["role"] == "assistant"
        ):
            raise ValueError(
                f"replay_data {spec!r} row {i} is not a conversation ({{role, content}} turns) ending "
                f"in an assistant turn; got {str(messages)[:60]!r}"
            )
        rows.append({"messages": [{"role": m["role"], "content": m["content"]} for m in messages]})
    logger.info(
        "replay: %d conversations from %s added to %d verified answers (the same next-token loss)",
        len(rows),
        spec,
        len(train),
    )
    return datasets.concatenate_datasets([train, datasets.Dataset.from_list(rows, features=train.features)])
