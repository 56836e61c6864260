"""Final answers by allow-list: one extractor finds every candidate, a grammar per gold kind reads each one whole.

Table-driven, per class of attack: ``ATTACKS`` each score 0 and ``HONEST`` forms each score 1 under
``math_reward`` (M) or ``exact_match_reward`` (E), with the prompt TRL would pass where the case needs one. Then the
grammar pieces directly (kinds, numbers, the extractor), and the bounds: 1 MB of each adversarial shape returns in
bounded time and memory, from the extractor (with its scan cap lifted, so the mechanism itself is linear) and
from both rewards.
"""

from __future__ import annotations

import time
import tracemalloc
from fractions import Fraction

import pytest

import rewards.extract as extract
from rewards import exact_match_reward, math_reward
from rewards.answer import answer_kind, judge
from rewards.extract import answer_candidates, box_spans
from rewards.grammar import inequality_interval, read_equations
from rewards.numbers import parse_number
from rewards.units import UnitContext

M, E = math_reward, exact_match_reward
APPLES = "Tom has 3 apples and buys 4 more. How many apples does Tom have?"
ROPE = "A rope is 2 m long and another is 3 m long. How long are they together?"
OPTIONS = "Which is the largest? (A) 40 (B) 42 (C) 44 (D) 41"

# (class, id, reward, completion, gold, prompt): each must score 0.
ATTACKS = [
    # a percent in any spelling is a percent: read by its meaning, never dropped as a unit (100x)
    ("percent", "per_cent", M, "\\boxed{0.5 per cent}", "0.5", None),
    ("percent", "pct", M, "\\boxed{0.5 pct}", "0.5", None),
    ("percent", "pct_dot", M, "\\boxed{0.5 pct.}", "0.5", None),
    ("percent", "text_percent", M, "\\boxed{0.5 \\text{ percent}}", "0.5", None),
    ("percent", "mathrm_percent", M, "\\boxed{0.5 \\mathrm{percent}}", "0.5", None),
    ("percent", "textnormal_percent", M, "\\boxed{0.5\\textnormal{ per cent}}", "0.5", None),
    ("percent", "percentage_points", M, "\\boxed{0.5 percentage points}", "0.5", None),
    ("percent", "percentage", M, "\\boxed{0.25 percentage}", "\\frac{1}{4}", None),
    ("percent", "text_escaped_sign", M, "\\boxed{0.5 \\text{\\%}}", "0.5", None),
    ("percent", "spaced_sign", M, "\\boxed{0.5\\,\\%}", "0.5", None),
    ("percent", "percent_100x_integer_gold", M, "\\boxed{5000 per cent}", "50", None),
    ("percent", "percent_gold_as_proportion", M, "\\boxed{0.5}", "50\\%", None),
    ("percent", "percent_gold_100x", M, "\\boxed{5000 pct}", "50\\%", None),
    ("percent", "anchored", M, "The answer is 0.5 percent.", "0.5", None),
    # a word after a number is a unit only by the allow-list (the question's word or a unit of measure)
    ("unit", "approximate", M, "\\boxed{3 approximate}", "3", None),
    ("unit", "approximate_in_prompt", M, "\\boxed{3 approximate}", "3", "Approximate pi to the nearest integer."),
    ("unit", "tops", M, "\\boxed{3 tops}", "3", None),
    ("unit", "incorrect", M, "\\boxed{3 incorrect}", "3", None),
    ("unit", "incorrect_marked", M, "\\boxed{3 \\text{ incorrect}}", "3", None),
    ("unit", "squared", M, "\\boxed{9 squared}", "9", None),
    ("unit", "squared_in_prompt", M, "\\boxed{3 squared}", "3", "What is 3 squared?"),
    ("unit", "cubed", M, "\\boxed{2 cubed}", "2", None),
    ("unit", "dozen", M, "\\boxed{3 dozen}", "3", None),
    ("unit", "dozen_in_prompt", M, "\\boxed{3 dozen}", "3", "She buys 3 dozen eggs. How many dozen does she buy?"),
    ("unit", "thousand", M, "\\boxed{3 thousand}", "3", None),
    ("unit", "million_marked", M, "\\boxed{3 \\text{ million}}", "3", None),
    ("unit", "times", M, "\\boxed{3 times}", "3", None),
    ("unit", "maybe_after", M, "\\boxed{3 maybe}", "3", None),
    ("unit", "hmm", M, "\\boxed{3 hmm}", "3", None),
    ("unit", "wrong", M, "\\boxed{3 wrong}", "3", None),
    ("unit", "negation", M, "\\boxed{3 not}", "3", None),
    ("unit", "or_more", M, "\\boxed{3 or more}", "3", None),
    ("unit", "at_most", M, "\\boxed{3 at most}", "3", None),
    ("unit", "give_or_take", M, "\\boxed{3 give or take}", "3", None),
    ("unit", "parenthetical_estimate", M, "\\boxed{3 \\text{ (estimate)}}", "3", None),
    ("unit", "attached_k", M, "\\boxed{3k}", "3", None),
    ("unit", "invented_word", M, "\\boxed{3 blorps}", "3", None),
    ("unit", "wrong_dimension", M, "\\boxed{5 kg}", "5", ROPE),
    ("unit", "measure_for_a_count", M, "\\boxed{7 cm}", "7", APPLES),
    ("unit", "noun_not_in_prompt", M, "\\boxed{7 pears}", "7", APPLES),
    ("unit", "anchored_word", M, "The answer is 3 approximately.", "3", None),
    ("unit", "expression_hedge_word", M, "\\boxed{\\sqrt{2} \\text{ roughly}}", "\\sqrt{2}", None),
    # equations: variables are matched by name
    ("equation", "swapped_values", M, "\\boxed{y = 1, x = 2}", "x = 1, y = 2", None),
    ("equation", "other_variable", M, "\\boxed{x = 3}", "y = 3", None),
    ("equation", "other_variable_greek", M, "\\boxed{\\beta = 3}", "\\alpha = 3", None),
    ("equation", "tuple_swapped", M, "\\boxed{(y, x) = (1, 2)}", "x = 1, y = 2", None),
    ("equation", "one_missing", M, "\\boxed{x = 1}", "x = 1, y = 2", None),
    ("equation", "one_extra", M, "\\boxed{x = 1, y = 2, z = 3}", "x = 1, y = 2", None),
    ("equation", "bare_values_for_a_system", M, "\\boxed{1, 2}", "x = 1, y = 2", None),
    ("equation", "false_chain", M, "\\boxed{y = 7 = 2x+1}", "y = 2x+1", None),
    ("equation", "false_chain_number", M, "\\boxed{x = 2 = 3}", "3", None),
    ("equation", "false_equation", M, "\\boxed{2 + 2 = 5}", "5", None),
    ("equation", "other_line", M, "\\boxed{y = 2x + 2}", "y = 2x + 1", None),
    ("equation", "two_values_for_one", M, "\\boxed{x = 2 \\text{ or } x = 3}", "x = 2", None),
    # a box the old extractor did not see, beside the paid one: two distinct candidates
    ("box", "space_before_brace", M, "\\boxed{3} or \\boxed {4}", "3", None),
    ("box", "newline_before_brace", M, "\\boxed{3} or \\boxed\n{4}", "3", None),
    ("box", "tab_before_brace", M, "\\boxed{3} or \\boxed\t{4}", "3", None),
    ("box", "without_braces", M, "\\boxed{3} or \\boxed 4", "3", None),
    ("box", "without_braces_attached", M, "\\boxed{3} or \\boxed4", "3", None),
    ("box", "fbox", M, "\\boxed{3} or \\fbox{4}", "3", None),
    ("box", "framebox_options", M, "\\boxed{3} or \\framebox[2cm][l]{4}", "3", None),
    ("box", "starred", M, "\\boxed{3} or \\boxed*{4}", "3", None),
    ("box", "capitalised", M, "\\boxed{3} or \\Boxed{4}", "3", None),
    ("box", "colorbox", M, "\\boxed{3} or \\colorbox{yellow}{4}", "3", None),
    ("box", "fcolorbox", M, "\\boxed{3} or \\fcolorbox{red}{white}{4}", "3", None),
    ("box", "bbox", M, "\\boxed{3} or \\bbox[red]{4}", "3", None),
    ("box", "second_first", M, "\\fbox{4} then \\boxed{3}", "3", None),
    ("box", "inside_the_box", M, "\\boxed{3 \\boxed{4}}", "3", None),
    ("box", "exact_space", E, "\\boxed{yes} or \\boxed {no}", "yes", None),
    ("box", "exact_fbox", E, "\\boxed{yes} or \\fbox{no}", "yes", None),
    ("box", "exact_bare", E, "\\boxed{yes} or \\boxed no", "yes", None),
    ("box", "exact_newline", E, "\\boxed{2, 5, 9} \\boxed\n{9, 5, 2}", "2, 5, 9", None),
    ("box", "too_long", M, "\\boxed{3} \\boxed{" + "x" * 2000 + "}", "3", None),
    # answer phrases are candidates too
    ("anchor", "box_then_phrase", M, "\\boxed{3}. The answer is 4.", "3", None),
    ("anchor", "phrase_then_box", M, "The answer is 4. So \\boxed{3}", "3", None),
    ("anchor", "gsm8k_beside_box", M, "\\boxed{3}\n#### 4", "3", None),
    (
        "anchor",
        "minerva_beside_box",
        M,
        "\\boxed{3}\nFinal Answer: The final answer is $4$. I hope it is correct.",
        "3",
        None,
    ),
    ("anchor", "two_phrases", M, "The answer is 4. No, the answer is 3.", "3", None),
    ("anchor", "two_gsm8k", M, "#### 3\n#### 4", "3", None),
    ("anchor", "heading_beside_box", M, "\\boxed{3}\n### Final Answer\n4", "3", None),
    ("anchor", "exact_phrase_beside_box", E, "\\boxed{yes}. The answer is no.", "yes", None),
    ("anchor", "exact_phrase_alone", E, "The answer is yes.", "yes", None),
    # intervals are not sets; an interval in its own order only
    ("interval", "set_for_open_interval", M, "\\boxed{\\{1, 2\\}}", "(1, 2)", None),
    ("interval", "set_for_half_open", M, "\\boxed{\\{1, 2\\}}", "(1, 2]", None),
    ("interval", "set_for_closed", M, "\\boxed{\\{1, 2\\}}", "[1, 2]", None),
    ("interval", "reversed_set_for_interval", M, "\\boxed{\\{2, 1\\}}", "(1, 2]", None),
    ("interval", "interval_for_set", M, "\\boxed{(1, 2]}", "\\{1, 2\\}", None),
    ("interval", "closed_for_set", M, "\\boxed{[1, 2]}", "\\{1, 2\\}", None),
    ("interval", "open_for_set", M, "\\boxed{(1, 2)}", "\\{1, 2\\}", None),
    ("interval", "reversed_interval", M, "\\boxed{(2, 1]}", "(1, 2]", None),
    ("interval", "other_brackets", M, "\\boxed{[1, 2)}", "(1, 2]", None),
    ("interval", "open_for_closed", M, "\\boxed{(1, 2)}", "[1, 2]", None),
    (
        "interval",
        "union_reordered",
        M,
        "\\boxed{(5, \\infty) \\cup (-\\infty, 3)}",
        "(-\\infty, 3) \\cup (5, \\infty)",
        None,
    ),
    ("interval", "tuple_reversed", M, "\\boxed{(2, 1)}", "(1, 2)", None),
    ("interval", "list_for_interval", M, "\\boxed{1, 2}", "(1, 2]", None),
    ("interval", "wrong_inequality", M, "\\boxed{1 \\leq x < 2}", "(1, 2]", None),
    # a trailing ellipsis says "and so on": the value is not stated
    ("ellipsis", "integer", M, "\\boxed{3\\ldots}", "3", None),
    ("ellipsis", "dots", M, "\\boxed{3...}", "3", None),
    ("ellipsis", "cdots", M, "\\boxed{3 \\cdots}", "3", None),
    ("ellipsis", "unicode", M, "\\boxed{3…}", "3", None),
    ("ellipsis", "truncated_decimal", M, "\\boxed{1.41\\ldots}", "\\sqrt{2}", None),
    ("ellipsis", "truncated_pi", M, "\\boxed{3.14159\\ldots}", "\\pi", None),
    ("ellipsis", "after_expression", M, "\\boxed{\\sqrt{2}\\ldots}", "\\sqrt{2}", None),
    ("ellipsis", "after_list", M, "\\boxed{1, 2, 3, \\ldots}", "1, 2, 3", None),
    ("ellipsis", "in_set", M, "\\boxed{\\{1, 2, \\ldots\\}}", "\\{1, 2\\}", None),
    ("ellipsis", "non_repeating_decimal", M, "\\boxed{0.12\\ldots}", "0.12", None),
    ("ellipsis", "anchored", M, "The answer is 3...", "3", None),
    ("ellipsis", "exact", E, "\\boxed{yes\\ldots}", "yes", None),
    # plus-minus states two values: never one of them
    ("pm", "for_one_number", M, "\\boxed{3 \\pm 1}", "3", None),
    ("pm", "for_one_root", M, "\\boxed{\\pm 2}", "2", None),
    ("pm", "for_one_expression", M, "\\boxed{1 \\pm \\sqrt{2}}", "1 + \\sqrt{2}", None),
    ("pm", "wrong_pair", M, "\\boxed{1 \\pm \\sqrt{3}}", "1+\\sqrt{2}, 1-\\sqrt{2}", None),
    ("pm", "three_values", M, "\\boxed{1 \\pm \\sqrt{2}}", "\\{1, 1+\\sqrt{2}, 1-\\sqrt{2}\\}", None),
    # lettered choices
    ("choice", "other_letter", M, "\\boxed{C}", "B", None),
    ("choice", "two_letters", M, "\\boxed{B} or \\boxed{C}", "B", None),
    ("choice", "two_lines", M, "(B)\n(C)", "B", None),
    ("choice", "box_and_line", M, "\\boxed{B}\n(C)", "B", None),
    ("choice", "box_and_option_phrase", M, "\\boxed{B}. The correct option is C.", "B", None),
    ("choice", "letter_with_other_option_text", M, "The answer is (B) 40.", "B", OPTIONS),
    ("choice", "letter_with_words", M, "\\boxed{B because it is larger}", "B", OPTIONS),
    ("choice", "two_letters_one_box", M, "\\boxed{B, C}", "B", None),
    ("choice", "letter_in_prose", M, "\\boxed{(B) is wrong}", "B", OPTIONS),
    # matrices: entries compared, whatever the environment
    (
        "matrix",
        "wrong_entry",
        M,
        "\\boxed{\\begin{bmatrix} 1 & 2 \\\\ 3 & 5 \\end{bmatrix}}",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        None,
    ),
    (
        "matrix",
        "transposed",
        M,
        "\\boxed{\\begin{pmatrix} 1 & 3 \\\\ 2 & 4 \\end{pmatrix}}",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        None,
    ),
    (
        "matrix",
        "row_for_column",
        M,
        "\\boxed{\\begin{pmatrix} 1 & 2 \\end{pmatrix}}",
        "\\begin{pmatrix} 1 \\\\ 2 \\end{pmatrix}",
        None,
    ),
    (
        "matrix",
        "hedge_entry",
        M,
        "\\boxed{\\begin{pmatrix} 1 & \\text{maybe } 2 \\end{pmatrix}}",
        "\\begin{pmatrix} 1 & 2 \\end{pmatrix}",
        None,
    ),
    ("matrix", "tuple_for_matrix", M, "\\boxed{(1, 2)}", "\\begin{pmatrix} 1 & 2 \\end{pmatrix}", None),
    # inequalities
    ("inequality", "strict_for_closed", M, "\\boxed{x < 5}", "x \\leq 5", None),
    ("inequality", "other_direction", M, "\\boxed{x \\geq 5}", "x \\leq 5", None),
    ("inequality", "flipped_wrongly", M, "\\boxed{5 \\leq x}", "x \\leq 5", None),
    ("inequality", "other_variable", M, "\\boxed{y \\leq 5}", "x \\leq 5", None),
    ("inequality", "other_bound", M, "\\boxed{x \\leq 6}", "x \\leq 5", None),
    ("inequality", "number_for_inequality", M, "\\boxed{5}", "x \\leq 5", None),
    ("inequality", "inequality_for_number", M, "\\boxed{x \\geq 3}", "3", None),
    ("inequality", "hedged", M, "\\boxed{x \\leq 5 \\text{ probably}}", "x \\leq 5", None),
    # lists in order, each entry by its kind
    ("list", "unordered", M, "\\boxed{7, 3, 9}", "3, 7, 9", None),
    ("list", "missing", M, "\\boxed{3, 7}", "3, 7, 9", None),
    ("list", "tuples_reordered", M, "\\boxed{(3,4),(1,2)}", "(1, 2), (3, 4)", None),
    ("list", "tuple_entries_swapped", M, "\\boxed{(2,1),(3,4)}", "(1, 2), (3, 4)", None),
    ("list", "set_braces_for_a_list", M, "\\boxed{\\{9, 3, 7\\}}", "3, 7, 9", None),
    ("list", "exact_unordered", E, "\\boxed{9, 5, 2}", "2, 5, 9", None),
    # typography that is not typography: words and relations the gold does not have
    ("typography", "text_hedge", M, "\\boxed{\\textnormal{about } \\frac{1}{2}}", "\\frac{1}{2}", None),
    ("typography", "approx", M, "\\boxed{\\approx \\frac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", None),
    ("typography", "neq", M, "\\boxed{x \\neq 2}", "2", None),
    ("typography", "unknown_command", M, "\\boxed{\\foo{2}}", "2", None),
    ("typography", "question_mark", M, "\\boxed{\\sqrt{2}?}", "\\sqrt{2}", None),
    ("typography", "coloured_hedge", M, "\\boxed{\\textcolor{red}{about} 3}", "3", None),
    ("typography", "bold_second_value", M, "\\boxed{3 \\mathbf{4}}", "3", None),
    ("typography", "number_for_variable_gold", M, "\\boxed{2}", "2x", None),
]

# (class, id, reward, completion, gold, prompt): each must score 1.
HONEST = [
    # percents, by their meaning
    ("percent", "per_cent_for_proportion", M, "\\boxed{50 per cent}", "0.5", None),
    ("percent", "pct_for_proportion", M, "\\boxed{50 pct}", "\\frac{1}{2}", None),
    ("percent", "text_percent_for_percent", M, "\\boxed{28 \\text{ percent}}", "28\\%", None),
    ("percent", "mathrm_percent_for_percent", M, "\\boxed{28\\mathrm{percent}}", "28\\%", None),
    ("percent", "percentage_for_percent", M, "\\boxed{28 percentage}", "28\\%", None),
    ("percent", "percentage_points_for_percent", M, "\\boxed{5 percentage points}", "5\\%", None),
    ("percent", "figure_for_percent", M, "\\boxed{28}", "28\\%", None),
    ("percent", "sign_for_integer", M, "\\boxed{50\\%}", "50", None),
    ("percent", "text_sign", M, "\\boxed{50\\text{\\%}}", "0.5", None),
    ("percent", "minerva", M, "Final Answer: The final answer is $28 \\%$. I hope it is correct.", "28\\%", None),
    ("percent", "rounded_third", M, "\\boxed{33.33 per cent}", "\\frac{1}{3}", None),
    # units by the allow-list
    ("unit", "counted_noun_from_prompt", M, "\\boxed{7 apples}", "7", APPLES),
    ("unit", "counted_noun_singular", M, "\\boxed{1 apple}", "1", APPLES),
    ("unit", "counted_noun_marked", M, "\\boxed{7 \\text{ apples}}", "7", APPLES),
    ("unit", "counted_noun_anchored", M, "Tom has 7 apples, so the answer is 7 apples.", "7", APPLES),
    ("unit", "prompt_as_conversation", M, "\\boxed{7 apples}", "7", [{"role": "user", "content": APPLES}]),
    ("unit", "measure_of_named_dimension", M, "\\boxed{5 m}", "5", ROPE),
    ("unit", "measure_other_spelling", M, "\\boxed{5 \\text{ metres}}", "5", ROPE),
    ("unit", "measure_same_dimension", M, "\\boxed{500 cm}", "500", ROPE),
    ("unit", "measure_without_prompt", M, "\\boxed{12 \\text{ cm}}", "12", None),
    ("unit", "measure_attached", M, "\\boxed{12cm}", "12", None),
    ("unit", "square_measure", M, "\\boxed{6 \\text{ m}^2}", "6", "A rectangle is 2 m by 3 m. What is its area?"),
    ("unit", "square_words", M, "\\boxed{6 square metres}", "6", "A rectangle is 2 m by 3 m. What is its area?"),
    ("unit", "rate", M, "\\boxed{60 \\text{ km/h}}", "60", "A car covers 120 km in 2 hours. What is its speed?"),
    ("unit", "rate_per", M, "\\boxed{60 km per hour}", "60", "A car covers 120 km in 2 hours. What is its speed?"),
    ("unit", "time", M, "\\boxed{3 hours}", "3", "How long does the trip take?"),
    ("unit", "money_word", M, "\\boxed{18 dollars}", "18", "She sells 9 eggs at $2 each. How much does she earn?"),
    ("unit", "money_sign", M, "\\boxed{\\$18}", "18", "She sells 9 eggs at $2 each. How much does she earn?"),
    ("unit", "degrees", M, "\\boxed{90^\\circ}", "90", "Find angle ABC."),
    ("unit", "degrees_unicode", M, "\\boxed{90°}", "90", None),
    ("unit", "gold_unit", M, "\\boxed{10 \\text{ cm}}", "10 \\text{ cm}", "How long?"),
    ("unit", "gold_word", M, "\\boxed{12 marbles}", "12 marbles", None),
    ("unit", "generic_units", M, "\\boxed{20 \\text{ square units}}", "20", "Find the area of the square of side 2."),
    ("unit", "expression_with_unit", M, "\\boxed{2\\sqrt{3}\\text{ cm}}", "2\\sqrt{3}", None),
    # equations by variable name, in any order
    ("equation", "reordered_system", M, "\\boxed{y = 2, x = 1}", "x = 1, y = 2", None),
    ("equation", "same_order", M, "\\boxed{x = 1, y = 2}", "x=1, y=2", None),
    ("equation", "semicolon", M, "\\boxed{x = 1; y = 2}", "x = 1, y = 2", None),
    ("equation", "and", M, "\\boxed{x = 1 \\text{ and } y = 2}", "x = 1, y = 2", None),
    ("equation", "quad", M, "\\boxed{x=1 \\quad y=2}", "x = 1, y = 2", None),
    ("equation", "tuple_assignment", M, "\\boxed{(x, y) = (1, 2)}", "x = 1, y = 2", None),
    ("equation", "bare_value", M, "\\boxed{3}", "y = 3", None),
    ("equation", "same_variable", M, "\\boxed{y = 3}", "y = 3", None),
    ("equation", "roots_reordered", M, "\\boxed{x = 3, x = 2}", "x = 2, x = 3", None),
    ("equation", "roots_or", M, "\\boxed{x = 2 \\text{ or } x = 3}", "x = 2, x = 3", None),
    ("equation", "roots_as_membership", M, "\\boxed{x \\in \\{2, 3\\}}", "x = 2, x = 3", None),
    ("equation", "roots_bare", M, "\\boxed{3, 2}", "x = 2, x = 3", None),
    ("equation", "line", M, "\\boxed{y = 1 + 2x}", "y = 2x + 1", None),
    ("equation", "line_flipped", M, "\\boxed{2x + 1 = y}", "y = 2x + 1", None),
    ("equation", "line_true_chain", M, "\\boxed{y = 2(x + 1) - 1 = 2x + 1}", "y = 2x + 1", None),
    ("equation", "greek", M, "\\boxed{\\theta = \\frac{\\pi}{2}}", "\\theta = \\frac{\\pi}{2}", None),
    ("equation", "assignment_for_number", M, "\\boxed{x = 3}", "3", None),
    ("equation", "true_equation_for_number", M, "\\boxed{3 + 4 = 7}", "7", None),
    ("equation", "function_value", M, "\\boxed{f(2) = 5}", "5", None),
    # every box spelling, alone
    ("box", "space_before_brace", M, "\\boxed {3}", "3", None),
    ("box", "newline_before_brace", M, "\\boxed\n{3}", "3", None),
    ("box", "without_braces", M, "The answer is $\\boxed 3$.", "3", None),
    ("box", "fbox", M, "\\fbox{3}", "3", None),
    ("box", "framebox", M, "\\framebox[1.5cm]{3}", "3", None),
    ("box", "starred", M, "\\boxed*{3}", "3", None),
    ("box", "colorbox", M, "\\colorbox{yellow}{$3$}", "3", None),
    ("box", "nested", M, "\\boxed{\\boxed{3}}", "3", None),
    ("box", "repeated", M, "\\boxed{3}, so \\fbox{3}", "3", None),
    ("box", "layout_box_is_text", M, "It is 12 \\mbox{ cm}: \\boxed{12}", "12", None),
    ("box", "exact_fbox", E, "\\fbox{Yes}", "yes", None),
    ("box", "exact_space", E, "\\boxed {2, 5, 9}", "2, 5, 9", None),
    # answer phrases
    ("anchor", "minerva", M, "Final Answer: The final answer is $3$. I hope it is correct.", "3", None),
    ("anchor", "minerva_no_sentence", M, "Final Answer: The final answer is $\\frac{1}{2}$.", "0.5", None),
    (
        "anchor",
        "minerva_then_sentences",
        M,
        "Final Answer: The final answer is $72$. I hope it is correct. Let me know if you need more.",
        "72",
        None,
    ),
    (
        "anchor",
        "minerva_expression",
        M,
        "Final Answer: The final answer is $\\sqrt{2}$. I hope it is correct.",
        "\\sqrt{2}",
        None,
    ),
    ("anchor", "gsm8k", M, "3 + 4 = 7 and 7 * 10 = 70, so 72.\n#### 72", "72", None),
    ("anchor", "gsm8k_thousands", M, "#### 1,080", "1080", None),
    ("anchor", "gsm8k_dollar", M, "#### $18", "18", None),
    ("anchor", "gsm8k_and_box", M, "\\boxed{72}\n#### 72", "72", None),
    ("anchor", "bold_label", M, "**Answer:** 3", "3", None),
    ("anchor", "bold_label_colon_outside", M, "**Final Answer**: 3", "3", None),
    ("anchor", "heading", M, "### Final Answer\n\n3", "3", None),
    ("anchor", "heading_display_math", M, "**Final Answer**\n\\[ \\frac{3}{4} \\]", "0.75", None),
    ("anchor", "colon_newline", M, "The answer is:\n\n$3$", "3", None),
    ("anchor", "phrase_points_at_box", M, "The answer is $\\boxed{5}$ apples.", "5", None),
    ("anchor", "phrase_and_box_agree", M, "The answer is 5. Therefore \\boxed{5}.", "5", None),
    ("anchor", "phrase_is_prose", M, "The answer is 5 because 2 + 3 = 5, so \\boxed{5}", "5", None),
    ("anchor", "prose_before_box", M, "To answer this, add: 2 + 3 = 5. \\boxed{5}", "5", None),
    ("anchor", "would_be", M, "So the answer would be 5.", "5", None),
    ("anchor", "decimal_in_sentence", M, "The answer is 3.5 hours.", "3.5", None),
    ("anchor", "exact_box_and_phrase", E, "\\boxed{Paris}. The answer is Paris.", "paris", None),
    # intervals, tuples and sets, each by its own rules
    ("interval", "same", M, "\\boxed{(1, 2]}", "(1, 2]", None),
    ("interval", "spacing", M, "\\boxed{(1,2]}", "(1, 2]", None),
    ("interval", "membership", M, "\\boxed{x \\in (1, 2]}", "(1, 2]", None),
    ("interval", "inequality", M, "\\boxed{1 < x \\leq 2}", "(1, 2]", None),
    ("interval", "inequality_reversed", M, "\\boxed{2 \\geq x > 1}", "(1, 2]", None),
    ("interval", "half_line", M, "\\boxed{x \\geq 3}", "[3, \\infty)", None),
    ("interval", "left_right", M, "\\boxed{\\left( 1, 2 \\right]}", "(1, 2]", None),
    ("interval", "union", M, "\\boxed{(-\\infty, 3) \\cup (5, \\infty)}", "(-\\infty,3)\\cup(5,\\infty)", None),
    ("interval", "real_line", M, "\\boxed{\\mathbb{R}}", "(-\\infty, \\infty)", None),
    ("interval", "fraction_endpoint", M, "\\boxed{[\\frac{1}{2}, 3)}", "[0.5, 3)", None),
    ("interval", "tuple", M, "\\boxed{(1, 2)}", "(1, 2)", None),
    ("interval", "polar_tuple", M, "\\boxed{\\left( 3, \\frac{\\pi}{2} \\right)}", "(3, \\frac{\\pi}{2})", None),
    ("interval", "set_reordered", M, "\\boxed{\\{2, 1\\}}", "\\{1, 2\\}", None),
    ("interval", "set_bare", M, "\\boxed{2, 1}", "\\{1, 2\\}", None),
    ("interval", "set_words", M, "\\boxed{1 \\text{ and } 2}", "\\{1, 2\\}", None),
    ("interval", "empty_set", M, "\\boxed{\\varnothing}", "\\emptyset", None),
    # repeating decimals denote their value
    ("repeating", "overline_third", M, "\\boxed{0.\\overline{3}}", "\\frac{1}{3}", None),
    ("repeating", "overline_two_thirds", M, "\\boxed{0.\\overline{6}}", "2/3", None),
    ("repeating", "overline_after_digit", M, "\\boxed{0.1\\overline{6}}", "\\frac{1}{6}", None),
    ("repeating", "overline_block", M, "\\boxed{0.\\overline{142857}}", "\\frac{1}{7}", None),
    ("repeating", "overline_whole", M, "\\boxed{1.\\overline{3}}", "\\frac{4}{3}", None),
    ("repeating", "dot", M, "\\boxed{0.\\dot{3}}", "\\frac{1}{3}", None),
    ("repeating", "ldots", M, "\\boxed{0.333\\ldots}", "\\frac{1}{3}", None),
    ("repeating", "dots", M, "\\boxed{0.3333...}", "1/3", None),
    ("repeating", "block_ldots", M, "\\boxed{0.142857142857\\ldots}", "\\frac{1}{7}", None),
    ("repeating", "prefix_ldots", M, "\\boxed{0.58333\\ldots}", "\\frac{7}{12}", None),
    ("repeating", "gold_repeating", M, "\\boxed{\\frac{1}{3}}", "0.\\overline{3}", None),
    # plus-minus: two values
    ("pm", "same", M, "\\boxed{1 \\pm \\sqrt{2}}", "1 \\pm \\sqrt{2}", None),
    ("pm", "for_list", M, "\\boxed{1 \\pm \\sqrt{2}}", "1+\\sqrt{2}, 1-\\sqrt{2}", None),
    ("pm", "for_list_minus_first", M, "\\boxed{1 \\pm \\sqrt{2}}", "1-\\sqrt{2}, 1+\\sqrt{2}", None),
    ("pm", "for_set", M, "\\boxed{1 \\pm \\sqrt{2}}", "\\{1-\\sqrt{2}, 1+\\sqrt{2}\\}", None),
    ("pm", "integer_for_set", M, "\\boxed{\\pm 3}", "\\{-3, 3\\}", None),
    ("pm", "assignment", M, "\\boxed{x = \\pm 3}", "\\{3, -3\\}", None),
    (
        "pm",
        "in_fraction",
        M,
        "\\boxed{\\frac{-1 \\pm \\sqrt{5}}{2}}",
        "\\frac{-1+\\sqrt{5}}{2}, \\frac{-1-\\sqrt{5}}{2}",
        None,
    ),
    ("pm", "list_for_pm_gold", M, "\\boxed{2, -2}", "\\pm 2", None),
    # lettered choices
    ("choice", "letter", M, "\\boxed{B}", "B", None),
    ("choice", "parenthesised", M, "\\boxed{(B)}", "B", None),
    ("choice", "closing_paren", M, "\\boxed{B)}", "B", None),
    ("choice", "text", M, "\\boxed{\\text{(B)}}", "B", None),
    ("choice", "textbf", M, "\\boxed{\\textbf{B}}", "(B)", None),
    ("choice", "lower_case", M, "\\boxed{(b)}", "B", None),
    ("choice", "phrase", M, "The answer is (B).", "B", None),
    ("choice", "option_phrase", M, "The correct option is B.", "B", None),
    ("choice", "line", M, "Comparing the four numbers, the largest is:\n(B)", "B", None),
    ("choice", "bold_line", M, "**(B)**", "B", None),
    ("choice", "with_its_text", M, "The answer is (B) 42.", "B", OPTIONS),
    ("choice", "line_with_its_text", M, "(B) 42", "B", OPTIONS),
    ("choice", "gold_in_text", M, "\\boxed{C}", "\\text{(C)}", None),
    # typography is not content
    ("typography", "displaystyle", M, "\\boxed{\\displaystyle \\frac{1}{2}}", "\\frac{1}{2}", None),
    (
        "typography",
        "displaystyle_expression",
        M,
        "\\boxed{\\displaystyle \\frac{\\sqrt{3}}{2}}",
        "\\frac{\\sqrt{3}}{2}",
        None,
    ),
    ("typography", "cfrac", M, "\\boxed{\\cfrac{\\sqrt{3}}{2}}", "\\frac{\\sqrt{3}}{2}", None),
    ("typography", "cfrac_number", M, "\\boxed{\\cfrac{3}{4}}", "0.75", None),
    ("typography", "textnormal", M, "\\boxed{\\textnormal{Evelyn}}", "\\text{Evelyn}", None),
    ("typography", "textnormal_unit", M, "\\boxed{12\\textnormal{ cm}}", "12", None),
    ("typography", "left_right", M, "\\boxed{\\left(\\frac{1}{3}\\right)}", "\\frac{1}{3}", None),
    ("typography", "big_parentheses", M, "\\boxed{\\big(x+1\\big)^2}", "(x+1)^2", None),
    ("typography", "spacing", M, "\\boxed{2\\,\\sqrt{3}}", "2\\sqrt{3}", None),
    ("typography", "dfrac_tfrac", M, "\\boxed{\\dfrac{x}{2} + \\tfrac{1}{3}}", "\\frac{x}{2} + \\frac{1}{3}", None),
    ("typography", "braceless_fraction", M, "\\boxed{\\frac34}", "0.75", None),
    ("typography", "product_reordered", M, "\\boxed{yx + 1}", "xy + 1", None),
    ("typography", "mixed_number", M, "\\boxed{2\\frac{1}{2}}", "\\frac{5}{2}", None),
    ("typography", "mixed_number_slash", M, "\\boxed{2 1/2}", "2.5", None),
    ("typography", "thin_space_thousands", M, "\\boxed{12\\,345}", "12345", None),
    ("typography", "double_braces", M, "\\boxed{{3}}", "3", None),
    ("typography", "bold_number", M, "\\boxed{\\mathbf{3}}", "3", None),
    ("typography", "coloured", M, "\\boxed{\\textcolor{red}{\\frac{1}{2}}}", "0.5", None),
    ("typography", "underlined", M, "\\boxed{\\underline{42}}", "42", None),
    ("typography", "ell", M, "\\boxed{2\\ell}", "2\\ell", None),
    # matrices in any environment
    (
        "matrix",
        "bmatrix_for_pmatrix",
        M,
        "\\boxed{\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}}",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        None,
    ),
    (
        "matrix",
        "matrix_for_bmatrix",
        M,
        "\\boxed{\\begin{matrix} 1 & 2 \\\\ 3 & 4 \\end{matrix}}",
        "\\begin{bmatrix} 1 & 2 \\\\ 3 & 4 \\end{bmatrix}",
        None,
    ),
    (
        "matrix",
        "array_in_parentheses",
        M,
        "\\boxed{\\left(\\begin{array}{cc} 1 & 2 \\\\ 3 & 4 \\end{array}\\right)}",
        "\\begin{pmatrix} 1 & 2 \\\\ 3 & 4 \\end{pmatrix}",
        None,
    ),
    (
        "matrix",
        "column_vector",
        M,
        "\\boxed{\\begin{bmatrix} \\frac{1}{2} \\\\ -3 \\end{bmatrix}}",
        "\\begin{pmatrix} 0.5 \\\\ -3 \\end{pmatrix}",
        None,
    ),
    (
        "matrix",
        "expression_entries",
        M,
        "\\boxed{\\begin{Bmatrix} \\sqrt{2} & 0 \\\\ 0 & x \\end{Bmatrix}}",
        "\\begin{pmatrix} \\sqrt{2} & 0 \\\\ 0 & x \\end{pmatrix}",
        None,
    ),
    # inequalities in any spelling and direction
    ("inequality", "geq_for_ascii", M, "\\boxed{x \\geq 5}", "x >= 5", None),
    ("inequality", "ascii_for_geq", M, "\\boxed{x >= 5}", "x \\geq 5", None),
    ("inequality", "unicode", M, "\\boxed{x ≥ 5}", "x \\ge 5", None),
    ("inequality", "geqslant", M, "\\boxed{x \\geqslant 5}", "x \\geq 5", None),
    ("inequality", "lt", M, "\\boxed{x \\lt 5}", "x < 5", None),
    ("inequality", "flipped", M, "\\boxed{5 \\geq x}", "x \\leq 5", None),
    ("inequality", "flipped_strict", M, "\\boxed{3 < x}", "x > 3", None),
    ("inequality", "chain", M, "\\boxed{-1 < x < 2}", "-1 < x < 2", None),
    ("inequality", "chain_flipped", M, "\\boxed{2 > x > -1}", "-1 < x < 2", None),
    ("inequality", "interval", M, "\\boxed{[3, \\infty)}", "x \\geq 3", None),
    ("inequality", "fraction_bound", M, "\\boxed{x \\leq \\frac{1}{2}}", "x \\leq 0.5", None),
    # lists: order, and each entry by its own kind
    ("list", "same", M, "\\boxed{3, 7, 9}", "3, 7, 9", None),
    ("list", "brackets", M, "\\boxed{[3, 7, 9]}", "3, 7, 9", None),
    ("list", "tuples_spacing", M, "\\boxed{(1,2),(3,4)}", "(1, 2), (3, 4)", None),
    ("list", "tuples_more_spacing", M, "\\boxed{( 1 , 2 ) , ( 3 , 4 )}", "(1,2), (3,4)", None),
    ("list", "fractions", M, "\\boxed{\\frac{1}{2}, 0.25}", "0.5, \\frac{1}{4}", None),
    ("list", "exact_spacing", E, "\\boxed{2,5, 9}", "2, 5, 9", None),
    ("list", "exact_case", E, "\\boxed{\\text{Yes}}", "yes", None),
]


def _kwargs(prompt):
    return {} if prompt is None else {"prompts": [prompt]}


@pytest.mark.parametrize("case", ATTACKS, ids=[f"{c[0]}-{c[1]}" for c in ATTACKS])
def test_attack_scores_zero(case):
    _, _, reward, completion, gold, prompt = case
    assert reward([completion], answer=[gold], **_kwargs(prompt)) == [0.0]


@pytest.mark.parametrize("case", HONEST, ids=[f"{c[0]}-{c[1]}" for c in HONEST])
def test_honest_form_scores_one(case):
    _, _, reward, completion, gold, prompt = case
    assert reward([completion], answer=[gold], **_kwargs(prompt)) == [1.0]


def test_every_class_has_attacks_and_honest_forms():
    attack_classes = {c[0] for c in ATTACKS}
    honest_classes = {c[0] for c in HONEST}
    for name in (
        "percent",
        "unit",
        "equation",
        "box",
        "anchor",
        "interval",
        "choice",
        "matrix",
        "inequality",
        "list",
        "typography",
        "pm",
    ):
        assert name in attack_classes and name in honest_classes, name
    for cases in (ATTACKS, HONEST):
        assert len({(c[0], c[1]) for c in cases}) == len(cases)


# ------------------------------------------------------------------------------------------ the grammar, directly


@pytest.mark.parametrize(("gold", "kind"), [
    ("42", "number"), ("-3.5", "number"), ("\\frac{3}{4}", "number"), ("50\\%", "number"),
    ("12 \\text{ cm}", "number"),
    ("0.\\overline{3}", "number"), ("2\\frac{1}{2}", "number"), ("(B)", "choice"), ("C", "choice"),
    ("y = 2x + 1", "equation"), ("x = 1, y = 2", "equation"), ("y = 3", "equation"), ("x \\leq 5", "inequality"),
    ("-1 < x < 2", "inequality"), ("\\{1, 2\\}", "set"), ("\\emptyset", "set"), ("(1, 2]", "interval"),
    ("[0, \\infty)", "interval"), ("(1, 2)", "tuple"), ("[1, 2, 3]", "tuple"), ("3, 3, 7, 9", "list"),
    ("\\begin{bmatrix} 1 & 2 \\end{bmatrix}", "matrix"), ("Paris", "text"), ("\\sqrt{2}", "expression"),
    ("2x", "expression"), ("5m", "expression"),
])  # fmt: skip
def test_answer_kind(gold, kind):
    assert answer_kind(gold) == kind


@pytest.mark.parametrize(("text", "value", "percent"), [
    ("42", 42, False), ("\\$1,000", 1000, False), ("12{,}345", 12345, False), ("2,\\!000", 2000, False),
    (".5", Fraction(1, 2), False), ("-\\frac{1}{2}", Fraction(-1, 2), False), ("3/4", Fraction(3, 4), False),
    ("2\\frac{1}{2}", Fraction(5, 2), False), ("2 1/2", Fraction(5, 2), False), ("1.2e3", 1200, False),
    ("1.2 \\times 10^{3}", 1200, False), ("0.\\overline{3}", Fraction(1, 3), False),
    ("0.1\\overline{6}", Fraction(1, 6), False), ("0.333\\ldots", Fraction(1, 3), False),
    ("50 per cent", 50, True), ("50 pct", 50, True), ("50\\text{ percent}", 50, True),
    ("50 percentage points", 50, True), ("x = 3", 3, False), ("90^\\circ", 90, False), ("12 \\text{ cm}^2", 12, False),
])  # fmt: skip
def test_a_number_is_read_whole(text, value, percent):
    n = parse_number(text)
    assert n is not None and n.value == value and n.percent is percent


@pytest.mark.parametrize("text", [
    "3 + 4", "12/4", "\\frac{12}{4}", "\\frac{3}{1}", "2^3", "12 \\times 10^{2}", "3 or 4", "maybe 3", "~3",
    "\\approx 3",
    "3 approximately", "3 dozen", "3 squared", "3 tops", "3 incorrect", "3\\ldots", "1.41\\ldots", "0.12\\ldots",
    "3, 4", "2x", "3ab", "2\\frac{3}{2}", "--3", "3 \\pm 1", "3 \\text{ (approx.)}", "3 apples",
])  # fmt: skip
def test_what_is_not_a_number(text):
    assert parse_number(text) is None


def test_units_come_from_the_question_or_its_dimension():
    apples = UnitContext(gold="7", prompt=APPLES)
    assert parse_number("7 apples", units=apples) is not None and parse_number("7 cm", units=apples) is None
    rope = UnitContext(gold="5", prompt=ROPE)
    assert parse_number("5 m", units=rope) is not None and parse_number("5 kg", units=rope) is None
    assert parse_number("5 kg") is not None  # no prompt at all: any unit of measure
    squared = UnitContext(gold="3", prompt="What is 3 squared?")
    assert parse_number("3 squared", units=squared) is None  # words that operate on a number never are units


def test_equations_and_inequalities_are_read_by_name():
    assert read_equations("y = 1, x = 2") == [("y", "1"), ("x", "2")]
    assert read_equations("(x, y) = (1, 2)") == [("x", "1"), ("y", "2")]
    assert read_equations("x \\in \\{1, 2\\}") == [("x", "1"), ("x", "2")]
    assert inequality_interval("5 \\geq x") == ("x", ("(", "-\\infty", "5", "]"))
    assert inequality_interval("x + y < 3") is None


def test_distinct_candidates_refuse_and_agreeing_ones_pay():
    assert judge("\\boxed{50\\%}. The answer is 0.5.", "0.5") is True  # the same value, two spellings
    assert judge("\\boxed{y = 2, x = 1}. Answer: x = 1, y = 2", "x = 1, y = 2") is True
    assert judge("\\boxed{3}\n\\fbox{3}\n#### 3", "3") is True
    assert judge("\\boxed{3}\n\\fbox{3}\n#### 4", "3") is False
    assert judge("nothing stated", "3") is None  # no candidate: the caller decides (last_number_fallback)


# ------------------------------------------------------------------------------------------ the extractor


def test_every_box_spelling_is_a_candidate():
    text = "\\boxed{1} \\boxed {2} \\boxed\n{3} \\boxed 4. \\fbox{5} \\framebox[2cm]{6} \\boxed*{7} \\colorbox{red}{8}"
    assert [text[a:b] for a, b in box_spans(text)] == ["1", "2", "3", "4", "5", "6", "7", "8"]
    layout = "\\mbox{cm} \\makebox{x} \\boxed{\\boxed{9}}"
    assert [layout[a:b] for a, b in box_spans(layout)] == ["\\boxed{9}"]


def test_answer_phrases_are_candidates():
    text = "Final Answer: The final answer is $3$. I hope it is correct.\n#### 3\n**Answer:** 3"
    found = [(c.text, c.source) for c in answer_candidates(text)]
    assert ("$3$", "anchor") in found and ("3", "anchor") in found and len(found) == 4  # + "The final" (prose)
    assert [c.text for c in answer_candidates("The answer is \\boxed{3}.")] == ["3"]  # the phrase points at the box


MB = 1 << 20
SHAPES = {
    "nested_boxes": "\\boxed{" * (MB // 7) + "3" + "}" * (MB // 7),
    "unclosed_boxes": "\\boxed{3 " * (MB // 9),
    "whitespace_after_anchor": "The answer is" + " " * MB + "3",
    "newlines_after_anchor": "The answer is:" + " \n" * (MB // 2),
    "many_anchors": "The answer is " * (MB // 14),
    "many_answer_words": "answer " * (MB // 7),
    "many_gsm8k_marks": "#### " * (MB // 5),
    "many_choice_lines": "(A)\n" * (MB // 4),
    "many_box_commands": "\\fbox " * (MB // 6),
    "colour_box_openings": "\\colorbox{" * (MB // 10),
    "one_long_bare_box": "\\boxed " + "3" * MB,
    "braces": "{" * MB,
    "stars": "*a" * (MB // 2),
    "math_dollars": "The answer is $" + "." * MB,
}  # fmt: skip
BOUND_S, BOUND_MB = 2.0, 50


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_the_extractor_is_linear_on_1_mb(shape, monkeypatch):
    monkeypatch.setattr(extract, "MAX_SCAN_CHARS", 10 * MB)  # the mechanism, not the cap, must bound the work
    tracemalloc.start()
    try:
        start = time.perf_counter()
        answer_candidates(SHAPES[shape], choices=True)
        elapsed = time.perf_counter() - start
        peak = tracemalloc.get_traced_memory()[1] / MB
    finally:
        tracemalloc.stop()
    assert elapsed < BOUND_S and peak < BOUND_MB, (elapsed, peak)


@pytest.mark.parametrize("shape", SHAPES, ids=list(SHAPES))
def test_the_answer_rewards_are_bounded_on_1_mb(shape):
    text = SHAPES[shape]
    start = time.perf_counter()
    scores = [
        math_reward([text], answer=["3"])[0],
        math_reward([text], answer=["B"])[0],
        math_reward([text], answer=["3"], last_number_fallback=True)[0],
        exact_match_reward([text], answer=["3"])[0],
    ]
    assert all(s in (0.0, 1.0) for s in scores) and time.perf_counter() - start < 4 * BOUND_S


def test_the_symbolic_comparisons_of_one_completion_share_one_deadline():
    # 20 entries that each run to the deadline alone: together they still stop at it
    costly = "\\boxed{\\{" + ", ".join(["(x+y+z)^{100}"] * 20) + "\\}}"
    start = time.perf_counter()
    assert math_reward([costly], answer=["\\{x^2+1, x^3\\}"]) == [0.0]
    assert time.perf_counter() - start < 4 * BOUND_S
