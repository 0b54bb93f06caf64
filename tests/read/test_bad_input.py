import bz2
import gzip
import io
import json
import lzma
import random
import time
import tracemalloc

import pytest
import zstandard
from hypothesis import given, settings
from hypothesis import strategies as st

from mlm_pipeline.errors import InputError
from mlm_pipeline.read import Piece, ReadOptions
from mlm_pipeline.read.compression import ZstdFrameCheck

from .helpers import read_whole, split_file

MB = 1 << 20

# --------------------------------------------------------------------------- invalid UTF-8

TEXT = b"good line\n\nbad \xff line\nsecond\n\nlast\n"
WIKI = (
    b'<doc id="1" title="T">\nT\nGood.\n</doc>\n'
    b'<doc id="2" title="U">\nU\nBad \xfe here.\n</doc>\n'
)
JSONL = b'{"text": "Good."}\n{"text": "Bad \xc3 here."}\n'


@pytest.mark.parametrize(
    "fmt, raw, replaced_doc, offset",
    [
        ("text", TEXT, ["bad \ufffd line", "second"], TEXT.index(b"\xff")),
        ("wikiextractor", WIKI, ["Bad \ufffd here."], WIKI.index(b"\xfe")),
        ("jsonl", JSONL, ["Bad \ufffd here."], JSONL.index(b"\xc3")),
    ],
)
def test_invalid_utf8_policies(tmp_path, fmt, raw, replaced_doc, offset):
    path = tmp_path / f"bad.{fmt}"
    path.write_bytes(raw)
    docs, stats = read_whole(path, fmt, ReadOptions(on_decode_error="replace"))
    assert replaced_doc in docs
    assert len(docs) == (3 if fmt == "text" else 2)
    assert stats.documents_with_replaced_bytes == 1
    assert not stats.documents_skipped

    docs, stats = read_whole(path, fmt, ReadOptions(on_decode_error="skip"))
    assert replaced_doc not in docs
    assert len(docs) == (2 if fmt == "text" else 1)
    assert stats.documents_skipped == {"invalid_utf8": 1}
    assert stats.documents_with_replaced_bytes == 0

    with pytest.raises(InputError) as err:
        read_whole(path, fmt, ReadOptions(on_decode_error="fail"))
    assert str(path) in str(err.value)
    assert f"byte offset {offset}" in str(err.value)


def test_fail_offset_in_a_compressed_file_says_so(tmp_path):
    path = tmp_path / "bad.txt.gz"
    path.write_bytes(gzip.compress(TEXT))
    with pytest.raises(InputError, match="byte offset 15 of the decompressed stream"):
        read_whole(path, "text", ReadOptions(on_decode_error="fail"), compression="gzip")


# --------------------------------------------------------------------------- NUL, empty


def test_nul_bytes_skip_the_document_as_binary(tmp_path):
    path = tmp_path / "nul.txt"
    path.write_bytes(b"ok one\n\nhas a \x00 NUL\nmore\n\nok two\n")
    docs, stats = read_whole(path, "text")
    assert docs == [["ok one"], ["ok two"]]
    assert stats.documents_skipped == {"binary": 1}
    wiki = tmp_path / "nul.wiki"
    wiki.write_bytes(
        b'<doc id="1" title="A">\nx\x00y\n</doc>\n<doc id="2" title="B">\nFine.\n</doc>\n'
    )
    docs, stats = read_whole(wiki, "wikiextractor")
    assert docs == [["Fine."]]
    assert stats.documents_skipped == {"binary": 1}


@pytest.mark.parametrize("fmt", ["text", "wikiextractor", "jsonl"])
@pytest.mark.parametrize("suffix", ["", ".gz", ".bz2", ".zst", ".xz"])
def test_empty_file_yields_nothing(tmp_path, fmt, suffix):
    path = tmp_path / f"empty.txt{suffix}"
    path.write_bytes(b"")  # zero bytes, even where the extension names a compression
    (piece,) = split_file(str(path), fmt, 0, 1000)
    docs, stats = read_whole(path, fmt, compression=piece.compression)
    assert docs == []
    assert stats.to_dict() == {
        "documents_read": 0,
        "sentences": 0,
        "bytes_read": 0,
        "documents_skipped": {},
        "documents_with_replaced_bytes": 0,
    }


def test_empty_and_whitespace_only_documents(tmp_path):
    text = tmp_path / "ws.txt"
    text.write_bytes(b"\n \n\t\r\n" + "\u3000\n".encode() + b"real\n \n")
    docs, stats = read_whole(text, "text")
    assert docs == [["real"]]  # whitespace-only lines are separators, not documents
    assert not stats.documents_skipped
    jsonl = tmp_path / "ws.jsonl"
    jsonl.write_text(
        '{"text": ""}\n{"text": " \\n\\r\\n\\t"}\n{"text": "\\u3000"}\n{"text": "x"}\n'
    )
    docs, stats = read_whole(jsonl, "jsonl")
    assert docs == [["x"]]
    assert stats.documents_skipped == {"empty": 3}
    wiki = tmp_path / "ws.wiki"
    wiki.write_text('<doc id="1" title="A">\n</doc>\n<doc id="2" title="B">\n  \n\t\n</doc>\n')
    docs, stats = read_whole(wiki, "wikiextractor")
    assert docs == []
    assert stats.documents_skipped == {"empty": 2}


# --------------------------------------------------------------------------- giant lines


def _peak_while(fn):
    tracemalloc.start()
    try:
        result = fn()
        return result, tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()


@pytest.mark.parametrize("fmt", ["text", "jsonl", "wikiextractor"])
def test_giant_line_is_skipped_in_bounded_memory(tmp_path, fmt):
    giant = b"x" * (5 * MB)
    if fmt == "text":
        raw = b"before\n\nhead\n" + giant + b"\ntail\n\nafter\n"
        expected = [["before"], ["after"]]
    elif fmt == "jsonl":
        raw = b'{"text": "before"}\n{"text": "' + giant + b'"}\n{"text": "after"}\n'
        expected = [["before"], ["after"]]
    else:
        raw = (
            b'<doc id="1" title="A">\nbefore\n</doc>\n<doc id="2" title="B">\nhead\n'
            + giant
            + b'\n</doc>\n<doc id="3" title="C">\nafter\n</doc>\n'
        )
        expected = [["before"], ["after"]]
    path = tmp_path / f"giant.{fmt}"
    path.write_bytes(raw)
    del giant, raw
    (docs, stats), peak = _peak_while(
        lambda: read_whole(path, fmt, ReadOptions(max_line_bytes=MB))
    )
    assert docs == expected
    assert stats.documents_skipped == {"line_too_long": 1}
    assert stats.bytes_read == path.stat().st_size
    assert peak < 4.5 * MB  # the 5 MB line was never held whole


def test_100_mb_line_streams_through(tmp_path):
    path = tmp_path / "huge.txt"
    with open(path, "wb") as f:
        f.write(b"first doc\n\n")
        block = b"y" * (4 * MB)
        for _ in range(25):
            f.write(block)
        f.write(b"\n\nlast doc\n")
    del block
    start = time.perf_counter()
    (docs, stats), peak = _peak_while(lambda: read_whole(path, "text"))
    elapsed = time.perf_counter() - start
    assert docs == [["first doc"], ["last doc"]]
    assert stats.documents_skipped == {"line_too_long": 1}
    assert peak < 8 * MB
    assert elapsed < 3.0


# --------------------------------------------------------------------------- compression

COMPRESSORS = {
    ".gz": gzip.compress,
    ".bz2": bz2.compress,
    ".xz": lzma.compress,
    ".zst": lambda data: zstandard.ZstdCompressor().compress(data),
}


@pytest.fixture(scope="module")
def plain_files(tmp_path_factory, sample_dir):
    out = tmp_path_factory.mktemp("plain")
    wiki = sample_dir / "wikiextractor-AA.txt"
    jsonl = out / "sample.jsonl"
    docs, _ = read_whole(sample_dir / "sample_text.txt", "text")
    jsonl.write_text("".join(json.dumps({"text": " ".join(d)}) + "\n" for d in docs))
    return {"text": sample_dir / "sample_text.txt", "wikiextractor": wiki, "jsonl": jsonl}


@pytest.mark.parametrize("ext", sorted(COMPRESSORS))
@pytest.mark.parametrize("fmt", ["text", "wikiextractor", "jsonl"])
def test_compressed_round_trip(tmp_path, plain_files, fmt, ext):
    plain = plain_files[fmt]
    path = tmp_path / (plain.name + ext)
    path.write_bytes(COMPRESSORS[ext](plain.read_bytes()))
    pieces = split_file(str(path), fmt, path.stat().st_size, 100)  # small split: still one piece
    assert len(pieces) == 1 and pieces[0].compression is not None
    assert pieces[0].start == 0 and pieces[0].end is None
    docs, stats = read_whole(path, fmt, compression=pieces[0].compression)
    expected, expected_stats = read_whole(plain, fmt)
    assert docs == expected and len(docs) > 2
    assert stats.sentences == expected_stats.sentences
    assert stats.bytes_read == path.stat().st_size  # compressed bytes consumed


def test_multi_frame_zstd_and_multi_member_gzip(tmp_path, plain_files):
    raw = plain_files["text"].read_bytes()
    half = raw.index(b"\n\n") + 2
    expected, _ = read_whole(plain_files["text"], "text")
    zst = tmp_path / "two.txt.zst"
    cctx = zstandard.ZstdCompressor()
    zst.write_bytes(cctx.compress(raw[:half]) + cctx.compress(raw[half:]))
    assert read_whole(zst, "text", compression="zstd")[0] == expected
    gz = tmp_path / "two.txt.gz"
    gz.write_bytes(gzip.compress(raw[:half]) + gzip.compress(raw[half:]))
    assert read_whole(gz, "text", compression="gzip")[0] == expected


@pytest.mark.parametrize("ext", sorted(COMPRESSORS))
def test_corrupt_compressed_file_is_an_input_error(tmp_path, plain_files, ext):
    data = COMPRESSORS[ext](plain_files["text"].read_bytes())
    path = tmp_path / ("cut.txt" + ext)
    path.write_bytes(data[: len(data) // 2])  # truncated
    compression = split_file(str(path), "text", 1, 1)[0].compression
    with pytest.raises(InputError, match=rf"cut\.txt\{ext}: corrupt or truncated"):
        read_whole(path, "text", compression=compression)


def test_missing_file_and_invalid_pieces(tmp_path):
    with pytest.raises(InputError, match="no such file"):
        read_whole(tmp_path / "nope.txt", "text")
    with pytest.raises(ValueError, match="unknown format"):
        read_whole(tmp_path / "x", "csv")
    with pytest.raises(ValueError, match="read whole"):
        read_whole(tmp_path / "x.gz", "text", start=10, compression="gzip")
    with pytest.raises(ValueError, match="on_decode_error"):
        ReadOptions(on_decode_error="ignore")
    with pytest.raises(ValueError, match="max_line_bytes"):
        ReadOptions(max_line_bytes=0)
    assert Piece("a", "text", 0, None).describe() == "a [bytes 0:end]"


@settings(max_examples=60, deadline=None)
@given(
    frames=st.lists(
        st.tuples(
            st.sampled_from(["text", "rle", "random", "empty", "skippable"]),
            st.booleans(),  # checksum
            st.booleans(),  # content size in the header
            st.integers(1, 300_000),  # size
        ),
        min_size=1,
        max_size=3,
    ),
    data=st.data(),
)
def test_zstd_frame_check_accepts_frame_ends_only(frames, data):
    """Whole zstd data (any frame options, several frames, skippable frames) is accepted;
    cut anywhere but at a frame end it is an error, as for the other compressions."""
    rng = random.Random(0)
    blobs, plain = [], b""
    for kind, checksum, content_size, size in frames:
        if kind == "skippable":
            payload = b"s" * (size % 100)
            header = (0x184D2A53).to_bytes(4, "little") + len(payload).to_bytes(4, "little")
            blobs.append(header + payload)
            continue
        raw = {
            "text": (b"some text line.\n" * (size // 16 + 1))[:size],
            "rle": b"\n" * size,
            "random": rng.randbytes(size),
            "empty": b"",
        }[kind]
        cctx = zstandard.ZstdCompressor(write_checksum=checksum, write_content_size=content_size)
        blobs.append(cctx.compress(raw))
        plain += raw
    whole = b"".join(blobs)
    ends = {sum(map(len, blobs[: i + 1])) for i in range(len(blobs))}
    check = ZstdFrameCheck(io.BytesIO(whole))
    assert check.read(7) + check.read(-1) == whole
    check.finish()  # no error
    cut = data.draw(st.integers(0, len(whole)))
    check = ZstdFrameCheck(io.BytesIO(whole[:cut]))
    check.read(-1)
    if cut == 0 or cut in ends:
        check.finish()
    else:
        with pytest.raises(EOFError):
            check.finish()


def test_truncated_zstd_inside_a_frame_is_reported(tmp_path):
    plain = b"A line of text.\n" * 20_000
    data = zstandard.ZstdCompressor(write_checksum=False).compress(plain)
    path = tmp_path / "cut.txt.zst"
    path.write_bytes(data[:-1])  # python-zstandard alone would return a shorter text, no error
    with zstandard.ZstdDecompressor().stream_reader(io.BytesIO(data[:-1])) as r:
        assert len(r.read()) < len(plain)
    with pytest.raises(InputError, match="ends inside a frame"):
        read_whole(path, "text", compression="zstd")
