"""InstanceBatch layout helpers."""

from __future__ import annotations

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
