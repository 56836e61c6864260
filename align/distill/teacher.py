"""Distillation's teacher side: its tokenizer and placement, the tokenizer mode, and what the teacher reads.

Why a module of its own: the teacher sees each prompt its own way (its chat template in the cross-tokenizer path,
mode flags stripped, solved demonstrations first with `teacher_few_shot`, privileged context with `teacher_hint`),
and with `loss: sequence_kd` it writes the answers the student learns. align/distill/trainer.py builds the trainer
around what this module returns.

    teacher_tok = load_teacher_tokenizer(args.teacher_model_name_or_path)
    mode = resolve_tokenizer_mode(args.tokenizer_mode, student_tok, teacher_tok, student, teacher)
    teacher_prompts = teacher_prompt_map(conversations, student_tok, teacher_tok, args, pool, groups, hints)
"""

from __future__ import annotations

import random
import re
from collections.abc import Sequence

import torch
from transformers import BitsAndBytesConfig

from align.distill.config import DistillConfig
from align.distill.metrics import _decode, greedy_completions
from align.modeling.loading import load_model, load_tokenizer, local_device

MODE_FLAGS = ("/no_think", "/think")


def load_teacher_tokenizer(name_or_path: str):
    """The teacher's tokenizer, or a ValueError that names the path and what to do."""
    try:
        return load_tokenizer(name_or_path)
    except (OSError, ValueError, FileNotFoundError, TypeError) as e:
        raise ValueError(
            f"cannot load the teacher tokenizer from teacher_model_name_or_path={name_or_path!r} "
            f"({type(e).__name__}: {' '.join(str(e).split())[:200]}); point it at a model dir that has "
            "tokenizer files, or set teacher_tokenizer_name_or_path"
        ) from e


def load_teacher(name_or_path: str, args: DistillConfig, dtype: str | torch.dtype = "auto"):
    # checked here, not in __post_init__, so GPU recipes still parse (and are tested) on a CPU machine
    if (args.teacher_quantization or (args.teacher_device or "").startswith("cuda")) and not torch.cuda.is_available():
        raise ValueError(
            "teacher_device/teacher_quantization need a CUDA GPU (this machine has none): remove them from the recipe"
        )
    kwargs = {}
    if args.teacher_quantization:
        four = args.teacher_quantization == "4bit"
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=four, load_in_8bit=not four)
        # this rank's own GPU unless the recipe names one (one process: a second GPU for the teacher)
        kwargs["device_map"] = {"": args.teacher_device or local_device()}
    model = load_model(name_or_path, dtype=dtype, **kwargs)
    model.eval()
    if not args.teacher_quantization and not any(hasattr(p, "ds_id") for p in model.parameters()):
        # GPU: this rank's GPU (or teacher_device) now, not when a trainer wraps it: sequence_kd and
        # rejection_sampling sample the teacher's answers before that, on the CPU until this (ZeRO-3 partitions
        # are placed by DeepSpeed)
        model.to(args.teacher_device or local_device())
    if model.dtype != torch.float32 and not args.teacher_quantization:
        # a half-precision teacher: its logits reach the divergences in float32, like the student's
        model.register_forward_hook(_float_logits)
    return model


def _float_logits(module, inputs, output):
    if getattr(output, "logits", None) is not None and output.logits.dtype != torch.float32:
        output.logits = output.logits.float()
    return output


def same_vocabulary(student_tok, teacher_tok) -> bool:
    return student_tok.get_vocab() == teacher_tok.get_vocab()


def resolve_tokenizer_mode(mode: str, student_tok, teacher_tok, student, teacher) -> str:
    """'same' or 'cross'. A same-tokenizer run with different vocabularies is a ValueError suggesting GOLD."""
    s_size, t_size = student.config.get_text_config().vocab_size, teacher.config.get_text_config().vocab_size
    shared = same_vocabulary(student_tok, teacher_tok)
    if mode == "cross":
        return "cross"
    if mode == "same" and not (shared and s_size == t_size):
        what = (
            f"the tokenizers differ ({len(student_tok)} vs {len(teacher_tok)} tokens)"
            if not shared
            else f"the models' vocab_size differ ({s_size} vs {t_size})"
        )
        raise ValueError(
            f"tokenizer_mode=same but student and teacher vocabularies do not match: {what}. Token-level "
            "distillation needs one vocabulary; use the GOLD cross-tokenizer path instead: tokenizer_mode: cross "
            "(or auto)"
        )
    return "same" if shared and s_size == t_size else "cross"


def teacher_messages(messages: Sequence[dict], strip_mode_flags: bool) -> list[dict]:
    out = []
    for m in messages:
        if strip_mode_flags and m["role"] == "system":
            content = m["content"]
            for flag in MODE_FLAGS:
                content = content.replace(flag, "")
            if not content.strip():
                continue
            m = {**m, "content": content.strip()}
        out.append(dict(m))
    return out


def thinking_view(messages: Sequence[dict]) -> list[dict]:
    r"""The prompt with its system turns' ``/no_think`` flag swapped for ``/think`` (`teacher_thinks`).

    >>> thinking_view([{"role": "system", "content": "Be brief. /no_think"}, {"role": "user", "content": "2+2?"}])
    [{'role': 'system', 'content': 'Be brief. /think'}, {'role': 'user', 'content': '2+2?'}]
    """
    return [
        {**m, "content": re.sub(r"(?<!\S)/no_think(?!\S)", "/think", m["content"])}
        if m["role"] == "system"
        else dict(m)
        for m in messages
    ]


def _prompt_part(messages: Sequence[dict]) -> list[dict]:
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
    return list(messages[:last])


def _roundtrip(tokenizer, text: str) -> str:
    """The text as the student's token ids decode it (the form TRL hands the teacher)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


class FewShotPool:
    """Solved training conversations for the teacher's context, by system turn, each with its group (or None)."""

    def __init__(
        self,
        conversations: Sequence[Sequence[dict]],
        groups: Sequence | None,
        k: int,
        seed: int = 0,
        hints: Sequence[str] | None = None,
    ):
        self.k, self.seed = k, seed
        self.pool: dict[str, list[tuple[object, str, list[dict]]]] = {}
        for i, messages in enumerate(conversations):
            group = groups[i] if groups is not None else None
            messages = list(messages)
            question = _prompt_part(messages)[-1]["content"]
            if hints is not None:  # the hint goes on the demonstration's question, as on the prompt's
                q = max(j for j, m in enumerate(messages) if m["role"] == "user")
                messages[q] = {**messages[q], "content": messages[q]["content"] + hints[i]}
            self.pool.setdefault(self._system(messages), []).append((group, question, messages))

    @staticmethod
    def _system(messages: Sequence[dict]) -> str:
        return next((m["content"] for m in messages if m["role"] == "system"), "")

    def demos(self, prompt: Sequence[dict], group=None) -> list[dict]:
        """k user/assistant pairs with the prompt's system turn (and its group, when given), never its own."""
        if not self.k:
            return []
        question = prompt[-1]["content"]
        candidates = [
            c for g, q, c in self.pool.get(self._system(prompt), []) if (group is None or g == group) and q != question
        ]
        rng = random.Random(f"{self.seed}:{question}")  # the same demonstrations for a prompt every time it comes
        turns: list[dict] = []
        for c in rng.sample(candidates, min(self.k, len(candidates))):
            turns += [dict(m) for m in c if m["role"] != "system"]
        return turns


def teacher_hints(rows: Sequence[dict], template: str | None) -> list[str] | None:
    """`teacher_hint` filled from each row's columns (None when no hint is configured)."""
    if not template:
        return None
    out = []
    for i, row in enumerate(rows):
        try:
            out.append(template.format(**row))
        except KeyError as e:
            raise ValueError(
                f"teacher_hint {template!r} names column {e.args[0]!r}, which row {i} of the data lacks "
                f"(it has {sorted(row)}); name one of those columns or unset teacher_hint"
            ) from None
        except (IndexError, ValueError, AttributeError) as e:
            raise ValueError(
                f"teacher_hint {template!r} is not a usable format string ({e}); write columns by name "
                "in braces, e.g. ' (The correct final answer is {answer}.)'"
            ) from None
    return out


def _teacher_view(
    prompt: Sequence[dict], args: DistillConfig, pool: FewShotPool | None, group=None, hint: str | None = None
) -> list[dict]:
    """The messages the teacher sees for a prompt: mode flags stripped if asked, the pool's demonstrations first,
    the hint (privileged context) after the question."""
    shown = teacher_messages(prompt, args.teacher_strip_mode_flags)
    demos = pool.demos(prompt, group) if pool is not None else []
    question = shown[-1] if not hint else {**shown[-1], "content": shown[-1]["content"] + hint}
    return shown[:-1] + demos + [question]


def teacher_prompt_map(
    conversations,
    student_tok,
    teacher_tok,
    args: DistillConfig,
    pool: FewShotPool | None = None,
    groups: Sequence | None = None,
    hints: Sequence[str] | None = None,
) -> dict[str, str]:
    """Student-rendered prompt text -> the same prompt rendered with the teacher's own chat template.

    With a `pool` (teacher_few_shot > 0) the teacher's rendering carries solved demonstrations first; with
    `hints` (teacher_hint) each question carries its own."""
    out: dict[str, str] = {}
    kwargs = dict(args.teacher_chat_template_kwargs or {})
    for i, messages in enumerate(conversations):
        prompt = _prompt_part(messages)
        student_text = student_tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        shown = _teacher_view(
            prompt, args, pool, groups[i] if groups is not None else None, hints[i] if hints is not None else None
        )
        teacher_text = teacher_tok.apply_chat_template(shown, add_generation_prompt=True, tokenize=False, **kwargs)
        out[_roundtrip(student_tok, student_text)] = teacher_text
    return out


class TeacherOnDevice(torch.nn.Module):
    """The teacher on its own device: inputs go there, logits come back to the student's device."""

    is_gradient_checkpointing = False

    def __init__(self, teacher, device: str, home: torch.device):
        super().__init__()
        self.teacher, self.device_, self.home = teacher, torch.device(device), home

    def forward(self, input_ids, attention_mask=None, **kwargs):
        move = {k: v.to(self.device_) if torch.is_tensor(v) else v for k, v in kwargs.items()}
        mask = attention_mask.to(self.device_) if attention_mask is not None else None
        out = self.teacher(input_ids=input_ids.to(self.device_), attention_mask=mask, **move)
        out.logits = out.logits.to(self.home)
        return out


def teacher_samples(
    teacher,
    teacher_tok,
    conversations: list[list[dict]],
    args: DistillConfig,
    pool: FewShotPool | None = None,
    groups: Sequence | None = None,
    hints: Sequence[str] | None = None,
) -> list[str]:
    """sequence_kd: the teacher's greedy answer to each prompt (its own template, after the pool's demonstrations,
    with its hint)."""
    prompts = [
        _teacher_view(
            _prompt_part(m),
            args,
            pool,
            groups[i] if groups is not None else None,
            hints[i] if hints is not None else None,
        )
        for i, m in enumerate(conversations)
    ]
    _, completion_ids = greedy_completions(
        teacher, teacher_tok, prompts, args.max_completion_length, template_kwargs=args.teacher_chat_template_kwargs
    )
    # as generated, eos dropped: a tokenizer that makes <think> a special token keeps the think block
    return [_decode(teacher_tok)(c) for c in completion_ids]
