"""FULL-SENTENCES packing: exact boundaries on hand-built documents."""

from __future__ import annotations

from mlm_pipeline.instances.packed import build_packed_instances

from instances.helpers import CLS, SEP, bodies, docs_of


def test_whole_sentences_are_packed_across_documents_with_a_separator():
    docs = docs_of([[3, 4], [2, 6]])  # tokens 1000..1014
    batch = build_packed_instances(docs, max_seq_length=12, cls_id=CLS, sep_id=SEP)
    # cap 10: [3+4 | sep | 2] = 10, then [6]
    assert bodies(batch) == [
        [1000, 1001, 1002, 1003, 1004, 1005, 1006, SEP, 1007, 1008],
        [1009, 1010, 1011, 1012, 1013, 1014],
    ]
    assert all(batch.row(i)["input_ids"][0] == CLS and batch.row(i)["input_ids"][-1] == SEP for i in range(len(batch)))
    assert batch.next_sentence_labels is None and not batch.segment_ids.any()


def test_a_sentence_never_splits_unless_longer_than_an_instance():
    docs = docs_of([[4, 4, 4], [13]])
    batch = build_packed_instances(docs, max_seq_length=12, cls_id=CLS, sep_id=SEP)
    lens = [len(b) for b in bodies(batch)]
    # [4+4] (third sentence does not fit), [4 + sep] -> separator trimmed, [10], [3]
    assert lens == [8, 4, 10, 3]
    flat = [t for b in bodies(batch) for t in b if t != SEP]
    assert flat == list(range(1000, 1025))  # every token once, in order

