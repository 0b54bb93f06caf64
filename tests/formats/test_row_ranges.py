"""Row-range reading of one shard (what the loader's windows use), for every built-in format."""

from __future__ import annotations

import io

import numpy as np
import pytest

from mlm_pipeline.formats import get_output_format
from mlm_pipeline.formats.tfrecord import decode_records, features_to_batch, iter_tfrecord_records
from mlm_pipeline.formats.tfrecord.wire import skip_records
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets


def _batch(rng: np.random.Generator, n: int) -> InstanceBatch:
    lens = rng.integers(5, 30, n)
    mlens = np.minimum(3, lens - 2)
    offsets = lengths_to_offsets(lens)
    return InstanceBatch(
        input_ids=rng.integers(1000, 30000, int(lens.sum())).astype(np.int32),
        segment_ids=(rng.random(int(lens.sum())) < 0.5).astype(np.int8),
        offsets=offsets,
        masked_lm_positions=np.concatenate([np.arange(1, 1 + m) for m in mlens]).astype(np.int32),
        masked_lm_ids=rng.integers(1000, 30000, int(mlens.sum())).astype(np.int32),
        masked_offsets=lengths_to_offsets(mlens),
        next_sentence_labels=rng.integers(0, 2, n).astype(np.int8),
    )


def _assert_rows(got: InstanceBatch, want: InstanceBatch) -> None:
    assert len(got) == len(want)
    for i in range(len(want)):
        assert got.row(i) == want.row(i)


@pytest.mark.parametrize("name", ["tfrecord", "parquet"])
def test_row_ranges_forward_backward_and_past_the_end(name, tmp_path):
    fmt = get_output_format(name)
    blocks = [_batch(np.random.default_rng(seed), n) for seed, n in enumerate((13, 1, 20, 6))]
    whole = InstanceBatch.concat(blocks)
    path = tmp_path / f"shard{fmt.extension}"
    with open(path, "wb") as f:
        writer = fmt.open_writer(f, max_seq_length=32, max_predictions=5)
        for block in blocks:  # Parquet: one row group per block, so ranges cross row groups
            writer.write(block)
        writer.close()
    _assert_rows(fmt.read_shard(str(path)), whole)
    rows = fmt.rows(str(path))
    try:
        for start, stop in [(0, 3), (3, 14), (14, 15), (2, 9), (25, 40), (39, 40), (0, 40)]:
            _assert_rows(rows.read(start, stop), whole.slice(start, stop))
        with pytest.raises(ValueError, match=f"{path}: .*rows up to 41 requested"):
            rows.read(38, 41)
    finally:
        rows.close()


def test_skip_records_reads_headers_only_and_stops_at_the_end():
    from mlm_pipeline.formats.tfrecord import encode_tfrecord

    batch = _batch(np.random.default_rng(7), 5)
    data = encode_tfrecord(batch, max_seq_length=32, max_predictions=5)
    f = io.BytesIO(data)
    assert skip_records(f, 3) == 3
    rest = list(iter_tfrecord_records(f))
    _assert_rows(features_to_batch(decode_records(rest)), batch.slice(3, 5))
    f.seek(0)
    assert skip_records(f, 9) == 5 and f.read() == b""
    assert len(features_to_batch(decode_records([]))) == 0


def _rchar() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


@pytest.mark.skipif(not __import__("os").path.exists("/proc/self/io"), reason="needs /proc/self/io (Linux)")
@pytest.mark.parametrize("name", ["tfrecord", "parquet"])
def test_small_steps_from_the_middle_read_about_the_rest_once(name, tmp_path):
    """A loader worker's access: start inside a shard, go on in small steps. It reads about what
    is left of the shard once (TFRecord: skipped by headers; Parquet: from the row group holding
    the start, each row group once, and the footer, not Arrow's 64 KiB tail)."""
    import os

    fmt = get_output_format(name)
    blocks = [_batch(np.random.default_rng(seed), 200) for seed in range(10)]
    whole = InstanceBatch.concat(blocks)
    path = tmp_path / f"shard{fmt.extension}"
    with open(path, "wb") as f:
        writer = fmt.open_writer(f, max_seq_length=32, max_predictions=5)
        for block in blocks:  # Parquet: 10 row groups of 200 rows
            writer.write(block)
        writer.close()
    size = os.path.getsize(path)
    warm = fmt.rows(str(path))  # imports done outside the count (they read files too)
    warm.read(0, 1)
    warm.close()
    rows = fmt.rows(str(path))
    before = _rchar()
    got = [rows.read(a, min(a + 7, 2000)) for a in range(1000, 2000, 7)]
    read = _rchar() - before
    rows.close()
    _assert_rows(InstanceBatch.concat(got), whole.slice(1000, 2000))
    assert read < 0.56 * size, (read, size)  # the second half, and little more


def _parquet_shard_on_s3(moto_s3, tmp_path, prefix: str):
    """A Parquet shard of 64 row groups of 4,000 rows, written locally and put on the S3 server:
    (its blocks, its bytes, its URL)."""
    fmt = get_output_format("parquet")
    blocks = [_batch(np.random.default_rng(seed), 4000) for seed in range(64)]
    path = tmp_path / "shard.parquet"
    with open(path, "wb") as f:
        writer = fmt.open_writer(f, max_seq_length=32, max_predictions=5)
        for block in blocks:
            writer.write(block)
        writer.close()
    data = path.read_bytes()
    url = moto_s3.new_prefix(prefix) + "/shard.parquet"
    bucket, key = url[len("s3://"):].split("/", 1)
    moto_s3.client().put_object(Bucket=bucket, Key=key, Body=data)
    return blocks, data, url


@pytest.mark.s3
def test_an_object_store_reader_fetches_about_its_part(moto_s3, tmp_path):
    """On S3, a loader worker that reads the first part of a Parquet shard in small steps fetches
    about that part (blocks of a few MiB), not the whole object (s3fs reads ahead 50 MiB)."""
    from conftest_servers import s3_env

    from mlm_pipeline import fs

    fmt = get_output_format("parquet")
    blocks, data, url = _parquet_shard_on_s3(moto_s3, tmp_path, "rows")
    whole = InstanceBatch.concat(blocks)
    stop_fraction = 0.25
    stop = int(len(whole) * stop_fraction)
    with s3_env(moto_s3):
        rows = fmt.rows(url)
        got = [rows.read(a, min(a + 50, stop)) for a in range(0, stop, 50)]
        fetched = rows._file.cache.total_requested_bytes
        rows.close()
    _assert_rows(InstanceBatch.concat(got), whole.slice(0, stop))
    assert len(data) > 3 * fs.RANGE_BLOCK_BYTES
    assert fetched < stop_fraction * len(data) + 2 * fs.RANGE_BLOCK_BYTES, (fetched, len(data))


@pytest.mark.s3
def test_an_object_store_layout_fetches_the_footer_and_lengths_only(moto_s3, tmp_path):
    """On S3, a shard's layout with its rows' lengths fetches the footer and the small
    ``input_mask`` column chunks, each exactly: far less than the object."""
    from conftest_servers import s3_env

    from mlm_pipeline import fs

    fmt = get_output_format("parquet")
    blocks, data, url = _parquet_shard_on_s3(moto_s3, tmp_path, "layout")
    fetched = []
    original = fs.open_ranges

    def counting(*args, **kwargs):  # every byte fetched from the store, whatever the file's cache
        f = original(*args, **kwargs)
        fetch = f.cache.fetcher

        def counted(start, end):
            data = fetch(start, end)
            fetched.append(len(data))
            return data

        f.cache.fetcher = counted
        return f

    with s3_env(moto_s3), pytest.MonkeyPatch.context() as patch:
        patch.setattr(fs, "open_ranges", counting)
        layout = fmt.layout(url, instances=64 * 4000, lengths=True)
    assert layout.row_groups.tolist() == [4000] * 64
    assert (layout.lengths == InstanceBatch.concat(blocks).lengths).all()
    total = sum(fetched)
    assert total < 0.05 * len(data), (total, len(data))
