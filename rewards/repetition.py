r"""N-gram repetition penalty: discourages the loops a policy falls into under RL.

``repetition_penalty_reward`` = ``max_penalty * (1 - distinct n-grams / all n-grams)`` over the words of each
completion (runs of letters and digits), compared by their ``skeleton``: 0.0 for text without a repeated n-gram,
approaching ``max_penalty`` (negative) as the text becomes one phrase repeated (the scheme of open-r1 and
"Demystifying Long Chain-of-Thought Reasoning"). Text shorter than one n-gram scores 0.0.

A loop must not escape by looking different while reading the same, so words are compared by a skeleton in the
spirit of Unicode TR39 (confusable detection), applied in this order:

1. invisible characters are dropped (``rewards.visible.visible_text``: Default_Ignorable_Code_Point and format
   controls — zero-width spaces and joiners, soft hyphens, variation selectors, tag characters) and the text is
   put in NFKC form (fullwidth ``ｔｈｅ``, mathematical ``𝐭𝐡𝐞``, circled and superscript letters become plain);
2. case is folded (``Go, go. GO!`` is one word three times; punctuation separates words and is not compared);
3. combining diacritics that NFC cannot compose with their letter are dropped (``t̴h̴e̴``): an orthographic accent
   composes (``é``) and stays;
4. letters of other scripts that look like a Latin letter are read as it (``_LOOK_ALIKES``, after Unicode's
   confusables: Cyrillic ``а е о р с у х ѕ і ј ...``, Greek ``α ε ι κ ν ο ρ τ υ χ ...``, Armenian ``օ ս ո հ``,
   Latin small capitals ``ᴛʜᴇ``), decomposed first so an accent on a look-alike stays on its Latin letter; the Greek
   capitals ``Η Ν Υ`` (like H N Y, while ``η ν υ`` look like n v u) are read before case folding. A decimal digit of
   any script is read as its ASCII digit.

ASCII text is unchanged but for case, so the scores equal TRL's ``get_repetition_penalty_reward`` on one-token words
(tests/test_reward_parity.py). Honest text in another script keeps its own n-grams: only a collision of whole
n-grams across scripts could merge them.

Run the examples: ``python -m pytest --doctest-modules rewards/repetition.py``.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Any

from rewards.match import completion_text
from rewards.visible import visible_text

_WORD = re.compile(r"[^\W_]+")
# Combining diacritics of every script (the generic blocks); left over after NFC they decorate, they do not spell.
_LOOSE_MARKS = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")
# Greek capitals that look like a different Latin letter than their small form (η ν υ read as n v u), read before
# case folding: a Greek word holding them compares case-sensitively (two or three spellings, not a disguise).
_CAPITALS = str.maketrans({"Η": "h", "Ν": "n", "Υ": "y"})
# Small letters (after case folding) that look like a Latin letter, after Unicode's confusables.txt.
_LOOK_ALIKE_PAIRS = (
    "аa вb еe кk мm нh оo пn рp сc тt уy хx ѕs іi јj һh ԁd ԛq ԝw ӏl үy"  # Cyrillic
    " αa βb γy εe ζz ηn ιi κk μm νv οo ρp τt υu χx ωw ϲc ϳj"  # Greek (μ follows its capital Μ)
    " օo սu ոn հh"  # Armenian
    " ıi ȷj ɑa ɡg ɩi ᴀa ʙb ᴄc ᴅd ᴇe ɢg ʜh ɪi ᴊj ᴋk ʟl ᴍm ɴn ᴏo ᴘp ʀr ꜱs ᴛt ᴜu ᴠv ᴡw ʏy ᴢz"  # Latin variants
)
_LOOK_ALIKES = {ord(pair[0]): pair[1] for pair in _LOOK_ALIKE_PAIRS.split()}


class _Latin(dict):
    """``str.translate`` table: look-alikes to their Latin letter, decimal digits of any script to ASCII."""

    def __missing__(self, cp: int) -> Any:
        value = self[cp] = _LOOK_ALIKES.get(cp, str(unicodedata.decimal(chr(cp), "")) or cp)
        return value


_TO_LATIN = _Latin()


def skeleton(text: str) -> str:
    r"""The text a reader sees, spelt one way (the module's rule): what repeated n-grams are compared by.

    >>> skeleton("Тhе саt"), skeleton("th\u200be \uff43\uff41\uff54"), skeleton("𝐭𝐡𝐞 ᴄᴀᴛ ٣")
    ('the cat', 'the cat', 'the cat 3')
    >>> skeleton("t\u0334h\u0334e Ρ\u200bΑΤ")
    'the pat'
    """
    s = unicodedata.normalize("NFC", visible_text(text).translate(_CAPITALS).casefold())
    s = _LOOSE_MARKS.sub("", s)
    return unicodedata.normalize("NFC", unicodedata.normalize("NFD", s).translate(_TO_LATIN))


def repetition_penalty_reward(
    completions: list, ngram_size: int = 3, max_penalty: float = -1.0, **kwargs: Any
) -> list[float]:
    r"""0.0 for no repeated ``ngram_size``-grams, down to ``max_penalty`` for pure repetition.

    >>> repetition_penalty_reward(["the cat sat on the mat", "go go go go go go", "Go, go. GO! go go; go", "hi"],
    ...                           ngram_size=2)
    [0.0, -0.8, -0.8, 0.0]
    """
    if ngram_size < 1:
        raise ValueError(f"repetition_penalty_reward: ngram_size must be >= 1, got {ngram_size}")
    if max_penalty > 0:
        raise ValueError(f"repetition_penalty_reward: max_penalty must be <= 0 (it is a penalty), got {max_penalty}")
    scores = []
    for completion in completions:
        words = _WORD.findall(skeleton(completion_text(completion)))
        if len(words) < ngram_size:
            scores.append(0.0)
            continue
        ngrams = [tuple(words[i : i + ngram_size]) for i in range(len(words) - ngram_size + 1)]
        scores.append(round((1 - len(set(ngrams)) / len(ngrams)) * max_penalty, 6) + 0.0)
    return scores
