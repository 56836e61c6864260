"""Distillation: on-policy (same tokenizer) and GOLD cross-tokenizer, behind one `main()`.

Why: for small models, on-policy distillation from a stronger teacher beats RL at a fraction of the cost
(the student samples once, the teacher grades every token), and GOLD lifts the rule that teacher and
student share a tokenizer. We configure TRL's `GOLDTrainer` (trl.experimental.gold, a superset of GKD:
`lmbda` on-policy share, `beta` generalised JSD, cross-tokenizer ULD) rather than forking it. What we add:

- `loss`: reverse_kl (default; on-policy, beta=1), forward_kl (on-policy, beta=0), jsd (GKD with the
  recipe's lmbda/beta), supervised (token-level forward KL on the dataset's completions, lmbda=0) and
  sequence_kd (the teacher samples completions once through the rollout engine; the student then learns
  them token by token, lmbda=0) and rejection_sampling (the teacher samples `teacher_best_of` answers per prompt,
  the row's verifier keeps one, the student learns it with the plain next-token loss: Kim & Rush's sequence-level
  KD with a verifier, for a teacher whose lead is more samples rather than other weights; soft targets from such a
  teacher would hand back the same distribution it sampled from). In the cross-tokenizer path the per-token term
  is ULD's distance between sorted probability vectors (direction-free), so `loss` picks only where the sequences
  come from.
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
  training distance) and `accuracy` (greedy answers checked by the one scorer, `align.eval.statistics`), with a paired
  McNemar test of the accuracy on those same prompts (`paired`). Written to `<output_dir>/distill_eval.json`.

The config is align/distill/config.py, the teacher's side (its tokenizer, placement and view of each prompt)
align/distill/teacher.py, the rejection-sampling teacher align/distill/rejection.py, the held-out metrics
align/distill/metrics.py; this module holds the trainer, the engine adapter and `main`, which takes the shared steps
of align/stage.py in their order.

How to run:
    python scripts/distill.py recipes/tiny/distill.yaml     # same tokenizer: sft_strong -> pretrain_reasoning
    python scripts/distill.py recipes/tiny/gold.yaml        # cross tokenizer: SmolLM2-135M -> our tiny student
"""

from __future__ import annotations

import json
import logging
import os

import torch
from accelerate.utils import set_seed as set_rank_seed

from align import stage
from align.distill.config import DistillConfig
from align.distill.held_out import held_out_metrics
from align.distill.loss import check_plain_head, chunked_jsd, hidden_states_as_logits
from align.distill.rejection import add_replay_conversations, by_mode, teacher_best_of_accuracy, verified_answers
from align.distill.teacher import (
    FewShotPool,
    TeacherOnDevice,
    _prompt_part,
    load_teacher,
    load_teacher_tokenizer,
    resolve_tokenizer_mode,
    teacher_hints,
    teacher_prompt_map,
    teacher_samples,
)
from align.eval.outcomes import item_id
from align.eval.statistics import paired_change
from align.modeling.loading import resolve_model_path
from align.rollout import SamplingParams
from align.rollout.sampler import Sampler, build_sampler
from align.runtime.distributed import full_model, gather_shards, is_zero3, launched_world_size, shard
from align.tools.distill import (
    add_tools_to_conversations,
    check_tool_distillation,
    mask_tool_labels,
    tool_completions,
)
from align.tools.grpo import build_tool_loop
from data_gen.tasks import assistant_text

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # GOLD lives in trl.experimental in TRL 1.x
from trl.experimental.gold import GOLDTrainer  # noqa: E402

logger = logging.getLogger(__name__)

# TRL's private names this module overrides or reads, each with the parameters we rely on (checked against the
# installed TRL by tests/test_trl_private_names.py: an upgrade that renames or reshapes one fails there, in one place).
TRL_PRIVATE_METHODS = {
    # after TRL buffers on-policy completions: mask the tool tokens of tool-use rollouts out of the loss
    "_process_completions_to_buffer": "(self, slices, on_policy_indices, local_slice_indices, completion_ids, "
    "prompt_ids_list, prompts_text, max_completion_length)",
}
TRL_PRIVATE_ATTRIBUTES = (
    "_tokenizer",  # the student tokenizer TRL resolved (its eos id stops sampling)
    "_buffered_inputs",  # the buffered on-policy batch, whose labels the tool masks edit
    # GOLD samples through `self.vllm_generation` when `use_vllm`; our sampler stands in for it (`attach_sampler`),
    # synced every step: `_last_vllm_sync_step` is the step TRL last synced at
    "_last_vllm_sync_step",
    "vllm_generation",
    "vllm_sync_frequency",
)
# TRL's public flags we set to choose its code paths, and why (checked the same way: TRL must still read them).
TRL_FLAGS = {"use_vllm": "GOLD samples the student through `vllm_generation`, which our sampler stands in for"}


# ----------------------------------------------------------------------------- rollout engine adapter


class EngineGeneration:
    """What GOLD calls on `self.vllm_generation` (generate, sync_weights), served by our sampler
    (align.rollout.sampler): whole weights under ZeRO-3, weights pushed to an engine with its own copy, sampling seeded
    per rank."""

    def __init__(self, sampler: Sampler, trainer, args: DistillConfig, stop_token_ids: list[int]):
        self.sampler, self.trainer, self.stop = sampler, trainer, list(stop_token_ids)
        self.params = dict(
            temperature=args.temperature,
            top_p=args.top_p,
            top_k=max(args.top_k or 0, 0),
            max_new_tokens=args.max_completion_length,
            stop_token_ids=self.stop,
            logprobs=False,
        )

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
        loop = getattr(self.trainer, "tool_loop", None)
        if loop is not None:  # align/tools/distill.py: whole trajectories; the trainer masks the tool tokens' labels
            completions, self.trainer._tool_masks = tool_completions(
                loop, lambda ids, p: self.sampler.generate(self.trainer.model_wrapped, ids, p), unique, params
            )
            return prompts, completions, None, None
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


def _right_pad(rows: list[list[int]], pad_id: int) -> tuple[torch.Tensor, torch.Tensor]:
    width = max(len(r) for r in rows)
    ids = torch.tensor([r + [pad_id] * (width - len(r)) for r in rows])
    mask = torch.tensor([[1] * len(r) + [0] * (width - len(r)) for r in rows])
    return ids, mask


class DistillTrainer(GOLDTrainer):
    """GOLDTrainer + our rollout engine for student sampling + the teacher's own chat template (cross path)."""

    def __init__(
        self,
        *args,
        engine=None,
        sampler: Sampler | None = None,
        teacher_prompts: dict[str, str] | None = None,
        teacher_device: str | None = None,
        **kwargs,
    ):
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
        if self.args.loss_chunk_tokens:
            if self.use_uld_loss:
                raise ValueError(
                    "loss_chunk_tokens is for the same-tokenizer path; this teacher's tokenizer differs "
                    "(GOLD's ULD loss needs whole rows): set loss_chunk_tokens: 0"
                )
            for m in (self.model, self.teacher_model):
                check_plain_head(self.accelerator.unwrap_model(m))

    def attach_sampler(self, sampler: Sampler | None) -> None:
        """Student sampling through our sampler: GOLD calls it as its `vllm_generation` (None: TRL's generate)."""
        self.sampler = sampler
        if sampler is not None:
            stop = [i for i in {self._tokenizer.eos_token_id, self.pad_token_id} if i is not None]
            self.vllm_generation = EngineGeneration(sampler, self, self.args, stop)
            self.use_vllm, self.vllm_sync_frequency, self._last_vllm_sync_step = True, 1, -1

    tool_loop = None  # align.tools.ToolLoop when the recipe names tools (main)
    _tool_masks: list[list[int]] | None = None

    def _process_completions_to_buffer(
        self,
        slices,
        on_policy_indices,
        local_slice_indices,
        completion_ids,
        prompt_ids_list,
        prompts_text,
        max_completion_length,
    ):
        super()._process_completions_to_buffer(
            slices,
            on_policy_indices,
            local_slice_indices,
            completion_ids,
            prompt_ids_list,
            prompts_text,
            max_completion_length,
        )
        if self.tool_loop is not None and self._tool_masks is not None:
            rows: dict[int, list[list[int]]] = {i: [] for i in on_policy_indices}
            for i, slice_idx in enumerate(local_slice_indices):
                rows[slice_idx].append(self._tool_masks[i])
            self.tool_tokens_masked = getattr(self, "tool_tokens_masked", 0) + mask_tool_labels(
                self._buffered_inputs, rows, max_completion_length
            )
            self._tool_masks = None

    def resume_state(self) -> dict:
        """Per rank in every checkpoint (align.runtime.checkpoint.RESUME_STATE): the sampler's call count."""
        return {"sampler": None if self.sampler is None else self.sampler.state_dict()}

    def load_resume_state(self, state: dict) -> None:
        if self.sampler is not None and state.get("sampler"):
            self.sampler.load_state_dict(state["sampler"])

    def sync_engine(self) -> None:
        """After a resume (align.runtime.checkpoint): the engine gets the restored weights before the first step."""
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
        if self.args.loss_chunk_tokens:  # the logits before each completion token predict it, in both sequences
            at = [
                (
                    b,
                    torch.tensor(done, device=ids.device) - 1,
                    torch.arange(start - 1, start - 1 + len(done), device=ids.device),
                )
                for b, (done, start) in enumerate(spans)
                if done
            ]
            return self._chunked_loss(
                model, ids, mask, t_ids.to(ids.device), t_mask.to(ids.device), at, num_items_in_batch
            ), None
        outputs_student = model(input_ids=ids, attention_mask=mask, use_cache=False)
        self.teacher_model.eval()
        with torch.no_grad():
            t_logits = self.teacher_model(input_ids=t_ids.to(ids.device), attention_mask=t_mask.to(ids.device)).logits
        teacher_logits = torch.zeros_like(outputs_student.logits)
        for b, (done, start) in enumerate(spans):
            if done:  # the logits before each completion token predict it, in both sequences
                pos = torch.tensor(done, device=ids.device)
                teacher_logits[b, pos - 1] = t_logits[b, start - 1 : start - 1 + len(done)].to(teacher_logits.dtype)
        loss = self.generalized_jsd_loss(
            student_logits=outputs_student.logits[:, :-1, :],
            teacher_logits=teacher_logits[:, :-1, :],
            labels=labels[:, 1:],
            beta=self.beta,
            temperature=self.temperature,
            num_items_in_batch=num_items_in_batch,
        )
        return loss, outputs_student

    def _chunked_loss(self, model, ids, mask, t_ids, t_mask, spans, num_items_in_batch) -> torch.Tensor:
        """The generalized JSD of TRL's whole-logits path, `loss_chunk_tokens` positions at a time (align/distill/
        loss.py). `spans`: (row, the student positions whose logits predict a completion token, the teacher's
        positions whose logits predict the same tokens)."""
        with hidden_states_as_logits(model) as student_head:
            student = model(input_ids=ids, attention_mask=mask, use_cache=False).logits
        self.teacher_model.eval()
        with torch.no_grad(), hidden_states_as_logits(self.teacher_model) as teacher_head:
            teacher = self.teacher_model(input_ids=t_ids, attention_mask=t_mask).logits
        s_rows = [student[b, pos] for b, pos, _ in spans]
        t_rows = [teacher[b, pos] for b, _, pos in spans]
        hidden_s = torch.cat(s_rows) if s_rows else student[:, :0].flatten(0, 1)
        hidden_t = torch.cat(t_rows) if t_rows else teacher[:, :0].flatten(0, 1)
        total = chunked_jsd(
            hidden_s,
            hidden_t,
            student_head,
            teacher_head,
            beta=self.beta,
            temperature=self.temperature,
            chunk=self.args.loss_chunk_tokens,
        )
        count = num_items_in_batch if num_items_in_batch is not None else max(hidden_s.size(0), 1)
        return total / (count.to(total.device) if isinstance(count, torch.Tensor) else count)

    def _answer_nll(self, model, inputs, num_items_in_batch) -> torch.Tensor:
        """rejection_sampling: the next-token loss on the completion tokens (labels != -100) of the verified answers,
        over `num_items_in_batch` when the trainer counts them (gradient accumulation), as the chunked path."""
        logits = model(input_ids=inputs["input_ids"], attention_mask=inputs["attention_mask"], use_cache=False).logits
        labels = inputs["labels"][:, 1:]  # the logits at position i predict token i + 1
        total = torch.nn.functional.cross_entropy(
            logits[:, :-1].flatten(0, 1).float(), labels.flatten(), ignore_index=-100, reduction="sum"
        )
        count = num_items_in_batch if num_items_in_batch is not None else (labels != -100).sum().clamp(min=1)
        return total / (count.to(total.device) if isinstance(count, torch.Tensor) else count)

    def compute_loss(self, model, inputs, return_outputs=False, num_items_in_batch=None):
        if self.args.loss == "rejection_sampling" and not return_outputs:
            return self._answer_nll(model, inputs, num_items_in_batch)
        if self.args.loss_chunk_tokens and not return_outputs and not self.teacher_prompts:
            ids, mask = inputs["input_ids"], inputs["attention_mask"]
            scored = inputs["labels"][:, 1:] != -100  # the logits at position i predict token i + 1
            spans = []
            for b in range(ids.shape[0]):
                pos = scored[b].nonzero().flatten()
                if len(pos):  # the teacher reads the same sequence: its positions are the student's
                    spans.append((b, pos, pos))
            return self._chunked_loss(model, ids, mask, ids, mask, spans, num_items_in_batch)
        if not self.use_uld_loss and self.teacher_prompts:
            loss, outputs = self._same_vocab_teacher_view_loss(model, inputs, num_items_in_batch)
            return (loss, outputs) if return_outputs else loss
        if self.use_uld_loss and self.teacher_prompts and "original_prompt_text" in inputs:
            inputs = {
                **inputs,
                "original_prompt_text": [self._teacher_prompt_text(t) for t in inputs["original_prompt_text"]],
            }
        return super().compute_loss(model, inputs, return_outputs, num_items_in_batch)


# ----------------------------------------------------------------------------- data


def to_conversations(dataset, name: str = "train"):
    """{messages} rows (last turn assistant) for GOLD; task rows' prompt_messages + assistant text also work."""
    cols = set(dataset.column_names)
    # a tool-use trace (builtin:tool_tasks) holds the calls and replies before its answer: on-policy sampling starts
    # from its question (prompt_messages), where the student makes its own calls
    trace = "messages" in cols and len(dataset) and any(m["role"] == "tool" for m in dataset[0]["messages"])
    if "messages" in cols and not (trace and {"prompt_messages", "answer"} <= cols):
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


# ----------------------------------------------------------------------------- main


def check_teacher_placement(args: DistillConfig) -> None:
    if not args.teacher_model_name_or_path:
        raise ValueError("teacher_model_name_or_path is required (a local model dir, hub id or builtin:NAME)")
    if is_zero3() and (args.teacher_device or args.teacher_quantization):
        raise ValueError(
            "teacher_device / teacher_quantization place the teacher on one device, which DeepSpeed "
            "ZeRO-3 (it shards the teacher like the student) cannot do: drop them, or launch with "
            "recipes/accelerate/zero2.yaml or ddp.yaml"
        )
    ranks = launched_world_size()
    if args.teacher_device and ranks > 1:
        raise ValueError(
            f"teacher_device={args.teacher_device} would put all {ranks} ranks' teachers on that one GPU: "
            "drop it (each rank's teacher then sits on the rank's own GPU, 8-bit with "
            "teacher_quantization if it must be small) or run one process"
        )


def prepare_conversations(data, args: DistillConfig, eval_num_prompts: int) -> dict:
    """The training conversations and what the teacher's view of each prompt needs (its group, its hint, the pool
    of demonstrations), plus the held-out rows: {"train", "groups", "hints", "pool", "eval_rows"}."""
    group_col = args.teacher_few_shot_group
    if args.loss == "rejection_sampling" and not {"answer", "reward"} <= set(data["train"].column_names):
        raise ValueError(
            "loss: rejection_sampling keeps the teacher's answers its verifier accepts, so the training "
            "rows need 'answer' and 'reward' columns (e.g. builtin:tasks); this dataset has "
            f"{sorted(data['train'].column_names)}: add them or use loss: sequence_kd"
        )
    groups = data["train"][group_col] if group_col in data["train"].column_names else None
    hints = teacher_hints(data["train"].to_list(), args.teacher_hint) if args.teacher_hint else None
    train = to_conversations(data["train"])
    pool = (
        FewShotPool(train["messages"], groups, args.teacher_few_shot, args.seed, hints)
        if args.teacher_few_shot
        else None
    )
    if args.teacher_few_shot and groups is None:
        logger.info(
            "teacher_few_shot: the data has no %r column; demonstrations match the system turn only", group_col
        )
    eval_rows = []
    if "test" in data and "prompt_messages" in data["test"].column_names:
        eval_rows = data["test"].select(range(min(eval_num_prompts, len(data["test"])))).to_list()
    rows = data["train"].to_list() if args.loss == "rejection_sampling" else None
    return {"train": train, "groups": groups, "hints": hints, "pool": pool, "eval_rows": eval_rows, "rows": rows}


def teacher_answers(conv: dict, teacher, teacher_tok, args: DistillConfig):
    """sequence_kd: the training conversations with the teacher's greedy answers in place of the dataset's. Each rank
    answers its share of the prompts with the whole teacher; every rank gets all the answers.
    rejection_sampling: the teacher's verified best-of-`teacher_best_of` answers (align/distill/rejection.py)."""
    if args.loss == "rejection_sampling":
        return verified_answers(conv, teacher, teacher_tok, args)
    convs, groups, hints = list(conv["train"]["messages"]), conv["groups"], conv["hints"]
    idx = shard(range(len(convs)))
    with full_model(teacher, None) as whole:
        mine = teacher_samples(
            whole,
            teacher_tok,
            [convs[i] for i in idx],
            args,
            conv["pool"],
            [groups[i] for i in idx] if groups is not None else None,
            [hints[i] for i in idx] if hints is not None else None,
        )
    answers = gather_shards(mine)
    return conv["train"].map(
        lambda row, i: {"messages": _prompt_part(row["messages"]) + [{"role": "assistant", "content": answers[i]}]},
        with_indices=True,
    )


def teacher_view(conv: dict, student_tok, teacher_tok, args: DistillConfig, mode: str) -> dict[str, str]:
    """Student-rendered prompt -> the teacher's rendering, for the training and held-out prompts. cross: the teacher
    always reads its own template; same: only when it has a view of its own (demonstrations, a hint, stripped
    flags), else it reads exactly the student's tokens (TRL's GKD path, untouched) and the map is empty."""
    if mode != "cross" and not (args.teacher_few_shot or args.teacher_hint or args.teacher_strip_mode_flags):
        return {}
    eval_rows = conv["eval_rows"]
    convs = list(conv["train"]["messages"]) + [r["prompt_messages"] for r in eval_rows]
    # a row without the group column gets demonstrations from any group (same system turn)
    groups = (
        None
        if conv["groups"] is None
        else list(conv["groups"]) + [r.get(args.teacher_few_shot_group) for r in eval_rows]
    )
    hints = None if conv["hints"] is None else conv["hints"] + teacher_hints(eval_rows, args.teacher_hint)
    return teacher_prompt_map(convs, student_tok, teacher_tok, args, conv["pool"], groups, hints)


def main(script_args, training_args: DistillConfig, model_args, known: dict | None = None) -> dict:
    """Load student and teacher, measure, distil, save, measure again; returns the before/after metrics.

    `known`: greedy held-out answers made earlier in this process (`held_out_metrics`), which expert iteration's
    rounds share: a round's student or teacher that is weights already measured is not measured again.

    Long because it is the stage's one sequence (load, measure, train, save, measure again, compare) whose steps share
    the tokenizers, the tokenizer mode, the trainer and the held-out rows; split, they would be passed step to step."""
    args = training_args
    known = {} if known is None else known
    check_teacher_placement(args)
    stage.start("distill", script_args, args, model_args)  # the same seed on every rank while the models are built
    student_tok, _ = stage.load_tokenizer(model_args, args)
    teacher_tok = load_teacher_tokenizer(args.teacher_tokenizer_name_or_path or args.teacher_model_name_or_path)

    conv = prepare_conversations(stage.load_data(script_args, args.output_dir), args, script_args.eval_num_prompts)
    eval_rows = conv["eval_rows"]
    tool_loop = build_tool_loop(args, student_tok)  # a tool without hints or docstring fails here
    if tool_loop is not None:
        conv["train"] = add_tools_to_conversations(conv["train"], tool_loop)

    student = stage.load_model(model_args)
    teacher = load_teacher(
        args.teacher_model_name_or_path, args, dtype=args.teacher_dtype or model_args.dtype or "auto"
    )
    mode = resolve_tokenizer_mode(args.tokenizer_mode, student_tok, teacher_tok, student, teacher)
    args.use_uld_loss = mode == "cross"
    if mode == "cross" and not args.teacher_tokenizer_name_or_path:
        args.teacher_tokenizer_name_or_path = resolve_model_path(args.teacher_model_name_or_path)
    logger.info(
        "distillation: loss=%s mode=%s beta=%s lmbda=%s backend=%s teacher on %s",
        args.loss,
        mode,
        args.beta,
        args.lmbda,
        args.rollout_backend,
        teacher.device,
    )
    check_tool_distillation(args, args.use_uld_loss)
    teacher_written = args.loss in ("sequence_kd", "rejection_sampling")
    train = teacher_answers(conv, teacher, teacher_tok, args) if teacher_written else conv["train"]
    if args.replay_data:
        train = add_replay_conversations(train, args.replay_data, args.replay_samples)
    teacher_prompts = teacher_view(conv, student_tok, teacher_tok, args, mode)
    best_of = None  # measured before a trainer wraps the teacher, as its answers are
    if args.loss == "rejection_sampling" and args.distill_eval and script_args.eval_after and eval_rows:
        best_of = teacher_best_of_accuracy(conv, teacher, teacher_tok, args)
        logger.info(
            "held-out accuracy of the teacher's verified best of %d: %.3f %s",
            args.teacher_best_of,
            best_of["accuracy"],
            best_of["by_mode"],
        )

    trainer = DistillTrainer(
        model=student,
        teacher_model=teacher,
        args=args,
        train_dataset=train,
        processing_class=student_tok,
        teacher_prompts=teacher_prompts,
        teacher_device=args.teacher_device,
        peft_config=stage.peft_config(model_args),
    )
    set_rank_seed(args.seed, device_specific=True)  # dropout and sampling: a stream of its own per rank
    trainer.attach_sampler(
        build_sampler(
            args.rollout_backend,
            args.rollout_kwargs,
            trainer.accelerator.unwrap_model(trainer.model),
            resolve_model_path(model_args.model_name_or_path),
            student_tok,
            trainer.accelerator,
            seed=args.seed,
            max_model_len=args.max_length,
        )
    )
    if tool_loop is not None:
        if trainer.sampler is None:
            raise ValueError("tools need the shared rollout engine: set rollout_backend auto, hf, vllm or vllm-server")
        trainer.tool_loop = tool_loop
    stage.prepare(trainer, script_args, "distill", raw_train=train)

    metrics: dict = {
        "loss": args.loss,
        "tokenizer_mode": mode,
        "world_size": trainer.accelerator.num_processes,
        "distributed_type": str(trainer.accelerator.distributed_type.value),
    }
    measure = args.distill_eval and script_args.eval_after and bool(eval_rows)
    if best_of is not None:
        metrics["teacher_best_of"] = best_of
    if measure:
        plain = stage.peft_config(model_args) is None  # an adapter's saved weights are not the measured model's
        before = held_out_metrics(
            trainer,
            student_tok,
            teacher_tok,
            eval_rows,
            mode=mode,
            args=args,
            teacher_prompts=teacher_prompts,
            with_teacher_accuracy=mode == "same",
            known=known if plain else None,
            student_path=model_args.model_name_or_path,
        )
        if "reused" in before:
            metrics["reused"] = {"before": before.pop("reused")}
            logger.info("held-out answers already made in this process, not generated again: %s", metrics["reused"])
        if "teacher_accuracy" in before and "accuracy" in before:
            metrics["teacher_accuracy"] = before["teacher_accuracy"]
            metrics["num_prompts"] = before["num_prompts"]  # the teacher answered the same held-out rows
            logger.info(
                "held-out teacher accuracy %.3f (student before %.3f)", metrics["teacher_accuracy"], before["accuracy"]
            )
        before.pop("teacher_accuracy", None)
        metrics["before"] = before
        logger.info("held-out before: %s", _scalars(metrics["before"]))
    metrics["train"] = stage.train(trainer, args)
    metrics["teacher_prompt_misses"] = trainer.teacher_prompt_misses
    metrics["engine_calls"] = trainer.sampler.num_calls if trainer.sampler is not None else 0
    metrics["tool_tokens_masked"] = getattr(trainer, "tool_tokens_masked", 0)
    stage.save(trainer, student_tok, args)
    if measure:
        with stage.own_precision(trainer):  # as "before": the model's dtype, not the training autocast
            metrics["after"] = held_out_metrics(
                trainer,
                student_tok,
                teacher_tok,
                eval_rows,
                mode=mode,
                args=args,
                teacher_prompts=teacher_prompts,
                known=known if plain else None,
                student_path=args.output_dir,
            )  # saved: a later round's teacher
        logger.info("held-out after: %s", _scalars(metrics["after"]))
        b, a = metrics["before"], metrics["after"]
        if "correct" in b and "correct" in a:  # the same prompts before and after: a paired test
            b["by_mode"], a["by_mode"] = by_mode(eval_rows, b["correct"]), by_mode(eval_rows, a["correct"])
            for part in (b, a):  # which rows, for the per-item outcome files beside the pipeline report
                part["items"] = [
                    item_id(json.dumps(r.get("prompt_messages") or r.get("prompt"), sort_keys=True, default=str))
                    for r in eval_rows
                ]
                if all(r.get("family") for r in eval_rows):
                    part["families"] = [r["family"] for r in eval_rows]
            metrics["paired"] = paired_change(b["correct"], a["correct"])
            logger.info(
                "distill: same prompts: %d gained, %d lost, McNemar p=%.3g",
                metrics["paired"]["gained"],
                metrics["paired"]["lost"],
                metrics["paired"]["p_value"],
            )
        logger.info(
            "distill: held-out divergence %.4f -> %.4f, accuracy %.3f -> %.3f",
            b["divergence"],
            a["divergence"],
            b.get("accuracy", float("nan")),
            a.get("accuracy", float("nan")),
        )
    if trainer.sampler is not None:
        trainer.sampler.close(trainer.model_wrapped)
    stage.write_report(trainer, args.output_dir, "distill_eval.json", metrics)
    return metrics


def _scalars(metrics: dict) -> dict:
    """A held-out result without its per-row lists, for the log."""
    return {k: v for k, v in metrics.items() if not isinstance(v, list)}
