"""Tokenizer backends: one module each, one registry line each, HF first as the reference.

A backend is a class built from a loaded HF ``tokenizers.Tokenizer`` with ``name``,
``version()`` and ``encode_batch(texts) -> (ids int32, lengths int64)`` (no special tokens).
Building it raises (``ImportError``, ``ValueError``...) when the library is missing or does
not implement the tokenizer's configuration. ``auto`` takes the first backend, fastest first,
that builds and passes the self-check against the reference; the output never depends on the
choice. The reference is HF, except for a SentencePiece ``.model``: there it is the
``sentencepiece`` library (``from_hf = False``: built from the model, not from HF), and HF's
conversion of the model is the candidate that is checked.
"""

from __future__ import annotations

from typing import Callable

from mlm_pipeline.tokenize.backends.fastokens import FastokensEncoder
from mlm_pipeline.tokenize.backends.hf import HFEncoder
from mlm_pipeline.tokenize.backends.nanotoken import NanotokenEncoder
from mlm_pipeline.tokenize.backends.splintr import SplintrEncoder
from mlm_pipeline.tokenize.backends.spm import SentencePieceEncoder

BACKENDS: dict[str, Callable] = {}


def register_backend(cls) -> None:
    BACKENDS[cls.name] = cls


# ``auto`` tries them in this order, fastest first, up to the reference (HF, or sentencepiece
# for a .model), which is always there
register_backend(FastokensEncoder)
register_backend(NanotokenEncoder)
register_backend(SentencePieceEncoder)
register_backend(SplintrEncoder)  # Unigram tokenizer.json (XLM-R, T5); after sentencepiece, the reference of a .model
register_backend(HFEncoder)


def backend_names() -> list[str]:
    return ["auto", *BACKENDS]
