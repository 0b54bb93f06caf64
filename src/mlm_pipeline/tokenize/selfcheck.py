"""Exactness guard for fast backends: the same ids as HF on hard text, or HF is used.

A backend is trusted for a run only after it encodes the probes of its tokenizer's model type
(:func:`probes_for`: ``PROBES``, then that type's own set in ``PROBE_SETS``) exactly as HF
does; each task then also compares its first block of real input. Any difference makes the task
fall back to HF, with a warning naming the first differing text, and the fact goes into the task
marker and the manifest.
"""

from __future__ import annotations

import numpy as np


def _probes() -> list[str]:
    words = ["a" * n for n in (99, 100, 101, 250)] + ["\u00e9" * 100, "x" * 99 + "\u00e9"]
    return [
        "", " ", "\t \n", "\u3000", "\u00a0\u2009\u202f",                   # empty, whitespace-only
        "nul\x00in\x00text", "ctrl\x01\x07\x1b\x7f\x9f chars", "crlf\r\nline\rcr",  # controls, CR/LF
        "zero\u200bwidth\u200c\u200djoin\ufeffbom\u2060wj", "soft\u00adhyphen",
        "caf\u00e9 na\u00efve r\u00e9sum\u00e9", "cafe\u0301 nai\u0308ve resu\u0301me\u0301",  # NFC / NFD
        "\u1e9b\u0323 \u0041\u030a \u212b \ufb01", "Ǆ ǅ ǆ İstanbul ΣΊΣΥΦΟΣ ß ẞ",
        "👍🏽 👩‍👩‍👧‍👦 🇩🇪 ❤️ 1️⃣", "\U0001f600\U0001f3fb\u200d\U0001f9b0",        # emoji, modifiers, ZWJ
        "مرحبا بالعالم، كيف حالك؟", "नमस्ते दुनिया। क्षत्रिय", "สวัสดีชาวโลก ภาษาไทย",  # Arabic, Devanagari, Thai
        "ひらがな カタカナ ｶﾀｶﾅ 漢字かな交じり", "한국어 텍스트 ㄱㄴㄷ", "中文，标点！（括号）「引号」",
        "ＦＵＬＬＷＩＤＴＨ　ＡＳＣＩＩ　１２３", "\U00020000\U0002a6d6\U0002f800 ext-b ideographs",
        "!!!???...,,,;;;:::---___***", "((([[[{{{<<<>>>}}}]]])))", "\"'`´‘’“”„«»‹›", "a--b..c//d\\\\e",
        "\ufffd replacement \ufffd\ufffd", "\ue000\uf8ff private use \U000f0000", "\ud7ff\ue000\uffff",
        "[MASK] [CLS] [SEP] [PAD] [UNK] [mask] [Mask] <mask> <s> </s>",
        "MiXeD CaSe WORDS and UPPER", "don't won't it's O'Neill's 1,234.56 3.14e-10 $5 €5 ¥5",
        "http://example.com/path?q=1&b=2 user@example.com #hashtag @mention",
        "tab\tseparated\tvalues\tand  double  spaces", "  leading and trailing  ",
        *words, "word" * 40, " ".join(["x"] * 300),
        # NEL (U+0085, whitespace to some rules only) and a vertical tab, digits between an added
        # token's look-alikes, combining marks after a space, the unknown token between spaces:
        # each caught a candidate (on RoBERTa's BPE, XLM-R's or T5's Unigram) that passed the rest
        " \x85\x0b", "<id>666</id>", "\x85next line\x85", "\u094e \u0488", " <unk> ",
    ]


PROBES: tuple[str, ...] = tuple(_probes())


def _unigram_probes() -> list[str]:
    """Where a SentencePiece-style Unigram (XLM-R's, T5's, ALBERT's) is easy to get wrong: the
    unknown token between spaces, ties between segmentations of equal score (``666``: the
    sentencepiece library breaks them unlike HF), whitespace runs and U+0085 (whitespace to some
    rules only), accents with and without stripping (ALBERT's ``StripAccents`` differs from
    splintr's on combining marks such as U+0488 and U+07FD), ``▁`` in the text itself, and added
    tokens inside words."""
    return [
        " <unk> ", "<unk>", "a<unk>b", "<id>666</id>", "666", " 666 6666 66666", "1234567890 3.14 1,5",  # unk, digits
        "x1y22z333", "\u0663\u0664 \uff11\uff12 \u00bd \u00b2",
        "a  b", "a\t\tb", "  x  y  ", "\n\n", "a \u3000 b", "x" + " " * 9 + "y", "a\u2028b\u2029c",   # whitespace runs
        "\x85", "a\x85b", " \x85\x0b", "\x85next line\x85", "word\x85 \x85",                    # NEL
        "caf\u00e9 na\u00efve \u00c5ngstr\u00f6m", "cafe\u0301 a\u0308\u0304 \u0301\u0301",      # accents
        "\u0488 \u0489 \u07fd \u0897 x\u0488y", "\u094e \u0488", "\u01c5 \u1e9b\u0323 \u00df",
        "\u2581", "x\u2581y \u2581", "\u2581\u2581x", "\u2581hello \u2581 world", "a \u2581 b",  # the ▁ marker
        "a<mask>b", "x <mask>", "a  <mask>b", "foo<s>bar", "un<unk>known", "a</s>b", "<pad><pad>",    # added tokens
        "a[MASK]b [CLS]x[SEP]", "<mask >< mask>", "\u4e2d<mask>\u6587",
    ]


def _byte_level_bpe_probes() -> list[str]:
    """Where a byte-level BPE (GPT-2's, RoBERTa's) is easy to get wrong: its split regex (a
    space joins the letters, digits or symbols after it; a whitespace run gives all but its last
    character a token of their own) on runs of whitespace, letters, digits and marks; added tokens
    (RoBERTa's ``<mask>`` takes the spaces before it, ``lstrip``) at word edges and inside words;
    texts that start with and without a space, which ``add_prefix_space`` tells apart."""
    return [
        "a  b", "a   b", "a \t b", "a\t\tb", "a \n\n b", "a\n \nb", "x" + " " * 9 + "y", "end   ", "   ",  # runs
        "\n", "\n\n\n", " \n", "\r\n\r\n", "\u00a0a\u00a0 \u00a0b", "a\u2028b\u2029c", "\x1c\x1d\x1e\x1f a",
        "\x85", "a\x85b", " \x85 ", "\x85\x85 \x85", "word\x85", "\x0b\x0c", "a \x0b b",            # NEL, VT, FF
        "<mask>", " <mask>", "a <mask> b", "a  <mask>b", "a\n<mask>", "<mask><mask> <mask>", "x<mask>y",
        "foo<s>bar", "un<unk>known", "a</s>b", "<pad><pad>", "<s> </s>", "<MASK> < mask> <mask >",  # added tokens
        "Hello", " Hello", "  Hello", "\tHello", "\nHello", "hello world", ".Hello", "'s",          # prefix space
        "don't I'M she'll we'VE you'd it's 's 'S", "a'b'c ''' '",                                   # contractions
        "666", " 666", "6666666 66666666", "1234567890", "3.14159 -2,5 1e10", "x1y22z333",           # digits
        "\u0663\u0664\u0665 \uff11\uff12 \u2167 \u00bd \u00b2 \U0001d7d8",
        "caf\u00e9 CAF\u00c9 na\u00efve \u00c5ngstr\u00f6m", "cafe\u0301 \u0301\u0301 a\u0308\u0304",  # accents
        "\u00df \u1e9e \u0130 \u0131 \ufb01 \u01c4", "\u0928\u093f \u093f\u0928 \u0e01\u0e34",
        "\u4e2d\u6587 \u65e5\u672c\u8a9e \ud55c\uad6d\uc5b4", "\U0001f600\U0001f600 \U0001f1e9\U0001f1ea",
    ]


PROBE_SETS: dict[str, tuple[str, ...]] = {
    "sentencepiece": tuple(_unigram_probes()),
    "byte-level-bpe": tuple(_byte_level_bpe_probes()),
}
"""Each model type's own probes (keys: ``loading.model_type_of``), checked after ``PROBES``."""


def probes_for(model_type: str | None) -> tuple[str, ...]:
    """The probes a backend must pass for a tokenizer of ``model_type``: ``PROBES``, then the
    type's own set, if it has one."""
    return PROBES + PROBE_SETS.get(model_type or "", ())


def first_difference(texts: list[str], candidate, reference) -> int | None:
    """Index of the first text whose ids differ between two encoders, or ``None``. A text the
    candidate fails to encode at all (it raises: fastokens on a byte its vocabulary has no token
    for, where HF gives the unknown token) differs too."""
    try:
        ids_a, lens_a = candidate.encode_batch(texts)
    except Exception:  # which text: one at a time, the reference's ids compared on the way
        return next((i for i, text in enumerate(texts) if fails_or_differs(text, candidate, reference)), 0)
    ids_b, lens_b = reference.encode_batch(texts)
    if np.array_equal(lens_a, lens_b) and np.array_equal(ids_a, ids_b):
        return None
    starts = np.concatenate([[0], np.cumsum(lens_b)])
    starts_a = np.concatenate([[0], np.cumsum(lens_a)])
    for i in range(len(texts)):
        if lens_a[i] != lens_b[i] or not np.array_equal(ids_a[starts_a[i]:starts_a[i + 1]],
                                                         ids_b[starts[i]:starts[i + 1]]):
            return i
    return 0  # unreachable: arrays differ, so some text does


def fails_or_differs(text: str, candidate, reference) -> bool:
    """Whether ``candidate`` raises on ``text`` alone or gives other ids than ``reference``."""
    try:
        ids, _ = candidate.encode_batch([text])
    except Exception:
        return True
    return not np.array_equal(ids, reference.encode_batch([text])[0])


def first_failure(texts: list[str], encoder) -> int:
    """Index of the first text ``encoder`` raises on alone (0 if none does: the batch failed)."""
    for i, text in enumerate(texts):
        try:
            encoder.encode_batch([text])
        except Exception:
            return i
    return 0


CHECK_FRACTION = 1 / 512
CHECK_MIN_BYTES = 4 << 10
CHECK_MAX_BYTES = 64 << 10


def check_budget(task_bytes: int) -> int:
    """Characters of a task's first block that the backend check encodes a second time, with HF.

    HF is ~50x slower than the fast backend, so the check costs about 50x the share of the text
    it covers: 1/512 of the task (4-64 KB) adds at most ~10% to the tokenizer's own small cost
    (64 KB of each 64 MB task; a fixed 64 KB made 1 MB tasks encode 6% of their text with HF,
    more than all their other stages together).
    """
    return int(min(CHECK_MAX_BYTES, max(CHECK_MIN_BYTES, task_bytes * CHECK_FRACTION)))


def first_texts(documents: list[list[str]], budget: int = CHECK_MAX_BYTES) -> list[str]:
    """Texts of a block for the backend check, about ``budget`` characters.

    Texts with non-ASCII characters come first (in their order), since that is where encoders
    differ (normalisation, accents, scripts, Unicode categories); the first texts of the block
    fill what they leave. A text is cut at ``CHECK_MAX_BYTES`` characters: HF takes many times a
    text's size in memory (a whole 16 MB line took 2 GB), and both encoders see the same
    characters.
    """
    texts = [s for doc in documents for s in doc]
    chosen, size = [], 0
    for s in texts:
        if not s.isascii():
            chosen.append(s[:CHECK_MAX_BYTES])
            size += len(chosen[-1])
            if size >= budget:
                return chosen
    for s in texts:
        if s.isascii():
            chosen.append(s[:CHECK_MAX_BYTES])
            size += len(chosen[-1])
            if size >= budget:
                break
    return chosen


class UnsupportedConfiguration(ValueError):
    """A backend refuses a configuration of the model type it serves (ALBERT's accent stripping
    for the Unigram backend): a fallback to the reference the user hears of, as of a difference,
    whereas a backend for another model type, or one not installed, falls back silently."""
