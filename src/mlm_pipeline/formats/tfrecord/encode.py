"""BERT instances to TFRecord bytes: ``tf.train.Example`` records encoded for all records at once.

:func:`encode_tfrecord` turns an :class:`InstanceBatch` into the bytes of a TFRecord file with one
``tf.train.Example`` per instance and exactly the features of google-research/bert
``create_pretraining_data.py`` (read by ``run_pretraining.py``); :func:`encode_examples` does the
same for any 2-D integer/float arrays. Nothing loops per value or per token. Every record is the
same sequence of pieces: field tags and key strings (constant), varint length prefixes and packed
varint values (whose sizes vary per record), raw float bytes and the framing. Each piece gets a
fixed-width slot (as wide as its longest encoding) in a (records x width) byte matrix, filled
column-wise for all records at once, varints one 7-bit group per round (usually 2 or 3 rounds);
slot bytes past a varint's actual size are masked out, and compacting the matrix by the mask
yields the records back to back. The framing (length headers, CRCs) comes from :mod:`.wire`.

Map entries are written sorted by key, all values as packed repeated fields, an empty value list
omitted: protobuf's deterministic serialization, so the bytes depend only on the values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping

import numpy as np

from mlm_pipeline.formats.tfrecord.wire import (
    FOOTER_BYTES,
    HEADER_BYTES,
    LIST_TAG,
    SEQUENCE_FEATURES,
    TAG_FIELD1_LEN,
    entry_key,
    fill_data_crcs,
    frame_headers,
    varint_bytes,
)
from mlm_pipeline.instances.batch import InstanceBatch

__all__ = ["encode_examples", "encode_tfrecord", "iter_encoded_examples", "iter_encoded_sequences",
           "iter_encoded_tfrecord"]


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

    def varint(self, values: np.ndarray | int) -> None:
        """One varint per record (a length prefix), or, given an int (the same length in every
        record), constant bytes that merge with the constant pieces around them."""
        if isinstance(values, int):
            self.const(varint_bytes(values))
            return
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


def _size_of(length):
    """Varint size of a length: one per record (an array) or the same for all (an int)."""
    if isinstance(length, int):
        return len(varint_bytes(length))
    return _varint_sizes(length.view(np.uint64))


def _encode_chunk(checked: list[tuple[str, str, np.ndarray]], n: int) -> np.ndarray:
    # Lengths are Python ints while they are the same in every record (a fixed-width feature's
    # whole entry), arrays once they vary: the nested length prefixes of most features then cost
    # no array work and become constant bytes.
    blocks = []
    features_len = 0
    for key, kind, a in checked:
        width = a.shape[1]
        if kind == "float":
            values = np.ascontiguousarray(a, dtype="<f4").view(np.uint8).reshape(n, 4 * width)
            sizes, payload = None, 4 * width
        else:
            values = _as_varint_values(a, key)
            if values.dtype == np.uint8 and (not width or int(values.max()) < 0x80):
                sizes, payload = None, width  # one byte each: raw
            else:
                sizes = _varint_sizes(values)
                payload = sizes.sum(axis=1, dtype=np.int64)
        list_len = (1 + _size_of(payload) + payload) if width else 0
        feature_len = 1 + _size_of(list_len) + list_len
        key_part = entry_key(key)
        entry_len = feature_len + _size_of(feature_len) + len(key_part)
        features_len = features_len + 1 + _size_of(entry_len) + entry_len
        blocks.append((kind, width, values, sizes, payload, list_len, feature_len, key_part, entry_len))
    example_len = np.broadcast_to(1 + _size_of(features_len) + features_len, (n,)).astype(np.int64)

    slots = _Slots(n)
    slots.raw(frame_headers(example_len))  # the length and its CRC
    slots.const(bytes([TAG_FIELD1_LEN]))  # Example.features
    slots.varint(features_len)
    for kind, width, values, sizes, payload, list_len, feature_len, key_part, entry_len in blocks:
        slots.const(bytes([TAG_FIELD1_LEN]))  # Features.feature: a map entry
        slots.varint(entry_len)
        slots.const(key_part)  # the entry key, then the tag of the entry value
        slots.varint(feature_len)
        slots.const(bytes([LIST_TAG[kind]]))
        slots.varint(list_len)
        if width:
            slots.const(bytes([TAG_FIELD1_LEN]))  # the packed values
            slots.varint(payload)
            if sizes is None:
                slots.raw(values)
            else:
                slots.varints(values, sizes)
    slots.raw(np.zeros((n, 4), np.uint8))  # data CRC, filled after compaction

    out = slots.compact()
    record_end = np.cumsum(example_len + (HEADER_BYTES + FOOTER_BYTES))
    data_end = record_end - FOOTER_BYTES
    fill_data_crcs(out, data_end - example_len, data_end)
    return out


_CHUNK_BYTES = 1 << 23  # records are encoded in chunks of about this many (estimated) slot bytes:
# the estimate is ~5x the real slot width for BERT records, so a chunk is ~1,700 records (~1.7 MB
# of slots); smaller chunks cost 5% more in per-chunk numpy calls, larger ones gain nothing


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


def iter_encoded_sequences(batch: InstanceBatch, *, max_seq_length: int) -> Iterator[np.ndarray]:
    """ELECTRA's records (google-research/electra ``build_pretraining_dataset.py``): only
    ``input_ids``, ``input_mask`` and ``segment_ids``, int64 padded to ``max_seq_length``.
    ``ValueError`` for a batch with masked positions or next-sentence labels (they have no
    feature here)."""
    max_seq_length = _check_limit("max_seq_length", max_seq_length)
    if max_seq_length < 1:
        raise ValueError(f"max_seq_length must be >= 1, got {max_seq_length}")
    if batch.next_sentence_labels is not None or len(batch.masked_lm_ids):
        raise ValueError("ELECTRA's records hold no masked positions and no next-sentence labels")
    if len(batch) == 0:
        return iter(())
    padded = batch.padded(max_seq_length, 0, compact=True)
    return iter_encoded_examples({name: padded[name] for name in SEQUENCE_FEATURES})


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

