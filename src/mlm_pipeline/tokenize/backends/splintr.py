"""The fast Unigram backend: ``splintr`` (``splintr-rs`` on PyPI, MIT code), for SentencePiece-style
Unigram tokenizers as XLM-R's and T5's ``tokenizer.json`` files hold them.

It is built from the HF tokenizer's own ``tokenizer.json`` (its post-processor dropped: the
pipeline adds special tokens itself), and only for the configurations it was checked to encode
as HF does, code point by code point: a Unigram model, a normaliser made of ``Precompiled``,
``Replace`` and ``Lowercase`` steps (or none), and a ``Metaspace`` pre-tokenizer that always
prepends ``▁`` and splits, alone or after ``WhitespaceSplit``. Anything else raises
``UnsupportedConfiguration`` when building (a plain ``ValueError`` for another model type), so
the caller keeps HF, with a warning; ALBERT's accent stripping (``NFKD`` +
``StripAccents``) is refused by name, as splintr strips accents otherwise on hundreds of code
points. The self-check still compares every configuration it accepts.

One text per call, on the calling thread: splintr's batch calls use a thread pool that hangs a
forked worker once the parent has used it, so this module never calls them.
"""

from __future__ import annotations

import json

import numpy as np
from tokenizers import Tokenizer

from mlm_pipeline.tokenize.selfcheck import UnsupportedConfiguration

NORMALIZERS = frozenset({"Precompiled", "Replace", "Lowercase"})
"""Normaliser steps splintr reproduces (checked on every code point against HF)."""


def _state(component) -> dict | None:
    return None if component is None else json.loads(component.__getstate__())


def unsupported(spec: dict) -> str | None:
    """Why splintr cannot encode the tokenizer ``spec`` (a parsed ``tokenizer.json``) as HF
    does, or None when it can."""
    model = (spec.get("model") or {}).get("type")
    if model != "Unigram":
        return f"the splintr backend encodes Unigram tokenizers only; this one is {model}"
    norm = spec.get("normalizer")
    steps = [] if norm is None else norm.get("normalizers", []) if norm.get("type") == "Sequence" else [norm]
    kinds = [s.get("type") for s in steps]
    if "StripAccents" in kinds:
        return "splintr strips accents unlike HF (ALBERT's NFKD + StripAccents normaliser)"
    other = [k for k in kinds if k not in NORMALIZERS]
    if other:
        return f"normaliser {', '.join(map(str, other))} is not one splintr was checked on"
    pre = spec.get("pre_tokenizer")
    parts = [] if pre is None else pre.get("pretokenizers", []) if pre.get("type") == "Sequence" else [pre]
    kinds = [p.get("type") for p in parts]
    if kinds not in (["Metaspace"], ["WhitespaceSplit", "Metaspace"]):
        return f"pre-tokenizer {kinds or None} is not Metaspace (after WhitespaceSplit or alone)"
    meta = parts[-1]
    if meta.get("replacement") != "\u2581" or meta.get("prepend_scheme", "always") != "always" \
            or not meta.get("split", True):
        return "Metaspace other than replacement '\u2581', prepend_scheme 'always', split true"
    return None


class SplintrEncoder:
    name = "splintr"

    def __init__(self, tokenizer: Tokenizer):
        if type(tokenizer.model).__name__ != "Unigram":  # WordPiece, BPE: not news
            raise ValueError(f"the splintr backend encodes Unigram tokenizers only; this one is "
                             f"{type(tokenizer.model).__name__}")
        import splintr  # ImportError: not installed (the fast-unigram extra)

        # the components' own JSON, not the whole tokenizer's (a 250k vocabulary's took seconds)
        spec = {"model": {"type": "Unigram"}, "normalizer": _state(tokenizer.normalizer),
                "pre_tokenizer": _state(tokenizer.pre_tokenizer)}
        why = unsupported(spec)
        if why is not None:
            raise UnsupportedConfiguration(why)
        # ids of the text only, as HF's add_special_tokens=False: serialised without the
        # post-processor (put back at once; loading runs on one thread)
        kept = tokenizer.post_processor
        tokenizer.post_processor = None
        try:
            data = tokenizer.to_str().encode("utf-8")
        finally:
            tokenizer.post_processor = kept
        self._encode = splintr.from_json_bytes(data).encode_flat

    @staticmethod
    def version() -> str:
        from importlib.metadata import version

        return version("splintr-rs")

    def encode_batch(self, texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """One ``encode_flat`` call per text (little-endian uint32 ids as bytes), joined once."""
        if not texts:
            return np.zeros(0, np.int32), np.zeros(0, np.int64)
        bufs = list(map(self._encode, texts))
        lengths = np.fromiter(map(len, bufs), dtype=np.int64, count=len(bufs)) >> 2
        # a bytearray keeps the array writable, as every other backend's is; ids < 2**31
        return np.frombuffer(bytearray().join(bufs), dtype="<i4"), lengths
