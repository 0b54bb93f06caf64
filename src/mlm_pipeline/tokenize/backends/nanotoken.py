"""The fast backend: ``nanotoken`` (MIT), a WordPiece encoder that reproduces HF ``tokenizers``.

It is built from the HF tokenizer's own ``tokenizer.json`` (normaliser, pre-tokeniser, vocab,
added tokens), so both see one configuration; configurations it does not implement raise
``UnsupportedTokenizerError`` when loading, and the caller keeps HF. It runs on the calling
thread (``parallel=False``): the pipeline's parallelism is its worker processes.
"""

from __future__ import annotations

import numpy as np
from tokenizers import Tokenizer


class NanotokenEncoder:
    name = "nanotoken"

    def __init__(self, tokenizer: Tokenizer):
        from nanotoken import WordPieceTokenizer  # ImportError: not installed

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
