"""Pieces of the per-task function (mlm_pipeline.task) that have a reference to be exact against."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra.numpy import arrays

from mlm_pipeline.task import largest


@settings(max_examples=500, deadline=None)
@given(arrays(np.int64, st.integers(1, 400), elements=st.integers(0, 6)), st.integers(1, 450))
def test_largest_is_the_head_of_a_stable_descending_argsort(counts, k):
    """Ties (few distinct counts, zeros among them) are where a partition could pick other indices."""
    assert np.array_equal(largest(counts, k), np.argsort(-counts, kind="stable")[:k])


def test_largest_on_real_token_counts():
    rng = np.random.default_rng(0)
    counts = np.bincount(rng.zipf(1.3, 1_000_000) % 30_522, minlength=30_522)
    assert np.array_equal(largest(counts, 500), np.argsort(-counts, kind="stable")[:500])


def test_largest_on_a_250k_vocabulary_mostly_unused():
    """XLM-R's 250,002 ids, of which a task's text uses a fraction: the zeros are left out of the
    partition (slow on ties), the answer is the same."""
    rng = np.random.default_rng(1)
    counts = np.zeros(250_002, np.int64)
    counts[rng.integers(0, len(counts), 40_000)] = rng.zipf(1.3, 40_000)
    assert np.array_equal(largest(counts, 500), np.argsort(-counts, kind="stable")[:500])
    few = np.zeros(250_002, np.int64)
    few[[7, 3, 250_001]] = [2, 5, 2]
    assert np.array_equal(largest(few, 500), np.argsort(-few, kind="stable")[:500])
