"""Distillation: on-policy (same tokenizer) and GOLD cross-tokenizer, behind one `main()`.

    python scripts/distill.py recipes/tiny/distill.yaml     # same tokenizer: sft_strong -> pretrain_reasoning
    python scripts/distill.py recipes/tiny/gold.yaml        # cross tokenizer: SmolLM2-135M -> our tiny student

The modules, in import order: config.py (DistillConfig, beside the stage as TRL keeps `*_config.py`), loss.py (the
divergence over chunks of positions, without batch x length x vocabulary logits), metrics.py (held-out divergence
and accuracy), held_out.py (those on whole weights inside the stage, each weights' greedy answers made once),
teacher.py (the teacher's tokenizer, placement and view of each prompt), rejection.py (the
rejection-sampling teacher), trainer.py (the trainer, the engine adapter and one round's `main`; its docstring says
what we add to TRL's GOLDTrainer) and rounds.py (the stage's `main`: one round, or rounds of expert iteration).
"""

from align.distill.config import LOSSES, TOKENIZER_MODES, DistillConfig
from align.distill.loss import chunked_jsd
from align.distill.metrics import divergence, evaluate, greedy_completions, teacher_accuracy, verifiable_accuracy
from align.distill.rounds import main
from align.distill.teacher import (
    MODE_FLAGS,
    FewShotPool,
    TeacherOnDevice,
    load_teacher,
    load_teacher_tokenizer,
    resolve_tokenizer_mode,
    same_vocabulary,
    teacher_hints,
    teacher_messages,
    teacher_prompt_map,
    teacher_samples,
)
from align.distill.trainer import DistillTrainer, EngineGeneration, check_teacher_placement

__all__ = [
    "LOSSES",
    "MODE_FLAGS",
    "TOKENIZER_MODES",
    "DistillConfig",
    "DistillTrainer",
    "EngineGeneration",
    "FewShotPool",
    "TeacherOnDevice",
    "check_teacher_placement",
    "chunked_jsd",
    "divergence",
    "evaluate",
    "greedy_completions",
    "load_teacher",
    "load_teacher_tokenizer",
    "main",
    "resolve_tokenizer_mode",
    "same_vocabulary",
    "teacher_accuracy",
    "teacher_hints",
    "teacher_messages",
    "teacher_prompt_map",
    "teacher_samples",
    "verifiable_accuracy",
]
