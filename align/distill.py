"""Distillation: on-policy (same tokenizer) and GOLD cross-tokenizer, behind one `main()`.

Why: for small models, on-policy distillation from a stronger teacher beats RL at a fraction of the cost
(the student samples once, the teacher grades every token), and GOLD lifts the rule that teacher and
student share a tokenizer. We configure TRL's `GOLDTrainer` (trl.experimental.gold, a superset of GKD:
`lmbda` on-policy share, `beta` generalised JSD, cross-tokenizer ULD) rather than forking it. What we add:

- `loss`: reverse_kl (default; on-policy, beta=1), forward_kl (on-policy, beta=0), jsd (GKD with the
  recipe's lmbda/beta), supervised (token-level forward KL on the dataset's completions, lmbda=0) and
  sequence_kd (the teacher samples completions once through the rollout engine; the student then learns
  them token by token, lmbda=0). In the cross-tokenizer path the per-token term is ULD's distance between
  sorted probability vectors (direction-free), so `loss` picks only where the sequences come from.
- student sampling through the shared rollout engine (`align.rollout.get_engine`): TRL's GOLD calls
  `self.vllm_generation.generate(prompt_ids, ...)` / `.sync_weights()` when `use_vllm` is on, so an adapter
  with those two methods (`EngineGeneration`) plugs our engine in without touching TRL's buffer logic.
  `rollout_backend: trl` keeps TRL's own `model.generate` path instead.
- tokenizer checks: `tokenizer_mode: same` with a teacher whose vocabulary differs raises (TRL would silently
  resize the teacher's embeddings); `auto` picks GOLD/ULD when they differ. A teacher tokenizer that cannot
  be loaded raises naming the path.
- mismatched chat templates: in the cross path the teacher scores the prompt rendered with ITS OWN template
  (TRL would feed it the student's rendering); `teacher_strip_mode_flags` drops our "/think" flags for
  teachers that do not know them.
- the teacher's own view (`teacher_few_shot`, `teacher_hint`, `teacher_strip_mode_flags`) in either path: with
  one tokenizer the teacher reads its own prompt followed by the student's completion tokens, and TRL's
  generalized JSD compares the logits for those tokens (`DistillTrainer._same_vocab_teacher_view_loss`).
- teacher placement: `teacher_device` (e.g. cuda:1) and `teacher_quantization` (8bit/4bit, bitsandbytes) on GPUs.
- metrics before/after on held-out prompts: `divergence` (same tokenizer: exact per-token reverse and forward
  KL on the student's greedy completions; cross: ULD sorted-probability L1 on byte-aligned spans, the GOLD
  training distance) and `accuracy` (greedy answers checked by the one scorer, `align.scoring`). Written to
  `<output_dir>/distill_eval.json`.

How to run:
    python scripts/distill.py recipes/tiny_distill.yaml     # same tokenizer: sft_strong -> midtrain
    python scripts/distill.py recipes/tiny_gold.yaml        # cross tokenizer: SmolLM2-135M -> our tiny student
"""

from __future__ import annotations

import json
import logging
import os
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from align.configs import apply_device_defaults
from align.distill_metrics import (  # noqa: F401  (re-exported: the metrics' public home stays align.distill)
    _same_vocab_divergence,
    _uld_divergence,
    divergence,
    evaluate,
    greedy_completions,
    teacher_accuracy,
    verifiable_accuracy,
)
from align.distributed import full_model, gather_shards, is_zero3, shard
from align.rollout import SamplingParams
from align.sampler import ROLLOUT_BACKENDS, Sampler, build_sampler

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # GOLD lives in trl.experimental in TRL 1.x
from trl.experimental.gold import GOLDConfig, GOLDTrainer  # noqa: E402

from align.checkpoint import install, resume_checkpoint
from align.data import get_dataset
from align.models import load_model, load_tokenizer, resolve_model_path
from align.preflight import preflight
from align.stage import save_trained_model
from data_gen.tasks import assistant_text

logger = logging.getLogger(__name__)

# loss -> (beta, lmbda); None keeps the recipe's value (jsd is GKD with the user's own lmbda/beta).
LOSSES: dict[str, tuple[float | None, float | None]] = {
    "reverse_kl": (1.0, 1.0),
    "forward_kl": (0.0, 1.0),
    "jsd": (None, None),
    "supervised": (0.0, 0.0),
    "sequence_kd": (0.0, 0.0),
}
TOKENIZER_MODES = ("auto", "same", "cross")
MODE_FLAGS = ("/no_think", "/think")


@dataclass
class DistillConfig(GOLDConfig):
    """TRL's GOLDConfig (GKD + ULD) + our fields. `teacher_model_name_or_path` may be `builtin:NAME`."""

    loss: str = field(
        default="reverse_kl",
        metadata={"help": f"Distillation objective: one of {list(LOSSES)} (see align/distill.py)."},
    )
    tokenizer_mode: str = field(
        default="auto",
        metadata={"help": "same (shared vocabulary, exact token-level divergence), cross (GOLD/ULD) or auto."},
    )
    rollout_backend: str = field(
        default="hf",
        metadata={"help": f"Student sampling: {list(ROLLOUT_BACKENDS)}; trl = TRL's own model.generate."},
    )
    rollout_kwargs: dict | None = field(
        default=None, metadata={"help": "Extra knobs for align.rollout.get_engine (e.g. {gpu_memory_utilization: 0.3})."}
    )
    teacher_device: str | None = field(
        default=None, metadata={"help": "Put the teacher on its own device (e.g. cuda:1); GPU only."}
    )
    teacher_quantization: str | None = field(
        default=None, metadata={"help": "Load the teacher in 8bit or 4bit (bitsandbytes) to save memory; GPU only."}
    )
    teacher_chat_template_kwargs: dict | None = field(
        default=None, metadata={"help": "Template kwargs for the teacher's own chat template (cross path)."}
    )
    teacher_strip_mode_flags: bool = field(
        default=False,
        metadata={"help": "Remove /think and /no_think from the system turn the teacher sees."},
    )
    teacher_few_shot: int = field(
        default=0,
        metadata={"help": "Context distillation: show the teacher this many solved training conversations "
                  "before each prompt (same system turn, and same `teacher_few_shot_group` value when the data has "
                  "that column), so a teacher that never saw the task format grades the student in it."},
    )
    teacher_few_shot_group: str = field(
        default="family", metadata={"help": "Dataset column whose value the teacher's demonstrations must share."}
    )
    teacher_hint: str | None = field(
        default=None,
        metadata={"help": "Privileged context: a format string over the row's columns, "
                  "e.g. ' (The correct final answer is {answer}.)', appended to the last user turn the teacher sees "
                  "(and to its demonstrations'). The student never sees it."},
    )
    distill_eval: bool = field(
        default=True, metadata={"help": "Measure held-out divergence and verifiable accuracy before and after."}
    )
    distill_eval_max_new_tokens: int = field(
        default=64, metadata={"help": "Greedy completion length for the held-out metrics."}
    )

    def __post_init__(self):
        apply_device_defaults(self)
        if self.loss not in LOSSES:
            raise ValueError(f"loss {self.loss!r} is not known; choose from {list(LOSSES)}")
        if self.tokenizer_mode not in TOKENIZER_MODES:
            raise ValueError(f"tokenizer_mode {self.tokenizer_mode!r}: choose from {list(TOKENIZER_MODES)}")
        if self.rollout_backend not in ROLLOUT_BACKENDS:
            raise ValueError(f"rollout_backend {self.rollout_backend!r}: choose from {list(ROLLOUT_BACKENDS)}")
        if self.teacher_few_shot < 0:
            raise ValueError(f"teacher_few_shot must be >= 0 (demonstrations per teacher prompt), got {self.teacher_few_shot}")
        if self.teacher_quantization not in (None, "8bit", "4bit"):
            raise ValueError(f"teacher_quantization {self.teacher_quantization!r}: choose 8bit, 4bit or leave unset")
        beta, lmbda = LOSSES[self.loss]
        self.beta = self.beta if beta is None else beta
        self.lmbda = self.lmbda if lmbda is None else lmbda
        if self.tokenizer_mode == "cross":
            self.use_uld_loss = True
        super().__post_init__()


# ----------------------------------------------------------------------------- teacher and tokenizers


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
        from transformers import BitsAndBytesConfig

        four = args.teacher_quantization == "4bit"
        kwargs["quantization_config"] = BitsAndBytesConfig(load_in_4bit=four, load_in_8bit=not four)
        kwargs["device_map"] = {"": args.teacher_device or "cuda:0"}
    model = load_model(name_or_path, dtype=dtype, **kwargs)
    model.eval()
    return model


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


def _prompt_part(messages: Sequence[dict]) -> list[dict]:
    last = max((i for i, m in enumerate(messages) if m["role"] == "assistant"), default=len(messages))
    return list(messages[:last])


def _roundtrip(tokenizer, text: str) -> str:
    """The text as the student's token ids decode it (the form TRL hands the teacher)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return tokenizer.decode(ids, skip_special_tokens=False, clean_up_tokenization_spaces=False)


class FewShotPool:
    """Solved training conversations for the teacher's context, by system turn, each with its group (or None)."""

    def __init__(self, conversations: Sequence[Sequence[dict]], groups: Sequence | None, k: int, seed: int = 0,
                 hints: Sequence[str] | None = None):
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
        candidates = [c for g, q, c in self.pool.get(self._system(prompt), [])
                      if (group is None or g == group) and q != question]
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
            raise ValueError(f"teacher_hint {template!r} names column {e.args[0]!r}, which row {i} of the data lacks "
                             f"(it has {sorted(row)}); name one of those columns or unset teacher_hint") from None
        except (IndexError, ValueError, AttributeError) as e:
            raise ValueError(f"teacher_hint {template!r} is not a usable format string ({e}); write columns by name "
                             "in braces, e.g. ' (The correct final answer is {answer}.)'") from None
    return out


def _teacher_view(prompt: Sequence[dict], args: DistillConfig, pool: FewShotPool | None, group=None,
                  hint: str | None = None) -> list[dict]:
    """The messages the teacher sees for a prompt: mode flags stripped if asked, the pool's demonstrations first,
    the hint (privileged context) after the question."""
    shown = teacher_messages(prompt, args.teacher_strip_mode_flags)
    demos = pool.demos(prompt, group) if pool is not None else []
    question = shown[-1] if not hint else {**shown[-1], "content": shown[-1]["content"] + hint}
    return shown[:-1] + demos + [question]


def teacher_prompt_map(conversations, student_tok, teacher_tok, args: DistillConfig,
                       pool: FewShotPool | None = None, groups: Sequence | None = None,
                       hints: Sequence[str] | None = None) -> dict[str, str]:
    """Student-rendered prompt text -> the same prompt rendered with the teacher's own chat template.

    With a `pool` (teacher_few_shot > 0) the teacher's rendering carries solved demonstrations first; with
    `hints` (teacher_hint) each question carries its own."""
    out: dict[str, str] = {}
    kwargs = dict(args.teacher_chat_template_kwargs or {})
    for i, messages in enumerate(conversations):
        prompt = _prompt_part(messages)
        student_text = student_tok.apply_chat_template(prompt, add_generation_prompt=True, tokenize=False)
        shown = _teacher_view(prompt, args, pool, groups[i] if groups is not None else None,
                              hints[i] if hints is not None else None)
        teacher_text = teacher_tok.apply_chat_template(shown, add_generation_prompt=True, tokenize=False, **kwargs)
        out[_roundtrip(student_tok, student_text)] = teacher_text
    return out


def _right_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


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


# ----------------------------------------------------------------------------- rollout engine adapter


class EngineGeneration:
    """What GOLD calls on `self.vllm_generation` (generate, sync_weights), served by our sampler (align.sampler):
    whole weights under ZeRO-3, weights pushed to an engine with its own copy, sampling seeded per rank."""

    def __init__(self, sampler: Sampler, trainer, args: DistillConfig, stop_token_ids: list[int]):
        self.sampler, self.trainer, self.stop = sampler, trainer, list(stop_token_ids)
        self.params = dict(temperature=args.temperature, top_p=args.top_p, top_k=max(args.top_k or 0, 0),
                           max_new_tokens=args.max_completion_length, stop_token_ids=self.stop, logprobs=False)

    @property
    def num_calls(self) -> int:
        return self.sampler.num_calls

    @property
    def num_syncs(self) -> int:
        return self.sampler.num_pushes

    def sync_weights(self) -> None:
        self.sampler.sync(self.trainer.model_wrapped, self.trainer.state.global_step)

    def generate(self, prompts: list[list[int]], images=None, num_generations: int = 1, profiler=None):
        # GOLD repeats each prompt num_generations times in the batch: sample n per unique prompt
        unique = [list(p) for p in prompts[::num_generations]]
        params = SamplingParams(n=num_generations, seed=self.sampler.next_seed(), **self.params)
        groups = self.sampler.generate(self.trainer.model_wrapped, unique, params)
        completions = []
        for group in groups:
            for r in group:
                ids = list(r.completion_ids)
                # a stopped completion ends with its stop token, so the student learns to stop
                if getattr(r, "finish_reason", None) == "stop" and (not ids or ids[-1] not in self.stop):
                    ids.append(self.stop[0])
                completions.append(ids or [self.stop[0]])
        assert len(completions) == len(prompts), (len(completions), len(prompts))
        return prompts, completions, None, None


# ----------------------------------------------------------------------------- trainer


class DistillTrainer(GOLDTrainer):
    """GOLDTrainer + our rollout engine for student sampling + the teacher's own chat template (cross path)."""

    def __init__(self, *args, engine=None, sampler: Sampler | None = None, teacher_prompts: dict[str, str] | None = None,
                 teacher_device: str | None = None, **kwargs):
        super().__init__(*args, **kwargs)
        self.teacher_prompts = teacher_prompts or {}
        self.teacher_prompt_misses = 0
        self.sampler = None
        if sampler is None and engine is not None:
            sampler = Sampler(engine, self.accelerator, seed=self.args.seed)
        self.attach_sampler(sampler)
        if teacher_device:
            teacher = self.accelerator.unwrap_model(self.teacher_model).to(teacher_device)
            self.teacher_model = TeacherOnDevice(teacher, teacher_device, self.accelerator.device)

    def attach_sampler(self, sampler: Sampler | None) -> None:
        """Student sampling through our sampler: GOLD calls it as its `vllm_generation` (None: TRL's generate)."""
        self.sampler = sampler
        if sampler is not None:
            stop = [i for i in {self._tokenizer.eos_token_id, self.pad_token_id} if i is not None]
            self.vllm_generation = EngineGeneration(sampler, self, self.args, stop)
            self.use_vllm, self.vllm_sync_frequency, self._last_vllm_sync_step = True, 1, -1

    def sync_engine(self) -> None:
        """After a resume (align.checkpoint): the engine gets the restored weights before the first step."""
        if self.sampler is not None:
            self.sampler.sync(self.model_wrapped, self.state.global_step)

    def _teacher_prompt_text(self, text: str) -> str:
        mapped = self.teacher_prompts.get(text)
        if mapped is None:
            self.teacher_prompt_misses += 1
            if self.teacher_prompt_misses == 1:
                logger.warning("a prompt has no teacher rendering; the teacher sees the student's: %r", text)
        return text if mapped is None else mapped

    def _same_vocab_teacher_view_loss(self, model, inputs, num_items_in_batch=None):
        """Same tokenizer, teacher with its own context (teacher_hint / teacher_few_shot): the student's completion
        tokens follow the teacher's prompt in the teacher's forward pass; its logits for those tokens are put at the
        student's completion positions and TRL's generalized JSD compares the two there."""
        tok = self.processing_class
        ids, mask, labels = inputs["input_ids"], inputs["attention_mask"], inputs["labels"]
        outputs_student = model(input_ids=ids, attention_mask=mask, use_cache=False)
        rows, spans = [], []
        for b in range(ids.shape[0]):
            done = (labels[b] != -100).nonzero().flatten().tolist()
            first = done[0] if done else ids.shape[1]
            prompt = [t for t, m in zip(ids[b, :first].tolist(), mask[b, :first].tolist()) if m]
            text = tok.decode(prompt, skip_special_tokens=False, clean_up_tokenization_spaces=False)
            t_prompt = tok(self._teacher_prompt_text(text), add_special_tokens=False)["input_ids"]
            rows.append(t_prompt + ids[b, done].tolist())
            spans.append((done, len(t_prompt)))
        t_ids, t_mask = _right_pad(rows, self.pad_token_id or 0)
        self.teacher_model.eval()
        with torch.no_grad():
            t_logits = self.teacher_model(input_ids=t_ids.to(ids.device), attention_mask=t_mask.to(ids.device)).logits
        teacher_logits = torch.zeros_like(outputs_student.logits)
        for b, (done, start) in enumerate(spans):
            if done:  # the logits before each completion token predict it, in both sequences
                pos = torch.tensor(done, device=ids.device)
                teacher_logits[b, pos - 1] = t_logits[b, start - 1 : start - 1 + len(done)].to(teacher_logits.dtype)
        loss = self.generalized_jsd_loss(
            student_logits=outputs_student.logits[:, :-1, :], teacher_logits=teacher_logits[:, :-1, :],
            labels=labels[:, 1:], beta=self.beta, temperature=self.temperature, num_items_in_batch=num_items_in_batch,
        )
        return loss, outputs_student

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if not self.use_uld_loss and self.teacher_prompts:
            loss, outputs = self._same_vocab_teacher_view_loss(model, inputs, num_items_in_batch)
            return (loss, outputs) if return_outputs else loss
        if self.use_uld_loss and self.teacher_prompts and "original_prompt_text" in inputs:
            inputs = {**inputs, "original_prompt_text": [self._teacher_prompt_text(t) for t in inputs["original_prompt_text"]]}
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


# ----------------------------------------------------------------------------- data


def to_conversations(dataset, name: str = "train"):
    """{messages} rows (last turn assistant) for GOLD; task rows' prompt_messages + assistant text also work."""
    cols = set(dataset.column_names)
    if "messages" in cols:
        return dataset.select_columns(["messages"])
    if {"prompt_messages", "answer"} <= cols:
        def conv(row):
            mode = "no_think" if "/no_think" in row["prompt_messages"][0]["content"] else "think"
            text = assistant_text({**row, "think": row.get("think", "")}, mode)
            return {"messages": row["prompt_messages"] + [{"role": "assistant", "content": text}]}

        return dataset.map(conv, remove_columns=sorted(cols))
    raise ValueError(
        f"{name} dataset for distillation needs a 'messages' column (a conversation ending with an assistant turn) "
        f"or 'prompt_messages' + 'answer'; it has {sorted(cols)}"
    )


def teacher_samples(teacher, teacher_tok, conversations: list[list[dict]], args: DistillConfig,
                    pool: FewShotPool | None = None, groups: Sequence | None = None,
                    hints: Sequence[str] | None = None) -> list[str]:
    """sequence_kd: the teacher's greedy answer to each prompt (its own template, after the pool's demonstrations,
    with its hint)."""
    prompts = [_teacher_view(_prompt_part(m), args, pool, groups[i] if groups is not None else None,
                             hints[i] if hints is not None else None)
               for i, m in enumerate(conversations)]
    _, completion_ids = greedy_completions(teacher, teacher_tok, prompts, args.max_completion_length,
                                           template_kwargs=args.teacher_chat_template_kwargs)
    eos = teacher_tok.eos_token_id
    return [teacher_tok.decode([i for i in c if i != eos], skip_special_tokens=True) for c in completion_ids]


# ----------------------------------------------------------------------------- main


def held_out_metrics(trainer, student_tok, teacher_tok, rows: list[dict], *, mode: str, args: DistillConfig,
                     teacher_prompts: dict[str, str], with_teacher_accuracy: bool = False) -> dict:
    """`distill_metrics.evaluate` (and the teacher's own accuracy) on whole weights: each rank answers and measures
    its share of the rows and every rank gets the result over all of them. Collective."""
    acc = trainer.accelerator
    with full_model(trainer.model_wrapped, acc) as student, full_model(trainer.teacher_model, acc) as teacher:
        out = evaluate(student, teacher, student_tok, teacher_tok, rows, mode=mode,
                       max_new_tokens=args.distill_eval_max_new_tokens, uld_args=args, teacher_prompts=teacher_prompts)
        if with_teacher_accuracy and "accuracy" in out:
            out["teacher_accuracy"] = teacher_accuracy(teacher, student_tok, rows, args.distill_eval_max_new_tokens,
                                                       teacher_prompts=teacher_prompts)
    return out


def main(script_args, training_args: DistillConfig, model_args) -> dict:
    """Load student and teacher, measure, distil, save, measure again; returns the before/after metrics."""
    from accelerate.utils import set_seed as set_rank_seed
    from transformers import set_seed

    args = training_args
    if not args.teacher_model_name_or_path:
        raise ValueError("teacher_model_name_or_path is required (a local model dir, hub id or builtin:NAME)")
    if is_zero3() and (args.teacher_device or args.teacher_quantization):
        raise ValueError("teacher_device / teacher_quantization place the teacher on one device, which DeepSpeed "
                         "ZeRO-3 (it shards the teacher like the student) cannot do: drop them, or launch with "
                         "recipes/accelerate_configs/zero2.yaml or ddp.yaml")
    set_seed(args.seed)  # the same on every rank while the models (and a LoRA adapter) are built
    student_tok = load_tokenizer(model_args.model_name_or_path)
    teacher_tok = load_teacher_tokenizer(args.teacher_tokenizer_name_or_path or args.teacher_model_name_or_path)
    student = load_model(model_args.model_name_or_path, dtype=model_args.dtype or "auto")
    teacher = load_teacher(args.teacher_model_name_or_path, args, dtype=model_args.dtype or "auto")
    mode = resolve_tokenizer_mode(args.tokenizer_mode, student_tok, teacher_tok, student, teacher)
    args.use_uld_loss = mode == "cross"
    if mode == "cross" and not args.teacher_tokenizer_name_or_path:
        args.teacher_tokenizer_name_or_path = resolve_model_path(args.teacher_model_name_or_path)
    logger.info("distillation: loss=%s mode=%s beta=%s lmbda=%s backend=%s", args.loss, mode, args.beta, args.lmbda,
                args.rollout_backend)

    dd = get_dataset(script_args)
    group_col = args.teacher_few_shot_group
    train_groups = dd["train"][group_col] if group_col in dd["train"].column_names else None
    train_hints = teacher_hints(dd["train"].to_list(), args.teacher_hint) if args.teacher_hint else None
    train = to_conversations(dd["train"])
    pool = None
    if args.teacher_few_shot:
        pool = FewShotPool(train["messages"], train_groups, args.teacher_few_shot, args.seed, train_hints)
    if args.loss == "sequence_kd":  # each rank answers its share of the prompts with the whole teacher
        convs = list(train["messages"])
        idx = shard(range(len(convs)))
        with full_model(teacher, None) as whole:
            mine = teacher_samples(whole, teacher_tok, [convs[i] for i in idx], args, pool,
                                   [train_groups[i] for i in idx] if train_groups is not None else None,
                                   [train_hints[i] for i in idx] if train_hints is not None else None)
        answers = gather_shards(mine)
        train = train.map(lambda row, i: {"messages": _prompt_part(row["messages"]) + [
            {"role": "assistant", "content": answers[i]}]}, with_indices=True)
    eval_rows = []
    if "test" in dd and "prompt_messages" in dd["test"].column_names:
        eval_rows = dd["test"].select(range(min(script_args.eval_num_prompts, len(dd["test"])))).to_list()
    convs = list(train["messages"]) + [r["prompt_messages"] for r in eval_rows]
    # a row without the group column gets demonstrations from any group (same system turn)
    groups = None if train_groups is None else list(train_groups) + [r.get(group_col) for r in eval_rows]
    hints = None if train_hints is None else train_hints + teacher_hints(eval_rows, args.teacher_hint)
    if args.teacher_few_shot and train_groups is None:
        logger.info("teacher_few_shot: the data has no %r column; demonstrations match the system turn only", group_col)
    # cross: the teacher always reads its own template; same: the teacher reads its own view only when it has one
    # (demonstrations, a hint, stripped flags), else exactly the student's tokens (TRL's GKD path, untouched).
    teacher_view = bool(args.teacher_few_shot or args.teacher_hint or args.teacher_strip_mode_flags)
    teacher_prompts = (teacher_prompt_map(convs, student_tok, teacher_tok, args, pool, groups, hints)
                       if mode == "cross" or teacher_view else {})

    trainer = DistillTrainer(
        model=student, teacher_model=teacher, args=args, train_dataset=train, processing_class=student_tok,
        teacher_prompts=teacher_prompts, teacher_device=args.teacher_device,
    )
    set_rank_seed(args.seed, device_specific=True)  # dropout and sampling: a stream of its own per rank
    trainer.attach_sampler(build_sampler(
        args.rollout_backend, args.rollout_kwargs, trainer.accelerator.unwrap_model(trainer.model),
        resolve_model_path(model_args.model_name_or_path), student_tok, trainer.accelerator, seed=args.seed,
        max_model_len=args.max_length))
    preflight(trainer, script_args, stage="distill", raw_train=train)
    install(trainer, script_args)  # atomic checkpoints, non-finite guard, engine resync after a resume

    metrics: dict = {"loss": args.loss, "tokenizer_mode": mode, "world_size": trainer.accelerator.num_processes}
    measure = args.distill_eval and script_args.eval_after and bool(eval_rows)
    if measure:
        before = held_out_metrics(trainer, student_tok, teacher_tok, eval_rows, mode=mode, args=args,
                                  teacher_prompts=teacher_prompts, with_teacher_accuracy=mode == "same")
        if "teacher_accuracy" in before and "accuracy" in before:
            metrics["teacher_accuracy"] = before["teacher_accuracy"]
            metrics["num_prompts"] = before["num_prompts"]  # the teacher answered the same held-out rows
            logger.info("held-out teacher accuracy %.3f (student before %.3f)", metrics["teacher_accuracy"],
                        before["accuracy"])
        before.pop("teacher_accuracy", None)
        metrics["before"] = before
        logger.info("held-out before: %s", metrics["before"])
    trainer.train(resume_from_checkpoint=resume_checkpoint(args))
    metrics["teacher_prompt_misses"] = trainer.teacher_prompt_misses
    metrics["engine_calls"] = trainer.sampler.num_calls if trainer.sampler is not None else 0
    save_trained_model(trainer, student_tok, args.output_dir, merge_lora=True)
    if measure:
        metrics["after"] = held_out_metrics(trainer, student_tok, teacher_tok, eval_rows, mode=mode, args=args,
                                            teacher_prompts=teacher_prompts)
        logger.info("held-out after: %s", metrics["after"])
        b, a = metrics["before"], metrics["after"]
        logger.info("distill: held-out divergence %.4f -> %.4f, accuracy %.3f -> %.3f", b["divergence"],
                    a["divergence"], b.get("accuracy", float("nan")), a.get("accuracy", float("nan")))
    if trainer.sampler is not None:
        trainer.sampler.close(trainer.model_wrapped)
    if trainer.accelerator.is_main_process:
        Path(args.output_dir).mkdir(parents=True, exist_ok=True)
        (Path(args.output_dir) / "distill_eval.json").write_text(json.dumps(metrics, indent=2))
    return metrics
