"""What an output format is: a shard writer and a shard reader under one name.

A format is an :class:`OutputFormat` value (composition, no base class to inherit): the name
recorded in the manifest's ``format`` field, which is also the shard files' extension, a function
that opens a writer on a binary file, a function that reads a whole shard, and optionally one
that opens a shard for reading row ranges (the torch loader reads windows of rows) and one that
reads a shard's :class:`ShardLayout` without its data. Formats are looked up by name in the
registry of :mod:`mlm_pipeline.formats`.
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Protocol

import numpy as np

if TYPE_CHECKING:
    from mlm_pipeline.instances.batch import InstanceBatch

__all__ = ["OutputFormat", "ShardLayout", "ShardRows", "ShardWriter", "WholeShardRows", "named"]

# what a reader raises on bytes it cannot decode (a damaged or truncated shard); the exception
# then says which shard. (A message that already starts with the shard's URL is a reader's own,
# such as "has 10 rows, rows up to 20 requested", and is passed on as it is.)
_READ_ERRORS = (OSError, ValueError, TypeError, IndexError, KeyError, EOFError)


def named(url: str, exc: BaseException) -> BaseException:
    """``exc`` as it should reach the user: a :class:`ShardDamaged` naming ``url``, unless it
    already names it."""
    from mlm_pipeline.errors import ShardDamaged

    if isinstance(exc, ShardDamaged) or str(exc).startswith(url):
        return exc
    return ShardDamaged(url, exc)

_NAME = re.compile(r"[a-z][a-z0-9_]*")

UINT16_VOCAB = 1 << 16
"""Vocabularies up to this many entries store ids as uint16, larger ones as uint32 (mmBERT's 256k)."""


def id_dtype(vocab_size: int) -> np.dtype:
    """The unsigned type a format stores token ids in for a tokenizer of ``vocab_size`` entries:
    uint16 while every id fits, else uint32 (one rule for Parquet, MDS and HF datasets; Megatron's
    is its own library's)."""
    return np.dtype(np.uint16 if vocab_size <= UINT16_VOCAB else np.uint32)


def string_array(values):
    """Strings as an Arrow string array built from its buffers: ``pa.array`` would import pandas
    (when it is installed) to probe for its types, 0.2 s of a run's start-up."""
    import pyarrow as pa

    encoded = [str(v).encode() for v in values]
    offsets = np.zeros(len(encoded) + 1, np.int32)
    np.cumsum([len(e) for e in encoded], out=offsets[1:])
    return pa.StringArray.from_buffers(len(encoded), pa.py_buffer(offsets), pa.py_buffer(b"".join(encoded)))


def string_lists(values: np.ndarray, offsets: np.ndarray):
    """Rows of strings (``values`` cut by ``offsets``) as an Arrow ``list<string>`` array: the
    ``document_ids`` and ``document_metadata`` columns of Parquet and HF shards."""
    import pyarrow as pa

    offsets = np.ascontiguousarray(offsets, dtype=np.int32)
    return pa.ListArray.from_arrays(pa.Array.from_buffers(pa.int32(), len(offsets), [None, pa.py_buffer(offsets)]),
                                    string_array(values))


def string_list_values(column) -> tuple[np.ndarray, np.ndarray]:
    """A ``list<string>`` column (chunked or not) as (its rows' strings back to back, an object
    array; offsets int64 from 0): what :func:`string_lists` was given."""
    arr = column.combine_chunks() if hasattr(column, "combine_chunks") else column
    if len(arr) == 0:  # (an empty array may have no offsets buffer)
        return np.zeros(0, object), np.zeros(1, np.int64)
    offsets = np.frombuffer(arr.buffers()[1], np.int32, count=len(arr) + 1, offset=4 * arr.offset).astype(np.int64)
    values = arr.values.slice(int(offsets[0]), int(offsets[-1] - offsets[0]))
    return np.array(values.to_pylist(), dtype=object), offsets - offsets[0]


class ShardWriter(Protocol):
    """Appends blocks of instances to one shard file (an open binary file it does not close).

    Two optional members, which the shard sink uses where a writer has them: ``room(batch) -> int``,
    how many of the block's first rows the shard can still take (a format whose shards are also cut
    by bytes: MDS), and ``shard_entry``, a dict set by ``close`` that the sink adds to the shard's
    manifest entry (what the format's ``run_files`` need to know of the shard).
    """

    def write(self, batch: InstanceBatch) -> None: ...

    def close(self) -> dict[str, bytes] | None:
        """Finish the file's content (footers, indexes); the caller closes the file. Returns the
        bytes of the format's companion files (:attr:`OutputFormat.companions`), if it has any."""


class ShardRows(Protocol):
    """One shard opened for reading row ranges; it may keep the file open between calls."""

    def read(self, start: int, stop: int) -> InstanceBatch:
        """Rows ``[start, stop)``; ``ValueError`` if the shard has fewer rows than ``stop``."""

    def close(self) -> None: ...


@dataclass(frozen=True)
class ShardLayout:
    """What the loader plans an epoch with before it reads a shard's rows.

    ``row_groups``: the rows of each row group, in order. A row group is the smallest part a
    reader can read without reading its neighbours (a format without them has one: the shard),
    so the loader cuts its epoch at row-group boundaries and each is read by one reader.
    ``lengths``: tokens per row, when asked for (length bins need every rank's lengths).
    ``footer``: the format's parsed index of the shard (Parquet's footer), handed back to
    ``open_rows`` so that a reader does not read it again.
    """

    row_groups: np.ndarray
    lengths: np.ndarray | None = None
    footer: Any = None


@dataclass(frozen=True)
class OutputFormat:
    """An output format: its name, its writer and its readers.

    Attributes:
        name: the manifest's ``format`` value and, unless ``suffix`` says otherwise, the shard
            files' extension (``part-….NAME``): lowercase letters, digits and ``_``.
        open_writer: ``open_writer(f, *, max_seq_length, max_predictions, vocab_size, **_) ->
            ShardWriter`` for an open binary file ``f`` (the limits are those of the run, and
            ``vocab_size`` its tokenizer's, ``None`` when unknown; ``masking`` its ``static`` or
            ``none``, ``None`` when unknown; a format may ignore them, and takes ``**_`` for
            settings added later). The shard sink also passes ``task_id`` and ``first_row`` (the
            task's instances in its earlier shards, for formats that number rows), ``objective``
            and ``mds_compression``.
            ``max_predictions`` 0 means the run's instances carry no masks and no NSP labels and
            the layout has no masked-LM slots (ELECTRA's): TFRecord then writes only
            ``input_ids``, ``input_mask`` and ``segment_ids``.
        read_shard: ``read_shard(url) -> InstanceBatch``, the whole shard at a local path or
            fsspec URL.
        open_rows: ``open_rows(url) -> ShardRows`` for reading row ranges without reading the
            whole shard; ``None`` if the format has no such access (:meth:`rows` then reads the
            shard once and slices it). With ``read_layout``, also ``open_rows(url, footer=...)``.
        read_layout: ``read_layout(url, lengths) -> ShardLayout`` without reading the rows'
            data; ``None``: :meth:`layout` takes the shard as one row group and, for lengths,
            reads it whole.
        run_files: ``run_files(manifest) -> {relative path: bytes}``, the files a format's own
            readers need beside the shards (an index of every shard, say), built from the
            manifest alone, never from its ``created`` time, so that every finisher of a run
            writes the same bytes. They are written before ``manifest.json``: a reader that
            finds the manifest finds them too. ``None``: the shards are all there is.
        suffix: the shard files' extension, without its dot, where another library's readers
            know the files by one other than the name (``hf``'s shards are ``.arrow``, which
            ``datasets`` reads as Arrow; Megatron's ``.bin``); ``None``: the name.
        companions: extensions of files each shard has beside it (Megatron's ``.idx``), named as
            the shard with the extension replaced. The writer's ``close()`` returns their bytes
            (``{extension: bytes}``); the sink commits them before the shard, so a shard that
            exists has its companions, and records each one's size and digest in the shard's
            manifest entry (``companions``), which ``verify`` and resume check as they check the shard.
        layout_version: raised when the shards' layout changes (a column's type): a run records
            it, and one started under another version is not resumed, so no output mixes both.
        carries_sources: the format writes and reads the batch's ``document_ids`` and
            ``document_metadata`` (each row's source records: ``--id-field``,
            ``--metadata-field``); a run asking for them with another format is refused.
    """

    name: str
    open_writer: Callable[..., ShardWriter]
    read_shard: Callable[[str], InstanceBatch]
    open_rows: Callable[..., ShardRows] | None = None
    read_layout: Callable[[str, bool], ShardLayout] | None = None
    run_files: Callable[[dict], dict[str, bytes]] | None = None
    suffix: str | None = None
    companions: tuple[str, ...] = ()
    layout_version: int = 1
    carries_sources: bool = False

    def __post_init__(self) -> None:
        if not isinstance(self.name, str) or not _NAME.fullmatch(self.name):
            raise ValueError(
                f"an output format's name is its shard files' extension: lowercase letters, digits and _ "
                f"starting with a letter, got {self.name!r}"
            )
        if self.suffix is not None and not (isinstance(self.suffix, str) and _NAME.fullmatch(self.suffix)):
            raise ValueError(f"output format {self.name!r}: suffix is the shard files' extension without its dot: "
                             f"lowercase letters, digits and _ starting with a letter, got {self.suffix!r}")
        for field in ("open_writer", "read_shard"):
            if not callable(getattr(self, field)):
                raise ValueError(f"output format {self.name!r}: {field} must be callable")
        for field in ("open_rows", "read_layout", "run_files"):
            if getattr(self, field) is not None and not callable(getattr(self, field)):
                raise ValueError(f"output format {self.name!r}: {field} must be callable or None")
        for extension in self.companions:
            if not re.fullmatch(r"\.[a-z0-9_]+", extension):
                raise ValueError(f"output format {self.name!r}: an extension is a dot and lowercase letters, digits "
                                 f"or _, got {extension!r}")

    @property
    def extension(self) -> str:
        """The shard files' extension, with its dot."""
        return f".{self.suffix or self.name}"

    def read(self, url: str) -> InstanceBatch:
        """The whole shard at ``url``; an error reading it names the shard (:func:`named`)."""
        try:
            return self.read_shard(url)
        except _READ_ERRORS as exc:
            raise named(url, exc) from exc

    def rows(self, url: str, footer: Any = None) -> ShardRows:
        """A shard opened for reading row ranges (the format's own access, else whole-shard reads),
        with the ``footer`` of its :meth:`layout` if there is one; an error reading it names the
        shard (:func:`named`)."""
        if self.open_rows is not None:
            return _NamedRows(self.open_rows, url, footer)
        return WholeShardRows(self.read, url)

    def layout(self, url: str, *, instances: int, lengths: bool = False) -> ShardLayout:
        """The shard's :class:`ShardLayout` (``instances``: its row count, as the manifest says);
        an error reading it names the shard (:func:`named`)."""
        try:
            if self.read_layout is not None:
                return self.read_layout(url, lengths)
            return ShardLayout(np.array([instances], np.int64), self.read_shard(url).lengths if lengths else None)
        except _READ_ERRORS as exc:
            raise named(url, exc) from exc


class _NamedRows:
    """A format's row access whose errors name the shard."""

    def __init__(self, open_rows: Callable[..., ShardRows], url: str, footer: Any = None):
        self._url = url
        try:
            self._rows = open_rows(url) if footer is None else open_rows(url, footer=footer)
        except _READ_ERRORS as exc:
            raise named(url, exc) from exc

    def read(self, start: int, stop: int) -> InstanceBatch:
        try:
            return self._rows.read(start, stop)
        except _READ_ERRORS as exc:
            raise named(self._url, exc) from exc

    def close(self) -> None:
        self._rows.close()

    def __getattr__(self, name: str):  # anything else is the format's own reader's
        if name == "_rows":  # (not set yet: unpickling, a failed open)
            raise AttributeError(name)
        return getattr(self._rows, name)


class WholeShardRows:
    """Row ranges of a shard read whole once (for formats without row-range access)."""

    def __init__(self, read_shard: Callable[[str], InstanceBatch], url: str):
        self._read_shard = read_shard
        self._url = url
        self._batch: InstanceBatch | None = None

    def read(self, start: int, stop: int) -> InstanceBatch:
        if self._batch is None:
            self._batch = self._read_shard(self._url)
        if stop > len(self._batch):
            raise ValueError(f"{self._url}: has {len(self._batch)} rows, rows up to {stop} requested")
        return self._batch.slice(start, stop)

    def close(self) -> None:
        self._batch = None
