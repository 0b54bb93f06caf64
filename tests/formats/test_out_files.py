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



def test_a_sink_whose_tmp_dir_was_removed_meanwhile_writes_its_shards(tmp_path):
    """In array and claim modes the worker that writes the manifest removes an empty ``_tmp/``,
    while another may still run a task taken over from it, its sink made but no file open yet
    (before its first write, or between two shards): opening the next file makes ``_tmp/`` again
    rather than fail the task."""
    from mlm_pipeline.formats.sink import ShardSink, tidy_tmp

    sink = ShardSink(str(tmp_path), "00003", fmt="tfrecord", max_instances_per_shard=5, max_seq_length=4,
                     max_predictions=0)
    tidy_tmp(str(tmp_path), older_than=600)  # no file open yet: the finisher removes it
    assert not (tmp_path / "_tmp").exists()
    sink.write(numbered(0, 5))  # a full shard: committed, so no file is open again
    tidy_tmp(str(tmp_path), older_than=600)
    sink.write(numbered(5, 3))
    shards = sink.close()
    assert [s["instances"] for s in shards] == [5, 3]


def test_a_killed_workers_partial_shard_is_removed_when_the_run_completes(tmp_path):
    """A shared local output (array, claim) keeps ``_tmp/`` while workers write there; a worker
    killed mid-shard left its partial file for good (up to a shard, hundreds of MB, per task in
    flight). The finisher removes what nobody wrote for the run's stall or lease time and keeps a
    live writer's file."""
    import os
    import time

    from mlm_pipeline.formats.sink import ShardSink, tidy_tmp

    live = ShardSink(str(tmp_path), "00004", fmt="tfrecord", max_instances_per_shard=5, max_seq_length=4,
                     max_predictions=0)
    live.write(numbered(0, 3))  # a shard open, being written
    dead = tmp_path / "_tmp" / "00001-killed.partial"
    dead.write_bytes(b"x" * 1000)
    an_hour_ago = time.time() - 3600
    os.utime(dead, (an_hour_ago, an_hour_ago))
    tidy_tmp(str(tmp_path), older_than=600)
    assert not dead.exists() and len(list((tmp_path / "_tmp").iterdir())) == 1
    assert [s["instances"] for s in live.close()] == [3]
    tidy_tmp(str(tmp_path), older_than=600)
    assert not (tmp_path / "_tmp").exists()
