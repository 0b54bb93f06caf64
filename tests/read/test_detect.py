import gzip
import os

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from mlm_pipeline.errors import InputError
from mlm_pipeline.read import detect_format, sniff


def test_detect_sample_files(sample_dir):
    assert detect_format(str(sample_dir / "sample_text.txt")) == "text"
    assert detect_format(str(sample_dir / "wikitext2-train-1MB.txt")) == "text"
    assert detect_format(str(sample_dir / "wikiextractor-AA.txt")) == "wikiextractor"


@pytest.mark.parametrize(
    "name, content, fmt",
    [
        ("a.jsonl", b"not even json", "jsonl"),  # the extension decides
        ("a.ndjson", b"", "jsonl"),
        ("a.JSON.gz", b"", "jsonl"),
        ("a.parquet", b"", "parquet"),
        ("wiki_00", b"\n\n<doc id=\"1\" title=\"x\">\nx\n</doc>\n", "wikiextractor"),
        ("data", b'  \n{"text": "x"}\n', "jsonl"),
        ("data.txt", "\ufeff{\"text\": 1}\n".encode(), "jsonl"),  # BOM ignored
        ("data.txt", b"One sentence.\n\nAnother.\n", "text"),
        ("data.txt", b"", "text"),
        ("wiki.bz2", b'<doc id="1">\n', "wikiextractor"),
        # a first line that starts with { but is no JSON object: every line would be a bad record
        ("book.txt", b"{Editor's note: digitised in 2003.}\nThe first chapter.\n", "text"),
        ("data", b"{1: 2}\nx\n", "text"),
        ("data", b'["a list"]\n', "text"),
        # a first line longer than the detection head is judged by its first byte
        ("long", b'{"text": "' + b"a" * (70 << 10) + b'"}\n', "jsonl"),
    ],
)
def test_detect_format(tmp_path, name, content, fmt):
    path = tmp_path / name
    if name.endswith(".gz"):
        content = gzip.compress(content)
    if name.endswith(".bz2"):
        import bz2

        content = bz2.compress(content)
    path.write_bytes(content)
    assert detect_format(str(path)) == fmt


def test_detect_decompresses_only_the_head(tmp_path):
    path = tmp_path / "big.txt.zst"
    head = b'{"text": "x"}\n'
    # a 64 MB (decompressed) file: detection must not decompress all of it
    path.write_bytes(zstandard.ZstdCompressor().compress(head + b"a" * (64 << 20)))
    assert detect_format(str(path)) == "jsonl"
    assert sniff(str(path)) is None
    with pytest.raises(InputError, match="compressed Parquet"):
        detect_format(str(tmp_path / "x.parquet.gz"))


def test_sniff(tmp_path, sample_dir, data_dir):
    assert sniff(str(sample_dir / "wikiextractor-AA.txt")) is None
    assert sniff(str(data_dir / "hongloumeng-300KB.txt")) is None  # CJK text is text
    nul = tmp_path / "nul.txt"
    nul.write_bytes(b"text\x00text\n" * 10)
    assert "NUL bytes" in sniff(str(nul))
    stray = tmp_path / "stray.txt"
    stray.write_bytes(b"A text file .\n" * 20 + b"with one stray \x00 byte .\n" + b"More text .\n" * 20)
    assert sniff(str(stray)) is None  # the reader skips that one document as "binary"
    noise = tmp_path / "noise.txt"
    noise.write_bytes(bytes(range(1, 256)) * 40)
    assert "control characters or invalid UTF-8" in sniff(str(noise))
    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes("Café crème brûlée, naïve.\n".encode("latin-1") * 50)
    assert sniff(str(latin1)) is None  # a few invalid bytes: still text (decode policy applies)
    gz_text = tmp_path / "t.txt.gz"
    gz_text.write_bytes(gzip.compress((sample_dir / "sample_text.txt").read_bytes()))
    assert sniff(str(gz_text)) is None
    gz_bin = tmp_path / "b.txt.gz"
    gz_bin.write_bytes(gzip.compress(os.urandom(20000)))
    assert sniff(str(gz_bin)) is not None
    unnamed_gz = tmp_path / "t.txt"
    unnamed_gz.write_bytes(gzip.compress(b"x" * 1000))
    assert "gzip-compressed (name it *.gz)" in sniff(str(unnamed_gz))
    table = pa.table({"text": ["a", "b"]})
    pq.write_table(table, tmp_path / "t.parquet")
    pq.write_table(table, tmp_path / "parquet.txt")
    assert sniff(str(tmp_path / "t.parquet")) is None
    assert "Parquet (name it *.parquet)" in sniff(str(tmp_path / "parquet.txt"))
    empty = tmp_path / "empty.txt"
    empty.write_bytes(b"")
    assert sniff(str(empty)) is None
    with pytest.raises(InputError, match="no such file"):
        sniff(str(tmp_path / "missing.txt"))


@pytest.mark.parametrize(
    "content, fmt",
    [
        (b"\n" * 9000 + b'{"text": "x"}\n', "jsonl"),  # blank lines past the first 8 KiB
        (b'<doc id="1" title="' + b"x" * 9000 + b'">\nx\n</doc>\n', "wikiextractor"),  # a first line over 8 KiB
        (b" \n" * 4000 + b"<doc>" + b"y" * 70000 + b"\n", "wikiextractor"),  # ...cut at 64 KiB
        (b"\n" * 70000 + b'{"text": "x"}\n', "text"),  # nothing but blank lines in the first 64 KiB
    ],
)
def test_detection_looks_past_the_first_8_kib_when_the_first_line_needs_it(tmp_path, content, fmt):
    path = tmp_path / "data"
    path.write_bytes(content)
    assert detect_format(str(path)) == fmt
