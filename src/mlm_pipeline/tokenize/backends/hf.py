"""The reference backend: HF ``tokenizers`` (Rust), batched, ids straight into numpy.

Every other backend is checked against this one, and falls back to it on any difference.
"""

from __future__ import annotations

import functools
import itertools
import operator
import re

import numpy as np
from tokenizers import Tokenizer, normalizers

# Texts per tokenizer call in ``encode_ids``, and characters: HF holds about 110 bytes per
# character while it encodes, so 1024 long texts in one call could take gigabytes.
ENCODE_BATCH = 1024
ENCODE_CHARS = 1 << 19


# The ASCII bytes BertNormalizer keeps as they are (up to case): printable ones, and \t \n \r
# (made spaces, which the BERT pre-tokenizer splits on anyway). It deletes the other controls.
_PLAIN_ASCII = bytes(range(0x20, 0x7F)) + b"\t\n\r"


class AsciiPath:
    """BertNormalizer's work done in Python for plain-ASCII texts, then a tokenizer without it.

    For ASCII text, ``BertNormalizer`` only deletes control characters and lower-cases (its
    accent stripping, NFD and CJK spacing change nothing), yet its alignment-tracking Rust code
    takes about a third of the tokenizer's time on English text. So texts that are ASCII
    (``str.isascii`` is O(1) in CPython), contain no control character and no added-token
    string (those are matched before normalisation; the check is case-insensitive, to be safe
    both ways) are lower-cased by ``str.lower`` and sent to a copy of the tokenizer whose
    normaliser is removed; every other text goes through the full tokenizer. The ids are
    identical either way (``tests/test_tokenize.py`` compares them on the sample corpora and on
    generated text); only offsets would differ, and the pipeline reads ids only.
    """

    def __init__(self, tok: Tokenizer, normalizer: normalizers.BertNormalizer):
        self.tokenizer = Tokenizer.from_str(tok.to_str())
        self.tokenizer.normalizer = None
        self.lowercase = bool(normalizer.lowercase)
        added = sorted({t.content.lower().encode() for t in tok.get_added_tokens_decoder().values() if t.content})
        # searched in lower-cased bytes (a literal alternation: ~50x faster than IGNORECASE)
        self._added = re.compile(b"|".join(map(re.escape, added))) if added else None

    def _unsafe(self, data: bytes) -> bool:
        """Whether ASCII ``data`` holds a control character or an added token's string."""
        if data.translate(None, _PLAIN_ASCII):
            return True
        return self._added is not None and self._added.search(data.lower()) is not None

    @classmethod
    def for_tokenizer(cls, tok: Tokenizer) -> "AsciiPath | None":
        norm = tok.normalizer
        return cls(tok, norm) if isinstance(norm, normalizers.BertNormalizer) else None

    def split(self, texts: list[str]) -> tuple[list[int], list[str]]:
        """Indices of the texts this path takes, and those texts normalised."""
        take = [i for i, t in enumerate(texts) if t.isascii()]
        if not take:
            return [], []
        chosen = [texts[i] for i in take]
        if self._unsafe("\n".join(chosen).encode("ascii")):  # rare: sort it out text by text
            keep = [k for k, t in enumerate(chosen) if not self._unsafe(t.encode("ascii"))]
            take = [take[k] for k in keep]
            chosen = [chosen[k] for k in keep]
        if self.lowercase:
            chosen = [t.lower() for t in chosen]
        return take, chosen


class HFEncoder:
    """``encode_batch`` of an HF tokenizer, with the identical plain-ASCII shortcut."""

    name = "hf"

    def __init__(self, tokenizer: Tokenizer, *, ascii_route: bool = True):
        self.tokenizer = tokenizer
        self._ascii_route = ascii_route

    @functools.cached_property
    def _ascii(self) -> AsciiPath | None:
        """The ASCII route, built on first use: it copies the tokenizer (about 20 ms), which a
        run whose fast backend passed its self-check never needs."""
        return AsciiPath.for_tokenizer(self.tokenizer) if self._ascii_route else None

    @staticmethod
    def version() -> str:
        import tokenizers

        return tokenizers.__version__

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """Token ids of many texts as one flat int32 array plus per-text lengths.

        Plain-ASCII texts take a faster, identical route when the tokenizer normalises with
        ``BertNormalizer`` (see ``AsciiPath``); the two results are put back in text order.
        """
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        if self._ascii is None:
            return encode_ids(self.tokenizer, texts)
        take, normalised = self._ascii.split(texts)
        if len(take) == len(texts):
            return encode_ids(self._ascii.tokenizer, normalised)
        if not take:
            return encode_ids(self.tokenizer, texts)
        fast = np.zeros(len(texts), bool)
        fast[take] = True
        rest = np.flatnonzero(~fast)
        parts = [
            (fast, encode_ids(self._ascii.tokenizer, normalised)),
            (~fast, encode_ids(self.tokenizer, [texts[i] for i in rest.tolist()])),
        ]
        lengths = np.empty(len(texts), np.int64)
        for where, (_, lens) in parts:
            lengths[where] = lens
        starts = np.cumsum(lengths) - lengths
        ids = np.empty(int(lengths.sum()), np.int32)
        for where, (part_ids, lens) in parts:
            part_starts = np.cumsum(lens) - lens
            ids[np.arange(len(part_ids)) + np.repeat(starts[where] - part_starts, lens)] = part_ids
        return ids, lengths


def encode_ids(tokenizer: Tokenizer, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """Ids of ``texts`` (no special tokens added) as one flat int32 array plus per-text lengths.

    One Rust call per ``ENCODE_BATCH`` texts or ``ENCODE_CHARS`` characters (at least one
    text); the only Python work is one ``.ids`` read per text. Sub-batches keep the ``Encoding`` objects alive at once (tokens, offsets, masks: about
    100 bytes per token) to a few MB instead of ~100 MB for a 4 MB block, at no cost in speed.
    """
    encode = tokenizer.encode_batch_fast
    ids = operator.attrgetter("ids")
    flats, lengths = [], []
    for start, stop in _sub_batches(texts):
        encodings = encode(texts[start:stop], add_special_tokens=False)
        lens = np.fromiter(map(len, encodings), dtype=np.int64, count=len(encodings))
        # each text's id list is consumed as soon as it is made (a quarter faster than
        # collecting the lists first)
        flat = np.fromiter(itertools.chain.from_iterable(map(ids, encodings)), dtype=np.int32, count=int(lens.sum()))
        flats.append(flat)
        lengths.append(lens)
    if len(flats) == 1:
        return flats[0], lengths[0]
    return np.concatenate(flats), np.concatenate(lengths)


def _sub_batches(texts: list[str]) -> list[tuple[int, int]]:
    """``(start, stop)`` of each tokenizer call: ``ENCODE_BATCH`` texts, fewer when they hold
    over ``ENCODE_CHARS`` characters (a text longer than that alone)."""
    bounds = []
    for start in range(0, len(texts), ENCODE_BATCH):
        stop = min(start + ENCODE_BATCH, len(texts))
        ends = list(itertools.accumulate(map(len, texts[start:stop])))
        if ends[-1] <= ENCODE_CHARS:
            bounds.append((start, stop))
            continue
        first, used = start, 0
        for i, end in enumerate(ends, start):
            if end - used > ENCODE_CHARS and i > first:
                bounds.append((first, i))
                first, used = i, ends[i - start - 1]
        bounds.append((first, stop))
    return bounds
