"""align/eval/statistics.py, the one scorer: correct = the row's verifier >= 1, Wilson intervals, generation through an
engine, shuffled multiple choice at chance, and the report's intervals and "within noise" verdicts."""

import random
from types import SimpleNamespace

import pytest

from align.eval.generation import generate_and_score, greedy_params, summarize
from align.eval.multiple_choice import chance, shuffle_choices
from align.eval.statistics import accuracy, overlaps, paired_change, wilson_interval
from align.eval.suite import EvalConfig, mc_items
from align.eval.verification import correct, is_correct
from align.pipeline.report import metric_table, target_lines


@pytest.mark.parametrize(
    "k, n, low, high",  # reference: scipy.stats.binomtest(k, n).proportion_ci(method="wilson")
    [
        (0, 10, 0.0, 0.2775),
        (5, 10, 0.2366, 0.7634),
        (24, 48, 0.3639, 0.6361),
        (1, 48, 0.0037, 0.1090),
        (10, 10, 0.7225, 1.0),
    ],
)
def test_wilson_interval_matches_reference_values(k, n, low, high):
    lo, hi = wilson_interval(k, n)
    assert (lo, hi) == (pytest.approx(low, abs=1e-4), pytest.approx(high, abs=1e-4))


def test_accuracy_carries_count_and_interval_and_overlap_means_noise():
    a = accuracy([1.0] * 12 + [0.0] * 36)
    assert a["accuracy"] == 0.25 and a["num"] == 48 and a["ci_low"] < 0.25 < a["ci_high"]
    one_more = accuracy([1.0] * 13 + [0.0] * 35)  # one item of 48 is ~2 points: noise
    assert overlaps((a["ci_low"], a["ci_high"]), (one_more["ci_low"], one_more["ci_high"]))
    far = accuracy([1.0] * 40 + [0.0] * 8)
    assert not overlaps((a["ci_low"], a["ci_high"]), (far["ci_low"], far["ci_high"]))
    assert accuracy([]) == {"accuracy": 0.0, "num": 0, "ci_low": 0.0, "ci_high": 1.0}


ROWS = [
    {"answer": "3, 7, 9", "family": "sort", "reward": "exact_match_reward"},
    {"answer": "9", "family": "compare", "reward": "math_reward"},
    {"answer": "9", "family": "compare"},  # no reward column: the default verifier
    {"answer": None, "family": "compare"},  # no gold: the verifier abstains, which is not correct
]


def test_correct_is_the_rows_verifier_at_one():
    texts = ["\\boxed{9, 7, 3}", "\\boxed{9}", "The answer is \\boxed{9}.", "\\boxed{9}"]
    assert correct(texts, ROWS) == [False, True, True, False]
    assert not is_correct(0.5) and not is_correct(None) and is_correct(1.0)


class Engine:
    """Answers prompt i (its first token id) with the text `replies[i]`; records what it was asked."""

    def __init__(self, replies):
        self.replies, self.calls = replies, []

    def generate(self, prompts, params):
        self.calls.append((prompts, params))
        return [
            [SimpleNamespace(completion_ids=[p[0]] * (3 + p[0]), finish_reason="length" if p[0] == 0 else "stop")]
            for p in prompts
        ]


def test_generate_and_score_checks_each_rows_answer_in_order():
    replies = ["\\boxed{3, 7, 9}", "\\boxed{8}", "The answer is \\boxed{9}.", "\\boxed{1}"]
    engine = Engine(replies)
    params = greedy_params(16, [0])
    records = generate_and_score(
        engine.generate, ROWS, [[i, 50] for i in range(4)], params, lambda ids: replies[ids[0]]
    )
    assert [r["correct"] for r in records] == [True, False, True, False]
    assert [r["text"] for r in records] == replies and [r["num_tokens"] for r in records] == [3, 4, 5, 6]
    assert engine.calls[0][1].temperature == 0.0 and engine.calls[0][1].max_new_tokens == 16
    s = summarize(records, [r["family"] for r in ROWS])
    assert s["accuracy"] == 0.5 and s["num"] == 4 and s["truncated"] == 0.25
    assert s["by_family"] == {"compare": pytest.approx(1 / 3), "sort": 1.0}
    with pytest.raises(ValueError, match="3 prompts for 4 rows"):
        generate_and_score(engine.generate, ROWS, [[0]] * 3, params, str)


def test_only_generating_leaves_scores_empty_and_an_engine_is_not_called_without_prompts():
    engine = Engine([])
    assert generate_and_score(engine.generate, [], [], greedy_params(4), str) == [] and engine.calls == []
    records = generate_and_score(engine.generate, [{}], [[1]], greedy_params(4), str, check=False)
    assert records[0]["score"] is None and not records[0]["correct"]


# ------------------------------------------------------------------------------------------ multiple choice


def test_shuffle_records_the_order_keeps_the_gold_and_balances_its_position():
    items = [{"context": f"c{i}", "choices": ["gold", "w1", "w2", "w3"], "label": 0} for i in range(40)]
    for seed in range(5):
        out = shuffle_choices(items, random.Random(seed))
        for item, it in zip(items, out):
            assert sorted(it["choices"]) == sorted(item["choices"]) and it["choices"][it["label"]] == "gold"
            assert [item["choices"][i] for i in it["order"]] == it["choices"]
        assert sorted(it["label"] for it in out) == sorted(list(range(4)) * 10)  # every position 10 times of 40
        assert len({tuple(it["choices"]) for it in out}) > 4  # the wrong options are shuffled too


@pytest.mark.parametrize("name", ["truthfulqa", "hellaswag"])
def test_always_a_and_uniform_random_land_at_chance_on_shuffled_items(name):
    cfg = EvalConfig(model_name_or_path="m", seed=0)
    items = mc_items(name, 50, cfg)  # the dev split: the source's even rows
    level = chance(items)
    rng = random.Random(0)
    for picks in ([0] * len(items), [rng.randrange(len(it["choices"])) for it in items]):  # always "A"; uniform
        res = accuracy([float(p == it["label"]) for p, it in zip(picks, items)])
        assert res["ci_low"] <= level <= res["ci_high"], (name, res, level)
    for seed in range(10):  # any fixed position scores chance (within a few items) under any seed: balanced gold
        shuffled = mc_items(name, 50, EvalConfig(model_name_or_path="m", seed=seed))
        for position in range(2):
            assert abs(sum(it["label"] == position for it in shuffled) / 50 - level) <= 4 / 50, (seed, position)
    assert mc_items(name, 50, cfg) == items  # the shuffle is fixed by the seed
    source = mc_items(name, 50, EvalConfig(model_name_or_path="m", mc_shuffle=False))
    for it, src in zip(items, source):  # the recorded order leads back to the source item
        assert [src["choices"][i] for i in it["order"]] == it["choices"] and it["order"][it["label"]] == src["label"]
    if name == "truthfulqa":  # unshuffled, "always A" is always right: the bug this shuffle fixes
        assert all(src["label"] == 0 for src in source)
        assert sum(it["label"] == 0 for it in items) < 20


# ------------------------------------------------------------------------------------------ the report


def _stage(name, value, num, parent=None, target=None, **own):
    low, high = wilson_interval(value * num, num)
    stats = {
        "acc/tasks/think": {"num": num, "ci_low": low, "ci_high": high},
        "mcf/truthfulqa": {"num": 32, "ci_low": 0.1, "ci_high": 0.4, "chance": 0.227},
    }
    return {
        "name": name,
        "parent": parent,
        "target": target,
        "metrics": {"acc/tasks/think": value, "mcf/truthfulqa": 0.25},
        "stats": stats,
        "train_metrics": own,
    }


def test_report_shows_intervals_counts_chance_and_within_noise_verdicts():
    stages = [
        _stage("sft", 0.25, 48),
        _stage("apo", 0.2917, 48, parent="sft", target="acc/tasks/think"),  # +2 items of 48: within noise
        _stage(
            "grpo",
            0.75,
            48,
            parent="apo",
            target="grpo_eval/accuracy",
            **{
                "grpo_eval/before/accuracy": 0.25,
                "grpo_eval/before/num_prompts": 8,
                "grpo_eval/after/accuracy": 0.5,
                "grpo_eval/after/num_prompts": 8,
            },
        ),
        _stage("gold", 0.95, 200, parent="grpo", target="acc/tasks/think"),
    ]
    lines = target_lines(stages)
    assert lines[0].endswith(
        "**apo** targets `acc/tasks/think`: 0.250 ± 0.119 (n=48) (sft) -> 0.292 ± 0.125 (n=48): within noise"
    )
    assert "(its own held-out eval): 0.250 ± 0.260 (n=8) -> 0.500 ± 0.285 (n=8): within noise" in lines[1]
    assert lines[2].endswith(": improved")  # 0.75 of 48 -> 0.95 of 200: the intervals do not overlap
    table = "\n".join(metric_table(stages))
    assert "| mcf/truthfulqa (chance 0.227) | 0.250 ± 0.150 (n=32) |" in table
    assert "| acc/tasks/think | 0.250 ± 0.119 (n=48) | 0.292 ± 0.125 (n=48) |" in table


def test_paired_change_is_the_exact_mcnemar_test_and_sees_what_overlapping_intervals_miss():
    import math
    import random

    def binomial_two_sided(k, n):  # the exact test by its definition: P(X <= min) + P(X >= max), X ~ Bin(n, 1/2)
        lo, hi = min(k, n - k), max(k, n - k)
        mass = [math.comb(n, i) / 2**n for i in range(n + 1)]
        return min(1.0, sum(mass[: lo + 1]) + sum(mass[hi:])) if lo != hi else 1.0

    rng = random.Random(0)
    for gained, lost in [(0, 0), (1, 0), (5, 5), (7, 2), (2, 9), (22, 2), (30, 31)]:
        before = [0] * gained + [1] * lost + [rng.randint(0, 1) for _ in range(40)]
        after = [1] * gained + [0] * lost + before[gained + lost :]
        out = paired_change(before, after)
        assert (out["gained"], out["lost"], out["num"]) == (gained, lost, len(before))
        assert abs(out["p_value"] - binomial_two_sided(gained, gained + lost)) < 1e-12, (gained, lost)
    # 256 prompts, 60 -> 80 right: 22 gained, 2 lost. The 95% intervals overlap (the old rule: within noise), the
    # paired test sees that almost every change went one way.
    before = [1] * 58 + [1] * 2 + [0] * 22 + [0] * 174
    after = [1] * 58 + [0] * 2 + [1] * 22 + [0] * 174
    assert overlaps(wilson_interval(60, 256), wilson_interval(80, 256))
    result = paired_change(before, after)
    assert result["significant"] and result["p_value"] < 1e-4
    # the same totals reached by churn (every item that was right now wrong: 80 gained, 60 lost) are not
    # significant: the test reads the pairs, not the totals
    churn = paired_change([1] * 60 + [0] * 196, [0] * 60 + [1] * 80 + [0] * 116)
    assert (churn["gained"], churn["lost"]) == (80, 60) and 0.05 < churn["p_value"] < 0.2 and not churn["significant"]
    with pytest.raises(ValueError, match="same items"):
        paired_change([1, 0], [1])


def test_report_judges_a_stage_own_before_after_by_its_paired_test():
    own = {
        "grpo_eval/before/accuracy": 60 / 256,
        "grpo_eval/before/num_prompts": 256,
        "grpo_eval/after/accuracy": 80 / 256,
        "grpo_eval/after/num_prompts": 256,
    }
    unpaired = _stage("grpo", 0.3, 48, target="grpo_eval/accuracy", **own)
    assert target_lines([unpaired])[0].endswith(": within noise")  # the intervals overlap
    paired = _stage(
        "grpo",
        0.3,
        48,
        target="grpo_eval/accuracy",
        **own,
        **{"grpo_eval/paired/gained": 22, "grpo_eval/paired/lost": 2, "grpo_eval/paired/p_value": 3e-5},
    )
    assert target_lines([paired])[0].endswith(": improved (paired: 22 gained, 2 lost, McNemar p=3e-05)")
    churn = _stage(
        "grpo",
        0.3,
        48,
        target="grpo_eval/accuracy",
        **own,
        **{"grpo_eval/paired/gained": 80, "grpo_eval/paired/lost": 60, "grpo_eval/paired/p_value": 0.108},
    )
    assert target_lines([churn])[0].endswith(": within noise (paired: 80 gained, 60 lost, McNemar p=0.11)")
    worse = _stage(
        "grpo",
        0.3,
        48,
        target="grpo_eval/accuracy",
        **own,
        **{"grpo_eval/paired/gained": 2, "grpo_eval/paired/lost": 22, "grpo_eval/paired/p_value": 3e-5},
    )
    assert ": got worse (paired" in target_lines([worse])[0]
