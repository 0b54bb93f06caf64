"""Masking: one module per scheme, registered here by name, and the stage that applies one.

A scheme chooses the positions to mask (:class:`~mlm_pipeline.masking.base.MaskingScheme`);
``prepare`` applies the configured one to every built batch (:func:`mask_batch`, static masks)
and the torch collator applies it at load time (dynamic masks), with the same code. A new scheme
is one module here holding a ``SCHEME`` plus one line in ``registry._BUILT_IN`` (or one
``register_masking_scheme`` call from anywhere).

Built in:

* ``token`` (``token.py``): BERT's, tokens drawn uniformly.
* ``whole-word`` (``whole_word.py``): Google's ``--do_whole_word_mask``.
* ``ngram`` (``ngram.py``): ALBERT's and Megatron's n-grams of whole words, P(n) ∝ 1/n.
* ``span`` (``span.py``): SpanBERT's spans of whole words with geometric lengths, the
  80/10/10 choice made once per span.
"""

from __future__ import annotations

import sys
import types

from mlm_pipeline.masking import base as _base
from mlm_pipeline.masking.apply import mask_batch
from mlm_pipeline.masking.base import MaskingScheme, MaskingSpec, MaskStats, num_to_predict
from mlm_pipeline.masking.base import not_special as _not_special  # noqa: F401 (the tests' names)
from mlm_pipeline.masking.registry import (
    get_masking_scheme,
    masking_scheme_names,
    register_masking_scheme,
    scheme_record,
    unregister_masking_scheme,
)
from mlm_pipeline.masking.token import smallest as _smallest  # noqa: F401

__all__ = [
    "MaskStats",
    "MaskingScheme",
    "MaskingSpec",
    "get_masking_scheme",
    "mask_batch",
    "masking_scheme_names",
    "num_to_predict",
    "register_masking_scheme",
    "scheme_record",
    "unregister_masking_scheme",
]


def _forwarded(name: str) -> property:
    return property(lambda self: getattr(_base, name), lambda self, value: setattr(_base, name, value))


class _Package(types.ModuleType):
    """``_ROWS_PER_CHUNK`` and ``_WORD_SLACK`` (the row chunk and whole-word shortcut sizes,
    which tests vary to show they change nothing) read and set ``base``'s values, which the
    schemes use."""

    _ROWS_PER_CHUNK = _forwarded("ROWS_PER_CHUNK")
    _WORD_SLACK = _forwarded("WORD_SLACK")


sys.modules[__name__].__class__ = _Package
