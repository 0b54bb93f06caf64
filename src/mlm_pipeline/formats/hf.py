"""The ``hf`` output format: a Hugging Face ``datasets`` dataset, as ``save_to_disk`` writes one.

Each shard is an Arrow IPC *stream* (the format of ``datasets``' own ``.arrow`` files, which it
memory-maps), named ``.arrow`` so that ``datasets`` also knows it by its extension. The run's
``state.json`` lists every shard and ``dataset_info.json`` describes the run, so
``datasets.load_from_disk(OUTPUT)`` opens the whole run as one ``Dataset``. Both are written by
:func:`run_files` from the manifest alone, before ``manifest.json``.

The columns are the arguments of Hugging Face's models, so that ``Trainer`` keeps them and a
padding collator is all it needs (``DataCollatorForTokenClassification`` pads ``labels`` with
-100)::

    input_ids            list<uint16>, or list<uint32> for a vocabulary over 65,536 ids
    token_type_ids       list<int8>    segment ids
    labels               list<int32>   the original id at each masked position, -100 elsewhere
                                       (static masking only: with --masking none there is none)
    next_sentence_label  int8          nsp: 1 = B is a random segment; sop: 1 = A and B swapped
                                       (AlbertForPreTraining calls it sentence_order_label)
    token_boundary       list<int8>    sop: ALBERT's word-start feature
    document_starts      list<int32>   packed instances: where each document begins
    language             string        language-sampled mixes: the row's language
    document_ids         list<string>  --id-field: the ids of the records the row's tokens come from
    document_metadata    list<string>  --metadata-field: their metadata, as JSON text

Each shard's schema carries its ``datasets`` features (the ``huggingface`` metadata that
``datasets``' own writer adds), so the types come from the shards themselves: no run-level file
needs the vocabulary size. Arrow IPC has no checksums: a flipped byte is caught by the SHA-256
that ``verify`` and the loader check, not by this reader (which does check every offset, so a
damaged structure raises instead of reading out of bounds).
"""

from __future__ import annotations

import hashlib
import json
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from mlm_pipeline import fs
from mlm_pipeline.formats.base import (OutputFormat, ShardLayout, id_dtype, string_array, string_list_values,
                                       string_lists)
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets

IGNORE = -100
"""``labels`` outside the masked positions: the index Hugging Face's losses ignore."""

ROWS_PER_BATCH = 1000
"""Rows per Arrow record batch: ``datasets``' own ``writer_batch_size``. A record batch is what
``load_dataset``'s Arrow builder reads at a time, and the loader's unit of work here."""

STATE_FILE = "state.json"
INFO_FILE = "dataset_info.json"

_VALUE_TYPES = {pa.uint16(): "uint16", pa.uint32(): "uint32", pa.int8(): "int8", pa.int32(): "int32",
                pa.string(): "string"}
_NUMPY_TYPES = {pa.uint16(): np.uint16, pa.uint32(): np.uint32, pa.int8(): np.int8, pa.int32(): np.int32}


def ids_type(vocab_size: int | None) -> pa.DataType:
    """``uint16`` while every id fits (a vocabulary of at most 65,536), else ``uint32``."""
    return pa.from_numpy_dtype(id_dtype(vocab_size)) if vocab_size is not None else pa.uint32()


def _feature(typ: pa.DataType) -> dict:
    """``datasets``' feature of an Arrow type, as its ``Features.to_dict`` spells it (``Sequence``:
    the spelling every version reads; 4.x calls it ``List``)."""
    if pa.types.is_list(typ):
        return {"feature": _feature(typ.value_type), "_type": "Sequence"}
    return {"dtype": _VALUE_TYPES[typ], "_type": "Value"}


def schema_of(batch: InstanceBatch, *, vocab_size: int | None, labels: bool) -> pa.Schema:
    """The columns a batch of this run fills, with their ``datasets`` features as metadata."""
    fields = [("input_ids", pa.list_(ids_type(vocab_size))), ("token_type_ids", pa.list_(pa.int8()))]
    if labels:
        fields.append(("labels", pa.list_(pa.int32())))
    if batch.next_sentence_labels is not None:
        fields.append(("next_sentence_label", pa.int8()))
    if batch.token_boundary is not None:
        fields.append(("token_boundary", pa.list_(pa.int8())))
    if batch.document_starts is not None:
        fields.append(("document_starts", pa.list_(pa.int32())))
    if batch.languages is not None:
        fields.append(("language", pa.string()))
    fields += [(name, pa.list_(pa.string())) for name in ("document_ids", "document_metadata")
               if getattr(batch, name) is not None]
    features = {name: _feature(typ) for name, typ in fields}
    return pa.schema(fields, metadata={"huggingface": json.dumps({"info": {"features": features}})})


def _array(values: np.ndarray, typ: pa.DataType) -> pa.Array:
    """A numpy array as an Arrow array sharing its memory (``pa.array`` would import pandas)."""
    values = np.ascontiguousarray(values, dtype=_NUMPY_TYPES[typ])
    return pa.Array.from_buffers(typ, len(values), [None, pa.py_buffer(values)])


def _list(values: np.ndarray, offsets: np.ndarray, typ: pa.DataType) -> pa.ListArray:
    return pa.ListArray.from_arrays(_array(offsets, pa.int32()), _array(values, typ.value_type))


def labels_of(batch: InstanceBatch) -> np.ndarray:
    """Per token: the original id at each masked position, :data:`IGNORE` elsewhere."""
    labels = np.full(len(batch.input_ids), IGNORE, np.int32)
    rows = np.repeat(np.arange(len(batch)), batch.masked_counts)
    labels[batch.offsets[:-1][rows] + batch.masked_lm_positions] = batch.masked_lm_ids
    return labels


def batch_to_table(batch: InstanceBatch, schema: pa.Schema) -> pa.Table:
    """A block of instances as the columns of ``schema`` (:func:`schema_of`)."""
    columns = {
        "input_ids": lambda typ: _list(batch.input_ids, batch.offsets, typ),
        "token_type_ids": lambda typ: _list(batch.segment_ids, batch.offsets, typ),
        "labels": lambda typ: _list(labels_of(batch), batch.offsets, typ),
        "next_sentence_label": lambda typ: _array(batch.next_sentence_labels, typ),
        "token_boundary": lambda typ: _list(batch.token_boundary, batch.offsets, typ),
        "document_starts": lambda typ: _list(batch.document_starts, batch.document_offsets, typ),
        "language": lambda typ: string_array(batch.languages),
        **{name: (lambda typ, name=name: string_lists(getattr(batch, name), batch.source_offsets))
           for name in ("document_ids", "document_metadata")},
    }
    for field in schema:
        if field.name != "labels" and field.name in _SOURCE and getattr(batch, _SOURCE[field.name]) is None:
            raise ValueError(f"a block without {_SOURCE[field.name]} in a shard whose first block had them: "
                             "every block of a run fills the same columns")
    return pa.Table.from_arrays([columns[f.name](f.type) for f in schema], schema=schema)


_SOURCE = {"next_sentence_label": "next_sentence_labels", "token_boundary": "token_boundary",
           "document_starts": "document_starts", "language": "languages",
           "document_ids": "document_ids", "document_metadata": "document_metadata"}
"""The column -> the optional InstanceBatch field it comes from."""


class HfShardWriter:
    """Writes one shard as an Arrow IPC stream (an open binary file; not closed here).

    The schema is the first block's (its optional fields), with ``labels`` when the run masks
    statically (``masking``; when not told, when the first block has masks), so the stream is
    opened on the first write. Record batches hold :data:`ROWS_PER_BATCH` rows at most.
    """

    def __init__(self, f: BinaryIO, *, vocab_size: int | None = None, masking: str | None = None, **_settings):
        self._f = f
        self._vocab_size = vocab_size
        self._masking = masking
        self._writer: pa.ipc.RecordBatchStreamWriter | None = None
        self._schema: pa.Schema | None = None

    def write(self, batch: InstanceBatch) -> None:
        if not len(batch):
            return
        if self._writer is None:
            labels = self._masking == "static" or (self._masking is None and len(batch.masked_lm_ids) > 0)
            self._schema = schema_of(batch, vocab_size=self._vocab_size, labels=labels)
            self._writer = pa.ipc.new_stream(self._f, self._schema)
        id_type = self._schema.field("input_ids").type.value_type
        if batch.input_ids.size and int(batch.input_ids.max()) > np.iinfo(_NUMPY_TYPES[id_type]).max:
            raise ValueError(f"token id {int(batch.input_ids.max())} does not fit the shard's {id_type} ids "
                             f"(the tokenizer's vocabulary size: {self._vocab_size})")
        for start in range(0, len(batch), ROWS_PER_BATCH):
            part = batch.slice(start, min(start + ROWS_PER_BATCH, len(batch)))
            self._writer.write_table(batch_to_table(part, self._schema))

    def close(self) -> None:
        if self._writer is None:  # (no rows: a valid stream of no batches)
            self._writer = pa.ipc.new_stream(self._f, schema_of(InstanceBatch.empty(), vocab_size=self._vocab_size,
                                                                labels=self._masking == "static"))
        self._writer.close()


def _numpy(arr: pa.Array, dtype) -> np.ndarray:
    """Zero-copy view of a null-free primitive Arrow array (``to_numpy`` would import pandas)."""
    dtype = np.dtype(dtype)
    return np.frombuffer(arr.buffers()[1], dtype=dtype, count=len(arr), offset=arr.offset * dtype.itemsize)


def _flat(table: pa.Table, name: str) -> tuple[np.ndarray, np.ndarray]:
    """A list column's values (those of its rows) and its offsets from 0."""
    arr = table.column(name).combine_chunks()
    if len(arr) == 0:
        return np.zeros(0, _NUMPY_TYPES[arr.type.value_type]), np.zeros(1, np.int64)
    offsets = _numpy(arr.offsets, np.int32).astype(np.int64)
    values = _numpy(arr.values, _NUMPY_TYPES[arr.type.value_type])
    return values[offsets[0]: offsets[-1]], offsets - offsets[0]


def table_to_batch(table: pa.Table) -> InstanceBatch:
    """Rows of a shard back as an :class:`InstanceBatch` (the masked positions and ids from
    ``labels``, ascending as they were written)."""
    names = table.column_names
    ids, offsets = _flat(table, "input_ids")
    segments, _ = _flat(table, "token_type_ids")
    n = len(offsets) - 1
    if "labels" in names:
        labels, _ = _flat(table, "labels")
        (masked,) = np.nonzero(labels != IGNORE)
        rows = np.searchsorted(offsets, masked, side="right") - 1
        positions = (masked - offsets[rows]).astype(np.int32)
        masked_ids = labels[masked].astype(np.int32)
        masked_offsets = lengths_to_offsets(np.bincount(rows, minlength=n))
    else:
        positions, masked_ids, masked_offsets = np.zeros(0, np.int32), np.zeros(0, np.int32), np.zeros(n + 1, np.int64)
    nsp = (np.array(_numpy(table.column("next_sentence_label").combine_chunks(), np.int8)) if n else np.zeros(0, np.int8)
           ) if "next_sentence_label" in names else None
    boundary = _flat(table, "token_boundary")[0].astype(np.int8) if "token_boundary" in names else None
    starts, document_offsets = _flat(table, "document_starts") if "document_starts" in names else (None, None)
    languages = (np.array(table.column("language").to_pylist(), dtype=str) if "language" in names else None)
    sources = {name: string_list_values(table.column(name)) for name in ("document_ids", "document_metadata")
               if name in names}
    return InstanceBatch(
        input_ids=ids.astype(np.int32),
        segment_ids=segments.astype(np.int8),
        offsets=offsets,
        masked_lm_positions=positions,
        masked_lm_ids=masked_ids,
        masked_offsets=masked_offsets,
        next_sentence_labels=nsp,
        token_boundary=boundary,
        document_starts=None if starts is None else starts.astype(np.int32),
        document_offsets=document_offsets,
        languages=languages,
        source_offsets=next((offsets for _, offsets in sources.values()), None),
        **{name: values for name, (values, _) in sources.items()},
    )


def _open_table(url: str) -> pa.Table:
    """The whole stream as a table: memory-mapped for a local file (no copy: rows are decoded
    when asked for), read into memory from an object store. Every offset is checked."""
    if fs.is_local(url):
        source = pa.memory_map(fs.get_fs(url)[1])
    else:
        source = pa.BufferReader(fs.read_bytes(url))
    table = pa.ipc.open_stream(source).read_all()
    if table.column_names[:2] != ["input_ids", "token_type_ids"]:
        raise ValueError(f"not a shard of the hf format (its columns: {', '.join(table.column_names)})")
    table.validate(full=True)
    return table


def read_hf(url: str) -> InstanceBatch:
    """A whole shard (local path or fsspec URL) as an :class:`InstanceBatch`."""
    return table_to_batch(_open_table(url))


class HfRows:
    """Rows ``[start, stop)`` of one shard: the stream is mapped once (locally) and each range
    decoded from its slice."""

    def __init__(self, url: str, footer=None):
        self._url = url
        self._table: pa.Table | None = None

    def read(self, start: int, stop: int) -> InstanceBatch:
        if self._table is None:
            self._table = _open_table(self._url)
        if stop > self._table.num_rows:
            raise ValueError(f"{self._url}: has {self._table.num_rows} rows, rows up to {stop} requested "
                             "(manifest out of date?)")
        return table_to_batch(self._table.slice(start, stop - start))

    def close(self) -> None:
        self._table = None


def read_layout(url: str, lengths: bool = False) -> ShardLayout:
    """The shard's record batches as its row groups and, with ``lengths``, every row's length
    (from the ``input_ids`` offsets alone)."""
    table = _open_table(url)
    batches = table.to_batches()
    row_groups = np.array([b.num_rows for b in batches if b.num_rows], np.int64)
    if not lengths:
        return ShardLayout(row_groups)
    parts = [np.diff(_numpy(b.column(0).offsets, np.int32)).astype(np.int32) for b in batches]
    return ShardLayout(row_groups, np.concatenate(parts) if parts else np.zeros(0, np.int32))


def run_files(manifest: dict) -> dict[str, bytes]:
    """``state.json`` and ``dataset_info.json``: what ``datasets.load_from_disk`` opens the run
    with, from the manifest alone (no ``features``: ``datasets`` takes them from the shards)."""
    paths = [shard["path"] for shard in manifest["shards"]]
    digest = hashlib.sha256("".join(shard.get("sha256") or "" for shard in manifest["shards"]).encode())
    state = {
        "_data_files": [{"filename": path} for path in paths],
        "_fingerprint": digest.hexdigest()[:16],  # (``datasets`` caches a dataset's transforms under it)
        "_format_columns": None,
        "_format_kwargs": {},
        "_format_type": None,
        "_output_all_columns": False,
        "_split": "train",
    }
    instances = sum(int(shard["instances"]) for shard in manifest["shards"])
    size = sum(int(shard.get("bytes") or 0) for shard in manifest["shards"])
    info = {
        "builder_name": "mlm-pipeline",
        "citation": "",
        "config_name": "default",
        "dataset_size": size,
        "description": f"Masked-LM pretraining instances ({manifest.get('objective')} objective, "
                       f"masking {manifest.get('masking')}) written by mlm-pipeline {manifest.get('version')}; "
                       "README.md describes them.",
        "features": None,
        "homepage": "",
        "license": "",
        "size_in_bytes": size,
        "splits": {"train": {"name": "train", "num_bytes": size, "num_examples": instances,
                             "dataset_name": "mlm-pipeline"}},
    }
    return {STATE_FILE: json.dumps(state, indent=2, sort_keys=True).encode(),
            INFO_FILE: json.dumps(info, indent=2).encode()}


FORMAT = OutputFormat(name="hf", open_writer=HfShardWriter, read_shard=read_hf, open_rows=HfRows,
                      read_layout=read_layout, run_files=run_files, suffix="arrow", carries_sources=True)
