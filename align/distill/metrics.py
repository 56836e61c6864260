"""Distillation's held-out metrics: teacher-student divergence and verifiable accuracy on greedy completions.

Why a module of its own: `align/distill/trainer.py` measures before and after training with these, and they are plain
functions of two models, their tokenizers and prompts (no trainer), so a benchmark or a test can call them alone.
Answers are generated through the shared engine and checked by the one scorer (`align.eval.statistics`).
same tokenizer: exact per-token reverse and forward KL on the student's greedy completions; cross tokenizer:
ULD's sorted-probability L1 on byte-aligned spans, the GOLD training distance.

    from align.distill.metrics import evaluate
    metrics = evaluate(student, teacher, student_tok, teacher_tok, rows, mode="same", max_new_tokens=64,
                       uld_args=None, teacher_prompts={})

Plain arguments only: the cross-tokenizer distance takes `uld_args`, the GOLDConfig whose `uld_*` settings the
training used (align.distill's DistillConfig is one), so this module imports nothing of the stage.
"""

from __future__ import annotations

import copy

import torch

from align.eval.generation import generate_and_score, greedy_params, model_generate, summarize
from align.eval.statistics import accuracy
from align.eval.verification import correct
from align.runtime.distributed import gather_objects, shard


def render_prompts(tokenizer, prompts: list[list[dict]], template_kwargs: dict | None = None) -> list[list[int]]:
    """Each conversation rendered with the tokenizer's chat template and a generation prompt, as token ids."""
    texts = [
        tokenizer.apply_chat_template(p, add_generation_prompt=True, tokenize=False, **(template_kwargs or {}))
        for p in prompts
    ]
    return [tokenizer(t, add_special_tokens=False)["input_ids"] for t in texts]


def greedy_token_completions(
    model, tokenizer, prompt_ids: list[list[int]], max_new_tokens: int, batch_size: int = 16
) -> list[list[int]]:
    """Greedy completion ids (up to and including the first eos) of already-tokenized prompts, through the shared
    engine's decode loop (`align.eval.generation.model_generate`). Local: this process's prompts."""
    if not prompt_ids:
        return []
    groups = model_generate(model, tokenizer, batch_size)(
        prompt_ids, greedy_params(max_new_tokens, [tokenizer.eos_token_id])
    )
    return [list(g[0].completion_ids) for g in groups]


def greedy_completions(
    model,
    tokenizer,
    prompts: list[list[dict]],
    max_new_tokens: int,
    batch_size: int = 16,
    template_kwargs: dict | None = None,
) -> tuple[list[list[int]], list[list[int]]]:
    """(prompt_ids, completion_ids up to and including the first eos) per prompt, greedy."""
    prompt_ids = render_prompts(tokenizer, prompts, template_kwargs)
    return prompt_ids, greedy_token_completions(model, tokenizer, prompt_ids, max_new_tokens, batch_size)


@torch.no_grad()
def _same_vocab_divergence(
    student, teacher, prompt_ids, completions, teacher_prompt_ids: list[list[int]] | None = None
) -> dict[str, float]:
    rev = fwd = 0.0
    count = 0
    for i, (p, c) in enumerate(zip(prompt_ids, completions, strict=True)):
        if not c:
            continue
        ids = torch.tensor([p + c], device=next(student.parameters()).device)
        # logits at positions len(p)-1 .. end-1 predict the completion tokens: (C, V)
        s = torch.log_softmax(student(input_ids=ids).logits[0, len(p) - 1 : -1].float(), -1)
        tp = p if teacher_prompt_ids is None else teacher_prompt_ids[i]  # the teacher's own view of the prompt
        t_ids = torch.tensor([tp + c], device=next(teacher.parameters()).device)
        t = teacher(input_ids=t_ids).logits[0, len(tp) - 1 : -1]
        t = torch.log_softmax(t.float().to(s.device), -1)
        rev += (s.exp() * (s - t)).sum().item()
        fwd += (t.exp() * (t - s)).sum().item()
        count += len(c)
    n = max(count, 1)
    return {"divergence": rev / n, "reverse_kl": rev / n, "forward_kl": fwd / n, "num_tokens": count}


@torch.no_grad()
def _uld_divergence(
    student, teacher, student_tok, teacher_tok, prompt_ids, completions, teacher_prompts, uld_args
) -> dict[str, float]:
    # lazy: trl.experimental.gold imports vLLM when it is installed (~7 s), and only the cross path needs it
    from trl.experimental.gold.gold_trainer import ULDLoss, build_teacher_inputs_from_texts
    from trl.experimental.utils import encode_with_byte_offsets

    # The pure distance: no cross-entropy term, unit weight; "bayesian" so the logits at t-1 are compared for the
    # token at t (chain rule), and the end-of-turn position counts, so an empty answer still has a distance.
    metric_args = copy.copy(uld_args)
    metric_args.uld_crossentropy_weight, metric_args.uld_distillation_weight = 0.0, 1.0
    metric_args.uld_token_merge_strategy = "bayesian"
    metric_args.uld_skip_student_eos = metric_args.uld_skip_teacher_eos = False
    uld = ULDLoss(metric_args, student_tokenizer=student_tok, teacher_tokenizer=teacher_tok)
    total, count, num_tokens = 0.0, 0, 0
    s_dev, t_dev = next(student.parameters()).device, next(teacher.parameters()).device
    for p, c in zip(prompt_ids, completions, strict=True):
        eos = student_tok.eos_token_id
        text = student_tok.decode(
            [i for i in c if i != eos], skip_special_tokens=False, clean_up_tokenization_spaces=False
        )
        prompt_text = student_tok.decode(p, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        [(c_ids, c_offs)] = encode_with_byte_offsets(student_tok.backend_tokenizer, [text], add_special_tokens=False)
        c_ids, c_offs = list(c_ids) + [eos], list(c_offs) + [(len(text.encode()), len(text.encode()))]
        s_ids = torch.tensor([p + c_ids], device=s_dev)
        s_labels = s_ids.clone()
        s_labels[0, : len(p)] = -100
        s_offs = torch.tensor([[(0, 0)] * len(p) + c_offs])
        t_ids, t_labels, t_mask, t_offs = build_teacher_inputs_from_texts(
            teacher_tok,
            [teacher_prompts.get(prompt_text, prompt_text)],
            [text],
            use_extended_uld=uld_args.use_extended_uld,
        )
        s_logits = student(input_ids=s_ids).logits.float()
        t_logits = teacher(input_ids=t_ids.to(t_dev), attention_mask=t_mask.to(t_dev)).logits.float().to(s_dev)
        loss = uld(s_logits, t_logits, s_labels, t_labels.to(s_dev), s_ids, t_ids.to(s_dev), s_offs, t_offs)
        total += float(loss)
        count += 1
        num_tokens += len(c_ids)
    return {"divergence": total / max(count, 1), "uld_distance": total / max(count, 1), "num_tokens": num_tokens}


def divergence(
    student,
    teacher,
    student_tok,
    teacher_tok,
    prompts: list[list[dict]],
    *,
    mode: str,
    max_new_tokens: int = 64,
    uld_args=None,
    teacher_prompts: dict[str, str] | None = None,
    completions: tuple[list, list] | None = None,
) -> dict[str, float]:
    """Teacher-student divergence on the student's greedy completions of `prompts` (on-policy, as trained).

    same: mean per-token reverse KL(student || teacher) (`divergence`) and forward KL over completion tokens.
    cross: mean ULD distance, the L1 between sorted next-token probability vectors on byte-aligned spans of
    the completion text (TRL's extended ULD alignment), in [0, 2]; the teacher sees its own chat template.
    `uld_args` (cross only): a GOLDConfig with the run's ULD settings. `max_new_tokens`: the greedy budget when
    `completions` are not given.
    """
    if completions is None:
        completions = greedy_completions(student, student_tok, prompts, max_new_tokens)
    prompt_ids, completion_ids = completions
    if mode == "same":
        t_prompts = _teacher_prompt_ids(student_tok, prompt_ids, teacher_prompts) if teacher_prompts else None
        return _same_vocab_divergence(student, teacher, prompt_ids, completion_ids, t_prompts)
    if uld_args is None:
        raise ValueError(
            "mode='cross' needs uld_args: the GOLDConfig (e.g. DistillConfig) with the run's uld_* settings"
        )
    return _uld_divergence(
        student, teacher, student_tok, teacher_tok, prompt_ids, completion_ids, teacher_prompts or {}, uld_args
    )


def _teacher_prompt_ids(tokenizer, prompt_ids: list[list[int]], teacher_prompts: dict[str, str]) -> list[list[int]]:
    """Same tokenizer: each prompt as the teacher sees it (its hint or demonstrations; the student's own if
    unmapped)."""
    out = []
    for p in prompt_ids:
        text = tokenizer.decode(p, skip_special_tokens=False, clean_up_tokenization_spaces=False)
        mapped = teacher_prompts.get(text)
        out.append(p if mapped is None else tokenizer(mapped, add_special_tokens=False)["input_ids"])
    return out


def _decode(tokenizer):
    return lambda ids: tokenizer.decode([i for i in ids if i != tokenizer.eos_token_id], skip_special_tokens=False)


def _checkable(rows: list[dict]) -> bool:
    return bool(rows) and {"answer", "reward"} <= set(rows[0])


def verifiable_accuracy(tokenizer, rows: list[dict], completion_ids: list[list[int]]) -> float:
    """Share of rows answered correctly by their completions, by the one scorer (`align.eval.verification.correct`: the
    verifier the row's `reward` column names scores it >= 1)."""
    texts = [_decode(tokenizer)(c) for c in completion_ids]
    return accuracy([float(c) for c in correct(texts, rows)])["accuracy"]


def teacher_accuracy(
    teacher, tokenizer, rows: list[dict], max_new_tokens: int, teacher_prompts: dict[str, str] | None = None
) -> float:
    """Same tokenizer: the teacher's own verifiable accuracy on the rows, greedy, on the prompts as it sees them
    while it grades (the student's rendering, or its own view from `teacher_prompts`: hint, demonstrations).
    The level on-policy distillation pulls the student towards. Collective: every rank passes all rows (with the whole
    teacher) and gets the accuracy over all of them."""
    prompt_ids = render_prompts(tokenizer, [r["prompt_messages"] for r in rows])
    if teacher_prompts:
        prompt_ids = _teacher_prompt_ids(tokenizer, prompt_ids, teacher_prompts)
    records = generate_and_score(
        model_generate(teacher, tokenizer),
        rows,
        prompt_ids,
        greedy_params(max_new_tokens, [tokenizer.eos_token_id]),
        _decode(tokenizer),
    )
    return summarize(records)["accuracy"]


def evaluate(
    student,
    teacher,
    student_tok,
    teacher_tok,
    rows: list[dict],
    *,
    mode: str,
    max_new_tokens: int,
    uld_args=None,
    teacher_prompts: dict[str, str],
    records: list[dict] | None = None,
    keep: list[dict] | None = None,
) -> dict:
    """Divergence and (when rows carry answer/reward) verifiable accuracy with its item count and the per-row
    `correct` flags, from one greedy pass.

    `records`: the student's greedy answers to these rows already made (`generate_and_score`'s records, from the same
    weights in the same dtype): only the divergence is measured. `keep`: a list that receives the records.

    Collective: every rank passes all the rows (with whole models); each rank answers and measures its share, and every
    rank returns the result over all rows (per-token divergences weighted by tokens, per-prompt ones by prompts)."""
    prompt_ids = render_prompts(student_tok, [r["prompt_messages"] for r in rows])
    checkable = _checkable(rows)
    if records is None:
        records = generate_and_score(
            model_generate(student, student_tok),
            rows,
            prompt_ids,
            greedy_params(max_new_tokens, [student_tok.eos_token_id]),
            _decode(student_tok),
            check=checkable,
        )
    elif len(records) != len(rows):
        raise ValueError(f"evaluate: {len(records)} known answers for {len(rows)} rows")
    if keep is not None:
        keep.extend(records)
    mine = shard(list(range(len(rows))))
    part = (
        divergence(
            student,
            teacher,
            student_tok,
            teacher_tok,
            [rows[i]["prompt_messages"] for i in mine],
            mode=mode,
            uld_args=uld_args,
            teacher_prompts=teacher_prompts,
            completions=([prompt_ids[i] for i in mine], [records[i]["completion_ids"] for i in mine]),
        )
        if mine
        else {}
    )
    parts = [(n, p) for n, p in zip(gather_objects(len(mine)), gather_objects(part)) if n]
    out: dict[str, float] = {}
    for key in parts[0][1] if parts else []:
        if key == "num_tokens":
            out[key] = sum(p[key] for _, p in parts)
            continue
        per_token = mode == "same" and key in ("divergence", "reverse_kl", "forward_kl")
        weights = [p["num_tokens"] if per_token else n for n, p in parts]
        out[key] = sum(w * p[key] for w, (_, p) in zip(weights, parts)) / max(sum(weights), 1)
    if checkable:
        summary = summarize(records)
        out.update(
            accuracy=summary["accuracy"], num_prompts=summary["num"], correct=[int(r["correct"]) for r in records]
        )  # per row: the paired before/after test
    return out
