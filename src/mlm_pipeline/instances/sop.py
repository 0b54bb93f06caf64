"""``sop``: ALBERT's sentence-order pairs (default mode), with ALBERT's ``token_boundary`` feature.

Segments are cut as BERT cuts them (``nsp.py``: per document a target length, chunks of whole
sentences, A the first ``a_end`` sentences of a chunk, the pair truncated from a random end of
the longer segment). What ALBERT changes (google-research/albert ``create_pretraining_data.py``):

* half the time A and B are swapped, with label 1 (the sentence-order label); else label 0;
* a chunk with one sentence takes B from a random other document, with label 1, as ALBERT does
  (its unused-sentence bookkeeping is BERT's);
* with ``--random-next-sentence`` the pairs are BERT's next-sentence pairs (ALBERT's NSP variant);
* every example carries ``token_boundary``: 1 for a token that starts a word, ``[CLS]`` and
  ``[SEP]``, 0 for a continuation, by ALBERT's test of the token's text (``##`` for WordPiece,
  ``_is_start_piece_sp`` for SentencePiece pieces: ``tokenize/albert_rules.py``).

Whole-word masking is on unless a run turns it off, as in ALBERT's script. The reference mode
(``albert_reference.py``) reproduces ALBERT's script example for example.
"""

from __future__ import annotations

import functools

import numpy as np

from mlm_pipeline.instances.albert_reference import ALBERT_REFERENCE
from mlm_pipeline.instances.base import BuildContext, Objective, TokenizedDocs
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.instances.nsp import build_pairs
from mlm_pipeline.tokenize.albert_rules import UNDERLINE, kind_table


@functools.lru_cache(maxsize=8)
def boundary_table(tokenizer) -> np.ndarray:
    """Per id, 1 if ALBERT counts the token as a word start (``token_boundary``), else 0 (uint8):
    WordPiece by the ``##`` prefix, a SentencePiece vocabulary (pieces with ``▁``) by ALBERT's
    ``_is_start_piece_sp``, any other by the tokenizer's own continuation marker."""
    strings = tokenizer.convert_ids_to_tokens(range(tokenizer.vocab_size))
    model_type = getattr(tokenizer, "model_type", None)  # (wordpiece, sentencepiece, byte-level-bpe)
    if model_type is None:
        model_type = ("wordpiece" if type(tokenizer.tokenizer.model).__name__ == "WordPiece"
                      else "sentencepiece" if any(t.startswith(UNDERLINE) for t in strings) else "other")
    if model_type in ("wordpiece", "sentencepiece"):
        return (kind_table(strings, wordpiece=model_type == "wordpiece") != 0).astype(np.uint8)
    return (~np.asarray(tokenizer.is_continuation[: tokenizer.vocab_size], bool)).astype(np.uint8)


def word_continuation(tokenizer) -> np.ndarray:
    """Per id, whether it continues a word for masking: the complement of ``token_boundary``, so
    n-grams and whole words are ALBERT's words (a CJK piece is one, as in ALBERT's script)."""
    return boundary_table(tokenizer) == 0


def with_token_boundary(batch: InstanceBatch, table: np.ndarray) -> InstanceBatch:
    """``batch`` with ``token_boundary`` from its (unmasked) ids; ``[CLS]`` and both ``[SEP]`` 1."""
    # one pass: ids past the table read its last entry (clip), the 0/1 values taken as int8
    boundary = np.take(table.view(np.int8), batch.input_ids, mode="clip")
    starts = batch.offsets[:-1]
    boundary[starts] = 1  # [CLS]
    boundary[batch.offsets[1:] - 1] = 1  # the last [SEP]
    seg = batch.segment_ids
    segment_b_start = np.flatnonzero(seg[1:] > seg[:-1]) + 1  # where segment 0 turns to 1
    if len(seg) and seg[0] > 0:
        segment_b_start = np.insert(segment_b_start, 0, 0)
    boundary[segment_b_start - 1] = 1  # the middle [SEP], the last token of segment 0
    batch.token_boundary = boundary
    return batch


def build(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    """The ``sop`` objective: nsp's pairs (:func:`~mlm_pipeline.instances.nsp.build_pairs`) in
    ALBERT's sentence order, or BERT's with ``--random-next-sentence``, and ALBERT's ``token_boundary``."""
    batch, stats = build_pairs(docs, ctx, sentence_order=not ctx.settings.random_next_sentence)
    return with_token_boundary(batch, boundary_table(ctx.tokenizer)), stats.to_dict()


def check_settings(settings) -> None:
    """``sop``'s settings checks: ALBERT's pairs always have two segments."""
    if settings.max_seq_length < 5:
        raise ValueError(f"--objective sop needs --max-seq-length >= 5, got {settings.max_seq_length}")


OBJECTIVE = Objective(
    name="sop",
    build=build,
    help="ALBERT sentence-order pairs [CLS] A [SEP] B [SEP]: label 1 when A and B are swapped (or B comes from "
    "another document), with ALBERT's token_boundary feature; whole-word masking by default",
    has_nsp_labels=True,
    reference=ALBERT_REFERENCE,
    check=check_settings,
    cuts_long_sentences=True,
    default_masking_scheme="ngram",
    word_continuation=word_continuation,
    label_names=("in order", "swapped, or B from another document"),
    sentence_label="sentence_order_label",
)
