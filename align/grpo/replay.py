"""Replay rows in GRPO: an NLL term on conversations beside the policy-gradient loss (a part of align.grpo.trainer).

    replay_data: builtin:tool_tasks                 # conversations: a path, a hub id or a builtin, `messages` column
    replay_args: {num: 256, mode: mixed, seed: 11}  # the builtin's arguments (or load_dataset's)
    replay_coef: 0.2                                # loss = GRPO loss + 0.2 x NLL of the replay answers

InstructGPT's "ptx" mix and the replay rows APO has (align/preference/trainer.py): GRPO's rewards only move the tokens
where a group's rollouts disagree; every token they share (a tool name chosen before any reward differs, a think
block's opening) drifts with whatever the rewarded groups push. An NLL term on the SFT data's answers pulls back where
the policy leaves it and costs nearly nothing where it has not. The loss covers the assistant turns only
(align.data.chat.assistant_masks: tool replies and prompts carry none); each micro-batch takes the next
`replay_batch_size` rows of a seeded order, its place a function of the optimizer step, so a resumed run reads
the rows an uninterrupted one would. Logged as `replay/nll`.
"""

from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field

import torch

from align.data.chat import tokenize_sft_dataset
from align.data.loading import load_replay_conversations

logger = logging.getLogger(__name__)


@dataclass
class ReplayArgs:
    """The recipe keys of replay rows (a part of align.grpo.config.GRPOConfig)."""

    replay_data: str | None = field(
        default=None,
        metadata={
            "help": "Conversations (a `messages` column: a local path, a hub id or a builtin such as "
            "builtin:tool_tasks) whose assistant turns get an NLL term beside the GRPO loss: an anchor that keeps "
            "what SFT taught where the rewards say nothing. Tool replies and prompts carry no loss."
        },
    )
    replay_args: dict | None = field(
        default=None, metadata={"help": "Arguments of replay_data's source (a builtin's, or load_dataset's)."}
    )
    replay_coef: float = field(
        default=0.1, metadata={"help": "Weight of the replay NLL (mean over the assistant tokens of a micro-batch)."}
    )
    replay_batch_size: int = field(default=2, metadata={"help": "Replay conversations per micro-batch."})
    replay_samples: int | None = field(
        default=None, metadata={"help": "Use at most this many replay conversations (the first ones)."}
    )
    replay_max_length: int = field(
        default=1024, metadata={"help": "Tokens a replay conversation keeps at most (the rest is cut)."}
    )


def check_replay_args(args) -> None:
    """One line per replay setting that cannot run."""
    if args.replay_data is None:
        return
    if args.replay_coef <= 0:
        raise ValueError(f"replay_coef must be > 0 with replay_data (it weighs the NLL term), got {args.replay_coef}")
    if args.replay_batch_size < 1:
        raise ValueError(f"replay_batch_size must be >= 1, got {args.replay_batch_size}")
    if args.replay_args is not None and not isinstance(args.replay_args, dict):
        raise ValueError(f"replay_args must be a mapping of the source's arguments, got {args.replay_args!r}")


def load_replay(args, tokenizer) -> list[dict]:
    """replay_data's conversations as {"input_ids", "assistant_masks"}, in a seeded order."""
    spec = args.replay_data
    rows = load_replay_conversations(spec, args.replay_samples, **(args.replay_args or {}))
    rows = rows.select_columns([c for c in ("messages", "chat_template_kwargs") if c in rows.column_names])
    tokenized = tokenize_sft_dataset(rows, tokenizer, assistant_only_loss=True, name="replay")
    out = [
        {
            "input_ids": r["input_ids"][: args.replay_max_length],
            "assistant_masks": r["assistant_masks"][: args.replay_max_length],
        }
        for r in tokenized
    ]
    out = [r for r in out if sum(r["assistant_masks"][1:])]
    if not out:
        raise ValueError(
            f"replay_data {spec!r}: no conversation has an assistant token within replay_max_length "
            f"({args.replay_max_length} tokens): raise replay_max_length, or point it at conversations "
            "that end in assistant turns"
        )
    random.Random(args.seed).shuffle(out)
    logger.info(
        "replay: %d conversations from %s, weight %g, %d a micro-batch",
        len(out),
        spec,
        args.replay_coef,
        args.replay_batch_size,
    )
    return out


def replay_nll(model, rows: list[dict], pad_id: int) -> torch.Tensor:
    """Mean NLL of the assistant tokens of `rows` (right-padded: causal attention never reads the padding)."""
    length = max(len(r["input_ids"]) for r in rows)
    ids = torch.full((len(rows), length), pad_id, dtype=torch.long)
    labels = torch.full((len(rows), length), -100, dtype=torch.long)
    for i, r in enumerate(rows):
        n = len(r["input_ids"])
        ids[i, :n] = torch.tensor(r["input_ids"])
        keep = torch.tensor(r["assistant_masks"], dtype=torch.bool)
        labels[i, :n] = torch.where(keep, ids[i, :n], -100)
    device = next(model.parameters()).device
    ids, labels = ids.to(device), labels.to(device)
    positions = torch.arange(length, device=device).expand(len(rows), length)
    logits = model(input_ids=ids, position_ids=positions).logits[:, :-1].float()
    return torch.nn.functional.cross_entropy(
        logits.reshape(-1, logits.size(-1)), labels[:, 1:].reshape(-1), ignore_index=-100
    )


class ReplayLoss:
    """GRPOTrainer part: loss + replay_coef x the replay rows' NLL, on training micro-batches (`with_replay`)."""

    _replay_at: tuple[int, int] = (-1, -1)

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        # at start: a source without conversations fails before the first rollout
        self._replay_rows = load_replay(self.args, self.processing_class) if self.args.replay_data else None

    def _next_replay_rows(self) -> list[dict]:
        step, micro = self._replay_at
        micro = micro + 1 if step == self.state.global_step else 0
        self._replay_at = (self.state.global_step, micro)
        size, acc = self.args.replay_batch_size, self.args.gradient_accumulation_steps
        slot = (self.state.global_step * acc + micro) * self.accelerator.num_processes + self.accelerator.process_index
        rows = self._replay_rows
        return [rows[(slot * size + i) % len(rows)] for i in range(size)]

    def with_replay(self, model, loss: torch.Tensor) -> torch.Tensor:
        """The training loss plus `replay_coef` x the NLL of this micro-batch's replay rows (logged as
        `replay/nll`); the loss alone without replay rows or outside training. Called by the trainer's loss pass."""
        if self.args.replay_data is None or not model.training:
            return loss
        tok = self.processing_class
        pad = tok.pad_token_id if tok.pad_token_id is not None else tok.eos_token_id
        nll = replay_nll(model, self._next_replay_rows(), pad)
        self._metrics["train"]["replay/nll"].append(self.accelerator.gather(nll.detach()).mean().item())
        return loss + self.args.replay_coef * nll / self.current_gradient_accumulation_steps
