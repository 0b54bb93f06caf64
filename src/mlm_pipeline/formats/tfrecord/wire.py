"""The TFRecord wire format: record framing with its CRC32C, and the protobuf tags of ``tf.train.Example``.

Framing (per record): ``uint64 length`` (little-endian), ``uint32 masked_crc32c(length bytes)``,
``data``, ``uint32 masked_crc32c(data)``, where ``masked(c) = ((c >> 15) | (c << 17)) +
0xa282ead8 (mod 2**32)``. The encoder (:mod:`.encode`) frames all records of a chunk at once with
:func:`frame_headers` and :func:`data_crcs`; the readers check the framing with
:func:`iter_tfrecord_records` (a stream) or :func:`record_spans` (a whole file in memory), and the
loader skips records by their headers with :func:`skip_records`.

``tf.train.Example`` is ``Example{Features features = 1}``, ``Features{map<string, Feature>
feature = 1}`` (a map entry is ``{string key = 1; Feature value = 2}``), ``Feature{oneof:
BytesList bytes_list = 1, FloatList float_list = 2, Int64List int64_list = 3}``, ``*List{repeated
value = 1}``. The tags both the encoder and the decoder need are defined here once.
"""

from __future__ import annotations

import struct
from collections.abc import Iterator
from typing import BinaryIO

import google_crc32c
import numpy as np

__all__ = [
    "BERT_FEATURES",
    "FOOTER_BYTES",
    "SEQUENCE_FEATURES",
    "HEADER_BYTES",
    "crc32c_rows",
    "data_crcs",
    "entry_key",
    "frame_headers",
    "iter_tfrecord_records",
    "mask_crcs",
    "masked_crc32c",
    "record_spans",
    "skip_records",
    "varint_bytes",
]

#: The features of a BERT pretraining example and their list type, sorted by key (the order in
#: which the encoder writes the map entries), as google-research/bert ``run_pretraining.py`` reads them.
BERT_FEATURES: dict[str, str] = {
    "input_ids": "int64",
    "input_mask": "int64",
    "masked_lm_ids": "int64",
    "masked_lm_positions": "int64",
    "masked_lm_weights": "float",
    "next_sentence_labels": "int64",
    "segment_ids": "int64",
}

#: The features of an ELECTRA pretraining example (google-research/electra
#: ``build_pretraining_dataset.py``): the sequence only, masked at training time.
SEQUENCE_FEATURES: dict[str, str] = {"input_ids": "int64", "input_mask": "int64", "segment_ids": "int64"}

HEADER_BYTES = 12  # uint64 length + uint32 masked CRC of it
FOOTER_BYTES = 4  # uint32 masked CRC of the data
_MASK_DELTA = 0xA282EAD8
_U32 = 0xFFFFFFFF
_READ_CHUNK = 1 << 26  # never ask a file object for more at once (a corrupt length can be huge)

# Protobuf wire types and the tags used by tf.train.Example (tag = field << 3 | wire type).
VARINT, I64, LEN, I32 = 0, 1, 2, 5
TAG_FIELD1_LEN = 0x0A  # Example.features, Features.feature (map entry), entry key, *List.value packed
TAG_FIELD2_LEN = 0x12  # map entry value
LIST_TAG = {"bytes": 0x0A, "float": 0x12, "int64": 0x1A}  # Feature oneof kind
KIND_OF_TAG = {v: k for k, v in LIST_TAG.items()}


def varint_bytes(value: int) -> bytes:
    """One protobuf varint (for constant parts of a record). Negative int64 -> 10 bytes."""
    value &= (1 << 64) - 1
    out = bytearray()
    while value >= 0x80:
        out.append((value & 0x7F) | 0x80)
        value >>= 7
    out.append(value)
    return bytes(out)


def entry_key(key: str) -> bytes:
    """The bytes of a ``Features.feature`` map entry from its key up to its value's tag.

    The same in every record: the encoder writes it, the lockstep decoder expects it.
    """
    key_bytes = key.encode("utf-8")
    return bytes([TAG_FIELD1_LEN]) + varint_bytes(len(key_bytes)) + key_bytes + bytes([TAG_FIELD2_LEN])


# --------------------------------------------------------------------------------------------
# CRC32C


def masked_crc32c(data: bytes) -> int:
    """The masked CRC32C that TFRecord stores after the length and after the data."""
    crc = google_crc32c.value(bytes(data))
    return (((crc >> 15) | (crc << 17)) + _MASK_DELTA) & _U32


def mask_crcs(crc: np.ndarray) -> np.ndarray:
    """TFRecord's masking of an array of CRC32C values (uint32)."""
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


def crc32c_rows(rows: np.ndarray) -> np.ndarray:
    """CRC32C of every row of a small ``(n, k)`` uint8 array at once (k steps, vectorised over n)."""
    crc = np.full(rows.shape[0], _U32, np.uint32)
    for j in range(rows.shape[1]):
        crc = _CRC_TABLE[(crc ^ rows[:, j]) & np.uint32(0xFF)] ^ (crc >> np.uint32(8))
    return crc ^ np.uint32(_U32)


# --------------------------------------------------------------------------------------------
# Framing, writing


def frame_headers(lengths: np.ndarray) -> np.ndarray:
    """The 12-byte headers (length, masked CRC of it) of records of these data lengths: (n, 12) uint8.

    One vectorised CRC over the 8 length bytes of every record.
    """
    n = len(lengths)
    header = np.empty((n, HEADER_BYTES), np.uint8)
    header[:, :8] = np.asarray(lengths).astype("<u8").view(np.uint8).reshape(n, 8)
    header[:, 8:] = mask_crcs(crc32c_rows(header[:, :8])).astype("<u4").view(np.uint8).reshape(n, 4)
    return header


def data_crcs(records: list[bytes]) -> np.ndarray:
    """The 4-byte footers (masked CRC32C of the data) of these records: (n, 4) uint8.

    The only per-record Python step of encoding: one ``google_crc32c.value`` call per record.
    """
    crcs = np.fromiter(map(google_crc32c.value, records), dtype=np.uint32, count=len(records))
    return mask_crcs(crcs).astype("<u4").view(np.uint8).reshape(-1, 4)


# --------------------------------------------------------------------------------------------
# Framing, reading


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
            f"whose data starts at byte offset {offset + HEADER_BYTES} "
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
        header = _read_up_to(f, HEADER_BYTES)
        if not header:
            return
        if len(header) < HEADER_BYTES:
            raise _truncated(offset, f"{len(header)} of the {HEADER_BYTES} header bytes present")
        length = _unpack_header(header, offset, verify_crc)
        data = _read_up_to(f, length)
        footer = _read_up_to(f, FOOTER_BYTES) if len(data) == length else b""
        if len(footer) < FOOTER_BYTES:
            raise _truncated(
                offset, f"record declares {length} data bytes + {FOOTER_BYTES} CRC bytes, "
                f"{len(data) + len(footer)} present"
            )
        if verify_crc:
            _check_data(data, struct.unpack("<I", footer)[0], offset)
        yield data
        offset += HEADER_BYTES + length + FOOTER_BYTES


def skip_records(f: BinaryIO, n: int) -> int:
    """Move a seekable stream past its next ``n`` records, reading only their length headers.

    Returns how many were skipped (fewer than ``n`` only at the end of the stream). The data is
    not read, so its CRC is not checked; records read afterwards are checked as usual.
    """
    for skipped in range(n):
        header = f.read(HEADER_BYTES)
        if len(header) < HEADER_BYTES:
            return skipped
        (length,) = struct.unpack("<Q", header[:8])
        f.seek(length + FOOTER_BYTES, 1)
    return n


def record_spans(buf: bytes, *, verify_crc: bool = True) -> tuple[list[int], list[int]]:
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
        if size - offset < HEADER_BYTES:
            truncation = _truncated(offset, f"{size - offset} of the {HEADER_BYTES} header bytes present")
            break
        length = unpack("<Q", buf, offset)[0]
        offsets.append(offset)
        lengths.append(length)
        end = offset + HEADER_BYTES + length
        if end + FOOTER_BYTES > size:
            truncation = _truncated(
                offset,
                f"record declares {length} data bytes + {FOOTER_BYTES} CRC bytes, "
                f"{size - offset - HEADER_BYTES} present",
            )
            break
        complete += 1
        offset = end + FOOTER_BYTES
    starts = [o + HEADER_BYTES for o in offsets[:complete]]
    ends = [s + n for s, n in zip(starts, lengths)]
    if verify_crc and offsets:
        arr = np.frombuffer(buf, np.uint8)
        headers = arr[np.array(offsets, np.int64)[:, None] + np.arange(HEADER_BYTES)]
        stored = np.ascontiguousarray(headers[:, 8:]).view("<u4").ravel()
        bad = np.flatnonzero(mask_crcs(crc32c_rows(headers[:, :8])) != stored)
        first_bad_header = int(bad[0]) if bad.size else len(offsets)
        checked = min(first_bad_header, complete)
        value = google_crc32c.value
        crcs = np.fromiter(
            (value(buf[s:e]) for s, e in zip(starts[:checked], ends[:checked])), dtype=np.uint32, count=checked
        )
        stored = np.ascontiguousarray(arr[np.array(ends[:checked], np.int64)[:, None] + np.arange(4)]).view("<u4")
        bad = np.flatnonzero(mask_crcs(crcs) != stored.ravel())
        if bad.size:
            i = int(bad[0])
            _check_data(buf[starts[i] : ends[i]], int(stored[i, 0]), offsets[i])
        if first_bad_header < len(offsets):
            _unpack_header(headers[first_bad_header].tobytes(), offsets[first_bad_header], True)
    if truncation is not None:
        raise truncation
    return starts, ends
