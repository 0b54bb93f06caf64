"""Byte-range ownership: whatever the cuts, the pieces of a file give every document once."""

import io
import json
import os
import re

import pytest
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from mlm_pipeline.errors import InputError
from mlm_pipeline.read import Piece, ReadOptions, ranges
from mlm_pipeline.read.ranges import LineReader

from .helpers import read_cuts, read_pieces, read_split, read_whole, split_file

SETTINGS = settings(
    max_examples=25,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)


# --------------------------------------------------------------------------- inputs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory, sample_dir):
    """Real sample files (and JSONL made from them), format by name."""
    out = tmp_path_factory.mktemp("corpus")
    wikitext = (sample_dir / "wikitext2-train-1MB.txt").read_bytes()
    cut = wikitext.index(b"\n \n", 100_000) + 1  # first ~100 KB, cut at a line end
    (out / "wikitext-100KB.txt").write_bytes(wikitext[:cut])
    files = {
        "sample_text": (sample_dir / "sample_text.txt", "text"),
        "wikitext": (out / "wikitext-100KB.txt", "text"),
        "wikiextractor": (sample_dir / "wikiextractor-AA.txt", "wikiextractor"),
    }
    for name, (path, fmt) in list(files.items()):
        docs, _ = read_whole(path, fmt)
        jsonl = out / f"{name}.jsonl"
        with open(jsonl, "w", encoding="utf-8") as f:
            for i, d in enumerate(docs):
                f.write(json.dumps({"id": i, "text": "\n".join(d)}, ensure_ascii=False) + "\n")
                if i % 7 == 3:
                    f.write("not json\n\n")
        files[name + "_jsonl"] = (jsonl, "jsonl")
    # each file read whole once, the reference for its pieces
    return {name: (path, fmt, read_whole(path, fmt)) for name, (path, fmt) in files.items()}


def _same(whole, pieces, size):
    docs, stats = whole
    got, got_stats = pieces
    assert got == docs  # no loss, no duplicate, same order
    assert got_stats.to_dict() == stats.to_dict()
    assert got_stats.bytes_read == size


@pytest.mark.parametrize(
    "name",
    ["sample_text", "wikitext", "wikiextractor", "sample_text_jsonl", "wikitext_jsonl",
     "wikiextractor_jsonl"],
)
@SETTINGS
@given(data=st.data())
def test_sample_files_any_split_size(corpus, name, data):
    path, fmt, whole = corpus[name]
    size = os.path.getsize(path)
    # from very small pieces (at most ~150 of them, to stay fast) to larger than the file
    split = data.draw(st.integers(min_value=max(1, size // 150), max_value=size + 10))
    _same(whole, read_split(path, fmt, split), size)


@pytest.mark.parametrize("name", ["sample_text", "wikiextractor", "sample_text_jsonl"])
@SETTINGS
@given(data=st.data())
def test_sample_files_arbitrary_cuts(corpus, name, data):
    path, fmt, whole = corpus[name]
    size = os.path.getsize(path)
    cuts = data.draw(st.lists(st.integers(1, size - 1), max_size=40))
    _same(whole, read_cuts(path, fmt, cuts), size)


def test_sample_text_every_split_size(corpus):
    path, fmt, whole = corpus["sample_text"]
    size = os.path.getsize(path)
    for split in (*range(1, 40), *range(40, size + 3, 97)):
        _same(whole, read_split(path, fmt, split), size)


# --------------------------------------------------------------------------- generated files

TEXT_BITS = [b"a", b"bc. d", b" ", b"\t", b"\r", b"\n", b"\n", b"\n", b"\xc3\xa9", b"\xe3\x80\x80",
             b"\xff", b"\x00", b"long-long-long", b"\xef\xbb\xbf"]
WIKI_BITS = TEXT_BITS + [b'<doc id="1" title="a">\n', b'<doc id="2" title="T">\nT\n', b"</doc>\n",
                         b"<doc", b"\n</doc>"]
JSONL_BITS = [b'{"text": "a. B c"}\n', b'{"text": ', b'"x\\ny"}', b"\n", b"[1]\n", b"\xff", b" ",
              b'{"text": "\\u0000"}', b'{"t": 1}\n', b"\x00", b"0123456789abcdef", b"\r\n"]
OPTIONS = ReadOptions(max_line_bytes=12, max_document_bytes=30)


def _generated(tmp_path, data, bits, name):
    raw = b"".join(data.draw(st.lists(st.sampled_from(bits), max_size=60)))
    path = tmp_path / name
    path.write_bytes(raw)
    return path, len(raw)


@pytest.mark.parametrize(
    "fmt, bits", [("text", TEXT_BITS), ("wikiextractor", WIKI_BITS), ("jsonl", JSONL_BITS)]
)
@settings(SETTINGS, max_examples=150)
@given(data=st.data())
def test_generated_files_any_cuts_any_chunking(tmp_path, fmt, bits, data):
    """Small files full of edge cases (blank runs, CR, BOM, NUL, invalid UTF-8, over-long
    lines, missing final newline), cut anywhere and read with tiny chunks."""
    path, size = _generated(tmp_path, data, bits, f"gen.{fmt}")
    cuts = data.draw(st.lists(st.integers(1, max(1, size - 1)), max_size=12))
    chunk = data.draw(st.integers(1, 16))
    with pytest.MonkeyPatch.context() as mp:
        mp.setattr(ranges, "CHUNK_BYTES", chunk)
        whole = read_whole(path, fmt, OPTIONS)
        _same(whole, read_cuts(path, fmt, cuts, OPTIONS), size)
    # the chunk size does not change what is read
    _same(read_whole(path, fmt, OPTIONS), whole, size)


@pytest.mark.parametrize(
    "raw, docs",
    [
        (b"a\nb", [["a", "b"]]),  # no final newline
        (b"\n\n\na\n\nb\n", [["a"], ["b"]]),  # leading blank lines
        (b"a\r\nb\r\n\r\nc\r\n", [["a", "b"], ["c"]]),  # CRLF
        (b"aaaa\n\n\n\n\nbbbb\n \n \ncccc", [["aaaa"], ["bbbb"], ["cccc"]]),  # blank runs
        (b"x\n\ny\n\n", [["x"], ["y"]]),
        (b"a\rb\r\rc\r", [["a", "b"], ["c"]]),  # lone CR line ends (old Mac files)
        (b"a\r\nb\r\r\nc\rd", [["a", "b"], ["c", "d"]]),  # CR, CRLF and LF mixed
    ],
)
def test_text_edge_cases_every_cut(tmp_path, raw, docs):
    """Every split size and every pair of cut points (so cuts fall on, before and after each
    blank line of a run)."""
    path = tmp_path / "edge.txt"
    path.write_bytes(raw)
    whole = read_whole(path, "text")
    assert whole[0] == docs
    for split in range(1, len(raw) + 2):
        _same(whole, read_split(path, "text", split), len(raw))
    for i in range(1, len(raw)):
        for j in range(i, len(raw)):
            _same(whole, read_cuts(path, "text", [i, j]), len(raw))


def test_owner_of_a_document_is_the_range_of_its_preceding_blank_line(tmp_path):
    raw = b"first\n\nsecond\n\n\nthird\n"
    #       0     6 7       14 15 16
    path = tmp_path / "own.txt"
    path.write_bytes(raw)
    opts = ReadOptions()

    def docs(s, e):
        return read_cuts_range(path, s, e, opts)

    assert docs(0, 6) == [["first"]]  # no blank line starts in [0, 6): only the first document
    assert docs(6, 7) == [["second"]]  # the blank line at 6 precedes "second"
    assert docs(0, 7) == [["first"], ["second"]]
    assert docs(7, 15) == []  # the blank at 14 is not the one just before "third"
    assert docs(15, 16) == [["third"]]
    assert docs(16, None) == []


def read_cuts_range(path, s, e, opts):
    from mlm_pipeline.read import iter_documents
    from mlm_pipeline.stats import ReadStats

    return list(iter_documents(Piece(str(path), "text", s, e), opts, ReadStats()))


# --------------------------------------------------------------------------- LineReader


@settings(max_examples=300, deadline=None)
@given(
    raw=st.lists(st.sampled_from([b"a", b"bcd", b" ", b"\n", b"\r", b"\xff"]), max_size=40).map(
        b"".join
    ),
    chunk=st.integers(1, 9),
    limit=st.integers(1, 12),
    start=st.integers(0, 50),
)
def test_line_reader_matches_split(raw, chunk, limit, start):
    assume(start <= len(raw))
    expected, pos = [], 0
    for line in re.sub(rb"\r(?!\n)", b"\n", raw).split(b"\n"):  # a lone CR ends a line too
        if pos >= start and (pos < len(raw)):
            if len(line) > limit:
                expected.append((pos, line[:64] if line.strip() else b"", True))
            else:
                expected.append((pos, line, False))
        pos += len(line) + 1
    stream = io.BytesIO(raw)
    if start > 0:
        stream.seek(start - 1)
    reader = LineReader(stream, start, max_line_bytes=limit, chunk_bytes=chunk)
    assert list(reader) == expected
    assert reader.pos == len(raw) or (not expected and start == len(raw))


def test_line_reader_bom_and_long_line_head():
    raw = b"\xef\xbb\xbfab\n" + b" " * 100 + b"<doc x" + b"y" * 100 + b"\nz"
    got = list(LineReader(io.BytesIO(raw), 0, max_line_bytes=50, chunk_bytes=7))
    assert got == [(0, b"ab", False), (6, b" " * 64, True), (213, b"z", False)]


# --------------------------------------------------------------------------- split_file


def test_split_file_nominal_ranges():
    assert split_file("f.txt", "text", 10, 4) == [
        Piece("f.txt", "text", 0, 4),
        Piece("f.txt", "text", 4, 8),
        Piece("f.txt", "text", 8, None),
    ]
    assert split_file("f.txt", "jsonl", 8, 4) == [
        Piece("f.txt", "jsonl", 0, 4),
        Piece("f.txt", "jsonl", 4, None),
    ]
    assert split_file("f.txt", "text", 0, 4) == [Piece("f.txt", "text", 0, None)]
    assert split_file("f.txt.zst", "text", 10**9, 4) == [
        Piece("f.txt.zst", "text", 0, None, "zstd")
    ]
    with pytest.raises(ValueError, match="split_bytes"):
        split_file("f.txt", "text", 10, 0)
    with pytest.raises(ValueError, match="unknown format"):
        split_file("f.txt", "csv", 10, 4)
    with pytest.raises(InputError, match="compressed Parquet"):
        split_file("f.parquet.gz", "parquet", 10, 4)


def count_reads(monkeypatch) -> list[int]:
    """The sizes of the reads from every stream opened for a piece from now on."""
    reads: list[int] = []
    real_open = ranges.open_decompressed

    def counting_open(url, compression):
        stream = real_open(url, compression)
        real_read = stream.read

        def read(n=-1):
            data = real_read(n)
            reads.append(len(data))
            return data

        stream.read = read
        return stream

    monkeypatch.setattr(ranges, "open_decompressed", counting_open)
    return reads


def test_pieces_do_not_read_much_past_their_end(tmp_path, monkeypatch):
    """A small range reads a little past its end to finish its last document, not the file."""
    path = tmp_path / "many.txt"
    records = [b"doc %d line\n\n" % i for i in range(100_000)]  # ~1.5 MB
    path.write_bytes(b"".join(records))
    expected, pos = [], 0  # documents whose preceding blank line starts in [500_000, 500_100)
    for i, rec in enumerate(records):
        blank = pos + len(rec) - 1
        if 500_000 <= blank < 500_100 and i + 1 < len(records):
            expected.append([records[i + 1].decode().strip()])
        pos += len(rec)
    reads = count_reads(monkeypatch)
    docs = read_cuts_range(path, 500_000, 500_100, ReadOptions())
    assert docs == expected and len(expected) == 6
    assert sum(reads) <= 128 << 10


def test_a_range_of_whole_chunks_reads_only_a_little_past_its_end(tmp_path, monkeypatch):
    """A 1 MiB range (read in 1 MiB chunks) reads up to its end and a tail of ``TAIL_BYTES``, not
    a whole further chunk whose lines past the end would be split and decoded for nothing; the
    documents are those of the whole file's reading that start in the range."""
    path = tmp_path / "many.txt"
    path.write_bytes(b"".join(b"document %d, one line of it\n\n" % i for i in range(100_000)))  # ~3 MB
    start, end = 1 << 19, (1 << 19) + (1 << 20)
    whole, _ = read_whole(path, "text")
    reads = count_reads(monkeypatch)
    docs = read_cuts_range(path, start, end, ReadOptions())
    first = whole.index(docs[0])
    assert docs == whole[first : first + len(docs)] and 30_000 < len(docs) < 40_000
    assert end - start < sum(reads) <= end - start + 2 * ranges.TAIL_BYTES, reads


def test_a_file_without_boundaries_is_read_once_not_once_a_piece(tmp_path, monkeypatch):
    """A text file with no blank line is one document, owned by the first piece. The others own
    nothing and stop at their own end (they read on to the file's end, each); the extents that
    fingerprint a run's inputs, found last piece to first, read the file once in all, and are
    those each piece's own search finds."""
    from mlm_pipeline.plan import Plan, Task
    from mlm_pipeline.read import get_input_format
    from mlm_pipeline.run.state import input_fingerprints

    path = tmp_path / "noblank.txt"
    path.write_bytes(b"".join(b"sentence %d of a corpus without document breaks.\n" % i for i in range(60_000)))
    size = path.stat().st_size  # ~3 MB
    split = 64 << 10
    pieces = split_file(path, "text", size, split)
    assert len(pieces) > 40
    whole, _ = read_whole(path, "text")
    reads = count_reads(monkeypatch)
    docs, stats = read_pieces(pieces)
    assert docs == whole and len(docs) == 1 and stats.bytes_read == size
    assert sum(reads) < 3 * size, sum(reads)  # piece 0 reads the file; each other one a little past its end
    fmt = get_input_format("text")
    alone = {p: fmt.read_extent(p, ReadOptions()) for p in pieces}
    assert all(alone[p] == (max(0, p.start - 1), None) for p in pieces)  # no boundary after any piece
    reads.clear()
    tasks = [Task(f"{i:05d}", i, (p,), (p.end or size) - p.start) for i, p in enumerate(pieces)]
    extents: dict = {}
    input_fingerprints(Plan(tasks=tasks, files=[]), options=ReadOptions(), extents=extents)
    assert extents == {p: (*alone[p], False) for p in pieces}
    assert sum(reads) < 2 * size, sum(reads)  # (once a piece: about 21 times the file)

    with_blank = tmp_path / "one-blank.txt"  # a boundary far past most pieces' ends: they all stop there
    data = path.read_bytes()
    cut = data.index(b"\n", size - 5000) + 1
    with_blank.write_bytes(data[:cut] + b"\n" + data[cut:])
    pieces = split_file(with_blank, "text", size + 1, split)
    tasks = [Task(f"{i:05d}", i, (p,), (p.end or size) - p.start) for i, p in enumerate(pieces)]
    extents = {}
    input_fingerprints(Plan(tasks=tasks, files=[]), options=ReadOptions(), extents=extents)
    assert extents == {p: (*fmt.read_extent(p, ReadOptions()), False) for p in pieces}
    assert {e[1] for p, e in extents.items() if p.end is not None and p.end <= cut} == {cut + 1}


def test_non_local_filesystem_through_fsspec(corpus):
    """Files are opened through fsspec: an in-memory filesystem reads like local disk."""
    import fsspec

    from mlm_pipeline.read import detect_format, iter_documents
    from mlm_pipeline.stats import ReadStats

    path, fmt, (docs, stats) = corpus["wikiextractor"]
    url = "memory://corpus/wiki_00"
    mem = fsspec.filesystem("memory")
    mem.pipe(url, path.read_bytes())
    try:
        assert detect_format(url) == "wikiextractor"
        got_stats = ReadStats()
        got = [
            d
            for p in split_file(url, fmt, mem.size(url), 100_000)
            for d in iter_documents(p, ReadOptions(), got_stats)
        ]
        assert got == docs
        assert got_stats.to_dict() == stats.to_dict()
    finally:
        mem.rm(url)


def test_lone_cr_line_ends_are_counted_once_over_any_split(tmp_path):
    from mlm_pipeline.read import ReadOptions as Options

    raw = b"one\rtwo\r\rthree\r\nfour\n\nfive\rsix\r"
    path = tmp_path / "mac.txt"
    path.write_bytes(raw)
    docs, stats = read_whole(path, "text")
    assert docs == [["one", "two"], ["three", "four"], ["five", "six"]]
    assert stats.lone_cr_line_ends == 5 and stats.to_dict()["lone_cr_line_ends"] == 5
    for split in range(1, len(raw) + 1):
        got, got_stats = read_split(path, "text", split, Options())
        assert got == docs and got_stats.lone_cr_line_ends == 5, split


def test_files_without_lone_cr_keep_their_totals_keys(tmp_path):
    path = tmp_path / "unix.txt"
    path.write_bytes(b"a\r\nb\n\nc\n")
    assert "lone_cr_line_ends" not in read_whole(path, "text")[1].to_dict()
