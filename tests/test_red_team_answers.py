"""Red team, final answers: what ``math_reward`` and ``exact_match_reward`` (``rewards/answer.py``,
``rewards/extract.py``, ``rewards/numbers.py``, ``rewards/math.py``) must never do — pay a hack, raise on a
completion or hang on one (on any thread), refuse a standard honest form.

``ATTACKS`` each score 0, by a general rule named in its comment; ``CRASHES`` never raise and score 0;
``SYMBOLIC_BOMBS`` return 0 within a wall-clock bound in a worker thread (TRL's async reward path) and in the
main thread; ``HONEST`` (the honest-forms suite) each score 1. ``INVISIBLE_BOXES``: a box that prints nothing is
no answer (beside a real box the real one counts; alone, nothing does), for the format rewards too.
"""

from __future__ import annotations

import threading
import time

import pytest

from rewards import answer_format_reward, exact_match_reward, math_reward
from rewards.answer import answer_kind, answer_matches, final_answer, numbers_equal, parse_number
from rewards.math import bounded

M, E = math_reward, exact_match_reward
DIGITS = "1" * 5000  # past Python's 4,300-digit int() limit

# (id, reward, completion, gold): each must score 0.
ATTACKS = [
    # 1. a letter juxtaposed to a number is a variable: the gold is an expression, not its coefficient
    ("variable_gold_coefficient", M, "\\boxed{2}", "2x"),
    ("variable_gold_spaced", M, "\\boxed{2}", "2 x"),
    ("variable_gold_product", M, "\\boxed{3}", "3xy"),
    ("variable_gold_unit_lookalike", M, "\\boxed{5}", "5m"),  # a unit is a word or \text{m}, never a lone letter
    ("variable_gold_constant", M, "\\boxed{2}", "2\\pi"),
    # 2. a percent sign is read one way per gold, never at two scales
    ("percent_100x_for_integer_gold", M, "\\boxed{5000\\%}", "50"),
    ("percent_gold_as_proportion", M, "\\boxed{0.5}", "50\\%"),
    ("percent_100x_under_proportion_gold", M, "\\boxed{0.5\\%}", "0.5"),
    ("percent_100x_under_fraction_gold", M, "\\boxed{0.5\\%}", "\\frac{1}{2}"),
    ("percent_gold_100x", M, "\\boxed{5000\\%}", "50\\%"),
    # 3. two values joined by any word, or by none, are not one answer
    ("two_values_and", M, "\\boxed{3 and 4}", "3"),
    ("two_values_und", M, "\\boxed{3 und 4}", "3"),
    ("two_values_else", M, "\\boxed{3 else 4}", "4"),
    ("two_values_anchored", M, "The answer is 3 und 4.", "3"),
    ("two_values_marked_or", M, "\\boxed{3 \\text{ or } 4}", "3"),
    ("two_values_spaced", M, "\\boxed{3 \\quad 4}", "3"),
    ("two_values_expression_gold", M, "\\boxed{\\sqrt{2} und 3}", "\\sqrt{2}"),
    ("two_values_exact_match", E, "\\boxed{3 und 4}", "3"),
    # 4. an equation counts as `x = value` or when its sides are equal
    ("false_equation", M, "\\boxed{2+2=5}", "5"),
    ("false_equation_expression_gold", M, "\\boxed{1+1=\\sqrt{2}}", "\\sqrt{2}"),
    ("false_equation_value_first", M, "\\boxed{5 = 2+2}", "5"),
    ("false_equation_exact_match", E, "\\boxed{2+2=5}", "5"),
    ("inequality_for_a_number", M, "\\boxed{x \\geq 3}", "3"),
    # 5. a number is stated as a number: a fraction only in lowest terms, no operator
    ("echo_division_slash", M, "\\boxed{12/4}", "3"),
    ("echo_division_frac", M, "\\boxed{\\frac{12}{4}}", "3"),
    ("echo_division_dfrac", M, "\\boxed{\\dfrac{12}{4}}", "3"),
    ("echo_division_div", M, "\\boxed{12 \\div 4}", "3"),
    ("echo_division_unicode", M, "\\boxed{12 ÷ 4}", "3"),
    ("fraction_over_one", M, "\\boxed{\\frac{3}{1}}", "3"),
    ("unreduced_fraction", M, "\\boxed{\\frac{6}{8}}", "0.75"),
    ("echo_product", M, "\\boxed{2 \\times 4}", "8"),
    ("echo_power", M, "\\boxed{2^3}", "8"),
    ("scientific_not_normalised", M, "\\boxed{12 \\times 10^{2}}", "1200"),
    # 6. nothing but `x =` before a number, nothing but units after it (an allow-list, not a hedge list)
    ("hedge_maybe", M, "\\boxed{maybe 3}", "3"),
    ("hedge_probably", M, "\\boxed{probably 3}", "3"),
    ("hedge_perhaps", M, "\\boxed{perhaps 3}", "3"),
    ("hedge_roughly", M, "\\boxed{roughly 3}", "3"),
    ("hedge_approximately", M, "\\boxed{approximately 3}", "3"),
    ("hedge_at_least", M, "\\boxed{at least 3}", "3"),
    ("hedge_approx_symbol", M, "\\boxed{\\approx 3}", "3"),
    ("hedge_approx_unicode", M, "\\boxed{≈3}", "3"),
    ("hedge_tilde", M, "\\boxed{~3}", "3"),
    ("hedge_sim", M, "\\boxed{\\sim 3}", "3"),
    ("hedge_after_number", M, "\\boxed{3 probably}", "3"),
    ("hedge_suffix_ish", M, "\\boxed{3 ish}", "3"),
    ("hedge_parenthetical", M, "\\boxed{3 \\text{ (approx.)}}", "3"),
    ("hedge_anchored_tilde", M, "The answer is ~3.", "3"),
    ("hedge_anchored_word", M, "The answer is approximately 3.", "3"),
    ("hedge_expression_gold", M, "\\boxed{maybe \\sqrt{2}}", "\\sqrt{2}"),
    ("hedge_expression_gold_symbol", M, "\\boxed{\\approx \\sqrt{2}}", "\\sqrt{2}"),
    ("hedge_expression_gold_marked", M, "\\boxed{\\sqrt{2} \\text{ approximately}}", "\\sqrt{2}"),
    ("hedge_tilde_exact_match", E, "\\boxed{~3}", "3"),
    # 7. text after an unclosed <think> is reasoning, never the answer
    ("reopened_think_box", M, "<think>a</think> hmm <think> \\boxed{3}", "3"),
    ("reopened_think_anchor", M, "<think>a</think>\n<think>\nThe answer is 3.", "3"),
    ("reopened_think_exact_match", E, "<think>a</think><think>\\boxed{3}", "3"),
]

# (id, reward, completion, gold, reward kwargs): each must return [0.0] without raising.
CRASHES = [
    ("digit_loop_box", M, f"\\boxed{{{DIGITS}}}", "3", {}),
    ("digit_loop_box_exact_match", E, f"\\boxed{{{DIGITS}}}", "3", {}),
    ("digit_loop_anchored", M, f"The answer is {DIGITS}.", "3", {}),
    ("digit_loop_last_number", M, f"so it is {DIGITS}", "3", {"last_number_fallback": True}),
    ("digit_loop_decimal", M, f"\\boxed{{0.{'3' * 5000}}}", "\\frac{1}{3}", {}),
    ("digit_loop_expression_gold", M, f"\\boxed{{{DIGITS}}}", "\\sqrt{2}", {}),
    ("digit_loop_list_item", M, f"\\boxed{{{DIGITS}, 2}}", "1, 2", {}),
    ("digit_loop_fraction", M, f"\\boxed{{\\frac{{{DIGITS}}}{{7}}}}", "3", {}),
    ("power_of_ten_overflow", M, "\\boxed{1e99999}", "3", {}),
    ("power_of_ten_overflow_latex", M, "\\boxed{1 \\times 10^{99999}}", "3", {}),
    ("division_by_zero", M, "\\boxed{\\frac{1}{0}}", "3", {}),
    ("division_by_zero_slash", M, "\\boxed{1/0}", "3", {}),
    ("unclosed_boxes", M, "\\boxed{" * 50_000, "3", {}),
    ("answer_phrase_flood", M, "The answer is " * 20_000, "3", {}),
    ("lone_surrogate", M, "\\boxed{\ud800}", "3", {}),
    ("empty_box", M, "\\boxed{}", "3", {}),
]

# Symbolic evaluation that would hold the GIL for minutes: refused before parsing or stopped by the deadline.
SYMBOLIC_BOMBS = [
    ("power_tower", "\\boxed{9^{9^{9^{9}}}}", "\\sqrt{2}"),
    ("power_tower_number_gold", "\\boxed{9^{9^{9^{9}}}}", "3"),
    ("stacked_superscripts", "\\boxed{9^{9}^{9}^{9}}", "\\sqrt{2}"),
    ("python_power_tower", "\\boxed{9**9**9**9}", "\\sqrt{2}"),
    ("huge_exponent", "\\boxed{9^{999999999}}", "\\sqrt{2}"),
    ("power_of_power", "\\boxed{(10^{10})^{10^{10}}}", "\\sqrt{2}"),
    ("huge_factorial", "\\boxed{999999!}", "\\sqrt{2}"),
    ("huge_binomial", "\\boxed{\\binom{1000000}{500000}}", "\\sqrt{2}"),
    ("deep_nesting", "\\boxed{" + "(" * 20 + "1" + ")" * 20 + "}", "\\sqrt{2}"),
    ("slow_expansion", "\\boxed{(x+y+z)^{100}}", "x^2+1"),  # pure Python: stopped by the deadline
]
BOUND_S = 10.0  # generous: the deadline is 5 s, a refusal takes milliseconds

# (id, reward, completion, gold, reward kwargs): the honest-forms suite, each must score 1.
HONEST = [
    # 10. typographic number forms
    ("unicode_minus", M, "\\boxed{−3}", "-3", {}),
    ("unicode_minus_exact_match", E, "\\boxed{−3}", "-3", {}),
    ("thin_space_thousands", M, "\\boxed{12\u2009345}", "12345", {}),
    ("narrow_nbsp_thousands", M, "\\boxed{12\u202f345}", "12345", {}),
    ("latex_thin_space_thousands", M, "\\boxed{12\\,345}", "12345", {}),
    ("comma_thousands", M, "\\boxed{12,345}", "12345", {}),
    ("braced_comma_thousands", M, "\\boxed{12{,}345}", "12345", {}),
    ("math_dataset_thousands", M, "\\boxed{2,\\!000}", "2000", {}),
    ("comma_list_not_thousands", M, "\\boxed{2,345}", "2, 345", {}),
    ("scientific_e", M, "\\boxed{1.2e3}", "1200", {}),
    ("scientific_times", M, "\\boxed{1.2 \\times 10^{3}}", "1200", {}),
    ("scientific_unicode", M, "\\boxed{1.2×10³}", "1200", {}),
    ("scientific_negative_exponent", M, "\\boxed{3 \\times 10^{-2}}", "0.03", {}),
    # 11. units (words, \text, \mathrm, currency, degrees)
    ("unit_text", M, "\\boxed{12 \\text{ cm}}", "12", {}),
    ("unit_word", M, "\\boxed{12 cm}", "12", {}),
    ("unit_attached_abbreviation", M, "\\boxed{12cm}", "12", {}),
    ("unit_squared", M, "\\boxed{12 \\text{ cm}^2}", "12", {}),
    ("unit_rate", M, "\\boxed{60 \\text{ km/h}}", "60", {}),
    ("unit_mathrm_single_letter", M, "\\boxed{3.5 \\mathrm{m}}", "3.5", {}),
    # a counted noun is a unit when the question counts it (TRL passes the prompts)
    (
        "unit_counted_noun",
        M,
        "\\boxed{7 \\text{ students}}",
        "7",
        {"prompts": ["How many students are in the class?"]},
    ),
    ("currency_dollar", M, "\\boxed{\\$5}", "5", {}),
    ("currency_word", M, "\\boxed{5 dollars}", "5", {}),
    ("degrees_circ", M, "\\boxed{90^\\circ}", "90", {}),
    ("degrees_unicode", M, "\\boxed{90°}", "90", {}),
    ("unit_in_gold", M, "\\boxed{10}", "10 \\text{ cm}", {}),
    ("unit_after_expression", M, "\\boxed{2\\sqrt{3}\\text{ cm}}", "2\\sqrt{3}", {}),
    # 12. answer phrases in markup
    ("markdown_bold_label", M, "**Answer:** 3", "3", {}),
    ("markdown_bold_sentence", M, "**The answer is 3**", "3", {}),
    ("math_delimiters", M, "Answer: $3$", "3", {}),
    ("markdown_italic_value", M, "The answer is *3*.", "3", {}),
    ("markdown_heading", M, "### Final Answer: 3", "3", {}),
    ("markdown_italic_last_number", M, "*3*", "3", {"last_number_fallback": True}),
    # percents, by the rule
    ("percent_for_percent_gold", M, "\\boxed{50\\%}", "50\\%", {}),
    ("figure_for_percent_gold", M, "\\boxed{50}", "50\\%", {}),
    ("percent_for_integer_gold", M, "\\boxed{50\\%}", "50", {}),
    ("percent_for_proportion_gold", M, "\\boxed{50\\%}", "0.5", {}),
    ("percent_for_fraction_gold", M, "\\boxed{12.5\\%}", "\\frac{1}{8}", {}),
    # numbers, fractions, equations, variables
    ("fraction_in_lowest_terms", M, "\\boxed{\\frac{3}{4}}", "0.75", {}),
    ("slash_fraction", M, "\\boxed{3/4}", "0.75", {}),
    ("assignment", M, "\\boxed{x = 3}", "3", {}),
    ("true_equation", M, "\\boxed{3 + 4 = 7}", "7", {}),
    ("assignment_expression", M, "\\boxed{y = \\sqrt{2}}", "\\sqrt{2}", {}),
    ("membership_interval", M, "\\boxed{x \\in [1, 2]}", "[1, 2]", {}),
    ("variable_expression", M, "\\boxed{2x}", "2x", {}),
    ("variable_expression_reordered", M, "\\boxed{x \\cdot 2}", "2x", {}),
    ("gold_with_two_values", M, "\\boxed{3 and 4}", "3 and 4", {}),
    ("answer_before_reopened_think", M, "<think>a</think> \\boxed{3} <think> more", "3", {}),
]


# (id, completion, gold, final answer): a box that prints nothing (rewards.visible.box_is_visible) is no answer, so
# it neither disagrees with a real box beside it nor stands for one alone; the format rewards read boxes the same way.
INVISIBLE_BOXES = [
    ("thin_space_box_beside_real", "\\boxed{\\,} \\boxed{4}", "4", "4"),
    ("phantom_box_beside_real", "\\boxed{\\phantom{3}} The answer is \\boxed{4}.", "4", "4"),
    ("real_box_then_quad_box", "\\boxed{4} \\boxed{\\quad}", "4", "4"),
    ("zero_width_box_beside_real", "\\boxed{\u200b} \\boxed{4}", "4", "4"),
    ("empty_text_box_beside_real", "\\boxed{\\text{}} \\boxed{4}", "4", "4"),
    ("only_thin_space_box", "The answer is \\boxed{\\,}.", "0", None),
    ("only_phantom_of_the_gold", "\\boxed{\\phantom{3}}", "3", None),
    ("only_phantom_of_an_expression", "\\boxed{\\phantom{\\sqrt{2}}}", "\\sqrt{2}", None),
    ("only_invisible_boxes", "\\boxed{~} \\boxed{\\hspace{1em}} \\boxed{\\text{\\phantom{yes}}}", "yes", None),
]


@pytest.mark.parametrize("case", INVISIBLE_BOXES, ids=[c[0] for c in INVISIBLE_BOXES])
def test_a_box_that_prints_nothing_is_no_answer(case):
    _, completion, gold, expected = case
    assert final_answer(completion) == expected
    assert final_answer(completion, anchors=True) == expected
    score = [0.0] if expected is None else [1.0]
    assert math_reward([completion], answer=[gold]) == score
    assert exact_match_reward([completion], answer=[gold]) == score
    assert answer_format_reward([completion]) == score


def test_an_invisible_box_leaves_the_answer_phrase_beside_it_as_the_candidate():
    # every answer phrase is a candidate, box or no box; a box that prints nothing is none
    completion = "\\boxed{\\,} The answer is 4."
    assert final_answer(completion) is None and final_answer(completion, anchors=True) == "4"
    assert math_reward([completion], answer=["4"]) == [1.0]
    assert exact_match_reward([completion], answer=["4"]) == [0.0]  # exact match needs a box that prints
    assert answer_format_reward([completion]) == [0.0]


@pytest.mark.parametrize("attack", ATTACKS, ids=[a[0] for a in ATTACKS])
def test_attack_scores_zero(attack):
    _, reward, completion, gold = attack
    assert reward([completion], answer=[gold]) == [0.0]


@pytest.mark.parametrize("case", CRASHES, ids=[c[0] for c in CRASHES])
def test_degenerate_completion_never_raises_and_scores_zero(case):
    _, reward, completion, gold, kwargs = case
    start = time.monotonic()
    assert reward([completion], answer=[gold], **kwargs) == [0.0]
    assert time.monotonic() - start < BOUND_S


def _score_in_thread(completion: str, gold: str) -> tuple[list | None, float]:
    out: dict[str, list] = {}
    worker = threading.Thread(target=lambda: out.setdefault("scores", math_reward([completion], answer=[gold])),
                              daemon=True)  # fmt: skip
    start = time.monotonic()
    worker.start()
    worker.join(timeout=3 * BOUND_S)
    return out.get("scores"), time.monotonic() - start


@pytest.mark.parametrize("bomb", SYMBOLIC_BOMBS, ids=[b[0] for b in SYMBOLIC_BOMBS])
def test_symbolic_bomb_is_bounded_in_a_worker_thread(bomb):
    _, completion, gold = bomb
    scores, elapsed = _score_in_thread(completion, gold)
    assert scores == [0.0] and elapsed < BOUND_S, (scores, elapsed)


@pytest.mark.parametrize("bomb", SYMBOLIC_BOMBS[:3] + SYMBOLIC_BOMBS[-1:], ids=lambda b: b[0])
def test_symbolic_bomb_is_bounded_in_the_main_thread(bomb):
    _, completion, gold = bomb
    start = time.monotonic()
    assert math_reward([completion], answer=[gold]) == [0.0]
    assert time.monotonic() - start < BOUND_S


def test_the_deadline_interrupts_python_in_any_thread():
    out = {}
    forever = lambda: [0 for _ in iter(int, 1)]  # noqa: E731
    worker = threading.Thread(target=lambda: out.setdefault("r", bounded(forever, 0.5, "late")))
    start = time.monotonic()
    worker.start()
    worker.join(timeout=BOUND_S)
    assert out.get("r") == "late" and time.monotonic() - start < BOUND_S
    assert bounded(lambda: 4, 0.5) == 4


@pytest.mark.parametrize("case", HONEST, ids=[h[0] for h in HONEST])
def test_honest_form_scores_one(case):
    _, reward, completion, gold, kwargs = case
    assert reward([completion], answer=[gold], **kwargs) == [1.0]


# ------------------------------------------------------------------------------------------ the rules, directly


def test_percent_is_read_one_way_per_gold():
    # (prediction, gold, equal): a percent gold compares figures, a proportion gold divides by 100, else a unit
    table = [("50\\%", "50\\%", True), ("50", "50\\%", True), ("0.5", "50\\%", False),
             ("50\\%", "0.5", True), ("0.5\\%", "0.5", False), ("50", "0.5", False),
             ("50\\%", "50", True), ("5000\\%", "50", False), ("33.33\\%", "\\frac{1}{3}", True)]  # fmt: skip
    assert [numbers_equal(p, g) for p, g, _ in table] == [e for _, _, e in table]


def test_a_unit_is_a_word_a_variable_is_a_letter():
    answers = ("12 cm", "12 \\text{ cm}", "12\\text{m}", "12cm", "2x", "2 x", "3ab", "2\\pi")
    assert [answer_kind(g) for g in answers] == [
        "number", "number", "number", "number", "expression", "expression", "expression", "expression"]  # fmt: skip


def test_thousands_or_list_is_decided_by_the_gold():
    assert answer_kind("12,345") == "number" and answer_kind("12, 345") == "list"
    assert answer_matches("12,345", "12345") and answer_matches("12,345", "12, 345")
    assert not answer_matches("12, 345", "12345") and not answer_matches("1,2345", "12345")


def test_a_number_is_stated_as_a_number():
    assert parse_number("\\frac{3}{4}").value == parse_number("0.75").value
    assert parse_number("\\frac{12}{4}") is None and parse_number("\\frac{12}{4}", strict=False).value == 3
    assert parse_number(DIGITS) is None and parse_number("1e401") is None  # too long to read, never int()'d


def test_suite_size():
    for cases in (ATTACKS, CRASHES, SYMBOLIC_BOMBS, HONEST):
        assert len({c[0] for c in cases}) == len(cases)
    assert len(ATTACKS) >= 30 and len(HONEST) >= 25
