"""Google's ``FullTokenizer``, BERT's and ELECTRA's, written out plainly as the tests' oracle.

Its rules as google-research/bert's and google-research/electra's ``tokenization.py`` state them
(``strip_accents`` at ELECTRA's default, True), with Python's ``unicodedata`` as their tables.
The two differ in one place: BERT's text cleaning deletes the categories Cc and Cf, ELECTRA's
every category starting with ``C``.
"""

from __future__ import annotations

import unicodedata
from pathlib import Path

_CJK = ((0x4E00, 0x9FFF), (0x3400, 0x4DBF), (0x20000, 0x2A6DF), (0x2A700, 0x2B73F),
        (0x2B740, 0x2B81F), (0x2B820, 0x2CEAF), (0xF900, 0xFAFF), (0x2F800, 0x2FA1F))


def _is_punctuation(ch: str) -> bool:
    cp = ord(ch)
    return 33 <= cp <= 47 or 58 <= cp <= 64 or 91 <= cp <= 96 or 123 <= cp <= 126 or unicodedata.category(ch)[0] == "P"


def _is_control(ch: str, cleaning: str) -> bool:
    if ch in "\t\n\r":
        return False
    cat = unicodedata.category(ch)
    return cat.startswith("C") if cleaning == "electra" else cat in ("Cc", "Cf")


def _is_whitespace(ch: str) -> bool:
    return ch in " \t\n\r" or unicodedata.category(ch) == "Zs"


def _clean_text(text: str, cleaning: str) -> str:
    out = []
    for ch in text:
        if ord(ch) in (0, 0xFFFD) or _is_control(ch, cleaning):
            continue
        out.append(" " if _is_whitespace(ch) else ch)
    return "".join(out)


def _tokenize_chinese_chars(text: str) -> str:
    return "".join(f" {ch} " if any(lo <= ord(ch) <= hi for lo, hi in _CJK) else ch for ch in text)


def _run_strip_accents(word: str) -> str:
    return "".join(ch for ch in unicodedata.normalize("NFD", word) if unicodedata.category(ch) != "Mn")


def _run_split_on_punc(word: str) -> list[str]:
    pieces: list[list[str]] = []
    start_new = True
    for ch in word:
        if _is_punctuation(ch):
            pieces.append([ch])
            start_new = True
        else:
            if start_new:
                pieces.append([])
            start_new = False
            pieces[-1].append(ch)
    return ["".join(p) for p in pieces]


def google_words(text: str, lower: bool, cleaning: str, strip: bool = True) -> list[str]:
    """Google's BasicTokenizer.tokenize, step by step (``strip``: ELECTRA's ``strip_accents``)."""
    split_tokens = []
    for token in _tokenize_chinese_chars(_clean_text(text, cleaning)).strip().split():
        if lower:
            token = _run_strip_accents(token.lower()) if strip else token.lower()
        split_tokens.extend(_run_split_on_punc(token))
    return " ".join(split_tokens).strip().split()


def google_ids(text: str, vocab: dict[str, int], lower: bool, cleaning: str, strip: bool = True) -> list[int]:
    """Google's FullTokenizer: BasicTokenizer, then greedy longest-match WordPiece (200 chars)."""
    out = []
    for word in google_words(text, lower, cleaning, strip):
        pieces, start = [], 0
        while len(word) <= 200 and start < len(word):
            end = len(word)
            while end > start and ("##" if start else "") + word[start:end] not in vocab:
                end -= 1
            if end == start:
                break
            pieces.append(("##" if start else "") + word[start:end])
            start = end
        out += [vocab[p] for p in pieces] if len(word) <= 200 and start == len(word) else [vocab["[UNK]"]]
    return out


def electra_words(text: str, lower: bool) -> list[str]:
    return google_words(text, lower, "electra")


def electra_ids(text: str, vocab: dict[str, int], lower: bool, strip: bool = True) -> list[int]:
    return google_ids(text, vocab, lower, "electra", strip)


def code_points_sample() -> list[int]:
    """Every assigned code point (surrogates aside), and of the 830,000 unassigned ones (one
    class) the first and last of each run and every 61st."""
    out = []
    for cp in range(0x110000):
        if 0xD800 <= cp < 0xE000:
            continue
        if unicodedata.category(chr(cp)) != "Cn":
            out.append(cp)
        elif cp % 61 == 0 or unicodedata.category(chr(cp - 1)) != "Cn" or cp == 0x10FFFF or unicodedata.category(chr(cp + 1)) != "Cn":
            out.append(cp)
    return out


def code_point_probes() -> list[str]:
    """Each sampled code point between two letters and alone (``a<c>b <c>``)."""
    return [f"a{chr(cp)}b {chr(cp)}" for cp in code_points_sample()]


def write_char_vocab(path: Path) -> Path:
    """A vocab of every sampled code point, alone and as a ``##`` continuation: WordPiece then
    cuts each word into its characters, so ids show the words exactly (with a real vocab two
    different words often both end as ``[UNK]``)."""
    chars = [chr(cp) for cp in code_points_sample() if not chr(cp).isspace()]
    path.write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *chars, *("##" + c for c in chars)]) + "\n",
                    encoding="utf-8")
    return path


def mark_runs() -> list[str]:
    """Runs of marks whose canonical order NFD decides: every mark kept by accent stripping that
    has a combining class, a few that HF's older tables class otherwise, and non-spacing marks of
    low, middle and high classes, in pairs and with a non-spacing mark between."""
    kept = [chr(cp) for cp in range(0x110000) if not 0xD800 <= cp < 0xE000
            and unicodedata.combining(chr(cp)) and unicodedata.category(chr(cp)) != "Mn"]
    marks = kept + ["\u0334", "\u0301", "\u0345", "\u0898", "\U00011938", "\U00016fe4"]
    return [f"a{x}{y}" for x in marks for y in marks] + [f"a{x}{m}{y}" for x in kept for m in marks for y in kept[:8]]
