"""WikiExtractor output: ``<doc id=… url=… title=…>`` … ``</doc>`` blocks, one article each.

Inside a block every non-blank line is a paragraph; the first one is dropped when it repeats the
``title`` attribute (WikiExtractor writes the title as the first line); paragraphs are split
into sentences by ``sentences.split_sentences``. A block ends at ``</doc>``, at the next
``<doc`` line (a missing ``</doc>``) or at the end of the file. Non-blank text outside any block
is not used and is counted as skipped ``outside_doc`` (once per run of lines).
Which blocks a byte range owns: see ``ranges.py``.
"""

from __future__ import annotations

import re
from typing import Iterator

from mlm_pipeline.read.base import InputFormat, Piece, ReadOptions
from mlm_pipeline.read.ranges import OwnedLines, byte_ranges, is_blank, line_read_extent
from mlm_pipeline.read.sample import InputSample
from mlm_pipeline.read.sentences import segment_documents
from mlm_pipeline.read.text import DocumentBuffer, document_paragraphs
from mlm_pipeline.stats import ReadStats


class WikiExtractorFormat(InputFormat):
    """wikiextractor: <doc ...> blocks, one paragraph per line, split into sentences; detected
    by a first non-blank line that starts with ``<doc``."""

    name = "wikiextractor"

    def claims_head(self, sample: InputSample) -> bool:
        return is_doc_start(sample.first_line())

    def split(self, url: str, size: int, split_bytes: int, options: ReadOptions) -> list[Piece]:
        return byte_ranges(url, self.name, size, split_bytes)

    def read_extent(self, piece: Piece, options: ReadOptions, following=None) -> tuple[int, int | None]:
        return line_read_extent(piece, options.max_line_bytes, _doc_boundary, following)

    def read(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
        return read_wikiextractor(piece, options, stats)


_TITLE = re.compile(rb'\stitle="([^"]*)"')
# (a title holding a quote must be HTML-escaped in the attribute; it is unescaped to compare)


def is_doc_start(line: bytes) -> bool:
    return line.startswith(b"<doc ") or line.startswith(b"<doc>")


def _doc_boundary(line: bytes, too_long: bool) -> bool:
    return is_doc_start(line)  # an over-long line keeps enough of its head to tell


def _title(header: bytes) -> str | None:
    m = _TITLE.search(header)
    return m.group(1).decode("utf-8", "replace").strip() if m else None


def read_wikiextractor(
    piece: Piece, options: ReadOptions, stats: ReadStats
) -> Iterator[list[str]]:
    """Documents owned by ``piece`` of a WikiExtractor file, each a list of sentences."""
    return segment_documents(_paragraph_docs(piece, options, stats), stats)


def _paragraph_docs(
    piece: Piece, options: ReadOptions, stats: ReadStats
) -> Iterator[tuple[list[str], bool]]:
    with OwnedLines(piece, options.max_line_bytes, _doc_boundary, stats) as owned:
        doc = DocumentBuffer()
        title: str | None = None
        inside = False
        in_stray = False
        first_part = True
        limit = options.max_document_bytes
        for start, line, too_long in owned:
            if is_doc_start(line):
                if inside:  # the previous block had no </doc>
                    yield from _emit(doc.take(), title, first_part, piece, options, stats, owned)
                if owned.ends_at(start):
                    return
                inside, in_stray, first_part = True, False, True
                title = _title(line)
                continue
            if inside:
                if not too_long and line.strip() == b"</doc>":
                    yield from _emit(doc.take(), title, first_part, piece, options, stats, owned)
                    inside = False
                    continue
                if doc.lines and doc.size + len(line) > limit:
                    stats.documents_cut += 1
                    yield from _emit(doc.take(), title, first_part, piece, options, stats, owned)
                    first_part = False
                doc.add(start, line, too_long)
            elif is_blank(line, too_long):
                in_stray = False
            elif not in_stray:
                stats.skip("outside_doc")
                in_stray = True
        if inside:
            yield from _emit(doc.take(), title, first_part, piece, options, stats, owned)


def _emit(
    taken, title, first_part, piece, options, stats, owned
) -> Iterator[tuple[list[str], bool]]:
    if not taken[0]:
        stats.skip("empty")
        return
    found = document_paragraphs(taken, piece=piece, options=options, stats=stats, bom=owned.bom)
    if found is None:
        return
    paragraphs, replaced = found
    if first_part and paragraphs and title is not None:
        import html  # (here: detecting the format, which every run does, needs none)

        if paragraphs[0] == title or paragraphs[0] == html.unescape(title):
            del paragraphs[0]
    yield paragraphs, replaced
