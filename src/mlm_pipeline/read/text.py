"""Google BERT text format: one sentence per line, a blank line between documents.

Like google-research/bert ``create_pretraining_data.py``, each line is stripped and a line that
is empty after stripping (whitespace only, ``\\r`` included) ends the current document; runs of
blank lines are only separators. Which documents a byte range owns: see ``ranges.py``.

With ``--sentence-split`` a line is a paragraph instead, split into sentences by the segmenter
(``sentences.py``), one call per document: text with a paragraph per line (WikiText, most web
text) otherwise gives one-sentence documents, whose pairs are nearly all random-next.
"""

from __future__ import annotations

from bisect import bisect_left, bisect_right
from itertools import accumulate, chain, compress, count
from operator import not_
from typing import Iterator

from mlm_pipeline.read.base import InputFormat, Piece, ReadOptions
from mlm_pipeline.read.ranges import OwnedLines, byte_ranges, decode, is_blank, line_read_extent
from mlm_pipeline.read.sentences import paragraphs_of, split_sentences
from mlm_pipeline.stats import ReadStats


class TextFormat(InputFormat):
    """text: one sentence per line, a blank line between documents (Google's format); what
    auto-detection answers when no other format claims a file."""

    name = "text"
    fallback = True

    def split(self, url: str, size: int, split_bytes: int, options: ReadOptions) -> list[Piece]:
        return byte_ranges(url, self.name, size, split_bytes)

    def read_extent(self, piece: Piece, options: ReadOptions, following=None) -> tuple[int, int | None]:
        return line_read_extent(piece, options.max_line_bytes, is_blank, following)

    def read(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
        return read_text(piece, options, stats)

    def read_runs(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[list[str]]]:
        return read_text_runs(piece, options, stats)


class DocumentBuffer:
    """The raw lines of the document being read, with what is already known to be wrong, and,
    while every line came from a run decoded in bulk, their decoded and stripped texts
    (``texts``; None once a line came without: the document is then decoded when taken)."""

    __slots__ = ("lines", "start", "size", "too_long", "texts")

    def __init__(self) -> None:
        self.lines: list[bytes] = []
        self.start = 0
        self.size = 0
        self.too_long = False
        self.texts: list[str] | None = None

    def add(self, start: int, line: bytes, too_long: bool, text: str | None = None) -> None:
        if not self.lines:
            self.start = start
            self.texts = []
        self.lines.append(line)
        self.size += len(line) + 1
        self.too_long = self.too_long or too_long
        if self.texts is not None:
            if text is None:
                self.texts = None
            else:
                self.texts.append(text)

    def extend(self, start: int, lines: list[bytes], size: int, texts: list[str] | None = None) -> None:
        """Add whole lines within the limits at once (``size``: their bytes with line ends)."""
        if not self.lines:
            self.start = start
            self.texts = []
        self.lines.extend(lines)
        self.size += size
        if self.texts is not None:
            if texts is None:
                self.texts = None
            else:
                self.texts.extend(texts)

    def take(self) -> tuple[list[bytes], int, bool]:
        out = (self.lines, self.start, self.too_long)
        self.lines, self.size, self.too_long, self.texts = [], 0, False, None
        return out


def decode_document(
    lines: list[bytes],
    start: int,
    too_long: bool,
    *,
    piece: Piece,
    options: ReadOptions,
    stats: ReadStats,
    bom: int = 0,
) -> tuple[str, bool] | None:
    """The document's text (one ``decode`` for all its lines) and whether bytes were replaced,
    or None after counting why it is skipped (``line_too_long``, ``binary``, ``invalid_utf8``).
    """
    if too_long:
        stats.skip("line_too_long")
        return None
    data = b"\n".join(lines)
    if b"\x00" in data:
        stats.skip("binary")
        return None
    text, replaced = decode(
        data,
        policy=options.on_decode_error,
        url=piece.url,
        offset=start + (bom if start == 0 else 0),
        compressed=piece.compression is not None,
    )
    if text is None:
        stats.skip("invalid_utf8")
        return None
    return text, replaced


def document_paragraphs(
    taken: tuple[list[bytes], int, bool], *, piece: Piece, options: ReadOptions, stats: ReadStats, bom: int
) -> tuple[list[str], bool] | None:
    """The paragraphs of a document of a paragraph format (WikiExtractor, WikiText), as
    :meth:`DocumentBuffer.take` gave it, and whether bytes were replaced; None for a document
    without lines or one skipped while decoding (:func:`decode_document` counts why)."""
    lines, start, too_long = taken
    if not lines:
        return None
    decoded = decode_document(lines, start, too_long, piece=piece, options=options, stats=stats, bom=bom)
    if decoded is None:
        return None
    text, replaced = decoded
    return paragraphs_of(text), replaced


def read_text(piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
    """Documents owned by ``piece`` of a text-format file, each a list of stripped lines (those
    of :func:`read_text_runs`, one at a time)."""
    return chain.from_iterable(read_text_runs(piece, options, stats))


def read_text_runs(piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[list[str]]]:
    """Documents owned by ``piece`` of a text-format file, each a list of stripped lines, given
    out in runs (non-empty lists of consecutive documents: all those of a read chunk that lie
    between its blank lines come as one list, so a caller pays its per-document steps in bulk).

    Lines come in runs (a read chunk's whole lines, none with a NUL byte). A run that is valid
    UTF-8 is read in bulk: its lines decoded and stripped in C
    (``map``), its documents between blank lines slices of that list, and the lines before its
    first blank line and after its last one (documents that began in an earlier run or go on in
    the next) added to the document in progress a stretch at a time, cut where it reaches the
    size limit. That is what the line-by-line steps below give, at a fraction of the cost. The
    blank line that ends the range and every other run take the line-by-line steps.
    """
    with OwnedLines(piece, options.max_line_bytes, is_blank, stats) as owned:
        doc = DocumentBuffer()
        limit = options.max_document_bytes

        def emit() -> Iterator[list[list[str]]]:
            """The document in progress, given out (its texts as decoded in bulk where they all were)."""
            texts = doc.texts
            taken = doc.take()
            if texts is not None:
                yield from _documents([texts], options, stats, replaced=False)
            else:
                yield from _emit(taken, piece, options, stats, owned.bom)

        def one_by_one(start: int, lines: list[bytes], too_long: bool) -> Iterator[list[list[str]]]:
            """Read lines one at a time; returns True at the first blank line past the range."""
            for line in lines:
                if is_blank(line, too_long):
                    if doc.lines:
                        yield from emit()
                    if owned.ends_at(start):
                        return True
                else:
                    if doc.lines and doc.size + len(line) > limit:
                        stats.documents_cut += 1
                        yield from emit()
                    doc.add(start, line, too_long, None if too_long or b"\x00" in line else _stripped(line))
                start += len(line) + 1
            return False

        def without_blanks(start: int, lines: list[bytes], stripped: list[str], ends: list[int], i: int,
                           n: int) -> Iterator[list[list[str]]]:
            """Lines ``i..n-1`` of a run, none of them blank (valid UTF-8, within the line limit):
            what :func:`one_by_one` does with them, a stretch at a time. A line joins the document
            in progress while ``doc.size + len(line) <= limit``, which for lines ``i..j`` after
            its last one is ``ends[j] <= limit - doc.size + ends[i - 1] + 1``: one bisection per
            cut, not a step per line (a text without blank lines, such as a novel, is cut into
            documents of the block size here)."""
            while i < n:
                base = ends[i - 1] if i else 0
                if not doc.lines:  # a document's first line joins it whatever its size
                    doc.add(start + base, lines[i], False, stripped[i])
                    i += 1
                    continue
                j = bisect_right(ends, limit - doc.size + base + 1, i, n)
                if j > i:
                    doc.extend(start + base, lines[i:j], ends[j - 1] - base, stripped[i:j])
                if j < n:
                    stats.documents_cut += 1
                    yield from emit()
                i = j

        def in_bulk(start: int, lines: list[bytes], stripped: list[str], blank: list[int], ends: list[int]):
            """Read lines whose blank lines (``blank``, indices) all start before the range's end;
            ``stripped``: the lines decoded and stripped; ``ends[i]``: where line ``i`` ends (past
            its line end) from ``start``."""
            if not blank:  # every line goes on with the document in progress
                yield from without_blanks(start, lines, stripped, ends, 0, len(lines))
                return
            first, last = blank[0], blank[-1]
            yield from without_blanks(start, lines, stripped, ends, 0, first)  # the document in progress goes on
            if doc.lines:
                yield from emit()
            if ends[-1] <= limit:  # every document between blank lines within the limit: slices, one run
                middle = [stripped[a + 1 : b] for a, b in zip(blank, blank[1:]) if b > a + 1]
                yield from _documents(middle, options, stats, replaced=False)
            else:
                for a, b in zip(blank, blank[1:]):
                    if b == a + 1:
                        continue
                    if ends[b - 1] - ends[a] <= limit:
                        yield from _documents([stripped[a + 1 : b]], options, stats, replaced=False)
                    else:  # a document over the limit: cut into parts as it goes
                        yield from without_blanks(start, lines, stripped, ends, a + 1, b)
                        yield from emit()
            yield from without_blanks(start, lines, stripped, ends, last + 1, len(lines))  # a document that goes on

        for start, lines, too_long in owned.runs():
            decoded = None
            if len(lines) > 2:
                ends = list(accumulate(map((1).__add__, map(len, lines))))  # past each line, from start
                decoded = _stripped_run(lines)
            if decoded is None:
                if (yield from one_by_one(start, lines, too_long)):
                    return
                continue
            stripped, blank = decoded
            stop = len(lines)  # the first blank line that starts at or past the range's end, if any
            if piece.end is not None and blank and start + ends[-1] > piece.end:
                starts = [ends[i - 1] if i else 0 for i in blank]
                first = bisect_left(starts, piece.end - start)
                if first < len(blank):
                    stop, blank = blank[first], blank[:first]
            yield from in_bulk(start, lines[:stop], stripped, blank, ends)
            if stop < len(lines):  # the range ends at this blank line
                yield from one_by_one(start + (ends[stop - 1] if stop else 0), lines[stop : stop + 1], False)
                return
        if doc.lines:
            yield from emit()


def _stripped(line: bytes) -> str | None:
    """A line decoded and stripped, or None if it is not valid UTF-8."""
    try:
        return line.decode().strip()
    except UnicodeDecodeError:
        return None


def _stripped_run(lines: list[bytes]) -> tuple[list[str], list[int]] | None:
    """Lines decoded and stripped, and the indices of the blank ones; None if they hold invalid
    UTF-8 (the line-by-line steps deal with it; a run has no NUL byte, see ``LineReader.runs``)."""
    try:
        stripped = list(map(str.strip, map(bytes.decode, lines)))
    except UnicodeDecodeError:
        return None
    blank = list(compress(count(), map(not_, stripped)))  # is_blank, for valid UTF-8
    return stripped, blank


def _emit(taken, piece, options, stats, bom) -> Iterator[list[list[str]]]:
    lines, start, too_long = taken
    decoded = decode_document(lines, start, too_long, piece=piece, options=options, stats=stats, bom=bom)
    if decoded is None:
        return
    text, replaced = decoded
    yield from _documents([[s for s in map(str.strip, text.split("\n")) if s]], options, stats, replaced)


def _documents(documents: list[list[str]], options: ReadOptions, stats: ReadStats,
               replaced: bool) -> Iterator[list[list[str]]]:
    """Count and give out documents (their stripped non-empty lines) as one run, split into
    sentences first with ``--sentence-split``; nothing when none is left."""
    if options.sentence_split:
        documents = [[s for para in split_sentences(sents) for s in para] if sents else sents for sents in documents]
    run = stats.count_documents(documents, replaced)
    if run:
        yield run
