"""Byte ranges: how a file is cut into pieces, and which documents each piece owns.

Planning never reads the data of a text-like file: ``split_file`` cuts it into nominal ranges
``[k*split, (k+1)*split)`` knowing only its size. The *reader* of a range aligns on document
boundaries with these ownership rules (``s``/``e`` are the range bounds, a "line start" is offset
0 or the offset just after a ``\\n``):

* ``text``: a range owns the documents whose *immediately preceding blank line* starts in
  ``[s, e)``; the file's first document, when no blank line precedes it, is owned by the range
  with ``s == 0``. A reader with ``s > 0`` moves to the first line start ``>= s``, skips lines up
  to the first blank line (that line is where its owned span begins), then reads documents and
  stops at the first blank line that starts at ``>= e`` (reading past ``e`` to finish its last
  document).
* ``wikiextractor``: a range owns the ``<doc`` blocks whose ``<doc`` line starts in ``[s, e)``
  (plus any stray text after such a block, up to the next ``<doc`` line; stray text before the
  first block belongs to ``s == 0``).
* ``jsonl``: a range owns the lines whose start is in ``[s, e)``.

Every line is classified the same way whichever range reads it, so every document of a file is
read exactly once over its pieces, in file order. The bytes a range owns (its span, from its
first owned boundary to the next range's) tile the file, so ``bytes_read`` sums to the file size.

Compressed files are one piece (a compressed stream cannot be entered in the middle); Parquet
files are cut into runs of row groups, from the footer metadata.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
from itertools import chain, islice
from typing import BinaryIO, Callable, Iterator

from mlm_pipeline import fs
from mlm_pipeline.read.base import InputError, Piece, compression_of
from mlm_pipeline.stats import ReadStats

CHUNK_BYTES = 1 << 20
"""Read size for text-like inputs (one ``read`` + one ``split`` per chunk)."""

MIN_CHUNK_BYTES = 64 * 1024
"""Read size floor, for small ranges."""

HEAD_BYTES = 64
"""How much of an over-long line is kept (enough to classify it, e.g. as a ``<doc`` line)."""

BOM = b"\xef\xbb\xbf"


def split_file(url: str, fmt: str, size: int, split_bytes: int) -> list[Piece]:
    """The pieces of one file, in file order.

    Uncompressed text/wikiextractor/jsonl: nominal byte ranges of ``split_bytes`` (the last one
    open-ended); the data is not read. A compressed file: one whole piece. Parquet: runs of
    consecutive row groups of about ``split_bytes`` compressed bytes each (reads the footer).
    An empty file still gives one piece (which yields nothing).
    """
    if split_bytes < 1:
        raise ValueError(f"split_bytes must be >= 1, got {split_bytes}")
    if size < 0:
        raise ValueError(f"{url}: negative size {size}")
    compression = compression_of(url)
    if fmt == "parquet":
        if compression is not None:
            raise InputError(f"{url}: a compressed Parquet file is not supported; decompress it")
        return _split_parquet(url, split_bytes)
    if fmt not in ("text", "wikiextractor", "jsonl"):
        raise ValueError(f"{url}: unknown format {fmt!r}")
    if compression is not None:
        return [Piece(url, fmt, 0, None, compression)]
    starts = list(range(0, size, split_bytes)) or [0]
    return [
        Piece(url, fmt, s, (s + split_bytes) if s + split_bytes < size else None)
        for s in starts
    ]


def _split_parquet(url: str, split_bytes: int) -> list[Piece]:
    import pyarrow.parquet as pq

    with open_decompressed(url, None) as f:
        try:
            meta = pq.read_metadata(f)
        except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for a bad footer
            raise InputError(f"{url}: not a readable Parquet file ({exc})") from exc
    pieces: list[Piece] = []
    first, acc = 0, 0
    for i in range(meta.num_row_groups):
        rg = meta.row_group(i)
        rg_bytes = sum(rg.column(j).total_compressed_size for j in range(rg.num_columns))
        if i > first and acc + rg_bytes > split_bytes:
            pieces.append(Piece(url, "parquet", first, i))
            first, acc = i, 0
        acc += rg_bytes
    pieces.append(Piece(url, "parquet", first, meta.num_row_groups if pieces else None))
    return pieces


# --------------------------------------------------------------------------- opening streams


def open_decompressed(url: str, compression: str | None) -> BinaryIO:
    """A readable binary stream of ``url`` through fsspec, decompressed on the fly if asked.

    Raises ``InputError`` naming the file if it does not exist or cannot be opened.
    """
    try:
        raw = fs.open_url(url, "rb")
    except FileNotFoundError as exc:
        raise InputError(f"{url}: no such file") from exc
    except OSError as exc:
        raise InputError(f"{url}: cannot open ({exc})") from exc
    if compression is None:
        return raw
    try:
        if compression == "gzip":
            stream = gzip.GzipFile(fileobj=raw, mode="rb")
        elif compression == "bz2":
            stream = bz2.BZ2File(raw, mode="rb")
        elif compression == "xz":
            stream = lzma.LZMAFile(raw, mode="rb")
        elif compression == "zstd":
            import zstandard

            checked = ZstdFrameCheck(raw)
            stream = zstandard.ZstdDecompressor().stream_reader(checked, read_across_frames=True)
            return _Decompressing(stream, raw, url, compression, check=checked)
        else:
            raise ValueError(f"{url}: unknown compression {compression!r}")
    except BaseException:
        raw.close()
        raise
    return _Decompressing(stream, raw, url, compression)


class _Decompressing:
    """A decompressing stream that also closes the underlying raw file, reports a corrupt
    stream as ``InputError`` naming the file, and tells how many compressed bytes it consumed
    (``raw_tell``). A zero-byte file reads as empty, whatever its extension."""

    def __init__(self, stream, raw, url: str, compression: str, check=None) -> None:
        self._stream = stream
        self._raw = raw
        self._url = url
        self._compression = compression
        self._check = check

    def read(self, n: int = -1) -> bytes:
        try:
            data = self._stream.read(n)
            if not data and n != 0 and self._check is not None:
                self._check.finish()
            return data
        except Exception as exc:  # BadGzipFile/OSError, EOFError, LZMAError, ZstdError...
            if isinstance(exc, EOFError) and self._raw.tell() == 0:
                return b""
            raise InputError(
                f"{self._url}: corrupt or truncated {self._compression} data ({exc})"
            ) from exc

    def raw_tell(self) -> int:
        return self._raw.tell()

    def close(self) -> None:
        try:
            self._stream.close()
        finally:
            self._raw.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc) -> None:
        self.close()


class ZstdFrameCheck:
    """Pass-through reader of compressed zstd bytes that follows the frame layout (RFC 8878:
    frame header, block headers, optional checksum; skippable frames) without decompressing,
    so that a file cut inside a frame is an error. python-zstandard's ``stream_reader`` just
    reports end-of-data there (gzip, bz2 and xz raise ``EOFError``). Work is per block header
    (blocks are up to 128 KB), not per byte.
    """

    _MAGIC = 0xFD2FB528

    def __init__(self, raw) -> None:
        self._raw = raw
        self._buf = b""  # bytes of the header being collected
        self._need = 4  # header bytes wanted, in state _state
        self._skip = 0  # bytes to pass over before the next header
        self._state = "magic"
        self._checksum = False

    def read(self, n: int = -1) -> bytes:
        data = self._raw.read(n)
        self._feed(data)
        return data

    def finish(self) -> None:
        """Raise ``EOFError`` unless the data seen so far ends at a frame boundary."""
        while True:  # the decompressor may stop reading before the raw end: check the rest
            rest = self._raw.read(CHUNK_BYTES)
            if not rest:
                break
            self._feed(rest)
        if self._state != "magic" or self._buf or self._skip:
            raise EOFError("zstd data ends inside a frame")

    def _feed(self, data: bytes) -> None:
        i, n = 0, len(data)
        while i < n:
            if self._skip:
                k = min(self._skip, n - i)
                self._skip -= k
                i += k
                continue
            take = min(self._need - len(self._buf), n - i)
            self._buf += data[i : i + take]
            i += take
            if len(self._buf) == self._need:
                header, self._buf = self._buf, b""
                self._parse(header)

    def _parse(self, header: bytes) -> None:
        state = self._state
        if state == "magic":
            magic = int.from_bytes(header, "little")
            if magic == self._MAGIC:
                self._state, self._need = "descriptor", 1
            elif magic & 0xFFFFFFF0 == 0x184D2A50:  # skippable frame
                self._state, self._need = "skippable", 4
            else:
                raise ValueError("not zstd data (bad frame magic number)")
        elif state == "descriptor":
            fhd = header[0]
            single = (fhd >> 5) & 1
            self._checksum = bool((fhd >> 2) & 1)
            window = 0 if single else 1
            dict_id = (0, 1, 2, 4)[fhd & 3]
            content_size = ((1 if single else 0), 2, 4, 8)[fhd >> 6]
            self._skip = window + dict_id + content_size
            self._state, self._need = "block", 3
        elif state == "skippable":
            self._skip = int.from_bytes(header, "little")
            self._state, self._need = "magic", 4
        elif state == "block":
            value = int.from_bytes(header, "little")
            last, kind, size = value & 1, (value >> 1) & 3, value >> 3
            if kind == 3:
                raise ValueError("corrupt zstd block (reserved block type)")
            self._skip = 1 if kind == 1 else size
            if not last:
                self._need = 3
            elif self._checksum:
                self._state, self._need = "checksum", 4
            else:
                self._state, self._need = "magic", 4
        else:  # checksum
            self._state, self._need = "magic", 4


def open_piece(piece: Piece) -> BinaryIO:
    """Open the stream for a byte-range piece, positioned for ``LineReader`` (see ``start_of``)."""
    stream = open_decompressed(piece.url, piece.compression)
    if piece.start > 0:
        stream.seek(piece.start - 1)
    return stream


def consumed_bytes(stream, end_pos: int) -> int:
    """Bytes of the input file behind a span ending at ``end_pos`` of a whole-file read: the
    compressed size for a compressed stream, else ``end_pos`` itself."""
    return stream.raw_tell() if isinstance(stream, _Decompressing) else end_pos


# --------------------------------------------------------------------------- lines


class LineReader:
    """Lines of a binary stream, with their byte offsets, in bounded memory.

    Iterating yields ``(start, line, too_long)``: ``start`` is the offset of the line's first
    byte, ``line`` its bytes without the ``\\n`` (a ``\\r`` stays; callers strip). A line longer
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
    ) -> None:
        self._stream = stream
        self._start = start
        self._limit = max_line_bytes
        self._chunk = chunk_bytes
        self.pos = start
        self.bom = 0  # 3 once a byte-order mark was dropped at offset 0

    def __iter__(self) -> Iterator[tuple[int, bytes, bool]]:
        read = self._stream.read
        limit = self._limit
        if self._start > 0:
            pos = self._start - 1
            drop = True  # the partial line before the first line start >= start
        else:
            pos = 0
            drop = False
        bom = 0
        carry = b""  # the current (unfinished) line, while it is within the limit
        # Once the current line is over the limit: its length so far, its first HEAD_BYTES
        # and whether it has a non-whitespace byte. These depend only on the line, never on
        # where chunks were cut, so every range classifies the line the same way.
        long_len = -1
        long_head = b""
        long_text = False
        first = pos == 0
        while True:
            chunk = read(self._chunk)
            if not chunk:
                break
            if first:
                first = False
                while len(chunk) < 3 and BOM.startswith(chunk):  # a short first read
                    more = read(self._chunk)
                    if not more:
                        break
                    chunk += more
                if chunk.startswith(BOM):
                    bom = self.bom = 3
                    chunk = chunk[3:]
            parts = chunk.split(b"\n")
            last = parts.pop()
            if parts:
                # parts[0] completes the current line
                head = parts[0]
                if long_len >= 0:
                    length = long_len + len(head)
                    if len(long_head) < HEAD_BYTES:
                        long_head += head[: HEAD_BYTES - len(long_head)]
                    long_text = long_text or bool(head.strip())
                    item = (pos, long_head if long_text else b"", True)
                else:
                    line = carry + head if carry else head
                    length = len(line)
                    item = (pos, line, False) if length <= limit else _too_long(pos, line)
                pos += length + 1 + bom
                bom = 0
                carry, long_len = b"", -1
                if drop:
                    drop = False
                else:
                    self.pos = pos
                    yield item
                for line in islice(parts, 1, None):
                    start = pos
                    pos += len(line) + 1
                    self.pos = pos
                    yield (start, line, False) if len(line) <= limit else _too_long(start, line)
                carry = last
            elif long_len >= 0:
                long_len += len(last)
                if len(long_head) < HEAD_BYTES:
                    long_head += last[: HEAD_BYTES - len(long_head)]
                long_text = long_text or bool(last.strip())
                continue
            else:
                carry = carry + last if carry else last
            if len(carry) > limit:  # the unfinished line went over the limit: stop keeping it
                long_len = len(carry)
                long_head = carry[:HEAD_BYTES]
                long_text = bool(carry.strip())
                carry = b""
        # a last line without a final newline
        if carry or long_len >= 0:
            if long_len >= 0:
                item, length = (pos, long_head if long_text else b"", True), long_len
            else:
                item, length = (pos, carry, False), len(carry)
            pos += length + bom
            if not drop:
                self.pos = pos
                yield item
        elif bom:  # the file is just a BOM
            pos += bom
        self.pos = pos


def _too_long(start: int, line: bytes) -> tuple[int, bytes, bool]:
    return (start, line[:HEAD_BYTES] if line.strip() else b"", True)


def piece_lines(stream, piece: Piece, max_line_bytes: int) -> LineReader:
    """The ``LineReader`` of a piece opened with ``open_piece``."""
    return LineReader(
        stream, piece.start, max_line_bytes=max_line_bytes, chunk_bytes=chunk_size_for(piece)
    )


class OwnedLines:
    """The lines a text, WikiExtractor or JSONL piece owns, and the bytes of its span.

    These readers follow the same ownership rules (see the module docstring) and differ only in
    their boundary line, ``is_boundary(line, too_long)``: a blank line, a ``<doc`` line, any line.
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
        lines = self._lines
        it = iter(lines)
        if self._piece.start == 0:
            return it
        for first in it:
            if self._is_boundary(first[1], first[2]):
                break
        else:
            self._span_start = self._span_end = lines.pos
            return iter(())
        self._span_start = first[0]
        return chain([first], it)

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
        self._stream.close()


def chunk_size_for(piece: Piece) -> int:
    """Read size for a piece: smaller for small ranges (they mostly read a little past ``end``)."""
    if piece.end is None:
        return CHUNK_BYTES
    return max(MIN_CHUNK_BYTES, min(CHUNK_BYTES, piece.end - piece.start + MIN_CHUNK_BYTES // 4))


def is_blank(line: bytes, too_long: bool = False) -> bool:
    """Whether a line is whitespace only, as ``str.strip`` sees it after UTF-8 decoding
    (so ``\\r``, NBSP and ideographic spaces count as whitespace, invalid bytes do not).

    For a line the ``LineReader`` flagged ``too_long``, ``line`` is only its kept head: such a
    line is blank only when nothing was kept."""
    if too_long:
        return not line
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
