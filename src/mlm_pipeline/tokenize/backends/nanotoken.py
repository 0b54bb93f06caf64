"""The fast backend: ``nanotoken`` (MIT), a WordPiece encoder that reproduces HF ``tokenizers``.

It is built from the HF tokenizer's own ``tokenizer.json`` (normaliser, pre-tokeniser, vocab,
added tokens), so both see one configuration; configurations it does not implement raise
``UnsupportedTokenizerError`` when loading, and the caller keeps HF. It runs on the calling
thread (``parallel=False``): the pipeline's parallelism is its worker processes.

Its encodings of whitespace-delimited chunks are cached per thread, in two tables (raw chunks and
normalised words) of up to ``nanotoken``'s default of 2**20 entries each. On text with a long
tail of distinct words those fill, and a process holds about 200 MB more for them; the pipeline
caps them at :data:`CACHE_ENTRIES` instead (``NANOTOKEN_CACHE_ENTRIES`` in the environment, which
``nanotoken`` reads itself, overrides this).
"""

from __future__ import annotations

import os

import numpy as np
from tokenizers import Tokenizer

CACHE_ENTRIES = 1 << 17
"""Entries per cache table. On 58 MB of Zipf-distributed text (``benchmarks/zipf_text.py``: 1.5
million distinct words per 110 MB), a one-worker run's peak RSS was 172, 187, 213-220 and 406 MB
with 2**16, 2**17, 2**18 and 2**20 entries, at the same speed: the words common enough to repeat
fit. On WikiText-2 (33,000 distinct words) nothing changes (docs/performance.md)."""


def cap_cache() -> None:
    """Cap ``nanotoken``'s chunk caches at :data:`CACHE_ENTRIES` entries, unless the user set
    ``NANOTOKEN_CACHE_ENTRIES``. The setting is the process's (every thread, tables already
    filled included), and forked workers inherit it."""
    import nanotoken

    if "NANOTOKEN_CACHE_ENTRIES" not in os.environ:
        nanotoken.set_cache_entries(CACHE_ENTRIES)


class NanotokenEncoder:
    name = "nanotoken"

    def __init__(self, tokenizer: Tokenizer):
        from nanotoken import WordPieceTokenizer  # ImportError: not installed

        cap_cache()
        self._backend = WordPieceTokenizer.from_json(tokenizer.to_str())

    @staticmethod
    def version() -> str:
        from importlib.metadata import version

        return version("nanotoken")

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        ids, offsets = self._backend.encode_batch(texts, add_special_tokens=False, parallel=False)
        return ids.astype(np.int32), np.diff(offsets)
