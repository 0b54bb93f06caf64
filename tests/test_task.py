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
