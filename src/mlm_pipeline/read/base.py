"""Shared reader types, format detection, binary sniffing and the format registry.

The registry (``READERS``) maps a format name to its reader function; ``iter_documents``
dispatches a ``Piece`` through it. Reader modules import this one, so each format's reader is
imported on first use instead of at import time (no import cycle, and no import of what a run
does not read).
"""

from __future__ import annotations

import importlib
import os
import re
from dataclasses import dataclass
from typing import Callable, Iterator

from mlm_pipeline.stats import ReadStats

FORMATS = ("text", "wikiextractor", "jsonl", "parquet")
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".xz": "xz"}
DECODE_ERROR_POLICIES = ("replace", "skip", "fail")
JSONL_EXTENSIONS = (".jsonl", ".json", ".ndjson")
PARQUET_EXTENSIONS = (".parquet",)
SNIFF_BYTES = 8192


class InputError(ValueError):
    """A user-facing problem with an input (missing, unreadable, not of the stated format)."""


@dataclass(frozen=True)
class Piece:
    """A unit of input: a byte range ``[start, end)`` of one file (``end=None``: to the end).

    For Parquet, ``start``/``end`` count row groups instead of bytes. ``compression`` is set for
    compressed files, which are always read whole (``start=0``, ``end=None``).
    """

    url: str
    fmt: str
    start: int = 0
    end: int | None = None
    compression: str | None = None

    def describe(self) -> str:
        unit = "row groups" if self.fmt == "parquet" else "bytes"
        end = "end" if self.end is None else str(self.end)
        return f"{self.url} [{unit} {self.start}:{end}]"

    def validate(self) -> None:
        """Raise ``ValueError`` if the piece cannot be read as stated."""
        if self.fmt not in FORMATS:
            raise ValueError(f"{self.url}: unknown format {self.fmt!r}; expected one of {FORMATS}")
        if self.start < 0 or (self.end is not None and self.end < self.start):
            raise ValueError(f"{self.describe()}: invalid range")
        if self.compression is not None:
            if self.compression not in COMPRESSIONS.values():
                raise ValueError(
                    f"{self.url}: unknown compression {self.compression!r}; "
                    f"expected one of {sorted(COMPRESSIONS.values())}"
                )
            if self.fmt == "parquet":
                raise ValueError(f"{self.url}: Parquet files cannot be compressed as a whole")
            if self.start != 0 or self.end is not None:
                raise ValueError(f"{self.describe()}: a compressed file is read whole")


@dataclass(frozen=True)
class ReadOptions:
    """Reader settings that come from the run config.

    on_decode_error: ``replace`` (U+FFFD, document kept, counted), ``skip`` (document dropped,
    counted as ``invalid_utf8``) or ``fail`` (raise ``InputError``).
    max_line_bytes: a line longer than this is not decoded; its document is skipped as
    ``line_too_long`` (memory stays bounded by this, not by the line).
    max_document_bytes: a text/WikiExtractor document that grows past this many bytes is
    emitted in consecutive parts of about this size (cut at line ends), so memory stays bounded
    even for a file that has no document separators at all. Nothing is dropped.
    """

    text_field: str = "text"
    on_decode_error: str = "replace"
    max_line_bytes: int = 1 << 20
    max_document_bytes: int = 64 << 20

    def __post_init__(self) -> None:
        if self.on_decode_error not in DECODE_ERROR_POLICIES:
            raise ValueError(
                f"on_decode_error must be one of {DECODE_ERROR_POLICIES}, "
                f"got {self.on_decode_error!r}"
            )
        if not isinstance(self.text_field, str) or not self.text_field:
            raise ValueError(f"text_field must be a non-empty string, got {self.text_field!r}")
        if self.max_line_bytes < 1:
            raise ValueError(f"max_line_bytes must be >= 1, got {self.max_line_bytes}")
        if self.max_document_bytes < 1:
            raise ValueError(f"max_document_bytes must be >= 1, got {self.max_document_bytes}")


Reader = Callable[[Piece, ReadOptions, ReadStats], Iterator[list[str]]]

READERS: dict[str, Reader] = {}
"""Format name -> reader function. Filled on first use (per format, by ``_reader``)."""

# Where each format's reader lives: imported only when that format is read (the segmenter that
# JSONL, Parquet and WikiExtractor input need costs ~50 ms to import; plain text never needs it).
_READER_MODULES = {
    "text": ("mlm_pipeline.read.text", "read_text"),
    "wikiextractor": ("mlm_pipeline.read.wikiextractor", "read_wikiextractor"),
    "jsonl": ("mlm_pipeline.read.jsonl", "read_jsonl"),
    "parquet": ("mlm_pipeline.read.parquet", "read_parquet"),
}


def _reader(fmt: str) -> Reader:
    reader = READERS.get(fmt)
    if reader is None:
        module, name = _READER_MODULES[fmt]
        reader = READERS[fmt] = getattr(importlib.import_module(module), name)
    return reader


def _registry() -> dict[str, Reader]:
    """Every reader (imports them all)."""
    for fmt in _READER_MODULES:
        _reader(fmt)
    return READERS


def iter_documents(piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
    """Documents (non-empty lists of non-empty, stripped sentences) that ``piece`` owns.

    Counts every yielded document, its sentences and the bytes of the range in ``stats``; every
    document that is not yielded is counted in ``stats.documents_skipped`` by reason.
    """
    piece.validate()
    return _reader(piece.fmt)(piece, options, stats)


def compression_of(url: str) -> str | None:
    """Compression named by the file extension (``gzip``, ``bz2``, ``zstd``, ``xz``) or None."""
    return COMPRESSIONS.get(os.path.splitext(url)[1].lower())


def _strip_compression_ext(url: str) -> str:
    root, ext = os.path.splitext(url)
    return root if ext.lower() in COMPRESSIONS else url


def read_head(url: str, n: int = SNIFF_BYTES) -> bytes:
    """The first ``n`` bytes of a file, decompressed if its extension names a compression.

    Only the head is decompressed. Raises ``InputError`` if the file is missing, unreadable or
    not valid data of its compression.
    """
    from mlm_pipeline.read.ranges import open_decompressed

    with open_decompressed(url, compression_of(url)) as stream:
        head = stream.read(n)
        while 0 < len(head) < n:  # a decompressor may return less than asked before the end
            more = stream.read(n - len(head))
            if not more:
                break
            head += more
        return head


def detect_format(url: str) -> str:
    """The input format of ``url``, from its name or, failing that, its first non-blank line.

    ``.jsonl``/``.json``/``.ndjson`` -> ``jsonl`` and ``.parquet`` -> ``parquet`` (after removing
    a compression extension); otherwise a first non-blank line starting with ``<doc `` means
    ``wikiextractor``, one starting with ``{`` means ``jsonl``, anything else ``text``.
    """
    ext = os.path.splitext(_strip_compression_ext(url))[1].lower()
    if ext in JSONL_EXTENSIONS:
        return "jsonl"
    if ext in PARQUET_EXTENSIONS:
        if compression_of(url):
            raise InputError(f"{url}: a compressed Parquet file is not supported; decompress it")
        return "parquet"
    head = read_head(url, 64 * 1024)
    if head.startswith(b"\xef\xbb\xbf"):
        head = head[3:]
    for line in head.split(b"\n"):
        line = line.strip()
        if line:
            if line.startswith(b"<doc ") or line.startswith(b"<doc>"):
                return "wikiextractor"
            if line.startswith(b"{"):
                return "jsonl"
            return "text"
    return "text"


# Control characters that do not occur in text (tab, LF, FF, CR, BS and ESC are allowed).
_NON_TEXT = re.compile("[\x00-\x07\x0b\x0e-\x1a\x1c-\x1f\x7f]")


def sniff(url: str) -> str | None:
    """A reason string if ``url`` looks like a binary (non-text) file, else None.

    Reads only the first ~8 KB (decompressing only that much for a compressed file). Parquet
    files (by extension) are never flagged. Flags more than 1% NUL bytes (at least 2), or a head where more than 30% of the
    characters are control characters or invalid UTF-8, and names common binary signatures
    (Parquet, gzip, zstd, ...) when the file extension does not say so.
    """
    ext = os.path.splitext(_strip_compression_ext(url))[1].lower()
    if ext in PARQUET_EXTENSIONS and not compression_of(url):
        return None
    head = read_head(url)
    if not head:
        return None
    hint = _signature_hint(head)
    if hint:  # a known binary container under a text name
        return f"binary data{hint}"
    nuls = head.count(b"\x00")
    # a stray NUL in a text file costs one document (skipped as "binary" by the reader); many
    # NULs mean the file is not text at all
    if nuls > max(1, len(head) // 100):
        return f"{nuls} NUL bytes in the first {len(head)} bytes{hint}"
    text = head.decode("utf-8", "replace")
    if len(head) == SNIFF_BYTES:  # the head may end inside a character
        text = text[:-1] if text.endswith("\ufffd") else text
    bad = text.count("\ufffd") + len(_NON_TEXT.findall(text))
    if text and bad / len(text) > 0.30:
        return (
            f"{100 * bad / len(text):.0f}% control characters or invalid UTF-8 in the first "
            f"{len(head)} bytes{hint}"
        )
    return None


_SIGNATURES = (
    (b"PAR1", "Parquet (name it *.parquet)"),
    (b"\x1f\x8b", "gzip-compressed (name it *.gz)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed (name it *.zst)"),
    (b"BZh", "bzip2-compressed (name it *.bz2)"),
    (b"\xfd7zXZ\x00", "xz-compressed (name it *.xz)"),
    (b"PK\x03\x04", "a zip archive"),
)


def _signature_hint(head: bytes) -> str:
    for magic, what in _SIGNATURES:
        if head.startswith(magic):
            return f"; it looks like {what}"
    return ""
