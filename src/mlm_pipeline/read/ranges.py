"""Byte ranges: how a line-based file is cut into pieces, and which documents each piece owns.

Planning never reads the data of a line-based file: ``byte_ranges`` cuts it into nominal ranges
``[k*split, (k+1)*split)`` knowing only its size. The *reader* of a range aligns on document
boundaries: each format names its *boundary lines* (``OwnedLines``), and a range owns what
follows the boundary lines that start in it (``s``/``e`` are the range bounds, a "line start" is
offset 0 or the offset just after a ``\\n``):

* ``text`` (boundary: a blank line): a range owns the documents whose *immediately preceding
  blank line* starts in ``[s, e)``; the file's first document, when no blank line precedes it,
  is owned by the range with ``s == 0``. A reader with ``s > 0`` moves to the first line start
  ``>= s``, skips lines up to the first blank line (that line is where its owned span begins),
  then reads documents and stops at the first blank line that starts at ``>= e`` (reading past
  ``e`` to finish its last document).
* ``wikiextractor`` (boundary: a ``<doc`` line): a range owns the ``<doc`` blocks whose ``<doc``
  line starts in ``[s, e)`` (plus any stray text after such a block, up to the next ``<doc``
  line; stray text before the first block belongs to ``s == 0``).
* ``jsonl`` (boundary: every line, ``every_line``): a range owns the lines that start in it.

Every line is classified the same way whichever range reads it, so every document of a file is
read exactly once over its pieces, in file order. The bytes a range owns (its span, from its
first owned boundary to the next range's) tile the file, so ``bytes_read`` sums to the file size.

A compressed file is one piece: a compressed stream cannot be entered in the middle.
"""

from __future__ import annotations

import re
from itertools import chain
from typing import BinaryIO, Callable, Iterable, Iterator

from mlm_pipeline.errors import InputError
from mlm_pipeline.read.base import Piece
from mlm_pipeline.read.compression import compression_of, consumed_bytes, open_decompressed
from mlm_pipeline.read.sample import BOM
from mlm_pipeline.stats import ReadStats

CHUNK_BYTES = 1 << 20
"""Read size for line-based inputs (one ``read`` + one ``split`` per chunk)."""

TAIL_BYTES = 16 * 1024
"""Read size past a range's end, where only the lines up to its boundary line are needed."""

_LONE_CR = re.compile(rb"\r(?!\n)")

HEAD_BYTES = 64
"""How much of an over-long line is kept (enough to classify it, e.g. as a ``<doc`` line)."""


def byte_ranges(url: str, fmt: str, size: int, split_bytes: int) -> list[Piece]:
    """Nominal byte ranges of ``split_bytes`` of a file of ``size`` bytes (the last one
    open-ended), or one whole piece for a compressed file. The data is not read. An empty file
    still gives one piece (which yields nothing)."""
    if split_bytes < 1:
        raise ValueError(f"split_bytes must be >= 1, got {split_bytes}")
    if size < 0:
        raise ValueError(f"{url}: negative size {size}")
    compression = compression_of(url)
    if compression is not None:
        return [Piece(url, fmt, 0, None, compression)]
    starts = list(range(0, size, split_bytes)) or [0]
    return [
        Piece(url, fmt, s, (s + split_bytes) if s + split_bytes < size else None)
        for s in starts
    ]


def open_piece(piece: Piece) -> BinaryIO:
    """Open the stream for a byte-range piece, positioned for its ``LineReader``
    (one byte before ``start``, to tell whether ``start`` is a line start)."""
    stream = open_decompressed(piece.url, piece.compression)
    if piece.start > 0:
        stream.seek(piece.start - 1)
    return stream


# --------------------------------------------------------------------------- lines


class LineReader:
    """Lines of a binary stream, with their byte offsets, in bounded memory.

    Iterating yields ``(start, line, too_long)``: ``start`` is the offset of the line's first
    byte, ``line`` its bytes without the ``\\n`` (a ``\\r`` before it stays; callers strip; a lone
    ``\\r`` ends a line, as in Python's universal newlines, and is counted). A line longer
    than ``max_line_bytes`` is consumed chunk by chunk without being kept: it comes out as
    ``too_long=True`` with only its first ``HEAD_BYTES`` bytes, or ``b""`` if it is all ASCII
    whitespace. A UTF-8 byte-order mark at offset 0 is dropped from the first line (offsets are
    unchanged). After (or during) iteration ``pos`` is the offset just past the last line
    yielded or skipped.

    ``start > 0`` aligns on the first line start ``>= start``: the stream must be positioned at
    ``start - 1`` (see ``open_piece``) and the line through the next ``\\n`` is dropped.
    """

    def __init__(
        self,
        stream,
        start: int,
        *,
        max_line_bytes: int,
        chunk_bytes: int = CHUNK_BYTES,
        end: int | None = None,
    ) -> None:
        self._stream = stream
        self._start = start
        self.end = end
        self.lone_cr = 0  # lone \r line ends in [start, end)
        self._limit = max_line_bytes
        self._chunk = chunk_bytes
        self.pos = start
        self.bom = 0  # 3 once a byte-order mark was dropped at offset 0
        self._bom_pending = 0  # the dropped mark's bytes, not yet added to an offset

    def __iter__(self) -> Iterator[tuple[int, bytes, bool]]:
        return self.lines_of(self.runs())

    def lines_of(self, runs: Iterable[tuple[int, list[bytes], bool]]) -> Iterator[tuple[int, bytes, bool]]:
        """The lines of ``runs`` of this reader one at a time, ``pos`` past each as it is given out."""
        for start, lines, too_long in runs:
            if len(lines) == 1:
                yield start, lines[0], too_long
                continue
            for line in lines:
                self.pos = start + len(line) + 1
                yield start, line, False
                start = self.pos

    def runs(self) -> Iterator[tuple[int, list[bytes], bool]]:
        """The lines in runs ``(start, lines, too_long)``: all the lines that start and end in one
        read chunk when none is over the limit and the chunk has no NUL byte (the common case,
        one run per chunk), else one line a run (a line read across chunks, a line of a chunk
        with a NUL byte, or one over the limit: then ``too_long``).
        ``start`` is the offset of the run's first line; ``pos`` is past the run once it is
        yielded. A reader that classifies lines in bulk (text) takes runs; ``__iter__`` gives
        the same lines one at a time."""
        limit = self._limit
        pos = self._start - 1 if self._start > 0 else 0
        drop = self._start > 0  # the partial line before the first line start >= start
        line = _LineInProgress(limit)
        for chunk in self._chunks(at_file_start=pos == 0):
            parts = chunk.split(b"\n")
            rest = parts.pop()
            if parts:
                # parts[0] ends the line in progress
                kept, length, too_long = line.finish(parts[0])
                start, pos = pos, pos + length + 1 + self._take_bom()
                if drop:
                    drop = False
                else:
                    self.pos = pos
                    yield start, [kept], too_long
                # the lines that start and end inside this chunk
                whole = parts[1:]
                if whole and max(map(len, whole)) <= limit and b"\x00" not in chunk:
                    start, pos = pos, pos + len(chunk) - len(rest) - len(parts[0]) - 1
                    self.pos = pos
                    yield start, whole, False
                else:
                    for one in whole:
                        start, pos = pos, pos + len(one) + 1
                        self.pos = pos
                        yield (start, [one], False) if len(one) <= limit else (start, [_kept_head(one)], True)
            line.extend(rest)
        if not line.is_empty():  # a last line without a final newline
            kept, length, too_long = line.finish(b"")
            start, pos = pos, pos + length + self._take_bom()
            if not drop:
                self.pos = pos
                yield start, [kept], too_long
        self.pos = pos + self._take_bom()  # a mark not taken yet: the file is just a mark

    def _chunks(self, *, at_file_start: bool) -> Iterator[bytes]:
        """The stream, ``chunk_bytes`` at a time (see :meth:`_read_size` near ``end``); at the file
        start without its byte-order mark; a lone ``\\r`` (old Mac line ends) turned into ``\\n``
        (see :meth:`_line_ends`)."""
        offset = self._start - 1 if self._start > 0 else 0
        stream = self._stream
        read_at = offset  # where the next read starts in the stream

        def read() -> bytes:
            nonlocal read_at
            data = stream.read(self._read_size(read_at))
            read_at += len(data)
            return data

        chunk = read()
        if not chunk:
            return
        if at_file_start:
            chunk = self._drop_bom(chunk)
            offset += self.bom
        carry = b""  # a \r at the end of a chunk: what follows it decides (copies only then)
        first = True
        while chunk or first:
            first = False
            if carry:
                chunk, carry = carry + chunk, b""
            if chunk.endswith(b"\r"):
                chunk, carry = chunk[:-1], b"\r"
            if b"\r" in chunk:
                chunk = self._line_ends(chunk, offset)
            yield chunk  # (possibly empty: the first read was just the mark)
            offset += len(chunk)
            chunk = read()
        if carry:  # the file ends with a \r
            yield self._line_ends(carry, offset)

    def _read_size(self, at: int) -> int:
        """Bytes to read at offset ``at``: ``chunk_bytes``, except around ``end``. A range needs
        only the lines up to its boundary line after ``end``, usually a few: a read that would pass
        ``end`` stops ``TAIL_BYTES`` after it, and reads past it grow from ``TAIL_BYTES`` by
        doubling (a document that goes on far past ``end`` is still read in whole chunks). A
        whole chunk read there was split and decoded for nothing: half a chunk per range on
        average, 2-3 ms of each 4 MB range."""
        if self.end is None:
            return self._chunk
        to_end = self.end - at
        return min(self._chunk, to_end + TAIL_BYTES if to_end > 0 else max(TAIL_BYTES, -to_end))

    def _line_ends(self, data: bytes, offset: int) -> bytes:
        """``data`` (file bytes from ``offset``) with each lone ``\\r`` made a ``\\n``, the way
        Python's universal newlines read; the same length, so offsets stay those of the file, and
        each byte's fate depends only on it and the next, so every range agrees. Those in this
        reader's range ``[start, end)`` are counted."""
        positions = [m.start() for m in _LONE_CR.finditer(data)]
        if not positions:
            return data
        lo, hi = self._start - offset, (self.end - offset) if self.end is not None else len(data)
        self.lone_cr += sum(1 for p in positions if lo <= p < hi)
        return _LONE_CR.sub(b"\n", data)

    def _drop_bom(self, chunk: bytes) -> bytes:
        while len(chunk) < 3 and BOM.startswith(chunk):  # a short first read
            more = self._stream.read(self._chunk)
            if not more:
                break
            chunk += more
        if not chunk.startswith(BOM):
            return chunk
        self.bom = self._bom_pending = 3
        return chunk[3:]

    def _take_bom(self) -> int:
        """The dropped mark's length, once: it belongs to the first line's extent."""
        bom, self._bom_pending = self._bom_pending, 0
        return bom


class _LineInProgress:
    """The line being read across chunks.

    Kept whole while within ``limit``; past it, only its length, its first ``HEAD_BYTES`` and
    whether it has a non-whitespace byte. These depend only on the line, never on where chunks
    were cut, so every range classifies the line the same way.
    """

    __slots__ = ("limit", "kept", "length", "head", "has_text")

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.kept = b""  # the line so far, while within the limit
        self.length = -1  # once over the limit: its length so far (else -1)
        self.head = b""
        self.has_text = False

    def is_empty(self) -> bool:
        return not self.kept and self.length < 0

    def extend(self, data: bytes) -> None:
        """Add ``data``, a part of the line that does not end it."""
        if self.length >= 0:
            self._grow_long(data)
            return
        self.kept = self.kept + data if self.kept else data
        if len(self.kept) > self.limit:  # over the limit: stop keeping it
            data, self.kept = self.kept, b""
            self.length = 0
            self._grow_long(data)

    def finish(self, data: bytes) -> tuple[bytes, int, bool]:
        """Add ``data``, the line's last part, and start a new line. Returns ``(line, length,
        too_long)``: for a line over the limit, ``line`` is its head (``b""`` if all whitespace)."""
        if self.length >= 0:
            self._grow_long(data)
            done = (self.head if self.has_text else b"", self.length, True)
            self.length, self.head, self.has_text = -1, b"", False
            return done
        whole = self.kept + data if self.kept else data
        self.kept = b""
        if len(whole) <= self.limit:
            return whole, len(whole), False
        return _kept_head(whole), len(whole), True

    def _grow_long(self, data: bytes) -> None:
        self.length += len(data)
        if len(self.head) < HEAD_BYTES:
            self.head += data[: HEAD_BYTES - len(self.head)]
        self.has_text = self.has_text or bool(data.strip())


def _kept_head(line: bytes) -> bytes:
    """What is kept of an over-long line: its head, or nothing if it is all whitespace."""
    return line[:HEAD_BYTES] if line.strip() else b""


def piece_lines(stream, piece: Piece, max_line_bytes: int) -> LineReader:
    """The ``LineReader`` of a piece opened with ``open_piece``. A small range reads little past
    its end however large ``CHUNK_BYTES`` is (``LineReader._read_size``); the module's value is
    read at each call, so tests can make every chunk tiny."""
    return LineReader(
        stream, piece.start, max_line_bytes=max_line_bytes, chunk_bytes=CHUNK_BYTES, end=piece.end
    )


class OwnedLines:
    """The lines a piece of a line-based format owns, and the bytes of its span.

    Line-based formats follow the same ownership rules (see the module docstring) and differ
    only in their boundary line, ``is_boundary(line, too_long)``: ``is_blank`` (text), a ``<doc``
    line (WikiExtractor), ``every_line`` (JSONL: a record per line).
    Iterating starts at the first boundary when ``piece.start > 0``; the reader stops at the
    first boundary for which ``ends_at(start)``. Use as a context manager: on exit, also after
    an error or an early close, the span is added to ``stats.bytes_read`` and the stream closed.
    """

    def __init__(
        self,
        piece: Piece,
        max_line_bytes: int,
        is_boundary: Callable[[bytes, bool], bool],
        stats: ReadStats,
    ) -> None:
        self._stream = open_piece(piece)
        self._lines = piece_lines(self._stream, piece, max_line_bytes)
        self._piece = piece
        self._is_boundary = is_boundary
        self._stats = stats
        self._span_start = 0
        self._span_end: int | None = None

    @property
    def bom(self) -> int:
        return self._lines.bom

    def __iter__(self) -> Iterator[tuple[int, bytes, bool]]:
        """The owned lines one at a time: :meth:`runs`, line by line."""
        return self._lines.lines_of(self.runs())

    def runs(self) -> Iterator[tuple[int, list[bytes], bool]]:
        """The owned lines in the runs of :meth:`LineReader.runs` (the first run starting at the
        first boundary line when ``piece.start > 0``)."""
        lines = self._lines
        runs = lines.runs()
        if self._piece.start == 0:
            return runs
        end = self._piece.end
        for start, run, too_long in runs:
            for i, line in enumerate(run):
                if end is not None and start >= end:  # no boundary starts in the range: it owns nothing
                    self._span_start = self._span_end = start  # (not read on to the file's end)
                    return iter(())
                if self._is_boundary(line, too_long):
                    self._span_start = start
                    return chain([(start, run[i:], too_long)], runs)
                start += len(line) + 1
        self._span_start = self._span_end = lines.pos
        return iter(())

    def ends_at(self, start: int) -> bool:
        """Whether a boundary line starting at ``start`` is past the range; the span ends there."""
        end = self._piece.end
        if end is not None and start >= end:
            self._span_end = start
            return True
        return False

    def __enter__(self) -> OwnedLines:
        return self

    def __exit__(self, *exc) -> None:
        span_end = self._lines.pos if self._span_end is None else self._span_end
        self._stats.bytes_read += consumed_bytes(self._stream, span_end) - self._span_start
        self._stats.lone_cr_line_ends += self._lines.lone_cr
        self._stream.close()


def line_read_extent(piece: Piece, max_line_bytes: int, is_boundary: Callable[[bytes, bool], bool],
                     following: tuple[int, int | None] | None = None) -> tuple[int, int | None]:
    """The bytes the reader of a byte-range ``piece`` of a line-based file depends on: from the
    byte before its start (which says whether the start is a line start) to the end of the first
    boundary line starting at or past its end, where it stops; ``None`` if none does (the file's
    end). Reads the file from the piece's end to that line (a document's length, usually KBs).

    ``following``: ``(end, stop)`` of the file's next piece, known already: from that piece's end
    on the search goes as that piece's did, so it stops there with ``stop``. Found last to first,
    the pieces of a file with no boundary for a long way (a text file without blank lines) read
    it once in all instead of once each."""
    start = max(0, piece.start - 1)
    if piece.end is None:
        return start, None
    tail = Piece(piece.url, piece.fmt, piece.end, None, piece.compression)
    with open_piece(tail) as stream:
        # (``end``: reads of TAIL_BYTES, doubling, as the range's own reader does there)
        lines = LineReader(stream, tail.start, max_line_bytes=max_line_bytes, chunk_bytes=CHUNK_BYTES,
                           end=piece.end)
        for line_start, line, too_long in lines:
            if following is not None and following[0] is not None and line_start >= following[0]:
                return start, following[1]
            if is_boundary(line, too_long):
                return start, lines.pos
    return start, None


def every_line(line: bytes, too_long: bool) -> bool:
    """The boundary of record-per-line formats: every line starts a record."""
    return True


def is_blank(line: bytes, too_long: bool = False) -> bool:
    """Whether a line is whitespace only, as ``str.strip`` sees it after UTF-8 decoding
    (so ``\\r``, NBSP and ideographic spaces count as whitespace, invalid bytes do not).

    For a line the ``LineReader`` flagged ``too_long``, ``line`` is only its kept head: such a
    line is blank only when nothing was kept."""
    if too_long:
        return not line
    head = line[:2]  # most lines: visible ASCII first, or second after a space; no stripped copy
    if head and (0x20 < head[0] < 0x80 or (head[0] == 0x20 and len(head) == 2 and 0x20 < head[1] < 0x80)):
        return False
    b = line.strip()
    if not b:
        return True
    c = b[0]
    if c < 0x80 and not 0x1C <= c <= 0x1F:
        return False  # starts with a visible ASCII character
    return not line.decode("utf-8", "replace").strip()


def decode(
    data: bytes, *, policy: str, url: str, offset: int, compressed: bool
) -> tuple[str | None, bool]:
    """Decode UTF-8 under an ``on_decode_error`` policy: ``(text, replaced)``.

    ``text`` is None when the policy is ``skip`` and the bytes are invalid; ``fail`` raises
    ``InputError`` naming the file and the byte offset (``offset`` is where ``data`` starts).
    """
    try:
        return data.decode("utf-8"), False
    except UnicodeDecodeError as exc:
        if policy == "replace":
            return data.decode("utf-8", "replace"), True
        if policy == "skip":
            return None, False
        where = " of the decompressed stream" if compressed else ""
        raise InputError(
            f"{url}: invalid UTF-8 at byte offset {offset + exc.start}{where} ({exc.reason}); "
            "use --on-decode-error replace or skip to continue past such bytes"
        ) from exc
