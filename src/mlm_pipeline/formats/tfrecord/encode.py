"""BERT instances to TFRecord bytes: ``tf.train.Example`` records encoded for all records at once.

:func:`encode_tfrecord` turns an :class:`InstanceBatch` into the bytes of a TFRecord file with one
``tf.train.Example`` per instance and exactly the features of google-research/bert
``create_pretraining_data.py`` (read by ``run_pretraining.py``); :func:`encode_examples` does the
same for any 2-D integer/float arrays. Nothing loops per value or per token. Every record is the
same sequence of pieces: field tags and key strings (constant), varint length prefixes and packed
varint values, raw float bytes and the framing. A piece whose width is the same in every record
is a column block of one (records x width) byte matrix, filled column-wise for all records at
once. A packed block of varints whose sizes vary (token ids) becomes one byte stream for all
records: each value's varint is computed in a 4- or 8-byte word, and one ``np.compress`` keeps its
bytes; token ids come unpadded (:class:`ZeroPadded`), their padding a run of zero bytes. Arrow's
element-wise binary join (``binary_join_element_wise``, a C++ kernel) then lays the pieces out
record after record, which is a copy at memory speed. Compacting a byte-validity
mask over every slot of every record took most of the encoding time before. The framing (length
headers, CRCs) comes from :mod:`.wire`.

Map entries are written sorted by key, all values as packed repeated fields, an empty value list
omitted: protobuf's deterministic serialization, so the bytes depend only on the values.
"""

from __future__ import annotations

from collections.abc import Iterator, Mapping
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow._compute as arrow_compute  # the kernels alone: ``pyarrow.compute`` adds ~30 ms of Python wrappers

from mlm_pipeline.formats.tfrecord.wire import (
    HEADER_BYTES,
    LIST_TAG,
    SEQUENCE_FEATURES,
    TAG_FIELD1_LEN,
    data_crcs,
    entry_key,
    frame_headers,
    varint_bytes,
)
from mlm_pipeline.instances.batch import InstanceBatch

__all__ = ["RAGGED_FEATURES", "Ragged", "ZeroPadded", "encode_examples", "encode_tfrecord", "iter_encoded_examples",
           "iter_encoded_sequences", "iter_encoded_tfrecord"]

# The separator of the binary join, an empty binary scalar. Taken from an array built over buffers:
# ``pa.scalar`` (like ``pa.array``) first probes for pandas, which imports pandas when it is
# installed, ~0.3 s of every run's start-up.
_NOTHING = pa.Array.from_buffers(pa.binary(), 1, [None, pa.py_buffer(bytes(8)), pa.py_buffer(b"")])[0]


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


def _varint_planes(values: np.ndarray, width: int) -> np.ndarray:
    """Every value's varint in ``width`` bytes: shape ``values.shape + (width,)``, uint8.

    Group ``j`` of a value is byte ``j``, with the continuation bit while the value has more
    groups; a value shorter than ``width`` is followed by zero bytes (what a compaction drops).
    """
    out = np.empty(values.shape + (width,), np.uint8)
    for j in range(width):
        group = values >> values.dtype.type(7 * j) if j else values
        byte = (group & values.dtype.type(0x7F)).astype(np.uint8)
        if j + 1 < width:
            byte |= (group > values.dtype.type(0x7F)).view(np.uint8) << np.uint8(7)
        out[..., j] = byte
    return out


def _varint_words(values: np.ndarray, widest: int) -> tuple[np.ndarray, np.ndarray]:
    """Each value's varint in a little-endian word (4 bytes up to 4-byte varints, else 8), and a
    word whose byte ``j`` is 1 where the varint has a byte ``j``."""
    word = np.dtype("<u4") if widest <= 4 else np.dtype("<u8")
    one = word.type(1)
    v = values.astype(word, copy=False)
    valid = np.ones(v.shape, word)
    groups = v & word.type(0x7F)  # group j of the value in byte j
    for j in range(1, widest):
        valid |= (v >= (one << word.type(7 * j))).astype(word) << word.type(8 * j)
        groups |= (v << word.type(j)) & word.type(0x7F << (8 * j))
    groups |= (valid >> word.type(8)) << word.type(7)  # continuation bits: where a next byte is valid
    return groups, valid


def _varint_stream(values: np.ndarray, widest: int) -> np.ndarray:
    """The varints of ``values`` (unsigned, any shape), back to back in C order (1-D uint8).

    Up to 8 bytes (values below 2**56) each value's varint is built in a word (:func:`_varint_words`)
    and one ``np.compress`` keeps the valid bytes: a few whole-array operations on words instead
    of one strided pass per byte of the varint.
    """
    if widest > 8:  # 9- and 10-byte varints (negative int64): byte planes
        sizes = _varint_sizes(values)
        valid = np.arange(widest, dtype=np.uint8) < sizes[..., None]
        return np.compress(valid.ravel(), _varint_planes(values, widest).ravel())
    groups, valid = _varint_words(values, widest)
    return np.compress(valid.view(bool).ravel(), groups.view(np.uint8).ravel())


def _as_varint_values(a: np.ndarray, key: str) -> np.ndarray:
    """Values as the narrowest unsigned dtype holding their protobuf ``int64`` bit pattern.

    Negatives become their uint64 two's complement (10-byte varints, as protobuf writes them).
    """
    if a.dtype == np.uint64 and a.size and int(a.max()) > np.iinfo(np.int64).max:
        raise ValueError(f"feature {key!r}: value {int(a.max())} does not fit int64")
    if a.size and a.dtype.kind == "i" and a.dtype.itemsize <= 4 and int(a.min()) >= 0:
        a = a.view(a.dtype.str.replace("i", "u"))  # the same bits, unsigned: no int64 round trip
    if a.size and a.dtype.kind in "ub" and a.dtype.itemsize <= 4:
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


@dataclass(frozen=True)
class ZeroPadded:
    """Integer rows of different lengths zero-padded to ``width``, the padding not materialised:
    row ``i`` is ``values[offsets[i]:offsets[i + 1]]``. A 2-D integer feature for
    :func:`encode_examples` (token ids): each padding zero is one zero byte in the record, written
    as such, where a padded array's zeros went through the varint work like any value."""

    values: np.ndarray  # 1-D integers
    offsets: np.ndarray  # int64 [rows + 1]
    width: int

    @property
    def shape(self) -> tuple[int, int]:
        return len(self.offsets) - 1, self.width

    @property
    def ndim(self) -> int:
        return 2

    @property
    def dtype(self) -> np.dtype:
        return self.values.dtype

    def __getitem__(self, rows: slice) -> "ZeroPadded":
        start, stop, _ = rows.indices(self.shape[0])
        first = int(self.offsets[start])
        return ZeroPadded(self.values[first : int(self.offsets[stop])], self.offsets[start : stop + 1] - first,
                          self.width)

    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)


class Ragged(ZeroPadded):
    """Integer rows of different lengths written as they are, no padding: a variable-length
    ``int64_list`` feature (TensorFlow reads it with ``tf.io.VarLenFeature``). ``width`` is the
    longest row (what the chunk size is estimated from)."""

    def __init__(self, values: np.ndarray, offsets: np.ndarray):
        lengths = np.diff(offsets)
        super().__init__(values, offsets, int(lengths.max()) if lengths.size else 0)

    def __getitem__(self, rows: slice) -> "Ragged":
        part = super().__getitem__(rows)
        return Ragged(part.values, part.offsets)


RAGGED_FEATURES = ("document_starts",)
"""Features whose rows have different lengths (``packed``'s document starts): written and read
back as :class:`Ragged` rows."""
@dataclass(frozen=True)
class SameBytes:
    """One ``bytes`` value, the same in every one of ``rows`` records: a ``bytes_list`` feature of
    one value for :func:`encode_examples` (an instance's language; a batch of several languages is
    encoded in runs of one)."""

    value: bytes
    rows: int

    @property
    def shape(self) -> tuple[int, int]:
        return self.rows, 1

    @property
    def ndim(self) -> int:
        return 2

    def __getitem__(self, rows: slice) -> "SameBytes":
        start, stop, _ = rows.indices(self.rows)
        return SameBytes(self.value, max(0, stop - start))


# --------------------------------------------------------------------------------------------
# Encoding


def _binary_array(data: np.ndarray, offsets: np.ndarray) -> pa.Array:
    """An Arrow binary array over numpy memory (no copy): element ``i`` is ``data[offsets[i]:offsets[i + 1]]``."""
    return pa.Array.from_buffers(pa.binary(), len(offsets) - 1, [None, pa.py_buffer(offsets), pa.py_buffer(data)])


def _offsets(lengths: np.ndarray) -> np.ndarray:
    """Arrow's int32 offsets of elements of these lengths."""
    offsets = np.zeros(len(lengths) + 1, np.int32)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _rows_array(rows: np.ndarray) -> pa.Array:
    """Each row of a C-contiguous (n, w) uint8 matrix as one element of an Arrow binary array."""
    n, width = rows.shape
    return _binary_array(rows, np.arange(0, (n + 1) * width, width, dtype=np.int32))


def join_rows(arrays: list[pa.Array]) -> pa.Array:
    """Element-wise concatenation of binary arrays of equal length (Arrow's C++ kernel)."""
    if len(arrays) == 1:
        return arrays[0]
    return arrow_compute.call_function("binary_join_element_wise", [*arrays, _NOTHING])


def _flat_bytes(array: pa.Array) -> np.ndarray:
    """The bytes of all elements of a binary array, back to back (a read-only view, no copy)."""
    offsets = np.frombuffer(array.buffers()[1], np.int32, count=len(array) + 1, offset=4 * array.offset)
    return np.frombuffer(array.buffers()[2], np.uint8, count=int(offsets[-1]))[int(offsets[0]) :]


class _Pieces:
    """The pieces of one record, in order, for all records of a chunk at once.

    A piece is constant bytes (tags, key strings), raw per-record bytes of a fixed width (floats,
    one-byte values, the framing), or varints (a per-record length prefix, or a packed block of
    values). Consecutive pieces of the same width in every record (varints included, where every
    value has the same size) fill the column blocks of one byte matrix; a block of varints whose
    sizes vary is a byte stream of its own with each record's length. :meth:`join` lays out each
    record's pieces back to back.
    """

    def __init__(self, n: int):
        self.n = n
        self._columns: list[tuple[bytes | np.ndarray, int]] = []  # fixed-width pieces not yet in a matrix
        self._arrays: list[pa.Array] = []

    def const(self, data: bytes) -> None:
        self._columns.append((data, len(data)))

    def raw(self, rows: np.ndarray) -> None:
        """Fixed-width bytes (n, k)."""
        self._columns.append((rows, rows.shape[1]))

    def varints(self, values: np.ndarray, sizes: np.ndarray, lengths: np.ndarray,
                padding: np.ndarray | None = None) -> None:
        """Values (unsigned) with their varint sizes and each record's bytes of them: an (n, L)
        block, or with ``padding`` (each record's number of padding zeros, one zero byte each)
        the rows of a :class:`ZeroPadded` feature back to back."""
        widest = int(sizes.max()) if sizes.size else 1
        if padding is None and (not sizes.size or int(sizes.min()) == widest):  # one width in every record
            self.raw(_varint_planes(values, widest).reshape(self.n, -1))
            return
        self._flush()
        self._arrays.append(_binary_array(_varint_stream(values, widest), _offsets(lengths)))
        if padding is not None and padding.any():
            zeros = _offsets(padding)  # (Arrow arrays keep their buffers: one offsets array each)
            self._arrays.append(_binary_array(np.zeros(int(zeros[-1]), np.uint8), zeros))

    def varint(self, values: np.ndarray | int) -> None:
        """One varint per record (a length prefix), or, given an int (the same length in every
        record), constant bytes."""
        if isinstance(values, int):
            self.const(varint_bytes(values))
            return
        values = values.astype(np.uint64)[:, None]
        sizes = _varint_sizes(values)
        self.varints(values, sizes, sizes[:, 0])

    def _flush(self) -> None:
        if not self._columns:
            return
        rows = np.empty((self.n, sum(width for _, width in self._columns)), np.uint8)
        column = 0
        for data, width in self._columns:
            rows[:, column : column + width] = np.frombuffer(data, np.uint8) if isinstance(data, bytes) else data
            column += width
        self._columns = []
        self._arrays.append(_rows_array(rows))

    def join(self) -> pa.Array:
        """Each record's bytes as one element of a binary array."""
        self._flush()
        return join_rows(self._arrays)


def _check_features(features: Mapping[str, np.ndarray]) -> tuple[int, list[tuple[str, str, np.ndarray]]]:
    if not features:
        raise ValueError("at least one feature is needed")
    n = None
    checked = []
    for key in sorted(features):
        if not isinstance(key, str):
            raise ValueError(f"feature names must be str, got {key!r}")
        a = features[key]
        if not isinstance(a, (ZeroPadded, SameBytes)):
            a = np.asarray(a)
        if isinstance(a, SameBytes):
            if n is not None and a.rows != n:
                raise ValueError(f"feature {key!r} has {a.rows} rows, other features have {n}")
            n = a.rows if n is None else n
            checked.append((key, "bytes", a))
            continue
        if a.ndim != 2:
            raise ValueError(f"feature {key!r}: expected a 2-D array (instances x values), got shape {a.shape}")
        if n is None:
            n = a.shape[0]
        elif a.shape[0] != n:
            raise ValueError(f"feature {key!r} has {a.shape[0]} rows, other features have {n}")
        if isinstance(a, ZeroPadded) and (a.dtype.kind not in "iub" or a.values.ndim != 1
                                         or (a.shape[0] and int(a.lengths().max()) > a.width)):
            raise ValueError(f"feature {key!r}: zero-padded rows need 1-D integer values, each row at most "
                             f"{a.width} long")
        if a.dtype.kind in "iub":
            checked.append((key, "int64", a))
        elif a.dtype.kind == "f":
            checked.append((key, "float", a))
        else:
            raise ValueError(f"feature {key!r}: dtype {a.dtype} is neither integer nor floating")
    return int(n), checked


def _row_sums(values: np.ndarray, offsets: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Each row's sum of small non-negative values (row ``i``: ``values[offsets[i]:offsets[i + 1]]``,
    the rows back to back; an empty row sums to 0), int64: one ``reduceat`` over the non-empty rows."""
    sums = np.zeros(len(lengths), np.int64)
    full = lengths > 0
    if values.size:
        sums[full] = np.add.reduceat(values, offsets[:-1][full], dtype=np.uint32)
    return sums


def _size_of(length):
    """Varint size of a length: one per record (an int64 array: sums with Python ints that do not
    fit a byte stay exact) or the same for all (an int)."""
    if isinstance(length, int):
        return len(varint_bytes(length))
    return _varint_sizes(length.view(np.uint64)).astype(np.int64)


def _encode_chunk(checked: list[tuple[str, str, np.ndarray]], n: int) -> np.ndarray:
    # Lengths are Python ints while they are the same in every record (a fixed-width feature's
    # whole entry), arrays once they vary: the nested length prefixes of most features then cost
    # no array work and become constant bytes.
    blocks = []
    features_len = 0
    for key, kind, a in checked:
        width = a.shape[1]
        padding = None
        if kind == "bytes":  # one value, the same in every record: constant bytes throughout
            value = a.value
            list_len = 1 + _size_of(len(value)) + len(value)
            feature_len = 1 + _size_of(list_len) + list_len
            key_part = entry_key(key)
            entry_len = feature_len + _size_of(feature_len) + len(key_part)
            features_len = features_len + 1 + _size_of(entry_len) + entry_len
            blocks.append((kind, 1, value, None, None, None, list_len, feature_len, key_part, entry_len))
            continue
        if kind == "float":
            values = np.ascontiguousarray(a, dtype="<f4").view(np.uint8).reshape(n, 4 * width)
            sizes, payload = None, 4 * width
        elif isinstance(a, ZeroPadded):  # the rows' varints, then a zero byte per padding value
            values = _as_varint_values(a.values, key)
            sizes = _varint_sizes(values)
            lengths = a.lengths()
            padding = np.zeros(len(lengths), np.int64) if isinstance(a, Ragged) else width - lengths
            payload = _row_sums(sizes, a.offsets, lengths) + padding
        else:
            values = _as_varint_values(a, key)
            if values.dtype == np.uint8 and (not width or int(values.max()) < 0x80):
                sizes, payload = None, width  # one byte each: raw
            else:
                sizes = _varint_sizes(values)
                # summed in uint16 where it cannot overflow: twice as fast as in int64
                payload = sizes.sum(axis=1, dtype=np.uint16 if width < 6553 else np.int64).astype(np.int64)
        list_len = (1 + _size_of(payload) + payload) if width else 0  # (a Ragged feature's rows are never all empty)
        feature_len = 1 + _size_of(list_len) + list_len
        key_part = entry_key(key)
        entry_len = feature_len + _size_of(feature_len) + len(key_part)
        features_len = features_len + 1 + _size_of(entry_len) + entry_len
        blocks.append((kind, width, values, sizes, padding, payload, list_len, feature_len, key_part, entry_len))
    example_len = np.broadcast_to(1 + _size_of(features_len) + features_len, (n,)).astype(np.int64)

    pieces = _Pieces(n)
    pieces.const(bytes([TAG_FIELD1_LEN]))  # Example.features
    pieces.varint(features_len)
    for kind, width, values, sizes, padding, payload, list_len, feature_len, key_part, entry_len in blocks:
        pieces.const(bytes([TAG_FIELD1_LEN]))  # Features.feature: a map entry
        pieces.varint(entry_len)
        pieces.const(key_part)  # the entry key, then the tag of the entry value
        pieces.varint(feature_len)
        pieces.const(bytes([LIST_TAG[kind]]))
        pieces.varint(list_len)
        if kind == "bytes":  # BytesList.value (field 1): its length, then the bytes
            pieces.const(bytes([TAG_FIELD1_LEN]) + varint_bytes(len(values)) + values)
        elif width:
            pieces.const(bytes([TAG_FIELD1_LEN]))  # the packed values
            pieces.varint(payload)
            if sizes is None:
                pieces.raw(values)
            elif padding is None:
                pieces.varints(values, sizes, payload)
            else:
                pieces.varints(values, sizes, payload - padding, padding)
    data = pieces.join()
    records = join_rows([_rows_array(frame_headers(example_len)), data, _rows_array(data_crcs(data.to_pylist()))])
    return _flat_bytes(records)


_CHUNK_BYTES = 1 << 23  # records are encoded in chunks of about this many (estimated) bytes: the
# estimate is ~5x a BERT record's real size, so a chunk is ~1,700 records (~1.4 MB of output);
# chunks of half the size cost 8% more in per-chunk numpy calls, larger ones gain nothing


def iter_encoded_examples(features: Mapping[str, np.ndarray]) -> Iterator[np.ndarray]:
    """The bytes of :func:`encode_examples` as consecutive uint8 arrays, one per chunk of records
    (a writer passes them on as they are: no copy into one ``bytes``)."""
    n, checked = _check_features(features)
    # Bound the temporaries: a record takes at most ~10 bytes per int value.
    per_record = 64 + sum(len(k) + 40 + (4 if kind == "float" else 10) * a.shape[1] for k, kind, a in checked)
    step = max(1, _CHUNK_BYTES // per_record)
    for start in range(0, n, step):
        yield _encode_chunk([(k, kind, a[start : start + step]) for k, kind, a in checked], min(step, n - start))


def encode_examples(features: Mapping[str, np.ndarray]) -> bytes:
    """A TFRecord file with one ``tf.train.Example`` per row of the given 2-D arrays.

    Integer arrays (or :class:`ZeroPadded` rows) become ``int64_list`` features and floating
    arrays ``float_list`` (float32) features, each row a fixed-length list; entries are written
    sorted by feature name. Negative integers are encoded as protobuf does (10-byte two's
    complement varints). Zero rows give ``b""``.
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
    return _in_slices(batch, max_seq_length, lambda part: _bert_features(part, max_seq_length, max_predictions))


def _in_slices(batch: InstanceBatch, max_seq_length: int, features_of) -> Iterator[np.ndarray]:
    """The records of ``batch``, ``features_of(rows)`` padded slice by slice of rows (records are
    encoded one by one, so the bytes are those of one slice), each slice's rows in runs of one
    language where the batch has languages."""
    for part in _row_slices(batch, max_seq_length):
        if part.languages is not None:
            yield from _in_language_runs(part, features_of)
        else:
            yield from iter_encoded_examples(features_of(part))


_PADDED_CELLS = 1 << 22
"""Padded values a slice of rows holds at most: else 7,000 short rows of a block padded to 8,192
took 170 MB. Up to 512 columns a block of 8,192 rows is one slice, as before."""


def _row_slices(batch: InstanceBatch, max_seq_length: int) -> Iterator[InstanceBatch]:
    step = max(1, _PADDED_CELLS // max_seq_length)
    for start in range(0, len(batch), step):
        yield batch.slice(start, min(len(batch), start + step))


def _bert_features(batch: InstanceBatch, max_seq_length: int, max_predictions: int) -> dict:
    features = batch.padded(max_seq_length, max_predictions, compact=True, with_ids=False)
    features["input_ids"] = ZeroPadded(batch.input_ids, batch.offsets, max_seq_length)
    features["masked_lm_ids"] = ZeroPadded(batch.masked_lm_ids, batch.masked_offsets, max_predictions)
    if batch.document_starts is not None:  # packed rows: where their documents start, a few values each
        features["document_starts"] = Ragged(batch.document_starts, batch.document_offsets)
    return features


def _in_language_runs(batch: InstanceBatch, features_of) -> Iterator[np.ndarray]:
    """The records of a batch with languages: ``features_of(rows)``'s features and ``language``
    (a ``bytes_list`` of the code in UTF-8), encoded run by run of rows in one language."""
    codes = batch.languages
    cuts = np.flatnonzero(codes[1:] != codes[:-1]) + 1
    bounds = [0, *cuts.tolist(), len(batch)]
    for start, stop in zip(bounds[:-1], bounds[1:]):
        part = batch.slice(start, stop)
        part.languages = None
        features = dict(features_of(part))
        features["language"] = SameBytes(str(codes[start]).encode(), stop - start)
        yield from iter_encoded_examples(features)


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
    return _in_slices(batch, max_seq_length, lambda part: _sequence_features(part, max_seq_length))


def _sequence_features(batch: InstanceBatch, max_seq_length: int) -> dict:
    padded = batch.padded(max_seq_length, 0, compact=True, with_ids=False)
    padded["input_ids"] = ZeroPadded(batch.input_ids, batch.offsets, max_seq_length)
    return {name: padded[name] for name in SEQUENCE_FEATURES}


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

