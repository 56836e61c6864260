"""Tool-use rollouts for on-policy distillation (align/distill): the student samples through the turn loop, the
teacher reads the whole trajectory (tool replies included, so it conditions on what the student saw) and the
divergence is taken on the student's own tokens only: the tool tokens' labels are -100.

Same tokenizer and the teacher's plain view only: the cross-tokenizer (GOLD/ULD) path rebuilds sequences from text,
and a teacher with its own prompt (`teacher_hint`, `teacher_few_shot`) reads the completion without its tool tokens.
"""

from __future__ import annotations

from align.tools.loop import ToolLoop, with_tools


def check_tool_distillation(args, use_uld_loss: bool) -> None:
    if not (args.tools or args.environment):
        return
    if use_uld_loss:
        raise ValueError(
            "tools in distillation need one tokenizer for student and teacher (the cross-tokenizer ULD "
            "path rebuilds sequences from text); use a same-tokenizer teacher"
        )
    if args.teacher_hint or args.teacher_few_shot:
        raise ValueError("tools in distillation use the teacher's plain view: unset teacher_hint and teacher_few_shot")
    if args.loss in ("supervised", "sequence_kd", "rejection_sampling"):
        raise ValueError(
            f"loss {args.loss} trains on fixed completions; tools need an on-policy loss "
            "(reverse_kl, forward_kl or jsd)"
        )


def add_tools_to_conversations(dataset, loop: ToolLoop):
    """The tools described in each conversation's system turn (rows already listing them are kept)."""

    def add(row):
        msgs = row["messages"]
        if not any("<tools>" in str(m.get("content")) for m in msgs):
            prompt, rest = msgs[:-1], msgs[-1:]
            row["messages"] = with_tools(prompt, loop.schemas) + rest
        return row

    return dataset.map(add)


def tool_completions(
    loop: ToolLoop, generate, unique: list[list[int]], params
) -> tuple[list[list[int]], list[list[int]]]:
    """(completion ids, policy masks) of `params.n` trajectories per prompt, in GOLD's order."""
    groups = loop.rollout(generate, unique, params, systems=[loop._system_of(u) for u in unique])
    flat = [t for g in groups for t in g]
    return [t.completion_ids for t in flat], [t.mask for t in flat]


def mask_tool_labels(buffered: list, slice_rows: dict[int, list[list[int]]], max_completion_length: int) -> int:
    """Set the labels of inserted tool tokens to -100 in GOLD's buffered slices (completion i of a slice starts at the
    slice's prompt width). Returns how many labels it masked."""
    masked = 0
    for slice_idx, masks in slice_rows.items():
        inputs = buffered[slice_idx] if 0 <= slice_idx < len(buffered) else None
        if inputs is None:
            continue
        start, labels = inputs["prompts"].shape[1], inputs["labels"]
        for row, mask in enumerate(masks):
            for j, m in enumerate(mask[:max_completion_length]):
                if not m and labels[row, start + j] != -100:
                    labels[row, start + j] = -100
                    masked += 1
    return masked
