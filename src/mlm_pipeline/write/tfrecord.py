"""TFRecord shards of ``tf.train.Example`` records, written vectorised and read without TensorFlow.

Writing. :func:`encode_tfrecord` turns an :class:`InstanceBatch` into the bytes of a TFRecord file
with one ``tf.train.Example`` per instance and exactly the features of google-research/bert
``create_pretraining_data.py`` (read by ``run_pretraining.py``). Nothing loops per value or per
token. Every record is the same sequence of pieces: field tags and key strings (constant), varint
length prefixes and packed varint values (whose sizes vary per record), raw float bytes and the
framing. Each piece gets a fixed-width slot (as wide as its longest encoding) in a (records x
width) byte matrix, filled column-wise for all records at once, varints one 7-bit group per round
(usually 2 or 3 rounds); slot bytes past a varint's actual size are masked out, and compacting the
matrix by the mask yields the records back to back. The CRCs of the 8-byte length headers are
computed by a table-driven CRC32C vectorised over records; the only per-record Python step is one
``google_crc32c.value`` call on each record's data.

Map entries are written sorted by key, all values as packed repeated fields, an empty value list
omitted: protobuf's deterministic serialization, so the bytes depend only on the values.

Reading. :func:`iter_tfrecord_records` checks the framing (length and data CRCs) of a stream,
:func:`parse_example` decodes one ``tf.train.Example`` generically (int64/float lists packed or
not, bytes lists, unknown fields skipped), and :func:`read_tfrecord_features` /
:func:`read_tfrecord` stack a whole file into padded 2-D arrays / an ``InstanceBatch``. For files
in our layout, the value bytes of every feature are located for all records in lockstep (every tag,
key and nested length checked); any other layout is walked record by record. Either way the values
of a feature are then decoded for all records at once.

TFRecord framing (per record): ``uint64 length`` (little-endian), ``uint32 masked_crc32c(length
bytes)``, ``data``, ``uint32 masked_crc32c(data)``, where ``masked(c) = ((c >> 15) | (c << 17)) +
0xa282ead8 (mod 2**32)``.
"""

from __future__ import annotations

import os
import struct
from collections.abc import Iterator, Mapping
from typing import BinaryIO, Union

import google_crc32c
import numpy as np

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, ranges_to_indices

__all__ = [
    "BERT_FEATURES",
    "encode_examples",
    "encode_tfrecord",
    "iter_tfrecord_records",
    "masked_crc32c",
    "parse_example",
    "read_tfrecord",
    "read_tfrecord_features",
]

#: The features of a BERT pretraining example and their list type, sorted by key (the order in
#: which :func:`encode_tfrecord` writes the map entries).
BERT_FEATURES: dict[str, str] = {
    "input_ids": "int64",
    "input_mask": "int64",
    "masked_lm_ids": "int64",
    "masked_lm_positions": "int64",
    "masked_lm_weights": "float",
    "next_sentence_labels": "int64",
    "segment_ids": "int64",
}

Source = Union[str, os.PathLike, BinaryIO]

_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_HEADER_BYTES = 12  # uint64 length + uint32 masked CRC of it
_FOOTER_BYTES = 4  # uint32 masked CRC of the data
_READ_CHUNK = 1 << 26  # never ask a file object for more at once (a corrupt length can be huge)

# Protobuf wire types and the tags used by tf.train.Example (tag = field << 3 | wire type).
_VARINT, _I64, _LEN, _I32 = 0, 1, 2, 5
_TAG_FIELD1_LEN = 0x0A  # Example.features, Features.feature (map entry), entry key, *List.value packed
_TAG_FIELD2_LEN = 0x12  # map entry value
_TAG_BYTES_LIST, _TAG_FLOAT_LIST, _TAG_INT64_LIST = 0x0A, 0x12, 0x1A  # Feature oneof kind
_LIST_TAG = {"bytes": _TAG_BYTES_LIST, "float": _TAG_FLOAT_LIST, "int64": _TAG_INT64_LIST}
_KIND_OF_TAG = {v: k for k, v in _LIST_TAG.items()}


# --------------------------------------------------------------------------------------------
# CRC32C


def masked_crc32c(data: bytes) -> int:
    """The masked CRC32C that TFRecord stores after the length and after the data."""
    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def _mask_array(crc: np.ndarray) -> np.ndarray:
    c = crc.astype(np.uint64)
    return ((((c >> np.uint64(15)) | (c << np.uint64(17))) + np.uint64(_MASK_DELTA)) & np.uint64(_U32)).astype(
        np.uint32
    )


def _crc32c_table() -> np.ndarray:
    # Byte-at-a-time table for the reflected Castagnoli polynomial.
    t = np.arange(256, dtype=np.uint32)
    for _ in range(8):
        t = np.where(t & 1, (t >> np.uint32(1)) ^ np.uint32(0x82F63B78), t >> np.uint32(1)).astype(np.uint32)
    return t


_CRC_TABLE = _crc32c_table()


def _crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC32C of every row of a small ``(n, k)`` uint8 array at once (k steps, vectorised over n)."""
    crc = np.full(rows.shape[0], _U32, np.uint32)
    for j in range(rows.shape[1]):
        crc = _CRC_TABLE[(crc ^ rows[:, j]) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(_U32)


# --------------------------------------------------------------------------------------------
# Varints


def _varint_bytes(value: int) -> bytes:
    """One varint (for the constant parts of the template). Negative int64 -> 10 bytes."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def _varint_sizes(values: np.ndarray) -> np.ndarray:
    """Encoded size (1..10 bytes, uint8) of every value of an unsigned array, vectorised."""
    sizes = np.ones(values.shape, np.uint8)
    if values.size:
        top = int(values.max())
        threshold = 1 << 7
        while threshold <= top:  # so the threshold fits the dtype
            sizes += values >= values.dtype.type(threshold)
            threshold <<= 7
    return sizes


def _write_varints(out: np.ndarray, valid: np.ndarray, values: np.ndarray, sizes: np.ndarray) -> None:
    """Write ``values`` (n, L) as varints into fixed-width slots ``out``/``valid`` (n, L, K).

    Group ``j`` of every value goes to byte ``j`` of its slot, with the continuation bit where the
    value has more groups; slot bytes past a value's size are marked invalid (``valid`` False)
    and vanish when the record rows are compacted. K rounds, each over all values at once.
    """
    width = out.shape[2]
    for j in range(width):
        group = values >> values.dtype.type(7 * j) if j else values
        byte = (group & values.dtype.type(0x7F)).astype(np.uint8)
        if j + 1 < width:
            byte |= (sizes > j + 1).view(np.uint8) << np.uint8(7)
        out[:, :, j] = byte
        if j:
            valid[:, :, j] = sizes > j


def _as_varint_values(a: np.ndarray, key: str) -> np.ndarray:
    """Values as the narrowest unsigned dtype holding their protobuf ``int64`` bit pattern.

    Negatives become their uint64 two's complement (10-byte varints, as protobuf writes them).
    """
    if a.dtype == np.uint64 and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"feature {key!r}: value {int(a.max())} does not fit int64")
    if a.size and a.dtype.kind in "ub" and a.dtype.itemsize <= 4:  # no int64 round trip needed
        a = a.view(np.uint8) if a.dtype.kind == "b" else a
        top = int(a.max())
        for dtype in (np.uint8, np.uint16, np.uint32):
            if top <= np.iinfo(dtype).max:
                return a.astype(dtype, copy=False)
    a = a.astype(np.int64, copy=False)
    if a.size and int(a.min()) >= 0:
        top = int(a.max())
        for dtype in (np.uint8, np.uint16, np.uint32):
            if top <= np.iinfo(dtype).max:
                return a.astype(dtype)
    return a.view(np.uint64)


# --------------------------------------------------------------------------------------------
# Encoding


class _Slots:
    """The pieces of one record, in order, each given a fixed-width slot in every record's row.

    A piece is constant bytes (the same in every record: tags, key strings), raw per-record bytes
    of a fixed width (floats, one-byte values, the framing), or varints (a per-record length
    prefix, or a packed block of values) whose slot is as wide as the longest encoding; the bytes
    of a slot past a varint's actual size are marked invalid. Filling is column-wise over all
    records; compacting the rows by the validity mask then gives the records back to back.
    """

    def __init__(self, n: int):
        self.n = n
        self.pieces: list[tuple[str, object, int]] = []  # (kind, data, width)

    @property
    def width(self) -> int:
        return sum(w for _, _, w in self.pieces)

    def const(self, data: bytes) -> None:
        if self.pieces and self.pieces[-1][0] == "const":
            _, previous, _ = self.pieces.pop()
            data = previous + data
        self.pieces.append(("const", data, len(data)))

    def raw(self, rows: np.ndarray) -> None:
        """Fixed-width bytes (n, k), read when the rows are compacted."""
        self.pieces.append(("raw", rows, rows.shape[1]))

    def varints(self, values: np.ndarray, sizes: np.ndarray) -> None:
        """Values (n, L) (unsigned) with their varint sizes (n, L)."""
        widest = int(sizes.max()) if sizes.size else 1
        self.pieces.append(("varints", (values, sizes, widest), values.shape[1] * widest))

    def varint(self, values: np.ndarray) -> None:
        """One varint per record (a length prefix)."""
        values = values.astype(np.uint64)
        self.varints(values[:, None], _varint_sizes(values)[:, None])

    def compact(self) -> np.ndarray:
        """All records' bytes, back to back (1-D uint8)."""
        rows = np.empty((self.n, self.width), np.uint8)
        valid = np.ones(rows.shape, bool)
        column = 0
        for kind, data, width in self.pieces:
            end = column + width
            if kind == "const":
                rows[:, column:end] = np.frombuffer(data, np.uint8)
            elif kind == "raw":
                rows[:, column:end] = data
            else:
                values, sizes, widest = data
                shape = (self.n, values.shape[1], widest)
                _write_varints(rows[:, column:end].reshape(shape), valid[:, column:end].reshape(shape), values, sizes)
            column = end
        return np.compress(valid.ravel(), rows.ravel())  # = rows[valid], ~20% faster


def _check_features(features: Mapping[str, np.ndarray]) -> tuple[int, list[tuple[str, str, np.ndarray]]]:
    if not features:
        raise ValueError("at least one feature is needed")
    n = None
    checked = []
    for key in sorted(features):
        if not isinstance(key, str):
            raise ValueError(f"feature names must be str, got {key!r}")
        a = np.asarray(features[key])
        if a.ndim != 2:
            raise ValueError(f"feature {key!r}: expected a 2-D array (instances x values), got shape {a.shape}")
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise ValueError(f"feature {key!r} has {a.shape[0]} rows, other features have {n}")
        if a.dtype.kind in "iub":
            checked.append((key, "int64", a))
        elif a.dtype.kind == "f":
            checked.append((key, "float", a))
        else:
            raise ValueError(f"feature {key!r}: dtype {a.dtype} is neither integer nor floating")
    return int(n), checked


def _encode_chunk(checked: list[tuple[str, str, np.ndarray]], n: int) -> np.ndarray:
    slots = _Slots(n)
    header = np.empty((n, _HEADER_BYTES), np.uint8)  # length + its CRC, filled below
    slots.raw(header)
    blocks = []
    features_len = np.zeros(n, np.int64)
    for key, kind, a in checked:
        width = a.shape[1]
        if kind == "float":
            values = np.ascontiguousarray(a, dtype="<f4").view(np.uint8).reshape(n, 4 * width)
            sizes, payload = None, np.full(n, 4 * width, np.int64)
        else:
            values = _as_varint_values(a, key)
            if values.dtype == np.uint8 and (not width or int(values.max()) < 0x80):
                sizes, payload = None, np.full(n, width, np.int64)  # one byte each: raw
            else:
                sizes = _varint_sizes(values)
                payload = sizes.sum(axis=1, dtype=np.int64)
        list_len = (1 + _varint_sizes(payload.view(np.uint64)) + payload) if width else np.zeros(n, np.int64)
        feature_len = 1 + _varint_sizes(list_len.view(np.uint64)) + list_len
        key_bytes = key.encode("utf-8")
        key_part = bytes([_TAG_FIELD1_LEN]) + _varint_bytes(len(key_bytes)) + key_bytes + bytes([_TAG_FIELD2_LEN])
        entry_len = feature_len + _varint_sizes(feature_len.view(np.uint64)) + len(key_part)
        features_len += 1 + _varint_sizes(entry_len.view(np.uint64)) + entry_len
        blocks.append((kind, width, values, sizes, payload, list_len, feature_len, key_part, entry_len))
    example_len = 1 + _varint_sizes(features_len.view(np.uint64)) + features_len

    slots.const(bytes([_TAG_FIELD1_LEN]))  # Example.features
    slots.varint(features_len)
    for kind, width, values, sizes, payload, list_len, feature_len, key_part, entry_len in blocks:
        slots.const(bytes([_TAG_FIELD1_LEN]))  # Features.feature: a map entry
        slots.varint(entry_len)
        slots.const(key_part)  # the entry key, then the tag of the entry value
        slots.varint(feature_len)
        slots.const(bytes([_LIST_TAG[kind]]))
        slots.varint(list_len)
        if width:
            slots.const(bytes([_TAG_FIELD1_LEN]))  # the packed values
            slots.varint(payload)
            if sizes is None:
                slots.raw(values)
            else:
                slots.varints(values, sizes)
    slots.raw(np.zeros((n, 4), np.uint8))  # data CRC, filled after compaction

    # The length header and its CRC are known now (vectorised CRC over the 8 bytes of every record).
    header[:, :8] = example_len.astype("<u8").view(np.uint8).reshape(n, 8)
    header[:, 8:] = _mask_array(_crc32c_rows(header[:, :8])).astype("<u4").view(np.uint8).reshape(n, 4)

    out = slots.compact()
    record_end = np.cumsum(example_len + (_HEADER_BYTES + _FOOTER_BYTES))
    data_end = record_end - _FOOTER_BYTES
    data_start = data_end - example_len
    raw = out.tobytes()
    value = google_crc32c.value
    crcs = np.fromiter(
        (value(raw[a:b]) for a, b in zip(data_start.tolist(), data_end.tolist())), dtype=np.uint32, count=n
    )
    out[data_end[:, None] + np.arange(4)] = _mask_array(crcs).astype("<u4").view(np.uint8).reshape(n, 4)
    return out


_CHUNK_BYTES = 1 << 22  # records are encoded in chunks of about this many (estimated) slot bytes:
# ~18 MB of temporaries for a 4 MB block at dupe 1 instead of ~48 MB with 16 MB chunks, same speed


def iter_encoded_examples(features: Mapping[str, np.ndarray]) -> Iterator[np.ndarray]:
    """The bytes of :func:`encode_examples` as consecutive uint8 arrays, one per chunk of records
    (a writer passes them on as they are: no copy into one ``bytes``)."""
    n, checked = _check_features(features)
    # Bound the temporary slot matrix: a record takes at most ~10 bytes per int value.
    per_record = 64 + sum(len(k) + 40 + (4 if kind == "float" else 10) * a.shape[1] for k, kind, a in checked)
    step = max(1, _CHUNK_BYTES // per_record)
    for start in range(0, n, step):
        yield _encode_chunk([(k, kind, a[start : start + step]) for k, kind, a in checked], min(step, n - start))


def encode_examples(features: Mapping[str, np.ndarray]) -> bytes:
    """A TFRecord file with one ``tf.train.Example`` per row of the given 2-D arrays.

    Integer arrays become ``int64_list`` features and floating arrays ``float_list`` (float32)
    features, each row a fixed-length list; entries are written sorted by feature name. Negative
    integers are encoded as protobuf does (10-byte two's complement varints). Zero rows give
    ``b""``.
    """
    return b"".join(iter_encoded_examples(features))


def _check_limit(name: str, value) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)):
        raise ValueError(f"{name} must be an int, got {value!r}")
    return int(value)


def iter_encoded_tfrecord(batch: InstanceBatch, *, max_seq_length: int, max_predictions: int) -> Iterator[np.ndarray]:
    """The bytes of :func:`encode_tfrecord` as consecutive uint8 arrays (see
    :func:`iter_encoded_examples`)."""
    max_seq_length = _check_limit("max_seq_length", max_seq_length)
    max_predictions = _check_limit("max_predictions", max_predictions)
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    if max_predictions < 0:
        raise ValueError(f"max_predictions must be >= 0, got {max_predictions}")
    if len(batch) == 0:
        return iter(())
    return iter_encoded_examples(batch.padded(max_seq_length, max_predictions, compact=True))


def encode_tfrecord(batch: InstanceBatch, *, max_seq_length: int, max_predictions: int) -> bytes:
    """The complete bytes of a TFRecord file holding one BERT ``tf.train.Example`` per instance.

    Features (as in google-research/bert ``create_pretraining_data.py``): ``input_ids``,
    ``input_mask``, ``segment_ids`` (int64 x max_seq_length), ``masked_lm_positions``,
    ``masked_lm_ids`` (int64 x max_predictions), ``masked_lm_weights`` (float x max_predictions),
    ``next_sentence_labels`` (int64 x 1; zeros for a batch without NSP), zero-padded. Raises
    ``ValueError`` if an instance is longer than ``max_seq_length`` or has more than
    ``max_predictions`` masked positions.
    """
    return b"".join(iter_encoded_tfrecord(batch, max_seq_length=max_seq_length, max_predictions=max_predictions))


# --------------------------------------------------------------------------------------------
# TFRecord framing (reading)


def _read_up_to(f: BinaryIO, n: int) -> bytes:
    """Up to ``n`` bytes (fewer only at end of file), asking for at most 64 MiB at a time."""
    parts, got = [], 0
    while got < n:
        chunk = f.read(min(n - got, _READ_CHUNK))
        if not chunk:
            break
        parts.append(chunk)
        got += len(chunk)
    return parts[0] if len(parts) == 1 else b"".join(parts)


def _unpack_header(header: bytes, offset: int, verify_crc: bool) -> int:
    length, stored = struct.unpack("<QI", header)
    if verify_crc and masked_crc32c(header[:8]) != stored:
        raise ValueError(
            f"corrupt TFRecord at byte offset {offset}: length CRC mismatch "
            f"(stored 0x{stored:08x}, computed 0x{masked_crc32c(header[:8]):08x})"
        )
    return length


def _check_data(data: bytes, stored: int, offset: int) -> None:
    computed = masked_crc32c(data)
    if computed != stored:
        raise ValueError(
            f"corrupt TFRecord at byte offset {offset}: data CRC mismatch in the {len(data)}-byte record "
            f"whose data starts at byte offset {offset + _HEADER_BYTES} "
            f"(stored 0x{stored:08x}, computed 0x{computed:08x})"
        )


def _truncated(offset: int, what: str) -> ValueError:
    return ValueError(f"truncated TFRecord at byte offset {offset}: {what}")


def iter_tfrecord_records(f: BinaryIO, *, verify_crc: bool = True) -> Iterator[bytes]:
    """The data of every record of a TFRecord stream, in order.

    Raises ``ValueError`` naming the record's byte offset on a length or data CRC mismatch (when
    ``verify_crc``) or a truncated record.
    """
    offset = 0
    while True:
        header = _read_up_to(f, _HEADER_BYTES)
        if not header:
            return
        if len(header) < _HEADER_BYTES:
            raise _truncated(offset, f"{len(header)} of the {_HEADER_BYTES} header bytes present")
        length = _unpack_header(header, offset, verify_crc)
        data = _read_up_to(f, length)
        footer = _read_up_to(f, _FOOTER_BYTES) if len(data) == length else b""
        if len(footer) < _FOOTER_BYTES:
            raise _truncated(
                offset, f"record declares {length} data bytes + {_FOOTER_BYTES} CRC bytes, "
                f"{len(data) + len(footer)} present"
            )
        if verify_crc:
            _check_data(data, struct.unpack("<I", footer)[0], offset)
        yield data
        offset += _HEADER_BYTES + length + _FOOTER_BYTES


def _record_spans(buf: bytes, verify_crc: bool) -> tuple[list[int], list[int]]:
    """(data start, data end) of every record of a whole TFRecord file held in memory.

    Follows the lengths first (the only sequential part), then checks the length CRCs of all
    records at once and the data CRCs with one ``google_crc32c`` call per record. The first
    problem in file order is raised, as :func:`iter_tfrecord_records` would.
    """
    offsets: list[int] = []
    lengths: list[int] = []
    truncation = None
    complete = 0
    offset, size = 0, len(buf)
    unpack = struct.unpack_from
    while offset < size:
        if size - offset < _HEADER_BYTES:
            truncation = _truncated(offset, f"{size - offset} of the {_HEADER_BYTES} header bytes present")
            break
        length = unpack("<Q", buf, offset)[0]
        offsets.append(offset)
        lengths.append(length)
        end = offset + _HEADER_BYTES + length
        if end + _FOOTER_BYTES > size:
            truncation = _truncated(
                offset,
                f"record declares {length} data bytes + {_FOOTER_BYTES} CRC bytes, "
                f"{size - offset - _HEADER_BYTES} present",
            )
            break
        complete += 1
        offset = end + _FOOTER_BYTES
    starts = [o + _HEADER_BYTES for o in offsets[:complete]]
    ends = [s + n for s, n in zip(starts, lengths)]
    if verify_crc and offsets:
        arr = np.frombuffer(buf, np.uint8)
        headers = arr[np.array(offsets, np.int64)[:, None] + np.arange(_HEADER_BYTES)]
        stored = np.ascontiguousarray(headers[:, 8:]).view("<u4").ravel()
        bad = np.flatnonzero(_mask_array(_crc32c_rows(headers[:, :8])) != stored)
        first_bad_header = int(bad[0]) if bad.size else len(offsets)
        checked = min(first_bad_header, complete)
        value = google_crc32c.value
        crcs = np.fromiter(
            (value(buf[s:e]) for s, e in zip(starts[:checked], ends[:checked])), dtype=np.uint32, count=checked
        )
        stored = np.ascontiguousarray(arr[np.array(ends[:checked], np.int64)[:, None] + np.arange(4)]).view("<u4")
        bad = np.flatnonzero(_mask_array(crcs) != stored.ravel())
        if bad.size:
            i = int(bad[0])
            _check_data(buf[starts[i] : ends[i]], int(stored[i, 0]), offsets[i])
        if first_bad_header < len(offsets):
            _unpack_header(headers[first_bad_header].tobytes(), offsets[first_bad_header], True)
    if truncation is not None:
        raise truncation
    return starts, ends


# --------------------------------------------------------------------------------------------
# tf.train.Example decoding


def _varint(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    result = shift = 0
    while True:
        if pos >= end:
            raise ValueError("malformed tf.train.Example: truncated varint")
        b = buf[pos]
        pos += 1
        result |= (b & 0x7F) << shift
        if b < 0x80:
            return result & 0xFFFFFFFFFFFFFFFF, pos
        shift += 7
        if shift >= 70:
            raise ValueError("malformed tf.train.Example: varint longer than 10 bytes")


def _len_delimited(buf: bytes, pos: int, end: int) -> tuple[int, int]:
    n, pos = _varint(buf, pos, end)
    stop = pos + n
    if stop > end:
        raise ValueError("malformed tf.train.Example: length-delimited field runs past its message")
    return pos, stop


def _skip(buf: bytes, pos: int, end: int, tag: int) -> int:
    wire = tag & 7
    if tag >> 3 == 0:
        raise ValueError("malformed tf.train.Example: field number 0")
    if wire == _VARINT:
        return _varint(buf, pos, end)[1]
    if wire == _LEN:
        return _len_delimited(buf, pos, end)[1]
    if wire in (_I64, _I32):
        pos += 8 if wire == _I64 else 4
        if pos > end:
            raise ValueError("malformed tf.train.Example: truncated fixed-width field")
        return pos
    raise ValueError(f"malformed tf.train.Example: unsupported wire type {wire}")


# A walked feature: [kind or None, [(start, end), ...]] where each (start, end) is a run of bytes
# of ``buf`` holding, for int64, complete varints; for float, little-endian float32s; for bytes,
# one value.
_Walked = dict[str, list]


def _walk_list(buf: bytes, pos: int, end: int, kind: str, spans: list) -> None:
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        if tag >> 3 != 1:
            pos = _skip(buf, pos, end, tag)
            continue
        wire = tag & 7
        if wire == _LEN:
            start, pos = _len_delimited(buf, pos, end)
            if kind == "float" and (pos - start) % 4:
                raise ValueError("malformed tf.train.Example: packed float list not a multiple of 4 bytes")
            spans.append((start, pos))
        elif kind == "int64" and wire == _VARINT:
            start = pos
            pos = _varint(buf, pos, end)[1]
            spans.append((start, pos))
        elif kind == "float" and wire == _I32:
            if pos + 4 > end:
                raise ValueError("malformed tf.train.Example: truncated float")
            spans.append((pos, pos + 4))
            pos += 4
        else:
            raise ValueError(f"malformed tf.train.Example: wire type {wire} for the values of a {kind} list")


def _walk_feature(buf: bytes, pos: int, end: int, feature: list) -> None:
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        kind = _KIND_OF_TAG.get(tag)
        if kind is None:
            pos = _skip(buf, pos, end, tag)
            continue
        start, pos = _len_delimited(buf, pos, end)
        if feature[0] != kind:  # oneof: another kind replaces; the same kind merges
            feature[0], feature[1] = kind, []
        _walk_list(buf, start, pos, kind, feature[1])


def _walk_example(buf: bytes, pos: int, end: int) -> _Walked:
    features: _Walked = {}
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        if tag != _TAG_FIELD1_LEN:  # Example.features
            pos = _skip(buf, pos, end, tag)
            continue
        fstart, fend = _len_delimited(buf, pos, end)
        pos = fend
        while fstart < fend:
            tag, fstart = _varint(buf, fstart, fend)
            if tag != _TAG_FIELD1_LEN:  # Features.feature (map entry)
                fstart = _skip(buf, fstart, fend, tag)
                continue
            estart, eend = _len_delimited(buf, fstart, fend)
            fstart = eend
            key, feature = "", [None, []]
            while estart < eend:
                tag, estart = _varint(buf, estart, eend)
                if tag == _TAG_FIELD1_LEN:
                    kstart, estart = _len_delimited(buf, estart, eend)
                    try:
                        key = buf[kstart:estart].decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise ValueError(f"malformed tf.train.Example: feature name is not UTF-8 ({exc})") from None
                elif tag == _TAG_FIELD2_LEN:
                    vstart, estart = _len_delimited(buf, estart, eend)
                    _walk_feature(buf, vstart, estart, feature)
                else:
                    estart = _skip(buf, estart, eend, tag)
            features[key] = feature  # map semantics: the last entry for a key wins
    return features


def _decode_varints_with_ends(b: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Decode a run of complete varints (uint8 array): (int64 values, index of each last byte).

    One round per 7-bit group (usually 2 or 3), each over all values at once: group ``i`` of a
    value is the byte ``i`` after its start, present when the value is longer than ``i``.
    """
    if b.size == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    term = b < 0x80
    if not term[-1]:
        raise ValueError("malformed tf.train.Example: packed int64 list ends inside a varint")
    ends = np.flatnonzero(term)
    if ends.size == b.size:  # all one-byte values
        return b.astype(np.int64), ends
    starts = np.empty_like(ends)
    starts[0] = 0
    starts[1:] = ends[:-1] + 1
    sizes = ends - starts + 1
    widest = int(sizes.max())
    if widest > 10:
        raise ValueError("malformed tf.train.Example: varint longer than 10 bytes")
    acc = np.uint32 if widest <= 4 else np.uint64  # 4 groups = 28 bits
    values = (b[starts] & np.uint8(0x7F)).astype(acc)
    for i in range(1, widest):
        group = b[np.minimum(starts + i, ends)] & np.uint8(0x7F)
        group[sizes <= i] = 0
        values |= group.astype(acc) << acc(7 * i)
    return (values.astype(np.int64) if acc is np.uint32 else values.view(np.int64)), ends


def _decode_varints(b: np.ndarray) -> np.ndarray:
    """Decode a run of complete varints (uint8 array) to int64, vectorised."""
    return _decode_varints_with_ends(b)[0]


def _decode_one(buf: bytes, kind: str | None, spans: list):
    if kind is None:
        return []
    if kind == "bytes":
        return [buf[s:e] for s, e in spans]
    data = b"".join(buf[s:e] for s, e in spans)
    if kind == "float":
        return np.frombuffer(data, "<f4").astype(np.float32)
    return _decode_varints(np.frombuffer(data, np.uint8))


def parse_example(record: bytes) -> dict[str, np.ndarray | list[bytes]]:
    """Decode one serialized ``tf.train.Example``: feature name -> values.

    ``int64_list`` -> int64 array, ``float_list`` -> float32 array (packed or not), ``bytes_list``
    -> list of bytes, a ``Feature`` with no list set -> ``[]``. Unknown fields are skipped.
    Raises ``ValueError`` on malformed input.
    """
    record = bytes(record)
    walked = _walk_example(record, 0, len(record))
    return {key: _decode_one(record, kind, spans) for key, (kind, spans) in walked.items()}


# --------------------------------------------------------------------------------------------
# Whole files


def _stack(buf: bytes, name: str, kind: str | None, rec: np.ndarray, spans: np.ndarray, n: int) -> np.ndarray:
    """Values of feature ``name`` of all ``n`` records as a 2-D array (one row per record)."""
    if kind == "bytes":
        rows: list[list[bytes]] = [[] for _ in range(n)]
        for r, (s, e) in zip(rec.tolist(), spans.tolist()):
            rows[r].append(buf[s:e])
        counts = np.array([len(r) for r in rows])
    else:
        lengths = spans[:, 1] - spans[:, 0]
        data = np.frombuffer(buf, np.uint8)[ranges_to_indices(spans[:, 0], lengths)]
        if kind == "float":
            values = data.view("<f4").astype(np.float32)
            per_span = lengths // 4
        else:
            values, value_ends = _decode_varints_with_ends(data)
            bounds = lengths_to_offsets(lengths)
            if lengths.size and not np.all(data[bounds[1:][lengths > 0] - 1] < 0x80):
                raise ValueError(f"malformed tf.train.Example: feature {name!r} has a value cut inside a varint")
            ends_before = np.searchsorted(value_ends, bounds)  # values ending before each span bound
            per_span = ends_before[1:] - ends_before[:-1]
        counts = np.bincount(rec, weights=per_span, minlength=n).astype(np.int64)
    if n and counts.min() != counts.max():
        raise ValueError(
            f"feature {name!r} has between {counts.min()} and {counts.max()} values per record; "
            "only fixed-length features can be stacked"
        )
    width = int(counts[0]) if n else 0
    if kind == "bytes":
        stacked = np.empty((n, width), dtype=object)
        for i, row in enumerate(rows):
            stacked[i, :] = row
        return stacked
    return values.reshape(n, width)


class _Cursor:
    """One read position per record, advanced through all records in lockstep."""

    def __init__(self, arr: np.ndarray, pos: np.ndarray):
        self.arr, self.pos, self.last = arr, pos, arr.size - 1

    def expect(self, data: bytes) -> bool:
        """Whether every record holds ``data`` here; moves past it."""
        got = self.arr[np.minimum(self.pos[:, None] + np.arange(len(data)), self.last)]
        self.pos = self.pos + len(data)
        return bool((got == np.frombuffer(data, np.uint8)).all())

    def length(self) -> np.ndarray | None:
        """A varint length prefix in every record (None if malformed or impossible); moves past it."""
        value = np.zeros(self.pos.size, np.uint64)
        size = np.zeros(self.pos.size, np.int64)
        done = np.zeros(self.pos.size, bool)
        for j in range(10):
            b = self.arr[np.minimum(self.pos + j, self.last)]
            active = ~done
            value |= np.where(active, (b & np.uint8(0x7F)).astype(np.uint64) << np.uint64(7 * j), np.uint64(0))
            size += active
            done |= b < 0x80
            if done.all():
                break
        else:
            return None
        if int(value.max()) > self.arr.size:
            return None
        self.pos = self.pos + size
        return value.astype(np.int64)


def _lockstep_spans(buf: bytes, starts: list[int], ends: list[int], first: _Walked) -> dict[str, np.ndarray] | None:
    """The value bytes (start, end) of every feature of every record, found for all records at once.

    Applies when every record has exactly the entry sequence of record 0 (``first``), each with
    one packed int64 or float list and nothing else: the layout :func:`encode_examples` writes
    (and protobuf's deterministic serialization). Every tag and key is compared and every nested
    length must close exactly where its message ends, so a record that passes is parsed exactly;
    ``None`` if any record differs in any way (the caller then walks records one by one).
    """
    end = np.asarray(ends, np.int64)
    cur = _Cursor(np.frombuffer(buf, np.uint8), np.asarray(starts, np.int64))
    if not cur.expect(bytes([_TAG_FIELD1_LEN])):
        return None
    size = cur.length()
    if size is None or not np.array_equal(cur.pos + size, end):
        return None
    spans = {}
    for key, (kind, _) in first.items():
        if kind not in ("int64", "float") or not cur.expect(bytes([_TAG_FIELD1_LEN])):
            return None
        size = cur.length()
        if size is None:
            return None
        entry_end = cur.pos + size
        key_bytes = key.encode("utf-8")
        key_part = bytes([_TAG_FIELD1_LEN]) + _varint_bytes(len(key_bytes)) + key_bytes + bytes([_TAG_FIELD2_LEN])
        if not cur.expect(key_part):
            return None
        size = cur.length()
        if size is None or not np.array_equal(cur.pos + size, entry_end) or not cur.expect(bytes([_LIST_TAG[kind]])):
            return None
        size = cur.length()
        if size is None or not np.array_equal(cur.pos + size, entry_end):
            return None
        if not size.any():  # empty list in every record
            spans[key] = np.stack([entry_end, entry_end], axis=1)
            continue
        if not size.all() or not cur.expect(bytes([_TAG_FIELD1_LEN])):
            return None
        size = cur.length()
        if size is None or not np.array_equal(cur.pos + size, entry_end) or (kind == "float" and (size % 4).any()):
            return None
        spans[key] = np.stack([cur.pos, entry_end], axis=1)
        cur.pos = entry_end
    if not np.array_equal(cur.pos, end):
        return None
    return spans


def _features_from_buffer(buf: bytes, starts: list[int], ends: list[int]) -> dict[str, np.ndarray]:
    n = len(starts)
    if n == 0:
        return {}
    first = _walk_example(buf, starts[0], ends[0])
    spans = _lockstep_spans(buf, starts, ends, first)
    if spans is not None:
        records = np.arange(n)
        return {key: _stack(buf, key, first[key][0], records, spans[key], n) for key in sorted(spans)}
    per_key: dict[str, tuple[str | None, list[int], list[tuple[int, int]]]] = {}
    present: dict[str, int] = {}
    for r, (start, end) in enumerate(zip(starts, ends)):
        for key, (kind, spans) in _walk_example(buf, start, end).items():
            entry = per_key.get(key)
            if entry is None:
                if r:
                    raise ValueError(f"feature {key!r} is missing from record 0")
                entry = per_key[key] = (kind, [], [])
            elif entry[0] != kind:
                raise ValueError(f"feature {key!r} is a {entry[0]} list in record 0 but a {kind} list in record {r}")
            entry[1].extend([r] * len(spans))
            entry[2].extend(spans)
            present[key] = present.get(key, 0) + 1
    for key, count in present.items():
        if count != n:
            raise ValueError(f"feature {key!r} is present in {count} of {n} records")
    out = {}
    for key in sorted(per_key):
        kind, rec, spans = per_key[key]
        span_array = np.array(spans, dtype=np.int64).reshape(-1, 2)
        out[key] = _stack(buf, key, kind, np.array(rec, dtype=np.int64), span_array, n)
    return out


def _read_all(source: Source) -> bytes:
    if isinstance(source, (str, os.PathLike)):
        from mlm_pipeline.fs import open_url

        with open_url(os.fspath(source), "rb") as f:
            return f.read()
    return source.read()


def read_tfrecord_features(source: Source, *, verify_crc: bool = True) -> dict[str, np.ndarray]:
    """Every feature of a TFRecord file of ``tf.train.Example`` records, stacked: name -> 2-D array.

    ``source`` is a local path, an fsspec URL (``s3://...``, ``gs://...``, ``memory://...``) or a
    binary file object. int64 features give int64 arrays, float features float32 arrays, bytes
    features object arrays; row ``i`` is record ``i``. Every record must hold every feature with
    the same number of values (as BERT's padded features do); otherwise ``ValueError``. A file
    without records gives ``{}``.
    """
    buf = _read_all(source)
    starts, ends = _record_spans(buf, verify_crc)
    return _features_from_buffer(buf, starts, ends)


def read_tfrecord(source: Source, *, verify_crc: bool = True) -> InstanceBatch:
    """A TFRecord file of BERT pretraining examples back as an :class:`InstanceBatch`.

    The inverse of :func:`encode_tfrecord` (a batch without NSP labels comes back with labels 0,
    as the file stores them). ``source`` as for :func:`read_tfrecord_features`.
    """
    features = read_tfrecord_features(source, verify_crc=verify_crc)
    if not features:
        return InstanceBatch.empty()
    missing = [name for name in BERT_FEATURES if name not in features]
    if missing:
        raise ValueError(f"not a BERT pretraining TFRecord: missing features {', '.join(missing)}")
    return InstanceBatch.from_padded(features)
