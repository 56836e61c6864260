r"""The format, length and repetition rewards as allow-lists: attacks score 0, honest forms score 1, by class.

Each class is closed by one rule (docs/rewards.md, "Format, length and repetition"):

- no_think is the answer plus a budget of words, and no markup but formatting hides a word
  (``rewards.format.no_think_format``, ``rewards.markup.reply_shape``), whatever the markup is called or shaped;
- think needs words of reasoning in its block, markup and LaTeX command names being no words
  (``rewards.markup.prose_words``);
- a box holds an answer only when it holds a value (``rewards.visible.box_holds_answer``), not a placeholder;
- look-alike letters of any script fold by Unicode's confusables data (``rewards.confusables``);
- a length without token ids cannot be shortened by removing spaces (``rewards.length.estimated_tokens``);
- every reward runs in linear time and bounded memory on 1 MB of adversarial input.
"""

from __future__ import annotations

import gc
import time
import tracemalloc

import pytest

from rewards import (
    answer_format_reward,
    cosine_length_reward,
    mode_format_reward,
    repetition_penalty_reward,
    soft_overlong_reward,
    think_format_reward,
)
from rewards.confusables import FOLD, derive_fold, parse_confusables, unpack
from rewards.format import MAX_NO_THINK_WORDS, no_think_format
from rewards.length import estimated_tokens
from rewards.repetition import skeleton
from rewards.visible import box_holds_answer

BOX = "\\boxed{9}"
ANSWER = f"The answer is {BOX}."

# ------------------------------------------------------------------------------------------ no_think: attacks

# Reasoning a no_think reply must not carry, in every spelling of markup (and in none): each scores 0.
NO_THINK_ATTACKS = [
    ("renamed_block", f"<no_think>\n5 + 4 = 9\n</no_think>\n{ANSWER}"),
    ("space_in_tag", f"<reasoning >5 + 4 = 9</reasoning > {ANSWER}"),
    ("attribute", f'<reasoning mode="fast">5 + 4 = 9</reasoning>\n{ANSWER}'),
    ("attribute_holds_reasoning", f'<note why="5 + 4 = 9"/> {ANSWER}'),
    ("single_quoted_attribute", f"<r m='x'>\n</r> {ANSWER}"),
    ("self_closing_pair", f"<think/>5 + 4 = 9<think/> {ANSWER}"),
    ("self_closing_pair_spaced", f"<sep /> 5 plus 4 is 9 <sep /> {ANSWER}"),
    ("bracket_tags", f"[think]5 + 4 = 9[/think] {ANSWER}"),
    ("bracket_tags_unclosed_pair", f"[think] 5 + 4 = 9 [answer] {ANSWER}"),
    ("curly_tags", f"{{{{thought}}}}5 + 4 = 9{{{{/thought}}}} {ANSWER}"),
    ("cjk_brackets", f"【思考】5 + 4 = 9【/思考】 {ANSWER}"),
    ("guillemets", f"«reasoning»5 + 4 = 9«/reasoning» {ANSWER}"),
    ("fullwidth_angle", f"＜r＞5 + 4 = 9＜/r＞ {ANSWER}"),
    ("code_fence", f"```\n5 + 4 = 9\n```\n{ANSWER}"),
    ("code_fence_with_language", f"```text\nadd 5 and 4\n```\n{ANSWER}"),
    ("tilde_fence", f"~~~\n5 + 4 = 9\n~~~\n{ANSWER}"),
    ("unclosed_fence_after_answer", f"{ANSWER}\n```\nI added 5 and 4"),
    ("html_comment", f"<!-- 5 + 4 = 9 --> {ANSWER}"),
    ("unclosed_html_comment", f"{ANSWER} <!-- 5 + 4 = 9"),
    ("mismatched_tags", f"<reasoning>5 + 4 = 9</thinking> {ANSWER}"),
    ("closing_tag_only", f"5 + 4 = 9</reasoning>\n{ANSWER}"),
    ("opening_tag_after_answer", f"{ANSWER}\n<check>9 - 4 = 5"),
    ("block_after_answer", f"{ANSWER} <verify>9 - 4 = 5</verify>"),
    ("nested_block_beside_answer", f"<out><r>5 + 4 = 9</r> {ANSWER}</out>"),
    ("latex_environment", f"\\begin{{reasoning}}5 + 4 = 9\\end{{reasoning}} {ANSWER}"),
    ("align_environment", f"\\begin{{align}} 5 + 4 &= 9 \\end{{align}} {ANSWER}"),
    ("upper_case_tag", f"<THINK>5 + 4 = 9</THINK> {ANSWER}"),
    ("namespaced_tag", f"<x:think>5 + 4 = 9</x:think> {ANSWER}"),
    ("hyphenated_tag", f"<chain-of-thought>5 + 4 = 9</chain-of-thought> {ANSWER}"),
    ("details_block", f"<details>5 + 4 = 9</details> {ANSWER}"),
    ("script_block", f"<script>5 + 4 = 9</script> {ANSWER}"),
    ("think_block_with_reasoning", f"<think>\n5 + 4 = 9\n</think>\n{ANSWER}"),
    ("second_think_block", f"<think>\n\n</think>\n<think>5 + 4 = 9</think>{ANSWER}"),
    ("renamed_behind_empty_think", f"<think>\n\n</think>\n<no_think>5 + 4 = 9</no_think>\n{BOX}"),
    (
        "prose_derivation",
        f"First I add 5 and 4, which gives 9. Then I check it: 9 - 4 = 5, which is right, so {ANSWER}",
    ),
    ("prose_after_answer", f"{ANSWER} To see why, add five and four together and then check the sum twice over."),
    ("reasoning_in_box_text", "\\boxed{\\text{I add five and four, which gives nine, and I checked it twice, so} 9}"),
    (
        "tag_names_spell_reasoning",
        f"<five/><plus/><four/><is/><nine/><so/><the/><answer/><is/><nine/><ok/><x/><y/> {BOX}",
    ),
    ("guillemet_words", "«five» «plus» «four» «is» «nine» «so» «the» «answer» «is» «nine» «done» «ok» «yes» " + BOX),
    ("no_box", "The answer is 9."),
    ("placeholder_box", "The answer is \\boxed{?}."),
    ("two_answers", "The answer is \\boxed{9} or \\boxed{8}."),
]

# Honest no_think replies (a direct answer in a standard form, with or without formatting): each scores 1.
NO_THINK_HONEST = [
    ("gold", ANSWER),
    ("bare_box", BOX),
    ("empty_think_block", f"<think>\n\n</think>\n{ANSWER}"),
    ("invisible_think_block", f"<think>\u200b</think>{ANSWER}"),
    ("bold_html", f"The answer is <b>{BOX}</b>."),
    ("strong_and_em", f"<strong>Answer:</strong> <em>{BOX}</em>"),
    ("superscript", f"Since 3<sup>2</sup> = 9, the answer is {BOX}."),
    ("subscript", f"The value of x<sub>1</sub> is {BOX}."),
    ("span_with_attributes", f'<span class="answer">{BOX}</span>'),
    ("line_break", f"Answer:<br/>{BOX}"),
    ("paragraph", f"<p>{ANSWER}</p>"),
    ("inline_code", f"The answer is <code>{BOX}</code>."),
    ("markdown_bold", f"**Answer:** {BOX}"),
    ("markdown_heading", f"### Answer\n{BOX}"),
    ("math_delimiters", "The answer is $\\boxed{9}$."),
    ("display_math", "$$\\boxed{9}$$"),
    ("minerva_line", f"Final Answer: The final answer is ${BOX}$. I hope it is correct."),
    ("one_line_justification", f"5 + 4 = 9, so the answer is {BOX}."),
    ("comparison_signs", f"Since 3 < 5 > 1, the answer is {BOX}."),
    ("less_than_without_space", f"As 2<3 holds, {BOX}"),
    ("answer_wrapper_tag", f"<answer>{BOX}</answer>"),
    ("answer_wrapper_with_sentence", f"<answer>The answer is {BOX}</answer>"),
    ("empty_unknown_block", f"<scratch>\n</scratch>\n{ANSWER}"),
    ("lone_self_closing_tag", f"<done/> {ANSWER}"),
    ("interval_in_prose", "The interval [2, 5] has length \\boxed{3}."),
    ("units_in_box", "The side is \\boxed{12\\text{ cm}}."),
    ("text_answer", "The capital of France is \\boxed{\\text{Paris}}."),
    ("chinese", f"答案是 {BOX}。"),
    ("agreeing_boxes", "\\boxed{9}, so \\boxed{ 9 }"),
    ("letter_choice", "The correct option is \\boxed{B}."),
    ("trailing_newlines", f"{ANSWER}\n\n"),
]

NO_THINK_ATTACKS += [("megabyte_of_empty_fences", "```\n```\n" * 100_000 + ANSWER)]  # no direct answer: too long


@pytest.mark.parametrize("case", NO_THINK_ATTACKS, ids=[c[0] for c in NO_THINK_ATTACKS])
def test_no_think_attack_scores_zero(case):
    from align.eval.generative import is_formatted

    assert mode_format_reward([case[1]], mode=["no_think"]) == [0.0]
    assert not is_formatted(case[1], "no_think")


@pytest.mark.parametrize("case", NO_THINK_HONEST, ids=[c[0] for c in NO_THINK_HONEST])
def test_no_think_honest_form_scores_one(case):
    from align.eval.generative import is_formatted

    assert mode_format_reward([case[1]], mode=["no_think"]) == [1.0]
    assert is_formatted(case[1], "no_think")


@pytest.mark.parametrize("n, ok", [(MAX_NO_THINK_WORDS - 3, True), (MAX_NO_THINK_WORDS - 2, False)])
def test_no_think_budget_counts_every_word_outside_the_answer(n, ok):
    """The gold sentence's 3 words plus ``n`` more: the budget is the knob's, in words."""
    text = " ".join(["word"] * n) + " " + ANSWER
    assert no_think_format(text) is ok
    assert mode_format_reward([text], mode=["no_think"], max_no_think_words=MAX_NO_THINK_WORDS + 10) == [1.0]
    with pytest.raises(ValueError, match="max_no_think_words"):
        mode_format_reward([text], mode=["no_think"], max_no_think_words=-1)


# ------------------------------------------------------------------------------------------ think

THINK_ATTACKS = [
    ("empty_block", f"<think>\n\n</think>\n{ANSWER}"),
    ("tags_only", f"<think><b></b><i></i><u></u></think>\n{ANSWER}"),
    ("self_closing_tags_only", f"<think><step/><step/><step/></think>\n{ANSWER}"),
    ("latex_commands_only", f"<think>\\frac{{}}{{}} \\sqrt{{}} \\quad \\cdots</think>\n{ANSWER}"),
    ("attributes_only", f'<think><x a="1" b="2" c="3"/></think>\n{ANSWER}'),
    ("two_words", f"<think>add them</think>\n{ANSWER}"),
    ("block_not_opening", f"Let me see. <think>5 + 4 = 9, so nine</think>\n{ANSWER}"),
    ("renamed_block", f"<reasoning>5 + 4 = 9, so nine</reasoning>\n{ANSWER}"),
    ("no_block", ANSWER),
    ("two_blocks", f"<think>5 + 4 = 9</think><think>so nine it is</think>{ANSWER}"),
    ("answer_in_block_only", "<think>5 + 4 = 9 so \\boxed{9}</think>\nnine"),
    ("placeholder_answer", "<think>5 + 4 = 9, so nine</think>\n\\boxed{\\ldots}"),
    ("unclosed_block", "<think>5 + 4 = 9, so nine \\boxed{9}"),
]

THINK_HONEST = [
    ("plain", f"<think>\n5 + 4 = 9, so the sum is nine.\n</think>\n{ANSWER}"),
    ("inline_html_in_reasoning", f"<think>\n3<sup>2</sup> is <b>nine</b> here\n</think>\n{ANSWER}"),
    ("latex_reasoning", f"<think>\n$\\frac{{18}}{{2}} = 9$ so nine\n</think>\n{ANSWER}"),
    ("chinese_reasoning", f"<think>\n五加四等于九\n</think>\n{ANSWER}"),
    ("long_answer_part", f"<think>\nadd five and four\n</think>\nAdding five and four gives nine. {ANSWER}"),
    ("html_answer", f"<think>\nadd five and four\n</think>\nThe answer is <b>{BOX}</b>."),
]


@pytest.mark.parametrize("case", THINK_ATTACKS, ids=[c[0] for c in THINK_ATTACKS])
def test_think_attack_scores_zero(case):
    assert mode_format_reward([case[1]], mode=["think"]) == [0.0]


@pytest.mark.parametrize("case", THINK_HONEST, ids=[c[0] for c in THINK_HONEST])
def test_think_honest_form_scores_one(case):
    assert mode_format_reward([case[1]], mode=["think"]) == [1.0]
    assert think_format_reward([case[1]]) == [1.0]


# ------------------------------------------------------------------------------------------ boxes

PLACEHOLDER_BOXES = [
    "?", "\\text{?}", "\\text{ ? }", "\\textbf{?}", "\\mathrm{?}", "\\mathbf{?}", "\\ldots", "\\dots", "\\cdots",
    "\\vdots", "\\ddots", "\\dotsc", "\\text{\\ldots}", "(\\ldots)", "⋯", "…", "\\text{...}", "\\cdot",
    "\\cdot\\cdot\\cdot", "\\text{N/A}", "\\text{n/a}", "\\text{n.a.}", "\\_\\_\\_", "\\_", "\\square", "\\Box",
    "\\blacksquare", "□", "\\text{--}", "---", "\\text{—}", "\\%", "\\$", "\\#", "*", "!", "''", "\\foo",
    "\\underline{\\hspace{1cm}}", "\\begin{pmatrix}\\end{pmatrix}", "\\boxed{}", "\\,", "\\phantom{3}",
]  # fmt: skip

ANSWER_BOXES = [
    "3", "-3", "x", "x = 7", "\\frac{1}{2}", "\\text{yes}", "\\text{none}", "\\text{undefined}", "\\text{no solution}",
    "\\text{(B)}", "(A)", "\\textbf{(C)}", "\\text{I}", "\\pi", "\\infty", "\\emptyset", "\\varnothing", "\\{\\}",
    "[]", "\\alpha", "\\geq", "<", "=", "-", "\\pm 2", "\\times", "\\sin", "\\mathbb{R}", "\\sqrt{2}",
    "0.\\overline{3}", "0.333\\ldots", "1, 2, \\ldots, 10", "50\\%", "\\$5", "(1, 2]", "\\text{Paris}", "七", "Ⅻ", "½",
    "\\checkmark", "\\begin{pmatrix}1&2\\end{pmatrix}", "\\mathbf{v}", "\\hat{x}", "\\overline{AB}", "\\phantom{-}3",
    "1{,}000", "\\left(1, 2\\right)", "\\dfrac{\\sqrt{3}}{2}", "\\text{12 cm}", "\\operatorname{id}", "\\text{$x$}",
    "∞",
]  # fmt: skip


@pytest.mark.parametrize("box", PLACEHOLDER_BOXES)
def test_a_box_without_an_answer_pays_nothing(box):
    text = f"<think>\nfive and four make nine\n</think>\nThe answer is \\boxed{{{box}}}."
    assert not box_holds_answer(box)
    assert answer_format_reward([text]) == [0.0]
    assert think_format_reward([text]) == [0.0]
    assert mode_format_reward([f"The answer is \\boxed{{{box}}}."], mode=["no_think"]) == [0.0]


@pytest.mark.parametrize("box", ANSWER_BOXES)
def test_a_box_with_an_answer_pays(box):
    text = f"<think>\nfive and four make nine\n</think>\nThe answer is \\boxed{{{box}}}."
    assert box_holds_answer(box)
    assert answer_format_reward([text]) == [1.0]
    assert mode_format_reward([f"The answer is \\boxed{{{box}}}."], mode=["no_think"]) == [1.0]


# ------------------------------------------------------------------------------------------ look-alike loops

LOOP = "so the cat sat on the mat and "
PLAIN = LOOP * 8

# One spelling of the loop per script (or kind of look-alike); mixed with the plain loop, each must score exactly
# the plain loop's penalty.
LOOK_ALIKE_SPELLINGS = [
    ("cyrillic_small", "ѕо the саt ѕаt оn the mаt аnd "),
    ("cyrillic_capitals", "SО ТНЕ САТ SАТ ОN ТНЕ МАТ АND "),
    ("cyrillic_small_capitals", "so тнe cat sat on тнe мat and "),
    ("greek_small", "sο τhe cατ sατ οn τhe mατ αnd "),
    ("greek_capitals", "SΟ ΤΗΕ CΑΤ SΑΤ ΟΝ ΤΗΕ ΜΑΤ ΑΝD "),
    ("greek_lunate_sigma", "so the ϲat sat on the mat and "),
    ("armenian", "sօ the cat sat օn the mat and "),
    ("cherokee_capitals", "SO ᎢᎻᎬ ᏟᎪᎢ ᏚᎪᎢ ON ᎢᎻᎬ ᎷᎪᎢ ᎪND "),
    ("lisu", "ꓢO ꓔꓧꓰ ꓚꓮꓔ ꓢꓮꓔ Oꓠ ꓔꓧꓰ ꓟꓮꓔ ꓮꓠꓓ "),
    ("coptic", "sⲟ the cat sat ⲟn the mat and "),
    ("latin_small_capitals", "ꜱᴏ ᴛʜᴇ ᴄᴀᴛ ꜱᴀᴛ ᴏɴ ᴛʜᴇ ᴍᴀᴛ ᴀɴᴅ "),
    ("latin_variants", "so the cɑt sɑt on the mɑt ɑnd "),
    ("canadian_and_tifinagh", "so the cat sat on the mat and ".replace("mat", "ᗰat").replace("and", "anᗞ")),
    ("palochka_and_dotless_i", "so the cat sat on the mat and ".replace("the", "thе")),
    ("fullwidth_and_math", "ｓｏ ｔｈｅ 𝐜𝐚𝐭 𝑠𝑎𝑡 on the mat and "),
    ("mixed_per_letter", "ѕο τhе cаτ ѕаt оn τhe mаτ аnԁ "),
]


@pytest.mark.parametrize("case", LOOK_ALIKE_SPELLINGS, ids=[c[0] for c in LOOK_ALIKE_SPELLINGS])
def test_a_loop_in_look_alike_letters_is_penalised_like_the_plain_one(case):
    disguised = (LOOP + case[1]) * 4
    assert skeleton(case[1]).split() == LOOP.split()
    assert repetition_penalty_reward([disguised]) == repetition_penalty_reward([PLAIN])
    assert repetition_penalty_reward([disguised], ngram_size=1) == repetition_penalty_reward([PLAIN], ngram_size=1)


HONEST_TEXTS = [
    "Сначала сложим три и четыре, получим семь, затем проверим условие задачи.",
    "Πρώτα προσθέτουμε τρία και τέσσερα και παίρνουμε επτά, μετά ελέγχουμε.",
    "Առաջին հերթին գումարում ենք երեքը և չորսը, ստանում ենք յոթ։",
    "Zuerst addieren wir drei und vier und erhalten sieben, dann prüfen wir.",
    "Łódź i Kraków leżą w Polsce, a Gdańsk nad morzem.",
]


@pytest.mark.parametrize("text", HONEST_TEXTS)
def test_honest_text_keeps_its_words_apart(text):
    import re

    words = re.findall(r"[^\W_]+", text.lower())
    assert len(set(skeleton(text).split())) >= len(set(words)) - 1  # at most one pair of distinct words merged
    assert repetition_penalty_reward([text], ngram_size=2) == [0.0]


# Real lines of Unicode's confusables.txt (14.0.0): the rule derives each class's spelling from them.
CONFUSABLES_SAMPLE = """\
0430 ;\t0061 ;\tMA\t# ( а → a ) CYRILLIC SMALL LETTER A → LATIN SMALL LETTER A
0410 ;\t0041 ;\tMA\t# ( А → A ) CYRILLIC CAPITAL LETTER A → LATIN CAPITAL LETTER A
0049 ;\t006C ;\tMA\t# ( I → l ) LATIN CAPITAL LETTER I → LATIN SMALL LETTER L
0406 ;\t006C ;\tMA\t# ( І → l ) CYRILLIC CAPITAL LETTER BYELORUSSIAN-UKRAINIAN I → LATIN SMALL LETTER L
05D5 ;\t006C ;\tMA\t# ( ו → l ) HEBREW LETTER VAV → LATIN SMALL LETTER L
006D ;\t0072 006E ;\tMA\t# ( m → rn ) LATIN SMALL LETTER M → LATIN SMALL LETTER R, LATIN SMALL LETTER N
0442 ;\t1D1B ;\tMA\t# ( т → ᴛ ) CYRILLIC SMALL LETTER TE → LATIN LETTER SMALL CAPITAL T
03C4 ;\t1D1B ;\tMA\t# ( τ → ᴛ ) GREEK SMALL LETTER TAU → LATIN LETTER SMALL CAPITAL T
0422 ;\t0054 ;\tMA\t# ( Т → T ) CYRILLIC CAPITAL LETTER TE → LATIN CAPITAL LETTER T
03A4 ;\t0054 ;\tMA\t# ( Τ → T ) GREEK CAPITAL LETTER TAU → LATIN CAPITAL LETTER T
03F2 ;\t0063 ;\tMA\t# ( ϲ → c ) GREEK LUNATE SIGMA SYMBOL → LATIN SMALL LETTER C
01A7 ;\t0032 ;\tMA\t# ( Ƨ → 2 ) LATIN CAPITAL LETTER TONE TWO → DIGIT TWO
039B ;\t028C ;\tMA\t# ( Λ → ʌ ) GREEK CAPITAL LETTER LAMDA → LATIN SMALL LETTER TURNED V
"""


def test_the_fold_is_derived_by_the_rule():
    fold = derive_fold(parse_confusables(CONFUSABLES_SAMPLE))
    assert fold["а"] == "a" and fold["А"] == "A"  # rule 2: the ASCII letter of the same prototype
    assert fold["І"] == "I" and fold["ו"] == "l"  # I and l share a prototype: the source's case decides
    assert fold["т"] == "t" and fold["τ"] == "t" and fold["ᴛ"] == "t"  # rule 3: the class reads as its capitals
    assert fold["ϲ"] == "c"  # kept although NFKC changes it (to ς, which looks otherwise)
    assert "Ƨ" not in fold and "Λ" not in fold  # never a digit; never a split from the small letter
    assert fold["ɴ"] == "n"  # rule 5: a small capital by its name
    with pytest.raises(ValueError, match="source ; prototype"):
        parse_confusables("0430 0061\n")


def test_the_packed_table_keeps_the_rules_invariants():
    fold = unpack(FOLD)
    assert len(fold) > 500
    assert all(not src.isascii() and src.isalpha() for src in fold)  # ASCII is never folded: TRL parity
    assert all(len(dst) == 1 and dst.isalpha() for dst in fold.values())  # a letter folds into one letter
    ascii_targets = sum(1 for dst in fold.values() if dst.isascii())
    assert ascii_targets > 300  # most classes have an ASCII spelling


# ------------------------------------------------------------------------------------------ length


@pytest.mark.parametrize(
    "text, tokens",
    [
        ("w " * 5, 5),  # words win on short words
        ("the cat sat on the mat", 6),
        ("x" * 400, 100),  # no spaces: 400 bytes are 100 tokens, not one word
        ("thecatsatonthemat" * 10, 43),
        ("三加四等于七", 5),  # 18 bytes
        ("", 0),
        ("a\u200bb\u200bc", 3),  # invisible characters cost tokens too
    ],
)
def test_estimated_tokens(text, tokens):
    assert estimated_tokens(text) == tokens


def test_removing_spaces_does_not_shorten_a_completion():
    spaced, unspaced = "word " * 300, "word" * 300
    budget = {"max_completion_len": 200, "soft_punish_cache": 50}
    assert soft_overlong_reward([spaced, unspaced], **budget) == [-1.0, -1.0]
    assert soft_overlong_reward([unspaced], completion_ids=[[1] * 10], **budget) == [0.0]  # ids still win
    long_right = cosine_length_reward(["x" * 4000 + " \\boxed{4}"], answer=["4"], max_len=1000)
    short_right = cosine_length_reward(["\\boxed{4}"], answer=["4"], max_len=1000)
    assert long_right == [0.5] and short_right[0] > 0.99


# ------------------------------------------------------------------------------------------ bounds

MB = 1 << 20


def _fill(unit: str) -> str:
    return (unit * (MB // len(unit) + 1))[:MB]


SHAPES = {
    "angle_brackets": _fill("<"),
    "unclosed_tags": _fill("<a "),
    "tag_pairs": _fill("<r>"),
    "closing_tags": _fill("</r>"),
    "self_closing_tags": _fill("<r/>"),
    "bracket_tags": _fill("[r]"),
    "fences": _fill("```\n"),
    "comment_openings": _fill("<!--"),
    "nested_braces": "{" * (MB // 2) + "}" * (MB // 2),
    "whitespace": " " * MB,
    "anchor_then_whitespace": "The answer is" + " " * MB,
    "many_boxes": _fill("\\boxed{1}"),
    "nested_box_openings": _fill("\\boxed{"),
    "one_huge_box": "\\boxed{" + _fill("\\phantom x") + "}",
    "think_openings": _fill("<think>"),
    "long_think_block": "<think>" + _fill("a ") + "</think>\\boxed{3}",
    "unspaced": _fill("a"),
    "words": _fill("w "),
}
# Each shape again with an answer after it, so that no early refusal hides the parser's cost.
SHAPES.update(
    {
        f"{name}_then_answer": text + " The answer is \\boxed{9}."
        for name, text in list(SHAPES.items())
        if name in ("fences", "comment_openings", "self_closing_tags", "whitespace", "nested_braces", "tag_pairs")
    }
)

BUDGET = {"max_completion_len": 100, "soft_punish_cache": 10}
REWARDS = {
    "think_format_reward": lambda t: think_format_reward([t]),
    "answer_format_reward": lambda t: answer_format_reward([t]),
    "mode_format_reward_think": lambda t: mode_format_reward([t], mode=["think"]),
    "mode_format_reward_no_think": lambda t: mode_format_reward([t], mode=["no_think"]),
    "repetition_penalty_reward": lambda t: repetition_penalty_reward([t]),
    "soft_overlong_reward": lambda t: soft_overlong_reward([t], **BUDGET),
}


@pytest.mark.parametrize("name", REWARDS)
def test_every_reward_is_linear_and_bounded_on_a_megabyte_of_each_shape(name):
    """Time under 2 s a call and a traced peak under 50 MB (traced separately: tracing slows allocation)."""
    reward = REWARDS[name]
    for shape, text in SHAPES.items():
        start = time.perf_counter()
        score = reward(text)[0]
        elapsed = time.perf_counter() - start
        assert isinstance(score, float), (shape, score)
        assert elapsed < 2.0, f"{name} took {elapsed:.2f} s on 1 MB of {shape}"
    for shape, text in SHAPES.items():
        gc.collect()
        tracemalloc.start()
        try:
            reward(text)
            peak = tracemalloc.get_traced_memory()[1]
        finally:
            tracemalloc.stop()
        assert peak < 50 * MB, f"{name} peaked at {peak / MB:.0f} MB on 1 MB of {shape}"
