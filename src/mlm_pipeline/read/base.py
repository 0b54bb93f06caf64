"""The input-format contract, the registry of formats, and the types every reader shares.

An input format is one ``InputFormat`` object, registered once under its name (the built-in
ones in ``read/__init__.py``, one line each). It answers three questions, and the rest of the
package asks only through the registry:

* **detect**: does a file's name (``claims_name``) or its first bytes (``claims_head``) say it
  is this format? A name claim beats a content claim; with no claim, the ``fallback`` format.
* **split**: ``split`` cuts one file into ``Piece``s (byte ranges aligned on document
  boundaries by the reader, whole files, or the format's own units) without reading its data
  where it can; ``piece_bytes`` tells the planner what a piece weighs.
* **read**: ``read`` yields the documents one piece owns, each a non-empty list of non-empty
  sentence strings, counting what it does not yield in ``ReadStats`` by reason.

Shared helpers do the common work: ``compression`` (gz/bz2/zst/xz), ``ranges`` (nominal byte
ranges, and ``OwnedLines``: which lines a range owns), ``sentences`` (segmentation).
"""

from __future__ import annotations

import copy
import json
import re
from abc import ABC, abstractmethod
from dataclasses import dataclass, field, fields
from itertools import islice
from typing import Any, Callable, Iterator

from mlm_pipeline.errors import ConfigError, InputError
from mlm_pipeline.read.compression import COMPRESSIONS
from mlm_pipeline.read.sample import InputSample
from mlm_pipeline.stats import ReadStats

DECODE_ERROR_POLICIES = ("replace", "skip", "fail")


@dataclass(frozen=True)
class Piece:
    """A unit of input: ``[start, end)`` of one file in its format's ``unit`` (``end=None``: to
    the end of the file).

    Byte-range formats count bytes; Parquet counts row groups. ``compression`` is set for a file
    read through the shared decompression, which is always read whole (``start=0``,
    ``end=None``). ``extra`` holds format-specific facts a reader needs for this piece (JSON
    values: a side file's URL, where a header ends...); it is left out of ``to_dict`` when unset.
    """

    url: str
    fmt: str
    start: int = 0
    end: int | None = None
    compression: str | None = None
    extra: dict[str, Any] | None = field(default=None, hash=False)

    def describe(self) -> str:
        unit = _FORMATS[self.fmt].unit if self.fmt in _FORMATS else "bytes"
        end = "end" if self.end is None else str(self.end)
        return f"{self.url} [{unit} {self.start}:{end}]"

    def validate(self) -> None:
        """Raise ``ValueError`` if the piece cannot be read as stated."""
        get_input_format(self.fmt)
        if self.start < 0 or (self.end is not None and self.end < self.start):
            raise ValueError(f"{self.describe()}: invalid range")
        if self.compression is not None:
            if self.compression not in COMPRESSIONS.values():
                raise ValueError(
                    f"{self.url}: unknown compression {self.compression!r}; "
                    f"expected one of {sorted(COMPRESSIONS.values())}"
                )
            if self.start != 0 or self.end is not None:
                raise ValueError(f"{self.describe()}: a compressed file is read whole")

    def to_dict(self) -> dict:
        """The piece as JSON values (``Piece(**d)`` rebuilds it); the keys in field order, as
        ``dataclasses.asdict`` gives them (spelt out: ``asdict`` costs 25 µs a piece, seconds for
        the 200,000 pieces of a 10 TB plan)."""
        d = {"url": self.url, "fmt": self.fmt, "start": self.start, "end": self.end, "compression": self.compression}
        if self.extra is not None:
            d["extra"] = copy.deepcopy(self.extra)
        return d


LANGUAGE_CODE = re.compile(r"[A-Za-z0-9]{1,8}(?:[_-][A-Za-z0-9]{1,8}){0,3}")
"""A language code as a run takes it: BCP 47's shape (en, zh, zh-Hans, und; _ allowed)."""


def record_language(value: object) -> str | None:
    """A record's language field as a code, or None when it holds none (missing, empty, not one)."""
    return value if isinstance(value, str) and LANGUAGE_CODE.fullmatch(value) else None


class Document(list):
    """A document's sentences (a ``list[str]``) that also carry what its record says of it: its
    language (``ReadOptions.language_field``), its id (``id_field``, as a string) and its
    metadata (``metadata_field``, as compact JSON text); readers give plain lists otherwise."""

    __slots__ = ("language", "id", "metadata")

    def __init__(self, sentences=(), language: str | None = None, id: str | None = None,
                 metadata: str | None = None):
        super().__init__(sentences)
        self.language = language
        self.id = id
        self.metadata = metadata

    def with_sentences(self, sentences) -> "Document":
        """The same record's facts over other sentences (its paragraphs, segmented)."""
        return Document(sentences, self.language, self.id, self.metadata)


def metadata_fields(option: str | None) -> tuple[str, ...]:
    """``--metadata-field``'s names: one field, or several comma-separated (``url,domain``)."""
    return tuple(name.strip() for name in option.split(",") if name.strip()) if option else ()


def record_id(value: object) -> str | None:
    """A record's id as a string (an integer or other JSON value in its text form), None when the
    record has none (missing or null)."""
    if value is None:
        return None
    return value if isinstance(value, str) else json.dumps(value, ensure_ascii=False, separators=(",", ":"),
                                                          default=str)


def record_metadata(get: Callable[[str], object], names: tuple[str, ...]) -> str:
    """A record's metadata as compact JSON text: the value of the one field ``names`` holds (an
    object, as datatrove writes), or an object of the several fields named (NeMo Curator keeps
    extra fields at the top level), a field the record lacks as null. Keys keep their order."""
    value = get(names[0]) if len(names) == 1 else {name: get(name) for name in names}
    return json.dumps(value, ensure_ascii=False, separators=(",", ":"), default=str)


def record_document(paragraphs: list[str], options: "ReadOptions", get: Callable[[str], object],
                    stats: ReadStats) -> list[str]:
    """``paragraphs`` as a :class:`Document` with what ``options`` asks to keep of its record
    (``get(field)``: the record's value, None when it has none), or as they are when nothing is
    asked. A record without an id gets the empty string, counted as ``documents_without_id``."""
    if options.language_field is None and options.id_field is None and options.metadata_field is None:
        return paragraphs
    doc_id = None
    if options.id_field is not None:
        doc_id = record_id(get(options.id_field))
        if doc_id is None:
            stats.documents_without_id += 1
            doc_id = ""
    names = metadata_fields(options.metadata_field)
    return Document(paragraphs,
                    record_language(get(options.language_field)) if options.language_field is not None else None,
                    doc_id, record_metadata(get, names) if names else None)


@dataclass(frozen=True)
class ReadOptions:
    """Reader settings. Each field that the run config also has takes its value from there
    (``from_config``), so a format's setting is one config field plus one field here.

    on_decode_error: ``replace`` (U+FFFD, document kept, counted), ``skip`` (document dropped,
    counted as ``invalid_utf8``) or ``fail`` (raise ``InputError``).
    max_line_bytes: a line longer than this is not decoded; its document is skipped as
    ``line_too_long`` (memory stays bounded by this, not by the line).
    sentence_split: text format: each line is a paragraph, split into sentences by the segmenter.
    max_document_bytes: a text/WikiExtractor document that grows past this many bytes is
    emitted in consecutive parts of about this size (cut at line ends), so memory stays bounded
    even for a file that has no document separators at all. Nothing is dropped. A run's is its
    ``block_bytes``: a task's block holds a whole part, so a bigger part made a bigger block
    (a 64 MiB part took a worker past 1 GB).
    wiki_*: the Wikipedia dump's settings (``wikidump_format``): its multistream index (None:
    the one beside the dump), the namespace numbers read (comma-separated), and whether section
    headings, table text and the reference sections and citation list items are kept.
    unknown_text: what replaces a word its input marks as unknown (WikiText's ``<unk>``): a run
    sets the text its tokenizer encodes to the unknown token (so it is counted as one); empty
    (the default, e.g. when training a vocab): such words are dropped.
    language_field: JSONL and Parquet: the field or column naming each record's language; its
    documents are :class:`Document` objects with that ``language`` (a record without a valid code in
    it: ``None``, the file's label then applies).
    id_field, metadata_field: JSONL and Parquet: the field holding each record's id, and the
    field (or comma-separated fields) holding its metadata, kept on its :class:`Document`
    (:func:`record_document`) so that instances can name the records they come from.
    """

    text_field: str = "text"
    sentence_split: bool = False
    on_decode_error: str = "replace"
    max_line_bytes: int = 1 << 20
    max_document_bytes: int = 4 << 20  # (the default --block-size)
    wiki_index: str | None = None
    wiki_namespaces: str = "0"
    wiki_keep_headings: bool = False
    wiki_keep_tables: bool = False
    wiki_keep_references: bool = False
    unknown_text: str = ""
    language_field: str | None = None  # JSONL/Parquet: the field naming a record's language
    id_field: str | None = None  # JSONL/Parquet: the field holding a record's id
    metadata_field: str | None = None  # JSONL/Parquet: the field(s) holding a record's metadata

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

    @classmethod
    def from_config(cls, config: object) -> ReadOptions:
        """The options of a run: every field the config (any object) has an attribute for, and
        its ``block_bytes`` as ``max_document_bytes``."""
        values = {f.name: getattr(config, f.name) for f in fields(cls) if hasattr(config, f.name)}
        if hasattr(config, "block_bytes"):
            values.setdefault("max_document_bytes", config.block_bytes)
        return cls(**values)


class InputFormat(ABC):
    """One input format: how to detect it, split a file of it, and read one piece.

    Subclass it, set ``name``, implement ``split`` and ``read`` (and the detection methods that
    apply), then ``register_input_format(MyFormat())``. Everything a method needs comes in its
    arguments; a format keeps no per-run state (workers call ``read`` on pieces in any order,
    in other processes).
    """

    name: str = ""
    """Registry key, recorded in each ``Piece`` and in the plan (``--input-format NAME``)."""

    unit: str = "bytes"
    """What ``Piece.start``/``Piece.end`` count, for messages (``row groups`` for Parquet)."""

    fallback: bool = False
    """Auto-detection's answer when no format claims a file (exactly one format: ``text``)."""

    def claims_name(self, sample: InputSample) -> bool:
        """Whether the file's name says it is this format (an extension, a naming scheme).
        Called before any content is read; may raise ``InputError`` for a name this format
        recognises but cannot read (a compressed Parquet file)."""
        return False

    def claims_head(self, sample: InputSample) -> bool:
        """Whether the file's first bytes (``sample.head()``, ``sample.first_line()``) say it
        is this format. Asked only when no format claims the name."""
        return False

    def binary_reason(self, sample: InputSample) -> str | None:
        """Why a file given as this format must be skipped as not text, or None to read it.
        The default flags NUL bytes, control characters and invalid UTF-8 in the head and
        known binary signatures; a binary format (Parquet) answers None."""
        return sample.binary_reason()

    def side_files(self, url: str, options: ReadOptions) -> tuple[str, ...]:
        """Files this input reads besides itself (an index beside a dump). The planner drops
        them from the inputs, so a directory holding both is read once, as this format."""
        return ()

    @abstractmethod
    def split(self, url: str, size: int, split_bytes: int, options: ReadOptions) -> list[Piece]:
        """The pieces of one file of ``size`` bytes, in file order, each about ``split_bytes``
        of input; every document of the file must belong to exactly one piece. An empty file
        gives one piece (which yields nothing). ``ranges.byte_ranges`` cuts nominal ranges."""

    def piece_bytes(self, piece: Piece, file_size: int, n_pieces: int) -> int:
        """The input bytes of ``piece`` (one of the ``n_pieces`` of a file of ``file_size``
        bytes), for grouping pieces into tasks and for progress. Default: its byte range."""
        end = file_size if piece.end is None else piece.end
        return max(0, end - piece.start)

    def read_extent(self, piece: Piece, options: ReadOptions,
                    following: tuple[int, int | None] | None = None) -> tuple[int, int | None] | None:
        """The bytes ``[start, end)`` of its file that reading ``piece`` depends on, exactly
        (``end=None``: to the end of the file), which a resumed run checks for changes; None (the
        default) when that is not known beyond its range: a reader may go past its end (to finish
        a document), so its range is checked together with the file's size. A line-based format
        knows where its reader stops (:func:`~mlm_pipeline.read.ranges.line_read_extent`).
        ``following``: the next piece's end and extent's end, found first (pieces are asked last
        to first), which a search past this piece's end may stop at."""
        return None

    @abstractmethod
    def read(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
        """The documents ``piece`` owns, in file order, each a non-empty list of non-empty
        stripped sentences. Count each yielded document (``stats.documents_read``,
        ``sentences``, ``documents_with_replaced_bytes``), the bytes of the piece
        (``bytes_read``, summing to the file size over its pieces) and every document not
        yielded (``stats.skip(reason)``). Raise ``InputError`` for input that cannot be read."""

    def read_runs(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[list[str]]]:
        """The documents of :meth:`read`, given out in runs (non-empty lists of consecutive
        documents), for a caller that handles many at once. A format that reads a run of
        documents in bulk gives it as one; the default groups what :meth:`read` yields."""
        documents = self.read(piece, options, stats)
        return iter(lambda: list(islice(documents, DOCUMENTS_PER_RUN)), [])


DOCUMENTS_PER_RUN = 256
"""Documents the default :meth:`InputFormat.read_runs` groups into one run."""


# --------------------------------------------------------------------------- the registry

_FORMATS: dict[str, InputFormat] = {}


def register_input_format(fmt: InputFormat) -> InputFormat:
    """Make ``fmt`` known under ``fmt.name`` (to detection, planning, reading and the config's
    ``input_format``) in this process. Raises ``ValueError`` for a taken or invalid name, or a
    second fallback format.

    Worker processes (the local pool, Ray) start afresh and know the formats registered when
    ``mlm_pipeline.read`` is imported, i.e. its registry lines; a format registered later at run
    time is read by in-process runs (``workers=1``) only.
    """
    if not isinstance(fmt, InputFormat):
        raise ValueError(f"{fmt!r} is not an InputFormat")
    name = fmt.name
    if not name or name == "auto" or not name.replace("-", "").replace("_", "").isalnum():
        raise ValueError(f"invalid input format name {name!r} (letters, digits, - and _; not 'auto')")
    if name in _FORMATS:
        raise ValueError(f"input format {name!r} is already registered")
    if fmt.fallback and any(f.fallback for f in _FORMATS.values()):
        raise ValueError(f"input format {name!r}: there is already a fallback format")
    _FORMATS[name] = fmt
    return fmt


def unregister_input_format(name: str) -> None:
    """Forget a format registered with ``register_input_format`` (for tests and plug-in reloads)."""
    _FORMATS.pop(name, None)


def get_input_format(name: str) -> InputFormat:
    """The format registered as ``name``; ``ConfigError`` (a ``ValueError``) if there is none."""
    try:
        return _FORMATS[name]
    except KeyError:
        raise ConfigError(
            f"unknown format {name!r}; expected one of {', '.join(_FORMATS)}"
        ) from None


def input_format_names() -> tuple[str, ...]:
    """Names of the registered formats, in registration order."""
    return tuple(_FORMATS)


def detect_format(url: str | InputSample) -> str:
    """The format of a file: the first registered format that claims its name, else the first
    that claims its head (read only then), else the fallback format."""
    sample = url if isinstance(url, InputSample) else InputSample(url)
    formats = list(_FORMATS.values())
    for fmt in formats:
        if fmt.claims_name(sample):
            return fmt.name
    for fmt in formats:
        if fmt.claims_head(sample):
            return fmt.name
    for fmt in formats:
        if fmt.fallback:
            return fmt.name
    raise InputError(f"{sample.url}: no input format recognises this file; set --input-format")


def sniff(url: str, fmt: str | None = None) -> str | None:
    """Why ``url``, read as ``fmt`` (detected when None), must be skipped as binary, or None."""
    sample = InputSample(url)
    return get_input_format(fmt or detect_format(sample)).binary_reason(sample)


def iter_documents(piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
    """Documents (non-empty lists of non-empty, stripped sentences) that ``piece`` owns, read by
    its format (see ``InputFormat.read``)."""
    piece.validate()
    return _FORMATS[piece.fmt].read(piece, options, stats)


def iter_document_runs(piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[list[str]]]:
    """The documents of :func:`iter_documents` in runs (``InputFormat.read_runs``): the same
    documents, in the same order, a list at a time."""
    piece.validate()
    return _FORMATS[piece.fmt].read_runs(piece, options, stats)
