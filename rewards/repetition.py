r"""N-gram repetition penalty: discourages the loops a policy falls into under RL.

``repetition_penalty_reward`` = ``max_penalty * (1 - distinct n-grams / all n-grams)`` over the words of each
completion (runs of letters and digits), compared by their ``skeleton``: 0.0 for text without a repeated n-gram,
approaching ``max_penalty`` (negative) as the text becomes one phrase repeated (the scheme of open-r1 and
"Demystifying Long Chain-of-Thought Reasoning"). Text shorter than one n-gram scores 0.0.

A loop must not escape by looking different while reading the same, so words are compared by a skeleton in the
spirit of Unicode TR39 (confusable detection), applied in this order:

1. invisible characters are dropped (``rewards.visible.visible_text``: Default_Ignorable_Code_Point and format
   controls: zero-width spaces and joiners, soft hyphens, variation selectors, tag characters);
2. look-alike letters are read as the letter they look like (``rewards.confusables.FOLD``, derived by one rule
   from Unicode's confusables data for every script it covers: Cyrillic, Greek, Armenian, Cherokee, Lisu, Coptic,
   Canadian syllabics, Tifinagh, Latin small capitals, ...), decomposed first so an accent on a look-alike stays on
   its letter, once before NFKC (``ϲ`` looks like ``c``, NFKC makes it ``ς``) and once after it (fullwidth
   ``ｔｈｅ``, mathematical ``𝐭𝐡𝐞``, circled and superscript letters become plain first); a decimal digit of any
   script is read as its ASCII digit;
3. case is folded (``Go, go. GO!`` is one word three times; punctuation separates words and is not compared), and
   the fold runs once more on what case folding made (``Σ`` is ``σ``, which looks like ``o``);
4. combining marks that NFC cannot compose with their letter are dropped (``t̴h̴e̴``, and the overlays of
   prototypes such as ``ł`` = ``l̸``): an orthographic accent that composes (``é``) stays.

The fold is case-sensitive and runs before case folding: a capital that looks like a Latin capital (``Н``, ``Τ``)
is read as it, and a small letter without a look-alike of its own reads as its capital does (``н`` as ``h``), so a
word and its capitals stay one word. The Greek ``Ν``/``ν`` and ``Υ``/``υ`` look like N/v and Y/u: both looks are
kept, and a word holding them has two case spellings.

ASCII text is unchanged but for case, so the scores equal TRL's ``get_repetition_penalty_reward`` on one-token words
(tests/test_reward_parity.py). Honest text in another script keeps its own n-grams: only a collision of whole
n-grams across scripts could merge them. Linear time: every step is a ``str.translate``, a normalisation or one
regular-expression pass, and the n-grams are hashed one window at a time.

Run the examples: ``python -m pytest --doctest-modules rewards/repetition.py``.
"""

from __future__ import annotations

import re
import unicodedata
from itertools import islice
from typing import Any

from rewards.confusables import FOLD, unpack
from rewards.match import completion_text
from rewards.visible import drop_invisible, normalize, visible_text

_WORD = re.compile(r"[^\W_]+")
# Combining diacritics of every script (the generic blocks); left over after NFC they decorate, they do not spell.
_LOOSE_MARKS = re.compile("[\u0300-\u036f\u1ab0-\u1aff\u1dc0-\u1dff\u20d0-\u20ff\ufe20-\ufe2f]+")
_LOOK_ALIKES = unpack(FOLD)
_BETWEEN_WORDS = re.compile(r"[\W_]")
_PIECE = 1 << 16


class _Fold(dict):
    """``str.translate`` table: look-alikes to the letter they look like, decimal digits of any script to ASCII."""

    def __missing__(self, cp: int) -> Any:
        ch = chr(cp)
        value = self[cp] = _LOOK_ALIKES.get(ch) or str(unicodedata.decimal(ch, "")) or cp
        return value


_TO_LATIN = _Fold()


def _fold(text: str) -> str:
    return normalize("NFD", text).translate(_TO_LATIN)


def skeleton(text: str) -> str:
    r"""The text a reader sees, spelt one way (the module's rule): what repeated n-grams are compared by.

    >>> skeleton("Тhе саt"), skeleton("th\u200be \uff43\uff41\uff54"), skeleton("𝐭𝐡𝐞 ᴄᴀᴛ ٣")
    ('the cat', 'the cat', 'the cat 3')
    >>> skeleton("t\u0334h\u0334e Ρ\u200bΑΤ"), skeleton("ϲat ꓔꓧꓰ ᏟᎪᎢ ⲟⲣ")
    ('the pat', 'cat the cat op')
    """
    s = _fold(drop_invisible(text))
    s = _fold(_fold(visible_text(s)).casefold())  # again after case folding: Σ folds as σ does
    return _LOOSE_MARKS.sub("", normalize("NFC", s))


def _ngram_counts(text: str, n: int) -> tuple[int, int]:
    """(n-grams, distinct n-grams) of the words of ``text``. The text is read in pieces cut between words (the
    last ``n - 1`` words carried over), and only the hashes of distinct n-grams are kept: a long text costs no list
    of all its words, and the windows are hashed in C."""
    seen: set[int] = set()
    total, carry, start = 0, [], 0
    while start < len(text):
        cut = _BETWEEN_WORDS.search(text, start + _PIECE)
        end = cut.end() if cut else len(text)
        words = carry + _WORD.findall(text, start, end)
        if len(words) >= n:
            seen.update(map(hash, zip(*(islice(words, i, None) for i in range(n)))))
            total += len(words) - n + 1
        carry = words[len(words) - n + 1 :] if n > 1 else []
        start = end
    return total, len(seen)


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
        total, distinct = _ngram_counts(skeleton(completion_text(completion)), ngram_size)
        scores.append(0.0 if total == 0 else round((1 - distinct / total) * max_penalty, 6) + 0.0)
    return scores
