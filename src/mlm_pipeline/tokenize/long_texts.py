"""Long texts are encoded in bounded pieces, so a worker's memory does not grow with a line's length.

A tokenizer holds many times a text's size while it encodes it: HF ``tokenizers`` keeps
alignments, offsets and a string per token, about 110 bytes per character (a 16 MB line took
1.7 GB; 5 MB of ``[[`` took 2.2 GB). A text longer than :data:`LONG_TEXT_CHARS` is therefore cut
into pieces of at most that many characters, the pieces are encoded as texts of their own, and
their ids are joined back into one text's: instance building still sees one sentence.

Where a piece ends, in order of preference (the last such place in the second half of its
window, so pieces are at least half the limit):

1. before a space that follows a non-space character and precedes an ASCII letter or digit.
   Every pre-tokenizer that splits words at whitespace gives the same ids for ``"… a" + " b …"``
   as for the whole: no word spans the cut, and the space goes with the next word as byte-level
   BPE (``Ġb``) and SentencePiece's Metaspace (``▁b``) want it (a run of spaces is never cut, as
   a normalizer may fold it). Exact for BERT's and ELECTRA's WordPiece, RoBERTa's byte-level BPE
   and XLM-R's Unigram (``tests/test_tokenize_long_texts.py``).
2. between two characters that BERT's rules make words of their own: punctuation (ASCII, CJK
   and full-width) and CJK ideographs. Exact for BERT and ELECTRA; byte-level BPE merges runs of
   punctuation or letters, so its ids may differ at such a cut.
3. else after the window's last character: a run of 64K characters with neither (one "word").
   WordPiece gives an ``[UNK]`` per piece instead of one for the whole word (such a word is
   far over its length limit; a last piece under it gives its word pieces); other models may
   encode the characters at the cut otherwise.

Texts up to the limit, all ordinary text, are encoded as they are.
"""

from __future__ import annotations

import re
import unicodedata
from typing import Callable

import numpy as np

LONG_TEXT_CHARS = 1 << 16
"""The longest text encoded in one piece (HF: about 7 MB while it is encoded)."""

_SPACE_CUT = re.compile(r"(?<=\S) (?=[A-Za-z0-9])")


def _isolated_class() -> str:
    """A regex class of characters BERT's normalizer and pre-tokenizer make words of their own:
    ASCII punctuation, CJK and full-width punctuation (category ``P*``: ``，。「」``) and the
    two main blocks of CJK ideographs, which both HF's tables and Google's code know."""
    punct = "".join(chr(c) for lo, hi in ((0x3000, 0x303F), (0xFF00, 0xFF65)) for c in range(lo, hi + 1)
                    if unicodedata.category(chr(c)).startswith("P"))
    return "[" + re.escape("".join(chr(c) for c in range(0x21, 0x7F) if not chr(c).isalnum()) + punct) + \
        "\u3400-\u4dbf\u4e00-\u9fff]"


_ISOLATED = _isolated_class()
_ISOLATED_CUT = re.compile(f"(?<={_ISOLATED})(?={_ISOLATED})")

Encode = Callable[[list[str]], "tuple[np.ndarray, np.ndarray]"]


def _last_match(pattern: re.Pattern, text: str, lo: int, hi: int) -> int | None:
    """Where the last match of an empty-width ``pattern`` lies in ``(lo, hi]``, or None."""
    window = text[lo - 1 : hi + 1]  # one character more either side, for the look-behind and look-ahead
    last = None
    for last in pattern.finditer(window, 1):
        pass
    return None if last is None else lo - 1 + last.start()


def cut_points(text: str, limit: int = LONG_TEXT_CHARS) -> list[int]:
    """Where ``text`` is cut: the start of each piece after the first (empty when it fits)."""
    cuts = []
    start = 0
    while len(text) - start > limit:
        lo, hi = start + limit // 2, start + limit
        cut = _last_match(_SPACE_CUT, text, lo, hi)
        if cut is None:
            cut = _last_match(_ISOLATED_CUT, text, lo, hi)
        if cut is None:
            cut = hi
        cuts.append(cut)
        start = cut
    return cuts


def pieces_of(text: str, limit: int = LONG_TEXT_CHARS) -> list[str]:
    """``text`` as the pieces it is encoded in (their concatenation is ``text``)."""
    bounds = [0, *cut_points(text, limit), len(text)]
    return [text[a:b] for a, b in zip(bounds, bounds[1:])]


def encode_cut(encode: Encode, texts: list[str], limit: int = LONG_TEXT_CHARS) -> tuple[np.ndarray, np.ndarray]:
    """``encode(texts)`` (flat ids, per-text lengths) with each text longer than ``limit`` cut
    into pieces: the encoder sees the pieces, the caller one text per text."""
    if not texts or max(map(len, texts)) <= limit:
        return encode(texts)
    pieces: list[str] = []
    counts = np.ones(len(texts), np.int64)
    for i, text in enumerate(texts):
        if len(text) > limit:
            cut = pieces_of(text, limit)
            pieces.extend(cut)
            counts[i] = len(cut)
        else:
            pieces.append(text)
    ids, lens = encode(pieces)
    return ids, np.add.reduceat(lens, np.cumsum(counts) - counts)
