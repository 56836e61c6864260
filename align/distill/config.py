"""Distillation's config: TRL's GOLDConfig (GKD + ULD) with our fields, beside the stage (align/distill/trainer.py) as
TRL keeps `*_config.py` beside `*_trainer.py`, so the teacher side (align/distill/teacher.py) and the stage both read
it.

    python scripts/distill.py recipes/tiny/distill.yaml --loss forward_kl --rollout_backend auto
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field

from align.config import StageArgs
from align.rollout.sampler import ROLLOUT_BACKENDS
from align.runtime.device import apply_device_defaults

os.environ.setdefault("TRL_EXPERIMENTAL_SILENCE", "1")  # GOLD lives in trl.experimental in TRL 1.x
from trl.experimental.gold import GOLDConfig  # noqa: E402

# loss -> (beta, lmbda); None keeps the recipe's value (jsd is GKD with the user's own lmbda/beta).
LOSSES: dict[str, tuple[float | None, float | None]] = {
    "reverse_kl": (1.0, 1.0),
    "forward_kl": (0.0, 1.0),
    "jsd": (None, None),
    "supervised": (0.0, 0.0),
    "sequence_kd": (0.0, 0.0),
    "rejection_sampling": (0.0, 0.0),
}
TOKENIZER_MODES = ("auto", "same", "cross")


@dataclass
class DistillConfig(StageArgs, GOLDConfig):
    """TRL's GOLDConfig (GKD + ULD) + our fields. `teacher_model_name_or_path` may be `builtin:NAME`."""

    loss: str = field(
        default="reverse_kl",
        metadata={"help": f"Distillation objective: one of {list(LOSSES)} (see align/distill/trainer.py)."},
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
        default=None,
        metadata={"help": "Extra knobs for align.rollout.get_engine (e.g. {gpu_memory_utilization: 0.3})."},
    )
    teacher_device: str | None = field(
        default=None, metadata={"help": "Put the teacher on its own device (e.g. cuda:1); GPU only."}
    )
    teacher_dtype: str | None = field(
        default=None,
        metadata={
            "help": "dtype of the frozen teacher's weights (float32, bfloat16; default: the "
            "student's `dtype`). bfloat16 halves its memory and, on CPUs with bf16 matrix units "
            "(AMX, AVX512-BF16), runs its forward several times faster; its logits are handed "
            "to the loss in float32."
        },
    )
    loss_chunk_tokens: int = field(
        default=0,
        metadata={
            "help": "0: the loss takes both models' whole logits (TRL's path). N > 0: the heads and "
            "the divergence run over N completion positions at a time, so no batch x length x "
            "vocabulary logits are built (align/distill/loss.py); same loss and gradients. "
            "Same-tokenizer path only (not GOLD's cross-tokenizer ULD)."
        },
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
        metadata={
            "help": "Context distillation: show the teacher this many solved training conversations "
            "before each prompt (same system turn, and same `teacher_few_shot_group` value when the data has "
            "that column), so a teacher that never saw the task format grades the student in it."
        },
    )
    teacher_few_shot_group: str = field(
        default="family", metadata={"help": "Dataset column whose value the teacher's demonstrations must share."}
    )
    teacher_best_of: int = field(
        default=4,
        metadata={
            "help": "loss: rejection_sampling: answers the teacher samples per prompt (at `temperature`); the "
            "student learns the first one the row's verifier accepts in its asked mode's shape, and prompts "
            "with none are dropped. The teacher's lead is these samples plus the verifier (best-of-n)."
        },
    )
    teacher_thinks: bool = field(
        default=False,
        metadata={
            "help": "loss: rejection_sampling: the teacher answers no_think prompts thinking (their /no_think "
            "flag shown to it as /think), and the student learns the verified answer without its think block, "
            "in the no_think form: what the model concludes when it reasons, learned as a direct answer "
            "(System 2 distilled into System 1). Think prompts are sampled as asked."
        },
    )
    rejection_rounds: int = field(
        default=1,
        metadata={
            "help": "loss: rejection_sampling: rounds of expert iteration. Every round after the first samples "
            "from, and trains, the model the round before saved (output_dir/round-<k>; the last round saves to "
            "output_dir), so the teacher's lead moves with the student; each round trains max_steps. "
            "distill_eval.json judges the whole stage: round 1's before against the last round's after."
        },
    )
    rejection_round_student: str = field(
        default="previous",
        metadata={
            "help": "rejection_rounds > 1: which model each later round trains. 'previous': the model the round "
            "before saved (expert iteration: the student keeps moving); 'start': the stage's starting model "
            "again, on the newest round's answers only (ReST-EM: the samples improve, the drift from the "
            "starting model does not add up). The teacher is always the model the round before saved."
        },
    )
    replay_data: str | None = field(
        default=None,
        metadata={
            "help": "loss: rejection_sampling: conversations (a `messages` column: a local file or directory, "
            "e.g. the base model's answers from scripts/generate_answers.py) learned beside the verified answers "
            "with the same next-token loss, so a student trained on task answers stays a chat model."
        },
    )
    replay_samples: int | None = field(
        default=None, metadata={"help": "Use at most this many replay conversations (the first ones)."}
    )
    teacher_hint: str | None = field(
        default=None,
        metadata={
            "help": "Privileged context: a format string over the row's columns, "
            "e.g. ' (The correct final answer is {answer}.)', appended to the last user turn the teacher sees "
            "(and to its demonstrations'). The student never sees it."
        },
    )
    tools: list[str] | None = field(
        default=None,
        metadata={
            "help": "Tools the student may call while it samples (align/tools; as GRPO's `tools`): the teacher "
            "reads the whole trajectory, the loss covers the student's tokens only."
        },
    )
    environment: str | None = field(default=None, metadata={"help": "A tool environment class by path (align/tools)."})
    max_turns: int = field(default=4, metadata={"help": "Student turns per tool-use rollout at most."})
    tool_timeout_s: float = field(default=10.0, metadata={"help": "Seconds a user tool call may take."})
    tool_memory_mb: int = field(default=512, metadata={"help": "Memory a user tool may add, in MB."})
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
            raise ValueError(
                f"teacher_few_shot must be >= 0 (demonstrations per teacher prompt), got {self.teacher_few_shot}"
            )
        if self.teacher_best_of < 1:
            raise ValueError(f"teacher_best_of must be >= 1 (answers sampled per prompt), got {self.teacher_best_of}")
        if self.teacher_thinks and (self.loss != "rejection_sampling" or self.teacher_strip_mode_flags):
            raise ValueError(
                "teacher_thinks swaps a no_think prompt's flag for /think in the teacher's samples: it "
                "needs loss: rejection_sampling and teacher_strip_mode_flags: false"
            )
        if self.rejection_rounds < 1:
            raise ValueError(
                f"rejection_rounds must be >= 1 (rounds of expert iteration), got {self.rejection_rounds}"
            )
        if self.rejection_rounds > 1 and self.loss != "rejection_sampling":
            raise ValueError(
                f"rejection_rounds={self.rejection_rounds} repeats rejection sampling from the improved "
                f"student; loss {self.loss!r} samples no answers: set loss: rejection_sampling or "
                "rejection_rounds: 1"
            )
        if self.rejection_round_student not in ("previous", "start"):
            raise ValueError(
                f"rejection_round_student {self.rejection_round_student!r}: choose 'previous' (train "
                "the model the round before saved) or 'start' (train the stage's starting model)"
            )
        if self.replay_data and self.loss != "rejection_sampling":
            raise ValueError(
                f"replay_data is learned with rejection_sampling's next-token loss; loss {self.loss!r} "
                "would distil the teacher on those answers instead: set loss: rejection_sampling or drop "
                "replay_data"
            )
        if self.teacher_dtype not in (None, "auto", "float32", "bfloat16", "float16"):
            raise ValueError(f"teacher_dtype {self.teacher_dtype!r}: choose float32, bfloat16, float16 or leave unset")
        if self.teacher_quantization not in (None, "8bit", "4bit"):
            raise ValueError(f"teacher_quantization {self.teacher_quantization!r}: choose 8bit, 4bit or leave unset")
        if self.loss_chunk_tokens < 0:
            raise ValueError(f"loss_chunk_tokens must be >= 0 (0 = whole logits), got {self.loss_chunk_tokens}")
        if self.loss_chunk_tokens and self.tokenizer_mode == "cross":
            raise ValueError(
                "loss_chunk_tokens is for the same-tokenizer path; GOLD's cross-tokenizer ULD loss needs "
                "whole rows: set loss_chunk_tokens: 0 or tokenizer_mode: same"
            )
        if isinstance(self.tools, str):
            self.tools = [self.tools]
        beta, lmbda = LOSSES[self.loss]
        self.beta = self.beta if beta is None else beta
        self.lmbda = self.lmbda if lmbda is None else lmbda
        if self.tokenizer_mode == "cross":
            self.use_uld_loss = True
        super().__post_init__()
