"""Token windows: the block's stream cut into equal windows, exact boundaries on hand-built documents."""

from __future__ import annotations

from mlm_pipeline.instances.tokens import build_token_windows

from instances.helpers import CLS, SEP, bodies, docs_of


def test_token_windows_cover_the_stream():
    docs = docs_of([[5, 5], [7]])
    batch = build_token_windows(docs, max_seq_length=6, cls_id=CLS, sep_id=SEP)
    assert [len(b) for b in bodies(batch)] == [4, 4, 4, 4, 2]  # a stream of 18 incl. one separator
    flat = [t for b in bodies(batch) for t in b if t != SEP]
    assert flat == list(range(1000, 1017))


def test_a_window_never_ends_on_a_document_separator():
    docs = docs_of([[4], [3]])  # stream: 4 tokens, separator, 3 tokens
    batch = build_token_windows(docs, max_seq_length=7, cls_id=CLS, sep_id=SEP)
    # cap 5: the first window would end on the separator, which is dropped
    assert bodies(batch) == [[1000, 1001, 1002, 1003], [1004, 1005, 1006]]
    assert batch.next_sentence_labels is None and not batch.segment_ids.any()
