r"""Letters that look like another: the fold ``rewards.repetition.skeleton`` reads words by.

Derived by one rule from Unicode's confusables data (UTS #39, ``confusables.txt`` 14.0.0, whose prototypes say which
characters a reader cannot tell apart), restricted to letters and spelt in ASCII where the data allows:

1. a source is a letter (category L) outside ASCII without a canonical decomposition (NFD runs before the fold:
   ``ӓ`` reaches it as ``а`` + a mark); one that NFKC changes is kept only where NFKC would lose its look (``ϲ``,
   NFKC's ``ς``, looks like ``c``), as the skeleton folds before NFKC and again after it (``𝐭`` needs no entry);
2. it reads as the ASCII letter whose own prototype is the same (``а``, ``α``, ``ꓮ``, ``Ꭺ`` read as ``a``/``A``;
   ``ʍ``'s class is not ``m``'s, whose prototype is ``rn``), in the source's case; where two ASCII letters share the
   prototype (``I`` and ``l``) the one of the source's case;
3. a class without such an ASCII letter reads as its members' case partners do, when they agree on one, so a word
   and its capitals stay one word (``в``, ``ᏼ`` and ``ʙ`` as ``В``: ``b``; ``т``, ``τ`` and ``ᴛ`` as ``Т``: ``t``),
   and a letter the data leaves out reads as its case partner does (``Ɑ`` as ``ɑ``: ``A``);
4. any other letter whose prototype is one letter reads as that prototype (``ϐ`` and ``β`` both as ``ß``):
   look-alikes of one class compare equal even with no ASCII member, unless that would split a letter from its
   capital (``Λ`` stays, as ``λ`` has no prototype). A letter never folds into a digit, a sign or a sequence
   (``Ƨ`` is not ``2``, ``Æ`` is not ``AE``);
5. a letter the data leaves out that Unicode names ``LATIN LETTER SMALL CAPITAL X`` reads as ``x`` (``ɴ``, ``ᴅ``).

ASCII itself is never folded (``repetition_penalty_reward`` keeps TRL's scores on ASCII text). Where a letter and its
case partner read as two different ASCII letters (Greek ``Ν``/``ν`` look like N and v, ``Υ``/``υ`` like Y and u) both
looks are kept: a word holding them has two case spellings.

``FOLD`` is the derived table, packed as ``source target`` pairs; regenerate it with
``python -m rewards.confusables path/to/confusables.txt`` (tests/test_format_rules.py re-derives sample classes with
``derive_fold`` and checks the packed table's invariants).
"""

from __future__ import annotations

import string
import sys
import unicodedata


def parse_confusables(text: str) -> dict[str, str]:
    """Source -> prototype from the lines of ``confusables.txt`` (``src ; prototype ; MA # comment``).

    >>> parse_confusables("0430 ;\t0061 ;\tMA\t# ( а → a ) CYRILLIC SMALL LETTER A → LATIN SMALL LETTER A")
    {'а': 'a'}
    """
    table = {}
    for line in text.splitlines():
        data = line.split("#", 1)[0].strip().lstrip("\ufeff")
        if not data:
            continue
        fields = [f.strip() for f in data.split(";")]
        if len(fields) < 2:
            raise ValueError(f"confusables.txt: a line needs 'source ; prototype ; type', got {line!r}")
        source, prototype = ("".join(chr(int(cp, 16)) for cp in f.split()) for f in fields[:2])
        table[source] = prototype
    return table


def _is_source(ch: str) -> bool:
    return (
        len(ch) == 1
        and ord(ch) > 127
        and unicodedata.category(ch).startswith("L")
        and unicodedata.normalize("NFD", ch) == ch
    )


def _spells(target: str) -> bool:
    """A target that is one letter: a letter never folds into a digit or a sign (``Ƨ`` -> ``2``), nor into a
    sequence that reads as other words (``ऒ`` -> ``ॆा``; ``Æ`` -> ``AE``)."""
    return len(target) == 1 and unicodedata.category(target).startswith("L")


def _partner(ch: str) -> str | None:
    """The letter of the other case, when there is exactly one."""
    other = ch.lower() if ch.isupper() else ch.upper()
    return other if len(other) == 1 and other != ch else None


def derive_fold(prototypes: dict[str, str]) -> dict[str, str]:
    """The fold of every source letter (module docstring, rules 1-4) from confusables.txt's source -> prototype.
    The rules choose one spelling per class (a prototype and every letter that maps to it), so a class never splits:
    ``τ``, ``т`` and ``ᴛ`` itself all read as ``t``."""
    ascii_of: dict[str, list[str]] = {}
    for letter in string.ascii_letters:
        ascii_of.setdefault(prototypes.get(letter, letter), []).append(letter)
    classes: dict[str, set[str]] = {}
    for ch, prototype in prototypes.items():
        if _is_source(ch):
            classes.setdefault(prototype, set()).add(ch)
    for prototype, members in classes.items():
        if _is_source(prototype):
            members.add(prototype)

    def in_case(letter: str, ch: str) -> str:
        return letter.upper() if ch.isupper() else letter.lower()

    def ascii_spelling(prototype: str) -> str | None:
        """Rule 2's ASCII letter of a class (the lower-case one where two share it), or None."""
        letters = ascii_of.get(prototype, [])
        return letters[0] if letters else None

    fold = {}
    for prototype, members in classes.items():
        own = ascii_of.get(prototype, [])
        if own:  # rule 2: the source's case picks among the ASCII letters (I, l), else its case of the one
            for ch in members:
                same_case = [x for x in own if x.isupper() == ch.isupper()]
                fold[ch] = same_case[0] if same_case else in_case(own[0], ch)
            continue
        partners = {_partner(ch) for ch in members} - {None}
        via = {ascii_spelling(prototypes.get(p, p)) for p in partners} - {None}
        if len({v.lower() for v in via}) == 1:  # rule 3: the capitals agree on one ASCII letter
            letter = via.pop()
            fold.update({ch: in_case(letter, ch) for ch in members})
        elif _spells(prototype):  # rule 4
            fold.update({ch: prototype for ch in members if ch != prototype})
    # Rule 5: a small capital the data leaves out reads as its letter, by its name.
    for cp in range(0x80, sys.maxunicode + 1):
        ch = chr(cp)
        name = unicodedata.name(ch, "")
        letter = name.removeprefix("LATIN LETTER SMALL CAPITAL ")
        if letter != name and len(letter) == 1 and letter.isascii() and ch not in fold and _is_source(ch):
            fold[ch] = letter.lower()
    # A word and its capitals stay one word. A letter the data leaves out reads as its case partner does when that
    # one reads as an ASCII letter (``Ɑ`` as ``ɑ``: ``A``); a letter that would read as another non-ASCII letter than
    # its partner is not folded (rule 4 yields to case: ``Λ`` -> ``ʌ`` beside ``λ``).
    for ch in list(fold):
        partner = _partner(ch)
        if partner is not None and partner not in fold and partner not in prototypes and _is_source(partner):
            if fold[ch].isascii():
                fold[partner] = fold[ch].swapcase()
    for ch in list(fold):
        partner = _partner(ch)
        mine = fold.get(ch)
        if partner is None or mine is None or mine.isascii():
            continue
        if mine.casefold() != fold.get(partner, partner).casefold():
            del fold[ch]
    # A letter NFKC changes is kept only where it folds otherwise than what NFKC makes of it (``ϲ`` is NFKC's ``ς``
    # but looks like ``c``): the skeleton folds before NFKC as well as after.
    for ch in [c for c in fold if unicodedata.normalize("NFKC", c) != c]:
        nfkc = unicodedata.normalize("NFKC", ch)
        if "".join(fold.get(c, c) for c in unicodedata.normalize("NFD", nfkc)) == fold[ch]:
            del fold[ch]
    return fold


def pack(fold: dict[str, str], width: int = 100) -> str:
    """The table as source code: ``FOLD = (...)`` of space-separated ``source target`` pairs (``|`` between)."""
    pairs = [f"{s}{t}" if len(t) == 1 else f"{s}{t}|" for s, t in sorted(fold.items())]
    lines, line = [], ""
    for pair in pairs:
        if len(line) + len(pair) + 1 > width:
            lines.append(line)
            line = ""
        line += pair + " "
    lines.append(line)
    return "FOLD = (\n" + "".join(f"    {line!r}\n" for line in lines) + ")\n"


def unpack(packed: str) -> dict[str, str]:
    """The inverse of ``pack``'s pairs: the first character of each is the source, the rest (up to ``|``) the
    target.

    >>> fold = unpack(FOLD)
    >>> fold["а"], fold["ꓮ"], fold["Ꭲ"], fold["т"], fold["ϲ"], "t" in fold
    ('a', 'a', 'T', 't', 'c', False)
    """
    return {pair[0]: pair[1:].rstrip("|") for pair in packed.split()}


# Generated by `python -m rewards.confusables confusables.txt` (Unicode 14.0.0); do not edit by hand.
FOLD = (
    "ßb ıi ĸk ſf ƄB ƅb ƍg ƐE ƔY ƖI ƜW ƞh ƦR ƩO ƲU ƼS ƽs ǀl ȠH ɑa ɛe ɡg ɢg ɣy ɩi ɪi ɯw ɴn ʀr ʃo ʋu ʍm ʏy "
    "ʙb ʜh ʝj ʟl ʳᣴ ʿՙ ˡᣳ ˢᣵ ˤˁ ͺi ͻɔ ͽꜿ ͿJ ΑA ΒB ΓY ΕE ΖZ ΗH ΙI ΚK ΜM ΝN ΟO ΡP ΣO ΤT ΥY ΧX αa βb γy εe "
    "ζz ηh ιi κk μm νv οo ρp σo τt υu χx ϜF ϝf ϲc ϳj ϷÞ ϸþ ϹC ϺM ϻm ϽƆ ϿꜾ ЅS ІI ЈJ АA ВB ЕE КK МM НH ОO "
    "ПΠ РP СC ТT УY ХX ЬB аa бo вb гr еe кk мm нh оo пπ рp сc тt уy хx ьb єe ѕs іi јj ѠW ѡw ѰΨ ѱψ ѴV ѵv "
    "ҮY үy ҺH һh ҼE ҽe ӀI ӋҶ ӌҷ ӏi ԀD ԁd ԌG ԍg ԑe ԚQ ԛq ԜW ԝw ԱW ԳQ ԶQ ՀH ՈN ՌN ՍU ՏS ՑG ՔF ՕO աw գq զq "
    "հh ոn ռn սu տs ցg քf օo וl טv ןl סo اl هo يى ٮى ٯڡ ڧف کك ڪك ںى ھo ہo ۃة یى ېٻ ےى ەo ݢڬ ݧݔ ߊl ࢩݔ ࢰگ "
    "ࢱو ࢻڡ ࢼڡ ࢽى ઽऽ ଠo ஜஐ ரஈ ಅఅ ಆఆ ಇఇ ಒఒ ಜజ ಞఞ ಣణ ಯయ ಱఱ ಲల ഉஉ ജஐ ഠo ണண റര ഴழ ശஶ ൎॱ ൡഞ ฃข ซช ฏฎ ดค ตค ทฑ "
    "มฆ ฦภ ๅา ຈจ ຍย ບบ ປป ຝฝ ພพ ຟฟ ཪར ဝo ყy ჿo ᅳー ᅵ丨 ᆨᄀ ᆫᄂ ᆮᄃ ᆯᄅ ᆷᄆ ᆸᄇ ᆺᄉ ᆼᄋ ᆽᄌ ᆾᄎ ᆿᄏ ᇀᄐ ᇁᄑ ᇂᄒ ᇫᅀ ᇰᅌ ᇹᅙ "
    "ሀu ሣɰ ቀΦ በn ቡn ኔձ ዐo ᎠD ᎡR ᎢT ᎥI ᎩY ᎪA ᎫJ ᎬE ᎰⱵ ᎳW ᎷM ᎻH ᎽY ᏀG ᏂH ᏃZ ᏇW ᏏB ᏒR ᏔW ᏕS ᏙV ᏚS ᏞL ᏟC ᏢP "
    "ᏦK ᏧD ᏮO ᏰB ᏳG ᏴB ᏸb ᏻg ᏼb ᐃΔ ᐯv ᐱɅ ᑌu ᑎn ᑭp ᑯd ᑲb ᒍj ᒥΓ ᒪl ᓑᐡ ᕀᐩ ᕁx ᕷẟ ᕼh ᕽx ᖇr ᖯb ᖴf ᖵℲ ᖷꟻ ᗄⱯ ᗅa "
    "ᗞd ᗪd ᗯw ᗰm ᗷb ᘂᒐ ᘃᒉ ᘄᓓ ᘇᓚ ᘢᕃ ᘣᕆ ᘤᕊ ᘮƱ ᘯΩ ᘴƱ ᘵΩ ᚷx ᛁl ᛂᚽ ᛕk ᛖm ᛘΨ ᛜo ᛡᚼ ឣអ ᡕᠵ ᢖᡜ ᣛᣵ ᲧY ᲿO ᴀa ᴄc ᴅd "
    "ᴇe ᴈɜ ᴊj ᴋk ᴍm ᴏo ᴐɔ ᴑo ᴘp ᴛt ᴜu ᴠv ᴡw ᴢz ᴤƨ ᴦr ᴧʌ ᴨπ ᴩp ᴫл ᴾᣖ ᵒº ᵸᴴ ᶃg ᶌy ᶐɋ ᶟᵋ ᶢᵍ ᶺᣔ ᶻᙆ ẚả ẝf ỾY "
    "ỿy ℇƐ ℾΓ ↃƆ ↄɔ ⱭA ⲅr ⲉe ⲎH ⲏh ⲒI ⲓi ⲔK ⲕk ⲘM ⲙm ⲚN ⲛn ⲞO ⲟo ⲢP ⲣp ⲤC ⲥc ⲦT ⲧt ⲨY ⲩy ⲬX ⲭx ⲼШ ⲽш ⳐL "
    "ⳑl ⳒO ⳓo ⳤϗ ⴷɅ ⴸv ⴹe ⴺƎ ⵉo ⵏl ⵔo ⵕq ⵙʘ ⵝx ⵠΔ イ亻 エ工 カ力 タ夕 ト卜 ニ二 ハ八 ヘへ ロ口 㦳㘽 䎛㖈 䐠㬻 一ー "
    "倂併 值値 啟啓 囗口 填塡 士土 壿墫 嬀媯 帲帡 幐㬺 戸戶 搉㩁 晣䀿 晩晚 曶㫚 朦䑃 柿杮 槩㮣 樧榝 潙溈 硏研 絶絕 "
    "肦朌 胊朐 胐朏 胶㬵 脁朓 脧朘 腁胼 膧朣 蔿蒍 虁蘷 訞䚶 詽訮 讏讆 豣豜 趆赿 跺跥 躛躗 輧軿 郞郎 鎮鎭 隸隷 鹃鹂 "
    "黒黑 鿃䀹 ꓐb ꓑp ꓒd ꓓd ꓔt ꓖg ꓗk ꓙj ꓚc ꓛƆ ꓜz ꓝf ꓞℲ ꓟm ꓠn ꓡl ꓢs ꓣr ꓤu ꓥɅ ꓦv ꓧh ꓪw ꓫx ꓬy ꓭᙠ ꓮa ꓯⱯ ꓰe ꓱƎ ꓲl ꓳo ꓴu ꓵn "
    "ꓷᗡ ꙆI ꙇi ꚡИ ꚰᚹ ꚱⱵ ꛍʡ ꛎɅ ꛛΠ ꛟv ꜰf ꜱs ꝺꝹ ꞒE ꞓe ꞕꜧ ꞘF ꞙf Ꞛ𐐒 ꞛ𐐺 ꞞU ꞟu ꞬG ꞮI ꞯq ꞲJ ꞳX ꞴB ꞵb ꟷー ꦒⰿ ꦣꦝ ꬲe ꬵf ꬽo ꭇr ꭈr "
    "ꭍʃ ꭎu ꭒu ꭓx ꭕx ꭚy ꭠљ ꭰd ꭱr ꭲt ꭵi ꭹy ꭺa ꭻj ꭼe ꮀⱶ ꮁr ꮃw ꮇm ꮋh ꮍy ꮐg ꮒh ꮓz ꮗw ꮛe ꮟb ꮢr ꮤw ꮥs ꮩv ꮪs ꮮl ꮯc ꮲp ꮶk ꮷd "
    "ꮾo ﮤۀ ﮥۀ ﮰۓ ﮱۓ ﺁآ ﺂآ 𐊂b 𐊅Δ 𐊆e 𐊇f 𐊊l 𐊍Ʌ 𐊐x 𐊒o 𐊔o 𐊕p 𐊖s 𐊗t 𐊠a 𐊡b 𐊢c 𐊣Δ 𐊥f 𐊫o 𐊭Ϙ 𐊰m 𐊱t 𐊲y 𐊳Φ 𐊴x 𐊵Ψ 𐊶Ω 𐊸ⵀ 𐋏h 𐌁b 𐌂c "
    "𐌉l 𐌑m 𐌒Ϙ 𐌕t 𐌗x 𐐄O 𐐕C 𐐛L 𐐠S 𐐣Ɔ 𐐩e 𐐬o 𐐽c 𐑃l 𐑈s 𐑋ɔ 𐒰Ʌ 𐒴R 𐓂O 𐓎U 𐓑Ψ 𐓒E 𐓘ʌ 𐓜r 𐓪o 𐓶u 𐓹ψ 𐓺e 𐔓n 𐔖o 𐔘k 𐔜c 𐔝v 𐔥f 𐔦l 𐔧x 𑇜ꣻ "
    "𑒒ঘ 𑒔চ 𑒖জ 𑒘ঞ 𑒙ট 𑒛ড 𑒝ল 𑒞ত 𑒟থ 𑒠দ 𑒡ধ 𑒢ন 𑒣প 𑒧ম 𑒨য 𑒩ব 𑒪ণ 𑒫র 𑒭ষ 𑒮স 𑓄ঽ 𑗘𑖂 𑗙𑖂 𑗚𑖃 𑗛𑖄 𑜀m 𑜆v 𑜊w 𑜎w 𑜏w 𑢠V 𑢡S 𑢢F 𑢣L 𑢤Y 𑢦E 𑢨O "
    "𑢩Z 𑢮E 𑢲L 𑢵O 𑢷O 𑢸U 𑢻S 𑢼T 𑣀v 𑣁s 𑣂f 𑣃i 𑣄z 𑣆e 𑣈o 𑣉z 𑣎e 𑣒l 𑣕o 𑣗o 𑣘u 𑣛s 𑣜y 𒀸𐎚 𓋹𐦞 𖼇Γ 𖼈v 𖼊t 𖼖l 𖼚Δ 𖼜Ꙙ 𖼦ꓶ 𖼨l 𖼭Ɛ 𖼵r 𖼺s 𖼽Ʌ "
    "𖽀a 𖽂u 𖽃y 𝚪Γ 𝚲Ʌ 𝛅ẟ 𝛗ɸ 𝛟ɸ 𝛤Γ 𝛬Ʌ 𝛿ẟ 𝜑ɸ 𝜙ɸ 𝜞Γ 𝜦Ʌ 𝜹ẟ 𝝋ɸ 𝝓ɸ 𝝘Γ 𝝠Ʌ 𝝳ẟ 𝞅ɸ 𝞍ɸ 𝞒Γ 𝞚Ʌ 𝞭ẟ 𝞿ɸ 𝟇ɸ "
)

if __name__ == "__main__":
    with open(sys.argv[1], encoding="utf-8") as f:
        sys.stdout.write(pack(derive_fold(parse_confusables(f.read()))))
