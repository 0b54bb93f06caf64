"""Shared reader types and the format registry."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Iterator

from mlm_pipeline.stats import ReadStats

FORMATS = ("text", "wikiextractor", "jsonl", "parquet")
COMPRESSIONS = {".gz": "gzip", ".bz2": "bz2", ".zst": "zstd", ".xz": "xz"}


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


@dataclass(frozen=True)
class ReadOptions:
    """Reader settings that come from the run config.

    on_decode_error: ``replace`` (U+FFFD, document kept, counted), ``skip`` (document dropped,
    counted as ``invalid_utf8``) or ``fail`` (raise ``InputError``).
    max_line_bytes: a line longer than this is not decoded; its document is skipped as
    ``line_too_long`` (memory stays bounded by this, not by the line).
    """

    text_field: str = "text"
    on_decode_error: str = "replace"
    max_line_bytes: int = 1 << 20


Reader = Callable[[Piece, ReadOptions, ReadStats], Iterator[list[str]]]
