"""What "correct" means for every accuracy in the codebase.

Each row is checked by the verifier its own ``reward`` column names (``rewards.verifier_reward``: the row's
``reward``, else its family's, else the default), and it is correct when that verifier scores it ``>= CORRECT_AT``
(1.0): a format bonus or partial credit is not a correct answer. Pretraining's skill check, SFT's and GRPO's
held-out evaluations, distillation's, the eval suite and the report all use `verify` / `correct`.
"""

from __future__ import annotations

from collections.abc import Sequence

from rewards import verifier_reward

CORRECT_AT = 1.0  # a verifier score at or above this is a correct answer


# Row keys that are never verifier arguments (TRL passes the prompt and completion itself).
_NOT_COLUMNS = frozenset({"prompt", "completion", "completions"})


def is_correct(score: float | None) -> bool:
    """A verifier's score means a correct answer (None, an abstention, is not)."""
    return score is not None and score >= CORRECT_AT


def verify(
    completions: Sequence[str],
    rows: Sequence[dict],
    default_verifier: str = "math_reward",
    family_verifiers: dict[str, str] | None = None,
) -> list[float | None]:
    """Each completion scored by the verifier its row names (`rewards.verifier_reward`), with the row's columns."""
    if len(completions) != len(rows):
        raise ValueError(f"verify: {len(completions)} completions for {len(rows)} rows")
    if not rows:
        return []
    keys = [k for k in dict.fromkeys(k for r in rows for k in r) if k not in _NOT_COLUMNS]
    columns = {k: [r.get(k) for r in rows] for k in keys}
    if any(r.get("prompt") is not None for r in rows):  # as TRL passes it in GRPO: a unit may be the question's word
        columns["prompts"] = [r.get("prompt") for r in rows]
    return verifier_reward(
        list(completions), default_verifier=default_verifier, family_verifiers=family_verifiers, **columns
    )


def correct(
    completions: Sequence[str],
    rows: Sequence[dict],
    default_verifier: str = "math_reward",
    family_verifiers: dict[str, str] | None = None,
) -> list[bool]:
    """Whether each completion answers its row correctly (see the module doc)."""
    return [is_correct(s) for s in verify(completions, rows, default_verifier, family_verifiers)]
