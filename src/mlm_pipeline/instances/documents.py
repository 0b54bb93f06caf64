"""``sentences`` and ``documents``: tokenized documents, for trainers that build their instances themselves.

Megatron-LM (and NeMo) read tokenized documents and make their BERT samples, pairs, NSP labels
and masks as they train, so they take our tokens, not our instances. Each row is one document as
it was read, whole: its sentences' token ids back to back, no ``[CLS]``/``[SEP]``, no truncation,
unmasked, in input order (the trainer shuffles). ``sentences`` also records where each sentence
starts, in the row's ``document_starts`` (a row is one document here, so its "documents" are its
sentences): the sentence-level layout of ``preprocess_data.py --split-sentences``, which Megatron
BERT needs; ``documents`` writes each document as one sequence.

Both are written by ``--format megatron`` only (:mod:`mlm_pipeline.formats.megatron`), and count
the documents megatron-core's BERT dataset would leave out.
"""

from __future__ import annotations

import numpy as np

from mlm_pipeline.instances.base import BuildContext, Objective, TokenizedDocs
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets

FORMATS = ("megatron",)
"""The output formats that take tokenized documents (their trainers build instances)."""


def document_rows(docs: TokenizedDocs, *, sentence_starts: bool) -> InstanceBatch:
    """One unmasked row per document; with ``sentence_starts``, each sentence's start in its row."""
    doc_tokens = np.add.reduceat(docs.sentence_lengths, docs.doc_offsets[:-1]) if len(docs.doc_sentences) else \
        np.zeros(0, np.int64)
    offsets = lengths_to_offsets(doc_tokens)
    batch = InstanceBatch.unmasked(docs.ids.astype(np.int32, copy=False), np.zeros(len(docs.ids), np.int8), offsets)
    if sentence_starts:
        doc_of_sentence = np.repeat(np.arange(len(docs.doc_sentences)), docs.doc_sentences)
        batch.document_starts = (docs.sentence_offsets[:-1] - offsets[doc_of_sentence]).astype(np.int32)
        batch.document_offsets = docs.doc_offsets.astype(np.int64)
    return batch


def _counts(batch: InstanceBatch) -> dict[str, int]:
    from mlm_pipeline.formats.megatron import bert_skips, sequence_layout

    lengths, doc_sequences = sequence_layout(batch)
    return {"instances": len(batch), "megatron_sequences": len(lengths), **bert_skips(lengths, doc_sequences)}


def build_sentences(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    batch = document_rows(docs, sentence_starts=True)
    return batch, _counts(batch)


def build_documents(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    batch = document_rows(docs, sentence_starts=False)
    return batch, _counts(batch)


def check(settings) -> None:
    """Tokenized documents go to a format whose trainer builds and masks instances: no masks, no
    copies, no other format."""
    name = f"--objective {settings.objective}"
    if settings.format not in FORMATS:
        raise ValueError(f"{name} writes tokenized documents for trainers that build their instances themselves: "
                         f"it needs --format {' or '.join(FORMATS)}, not {settings.format}")
    if settings.masking != "none":
        raise ValueError(f"{name} writes tokens unmasked: Megatron masks as it builds its samples, so "
                         f"--masking {settings.masking} does not apply (leave it out)")
    if settings.dupe_factor > 1:
        raise ValueError(f"{name} writes each document once: --dupe-factor {settings.dupe_factor} would write "
                         "identical copies (Megatron draws its epochs from the same documents itself); leave it at 1")


def check_format(settings) -> None:
    """A format of :data:`FORMATS` takes tokenized documents only: ``ValueError`` naming the
    objectives that write them when another one (BERT's pairs, masks) is asked for."""
    if settings.format in FORMATS and settings.objective not in (SENTENCES.name, DOCUMENTS.name):
        raise ValueError(
            f"--format {settings.format} writes tokenized documents, not instances: Megatron-LM builds its BERT "
            f"samples (sentence pairs, NSP labels, masks) itself, so --objective {settings.objective} does not apply. "
            f"Use --objective sentences (one sequence per sentence, what Megatron BERT reads) or --objective "
            "documents (one sequence per document)")


_ABOUT = "tokenized documents for --format megatron (Megatron builds and masks its instances): "
SENTENCES = Objective(
    name="sentences", build=build_sentences, has_nsp_labels=False, default_masking="none", check=check,
    help=_ABOUT + "one sequence per sentence, as Megatron BERT reads (preprocess_data.py --split-sentences)")
DOCUMENTS = Objective(
    name="documents", build=build_documents, has_nsp_labels=False, default_masking="none", check=check,
    help=_ABOUT + "one sequence per document")
