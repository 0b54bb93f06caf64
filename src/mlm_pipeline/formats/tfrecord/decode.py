"""TFRecord bytes back to features and instances, without TensorFlow.

:func:`parse_example` decodes one ``tf.train.Example`` generically (int64/float lists packed or
not, bytes lists, unknown fields skipped). :func:`decode_examples` stacks many records held in one
buffer into padded 2-D arrays, and :func:`decode_records` does it for a list of record payloads
(what the loader reads); :func:`read_tfrecord_features` / :func:`read_tfrecord` do it for a whole
file, framing checked (:mod:`.wire`). For records in our layout, the value bytes of every feature
are located for all records in lockstep (every tag, key and nested length checked); any other
layout is walked record by record. Either way the values of a feature are then decoded for all
records at once. Malformed input raises ``ValueError`` saying what is wrong.
"""

from __future__ import annotations

import os
from collections.abc import Sequence
from typing import BinaryIO, Union

import numpy as np

from mlm_pipeline.formats.tfrecord.encode import RAGGED_FEATURES, Ragged
from mlm_pipeline.formats.tfrecord.wire import (
    BERT_FEATURES,
    SEQUENCE_FEATURES,
    I32,
    I64,
    KIND_OF_TAG,
    LEN,
    LIST_TAG,
    TAG_FIELD1_LEN,
    TAG_FIELD2_LEN,
    VARINT,
    entry_key,
    record_spans,
)
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, ranges_to_indices

__all__ = [
    "decode_examples",
    "decode_records",
    "features_to_batch",
    "parse_example",
    "read_tfrecord",
    "read_tfrecord_features",
]

Source = Union[str, os.PathLike, BinaryIO]


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
    if wire == VARINT:
        return _varint(buf, pos, end)[1]
    if wire == LEN:
        return _len_delimited(buf, pos, end)[1]
    if wire in (I64, I32):
        pos += 8 if wire == I64 else 4
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
        if wire == LEN:
            start, pos = _len_delimited(buf, pos, end)
            if kind == "float" and (pos - start) % 4:
                raise ValueError("malformed tf.train.Example: packed float list not a multiple of 4 bytes")
            spans.append((start, pos))
        elif kind == "int64" and wire == VARINT:
            start = pos
            pos = _varint(buf, pos, end)[1]
            spans.append((start, pos))
        elif kind == "float" and wire == I32:
            if pos + 4 > end:
                raise ValueError("malformed tf.train.Example: truncated float")
            spans.append((pos, pos + 4))
            pos += 4
        else:
            raise ValueError(f"malformed tf.train.Example: wire type {wire} for the values of a {kind} list")


def _walk_feature(buf: bytes, pos: int, end: int, feature: list) -> None:
    while pos < end:
        tag, pos = _varint(buf, pos, end)
        kind = KIND_OF_TAG.get(tag)
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
        if tag != TAG_FIELD1_LEN:  # Example.features
            pos = _skip(buf, pos, end, tag)
            continue
        fstart, fend = _len_delimited(buf, pos, end)
        pos = fend
        while fstart < fend:
            tag, fstart = _varint(buf, fstart, fend)
            if tag != TAG_FIELD1_LEN:  # Features.feature (map entry)
                fstart = _skip(buf, fstart, fend, tag)
                continue
            estart, eend = _len_delimited(buf, fstart, fend)
            fstart = eend
            key, feature = "", [None, []]
            while estart < eend:
                tag, estart = _varint(buf, estart, eend)
                if tag == TAG_FIELD1_LEN:
                    kstart, estart = _len_delimited(buf, estart, eend)
                    try:
                        key = buf[kstart:estart].decode("utf-8")
                    except UnicodeDecodeError as exc:
                        raise ValueError(f"malformed tf.train.Example: feature name is not UTF-8 ({exc})") from None
                elif tag == TAG_FIELD2_LEN:
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
    if name in RAGGED_FEATURES and kind == "int64":  # rows of their own lengths (packed's document starts)
        return Ragged(values, lengths_to_offsets(counts))
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
    if not cur.expect(bytes([TAG_FIELD1_LEN])):
        return None
    size = cur.length()
    if size is None or not np.array_equal(cur.pos + size, end):
        return None
    spans = {}
    for key, (kind, _) in first.items():
        if kind not in ("int64", "float") or not cur.expect(bytes([TAG_FIELD1_LEN])):
            return None
        size = cur.length()
        if size is None:
            return None
        entry_end = cur.pos + size
        if not cur.expect(entry_key(key)):
            return None
        size = cur.length()
        if size is None or not np.array_equal(cur.pos + size, entry_end) or not cur.expect(bytes([LIST_TAG[kind]])):
            return None
        size = cur.length()
        if size is None or not np.array_equal(cur.pos + size, entry_end):
            return None
        if not size.any():  # empty list in every record
            spans[key] = np.stack([entry_end, entry_end], axis=1)
            continue
        if not size.all() or not cur.expect(bytes([TAG_FIELD1_LEN])):
            return None
        size = cur.length()
        if size is None or not np.array_equal(cur.pos + size, entry_end) or (kind == "float" and (size % 4).any()):
            return None
        spans[key] = np.stack([cur.pos, entry_end], axis=1)
        cur.pos = entry_end
    if not np.array_equal(cur.pos, end):
        return None
    return spans


def decode_examples(buf: bytes, starts: Sequence[int], ends: Sequence[int]) -> dict[str, np.ndarray]:
    """The ``tf.train.Example`` records ``buf[starts[i]:ends[i]]``, stacked: name -> 2-D array.

    Row ``i`` is record ``i``; int64 features give int64 arrays, float features float32 arrays,
    bytes features object arrays. Every record must hold every feature with the same number of
    values (as BERT's padded features do), except those of ``RAGGED_FEATURES`` (``packed``'s
    ``document_starts``), which come back as :class:`~.encode.Ragged` rows; otherwise
    ``ValueError``. No records give ``{}``.
    """
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


def decode_records(records: Sequence[bytes]) -> dict[str, np.ndarray]:
    """:func:`decode_examples` of record payloads (as :func:`.wire.iter_tfrecord_records` yields them)."""
    lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
    ends = np.cumsum(lengths)
    return decode_examples(b"".join(records), (ends - lengths).tolist(), ends.tolist())


def features_to_batch(features: dict[str, np.ndarray]) -> InstanceBatch:
    """Stacked BERT features (:func:`decode_examples`) as an :class:`InstanceBatch`, padding removed.

    ELECTRA's three features alone give a batch without masked positions or NSP labels.

    ``ValueError`` if a BERT feature is missing; no features (no records) give an empty batch.
    """
    if not features:
        return InstanceBatch.empty()
    features = dict(features)
    language = features.pop("language", None)  # (runs with languages: a bytes_list of one code)
    documents = features.pop("document_starts", None)
    if set(features) != set(SEQUENCE_FEATURES):  # ELECTRA's examples: no masks, no NSP labels
        missing = [name for name in BERT_FEATURES if name not in features]
        if missing:
            raise ValueError(f"not a BERT pretraining TFRecord: missing features {', '.join(missing)}")
    batch = InstanceBatch.from_padded(features)
    if documents is not None:
        batch.document_starts = documents.values.astype(np.int32)
        batch.document_offsets = documents.offsets.astype(np.int64)
    if language is not None:
        batch.languages = np.array([bytes(v).decode() for v in np.asarray(language).reshape(-1)], dtype=str)
    return batch


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
    starts, ends = record_spans(buf, verify_crc=verify_crc)
    return decode_examples(buf, starts, ends)


def read_tfrecord(source: Source, *, verify_crc: bool = True) -> InstanceBatch:
    """A TFRecord file of BERT pretraining examples back as an :class:`InstanceBatch`.

    The inverse of :func:`.encode.encode_tfrecord` (a batch without NSP labels comes back with labels 0,
    as the file stores them). ``source`` as for :func:`read_tfrecord_features`.
    """
    return features_to_batch(read_tfrecord_features(source, verify_crc=verify_crc))

