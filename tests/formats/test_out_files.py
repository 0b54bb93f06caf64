"""ELECTRA's output files (``--num-out-files``): instance n of a task goes to its file n % N,
whatever the sizes of the batches it arrives in."""

from __future__ import annotations

import numpy as np
import pytest

from mlm_pipeline.formats.sink import OutFilesSink
from mlm_pipeline.formats.tfrecord import read_tfrecord_features
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets


def numbered(first: int, n: int) -> InstanceBatch:
    """``n`` instances of two tokens, the first token the instance's number."""
    ids = np.stack([np.arange(first, first + n), np.full(n, 7)], axis=1).astype(np.int32).ravel()
    return InstanceBatch.unmasked(ids, np.zeros(2 * n, np.int8), lengths_to_offsets(np.full(n, 2)), None)


@pytest.mark.parametrize("batches", [[8192, 808], [3, 5, 1, 2, 1000, 7], [1] * 12])
def test_every_instance_lands_in_file_n_mod_n(tmp_path, batches):
    """ELECTRA's reference run deals 8,192 examples at a time, then the rest, to 1,000 files."""
    files = 1000 if batches[0] == 8192 else 7
    sink = OutFilesSink(str(tmp_path), "00000", fmt="tfrecord", task_index=0, task_count=1, num_out_files=files,
                        max_seq_length=4, max_predictions=0)
    start = 0
    for n in batches:
        sink.write(numbered(start, n))
        start += n
    shards = sink.close()
    assert sum(s["instances"] for s in shards) == start
    for i, shard in enumerate(shards):
        features = read_tfrecord_features(str(tmp_path / shard["path"]))
        numbers = features["input_ids"][:, 0].tolist() if features else []
        assert numbers == list(range(i, start, files)), i

