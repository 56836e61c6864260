"""Per-row verifiers everywhere: GRPO training, preference grading and evaluation score a row the same way (the
verifier its `reward` column names), and GRPO logs each verifier's mean."""

from __future__ import annotations

import datasets
import pytest
from test_grpo import ScriptedEngine, _args, _trainer, tiny  # noqa: F401  (tiny is a fixture)

import align.rollout as rollout
from align.grpo.reward_funcs import build_rewards
from data_gen.preferences import PreferenceDataConfig, grade
from data_gen.tasks import make_tasks, prompt_messages

# A sort row (exact_match_reward, an ordered list) and a compare row (math_reward), each answered right and wrong.
ROWS = [
    {"answer": "3, 7, 9", "family": "sort", "reward": "exact_match_reward"},
    {"answer": "3, 7, 9", "family": "sort", "reward": "exact_match_reward"},
    {"answer": "9", "family": "compare", "reward": "math_reward"},
    {"answer": "9", "family": "compare", "reward": "math_reward"},
]
TEXTS = ["The answer is \\boxed{3, 7, 9}.", "The answer is \\boxed{9, 7, 3}.", "\\boxed{9}", "\\boxed{3 + 6}"]
EXPECTED = [1.0, 0.0, 1.0, 0.0]


def test_grpo_preferences_and_evaluation_agree(tmp_path):
    from align.eval.verification import correct

    train_reward = build_rewards(_args(tmp_path, reward_funcs=["math_reward"]))[0]
    columns = {k: [r[k] for r in ROWS] for k in ROWS[0]}
    assert train_reward.__name__ == "math_reward"
    assert train_reward(completions=TEXTS, **columns) == EXPECTED
    assert grade(ROWS, TEXTS, PreferenceDataConfig(method="graded", policy_model="p")) == EXPECTED
    cfg = PreferenceDataConfig(method="graded", policy_model="p", rewards=["math_reward", "answer_format_reward"])
    assert grade(ROWS, TEXTS, cfg) == [2.0, 1.0, 2.0, 1.0]  # the format reward adds 1 to each boxed answer
    assert correct(TEXTS, ROWS) == [e == 1.0 for e in EXPECTED]  # the one scorer every evaluation uses


def test_grpo_logs_per_verifier_and_per_family_means(tiny, tmp_path, monkeypatch):  # noqa: F811
    mod = rollout
    engine = ScriptedEngine(mod, range(10, len(tiny["tokenizer"])))
    args = _args(tmp_path, reward_funcs=["math_reward"])
    rows = make_tasks(["sort", "compare"], num=4, split="train", seed=1)
    for r in rows:
        r["prompt_messages"] = prompt_messages(r, "no_think")
    trainer = _trainer(tiny, args, build_rewards(args), engine, datasets.Dataset.from_list(rows))
    trainer.model.train()  # TRL files metrics under "train" in training mode
    trainer._generate_and_score_completions([dict(trainer.train_dataset[i // 4]) for i in range(16)])
    metrics = trainer._metrics["train"]
    for name in (
        "verifier/math_reward/mean",
        "verifier/exact_match_reward/mean",
        "family/sort/mean",
        "family/compare/mean",
    ):
        assert len(metrics[name]) == 1 and 0.0 <= metrics[name][0] <= 1.0, name
    assert trainer.reward_func_names == ["math_reward"]


@pytest.mark.parametrize("name", ["math_reward", "exact_match_reward"])
def test_a_sort_row_is_checked_in_order_whichever_verifier_the_recipe_names(tmp_path, name):
    reward = build_rewards(_args(tmp_path, reward_funcs=[name]))[0]
    out = reward(completions=["\\boxed{7, 3, 9}", "\\boxed{3, 7, 9}"], answer=["3, 7, 9"] * 2,
                 reward=["exact_match_reward"] * 2)  # fmt: skip
    assert out == [0.0, 1.0]
