"""FULL-SENTENCES packing: exact boundaries on hand-built documents."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings, strategies as st

from mlm_pipeline.instances import packed
from mlm_pipeline.instances.base import TokenizedDocs
from mlm_pipeline.instances.packed import (best_fit_rows, build_best_fit_instances, build_packed_instances,
                                          pack_full_sentences, stream_document_starts)
from mlm_pipeline.instances.single_segment import single_segment_batch, token_stream

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


# -- where each row's documents start ------------------------------------------------------------


def _documents(batch, i):
    """Row ``i`` cut at its recorded document starts."""
    ids = batch.row(i)["input_ids"]
    bounds = batch.cu_seqlens(i).tolist()
    return [ids[a:b] for a, b in zip(bounds, bounds[1:])]


def test_full_sentences_record_a_document_start_after_each_separator_inside_a_row():
    docs = docs_of([[3, 4], [2, 6], [1], [5]])
    batch = build_packed_instances(docs, max_seq_length=12, cls_id=CLS, sep_id=SEP)
    # cap 10: [d0 3+4 | sep | d1 2] = 10, [d1 6 | sep | d2 1 | sep] = 9 (the trailing sep dropped), [d3 5]
    assert bodies(batch) == [
        [1000, 1001, 1002, 1003, 1004, 1005, 1006, SEP, 1007, 1008],
        [1009, 1010, 1011, 1012, 1013, 1014, SEP, 1015],
        [1016, 1017, 1018, 1019, 1020],
    ]
    assert [batch.row(i)["document_starts"] for i in range(len(batch))] == [[0, 9], [0, 8], [0]]
    assert _documents(batch, 0) == [[CLS, *range(1000, 1007), SEP], [1007, 1008, SEP]]
    assert _documents(batch, 1) == [[CLS, *range(1009, 1015), SEP], [1015, SEP]]


def test_doc_sentences_never_put_two_documents_in_a_row():
    docs = docs_of([[3, 4], [2, 6], [1], [5, 5]])
    batch = build_packed_instances(docs, max_seq_length=12, cls_id=CLS, sep_id=SEP, cross_documents=False)
    assert bodies(batch) == [
        list(range(1000, 1007)), list(range(1007, 1015)), [1015], list(range(1016, 1026)),
    ]
    assert all(batch.row(i)["document_starts"] == [0] for i in range(len(batch)))
    assert not any(SEP in body for body in bodies(batch))


def test_best_fit_places_the_longest_piece_first_into_the_tightest_row():
    # capacity 10: 7 opens row 0 (room 3), 6 row 1 (room 4), 4 fits only row 1 (room 0),
    # 3 fits row 0 exactly, 3 opens row 2
    assert best_fit_rows(np.array([3, 7, 4, 6, 3]), 10) == [[1, 0], [3, 2], [4]]


def test_best_fit_packs_whole_documents_each_cls_to_sep_and_splits_long_ones():
    docs = docs_of([[3, 2], [12], [4], [1, 1]])  # documents of 5, 12, 4 and 2 tokens
    batch, counts = build_best_fit_instances(docs, max_seq_length=12, cls_id=CLS, sep_id=SEP)
    # pieces of at most 10 tokens: 5, 10 + 2, 4, 2 -> sizes with [CLS] [SEP]: 7, 12, 4, 6, 4;
    # 12 fills a row, 7 opens one (room 5), 6 opens one (room 6), the first 4 takes room 5, the second room 6
    assert counts == {"document_pieces": 5, "documents_split": 1}
    rows = [_documents(batch, i) for i in range(len(batch))]
    assert rows == [
        [[CLS, *range(1005, 1015), SEP]],  # the first 10 tokens of the 12-token document: a full row
        [[CLS, *range(1000, 1005), SEP], [CLS, 1015, 1016, SEP]],  # 7 + the split document's last 2 tokens
        [[CLS, *range(1017, 1021), SEP], [CLS, 1021, 1022, SEP]],  # 6 + 4
    ]
    assert all(len(batch.row(i)["input_ids"]) <= 12 for i in range(len(batch)))
    # every token once, each document's pieces in order
    flat = sorted(t for i in range(len(batch)) for t in batch.row(i)["input_ids"] if t not in (CLS, SEP))
    assert flat == list(range(1000, 1023))


def test_packing_settings_belong_to_packed_and_best_fit_is_not_doc_sentences():
    from mlm_pipeline.config import build_config
    from mlm_pipeline.errors import ConfigError

    base = {"inputs": ["x.txt"], "output": "out", "tokenizer": "vocab.txt"}
    assert build_config({**base, "objective": "packed", "packing": "best-fit"}).packing == "best-fit"
    with pytest.raises(ConfigError, match="--objective nsp does not use them"):
        build_config({**base, "objective": "nsp", "cross_document": False})
    with pytest.raises(ConfigError, match="--objective tokens does not use them"):
        build_config({**base, "objective": "tokens", "packing": "best-fit", "dupe_factor": 1})
    with pytest.raises(ConfigError, match="--no-cross-document"):
        build_config({**base, "objective": "packed", "packing": "best-fit", "cross_document": False})


# -- the packing against the item-by-item loop it replaced ----------------------------------------


def _reference_pack(item_len, is_sep, cap, *, cross_documents=True):
    """FULL-SENTENCES as the loop it was, one step per item: the definition the search keeps."""
    starts, lens = [], []
    pos = cur_start = cur_len = 0
    for length, sep in zip(item_len, is_sep):
        if sep:
            if cur_len == 0 or cur_len + 1 > cap or not cross_documents:
                if cur_len:
                    starts.append(cur_start)
                    lens.append(cur_len)
                cur_len = 0
                pos += 1
                cur_start = pos
                continue
            cur_len += 1
            pos += 1
            continue
        if cur_len + length > cap:
            if cur_len:
                starts.append(cur_start)
                lens.append(cur_len)
            cur_start, cur_len = pos, 0
            while length > cap:
                starts.append(pos)
                lens.append(cap)
                pos += cap
                length -= cap
            cur_start = pos
        cur_len += length
        pos += length
    if cur_len:
        starts.append(cur_start)
        lens.append(cur_len)
    return starts, lens


def _check_against_reference(item_len, is_sep, cap, cross_documents):
    starts, lens = pack_full_sentences(np.array(item_len, np.int64), np.array(is_sep, bool), cap,
                                       cross_documents=cross_documents)
    assert starts.dtype == lens.dtype == np.int64
    assert (starts.tolist(), lens.tolist()) == _reference_pack(item_len, is_sep, cap, cross_documents=cross_documents)


# an item: a separator (length 1), or a sentence of 0 to 3 rows' worth (0: none is made, but the loop allows it)
_ITEMS = st.lists(st.one_of(st.just((1, True)), st.tuples(st.integers(0, 40), st.just(False))), max_size=60)


@pytest.mark.parametrize("lockstep", [1, packed._LOCKSTEP])  # 1: every walk between sure openers in numpy
def test_full_sentences_cut_where_the_item_by_item_loop_cut(lockstep):
    @settings(max_examples=500, deadline=None)
    @given(_ITEMS, st.integers(1, 14), st.booleans())
    def check(items, cap, cross_documents):
        _check_against_reference([n for n, _ in items], [s for _, s in items], cap, cross_documents)

    default, packed._LOCKSTEP = packed._LOCKSTEP, lockstep
    try:
        check()
    finally:
        packed._LOCKSTEP = default


def test_full_sentences_cut_where_the_loop_cut_on_a_stream_shaped_like_english():
    # sentences of ~25 tokens, some longer than a row, documents of ~1.5 sentences; the rows' cap
    rng = np.random.default_rng(7)
    doc_sentences = rng.geometric(1 / 1.5, 40_000)
    sentence_lengths = np.maximum(1, rng.gamma(2.0, 12.5, int(doc_sentences.sum())).round().astype(np.int64))
    sentence_lengths[rng.integers(0, len(sentence_lengths), 400)] = rng.integers(127, 600, 400)
    docs = TokenizedDocs(ids=np.zeros(int(sentence_lengths.sum()), np.int32), sentence_lengths=sentence_lengths,
                         doc_sentences=doc_sentences)
    _, item_len, is_sep = token_stream(docs, SEP)
    for cross_documents in (True, False):
        _check_against_reference(item_len.tolist(), is_sep.tolist(), 126, cross_documents)


@settings(max_examples=300, deadline=None)
@given(st.lists(st.integers(1, 12), min_size=1, max_size=40), st.integers(2, 9), st.integers(1, 3), st.randoms())
def test_rows_and_their_document_starts_in_shuffled_order_are_the_rows_taken_one_by_one(
        sentence_lengths, cap, copies, random):
    # documents of one to three sentences; rows as packed, then copies in a random order
    doc_sentences, left = [], len(sentence_lengths)
    while left:
        doc_sentences.append(min(left, random.randint(1, 3)))
        left -= doc_sentences[-1]
    docs = TokenizedDocs(ids=np.arange(1000, 1000 + sum(sentence_lengths), dtype=np.int32),
                         sentence_lengths=np.array(sentence_lengths), doc_sentences=np.array(doc_sentences))
    stream, item_len, is_sep = token_stream(docs, SEP)
    starts, lens = pack_full_sentences(item_len, is_sep, cap)
    order = np.array([random.randrange(len(starts)) for _ in range(copies * len(starts))], np.int64)
    batch = single_segment_batch(stream, starts[order], lens[order], cls_id=CLS, sep_id=SEP)
    sep_positions = np.flatnonzero(stream == SEP)
    document_starts, document_offsets = stream_document_starts(sep_positions, starts, lens, order)
    for row, k in enumerate(order.tolist()):
        body = stream[starts[k]:starts[k] + lens[k]].tolist()
        if len(body) > 1 and body[-1] == SEP:
            body.pop()
        assert batch.row(row)["input_ids"] == [CLS, *body, SEP]
        assert document_starts[document_offsets[row]:document_offsets[row + 1]].tolist() == [
            0, *(i + 2 for i, t in enumerate(body) if t == SEP)]
    assert batch.input_ids.dtype == np.int32 and not batch.segment_ids.any()
