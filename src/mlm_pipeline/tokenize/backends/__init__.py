"""Tokenizer backends: one module each, one registry line each, HF first as the reference.

A backend is a class built from a loaded HF ``tokenizers.Tokenizer`` with ``name``,
``version()`` and ``encode_batch(texts) -> (ids int32, lengths int64)`` (no special tokens).
Building it raises (``ImportError``, ``ValueError``...) when the library is missing or does
not implement the tokenizer's configuration. ``auto`` takes the first backend, fastest first,
that builds and passes the self-check against HF; the output never depends on the choice.
"""

from __future__ import annotations

from typing import Callable

from mlm_pipeline.tokenize.backends.hf import HFEncoder
from mlm_pipeline.tokenize.backends.nanotoken import NanotokenEncoder

BACKENDS: dict[str, Callable] = {}


def register_backend(cls) -> None:
    BACKENDS[cls.name] = cls


# ``auto`` tries them in this order: fastest first, HF (always there, the reference) last
register_backend(NanotokenEncoder)
register_backend(HFEncoder)


def backend_names() -> list[str]:
    return ["auto", *BACKENDS]
