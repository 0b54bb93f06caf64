"""The ``mds`` output format: mosaicml-streaming's MDS shards, for Composer and ModernBERT.

Each shard is one joint MDS file as streaming's ``MDSWriter`` writes it, and the run's
``index.json`` (version 2) lists every shard in the manifest's order, so that
``streaming.StreamingDataset(local=OUTPUT)`` (or ``remote=`` the same directory on an object
store) reads the output as it is. Writing needs no library beyond numpy and pyarrow (zstd).
:func:`read_mds` reads a whole shard back, vectorised, and :class:`MDSRows` a range of its rows
(the torch loader's windows) by their byte range.

A joint shard is ``[samples: uint32][offsets: (samples + 1) x uint32][config JSON][samples]``,
the offsets counted from the file's start; a sample is the byte sizes of its variable-size
columns (uint32 each), then every column's bytes, columns in name order. Columns (encodings as
streaming names them):

- ``input_ids``, ``masked_lm_ids``: ``ndarray:uint16`` when the vocabulary has at most 65,536
  ids, else ``ndarray:uint32``; ``masked_lm_positions`` and ``document_starts``: ``uint16``
  unless a row can be longer than 65,536 tokens;
- ``segment_ids``, ``token_boundary`` (``sop``): ``ndarray:uint8``;
- ``next_sentence_labels`` (``nsp``, ``sop``): ``uint8``; ``language``: ``str``;
- ``document_ids``, ``document_metadata`` (``--id-field``, ``--metadata-field``): ``json``, a
  list of strings per row (the records' ids; their metadata as JSON text), as streaming's JSON
  encoding writes it (``json.dumps``), so ``StreamingDataset`` gives each row a Python list;
- ``id``: ``str``, ``TASK-N``: the run's task id and the instance's number within that task's
  output (0, 1, ...). Unique in the run, the same whatever the worker count or executor, and
  the same as the Parquet output of the same settings numbers its rows.

The masked-LM columns are written when the shard's instances carry masks (static masking), the
others when the objective fills them; ``segment_ids`` unless every row is one segment (``tokens``,
``packed``), so that a tokens-only run's samples are ``id`` and ``input_ids``. Shards are cut at the run's ``--max-instances-per-shard`` or at ``SIZE_LIMIT``
bytes of MDS data, whichever comes first (streaming's own default limit; its offsets are uint32, so
a shard could never pass 4 GiB). With ``--mds-compression zstd`` each committed file is the zstd
frame of that data, as streaming compresses a shard, and ``index.json`` names the data's own
(decompressed) file ``part-….mds.SHA.raw`` beside it (``SHA``: the start of its SHA-256), where
streaming writes it on first read: a copy left by an earlier run's shard of that name is never
taken for this one's.
"""

from __future__ import annotations

import hashlib
import json
from typing import BinaryIO

import numpy as np
import pyarrow as pa

from mlm_pipeline import fs
from mlm_pipeline.formats.base import OutputFormat, id_dtype
from mlm_pipeline.instances.batch import InstanceBatch, gather_ranges, lengths_to_offsets

SIZE_LIMIT = 1 << 26
"""Bytes of MDS data per shard at most (streaming's ``MDSWriter`` default, 64 MiB): a worker holds
one shard's data until it is whole, as the offsets come first."""

COMPRESSIONS = ("none", "zstd")
ZSTD_LEVEL = 3  # streaming's level for "zstd"
_ZSTD_MAGIC = b"\x28\xb5\x2f\xfd"
HASHES = ["sha256"]  # the digests index.json records (the manifest's own)
_HEADER = 5  # ndarray header bytes reserved per row: (ndim << 2 | shape dtype), then the shape


def raw_basename(path: str, raw_sha256: str) -> str:
    """A compressed shard's decompressed file, as index.json names it (streaming uses a file of
    that name that it finds, so the name changes with the content)."""
    return f"{path}.{raw_sha256[:16]}.raw"


def _id_dtype(vocab_size: int | None) -> str:
    return id_dtype(vocab_size).name if vocab_size is not None else "uint32"


def _position_dtype(max_seq_length: int | None) -> str:
    return "uint16" if max_seq_length is not None and max_seq_length <= 1 << 16 else "uint32"


SINGLE_SEGMENT = frozenset({"tokens", "packed"})
"""Objectives whose rows are one segment: their shards have no ``segment_ids`` (all zeros), so
that a tokens-only sample is its ``input_ids`` (ModernBERT's ``NoStreamingDataset`` takes every
array column for token ids)."""


def columns_of(batch: InstanceBatch, *, vocab_size: int | None, max_seq_length: int | None,
               objective: str | None = None) -> dict[str, str]:
    """The MDS columns (name -> encoding) of a shard whose first instances are ``batch``."""
    ids, positions = _id_dtype(vocab_size), _position_dtype(max_seq_length)
    columns = {"id": "str", "input_ids": f"ndarray:{ids}"}
    if objective not in SINGLE_SEGMENT:
        columns["segment_ids"] = "ndarray:uint8"
    if len(batch.masked_lm_ids):
        columns["masked_lm_positions"] = f"ndarray:{positions}"
        columns["masked_lm_ids"] = f"ndarray:{ids}"
    if batch.next_sentence_labels is not None:
        columns["next_sentence_labels"] = "uint8"
    if batch.token_boundary is not None:
        columns["token_boundary"] = "ndarray:uint8"
    if batch.document_starts is not None:
        columns["document_starts"] = f"ndarray:{positions}"
    if batch.languages is not None:
        columns["language"] = "str"
    for name in SOURCE_COLUMNS:
        if getattr(batch, name) is not None:
            columns[name] = "json"
    return dict(sorted(columns.items()))


SOURCE_COLUMNS = ("document_ids", "document_metadata")
"""The ``json`` columns: each row's source records (see the module docstring)."""


def _source_texts(batch: InstanceBatch, name: str) -> list[str]:
    """Each row's list of ``name`` values as streaming's JSON encoding writes it (``json.dumps``)."""
    values, offsets = getattr(batch, name).tolist(), batch.source_offsets.tolist()
    return [json.dumps(values[offsets[i]:offsets[i + 1]]) for i in range(len(batch))]


def _fixed_size(encoding: str) -> int | None:
    """The bytes of a fixed-size column (streaming's ``column_sizes``), None for variable ones."""
    return None if encoding in ("str", "json") or encoding.startswith("ndarray") else np.dtype(encoding).itemsize


def shard_config(columns: dict[str, str], compression: str | None, size_limit: int) -> dict:
    """The writer's configuration as streaming records it in each shard and in ``index.json``."""
    return {
        "column_encodings": list(columns.values()),
        "column_names": list(columns),
        "column_sizes": [_fixed_size(e) for e in columns.values()],
        "compression": compression,
        "format": "mds",
        "hashes": HASHES,
        "size_limit": size_limit,
        "version": 2,
    }


def _strings(texts: list[str]) -> tuple[np.ndarray, np.ndarray]:
    """UTF-8 bytes of ``texts`` back to back, and each one's length in bytes."""
    encoded = [t.encode() for t in texts]
    lengths = np.fromiter(map(len, encoded), np.int64, len(encoded))
    return np.frombuffer(b"".join(encoded), np.uint8), lengths


class _Pieces:
    """The byte ranges a block of samples is gathered from: one source, ranges per row."""

    def __init__(self):
        self.sources: list[np.ndarray] = []
        self.base = 0
        self.starts: list[np.ndarray] = []  # per range kind: a start per row (in the joined source)
        self.lengths: list[np.ndarray] = []

    def add(self, source: np.ndarray, starts: np.ndarray, lengths: np.ndarray) -> None:
        self.sources.append(source)
        self.starts.append(np.asarray(starts, np.int64) + self.base)
        self.lengths.append(np.asarray(lengths, np.int64))
        self.base += len(source)

    def gather(self) -> np.ndarray:
        starts = np.stack(self.starts, axis=1).ravel()
        lengths = np.stack(self.lengths, axis=1).ravel()
        return gather_ranges((np.concatenate(self.sources),), starts, lengths)[0]


def _ndarray_header(counts: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Streaming's header of a one-dimensional array of ``counts[i]`` values with a static dtype:
    ``(1 << 2) | shape dtype`` (0: uint8, 1: uint16, 2: uint32, the smallest holding the count),
    then the count in that dtype. Returns ``_HEADER`` bytes per row and each header's length."""
    counts = np.asarray(counts, np.int64)
    code = (counts >= 1 << 8).astype(np.uint8) + (counts >= 1 << 16)
    header = np.zeros((len(counts), _HEADER), np.uint8)
    header[:, 0] = 4 | code
    header[:, 1:] = counts.astype("<u4").view(np.uint8).reshape(-1, 4)
    return header.ravel(), 1 + (1 << code.astype(np.int64))


class MDSShardWriter:
    """Encodes blocks of instances as MDS samples and writes the shard at :meth:`close`.

    The offsets precede the samples, so the samples are held (encoded) until the shard is closed:
    at most ``size_limit`` bytes, which :meth:`room` keeps to. ``task_id`` and ``first_row``
    (the task's instances in its earlier shards) number the ``id`` column. After :meth:`close`,
    ``shard_entry`` holds what the run's manifest keeps of the shard for ``index.json``.
    """

    def __init__(self, f: BinaryIO, *, max_seq_length: int | None = None, vocab_size: int | None = None,
                 mds_compression: str | None = "none", objective: str | None = None, task_id: str | None = None,
                 first_row: int = 0, size_limit: int = SIZE_LIMIT, **_settings):
        compression = mds_compression or "none"
        if compression not in COMPRESSIONS:
            raise ValueError(f"MDS compression must be one of {', '.join(COMPRESSIONS)}, got {compression!r}")
        if not 0 < size_limit < 1 << 32:
            raise ValueError(f"an MDS shard's size limit must be below 4 GiB (its offsets are uint32), got {size_limit}")
        self._f = f
        self._compression = None if compression == "none" else compression
        self._size_limit = size_limit
        self._vocab_size = vocab_size
        self._max_seq_length = max_seq_length
        self._objective = objective
        self._prefix = "" if task_id is None else f"{task_id}-"
        self._next_row = first_row
        self.columns: dict[str, str] | None = None
        self._config_bytes = b""
        self._chunks: list[np.ndarray] = []
        self._sizes: list[np.ndarray] = []
        self._bytes = 0  # the shard's bytes so far: header (as if closed now) and samples
        self.shard_entry: dict | None = None

    def _start(self, batch: InstanceBatch) -> None:
        self.columns = columns_of(batch, vocab_size=self._vocab_size, max_seq_length=self._max_seq_length,
                          objective=self._objective)
        config = shard_config(self.columns, self._compression, self._size_limit)
        self._config_bytes = json.dumps(config, sort_keys=True).encode()
        self._bytes = 4 + 4 + len(self._config_bytes)  # samples count, last offset, config

    def _lengths(self, batch: InstanceBatch) -> dict[str, np.ndarray]:
        """Per column, the values (or bytes, for str) of each row."""
        lengths = {"input_ids": batch.lengths, "segment_ids": batch.lengths, "token_boundary": batch.lengths,
                   "masked_lm_positions": batch.masked_counts, "masked_lm_ids": batch.masked_counts}
        if batch.document_starts is not None:
            lengths["document_starts"] = np.diff(batch.document_offsets)
        return lengths

    def _sample_sizes(self, batch: InstanceBatch) -> np.ndarray:
        """Each row's bytes as :meth:`write` would encode it (without its offset), from lengths alone."""
        n = len(batch)
        lengths = self._lengths(batch)
        sizes = np.zeros(n, np.int64)
        for name, encoding in self.columns.items():
            if name == "id":
                sizes += self._id_lengths(n)
            elif name == "language":
                sizes += _strings(batch.languages.tolist())[1]
            elif name in SOURCE_COLUMNS:
                sizes += _strings(_source_texts(batch, name))[1]
            elif encoding.startswith("ndarray:"):
                count = lengths[name]
                header = 1 + (1 << ((count >= 1 << 8).astype(np.int64) + (count >= 1 << 16)))
                sizes += header + count * np.dtype(encoding[8:]).itemsize
            else:
                sizes += _fixed_size(encoding)
        variable = sum(_fixed_size(e) is None for e in self.columns.values())
        return sizes + 4 * variable

    def _id_lengths(self, n: int) -> np.ndarray:
        """The UTF-8 bytes of the next ``n`` ids (the prefix and the row's decimal digits)."""
        rows = np.arange(self._next_row, self._next_row + n, dtype=np.int64)
        digits = np.ones(n, np.int64)
        for power in range(1, 19):
            digits += rows >= 10**power
        return digits + len(self._prefix.encode())

    def room(self, batch: InstanceBatch) -> int:
        """How many of ``batch``'s first rows this shard can still take within its size limit
        (at least one when it is empty: ``ValueError`` if that one alone is too large)."""
        if self.columns is None:
            self._start(batch)
        per_row = self._sample_sizes(batch) + 4  # (and its offset)
        fits = int(np.searchsorted(np.cumsum(per_row) + self._bytes, self._size_limit, side="right"))
        if fits == 0 and not self._sizes:
            raise ValueError(f"an instance takes {int(per_row[0]):,} bytes of MDS data, more than a shard's "
                             f"limit of {self._size_limit:,} bytes")
        return fits

    def write(self, batch: InstanceBatch) -> None:
        n = len(batch)
        if not n:
            return
        if self.columns is None:
            self._start(batch)
        self._check(batch)
        pieces = _Pieces()
        variable = [name for name, e in self.columns.items() if _fixed_size(e) is None]
        head = np.zeros((n, len(variable)), "<u4")
        pieces.add(head.view(np.uint8).ravel(), np.arange(n) * 4 * len(variable), np.full(n, 4 * len(variable)))
        lengths = self._lengths(batch)
        for name, encoding in self.columns.items():
            if name in ("id", "language", *SOURCE_COLUMNS):
                texts = ([f"{self._prefix}{r}" for r in range(self._next_row, self._next_row + n)] if name == "id"
                         else batch.languages.tolist() if name == "language" else _source_texts(batch, name))
                data, size = _strings(texts)
                pieces.add(data, lengths_to_offsets(size)[:-1], size)
            elif encoding.startswith("ndarray:"):
                dtype = np.dtype(encoding[8:]).newbyteorder("<")
                values = self._values(batch, name).astype(dtype, copy=False).view(np.uint8)
                count = lengths[name]
                header, header_size = _ndarray_header(count)
                pieces.add(header, np.arange(n) * _HEADER, header_size)
                pieces.add(values, lengths_to_offsets(count)[:-1] * dtype.itemsize, count * dtype.itemsize)
                size = header_size + count * dtype.itemsize
            else:
                values = np.ascontiguousarray(batch.next_sentence_labels, np.dtype(encoding)).view(np.uint8)
                pieces.add(values, np.arange(n) * values.itemsize, np.full(n, values.itemsize))
                continue
            head[:, variable.index(name)] = size  # (the pieces share head's memory: filled before the gather)
        samples = pieces.gather()
        sizes = np.stack(pieces.lengths, axis=1).sum(axis=1)
        total = self._bytes + int(sizes.sum()) + 4 * n
        if total > self._size_limit:
            raise ValueError(f"MDS shard over its size limit ({total:,} > {self._size_limit:,} bytes): "
                             "the writer was given more rows than room() allowed")
        self._chunks.append(samples)
        self._sizes.append(sizes)
        self._bytes = total
        self._next_row += n

    def _check(self, batch: InstanceBatch) -> None:
        """The block fits the shard's columns (decided by its first block) and their dtypes."""
        expected = columns_of(batch, vocab_size=self._vocab_size, max_seq_length=self._max_seq_length,
                          objective=self._objective)
        if not len(batch.masked_lm_ids) and "masked_lm_ids" in self.columns:
            expected["masked_lm_positions"], expected["masked_lm_ids"] = (
                self.columns["masked_lm_positions"], self.columns["masked_lm_ids"])
        if dict(sorted(expected.items())) != self.columns:
            raise ValueError(f"a block's columns {sorted(expected)} differ from its MDS shard's {list(self.columns)}")
        limit = 1 << 16
        if self.columns["input_ids"].endswith("uint16") and len(batch.input_ids) and int(batch.input_ids.max()) >= limit:
            raise ValueError(f"token id {int(batch.input_ids.max())} does not fit MDS's uint16 ids: the tokenizer "
                             f"reported a vocabulary of {self._vocab_size}")

    @staticmethod
    def _values(batch: InstanceBatch, name: str) -> np.ndarray:
        return {"input_ids": batch.input_ids, "segment_ids": batch.segment_ids, "token_boundary": batch.token_boundary,
                "masked_lm_positions": batch.masked_lm_positions, "masked_lm_ids": batch.masked_lm_ids,
                "document_starts": batch.document_starts}[name]

    def close(self) -> None:
        sizes = np.concatenate(self._sizes) if self._sizes else np.zeros(0, np.int64)
        n = len(sizes)
        start = 4 + 4 * (n + 1) + len(self._config_bytes)
        offsets = (start + lengths_to_offsets(sizes)).astype("<u4")
        parts = [np.array([n], "<u4").tobytes(), offsets.tobytes(), self._config_bytes, *self._chunks]
        columns = " ".join(f"{name}:{encoding}" for name, encoding in (self.columns or {}).items())
        entry: dict = {"columns": columns, "size_limit": self._size_limit}
        if self._compression is None:
            for part in parts:
                self._f.write(part)
        else:
            raw = b"".join(bytes(p) if isinstance(p, np.ndarray) else p for p in parts)
            entry.update(compression=self._compression, raw_bytes=len(raw),
                         raw_sha256=hashlib.sha256(raw).hexdigest())
            self._f.write(compress(raw))
        self._chunks, self._sizes = [], []
        self.shard_entry = {"mds": entry}


def compress(raw: bytes) -> bytes:
    """A zstd frame of ``raw`` (with its content size, which streaming's decompressor needs)."""
    return pa.Codec("zstd", compression_level=ZSTD_LEVEL).compress(raw, asbytes=True)


def decompress(data: bytes) -> bytes:
    """The MDS data of a shard file, compressed or not (a zstd frame starts with its magic)."""
    if data[:4] != _ZSTD_MAGIC:
        return data
    return pa.Codec("zstd").decompress(data, decompressed_size=_frame_content_size(data), asbytes=True)


def _frame_content_size(data: bytes) -> int:
    """The decompressed size a zstd frame header records (RFC 8878, 3.1.1.1)."""
    descriptor = data[4]
    fcs_flag, single_segment, dict_flag = descriptor >> 6, (descriptor >> 5) & 1, descriptor & 3
    at = 5 + (0 if single_segment else 1) + (0, 1, 2, 4)[dict_flag]
    width = (1 if single_segment else 0, 2, 4, 8)[fcs_flag]
    if width == 0:
        raise ValueError("a zstd frame without its content size")
    size = int.from_bytes(data[at:at + width], "little")
    return size + 256 if width == 2 else size


# --------------------------------------------------------------------------------------------
# Reading


def parse_columns(raw: bytes | np.ndarray) -> tuple[int, np.ndarray, dict]:
    """A shard's sample count, offsets and configuration (its header)."""
    data = np.frombuffer(raw, np.uint8)
    if len(data) < 8:
        raise ValueError(f"not an MDS shard: {len(data)} bytes")
    n = int(data[:4].view("<u4")[0])
    if 4 + 4 * (n + 1) > len(data):
        raise ValueError(f"not an MDS shard: {n:,} samples announced in {len(data):,} bytes")
    offsets = data[4 : 4 + 4 * (n + 1)].view("<u4").astype(np.int64)
    start = 4 + 4 * (n + 1)
    if offsets[0] < start or offsets[-1] != len(data) or np.any(np.diff(offsets) < 0):
        raise ValueError(f"damaged MDS shard: its offsets do not cover its {len(data):,} bytes")
    config = json.loads(bytes(data[start : offsets[0]]))
    if config.get("format") != "mds" or config.get("version") != 2:
        raise ValueError("not an MDS shard of version 2")
    return n, offsets, config


def read_columns(raw: bytes | np.ndarray) -> dict[str, tuple[np.ndarray, np.ndarray | None]]:
    """Every column of a shard's MDS data: ``(values, offsets)`` per ndarray column (the rows'
    values back to back), ``(values, None)`` per fixed-size one, and ``(bytes, offsets)`` per
    ``str`` one. Vectorised: a gather per column, no loop over samples."""
    n, offsets, config = parse_columns(raw)
    data = np.frombuffer(raw, np.uint8)
    names, encodings, fixed = config["column_names"], config["column_encodings"], config["column_sizes"]
    variable = sum(size is None for size in fixed)
    starts = offsets[:-1]
    if variable:
        heads = gather_ranges((data,), starts, np.full(n, 4 * variable))[0]
        sizes = heads.view("<u4").reshape(n, variable).astype(np.int64)
    else:
        sizes = np.zeros((n, 0), np.int64)
    position = starts + 4 * variable
    out: dict[str, tuple[np.ndarray, np.ndarray | None]] = {}
    k = 0
    for name, encoding, size in zip(names, encodings, fixed):
        if size is None:
            length = sizes[:, k]
            k += 1
        else:
            length = np.full(n, size, np.int64)
        if np.any(position + length > offsets[1:]):
            raise ValueError(f"damaged MDS shard: column {name} runs past its sample")
        if encoding.startswith("ndarray:"):
            dtype = np.dtype(encoding[8:]).newbyteorder("<")
            first = data[position] if n else np.zeros(0, np.uint8)
            if np.any(first >> 2 != 1) or np.any((first & 3) > 2):
                raise ValueError(f"damaged MDS shard: column {name} holds no one-dimensional array")
            header = 1 + (1 << (first & 3).astype(np.int64))
            values = gather_ranges((data,), position + header, length - header)[0]
            if (length - header).min(initial=0) < 0 or np.any((length - header) % dtype.itemsize):
                raise ValueError(f"damaged MDS shard: column {name} has a partial value")
            out[name] = (values.view(dtype), lengths_to_offsets((length - header) // dtype.itemsize))
        elif encoding in ("str", "json"):
            out[name] = (gather_ranges((data,), position, length)[0], lengths_to_offsets(length))
        else:
            out[name] = (gather_ranges((data,), position, length)[0].view(np.dtype(encoding).newbyteorder("<")), None)
        position = position + length
    return out


def _texts(values: np.ndarray, offsets: np.ndarray) -> list[str]:
    blob = values.tobytes()
    return [blob[offsets[i] : offsets[i + 1]].decode() for i in range(len(offsets) - 1)]


def columns_to_batch(columns: dict) -> InstanceBatch:
    ids, offsets = columns["input_ids"]
    n = len(offsets) - 1
    empty = (np.zeros(0, np.int32), np.zeros(n + 1, np.int64))
    positions, masked_offsets = columns.get("masked_lm_positions", empty)
    masked_ids, _ = columns.get("masked_lm_ids", empty)
    nsp = columns.get("next_sentence_labels")
    boundary = columns.get("token_boundary")
    documents = columns.get("document_starts")
    language = columns.get("language")
    segments = columns.get("segment_ids")
    sources = {name: [json.loads(text) for text in _texts(*columns[name])] for name in SOURCE_COLUMNS
               if name in columns}
    return InstanceBatch(
        input_ids=ids.astype(np.int32),
        segment_ids=np.zeros(len(ids), np.int8) if segments is None else segments[0].astype(np.int8),
        offsets=offsets,
        masked_lm_positions=positions.astype(np.int32),
        masked_lm_ids=masked_ids.astype(np.int32),
        masked_offsets=masked_offsets,
        next_sentence_labels=None if nsp is None else nsp[0].astype(np.int8),
        token_boundary=None if boundary is None else boundary[0].astype(np.int8),
        document_starts=None if documents is None else documents[0].astype(np.int32),
        document_offsets=None if documents is None else documents[1],
        languages=None if language is None else np.array(_texts(*language)),
        source_offsets=next((lengths_to_offsets(np.array([len(row) for row in rows], np.int64))
                             for rows in sources.values()), None),
        **{name: np.array([value for row in rows for value in row], dtype=object) for name, rows in sources.items()},
    )


def read_ids(url: str) -> list[str]:
    """The ``id`` of every instance of a shard, in order."""
    return _texts(*read_columns(decompress(fs.read_bytes(url)))["id"])


def read_mds(url: str) -> InstanceBatch:
    """A whole MDS shard (local path or fsspec URL, compressed or not) as an :class:`InstanceBatch`."""
    return columns_to_batch(read_columns(decompress(fs.read_bytes(url))))


class MDSRows:
    """Rows ``[start, stop)`` of one MDS shard, read by their byte range: the header (sample count,
    offsets, configuration) once, then only the samples asked for. A compressed shard is
    decompressed whole on the first read and kept (zstd has no random access)."""

    def __init__(self, url: str):
        self._url = url
        self._file = None
        self._data: bytes | None = None  # a compressed shard's data
        self._offsets: np.ndarray | None = None
        self._config = b""

    def _open(self) -> None:
        self._file = fs.open_ranges(self._url)
        head = _read_exactly(self._file, 8)
        if head[:4] == _ZSTD_MAGIC:
            self._file.seek(0)
            self._data = decompress(self._file.read())
            _, self._offsets, _ = parse_columns(self._data)
            return
        n = int.from_bytes(head[:4], "little")
        rest = _read_exactly(self._file, 4 * n)
        offsets = np.frombuffer(head[4:] + rest, "<u4").astype(np.int64)
        self._config = _read_exactly(self._file, int(offsets[0]) - 4 - 4 * (n + 1))
        if np.any(np.diff(offsets) < 0):
            raise ValueError("damaged MDS shard: its offsets go back")
        self._offsets = offsets

    def read(self, start: int, stop: int) -> InstanceBatch:
        if self._offsets is None:
            self._open()
        n = len(self._offsets) - 1
        if stop > n:
            raise ValueError(f"{self._url}: has {n} rows, rows up to {stop} requested (manifest out of date?)")
        lo, hi = int(self._offsets[start]), int(self._offsets[stop])
        if self._data is not None:
            samples = self._data[lo:hi]
            config = bytes(self._data[4 + 4 * (n + 1) : int(self._offsets[0])])
        else:
            self._file.seek(lo)
            samples, config = _read_exactly(self._file, hi - lo), self._config
        # the rows as a shard of their own: rebased offsets, the same configuration
        k = stop - start
        first = 4 + 4 * (k + 1) + len(config)
        offsets = (self._offsets[start : stop + 1] - lo + first).astype("<u4")
        shard = np.array([k], "<u4").tobytes() + offsets.tobytes() + config + samples
        return columns_to_batch(read_columns(shard))

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._file = self._data = self._offsets = None


def _read_exactly(f, size: int) -> bytes:
    data = f.read(size)
    if len(data) != size:
        raise ValueError(f"damaged MDS shard: {len(data)} bytes where {size} were expected (truncated?)")
    return data


# --------------------------------------------------------------------------------------------
# index.json


def index_entry(shard: dict) -> dict:
    """Streaming's ``index.json`` entry of a shard from its manifest entry."""
    mds = shard.get("mds")
    if not isinstance(mds, dict) or "columns" not in mds:
        raise ValueError(f"the manifest's entry of {shard.get('path')} has no MDS columns (not written as MDS?)")
    columns = dict(item.split(":", 1) for item in mds["columns"].split())
    compression = mds.get("compression")
    config = shard_config(columns, compression, mds["size_limit"])
    path = shard["path"]
    if compression is None:
        raw = {"basename": path, "bytes": shard["bytes"], "hashes": {"sha256": shard["sha256"]}}
        zipped = None
    else:
        raw = {"basename": raw_basename(path, mds["raw_sha256"]), "bytes": mds["raw_bytes"], "hashes": {"sha256": mds["raw_sha256"]}}
        zipped = {"basename": path, "bytes": shard["bytes"], "hashes": {"sha256": shard["sha256"]}}
    return {**config, "raw_data": raw, "samples": shard["instances"], "zip_data": zipped}


def run_files(manifest: dict) -> dict[str, bytes]:
    """``index.json``: every shard of the run in the manifest's order, as streaming's writer
    indexes its shards (paths relative to the output, which streaming joins to its ``local``)."""
    index = {"shards": [index_entry(s) for s in manifest["shards"]], "version": 2}
    return {"index.json": json.dumps(index, sort_keys=True).encode()}


FORMAT = OutputFormat(name="mds", open_writer=MDSShardWriter, read_shard=read_mds, open_rows=MDSRows,
                      run_files=run_files, carries_sources=True)
