"""The ``parquet`` output format: the same columns as the TFRecord features, unpadded, ids as
uint16 (vocabularies up to 65,536 entries) or uint32.

The ragged ``InstanceBatch`` arrays map zero-copy onto Arrow ``ListArray`` (values + offsets), so
a block of instances becomes a table without touching single instances, and back. The writer
appends each block as row groups, with a CRC-32 checksum per page that every read verifies (a
damaged shard raises, and :class:`~mlm_pipeline.formats.OutputFormat` names it); :func:`read_parquet` reads a whole shard,
:class:`ParquetRows` only the row groups that overlap a requested row range (the loader's
windows) and :func:`read_layout` the footer and, if asked, the rows' lengths. Files are read with ``ParquetFile``, never with ``read_table``: the dataset scanner's
threads can abort the interpreter at exit (apache/arrow#34314); a whole shard decodes fast enough
on the calling thread.
"""

from __future__ import annotations

import io
import struct
from typing import BinaryIO

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from mlm_pipeline import fs
from mlm_pipeline.formats.base import (OutputFormat, ShardLayout, id_dtype, string_array, string_list_values,
                                       string_lists)
from mlm_pipeline.instances.batch import InstanceBatch

def id_type(vocab_size: int | None) -> pa.DataType:
    """The Arrow type of ``input_ids`` and ``masked_lm_ids`` for a tokenizer of ``vocab_size``
    entries (``None``, a writer not told the vocabulary: int32, as shards were written before)."""
    if vocab_size is None:
        return pa.int32()
    return pa.from_numpy_dtype(id_dtype(vocab_size))


def schema_for(vocab_size: int | None = None, *, token_boundary: bool = False) -> pa.Schema:
    """The shard schema: ids as :func:`id_type`, the other columns int32 (weights float32).
    Readers take whatever integer type a shard has, so shards written with int32 ids still read."""
    ids = id_type(vocab_size)
    schema = pa.schema(
        [
            ("input_ids", pa.list_(ids)),
            ("input_mask", pa.list_(pa.int32())),
            ("segment_ids", pa.list_(pa.int32())),
            ("masked_lm_positions", pa.list_(pa.int32())),
            ("masked_lm_ids", pa.list_(ids)),
            ("masked_lm_weights", pa.list_(pa.float32())),
            ("next_sentence_labels", pa.int32()),
        ]
    )
    return schema.append(pa.field("token_boundary", pa.list_(pa.int32()))) if token_boundary else schema


SCHEMA = schema_for(None)
"""The schema of shards written before ids followed the vocabulary (int32 ids)."""
ALBERT_SCHEMA = schema_for(None, token_boundary=True)
"""``sop``'s shards: BERT's columns and ALBERT's ``token_boundary``."""
DOCUMENT_STARTS = pa.field("document_starts", pa.list_(pa.int32()))
"""``packed``'s shards add where each row's documents start (0 first, ascending): with the row's
length appended, FlashAttention's ``cu_seqlens`` of the row. A few values a row, zstd-compressed."""
LANGUAGE_FIELD = pa.field("language", pa.string())
"""Each instance's language code, the last column of a run with languages."""
SOURCE_FIELDS = {"document_ids": pa.field("document_ids", pa.list_(pa.string())),
                 "document_metadata": pa.field("document_metadata", pa.list_(pa.string()))}
"""A run with ``--id-field`` / ``--metadata-field``: each instance's source records (ids; metadata
as JSON text), in the order their tokens appear in it: the last columns."""


def source_columns(batch: InstanceBatch) -> list[tuple[pa.Field, pa.ListArray]]:
    """The batch's ``document_ids`` and ``document_metadata`` (those it has) as list<string> columns."""
    if batch.source_offsets is None:
        return []
    return [(field, string_lists(getattr(batch, name), batch.source_offsets))
            for name, field in SOURCE_FIELDS.items() if getattr(batch, name) is not None]


_NUMPY_TYPE = {pa.int32(): np.int32, pa.float32(): np.float32, pa.uint16(): np.uint16, pa.uint32(): np.uint32}


def _array(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A numpy array as an Arrow array sharing its memory. (``pa.array`` would also work, but it
    first probes for pandas, which imports pandas when it is installed: a second or more.)"""
    values = np.ascontiguousarray(values, dtype=_NUMPY_TYPE[typ])
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


def _list(values: np.ndarray, offsets: np.ndarray, typ: pa.DataType) -> pa.ListArray:
    return pa.ListArray.from_arrays(_array(offsets, pa.int32()), _array(values, typ))


def _check_ids_fit(batch: InstanceBatch, ids: pa.DataType) -> None:
    """``ValueError`` for an id the id type cannot hold (a tokenizer whose special tokens lie past
    the vocabulary size it reports), rather than a silently wrapped id."""
    top = np.iinfo(_NUMPY_TYPE[ids]).max
    for name in ("input_ids", "masked_lm_ids"):
        values = getattr(batch, name)
        if len(values) and (int(values.min()) < 0 or int(values.max()) > top):
            raise ValueError(f"{name} holds an id outside 0..{top} ({ids}, chosen from the vocabulary size): "
                             f"min {int(values.min())}, max {int(values.max())}")


def batch_to_table(batch: InstanceBatch, vocab_size: int | None = None) -> pa.Table:
    """The batch as a table of :func:`schema_for` ``vocab_size``."""
    ids = id_type(vocab_size)
    if ids != pa.int32():
        _check_ids_fit(batch, ids)
    n_tok = len(batch.input_ids)
    n_mask = len(batch.masked_lm_ids)
    nsp = (
        np.full(len(batch), -1, np.int32)
        if batch.next_sentence_labels is None
        else batch.next_sentence_labels.astype(np.int32)
    )
    boundary = [] if batch.token_boundary is None else [_list(batch.token_boundary, batch.offsets, pa.int32())]
    schema = schema_for(vocab_size, token_boundary=bool(boundary))
    documents = []
    if batch.document_starts is not None:
        documents = [_list(batch.document_starts, batch.document_offsets, pa.int32())]
        schema = schema.append(DOCUMENT_STARTS)
    language = []
    if batch.languages is not None:  # (runs with languages only: other shards keep their schema and bytes)
        language = [string_array(batch.languages)]
        schema = schema.append(LANGUAGE_FIELD)
    sources = source_columns(batch)  # (runs asking for them only, as languages)
    for field, _ in sources:
        schema = schema.append(field)
    return pa.Table.from_arrays(
        [
            _list(batch.input_ids, batch.offsets, ids),
            _list(np.ones(n_tok, np.int32), batch.offsets, pa.int32()),
            _list(batch.segment_ids, batch.offsets, pa.int32()),
            _list(batch.masked_lm_positions, batch.masked_offsets, pa.int32()),
            _list(batch.masked_lm_ids, batch.masked_offsets, ids),
            _list(np.ones(n_mask, np.float32), batch.masked_offsets, pa.float32()),
            _array(nsp, pa.int32()),
            *boundary,
            *documents,
            *language,
            *(column for _, column in sources),
        ],
        schema=schema,
    )


def _numpy(arr: pa.Array, dtype) -> np.ndarray:
    """Zero-copy view of a null-free primitive Arrow array (``to_numpy`` would import pandas)."""
    dtype = np.dtype(dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _flat(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    arr = col.combine_chunks()
    offsets = _numpy(arr.offsets, np.int32).astype(np.int64)
    values = _numpy(arr.values, _NUMPY_TYPE[arr.type.value_type])  # (ids: uint16, uint32 or, older, int32)
    return values[offsets[0] : offsets[-1]], offsets - offsets[0]


def table_to_batch(table: pa.Table) -> InstanceBatch:
    ids, offsets = _flat(table.column("input_ids"))
    seg, _ = _flat(table.column("segment_ids"))
    pos, moff = _flat(table.column("masked_lm_positions"))
    mids, _ = _flat(table.column("masked_lm_ids"))
    nsp = _numpy(table.column("next_sentence_labels").combine_chunks(), np.int32)
    boundary = _flat(table.column("token_boundary"))[0] if "token_boundary" in table.column_names else None
    documents = _flat(table.column("document_starts")) if "document_starts" in table.column_names else None
    languages = (np.array(table.column("language").to_pylist(), dtype=str)
                 if "language" in table.column_names else None)
    sources = {name: string_list_values(table.column(name)) for name in SOURCE_FIELDS if name in table.column_names}
    return InstanceBatch(
        input_ids=ids.astype(np.int32),
        segment_ids=seg.astype(np.int8),
        offsets=offsets,
        masked_lm_positions=pos.astype(np.int32),
        masked_lm_ids=mids.astype(np.int32),
        masked_offsets=moff,
        next_sentence_labels=None if (len(nsp) and nsp.min() < 0) else nsp.astype(np.int8),
        token_boundary=None if boundary is None else boundary.astype(np.int8),
        document_starts=None if documents is None else documents[0].astype(np.int32),
        document_offsets=None if documents is None else documents[1],
        languages=languages,
        source_offsets=next((offsets for _, offsets in sources.values()), None),
        **{name: values for name, (values, _) in sources.items()},
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

    Rows are stored unpadded, so the run's length limits play no part here. The schema is the
    first block's (with ``token_boundary`` for ``sop``, ``document_starts`` for ``packed``), so the
    file is opened on the first write; its ids are uint16 or uint32 by ``vocab_size`` (:func:`id_type`).
    """

    def __init__(self, f: BinaryIO, *, max_seq_length: int | None = None, max_predictions: int | None = None,
                 vocab_size: int | None = None, **_settings):
        self._f = f
        self._writer: pq.ParquetWriter | None = None
        self._vocab_size = vocab_size

    def write(self, batch: InstanceBatch) -> None:
        if len(batch):
            table = batch_to_table(batch, self._vocab_size)
            if self._writer is None:
                self._writer = pq.ParquetWriter(self._f, table.schema, **WRITE_OPTIONS)
            self._writer.write_table(table)

    def close(self) -> None:
        if self._writer is None:
            self._writer = pq.ParquetWriter(self._f, schema_for(self._vocab_size), **WRITE_OPTIONS)
        self._writer.close()


def read_parquet(url: str) -> InstanceBatch:
    """A whole Parquet shard (local path or fsspec URL) as an :class:`InstanceBatch`."""
    with fs.open_url(url) as f:
        return table_to_batch(pq.ParquetFile(f, pre_buffer=False, **READ_OPTIONS).read(use_threads=False))


# the columns an InstanceBatch is made of (input_mask and masked_lm_weights are all ones)
_BATCH_COLUMNS = ["input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"]
_OPTIONAL_COLUMNS = ["token_boundary", "document_starts", "language", *SOURCE_FIELDS]  # read where a shard has them


def _footer(f) -> pq.FileMetaData:
    """The metadata of the Parquet file ``f``, reading just its footer.

    Arrow reads the last 64 KiB to find it, which for a shard of a few hundred KiB is a sizeable
    share of the file read twice; the footer itself is usually a few KiB.
    """
    f.seek(-8, 2)
    tail = f.read(8)
    length = struct.unpack("<I", tail[:4])[0]
    if tail[4:] != b"PAR1":
        raise ValueError("not a Parquet file (no PAR1 at its end)")
    f.seek(-(8 + length), 2)
    return pq.read_metadata(io.BytesIO(b"PAR1" + f.read(length) + tail))


def read_layout(url: str, lengths: bool = False) -> ShardLayout:
    """The row groups of a Parquet shard (its footer) and, with ``lengths``, every row's length.

    The lengths come from ``input_mask``: a list of ones as long as ``input_ids``, so its pages
    hold little more than the list lengths (about 1% of a shard) and are read instead of the ids.
    Each range is read as it is (on an object store, one request each, no read-ahead).
    """
    with fs.open_ranges(url, block_size=0) as f:
        footer = _footer(f)
        row_groups = np.array([footer.row_group(i).num_rows for i in range(footer.num_row_groups)], np.int64)
        if not lengths:
            return ShardLayout(row_groups, None, footer)
        shard = pq.ParquetFile(f, metadata=footer, pre_buffer=False, **READ_OPTIONS)
        parts = []
        for i in range(footer.num_row_groups):  # one at a time: the decoded ones are not kept
            column = shard.read_row_group(i, columns=["input_mask"], use_threads=False).column(0).combine_chunks()
            parts.append(np.diff(_numpy(column.offsets, np.int32)).astype(np.int32))
    return ShardLayout(row_groups, np.concatenate(parts) if parts else np.zeros(0, np.int32), footer)


class ParquetRows:
    """Rows ``[start, stop)`` of one Parquet shard, streamed: only the row groups that overlap are read.

    Reading goes through a record-batch iterator over the row group holding ``start`` (one row
    group at a time: Arrow reads ahead through every row group an iterator is given), with
    buffered column reads, so what is held between calls is a record batch and Arrow's column
    readers (about a data page per column), not a decoded row group. A range that starts where
    the previous one stopped (a worker walking through a shard in small steps, as an interleaved
    loader epoch does) carries on with the same iterator: each row group is read once. Going
    back, or to another row group, starts a new iterator there. ``footer``: the shard's parsed
    footer, if the caller has it (:func:`read_layout`), so that it is not read again.
    """

    BATCH_ROWS = 128  # rows per record batch of the iterator
    BUFFER_BYTES = 1 << 16  # read buffer per column

    def __init__(self, url: str, footer: pq.FileMetaData | None = None):
        self._url = url
        self._footer = footer
        self._file = None
        self._parquet: pq.ParquetFile | None = None
        self._row_group_starts: np.ndarray | None = None
        self._batches = None  # record batches from row ``self._row`` on
        self._pending: pa.RecordBatch | None = None  # rows from ``self._row`` not yet returned
        self._group = -1  # the row group the iterator reads
        self._row = -1

    def _open(self) -> None:
        self._file = fs.open_ranges(self._url)
        footer = self._footer if self._footer is not None else _footer(self._file)
        self._parquet = pq.ParquetFile(self._file, metadata=footer, buffer_size=self.BUFFER_BYTES,
                                         pre_buffer=False, **READ_OPTIONS)
        meta = self._parquet.metadata
        counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
        self._row_group_starts = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        names = self._parquet.schema_arrow.names  # (sop's shards add ALBERT's token_boundary)
        self._columns = _BATCH_COLUMNS + [name for name in _OPTIONAL_COLUMNS if name in names]

    def _start_group(self, group: int) -> None:
        """Batches of row group ``group`` alone: Arrow reads ahead through all the row groups an
        iterator is given, which would read past where this reader stops."""
        self._batches = self._parquet.iter_batches(batch_size=self.BATCH_ROWS, row_groups=[group],
                                                   columns=self._columns, use_threads=False)
        self._group, self._pending, self._row = group, None, int(self._row_group_starts[group])

    def _seek(self, start: int) -> None:
        """Position the iterator at ``start`` (a new one, unless ``start`` is ahead in this row group)."""
        group = int(np.searchsorted(self._row_group_starts, start, side="right") - 1)
        if self._batches is None or start < self._row or group != self._group:
            self._start_group(group)
        self._take(start - self._row)  # rows before ``start`` in its row group: read past

    def _take(self, n: int) -> list[pa.RecordBatch]:
        out = []
        while n > 0:
            while self._pending is None or len(self._pending) == 0:
                batch = next(self._batches, None)
                if batch is None:  # the row group is done: on to the next
                    self._start_group(self._group + 1)
                else:
                    self._pending = batch
            k = min(n, len(self._pending))
            out.append(self._pending.slice(0, k))
            self._pending = self._pending.slice(k)
            self._row += k
            n -= k
        return out

    def read(self, start: int, stop: int) -> InstanceBatch:
        if self._parquet is None:
            self._open()
        offs = self._row_group_starts
        if stop > offs[-1]:
            raise ValueError(f"{self._url}: has {int(offs[-1])} rows, rows up to {stop} requested (manifest out of date?)")
        if start != self._row:
            self._seek(start)
        return table_to_batch(pa.Table.from_batches(self._take(stop - start)))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._parquet = self._row_group_starts = None
        self._batches = self._pending = None
        self._row = -1


FORMAT = OutputFormat(name="parquet", open_writer=ParquetShardWriter, read_shard=read_parquet, open_rows=ParquetRows,
                      read_layout=read_layout, layout_version=2, carries_sources=True)  # 2: ids uint16/uint32, not int32
