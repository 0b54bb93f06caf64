"""JSON lines: one JSON object per line, the document text in ``options.text_field``.

The text is split into paragraphs at line boundaries, then into sentences
(``sentences.split_sentences``). Blank lines are not records. A line that is not a JSON object,
or whose text field is missing or not a string, is skipped as ``bad_record``; a text that is
empty or whitespace only as ``empty``; a text with NUL characters (raw bytes or ``\\u0000``) as
``binary``; an over-long line as ``line_too_long``. Invalid UTF-8 — raw, or lone surrogates
written as ``\\udXXX`` escapes — follows ``options.on_decode_error``.
A byte range owns the lines that start in it (see ``ranges.py``).
"""

from __future__ import annotations

import json
import logging
import re
from typing import Iterator

from mlm_pipeline.errors import InputError
from mlm_pipeline.read.base import InputFormat, Piece, ReadOptions, record_document
from mlm_pipeline.read.ranges import OwnedLines, byte_ranges, decode, every_line, line_read_extent
from mlm_pipeline.read.sample import InputSample
from mlm_pipeline.read.sentences import paragraphs_of, segment_documents
from mlm_pipeline.stats import ReadStats

EXTENSIONS = (".jsonl", ".json", ".ndjson")

_SURROGATE = re.compile("[\ud800-\udfff]")  # json.loads joins valid pairs: these are lone

log = logging.getLogger("mlm_pipeline")


class JsonLinesFormat(InputFormat):
    """jsonl: one JSON object per line, the text in --text-field, split into sentences;
    detected by a ``.jsonl``/``.json``/``.ndjson`` name or a first non-blank line that is a
    JSON object."""

    name = "jsonl"

    def claims_name(self, sample: InputSample) -> bool:
        return sample.extension in EXTENSIONS

    def claims_head(self, sample: InputSample) -> bool:
        """A first line that is a JSON object (one cut at the detection head only has to start
        with ``{``): a text whose first line merely starts with ``{`` ("{Editor's note...}")
        stays text, where every line of it would be a bad record."""
        line = sample.first_line()
        if not line.startswith(b"{"):
            return False
        if not sample.first_line_is_whole():
            return True
        try:
            return isinstance(json.loads(line), dict)
        except ValueError:
            return False

    def split(self, url: str, size: int, split_bytes: int, options: ReadOptions) -> list[Piece]:
        return byte_ranges(url, self.name, size, split_bytes)

    def read_extent(self, piece: Piece, options: ReadOptions, following=None) -> tuple[int, int | None]:
        return line_read_extent(piece, options.max_line_bytes, every_line, following)

    def read(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
        return read_jsonl(piece, options, stats)


def read_jsonl(piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
    """Documents owned by ``piece`` of a JSONL file, each a list of sentences."""
    return segment_documents(_paragraph_docs(piece, options, stats), stats)


def _paragraph_docs(
    piece: Piece, options: ReadOptions, stats: ReadStats
) -> Iterator[tuple[list[str], bool]]:
    field = options.text_field
    policy = options.on_decode_error
    compressed = piece.compression is not None
    with OwnedLines(piece, options.max_line_bytes, every_line, stats) as owned:
        for start, line, too_long in owned:
            if owned.ends_at(start):
                return
            if too_long:
                if line:
                    stats.skip("line_too_long")
                continue
            if not line.strip():
                continue
            if b"\x00" in line:
                stats.skip("binary")
                continue
            offset = start + (owned.bom if start == 0 else 0)
            text, replaced = decode(
                line, policy=policy, url=piece.url, offset=offset, compressed=compressed
            )
            if text is None:
                stats.skip("invalid_utf8")
                continue
            try:
                record = json.loads(text)
            except ValueError as exc:
                _bad_record(piece, offset, f"not JSON ({exc})", stats)
                continue
            value = record.get(field) if isinstance(record, dict) else None
            if not isinstance(value, str):
                what = "not a JSON object" if not isinstance(record, dict) else (
                    f"no {field!r} field (it has {', '.join(map(repr, list(record)[:6]))}: --text-field names "
                    "the one with the text)" if field not in record else f"{field!r} is not a string")
                _bad_record(piece, offset, what, stats)
                continue
            if b"\\u" in line or b"\\U" in line:  # escapes may hide NUL or lone surrogates
                if "\x00" in value:
                    stats.skip("binary")
                    continue
                value, bad = _check_surrogates(value, policy, piece.url, offset)
                if value is None:
                    stats.skip("invalid_utf8")
                    continue
                replaced = replaced or bad
            paragraphs = paragraphs_of(value)
            if not paragraphs:
                stats.skip("empty")
                continue
            yield record_document(paragraphs, options, record.get, stats), replaced


def _check_surrogates(value: str, policy: str, url: str, offset: int) -> tuple[str | None, bool]:
    """A string decoded from JSON may hold lone surrogates (``"\\ud800"``), which are not
    Unicode text: treat them like invalid UTF-8."""
    try:
        value.encode("utf-8")
        return value, False
    except UnicodeEncodeError as exc:
        if policy == "replace":
            return _SURROGATE.sub("\ufffd", value), True
        if policy == "skip":
            return None, False
        raise InputError(
            f"{url}: lone surrogate escape in the JSON record at byte offset {offset} "
            f"({exc.reason}); use --on-decode-error replace or skip to continue past it"
        ) from exc


_SHOWN_BAD_RECORDS = 3  # a task logs this many bad records, then only counts them


def _bad_record(piece, offset: int, what: str, stats) -> None:
    """Count a bad record; log where it is for the first few of a task (a byte offset: a task
    reads a byte range of the file, so it cannot know line numbers without reading from the start)."""
    stats.skip("bad_record")
    n = stats.documents_skipped["bad_record"]
    if n <= _SHOWN_BAD_RECORDS:
        log.warning("%s: the record at byte %d is skipped: %s%s", piece.url, offset, what,
                    " (further bad records of this task are only counted)" if n == _SHOWN_BAD_RECORDS else "")
