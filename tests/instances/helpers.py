"""Hand-built token blocks for the builder tests: distinct ids make every token traceable."""

from __future__ import annotations

import numpy as np

from mlm_pipeline.instances.base import TokenizedDocs

CLS, SEP = 101, 102


def docs_of(doc_sentence_lengths: list[list[int]]) -> TokenizedDocs:
    lens = [n for d in doc_sentence_lengths for n in d]
    ids = np.arange(1000, 1000 + sum(lens), dtype=np.int32)  # distinct ids to follow tokens
    return TokenizedDocs(ids=ids, sentence_lengths=np.array(lens), doc_sentences=np.array([len(d) for d in doc_sentence_lengths]))


def bodies(batch) -> list[list[int]]:
    return [batch.row(i)["input_ids"][1:-1] for i in range(len(batch))]
