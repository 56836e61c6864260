r"""Red team, format and repetition: what is invisible or only looks different earns nothing.

Four classes of hack, each closed by one rule (rewards/format.py, rewards/repetition.py):

- invisible reasoning: a think block of characters that show nothing (Hangul fillers, blank Braille, zero-width
  characters, tag characters, variation selectors, lone combining marks, the tatweel) is no reasoning;
- empty-looking boxes: ``\boxed{}`` holding only LaTeX that prints nothing (spacing, ``\phantom``, empty groups,
  invisible characters) is no answer;
- renamed reasoning: a no_think answer that reasons inside a block under another tag name (``<no_think>...``)
  reasons all the same;
- disguised loops: a loop spelt in look-alike letters of other scripts, fullwidth or mathematical letters, or
  with invisible characters inside its words, is penalised exactly like the plain ASCII loop.

Each honest form (reasoning in other scripts, real LaTeX answers, multilingual prose) keeps its full score.
"""

from __future__ import annotations

import re
import time

import pytest

from rewards import answer_format_reward, mode_format_reward, repetition_penalty_reward, think_format_reward
from rewards.format import DEFAULT_IGNORABLE, box_is_visible, reasoning_words
from rewards.repetition import skeleton

BOX = "\nThe answer is \\boxed{7}."


def _think(reasoning: str, answer: str = BOX) -> str:
    return f"<think>\n{reasoning}\n</think>{answer}"


def _format_scores(completion: str) -> list:
    return [
        think_format_reward([completion])[0],
        answer_format_reward([completion])[0],
        mode_format_reward([completion], mode=["think"])[0],
    ]


# ------------------------------------------------------------------------------------------ invisible reasoning

# Each block would hold three "words" if every character Python calls a letter counted.
INVISIBLE_THINK = [
    ("hangul_filler_u3164", "\u3164 \u3164\u3164 \u3164"),
    ("hangul_choseong_filler_u115f", "\u115f \u115f \u115f"),
    ("hangul_jungseong_filler_u1160", "\u1160 \u1160 \u1160"),
    ("halfwidth_hangul_filler_uffa0", "\uffa0 \uffa0 \uffa0"),
    ("braille_blank_u2800", "\u2800\u2800 \u2800 \u2800"),
    ("mongolian_vowel_separator_u180e", "\u180e \u180e \u180e"),
    ("zero_width_space_joiners", "\u200b \u200c \u200d"),
    ("word_joiner_and_invisible_operators", "\u2060 \u2061\u2062 \u2063\u2064"),
    ("byte_order_mark_ufeff", "\ufeff \ufeff \ufeff"),
    ("combining_marks_alone", "\u0301\u0301 \u0308 \u0332\u0336"),
    ("tag_characters", "\U000e0074\U000e0068 \U000e0069\U000e006e \U000e006b"),
    ("variation_selectors", "\ufe0f \ufe0e \U000e0100"),
    ("soft_hyphens_and_bidi_controls", "\u00ad \u202e\u202c \u2066\u2069"),
    ("mixed_fillers", "\u3164\u200b \u2800\u0301 \ufeff\U000e0020 \uffa0\ufe0f"),
]


@pytest.mark.parametrize("hack", INVISIBLE_THINK, ids=[h[0] for h in INVISIBLE_THINK])
def test_invisible_think_block_is_no_reasoning(hack):
    completion = _think(hack[1])
    assert reasoning_words(hack[1]) == 0
    assert think_format_reward([completion]) == [0.0]
    assert mode_format_reward([completion], mode=["think"]) == [0.0]
    # nothing visible is no reasoning at all: a no_think row may carry such a block like an empty one
    assert mode_format_reward([completion], mode=["no_think"]) == [1.0]


# Marks with ink that are no letter of a word: the tatweel (kashida), extenders and IPA modifier letters.
MODIFIER_THINK = [
    ("tatweel_and_extenders", "\u0640\u0640 \u0640 \u07fa \u30fc\u30fc"),
    ("ipa_modifier_letters", "\u02c8\u02c8 \u02cc \u02d0"),
]


@pytest.mark.parametrize("hack", MODIFIER_THINK, ids=[h[0] for h in MODIFIER_THINK])
def test_modifier_letters_alone_are_no_words(hack):
    assert reasoning_words(hack[1]) == 0
    assert think_format_reward([_think(hack[1])]) == [0.0]
    assert mode_format_reward([_think(hack[1])], mode=["think"]) == [0.0]


# One visible word dressed up as the three a think row needs: invisible characters neither make nor split words.
PADDED_THINK = [
    ("zero_width_split_word", "c\u200bo\u200bu\u200bn\u200bt"),
    ("word_plus_fillers", "count \u3164 \u2800"),
    ("word_plus_tag_and_marks", "count \U000e0061\U000e0062 \u0301\u0302"),
    ("soft_hyphen_split_word", "co\u00adun\u00adted"),
]


@pytest.mark.parametrize("hack", PADDED_THINK, ids=[h[0] for h in PADDED_THINK])
def test_invisible_padding_does_not_reach_min_think_words(hack):
    assert reasoning_words(hack[1]) == 1
    assert mode_format_reward([_think(hack[1])], mode=["think"]) == [0.0]


# ------------------------------------------------------------------------------------------ empty-looking boxes

EMPTY_BOXES = [
    ("tilde", "~"),
    ("backslash_space", "\\ "),
    ("quad", "\\quad"),
    ("thin_space", "\\,"),
    ("spacing_run", "\\qquad\\;\\!\\:\\>"),
    ("empty_group", "{}"),
    ("nested_empty_groups", "{{ }{}}"),
    ("empty_text", "\\text{}"),
    ("nested_empty_text_with_gaps", "\\text {\\mathrm{\\text {}}}"),
    ("text_of_spaces", "\\textbf{ }\\mbox{}\\mathrm{\\,}"),
    ("phantom", "\\phantom{3}"),
    ("hphantom_vphantom", "\\hphantom{12}\\vphantom x"),
    ("phantom_in_text", "\\text{\\phantom{yes}}"),
    ("hspace", "\\hspace{1em}"),
    ("hspace_star_and_tilde", "\\hspace*{2cm}~\\text{\u200b}"),
    ("kern_and_glue", "\\kern1em\\hskip 2pt plus 1fil\\mkern{3mu}"),
    ("strut_rule", "\\rule{0pt}{1em}\\strut"),
    ("colour_without_content", "\\color{white}"),
    ("math_shift", "$ $"),
    ("null_delimiters", "\\left.\\right."),
    ("line_break", "\\\\"),
    ("style_switches", "\\displaystyle\\bf\\small"),
    ("comment", "%3\n"),
    ("sentence_punctuation", "."),
    ("zero_width_space", "\u200b"),
    ("hangul_filler", "\u3164"),
    ("braille_blank", "\u2800"),
    ("lone_combining_mark", "\u0301"),
    ("blanks_in_text", "\\text{\u2800\u3000}\\mathrm{\u0301\u00a0}"),
    ("discretionary_hyphen_italic_correction", "\\-\\/\\@"),
    ("nested_empty_box", "\\boxed{}"),
]


@pytest.mark.parametrize("hack", EMPTY_BOXES, ids=[h[0] for h in EMPTY_BOXES])
def test_empty_looking_box_is_no_answer(hack):
    completion = _think("three plus four is seven", f"\nThe answer is \\boxed{{{hack[1]}}}.")
    assert not box_is_visible(hack[1])
    assert _format_scores(completion) == [0.0, 0.0, 0.0]
    assert mode_format_reward([f"The answer is \\boxed{{{hack[1]}}}."], mode=["no_think"]) == [0.0]


# --------------------------------------------------------------------------------- renamed reasoning blocks

RENAMED = [
    "<no_think>\n5 + 4 = 9\n</no_think>\nThe answer is \\boxed{9}.",  # what APO learned (135M chain)
    "<think>\n\n</think>\n<no_think>5 + 4 = 9</no_think>\n\\boxed{9}",  # behind an empty think block
    "<Scratch-Pad>5 + 4 = 9</Scratch-Pad> The answer is \\boxed{9}.",
    "<reason>\n5\n+ 4\n</reason>\\boxed{9}",
]


@pytest.mark.parametrize("completion", RENAMED)
def test_a_renamed_reasoning_block_is_no_no_think_answer(completion):
    """A no_think answer that reasons inside a block under another tag name is paid nothing by the reward and
    counted unformatted by the evaluation (one rule: rewards.format.no_think_format), as a think block would be."""
    from align.eval.generative import is_formatted

    assert mode_format_reward([completion], mode=["no_think"]) == [0.0]
    assert not is_formatted(completion, "no_think")
    honest = completion[
        completion.index("The answer") if "The answer" in completion else completion.index("\\boxed") :
    ]
    assert mode_format_reward([honest], mode=["no_think"]) == [1.0] and is_formatted(honest, "no_think")


# ------------------------------------------------------------------------------------------ disguised loops

LOOP = "so the cat sat on the mat and "
PLAIN = LOOP * 8


def _each(variants: list[str]) -> str:
    """The loop written once per variant: every repetition spelt differently."""
    return "".join(variants[i % len(variants)] for i in range(8))


DISGUISED_LOOPS = [
    (
        "cyrillic_per_repetition",
        _each(
            [
                "so the cаt sat on the mat and ",
                "so thе cat sat on the mat and ",
                "sо the cat sat on the mat and ",
                "so the cat sat оn the mat and ",
                "so the cat sаt on thе mаt and ",
                "so the сat sat on the mat аnd ",
            ]
        ),
    ),
    (
        "greek_per_repetition",
        _each(
            [
                "so the cαt sat on the mat and ",
                "so the cat sat οn the mat and ",
                "so the cat sat on the mαt αnd ",
                "sο the cat sat on the mat and ",
            ]
        ),
    ),
    (
        "cyrillic_and_greek_capitals",
        _each(["SO THE CAT SAT ON THE MAT AND ", "SО ТНЕ САТ SАТ ОN ТНЕ МАТ АND ", "SΟ ΤΗΕ CΑΤ SΑΤ ΟΝ ΤΗΕ ΜΑΤ ΑΝD "]),
    ),
    ("fullwidth", _each([LOOP, "ｓｏ ｔｈｅ ｃａｔ ｓａｔ ｏｎ ｔｈｅ ｍａｔ ａｎｄ "])),
    (
        "mathematical_alphanumerics",
        _each(
            [
                "𝐬𝐨 𝐭𝐡𝐞 𝐜𝐚𝐭 𝐬𝐚𝐭 𝐨𝐧 𝐭𝐡𝐞 𝐦𝐚𝐭 𝐚𝐧𝐝 ",
                "𝑠𝑜 𝑡ℎ𝑒 𝑐𝑎𝑡 𝑠𝑎𝑡 𝑜𝑛 𝑡ℎ𝑒 𝑚𝑎𝑡 𝑎𝑛𝑑 ",
                "𝚜𝚘 𝚝𝚑𝚎 𝚌𝚊𝚝 𝚜𝚊𝚝 𝚘𝚗 𝚝𝚑𝚎 𝚖𝚊𝚝 𝚊𝚗𝚍 ",
                LOOP,
            ]
        ),
    ),
    ("circled_letters", _each([LOOP, "ⓢⓞ ⓣⓗⓔ ⓒⓐⓣ ⓢⓐⓣ ⓞⓝ ⓣⓗⓔ ⓜⓐⓣ ⓐⓝⓓ "])),
    ("small_capitals", _each([LOOP, "ꜱᴏ ᴛʜᴇ ᴄᴀᴛ ꜱᴀᴛ ᴏɴ ᴛʜᴇ ᴍᴀᴛ ᴀɴᴅ "])),
    (
        "zero_width_inside_words",
        _each(
            [
                "so th\u200be cat sat on the mat and ",
                "so the c\u200bat sat on the mat and ",
                "so the cat s\u200cat on the mat and ",
                "so the cat sat o\u200dn the m\u2060at and ",
            ]
        ),
    ),
    (
        "soft_hyphen_and_bom_inside_words",
        _each(["so the ca\u00adt sat on the mat and ", "so the cat sat on the ma\ufefft and ", LOOP]),
    ),
    (
        "tags_and_variation_selectors_inside_words",
        _each(["so the ca\U000e0031t sat on the mat and ", "so the cat s\ufe0fat on the mat and ", LOOP]),
    ),
    (
        "hangul_filler_inside_words",
        _each(["so the c\u3164at sat on the mat and ", "so the cat sa\uffa0t on the mat and "]),
    ),
    (
        "combining_overlays",
        _each([LOOP, "so t\u0334h\u0334e cat sat on the mat and ", "so the c\u0336a\u0336t sat on the mat and "]),
    ),
]


@pytest.mark.parametrize("hack", DISGUISED_LOOPS, ids=[h[0] for h in DISGUISED_LOOPS])
def test_disguised_loop_is_penalised_like_the_plain_one(hack):
    plain = repetition_penalty_reward([PLAIN])[0]
    assert plain < -0.8
    assert skeleton(hack[1]).split() == PLAIN.split()
    assert repetition_penalty_reward([hack[1]]) == [plain]
    assert repetition_penalty_reward([hack[1]], ngram_size=1) == repetition_penalty_reward([PLAIN], ngram_size=1)


def test_digits_of_other_scripts_are_the_same_digits():
    plain = "3 + 4 = 7 " * 6
    mixed = "3 + 4 = 7 ٣ + ٤ = ٧ ３ + ４ = ７ ३ + ४ = ७ 𝟑 + 𝟒 = 𝟕 3 + 4 = 7 "
    assert repetition_penalty_reward([mixed]) == repetition_penalty_reward([plain])


# ------------------------------------------------------------------------------------------ honest forms

HONEST_THINK = [
    ("chinese", "三加四等于七，所以答案是七。"),
    ("chinese_unspaced_short", "三加四得七"),
    ("japanese", "三たす四は七です。"),
    ("russian", "Три плюс четыре равно семи, значит ответ семь."),
    ("greek_math", "Αν x + 3 = 10, τότε x = 10 − 3 = 7."),
    ("korean_syllables", "삼 더하기 사는 칠입니다."),
    ("hindi", "तीन और चार का योग सात है।"),
    ("arabic", "ثلاثة زائد أربعة يساوي سبعة."),
    ("french_accents", "Trois plus quatre égale sept, donc la réponse est sept."),
    ("decomposed_accents", "re\u0301sume\u0301 de\u0301ja\u0300 vu"),
    ("emoji_with_joiners", "3 + 4 = 7 👍🏽 👩\u200d💻 done"),
    ("thai_unspaced", "สามบวกสี่เท่ากับเจ็ด"),
    ("persian_with_zwnj", "سه به علاوه چهار می\u200cشود هفت"),
]


@pytest.mark.parametrize("case", HONEST_THINK, ids=[c[0] for c in HONEST_THINK])
def test_honest_reasoning_in_any_script_scores_one(case):
    assert reasoning_words(case[1]) >= 3
    assert _format_scores(_think(case[1])) == [1.0, 1.0, 1.0]


HONEST_BOXES = [
    "\\frac{1}{2}", "\\text{yes}", "-3", "x^2", "\\pi", "\\infty", "\\{1, 2\\}", "\\sqrt{2}", "2, 5, 9", "\\emptyset",
    "0", "\\$5", "50\\%", "(1, 2]", "3\\,\\text{cm}", "\\dfrac{\\sqrt{3}}{2}", "1{,}000", "\\left(1, 2\\right)",
    "\\text{Paris}", "七", "\\mathbf{v}", "\\hat{x}", "\\overline{AB}", "\\phantom{-}3", "\\{\\}", "x = 7", "-",
]  # fmt: skip


@pytest.mark.parametrize("box", HONEST_BOXES)
def test_honest_box_scores_one(box):
    assert box_is_visible(box)
    completion = _think("three plus four is seven", f"\nThe answer is \\boxed{{{box}}}.")
    assert _format_scores(completion) == [1.0, 1.0, 1.0]
    assert mode_format_reward([f"The answer is \\boxed{{{box}}}."], mode=["no_think"]) == [1.0]


HONEST_PROSE = [
    ("english", "Three plus four is seven, so the answer is seven and nothing else is needed here."),
    ("chinese", "我们先把三和四相加，得到七。然后检查题目的条件，确认没有遗漏，所以最终答案是七。"),
    (
        "russian",
        "Сначала сложим три и четыре, получим семь. Затем проверим условие задачи: всё сходится, "
        "поэтому окончательный ответ равен семи, а не шести или восьми.",
    ),
    (
        "greek",
        "Έστω ότι x + 3 = 10. Αφαιρούμε το τρία από κάθε πλευρά και βρίσκουμε ότι x = 7, άρα η απάντηση είναι επτά.",
    ),
    ("korean", "먼저 삼과 사를 더하면 칠이 됩니다. 그다음 조건을 확인하면 모두 맞으므로 최종 답은 칠입니다."),
    ("mixed_scripts", "Пусть x = 3, then y = 2x = 6; αλλά z = y + 1 = 7, поэтому ответ 7 and we stop here."),
    ("vietnamese", "Ba cộng bốn bằng bảy, vì vậy đáp án là bảy và không cần làm gì thêm nữa."),
    ("hindi", "पहले तीन और चार को जोड़ते हैं, जिससे सात मिलता है, इसलिए अंतिम उत्तर सात है।"),
]


@pytest.mark.parametrize("case", HONEST_PROSE, ids=[c[0] for c in HONEST_PROSE])
def test_honest_multilingual_text_gets_no_repetition_penalty(case):
    assert repetition_penalty_reward([case[1]]) == [0.0]
    for n in (1, 2, 3):  # the skeleton merges no two words of honest text that lower-casing kept apart
        words = re.findall(r"[^\W_]+", case[1].lower())
        ngrams = [tuple(words[i : i + n]) for i in range(len(words) - n + 1)]
        plain = round((1 - len(set(ngrams)) / len(ngrams)) * -1.0, 6) + 0.0
        assert repetition_penalty_reward([case[1]], ngram_size=n) == [plain]


# ------------------------------------------------------------------------------------------ the rules themselves


def test_default_ignorable_table_is_unicodes():
    regex = pytest.importorskip("regex")
    everything = "".join(chr(cp) for cp in range(0x110000) if not 0xD800 <= cp <= 0xDFFF)
    theirs = {ord(ch) for ch in regex.findall(r"\p{Default_Ignorable_Code_Point}", everything)}
    ours = {cp for lo, hi in DEFAULT_IGNORABLE for cp in range(lo, hi + 1)}
    assert ours == theirs


def test_ascii_skeleton_is_only_lower_case():
    ascii_text = "".join(chr(cp) for cp in range(32, 127)) + "\n\tThe Cat, SAT; on 3 mats."
    assert skeleton(ascii_text) == ascii_text.lower()


def test_case_folding_still_merges_cyrillic_and_greek_words():
    assert len(set(skeleton("Сова сова СОВА").split())) == 1
    assert len(set(skeleton("Λόγος λόγος").split())) == 1
    assert len(set(skeleton("ΟΜΟΣ ομος Ομος").split())) == 1
    # the exceptions: Ν Υ look like N Y, their small forms like v u (both looks are kept); η has no look-alike of
    # its own in Unicode's data and reads as its capital Η does
    assert skeleton("ΗΝΥ ηνυ") == "hny hvu"


def test_long_hostile_inputs_stay_fast():
    hostile = [
        _think("\u0301" * 20000),
        _think("count", "\\boxed{" + "{" * 2000 + "}" * 2000 + "}"),
        _think("count", "\\boxed{" + "\\phantom x" * 3000 + "}"),
        _think("count", "\\boxed{" + "\\a[" * 3000 + "}"),
        _think("count", "\\boxed{\\kern " + "1" * 20000 + "x}"),
        _think("count", "\\boxed{" + "\\text{" * 1500 + "}" * 1500 + "}"),
        _think("count", "\\boxed{" + "\\hspace{" * 500 + "}" * 500 + "}"),
        _think("count", "\\boxed{" + "{" * 3000 + "x" + "}" * 3000 + "}"),
    ]
    start = time.perf_counter()
    for completion in hostile:
        _format_scores(completion)
        repetition_penalty_reward([completion])
    assert time.perf_counter() - start < 5.0  # about 0.2 s


def test_counts():
    attacks = INVISIBLE_THINK + MODIFIER_THINK + PADDED_THINK + EMPTY_BOXES + DISGUISED_LOOPS
    honest = HONEST_THINK + HONEST_PROSE
    assert len(attacks) == len({a[0] for a in attacks}) >= 20
    assert len(honest) + len(HONEST_BOXES) >= 12
