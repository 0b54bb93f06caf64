"""NSP instance building on real text: structure, lengths, labels, edge cases."""

from __future__ import annotations

import numpy as np
from hypothesis import given, strategies as st

from conftest import SAMPLE_TEXT, bert_text_documents, rng
from mlm_pipeline.instances.base import TokenizedDocs
from mlm_pipeline.instances.nsp import build_nsp_instances, truncated_lengths
from mlm_pipeline.stats import ReadStats
from mlm_pipeline.task import tokenize_documents


def _build(docs, tok, seq=128, dupe=1, seed=0, short=0.1):
    return build_nsp_instances(
        docs, max_seq_length=seq, short_seq_prob=short, dupe_factor=dupe,
        cls_id=tok.special.cls, sep_id=tok.special.sep, rng=rng(seed),
    )


def _reference_truncate(la, lb, max_tokens):
    while la + lb > max_tokens:
        if la > lb:
            la -= 1
        else:
            lb -= 1
    return la, lb


@given(st.integers(1, 600), st.integers(1, 600), st.integers(2, 509))
def test_truncated_lengths_match_the_reference_loop(la, lb, m):
    a, b = truncated_lengths(np.array([la]), np.array([lb]), m)
    assert (int(a[0]), int(b[0])) == _reference_truncate(la, lb, m)


def test_structure_and_lengths(wikitext_docs, tok):
    batch, stats = _build(wikitext_docs, tok)
    assert len(batch) == stats.instances > 1000
    assert batch.lengths.max() <= 128
    for i in range(0, len(batch), 17):
        row = batch.row(i)
        ids, seg = row["input_ids"], row["segment_ids"]
        assert ids[0] == tok.special.cls and ids[-1] == tok.special.sep
        n_a = seg.count(0)
        assert ids[n_a - 1] == tok.special.sep and ids.count(tok.special.sep) == 2
        assert seg == [0] * n_a + [1] * (len(ids) - n_a)
        assert n_a >= 3 and len(ids) - n_a >= 2  # both segments non-empty


def test_actual_next_pairs_are_contiguous_text(tok):
    docs = tokenize_documents(bert_text_documents(SAMPLE_TEXT), tok, ReadStats())
    batch, _ = _build(docs, tok, seq=512, short=0.0, dupe=10)  # ~60 pairs of 3 documents
    flat = docs.ids.tobytes()
    checked = 0
    for i in range(len(batch)):
        row = batch.row(i)
        n_a = row["segment_ids"].count(0)
        a = np.array(row["input_ids"][1 : n_a - 1], np.int32)
        b = np.array(row["input_ids"][n_a:-1], np.int32)
        if len(a) + len(b) == 512 - 3:
            continue  # truncated pair: its ends were cut
        if row["next_sentence_label"] == 0:
            assert np.concatenate([a, b]).tobytes() in flat
            checked += 1
        assert a.tobytes() in flat and b.tobytes() in flat
    assert checked >= 10


def test_nsp_label_share_on_multi_sentence_documents(tok):
    docs = tokenize_documents(bert_text_documents(SAMPLE_TEXT), tok, ReadStats())
    batch, stats = _build(docs, tok, dupe=200, seed=3)
    share = stats.random_next / stats.instances
    # one-sentence chunks are always random next, so the share is a bit above 1/2
    assert 0.5 < share < 0.65


def test_document_with_one_sentence_gets_random_next(tok):
    ids, lens = tok.encode_batch(["the only sentence of this document .", "a second document starts here .", "and goes on ."])
    docs = TokenizedDocs(ids=ids, sentence_lengths=lens, doc_sentences=np.array([1, 2]))
    batch, _ = _build(docs, tok, dupe=20, short=0.0)
    first = [batch.row(i) for i in range(len(batch)) if batch.row(i)["input_ids"][1] == ids[0]]
    assert first and all(r["next_sentence_label"] == 1 for r in first)


def test_single_document_block_draws_random_next_from_itself(tok):
    """As the reference: with one document, the "random" B comes from that same document (about
    half the multi-sentence chunks, and every one-sentence chunk)."""
    sents = ["one sentence here .", "another sentence follows .", "and a third one ."]
    ids, lens = tok.encode_batch(sents)
    docs = TokenizedDocs(ids=ids, sentence_lengths=lens, doc_sentences=np.array([3]))
    batch, stats = _build(docs, tok, dupe=400, short=0.0)
    # per pass, by the reference's algorithm: the three sentences are one chunk; a random next
    # (p 1/2) gives back the sentences after A, which make more chunks (one sentence: always a
    # random next): 13/8 instances and 1 random next expected, a share of 8/13 = 0.615
    assert stats.instances == len(batch) and 600 < len(batch) < 700
    share = batch.next_sentence_labels.mean()
    assert 0.57 < share < 0.66 and stats.random_next == int(batch.next_sentence_labels.sum())
    words = set(ids.tolist())
    for i in range(0, len(batch), 17):  # every B is made of the document's own tokens
        row = batch.row(i)
        seg_b = [t for t, s in zip(row["input_ids"], row["segment_ids"]) if s == 1][:-1]
        assert seg_b and set(seg_b) <= words
    # a document of one one-token sentence: A and B are that token, a random next (label 1)
    one_token = TokenizedDocs(ids=ids[:1], sentence_lengths=np.array([1]), doc_sentences=np.array([1]))
    single, stats = _build(one_token, tok)
    assert len(single) == 1 and single.row(0)["input_ids"] == [tok.special.cls, int(ids[0]), tok.special.sep,
                                                                 int(ids[0]), tok.special.sep]
    assert stats.random_next == 1 and stats.chunks_without_pair == 0


def test_numpy_and_python_rounds_give_the_same_instances(wikitext_docs, tok, monkeypatch):
    """A round is computed with numpy while many document passes are active, in Python for the
    last few: where the switch happens must not change a single instance."""
    import mlm_pipeline.instances.nsp as nsp

    built = []
    for threshold in (1, 40, 10**9):  # all numpy, switching midway, all Python
        monkeypatch.setattr(nsp, "_VECTOR_PASSES", threshold)
        batch, stats = _build(wikitext_docs, tok, dupe=3, seed=5)
        built.append((batch, stats))
    (first, first_stats), *others = built
    assert len(first) > 1000 and first_stats.truncated > 0 and first_stats.short_target_documents > 0
    for batch, stats in others:
        assert stats == first_stats
        for name in ("input_ids", "segment_ids", "offsets", "next_sentence_labels"):
            assert np.array_equal(getattr(batch, name), getattr(first, name)), name
