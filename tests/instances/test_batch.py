"""InstanceBatch layout helpers."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from mlm_pipeline.instances import batch as batch_module
from mlm_pipeline.instances.batch import InstanceBatch, gather_ranges, lengths_to_offsets, ranges_to_indices


def _batch(ids_high: int, nsp: bool = True) -> InstanceBatch:
    g = np.random.default_rng(0)
    lens = g.integers(3, 12, size=9)
    mcounts = np.minimum(g.integers(0, 4, size=9), lens)
    total, mtotal = int(lens.sum()), int(mcounts.sum())
    return InstanceBatch(
        input_ids=g.integers(0, ids_high, size=total).astype(np.int32),
        segment_ids=g.integers(0, 2, size=total).astype(np.int8),
        offsets=lengths_to_offsets(lens),
        masked_lm_positions=g.integers(0, 3, size=mtotal).astype(np.int32),
        masked_lm_ids=g.integers(0, ids_high, size=mtotal).astype(np.int32),
        masked_offsets=lengths_to_offsets(mcounts),
        next_sentence_labels=g.integers(0, 2, size=9).astype(np.int8) if nsp else None,
    )


@pytest.mark.parametrize("ids_high, nsp, seq", [(200, True, 16), (30522, True, 16), (250_000, False, 300)])
def test_compact_padding_holds_the_same_values(ids_high, nsp, seq):
    batch = _batch(ids_high, nsp)
    wide = batch.padded(seq, 5)
    small = batch.padded(seq, 5, compact=True)
    assert wide.keys() == small.keys()
    for key in wide:
        assert wide[key].shape == small[key].shape
        assert np.array_equal(wide[key], small[key]), key
        assert small[key].dtype.itemsize <= wide[key].dtype.itemsize
    assert wide["input_ids"].dtype == np.int64 and wide["masked_lm_weights"].dtype == np.float32
    if nsp:
        assert InstanceBatch.from_padded(small).row(4) == batch.row(4)


def test_tfrecord_bytes_do_not_depend_on_the_padding_dtype():
    from mlm_pipeline.formats.tfrecord import encode_examples, encode_tfrecord

    batch = _batch(30522)
    assert encode_tfrecord(batch, max_seq_length=16, max_predictions=5) == encode_examples(batch.padded(16, 5))


@pytest.mark.parametrize("seed", range(20))
def test_ranges_to_indices_is_the_concatenated_aranges(seed):
    rng = np.random.default_rng(seed)
    k = int(rng.integers(0, 12))
    starts = rng.integers(0, 10**9 if seed % 2 else 60, k)  # overlapping, backwards, far apart
    lengths = rng.integers(0, 6, k)  # empty ranges among them
    got = ranges_to_indices(starts, lengths)
    expected = np.concatenate([np.arange(s, s + n) for s, n in zip(starts, lengths)] + [np.zeros(0, int)])
    assert got.dtype == np.intp
    np.testing.assert_array_equal(got, expected)


@pytest.mark.parametrize("step", [1, 3, 1 << 13])
def test_gather_ranges_is_the_concatenated_slices_of_each_source(monkeypatch, step):
    monkeypatch.setattr(batch_module, "_GATHER_RANGES", step)  # ranges gathered a few at a time
    rng = np.random.default_rng(step)
    ids = rng.integers(0, 30000, 500).astype(np.int32)
    segments = rng.integers(0, 2, 500).astype(np.int8)
    starts = rng.integers(0, 450, 40)
    lengths = rng.integers(0, 50, 40)  # empty ranges among them
    got_ids, got_segments = gather_ranges((ids, segments), starts, lengths)
    expected = [np.concatenate([a[s : s + n] for s, n in zip(starts, lengths)]) for a in (ids, segments)]
    np.testing.assert_array_equal(got_ids, expected[0])
    np.testing.assert_array_equal(got_segments, expected[1])
    assert got_ids.dtype == np.int32 and got_segments.dtype == np.int8
    assert [len(a) for a in gather_ranges((ids,), np.zeros(0, int), np.zeros(0, int))] == [0]


@pytest.mark.parametrize("start, length", [(490, 11), (-1, 2), (3, -1)])
def test_gather_ranges_refuses_a_range_outside_its_source(start, length):
    with pytest.raises(IndexError):
        gather_ranges((np.arange(500),), np.array([0, start]), np.array([5, length]))


def _with_documents_and_languages() -> InstanceBatch:
    """Three packed rows: 2, 1 and 3 documents, languages en/zh/en."""
    lengths = np.array([6, 4, 9])
    batch = InstanceBatch.unmasked(np.arange(19, dtype=np.int32), np.zeros(19, np.int8), lengths_to_offsets(lengths))
    batch.document_starts = np.array([0, 3, 0, 0, 2, 5], np.int32)
    batch.document_offsets = lengths_to_offsets(np.array([2, 1, 3]))
    batch.languages = np.array(["en", "zh", "en"])
    return batch


def test_document_starts_and_languages_follow_their_rows_through_take_slice_and_concat():
    batch = _with_documents_and_languages()
    rows = [batch.row(i) for i in range(3)]
    assert rows[0]["document_starts"] == [0, 3] and rows[2]["document_starts"] == [0, 2, 5]
    assert [r["language"] for r in rows] == ["en", "zh", "en"]
    assert batch.cu_seqlens(2).tolist() == [0, 2, 5, 9] and batch.cu_seqlens(1).tolist() == [0, 4]
    taken = batch.take(np.array([2, 0, 1]))
    assert [taken.row(i) for i in range(3)] == [rows[2], rows[0], rows[1]]
    sliced = batch.slice(1, 3)
    assert [sliced.row(i) for i in range(2)] == rows[1:]
    joined = InstanceBatch.concat([batch.slice(0, 1), batch.slice(1, 3)])
    assert [joined.row(i) for i in range(3)] == rows
    plain = InstanceBatch.unmasked(np.arange(5, dtype=np.int32), np.zeros(5, np.int8), lengths_to_offsets(np.array([5])))
    assert plain.cu_seqlens(0).tolist() == [0, 5] and "document_starts" not in plain.row(0)


def test_concat_of_rows_with_and_without_document_starts_takes_the_latter_as_one_document_each():
    """(A window mixing shards written before document starts were recorded with newer ones.)"""
    batch = _with_documents_and_languages()
    plain = InstanceBatch.unmasked(np.arange(7, dtype=np.int32), np.zeros(7, np.int8), lengths_to_offsets(np.array([3, 4])))
    for parts in ([plain, batch], [batch, plain]):
        parts = [dataclasses.replace(p, languages=None) for p in parts]
        joined = InstanceBatch.concat(parts)
        starts = [joined.row(i)["document_starts"] for i in range(len(joined))]
        expected = [[0, 3], [0], [0, 2, 5]]
        assert starts == ([[0], [0]] + expected if parts[0].document_starts is None else expected + [[0], [0]])
