"""Prepared outputs of the real sample corpus for the loader tests (built once per session).

Small ``split_bytes`` and ``max_instances_per_shard`` give many shards of uneven sizes
(333, 65, 333, 16, ...), so rank and window boundaries fall inside shards and across them.
"""

from __future__ import annotations

import os

import pytest

from loader.loader_helpers import prepare_output, prepare_tiny_output

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@pytest.fixture(scope="session", autouse=True)
def _one_thread():
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)


@pytest.fixture(scope="session")
def parquet_out(tmp_path_factory):
    return prepare_output(tmp_path_factory.mktemp("pq"), fmt="parquet")


@pytest.fixture(scope="session")
def tfrecord_out(tmp_path_factory):
    return prepare_output(tmp_path_factory.mktemp("tf"), fmt="tfrecord")


@pytest.fixture(scope="session")
def short_out(tmp_path_factory):
    """max_seq_length 64: cheaper training steps for the smoke tests."""
    return prepare_output(tmp_path_factory.mktemp("pq64"), fmt="parquet", max_seq_length=64)


@pytest.fixture(scope="session")
def tiny_out(tmp_path_factory):
    """139 unmasked instances of 32 tokens: training tests that cross an epoch in 14 steps of 10."""
    return prepare_tiny_output(tmp_path_factory.mktemp("tiny") / "out")
