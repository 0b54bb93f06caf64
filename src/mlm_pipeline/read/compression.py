"""Compressed input, shared by every format: open a file through ``fs`` and decompress it on the fly.

The compression is named by the file extension (``.gz``, ``.bz2``, ``.zst``, ``.xz``). A corrupt
or truncated stream is an ``InputError`` naming the file, for every compression (zstd included,
see ``ZstdFrameCheck``). A compressed stream cannot be entered in the middle, so the byte-range
formats read a compressed file as one whole piece.
"""

from __future__ import annotations

import bz2
import gzip
import lzma
import os
from typing import BinaryIO

from mlm_pipeline import fs
from mlm_pipeline.errors import InputError

COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".xz": "xz"}
"""File extension -> compression name."""

CHECK_READ_BYTES = 1 << 20
"""Read size when ``ZstdFrameCheck.finish`` walks the rest of a file."""


def compression_of(url: str) -> str | None:
    """Compression named by the file extension (``gzip``, ``bz2``, ``zstd``, ``xz``) or None."""
    return COMPRESSIONS.get(os.path.splitext(url)[1].lower())


def strip_compression_ext(url: str) -> str:
    """``url`` without its compression extension (``a.jsonl.gz`` -> ``a.jsonl``)."""
    root, ext = os.path.splitext(url)
    return root if ext.lower() in COMPRESSIONS else url


def read_head(url: str, n: int, *, size: int | None = None) -> bytes:
    """The first ``n`` bytes of a file, decompressed if its extension names a compression.

    Only the head is decompressed, and only about ``n`` bytes are fetched (``fs.open_head``;
    ``size``, if known, spares a metadata request). Raises ``InputError`` if the file is missing,
    unreadable or not valid data of its compression.
    """
    with open_decompressed(url, compression_of(url), head_bytes=n, size=size) as stream:
        head = stream.read(n)
        while 0 < len(head) < n:  # a decompressor may return less than asked before the end
            more = stream.read(n - len(head))
            if not more:
                break
            head += more
        return head


def open_decompressed(
    url: str, compression: str | None, *, head_bytes: int | None = None, size: int | None = None
) -> BinaryIO:
    """A readable binary stream of ``url`` through fsspec, decompressed on the fly if asked
    (``head_bytes``: to read only about that much, see ``fs.open_head``).

    Raises ``InputError`` naming the file if it does not exist or cannot be opened.
    """
    try:
        raw = fs.open_url(url, "rb") if head_bytes is None else fs.open_head(url, head_bytes, size=size)
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
            rest = self._raw.read(CHECK_READ_BYTES)
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


def consumed_bytes(stream, end_pos: int) -> int:
    """Bytes of the input file behind a span ending at ``end_pos`` of a whole-file read: the
    compressed size for a compressed stream, else ``end_pos`` itself."""
    return stream.raw_tell() if isinstance(stream, _Decompressing) else end_pos
