"""TFRecord codec: golden round trips, byte identity with a plain per-record encoder, CRC checks.

``python tests/formats/test_tfrecord.py [N]`` prints the encoder benchmark (ours vs the plain
encoder below, same data, same run).
"""

from __future__ import annotations

import gzip
import io
import json
import re
import struct
import sys
import time
from pathlib import Path

import google_crc32c
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets
from mlm_pipeline.formats.tfrecord import (
    encode_examples,
    encode_tfrecord,
    iter_tfrecord_records,
    masked_crc32c,
    parse_example,
    read_tfrecord,
    read_tfrecord_features,
)
from mlm_pipeline.formats.tfrecord.encode import ZeroPadded
from mlm_pipeline.formats.tfrecord.wire import crc32c_rows

GOLDEN = Path(__file__).resolve().parents[1] / "data" / "golden"
GOLDEN_CASES = sorted(p.name[: -len(".jsonl.gz")] for p in GOLDEN.glob("*.jsonl.gz"))
FLOAT_FEATURES = {"masked_lm_weights"}

# --------------------------------------------------------------------------------------------
# A plain encoder, written from the protobuf and TFRecord specs: one record at a time, one value
# at a time, Python ints. Example{Features features = 1}, Features{map<string, Feature> feature =
# 1} (a map entry is a message {string key = 1; Feature value = 2}), Feature{oneof: BytesList
# bytes_list = 1, FloatList float_list = 2, Int64List int64_list = 3}, *List{repeated value = 1}
# packed. Empty packed fields are not written.


def plain_varint(value: int) -> bytes:
    value &= (1 << 64) - 1  # int64 two's complement
    out = bytearray()
    while True:
        low = value & 0x7F
        value >>= 7
        if value:
            out.append(low | 0x80)
        else:
            out.append(low)
            return bytes(out)


def plain_field(number: int, payload: bytes) -> bytes:
    return plain_varint(number << 3 | 2) + plain_varint(len(payload)) + payload


def plain_example(features: dict[str, list], order: list[str] | None = None, unpacked: bool = False) -> bytes:
    entries = b""
    for key in order or sorted(features):
        values = features[key]
        if key in FLOAT_FEATURES:
            if unpacked:
                items = b"".join(plain_varint(1 << 3 | 5) + struct.pack("<f", v) for v in values)
            else:
                items = plain_field(1, b"".join(struct.pack("<f", v) for v in values)) if values else b""
            feature = plain_field(2, items)
        else:
            if unpacked:
                items = b"".join(plain_varint(1 << 3 | 0) + plain_varint(int(v)) for v in values)
            else:
                items = plain_field(1, b"".join(plain_varint(int(v)) for v in values)) if values else b""
            feature = plain_field(3, items)
        entries += plain_field(1, plain_field(1, key.encode()) + plain_field(2, feature))
    return plain_field(1, entries)


def plain_masked_crc(data: bytes) -> int:
    crc = google_crc32c.value(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) % (1 << 32)


def plain_tfrecord(examples: list[bytes]) -> bytes:
    out = bytearray()
    for data in examples:
        header = struct.pack("<Q", len(data))
        out += header + struct.pack("<I", plain_masked_crc(header))
        out += data + struct.pack("<I", plain_masked_crc(data))
    return bytes(out)


def plain_encode(batch: InstanceBatch, max_seq_length: int, max_predictions: int) -> bytes:
    examples = []
    for i in range(len(batch)):
        row = batch.row(i)
        pad = max_seq_length - len(row["input_ids"])
        mpad = max_predictions - len(row["masked_lm_ids"])
        examples.append(
            plain_example(
                {
                    "input_ids": row["input_ids"] + [0] * pad,
                    "input_mask": [1] * len(row["input_ids"]) + [0] * pad,
                    "segment_ids": row["segment_ids"] + [0] * pad,
                    "masked_lm_positions": row["masked_lm_positions"] + [0] * mpad,
                    "masked_lm_ids": row["masked_lm_ids"] + [0] * mpad,
                    "masked_lm_weights": [1.0] * len(row["masked_lm_ids"]) + [0.0] * mpad,
                    "next_sentence_labels": [row.get("next_sentence_label", 0)],
                }
            )
        )
    return plain_tfrecord(examples)


# --------------------------------------------------------------------------------------------
# Helpers


def batch_from_rows(rows: list[dict], with_nsp: bool = True) -> InstanceBatch:
    if not rows:
        return InstanceBatch.empty(with_nsp=with_nsp)
    return InstanceBatch(
        input_ids=np.array([t for r in rows for t in r["input_ids"]], np.int32),
        segment_ids=np.array([t for r in rows for t in r["segment_ids"]], np.int8),
        offsets=lengths_to_offsets(np.array([len(r["input_ids"]) for r in rows])),
        masked_lm_positions=np.array([t for r in rows for t in r["masked_lm_positions"]], np.int32),
        masked_lm_ids=np.array([t for r in rows for t in r["masked_lm_ids"]], np.int32),
        masked_offsets=lengths_to_offsets(np.array([len(r["masked_lm_ids"]) for r in rows])),
        next_sentence_labels=np.array([r["next_sentence_label"] for r in rows], np.int8) if with_nsp else None,
    )


def assert_batches_equal(a: InstanceBatch, b: InstanceBatch) -> None:
    for name in ("input_ids", "segment_ids", "offsets", "masked_lm_positions", "masked_lm_ids", "masked_offsets"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)
    np.testing.assert_array_equal(a.next_sentence_labels, b.next_sentence_labels)


def random_batch(rng: np.random.Generator, n: int, max_seq: int, max_pred: int, vocab: int = 30522) -> InstanceBatch:
    lengths = rng.integers(2, max_seq + 1, n)
    counts = np.minimum(rng.integers(0, max_pred + 1, n), lengths)
    positions = [np.sort(rng.choice(length, count, replace=False)) for length, count in zip(lengths, counts)]
    return InstanceBatch(
        input_ids=rng.integers(0, vocab, int(lengths.sum())).astype(np.int32),
        segment_ids=rng.integers(0, 2, int(lengths.sum())).astype(np.int8),
        offsets=lengths_to_offsets(lengths),
        masked_lm_positions=np.concatenate(positions).astype(np.int32),
        masked_lm_ids=rng.integers(0, vocab, int(counts.sum())).astype(np.int32),
        masked_offsets=lengths_to_offsets(counts),
        next_sentence_labels=rng.integers(0, 2, n).astype(np.int8),
    )


_golden_cache: dict[str, tuple[dict, dict[str, np.ndarray]]] = {}


def load_golden(case: str) -> tuple[dict, dict[str, np.ndarray]]:
    if case not in _golden_cache:
        settings_ = json.loads((GOLDEN / f"{case}.json").read_text())
        with gzip.open(GOLDEN / f"{case}.jsonl.gz", "rt") as f:
            rows = [json.loads(line) for line in f]
        arrays = {
            key: np.array([r[key] for r in rows], np.float32 if key in FLOAT_FEATURES else np.int64)
            for key in rows[0]
        }
        _golden_cache[case] = (settings_, arrays)
    return _golden_cache[case]


# --------------------------------------------------------------------------------------------
# Golden round trips


def test_golden_cases_present():
    assert len(GOLDEN_CASES) == 4


@pytest.mark.parametrize("case", GOLDEN_CASES)
def test_golden_round_trip(case):
    settings_, golden = load_golden(case)
    max_seq, max_pred = settings_["max_seq_length"], settings_["max_predictions_per_seq"]
    assert golden["input_ids"].shape == (settings_["instances"], max_seq)
    batch = InstanceBatch.from_padded(golden)
    data = encode_tfrecord(batch, max_seq_length=max_seq, max_predictions=max_pred)
    features = read_tfrecord_features(io.BytesIO(data))
    assert sorted(features) == sorted(golden)
    for key, expected in golden.items():
        assert features[key].dtype == expected.dtype, key
        np.testing.assert_array_equal(features[key], expected, err_msg=key)
    assert_batches_equal(read_tfrecord(io.BytesIO(data)), batch)


def test_golden_matches_plain_encoder():
    settings_, golden = load_golden("sample_text-d10")
    batch = InstanceBatch.from_padded(golden)
    args = settings_["max_seq_length"], settings_["max_predictions_per_seq"]
    assert encode_tfrecord(batch, max_seq_length=args[0], max_predictions=args[1]) == plain_encode(batch, *args)


# --------------------------------------------------------------------------------------------
# Byte identity with the plain encoder

EDGE_IDS = [0, 1, 127, 128, 2**14 - 1, 2**14, 2**21 - 1, 2**21, 2**28 - 1, 2**28, 2**31 - 1, -1, -(2**31)]


@st.composite
def batches(draw):
    max_seq = draw(st.integers(2, 40))
    max_pred = draw(st.integers(0, 12))
    ids = st.one_of(st.sampled_from(EDGE_IDS), st.integers(0, 2**31 - 1), st.integers(0, 300))
    rows = []
    for _ in range(draw(st.integers(0, 6))):
        length = draw(st.integers(2, max_seq))
        count = draw(st.integers(0, min(max_pred, length)))
        positions = sorted(draw(st.sets(st.integers(0, length - 1), min_size=count, max_size=count)))
        rows.append(
            {
                "input_ids": draw(st.lists(ids, min_size=length, max_size=length)),
                "segment_ids": draw(st.lists(st.sampled_from([0, 1, 2, 127, -1]), min_size=length, max_size=length)),
                "masked_lm_positions": positions,
                "masked_lm_ids": draw(st.lists(ids, min_size=count, max_size=count)),
                "next_sentence_label": draw(st.integers(0, 1)),
            }
        )
    return batch_from_rows(rows, with_nsp=draw(st.booleans())), max_seq, max_pred


@settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(batches())
def test_matches_plain_encoder_and_round_trips(case):
    batch, max_seq, max_pred = case
    data = encode_tfrecord(batch, max_seq_length=max_seq, max_predictions=max_pred)
    assert data == plain_encode(batch, max_seq, max_pred)
    back = read_tfrecord(io.BytesIO(data))
    if batch.next_sentence_labels is None:  # the file stores label 0 for every instance
        batch.next_sentence_labels = np.zeros(len(batch), np.int8)
    if len(batch):
        assert_batches_equal(back, batch)
    else:
        assert data == b"" and len(back) == 0
    for record, expected in zip(iter_tfrecord_records(io.BytesIO(data)), range(len(batch))):
        parsed = parse_example(record)
        np.testing.assert_array_equal(parsed["input_ids"][: batch.lengths[expected]], batch.row(expected)["input_ids"])


def test_a_varying_entry_after_more_than_255_bytes_of_fixed_ones():
    # Lengths stay Python ints while every record has the same (here: over 255 bytes of entries
    # before segment_ids), then become arrays: their sum must not take a byte-sized dtype.
    batch = batch_from_rows([{"input_ids": [0, 0], "segment_ids": [0, -1], "masked_lm_positions": [],
                              "masked_lm_ids": [], "next_sentence_label": 0}], with_nsp=False)
    data = encode_tfrecord(batch, max_seq_length=17, max_predictions=12)
    assert data == plain_encode(batch, 17, 12)


@pytest.mark.parametrize("chunk_bytes", [None, 200])
def test_zero_padded_rows_give_the_bytes_of_padded_arrays(monkeypatch, chunk_bytes):
    import mlm_pipeline.formats.tfrecord.encode as codec

    if chunk_bytes:  # rows sliced into chunks of a few records
        monkeypatch.setattr(codec, "_CHUNK_BYTES", chunk_bytes)
    rng = np.random.default_rng(7)
    lengths = np.array([0, 3, 5, 1, 0, 5, 2])  # empty rows, full rows
    values = rng.choice(np.array([0, 1, 127, 128, 300, 2**14, 2**21, 2**40, -1], np.int64), int(lengths.sum()))
    offsets = lengths_to_offsets(lengths)
    dense = np.zeros((len(lengths), 5), np.int64)
    dense[np.arange(5)[None, :] < lengths[:, None]] = values
    other = rng.integers(0, 3, (len(lengths), 2))
    expected = encode_examples({"ids": dense, "other": other})
    assert encode_examples({"ids": ZeroPadded(values, offsets, 5), "other": other}) == expected
    small = values[values >= 0][:4]  # non-negative int32 values (token ids): the unsigned view
    dense_small = np.zeros((2, 3), np.int32)
    dense_small[0, :2], dense_small[1, :2] = small[:2], small[2:4]
    assert encode_examples({"ids": ZeroPadded(small.astype(np.int32), np.array([0, 2, 4]), 3)}) == encode_examples(
        {"ids": dense_small})


@pytest.mark.parametrize("rows, match", [
    (ZeroPadded(np.array([1.5, 2.0]), np.array([0, 2]), 2), "integer"),
    (ZeroPadded(np.array([1, 2, 3]), np.array([0, 3]), 2), "at most 2"),
])
def test_zero_padded_rows_are_checked(rows, match):
    with pytest.raises(ValueError, match=match):
        encode_examples({"ids": rows})


def test_chunks_give_the_same_bytes(monkeypatch):
    import mlm_pipeline.formats.tfrecord.encode as codec

    batch = random_batch(np.random.default_rng(4), 50, 64, 10, vocab=2**30)
    whole = encode_tfrecord(batch, max_seq_length=64, max_predictions=10)
    monkeypatch.setattr(codec, "_CHUNK_BYTES", 3000)  # a few records per chunk
    assert encode_tfrecord(batch, max_seq_length=64, max_predictions=10) == whole == plain_encode(batch, 64, 10)


def _varint_size(value: int) -> int:
    return len(plain_varint(value))


@pytest.mark.parametrize("widest", range(1, 11))
def test_varints_of_every_size(widest):
    # Values of sizes 1..widest mixed in every row (one byte stream for all records: words of 4 or
    # 8 bytes up to 8-byte varints, byte planes for 9 and 10), and columns where every value has
    # the same size (written in place): both against the plain encoder.
    edges = [0, 1, 127, 128, 300, *(2 ** (7 * s) - 1 for s in range(2, 10)), *(2 ** (7 * s) for s in range(2, 9)),
             2**63 - 1, -1, -(2**63)]
    values = [v for v in edges if _varint_size(v) <= widest]
    rng = np.random.default_rng(widest)
    mixed = rng.choice(np.array(values, np.int64), (9, 11))
    mixed[4, 5] = max(values, key=lambda v: (_varint_size(v), v))
    same = np.full((9, 3), mixed[4, 5], np.int64)
    features = {"mixed": mixed, "same": same}
    expected = plain_tfrecord([plain_example({"mixed": m, "same": s}) for m, s in zip(mixed.tolist(), same.tolist())])
    assert encode_examples(features) == expected
    back = read_tfrecord_features(io.BytesIO(expected))
    np.testing.assert_array_equal(back["mixed"], mixed)


def test_benchmark_smoke():
    # The figures come from ``python tests/formats/test_tfrecord.py``; here: same bytes, runs.
    result = benchmark(300)
    assert result["identical"]


def test_encode_examples_generic_features():
    features = {
        "b": np.array([[1.5, -2.0], [0.0, 3.25]], np.float64),
        "a": np.array([[-5], [2**40]], np.int64),
        "c": np.zeros((2, 0), np.int64),
    }
    data = encode_examples(features)
    back = read_tfrecord_features(io.BytesIO(data))
    np.testing.assert_array_equal(back["a"], features["a"])
    np.testing.assert_array_equal(back["b"], features["b"].astype(np.float32))
    assert back["c"].shape == (2, 0)
    assert encode_examples({"a": np.zeros((0, 3), np.int64)}) == b""


@pytest.mark.parametrize(
    "features, match",
    [
        ({}, "at least one"),
        ({"a": np.zeros(3, np.int64)}, "2-D"),
        ({"a": np.zeros((2, 1)), "b": np.zeros((3, 1))}, "rows"),
        ({"a": np.array([["x"]])}, "dtype"),
        ({"a": np.array([[2**63]], np.uint64)}, "int64"),
    ],
)
def test_encode_examples_rejects(features, match):
    with pytest.raises(ValueError, match=match):
        encode_examples(features)


def test_encode_tfrecord_validates_limits():
    row = {"input_ids": list(range(10)), "segment_ids": [0] * 10, "masked_lm_positions": [1, 2, 3, 4],
           "masked_lm_ids": [5, 6, 7, 8], "next_sentence_label": 0}
    batch = batch_from_rows([row])
    encode_tfrecord(batch, max_seq_length=10, max_predictions=4)
    for kwargs, match in [
        ({"max_seq_length": 0, "max_predictions": 4}, "max_seq_length"),
        ({"max_seq_length": 10, "max_predictions": -1}, "max_predictions"),
        ({"max_seq_length": 10.0, "max_predictions": 4}, "int"),
        ({"max_seq_length": 5, "max_predictions": 4}, "exceeds max_seq_length"),
        ({"max_seq_length": 10, "max_predictions": 1}, "exceeds max_predictions"),
    ]:
        with pytest.raises(ValueError, match=match):
            encode_tfrecord(batch, **kwargs)


# --------------------------------------------------------------------------------------------
# Framing and CRCs


def test_masked_crc_known_answer():
    assert google_crc32c.value(b"123456789") == 0xE3069283
    # ((0xE3069283 >> 15) | (0xE3069283 << 17)) mod 2**32 = 0x2507C60D; + 0xA282EAD8 = 0xC78AB0E5
    assert masked_crc32c(b"123456789") == 0xC78AB0E5
    assert plain_masked_crc(b"123456789") == 0xC78AB0E5


def test_vectorised_crc_matches_google_crc32c():
    rows = np.random.default_rng(1).integers(0, 256, (50, 8)).astype(np.uint8)
    assert crc32c_rows(rows).tolist() == [google_crc32c.value(r.tobytes()) for r in rows]
    assert crc32c_rows(np.frombuffer(b"123456789", np.uint8)[None, :]).tolist() == [0xE3069283]


def three_records() -> tuple[bytes, list[int]]:
    batch = random_batch(np.random.default_rng(2), 3, 16, 4)
    data = encode_tfrecord(batch, max_seq_length=16, max_predictions=4)
    offsets, pos = [], 0
    while pos < len(data):
        offsets.append(pos)
        pos += 16 + struct.unpack_from("<Q", data, pos)[0]
    assert pos == len(data) and len(offsets) == 3
    return data, offsets


def read_both_ways(data: bytes, **kwargs):
    records = list(iter_tfrecord_records(io.BytesIO(data), **kwargs))
    read_tfrecord_features(io.BytesIO(data), **kwargs)
    return records


@pytest.mark.parametrize("where, what", [(0, "length CRC"), (8, "length CRC"), (12, "data CRC"), (-5, "data CRC")])
def test_flipped_byte_raises_with_offset(where, what):
    data, offsets = three_records()
    record = 1
    end = offsets[2]
    pos = offsets[record] + where if where >= 0 else end + where
    bad = bytearray(data)
    bad[pos] ^= 0x01
    for reader in (lambda b: list(iter_tfrecord_records(io.BytesIO(b))), lambda b: read_tfrecord_features(io.BytesIO(b))):
        with pytest.raises(ValueError, match=f"byte offset {offsets[record]}: {what}"):
            reader(bytes(bad))


def test_stored_data_crc_flipped_raises():
    data, offsets = three_records()
    bad = bytearray(data)
    bad[offsets[2] - 1] ^= 0x80  # last byte of record 1: its data CRC
    with pytest.raises(ValueError, match=f"byte offset {offsets[1]}: data CRC"):
        read_both_ways(bytes(bad))


def test_verify_crc_false_skips_checks():
    data, offsets = three_records()
    bad = bytearray(data)
    bad[offsets[1] + 12 + 3] ^= 0x01  # inside the key string "input_ids": still parses
    records = list(iter_tfrecord_records(io.BytesIO(bytes(bad)), verify_crc=False))
    assert records == [bytes(bad[o + 12 : e - 4]) for o, e in zip(offsets, offsets[1:] + [len(data)])]
    # checked, the same flip is the data CRC mismatch of record 1, named by its offsets and CRCs
    stored = struct.unpack_from("<I", data, offsets[2] - 4)[0]
    expected = (
        f"corrupt TFRecord at byte offset {offsets[1]}: data CRC mismatch in the {len(records[1])}-byte record "
        f"whose data starts at byte offset {offsets[1] + 12} "
        f"(stored 0x{stored:08x}, computed 0x{masked_crc32c(records[1]):08x})"
    )
    assert stored == masked_crc32c(data[offsets[1] + 12 : offsets[2] - 4]) != masked_crc32c(records[1])
    for reader in (lambda b: list(iter_tfrecord_records(io.BytesIO(b))), lambda b: read_tfrecord_features(io.BytesIO(b))):
        with pytest.raises(ValueError) as caught:
            reader(bytes(bad))
        assert str(caught.value) == expected


@pytest.mark.parametrize("cut", [1, 4, 11, 12, 20, -4, -1])
def test_truncated_file_raises(cut):
    data, offsets = three_records()
    end = offsets[2] + cut if cut > 0 else len(data) + cut
    with pytest.raises(ValueError, match=f"truncated TFRecord at byte offset {offsets[2]}"):
        read_both_ways(data[:end])


def test_corrupt_length_without_crc_check_is_truncation():
    data, offsets = three_records()
    bad = bytearray(data)
    bad[offsets[1] + 6] = 0x7F  # length ~2**55: must not try to allocate it
    with pytest.raises(ValueError, match=f"truncated TFRecord at byte offset {offsets[1]}"):
        read_both_ways(bytes(bad), verify_crc=False)


def test_empty_file():
    assert list(iter_tfrecord_records(io.BytesIO(b""))) == []
    assert read_tfrecord_features(io.BytesIO(b"")) == {}
    assert len(read_tfrecord(io.BytesIO(b""))) == 0
    assert encode_tfrecord(InstanceBatch.empty(), max_seq_length=8, max_predictions=2) == b""


def test_short_reads_are_completed():
    class Trickle(io.RawIOBase):
        def __init__(self, data):
            self.data, self.pos = data, 0

        def readable(self):
            return True

        def read(self, n=-1):
            chunk = self.data[self.pos : self.pos + min(n, 3)]
            self.pos += len(chunk)
            return chunk

    data, _ = three_records()
    assert list(iter_tfrecord_records(Trickle(data))) == list(iter_tfrecord_records(io.BytesIO(data)))


def test_paths_and_fsspec_urls(tmp_path):
    import fsspec

    batch = random_batch(np.random.default_rng(3), 5, 32, 5)
    data = encode_tfrecord(batch, max_seq_length=32, max_predictions=5)
    path = tmp_path / "shard.tfrecord"
    path.write_bytes(data)
    assert_batches_equal(read_tfrecord(path), batch)
    assert_batches_equal(read_tfrecord(str(path)), batch)
    fs = fsspec.filesystem("memory")
    fs.pipe_file("/tfrecord-test/shard.tfrecord", data)
    try:
        assert_batches_equal(read_tfrecord("memory://tfrecord-test/shard.tfrecord"), batch)
    finally:
        fs.rm("/tfrecord-test", recursive=True)


# --------------------------------------------------------------------------------------------
# Generic Example decoding


def test_parse_example_unpacked_bytes_and_unknown_fields():
    ints_unpacked = b"".join(plain_varint(1 << 3 | 0) + plain_varint(v) for v in [1, 300, -1])
    floats_unpacked = b"".join(plain_varint(1 << 3 | 5) + struct.pack("<f", v) for v in [1.5, -2.0])
    floats_mixed = plain_field(1, struct.pack("<2f", 0.5, 0.25)) + plain_varint(1 << 3 | 5) + struct.pack("<f", 4.0)
    strings = plain_field(1, b"x") + plain_field(1, b"") + plain_field(1, "é".encode())
    unknown = plain_varint(7 << 3 | 0) + plain_varint(99) + plain_varint(8 << 3 | 1) + b"\0" * 8

    def entry(key: str, feature: bytes) -> bytes:
        return plain_field(1, plain_field(1, key.encode()) + plain_field(2, feature))

    features = (
        entry("ints", plain_field(3, ints_unpacked + unknown))
        + entry("floats", plain_field(2, floats_unpacked))
        + entry("mixed", plain_field(2, floats_mixed))
        + entry("strings", plain_field(1, strings))
        + entry("empty", b"")
        + entry("replaced", plain_field(3, plain_field(1, plain_varint(5))))
        + entry("replaced", plain_field(3, plain_field(1, plain_varint(6))))  # map: last wins
        + entry("merged", plain_field(3, plain_field(1, plain_varint(7))) + plain_field(3, b"\x08" + plain_varint(8) + b"\x08" + plain_varint(9)))
        + entry("oneof", plain_field(3, plain_field(1, plain_varint(7))) + plain_field(1, plain_field(1, b"z")))
    )
    record = plain_field(1, features) + unknown
    parsed = parse_example(record)
    assert parsed["ints"].dtype == np.int64 and parsed["ints"].tolist() == [1, 300, -1]
    assert parsed["floats"].dtype == np.float32 and parsed["floats"].tolist() == [1.5, -2.0]
    assert parsed["mixed"].tolist() == [0.5, 0.25, 4.0]
    assert parsed["strings"] == [b"x", b"", "é".encode()]
    assert parsed["empty"] == []
    assert parsed["replaced"].tolist() == [6]
    assert parsed["merged"].tolist() == [7, 8, 9]
    assert parsed["oneof"] == [b"z"]


def test_parse_example_large_and_negative_varints():
    values = [0, 2**63 - 1, -(2**63), -1, 2**35 + 17]
    record = plain_example({"v": values})
    assert parse_example(record)["v"].tolist() == values


@pytest.mark.parametrize(
    "record, match",
    [
        (b"\x0a\x05\x0a", "runs past"),
        (b"\x0a\x03\x0a\x01", "runs past"),
        (b"\x0a", "truncated varint"),
        (b"\x0b", "wire type 3"),
        (b"\x00\x00", "field number 0"),
        (plain_example({"v": [1]})[:-1] + b"\x80", "inside a varint"),
        (b"\x08" + b"\xff" * 11, "longer than 10"),
    ],
)
def test_parse_example_rejects_malformed(record, match):
    with pytest.raises(ValueError, match=match):
        parse_example(record)


def test_lockstep_and_record_by_record_paths_agree(monkeypatch):
    import mlm_pipeline.formats.tfrecord.decode as codec

    _, golden = load_golden("sample_text-wwm-d5")
    data = encode_examples(golden)
    fast = read_tfrecord_features(io.BytesIO(data))
    monkeypatch.setattr(codec, "_lockstep_spans", lambda *args: None)
    slow = read_tfrecord_features(io.BytesIO(data))
    for key, expected in golden.items():
        np.testing.assert_array_equal(fast[key], expected)
        np.testing.assert_array_equal(slow[key], expected)
        assert fast[key].dtype == slow[key].dtype == expected.dtype


def test_other_layouts_fall_back_to_record_by_record():
    _, golden = load_golden("sample_text-d10")
    rows = [{key: value[i].tolist() for key, value in golden.items()} for i in range(6)]
    keys = sorted(golden)
    records = [
        plain_example(rows[0]),
        plain_example(rows[1], order=keys[::-1]),  # TensorFlow's default order is not sorted
        plain_example(rows[2], unpacked=True),
        plain_example(rows[3]) + plain_varint(9 << 3 | 0) + plain_varint(5),  # unknown field
        plain_example(rows[4]),
        plain_example(rows[5], order=keys[1:] + keys[:1], unpacked=True),
    ]
    features = read_tfrecord_features(io.BytesIO(plain_tfrecord(records)))
    for key, expected in golden.items():
        np.testing.assert_array_equal(features[key], expected[:6], err_msg=key)


# every ValueError the readers raise on bad bytes says which of these it is
READER_ERROR = re.compile(
    r"(corrupt|truncated) TFRecord at byte offset \d+: |malformed tf\.train\.Example: |feature ['\"]"
)
_FUZZ_FILE = encode_tfrecord(random_batch(np.random.default_rng(5), 4, 12, 3, vocab=2**20), max_seq_length=12, max_predictions=3)


@settings(max_examples=150, deadline=None)
@given(st.lists(st.tuples(st.integers(0, len(_FUZZ_FILE) - 1), st.integers(1, 255)), min_size=1, max_size=3))
def test_corrupt_bytes_give_value_error_or_a_result(flips):
    bad = bytearray(_FUZZ_FILE)
    for pos, xor in flips:
        bad[pos] ^= xor
    for verify in (True, False):
        try:
            read_tfrecord_features(io.BytesIO(bytes(bad)), verify_crc=verify)
        except ValueError as exc:
            assert READER_ERROR.match(str(exc)), exc  # the reader's own diagnosis, not a stray error
    try:
        for record in iter_tfrecord_records(io.BytesIO(bytes(bad)), verify_crc=False):
            parse_example(record)
    except ValueError as exc:
        assert READER_ERROR.match(str(exc)), exc


def test_stacking_requires_fixed_lengths():
    data = plain_tfrecord([plain_example({"v": [1, 2]}), plain_example({"v": [3]})])
    with pytest.raises(ValueError, match="between 1 and 2 values"):
        read_tfrecord_features(io.BytesIO(data))
    data = plain_tfrecord([plain_example({"v": [1]}), plain_example({"w": [3]})])
    with pytest.raises(ValueError, match="missing from record 0|present in 1 of 2"):
        read_tfrecord_features(io.BytesIO(data))


# --------------------------------------------------------------------------------------------
# Real TensorFlow (CI installs tensorflow-cpu)


@pytest.mark.tensorflow
def test_tensorflow_reads_our_files_and_we_read_its(tmp_path):
    tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed (CI installs tensorflow-cpu)")
    settings_, golden = load_golden("sample_text-wwm-d5")
    max_seq, max_pred = settings_["max_seq_length"], settings_["max_predictions_per_seq"]
    batch = InstanceBatch.from_padded(golden)
    path = tmp_path / "ours.tfrecord"
    path.write_bytes(encode_tfrecord(batch, max_seq_length=max_seq, max_predictions=max_pred))
    spec = {
        key: tf.io.FixedLenFeature(
            [value.shape[1]], tf.float32 if key in FLOAT_FEATURES else tf.int64
        )
        for key, value in golden.items()
    }
    rows = [tf.io.parse_single_example(r, spec) for r in tf.data.TFRecordDataset(str(path))]
    assert len(rows) == len(batch)
    for key, expected in golden.items():
        np.testing.assert_array_equal(np.stack([r[key].numpy() for r in rows]), expected, err_msg=key)

    # And the other way: records serialized by TensorFlow itself, as create_pretraining_data.py does.
    # Our records are protobuf's deterministic serialization (map entries sorted by key).
    theirs = tmp_path / "theirs.tfrecord"
    ours = list(iter_tfrecord_records(io.BytesIO(path.read_bytes())))
    with tf.io.TFRecordWriter(str(theirs)) as writer:
        for i in range(len(batch)):
            feature = {}
            for key, value in golden.items():
                if key in FLOAT_FEATURES:
                    feature[key] = tf.train.Feature(float_list=tf.train.FloatList(value=value[i].tolist()))
                else:
                    feature[key] = tf.train.Feature(int64_list=tf.train.Int64List(value=value[i].tolist()))
            example = tf.train.Example(features=tf.train.Features(feature=feature))
            assert example.SerializeToString(deterministic=True) == ours[i]
            writer.write(example.SerializeToString())
    with open(theirs, "rb") as f:
        features = read_tfrecord_features(f)
    for key, expected in golden.items():
        np.testing.assert_array_equal(features[key], expected, err_msg=key)


# --------------------------------------------------------------------------------------------
# Benchmark: ours vs the plain encoder, same batch, same run


def benchmark(n: int = 10_000, max_seq: int = 128, max_pred: int = 20) -> dict:
    rng = np.random.default_rng(12345)
    lengths = np.full(n, max_seq)
    counts = np.full(n, max_pred)
    batch = InstanceBatch(
        input_ids=rng.integers(0, 30522, n * max_seq).astype(np.int32),
        segment_ids=(np.arange(max_seq)[None, :] >= rng.integers(1, max_seq, n)[:, None]).astype(np.int8).ravel(),
        offsets=lengths_to_offsets(lengths),
        masked_lm_positions=np.sort(np.argsort(rng.random((n, max_seq)), axis=1)[:, :max_pred], axis=1)
        .astype(np.int32)
        .ravel(),
        masked_lm_ids=rng.integers(0, 30522, n * max_pred).astype(np.int32),
        masked_offsets=lengths_to_offsets(counts),
        next_sentence_labels=rng.integers(0, 2, n).astype(np.int8),
    )

    def best_of(fn, repeat):
        times = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            result = fn()
            times.append(time.perf_counter() - t0)
        return min(times), result

    t_ours, ours = best_of(lambda: encode_tfrecord(batch, max_seq_length=max_seq, max_predictions=max_pred), 5)
    t_plain, plain = best_of(lambda: plain_encode(batch, max_seq, max_pred), 1)
    t_read, features = best_of(lambda: read_tfrecord_features(io.BytesIO(ours)), 3)
    mb = len(ours) / 1e6
    return {
        "records": n,
        "mb": mb,
        "identical": ours == plain,
        "read_ok": bool(np.array_equal(features["input_ids"], batch.padded(max_seq, max_pred)["input_ids"])),
        "ours_s": t_ours,
        "plain_s": t_plain,
        "read_s": t_read,
    }


if __name__ == "__main__":
    r = benchmark(int(sys.argv[1]) if len(sys.argv) > 1 else 10_000)
    print(f"{r['records']} records, {r['mb']:.2f} MB, byte-identical: {r['identical']}, read back ok: {r['read_ok']}")
    for name, key in (("encode_tfrecord", "ours_s"), ("plain encoder", "plain_s"), ("read_tfrecord_features", "read_s")):
        t = r[key]
        print(f"{name:24s} {t * 1e3:9.1f} ms {r['records'] / t:12,.0f} records/s {r['mb'] / t:9.1f} MB/s")
    print(f"speed-up of encode over plain: {r['plain_s'] / r['ours_s']:.0f}x")
