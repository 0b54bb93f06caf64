"""The fast BPE backend: ``fastokens`` (Apache-2.0), a BPE encoder that reproduces HF ``tokenizers``.

It is built from the HF tokenizer's own ``tokenizer.json`` (the source of truth: normaliser,
byte-level pre-tokeniser, merges, added tokens such as RoBERTa's ``<mask>`` with ``lstrip``),
with the post-processor removed: fastokens refuses RoBERTa's ``RobertaProcessing``, and the
pipeline adds special tokens itself. Configurations it does not implement raise when loading,
and the caller keeps HF. It is used for BPE models only: WordPiece has ``nanotoken``.

fastokens encodes a batch on a pool of threads of its own, as many as the cores (the caller
among them), started at the process's first call and sized from ``FASTOKENS_BPE_THREADS`` read
then. The pipeline's parallelism is its worker
processes (one core each), and the local pool decides between fork and spawn by the Python
threads it can see, which a native pool is not; so the backend sets that variable to 1 before
the process's first call, and fastokens then encodes on the calling thread.
"""

from __future__ import annotations

import os

import numpy as np
from tokenizers import Tokenizer

THREADS_VARIABLE = "FASTOKENS_BPE_THREADS"


class FastokensEncoder:
    name = "fastokens"

    def __init__(self, tokenizer: Tokenizer):
        model = type(tokenizer.model).__name__
        if model != "BPE":  # said before importing the library (40-90 ms)
            raise ValueError(f"the fastokens backend encodes BPE tokenizers only, not {model}")
        from fastokens import Tokenizer as FastTokenizer  # ImportError: not installed
        # without its post-processor: special tokens are the pipeline's (fastokens refuses RoBERTa's);
        # unset for the moment of serialising (a JSON round trip took 3x as long: 0.09 s)
        post_processor = tokenizer.post_processor
        tokenizer.post_processor = None
        try:
            spec = tokenizer.to_str()
        finally:
            tokenizer.post_processor = post_processor
        os.environ[THREADS_VARIABLE] = "1"  # before the process's first call (see the module docstring)
        self._backend = FastTokenizer.from_json_str(spec)

    @staticmethod
    def version() -> str:
        from importlib.metadata import version

        return version("fastokens")

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        ids, offsets = self._backend.encode_batch_flat(texts, add_special_tokens=False)
        # little-endian uint32 ids and uint64 offsets; ids fit int32 (vocabularies are far smaller)
        return (np.frombuffer(ids, dtype="<u4").astype(np.int32),
                np.diff(np.frombuffer(offsets, dtype="<u8")).astype(np.int64))
