"""A new input format from this file alone: registered, detected, planned and run by ``prepare``.

The format, "one document per line, tab-separated sentences" (``.tsv``), is built from the
shared pieces every line-based format uses (``byte_ranges``, ``OwnedLines``, ``decode``). The
same documents written in Google's text format must give byte-identical shards: the format
changes how documents are read, nothing downstream.
"""

from __future__ import annotations

from typing import Iterator

import pytest

from conftest import VOCAB, WIKITEXT
from mlm_pipeline.config import build_config
from mlm_pipeline.errors import ConfigError
from mlm_pipeline.read import (
    InputFormat,
    InputSample,
    Piece,
    ReadOptions,
    detect_format,
    input_format_names,
    register_input_format,
    unregister_input_format,
)
from mlm_pipeline.read.ranges import OwnedLines, byte_ranges, decode, every_line
from mlm_pipeline.stats import ReadStats

from .helpers import read_split, read_whole


class TabSeparatedFormat(InputFormat):
    """tsv-docs: one document per line, its sentences separated by tabs; detected by a ``.tsv``
    name. Blank lines are not documents."""

    name = "tsv-docs"

    def claims_name(self, sample: InputSample) -> bool:
        return sample.extension == ".tsv"

    def split(self, url: str, size: int, split_bytes: int, options: ReadOptions) -> list[Piece]:
        return byte_ranges(url, self.name, size, split_bytes)

    def read(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
        with OwnedLines(piece, options.max_line_bytes, every_line, stats) as owned:
            for start, line, too_long in owned:
                if owned.ends_at(start):
                    return
                if too_long:
                    if line:
                        stats.skip("line_too_long")
                    continue
                text, replaced = decode(
                    line, policy=options.on_decode_error, url=piece.url, offset=start,
                    compressed=piece.compression is not None,
                )
                if text is None:
                    stats.skip("invalid_utf8")
                    continue
                sentences = [s for s in (part.strip() for part in text.split("\t")) if s]
                if not sentences:
                    continue
                stats.documents_read += 1
                stats.sentences += len(sentences)
                stats.documents_with_replaced_bytes += replaced
                yield sentences


@pytest.fixture
def tsv_format():
    fmt = register_input_format(TabSeparatedFormat())
    try:
        yield fmt
    finally:
        unregister_input_format(fmt.name)


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """The first ~200 KB of WikiText-2 in Google's text format, and the same documents as TSV."""
    out = tmp_path_factory.mktemp("tsv")
    raw = WIKITEXT.read_bytes()
    text = out / "wiki.txt"
    text.write_bytes(raw[: raw.index(b"\n \n", 200_000) + 1])
    docs, _ = read_whole(text, "text")
    tsv = out / "wiki.tsv"
    tsv.write_text("".join("\t".join(d) + "\n" for d in docs), encoding="utf-8")
    return text, tsv, docs


def test_registered_format_is_detected_and_reads_every_document_once(tsv_format, corpus, tmp_path):
    text, tsv, docs = corpus
    assert "tsv-docs" in input_format_names()
    assert detect_format(str(tsv)) == "tsv-docs"
    assert detect_format(str(text)) == "text"  # the other formats are unchanged
    gz = tmp_path / "wiki.TSV.gz"  # a name claim sees through a compression extension
    gz.write_bytes(b"")
    assert detect_format(str(gz)) == "tsv-docs"
    whole, stats = read_whole(tsv, "tsv-docs")
    assert whole == docs and stats.documents_read == len(docs) > 100
    assert stats.bytes_read == tsv.stat().st_size
    pieces, piece_stats = read_split(tsv, "tsv-docs", 5_000)  # ~40 byte ranges
    assert pieces == docs
    assert piece_stats.to_dict() == stats.to_dict()


def test_a_name_claim_beats_a_content_claim_which_beats_the_fallback(tsv_format, tmp_path):
    class HeadedTsv(TabSeparatedFormat):
        """tsv-headed: TSV documents after a ``#tsv`` first line (detected by content only)."""

        name = "tsv-headed"

        def claims_name(self, sample: InputSample) -> bool:
            return False

        def claims_head(self, sample: InputSample) -> bool:
            return sample.first_line() == b"#tsv"

    fmt = register_input_format(HeadedTsv())
    try:
        for name, content, expected in [
            ("a.txt", b"\n#tsv\nOne.\tTwo.\n", "tsv-headed"),  # content, after blank lines
            ("a.tsv", b"#tsv\nOne.\tTwo.\n", "tsv-docs"),  # the name decides first
            ("b.txt", b"One.\tTwo.\n", "text"),  # nobody claims it: the fallback
        ]:
            (tmp_path / name).write_bytes(content)
            assert detect_format(str(tmp_path / name)) == expected, name
    finally:
        unregister_input_format(fmt.name)


def _prepare(inputs, out, **settings) -> dict:
    from mlm_pipeline.pipeline import run_prepare

    config = build_config({
        "inputs": [str(p) for p in inputs], "output": str(out), "tokenizer": str(VOCAB),
        "workers": 1, "progress": False, "dupe_factor": 2, **settings,
    })
    return run_prepare(config, show_progress=False)


def _digests(manifest: dict) -> list[tuple[str, str, int]]:
    return [(s["path"], s["sha256"], s["instances"]) for s in manifest["shards"]]


def test_prepare_uses_a_registered_format_detected_or_named(tsv_format, corpus, tmp_path):
    text, tsv, docs = corpus
    as_text = _prepare([text], tmp_path / "text")
    detected = _prepare([tsv], tmp_path / "detected")
    assert detected["inputs"] == [
        {"path": str(tsv), "bytes": tsv.stat().st_size, "format": "tsv-docs", "pieces": 1}
    ]
    assert detected["totals"]["documents_read"] == len(docs)
    # same documents, same shards, byte for byte
    assert _digests(detected) == _digests(as_text) and len(detected["shards"]) >= 1
    # named: a file whose name claims nothing is read as the format the config names
    renamed = tmp_path / "wiki.data"
    renamed.write_bytes(tsv.read_bytes())
    named = _prepare([renamed], tmp_path / "named", input_format="tsv-docs")
    assert named["inputs"][0]["format"] == "tsv-docs"
    assert _digests(named) == _digests(as_text)


def test_config_accepts_exactly_the_registered_formats(tmp_path):
    settings = {"inputs": ["x"], "output": str(tmp_path), "tokenizer": str(VOCAB)}
    for name in ("auto", *input_format_names()):
        assert build_config({**settings, "input_format": name}).input_format == name
    with pytest.raises(ConfigError, match="unknown input format 'tsv-docs'"):
        build_config({**settings, "input_format": "tsv-docs"})
    fmt = register_input_format(TabSeparatedFormat())
    try:
        assert build_config({**settings, "input_format": "tsv-docs"}).input_format == "tsv-docs"
    finally:
        unregister_input_format(fmt.name)


def test_registry_refuses_a_taken_name_a_bad_name_and_a_second_fallback(tsv_format):
    with pytest.raises(ValueError, match="already registered"):
        register_input_format(TabSeparatedFormat())

    class Bad(TabSeparatedFormat):
        name = "auto"

    with pytest.raises(ValueError, match="invalid input format name"):
        register_input_format(Bad())

    class AnotherFallback(TabSeparatedFormat):
        name = "other"
        fallback = True

    with pytest.raises(ValueError, match="already a fallback"):
        register_input_format(AnotherFallback())
    assert "other" not in input_format_names()
