"""The ``parquet`` output format: the same columns as the TFRecord features, unpadded.

The ragged ``InstanceBatch`` arrays map zero-copy onto Arrow ``ListArray`` (values + offsets), so
a block of instances becomes a table without touching single instances, and back. The writer
appends each block as row groups, with a CRC-32 checksum per page that every read verifies (a
damaged shard raises, and :class:`~mlm_pipeline.formats.OutputFormat` names it); :func:`read_parquet` reads a whole shard and
:class:`ParquetRows` only the row groups that overlap a requested row range (the loader's
windows). Files are read with ``ParquetFile``, never with ``read_table``: the dataset scanner's
threads can abort the interpreter at exit (apache/arrow#34314); a whole shard decodes fast enough
on the calling thread.
"""

from __future__ import annotations

from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mlm_pipeline import fs
from mlm_pipeline.formats.base import OutputFormat
from mlm_pipeline.instances.batch import InstanceBatch

SCHEMA = pa.schema(
    [
        ("input_ids", pa.list_(pa.int32())),
        ("input_mask", pa.list_(pa.int32())),
        ("segment_ids", pa.list_(pa.int32())),
        ("masked_lm_positions", pa.list_(pa.int32())),
        ("masked_lm_ids", pa.list_(pa.int32())),
        ("masked_lm_weights", pa.list_(pa.float32())),
        ("next_sentence_labels", pa.int32()),
    ]
)


_NUMPY_TYPE = {pa.int32(): np.int32, pa.float32(): np.float32}


def _array(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A numpy array as an Arrow array sharing its memory. (``pa.array`` would also work, but it
    first probes for pandas, which imports pandas when it is installed: a second or more.)"""
    values = np.ascontiguousarray(values, dtype=_NUMPY_TYPE[typ])
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


def _list(values: np.ndarray, offsets: np.ndarray, typ: pa.DataType) -> pa.ListArray:
    return pa.ListArray.from_arrays(_array(offsets, pa.int32()), _array(values, typ))


def batch_to_table(batch: InstanceBatch) -> pa.Table:
    n_tok = len(batch.input_ids)
    n_mask = len(batch.masked_lm_ids)
    nsp = (
        np.full(len(batch), -1, np.int32)
        if batch.next_sentence_labels is None
        else batch.next_sentence_labels.astype(np.int32)
    )
    return pa.Table.from_arrays(
        [
            _list(batch.input_ids, batch.offsets, pa.int32()),
            _list(np.ones(n_tok, np.int32), batch.offsets, pa.int32()),
            _list(batch.segment_ids, batch.offsets, pa.int32()),
            _list(batch.masked_lm_positions, batch.masked_offsets, pa.int32()),
            _list(batch.masked_lm_ids, batch.masked_offsets, pa.int32()),
            _list(np.ones(n_mask, np.float32), batch.masked_offsets, pa.float32()),
            _array(nsp, pa.int32()),
        ],
        schema=SCHEMA,
    )


def _numpy(arr: pa.Array, dtype) -> np.ndarray:
    """Zero-copy view of a null-free primitive Arrow array (``to_numpy`` would import pandas)."""
    dtype = np.dtype(dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _flat(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks()
    offsets = _numpy(arr.offsets, np.int32).astype(np.int64)
    values = _numpy(arr.values, np.float32 if pa.types.is_floating(arr.type.value_type) else np.int32)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]


def table_to_batch(table: pa.Table) -> InstanceBatch:
    ids, offsets = _flat(table.column("input_ids"))
    seg, _ = _flat(table.column("segment_ids"))
    pos, moff = _flat(table.column("masked_lm_positions"))
    mids, _ = _flat(table.column("masked_lm_ids"))
    nsp = _numpy(table.column("next_sentence_labels").combine_chunks(), np.int32)
    return InstanceBatch(
        input_ids=ids.astype(np.int32),
        segment_ids=seg.astype(np.int8),
        offsets=offsets,
        masked_lm_positions=pos.astype(np.int32),
        masked_lm_ids=mids.astype(np.int32),
        masked_offsets=moff,
        next_sentence_labels=None if (len(nsp) and nsp.min() < 0) else nsp.astype(np.int8),
    )


# Dictionary encoding and column statistics buy nothing for token-id lists (tens of thousands of
# distinct values; min/max of ids are no use to a reader) and cost a quarter of the writing time;
# without them the file is about 3% larger. Larger write batches: fewer passes through the writer.
# Page checksums (CRC-32 of every page, 4 bytes a page) are verified on every read, so a damaged
# shard raises instead of decoding into wrong token ids.
WRITE_OPTIONS = {"compression": "zstd", "use_dictionary": False, "write_statistics": False, "write_batch_size": 65536,
                 "write_page_checksum": True}
READ_OPTIONS = {"page_checksum_verification": True}


class ParquetShardWriter:
    """Appends blocks as row groups to one Parquet file (an open binary file; not closed here).

    Rows are stored unpadded, so the run's length limits play no part here.
    """

    def __init__(self, f: BinaryIO, *, max_seq_length: int | None = None, max_predictions: int | None = None):
        self._writer = pq.ParquetWriter(f, SCHEMA, **WRITE_OPTIONS)

    def write(self, batch: InstanceBatch) -> None:
        if len(batch):
            self._writer.write_table(batch_to_table(batch))

    def close(self) -> None:
        self._writer.close()


def read_parquet(url: str) -> InstanceBatch:
    """A whole Parquet shard (local path or fsspec URL) as an :class:`InstanceBatch`."""
    with fs.open_url(url) as f:
        return table_to_batch(pq.ParquetFile(f, pre_buffer=False, **READ_OPTIONS).read(use_threads=False))


# the columns an InstanceBatch is made of (input_mask and masked_lm_weights are all ones)
_BATCH_COLUMNS = ["input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"]


class ParquetRows:
    """Rows ``[start, stop)`` of one Parquet shard: only the row groups that overlap are read."""

    def __init__(self, url: str):
        self._url = url
        self._file = None
        self._parquet: pq.ParquetFile | None = None
        self._row_group_starts: np.ndarray | None = None

    def read(self, start: int, stop: int) -> InstanceBatch:
        if self._parquet is None:
            self._file = fs.open_url(self._url, "rb")
            self._parquet = pq.ParquetFile(self._file, **READ_OPTIONS)
            meta = self._parquet.metadata
            counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            self._row_group_starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        offs = self._row_group_starts
        if stop > offs[-1]:
            raise ValueError(f"{self._url}: has {int(offs[-1])} rows, rows up to {stop} requested (manifest out of date?)")
        first = int(np.searchsorted(offs, start, side="right") - 1)
        last = int(np.searchsorted(offs, stop, side="left"))
        table = self._parquet.read_row_groups(list(range(first, last)), columns=_BATCH_COLUMNS)
        return table_to_batch(table.slice(start - int(offs[first]), stop - start))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._parquet = self._row_group_starts = None


FORMAT = OutputFormat(name="parquet", open_writer=ParquetShardWriter, read_shard=read_parquet, open_rows=ParquetRows)
