"""The WikiText-2 and WikiText-103 dataset files (``wiki.train.tokens``, ``wiki.train.raw``):
one article per document.

These files hold Wikipedia articles as a title line `` = Title = ``, section headings
`` = = Section = = `` (deeper: more ``=``), and a paragraph per line, with blank lines between
them all. Read as plain text, each paragraph would be a document of its own, and most
next-sentence pairs random-next; here an article runs from its title line to the next one, its
headings are dropped, and its paragraphs are split into sentences by ``sentences.split_sentences``
(as WikiExtractor articles are). Text before the first title of a file is an article of its own.

The dataset's own debris is undone (``undo_debris``): its tokenization split hyphens, thousands
separators and decimal points as `` @-@ ``, `` @,@ ``, `` @.@ `` (a tokenizer would read
``@ - @``), and the ``.tokens`` files replace rare words by ``<unk>`` (a tokenizer would read
``< un ##k >``, about 12% of all tokens, none counted as unknown): it becomes the run's
tokenizer's unknown token (``ReadOptions.unknown_text``).

Detected by the dataset's file names (``wiki.train.tokens``, ``wiki.valid.raw``, ...), not by
content: other text may start with a line like a title. Which articles a byte range owns (those
whose title line starts in it): see ``ranges.py``.
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

_NAME = re.compile(r"^wiki\.(train|valid|test)\.(tokens|raw)$")
_TITLE = re.compile(rb"^ = [^=].* = ?\s*$")  # ' = Valkyria Chronicles III = '
_HEADING = re.compile(rb"^ = (= )+.* =( =)+ ?\s*$")  # ' = = Gameplay = = ', ' = = = Plot = = = '


class WikiTextDatasetFormat(InputFormat):
    """wikitext: the WikiText-2/-103 files, an article per document, paragraphs split
    into sentences; detected by the names ``wiki.{train,valid,test}.{tokens,raw}``."""

    name = "wikitext"

    def claims_name(self, sample: InputSample) -> bool:
        return _NAME.match(sample.name) is not None

    def split(self, url: str, size: int, split_bytes: int, options: ReadOptions) -> list[Piece]:
        return byte_ranges(url, self.name, size, split_bytes)

    def read_extent(self, piece: Piece, options: ReadOptions, following=None) -> tuple[int, int | None]:
        return line_read_extent(piece, options.max_line_bytes, _boundary, following)

    def read(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
        return segment_documents(_paragraph_docs(piece, options, stats), stats)


_DEBRIS = ((" @-@ ", "-"), (" @,@ ", ","), (" @.@ ", "."))


def undo_debris(paragraph: str, unknown_text: str) -> str:
    """A paragraph without WikiText's ``@-@``/``@,@``/``@.@`` splits, each ``<unk>`` replaced by
    ``unknown_text`` (dropped when that is empty). Guarded ``str.replace`` passes: text without
    the debris costs one scan per mark."""
    for mark, joined in _DEBRIS:
        if mark in paragraph:
            paragraph = paragraph.replace(mark, joined)
    if "<unk>" in paragraph:
        if unknown_text:
            paragraph = paragraph.replace("<unk>", unknown_text)
        else:
            paragraph = " ".join(paragraph.replace("<unk>", " ").split())
    return paragraph


def is_title(line: bytes) -> bool:
    return _TITLE.match(line) is not None


def looks_like_wikitext(first_line: bytes) -> bool:
    """A first line like a WikiText title: the planner's hint for a file of another name."""
    return is_title(b" " + first_line.strip() + b" ")


def _boundary(line: bytes, too_long: bool) -> bool:
    return not too_long and is_title(line)


def _paragraph_docs(piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[tuple[list[str], bool]]:
    with OwnedLines(piece, options.max_line_bytes, _boundary, stats) as owned:
        doc = DocumentBuffer()
        limit = options.max_document_bytes
        for start, line, too_long in owned:
            if _boundary(line, too_long):
                yield from _emit(doc.take(), piece, options, stats, owned)
                if owned.ends_at(start):
                    return
                continue
            if is_blank(line, too_long) or (not too_long and _HEADING.match(line)):
                continue
            if doc.lines and doc.size + len(line) > limit:  # an article too long to hold: in parts
                stats.documents_cut += 1
                yield from _emit(doc.take(), piece, options, stats, owned)
            doc.add(start, line, too_long)
        yield from _emit(doc.take(), piece, options, stats, owned)


def _emit(taken, piece: Piece, options: ReadOptions, stats: ReadStats, owned: OwnedLines):
    found = document_paragraphs(taken, piece=piece, options=options, stats=stats, bom=owned.bom)
    if found is None:
        return
    paragraphs, replaced = found
    if options.unknown_text:  # (counted: the report tells them from words the vocabulary lacks)
        stats.unknown_marked += sum(p.count("<unk>") for p in paragraphs)
    paragraphs = [p for p in (undo_debris(p, options.unknown_text) for p in paragraphs) if p]
    if paragraphs:
        yield paragraphs, replaced
    else:
        stats.skip("empty")
