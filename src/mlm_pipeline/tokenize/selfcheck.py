"""Exactness guard for fast backends: the same ids as HF on hard text, or HF is used.

A backend is trusted for a run only after it encodes ``PROBES`` (the built-in adversarial set)
exactly as HF does; each task then also compares its first block of real input. Any
difference makes the task fall back to HF, with a warning naming the first differing text, and
the fact goes into the task marker and the manifest.
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
    ]


PROBES: tuple[str, ...] = tuple(_probes())


def first_difference(texts: list[str], candidate, reference) -> int | None:
    """Index of the first text whose ids differ between two encoders, or ``None``."""
    ids_a, lens_a = candidate.encode_batch(texts)
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
