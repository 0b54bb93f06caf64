"""Chinese (and any text of characters BERT isolates) looked up in a table, not encoded word by word.

BERT's normaliser puts spaces around every CJK ideograph and its pre-tokeniser splits off every
punctuation character, so in a WordPiece vocabulary each such character is a word of its own,
whose id is the character's vocabulary entry or ``[UNK]``: no context changes it. ``nanotoken``
caches the encodings of whitespace-delimited chunks, which makes English fast; unspaced Chinese
is one long chunk per line that never repeats, so every line is encoded from scratch (about 6x
HF on 红楼梦, against about 45x on English). Here the texts' code points go through a table of
those characters in numpy; only the runs between them (Latin words, digits, spaces, anything
else) go to ``nanotoken``, where its cache works again.

Nothing is assumed that HF does not do: a character is in the table only if the tokenizer's own
normaliser leaves it as it is and its own pre-tokeniser isolates it, and no added token (``[MASK]``
...) contains it, since those are matched in the raw text before anything else. The backend's
self-check and each task's first-block check compare the result with HF like any backend's.
"""

from __future__ import annotations

import unicodedata

import numpy as np
from tokenizers import Tokenizer, models, normalizers, pre_tokenizers

from mlm_pipeline.instances.batch import lengths_to_offsets, ranges_to_indices

TABLE_SIZE = 0x10000
"""The Basic Multilingual Plane: CJK ideographs beyond it (extension B and on) are rare and go
to the encoder as other text."""

MIN_SHARE = 0.25
"""A text goes through the table when at least this share of its characters are table characters
(Chinese and Japanese text: ~90%); others, English with a few accented words say, are cheaper as
whole texts through the encoder."""


def _isolated_by_bert(ch: str) -> bool:
    """Whether BERT's rules make a word of ``ch`` alone: its CJK ideographs (in the BMP), Unicode
    punctuation and the ASCII symbols it counts as punctuation."""
    cp = ord(ch)
    return (0x4E00 <= cp < 0xA000 or 0x3400 <= cp < 0x4DC0 or 0xF900 <= cp < 0xFB00
            or unicodedata.category(ch).startswith("P") or (33 <= cp < 127 and not ch.isalnum()))


_UNCHECKED, _OTHER = -2, -1


def _may_be_mostly_table(texts: list[str], min_share: float) -> np.ndarray:
    """Per text, False where fewer than ``min_share`` of its characters can be table characters,
    from its UTF-8 bytes alone: a table character is either not ASCII or an ASCII character other
    than a letter, a digit or a space. A text with as many bytes beyond its characters as the
    share (Chinese: two per character) may be at once; the others' bytes are looked at (their
    non-ASCII characters counted at their lead bytes). A few passes over bytes, where the table's
    own count decodes every code point and looks it up."""
    encoded = [t.encode("utf-8", "surrogatepass") for t in texts]
    chars = np.fromiter(map(len, texts), np.int64, len(texts))
    nbytes = np.fromiter(map(len, encoded), np.int64, len(texts))
    may = nbytes - chars >= min_share * chars  # every non-ASCII character adds at least one byte
    rest = np.flatnonzero(~may)
    if len(rest):
        b = np.frombuffer(b"".join([encoded[i] for i in rest.tolist()]), np.uint8)
        lower = b | np.uint8(0x20)
        plain = ((lower >= ord("a")) & (lower <= ord("z"))) | ((b >= ord("0")) & (b <= ord("9"))) | (b == ord(" "))
        plain |= (b >= 0x80) & (b < 0xC0)  # UTF-8 continuation bytes: their character counted at its lead byte
        may[rest] = _per_text(~plain, nbytes[rest]) >= min_share * chars[rest]
    return may


def _per_text(flags: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """The True flags of each text (``flags`` holds the texts' back to back, ``lengths`` each one's
    share): one ``reduceat`` over the non-empty texts (10x a cumsum of bools into int64)."""
    counts = np.zeros(len(lengths), np.int64)
    full = lengths > 0
    if full.any():
        counts[full] = np.add.reduceat(flags, lengths_to_offsets(lengths)[:-1][full], dtype=np.int64)
    return counts


class SingleCharTable:
    """Vocabulary ids of the characters a BERT WordPiece tokenizer always makes a word of their own.

    A character is checked the first time a text holds it (a novel has a few thousand distinct
    characters; checking all 28,000 candidates up front cost a quarter of a second per process).
    """

    def __init__(self, tok: Tokenizer):
        if not (isinstance(tok.model, models.WordPiece) and isinstance(tok.normalizer, normalizers.BertNormalizer)
                and isinstance(tok.pre_tokenizer, pre_tokenizers.BertPreTokenizer)):
            raise ValueError("the character table is for BERT WordPiece tokenizers")
        self._tok = tok
        self._vocab = tok.get_vocab()
        self._unk = self._vocab.get(tok.model.unk_token)
        self._added = "".join(t.content for t in tok.get_added_tokens_decoder().values())
        self.ids = np.full(TABLE_SIZE, _UNCHECKED, np.int32)
        self.ids[[ord(c) for c in "abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789 "]] = _OTHER
        self.ids[TABLE_SIZE - 1] = _OTHER  # a noncharacter, and where code points beyond the BMP land

    def _lookup(self, cps: np.ndarray) -> np.ndarray:
        """Each code point's id, or ``_OTHER``; checks the characters seen for the first time."""
        table = self.ids.take(cps, mode="clip")  # beyond the BMP: U+FFFF's entry, "other"
        new = table == _UNCHECKED
        if new.any():
            self._check(np.unique(cps[new]).tolist())
            table[new] = self.ids.take(cps[new], mode="clip")
        return table

    def _check(self, cps: list[int]) -> None:
        # Python's Unicode data rules out the characters the normaliser could change; the
        # tokenizer itself then confirms the rest
        chars = [chr(cp) for cp in cps]
        chars = [ch for ch in chars if _isolated_by_bert(ch) and ch not in self._added
                 and unicodedata.normalize("NFD", ch) == ch and ch.lower() == ch and ch.upper() == ch]
        self.ids[cps] = _OTHER
        for ch in self._confirmed(self._tok, chars):
            tid = self._vocab.get(ch, self._unk)
            if tid is not None:
                self.ids[ord(ch)] = tid

    @staticmethod
    def _confirmed(tok: Tokenizer, chars: list[str]) -> list[str]:
        """The characters of ``chars`` that HF leaves as they are and makes a word of their own:
        ``a{c}a`` must give the words ``a``, ``c``, ``a``. One call for all; a character it keeps
        inside its word (``a{c}a``, punctuation newer than its Unicode tables) is left out, and
        anything else unexpected is checked on its own."""
        text = " ".join(f"a{ch}a" for ch in chars)
        words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(text))]
        confirmed, j = [], 0
        for k, ch in enumerate(chars):
            if words[j:j + 3] == ["a", ch, "a"]:
                confirmed.append(ch)
                j += 3
            elif j < len(words) and words[j] == f"a{ch}a":
                j += 1
            else:  # out of step: the rest one by one
                return confirmed + [c for c in chars[k:] if SingleCharTable._confirmed_one(tok, c)]
        return confirmed

    @staticmethod
    def _confirmed_one(tok: Tokenizer, ch: str) -> bool:
        words = [w for w, _ in tok.pre_tokenizer.pre_tokenize_str(tok.normalizer.normalize_str(f"a{ch}a"))]
        return words == ["a", ch, "a"]

    def may_take(self, texts: list[str], min_share: float = MIN_SHARE) -> np.ndarray:
        """Per text, False where it certainly holds fewer than ``min_share`` table characters,
        which :meth:`encode_batch` would encode whole anyway: a caller sends those to the encoder
        itself, with its ASCII texts, and English with a few accented words skips the table's
        pass over every code point (its share is counted exactly only for the texts passed on)."""
        return _may_be_mostly_table(texts, min_share)

    def encode_batch(self, texts: list[str], encode_runs, min_share: float = MIN_SHARE) -> tuple[np.ndarray, np.ndarray]:
        """Ids and per-text lengths: table characters from the table, the runs of other
        characters between them through ``encode_runs(list[str]) -> (ids, lengths)``; a text
        with less than ``min_share`` table characters is one run."""
        joined = "".join(texts)
        cps = np.frombuffer(joined.encode("utf-32-le"), np.uint32)
        n = len(cps)
        text_starts = lengths_to_offsets(np.fromiter(map(len, texts), np.int64, len(texts)))
        table = self._lookup(cps)
        single = table >= 0
        if min_share:
            hits = np.concatenate([[0], np.cumsum(single)])
            hits = hits[text_starts[1:]] - hits[text_starts[:-1]]
            few = hits < min_share * np.diff(text_starts)
            if few.all():
                return encode_runs(texts)
            if few.any():
                single &= ~np.repeat(few, np.diff(text_starts))
        # a unit starts at every table character, at the first character of each run of others,
        # and at every text's start
        starts = single.copy()
        if n:
            starts[1:] |= single[:-1]
            starts[0] = True
        starts[text_starts[:-1][text_starts[:-1] < n]] = True
        unit_starts = np.flatnonzero(starts)
        unit_ends = np.append(unit_starts[1:], n)
        unit_single = single[unit_starts]
        runs = np.flatnonzero(~unit_single)
        run_texts = [joined[a:b] for a, b in zip(unit_starts[runs].tolist(), unit_ends[runs].tolist())]
        run_ids, run_lengths = encode_runs(run_texts) if run_texts else (np.zeros(0, np.int32), np.zeros(0, np.int64))
        unit_lengths = np.ones(len(unit_starts), np.int64)
        unit_lengths[runs] = run_lengths
        out_starts = lengths_to_offsets(unit_lengths)
        ids = np.empty(int(out_starts[-1]), np.int32)
        ids[out_starts[:-1][unit_single]] = table[unit_starts[unit_single]]
        ids[ranges_to_indices(out_starts[:-1][runs], run_lengths)] = run_ids
        # a text's ids start where its first unit's do (units never cross a text's start; an
        # empty text's "first unit" is the next text's)
        unit_at = np.empty(n + 1, np.int64)
        np.cumsum(starts, out=unit_at[:n])
        unit_at[:n] -= 1
        unit_at[n] = len(unit_starts)
        return ids, np.diff(out_starts[unit_at[text_starts]])
