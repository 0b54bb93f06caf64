"""Tokenizers: loading (vocab.txt, tokenizer.json, HF model directories) and encoding backends.

``load_tokenizer`` returns a ``TextTokenizer``: the HF tokenizer (the reference, and what
``inspect`` and the loader decode with) plus the fastest exact backend for ``encode_batch``.
"""

from mlm_pipeline.errors import TokenizerError
from mlm_pipeline.tokenize.backends import BACKENDS, backend_names, register_backend
from mlm_pipeline.tokenize.backends.hf import ENCODE_BATCH, encode_ids
from mlm_pipeline.tokenize.google_rules import TOKENIZER_FLAVORS, read_google_vocab
from mlm_pipeline.tokenize.loading import (SpecialIds, TextTokenizer, case_mismatch, load_tokenizer, missing_unk_message,
                                           unspellable_word_error)

__all__ = ["BACKENDS", "ENCODE_BATCH", "SpecialIds", "TOKENIZER_FLAVORS", "TextTokenizer", "TokenizerError",
           "backend_names", "case_mismatch", "encode_ids", "load_tokenizer", "missing_unk_message", "read_google_vocab",
           "register_backend", "unspellable_word_error"]
