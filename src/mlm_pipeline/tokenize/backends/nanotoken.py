"""The fast backend: ``nanotoken`` (MIT), a WordPiece encoder that reproduces HF ``tokenizers``.

It is built from the HF tokenizer's own ``tokenizer.json`` (normaliser, pre-tokeniser, vocab,
added tokens), so both see one configuration; configurations it does not implement raise
``UnsupportedTokenizerError`` when loading, and the caller keeps HF. It runs on the calling
thread (``parallel=False``): the pipeline's parallelism is its worker processes. Texts made mostly
of characters BERT isolates (Chinese, Japanese) take its character table instead
(:mod:`~mlm_pipeline.tokenize.backends.single_chars`), with only the runs between them encoded.

Its encodings of whitespace-delimited chunks are cached per thread, in two tables (raw chunks and
normalised words) of up to ``nanotoken``'s default of 2**20 entries each. On text with a long
tail of distinct words those fill (a one-worker run's peak RSS reached 431 MB on such text,
against about 180 MB on WikiText-2), so the pipeline caps them at :data:`CACHE_ENTRIES`
instead, unless a size was chosen already: ``NANOTOKEN_CACHE_ENTRIES`` in the environment (which
``nanotoken`` reads itself), or a program's own ``nanotoken.set_cache_entries`` call before it
loads a tokenizer through the pipeline.
"""

from __future__ import annotations

import os

import numpy as np
from tokenizers import Tokenizer

from mlm_pipeline.instances.batch import lengths_to_offsets, ranges_to_indices
from mlm_pipeline.tokenize.backends.single_chars import SingleCharTable

CACHE_ENTRIES = 1 << 19
"""Entries per cache table: on text with a long tail of distinct words, as fast as nanotoken's
default and about 130 MB less per process (2**17 held 80 MB less again but ran 7% slower); on
WikiText-2 no different (docs/performance.md, "Text with a long tail of words")."""

NANOTOKEN_DEFAULT_ENTRIES = 1 << 20
"""nanotoken's own size, which tells that nobody chose one."""


def cap_cache() -> None:
    """Cap ``nanotoken``'s chunk caches at :data:`CACHE_ENTRIES` entries if their size is still
    nanotoken's default and ``NANOTOKEN_CACHE_ENTRIES`` is unset. The setting is the process's
    (every thread, tables already filled included), and forked workers inherit it."""
    import nanotoken

    if "NANOTOKEN_CACHE_ENTRIES" not in os.environ and nanotoken.get_cache_entries() == NANOTOKEN_DEFAULT_ENTRIES:
        nanotoken.set_cache_entries(CACHE_ENTRIES)


class NanotokenEncoder:
    name = "nanotoken"

    def __init__(self, tokenizer: Tokenizer):
        kind = type(tokenizer.model).__name__
        if kind != "WordPiece":  # said before importing the library (36 ms) and serialising the tokenizer
            raise ValueError(f'unsupported tokenizer: model type "{kind}" (nanotoken only implements WordPiece)')
        from nanotoken import WordPieceTokenizer  # ImportError: not installed
        cap_cache()
        self._backend = WordPieceTokenizer.from_json(tokenizer.to_str())
        try:
            self._table: SingleCharTable | None = SingleCharTable(tokenizer)
        except ValueError:  # not BERT's normaliser and pre-tokeniser: no table, same ids
            self._table = None

    @staticmethod
    def version() -> str:
        from importlib.metadata import version

        return version("nanotoken")

    def _encode(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        ids, offsets = self._backend.encode_batch(texts, add_special_tokens=False, parallel=False)
        return ids.astype(np.int32), np.diff(offsets)

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        # ASCII texts (str.isascii is O(1)) hold no table character
        wide = [i for i, t in enumerate(texts) if not t.isascii()] if self._table is not None else []
        if wide:  # texts with too few table characters are encoded whole, with the ASCII ones
            may = self._table.may_take([texts[i] for i in wide])
            wide = [i for i, m in zip(wide, may.tolist()) if m]
        if not wide:
            return self._encode(texts)
        if len(wide) == len(texts):
            return self._table.encode_batch(texts, self._encode)
        in_table = np.zeros(len(texts), bool)
        in_table[wide] = True
        rest = np.flatnonzero(~in_table)
        ids_t, lens_t = self._table.encode_batch([texts[i] for i in wide], self._encode)
        ids_r, lens_r = self._encode([texts[i] for i in rest.tolist()])
        # back in the texts' order: both parts' rows, each from its own ids
        lengths = np.empty(len(texts), np.int64)
        lengths[wide], lengths[rest] = lens_t, lens_r
        starts = lengths_to_offsets(lengths)[:-1]
        ids = np.empty(int(lengths.sum()), np.int32)
        ids[ranges_to_indices(starts[wide], lens_t)] = ids_t
        ids[ranges_to_indices(starts[rest], lens_r)] = ids_r
        return ids, lengths
