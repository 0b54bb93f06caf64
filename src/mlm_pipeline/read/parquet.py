"""Parquet: one document per row, the text in column ``options.text_field``.

Read through the fsspec file object with ``pyarrow.parquet.ParquetFile``, only the text column,
only the piece's row groups (``Piece.start``/``end`` are row-group indices, end exclusive),
in record batches so memory stays bounded by a batch. The column may be ``string``,
``large_string``, ``binary`` or ``large_binary``; values are taken as bytes and decoded under
``options.on_decode_error`` like the other formats (Parquet writers do not all validate UTF-8).
Segmentation as for JSONL. A null value is skipped as ``bad_record``, empty text as ``empty``,
text with NUL characters as ``binary``. ``bytes_read`` counts the compressed size of the text
column chunks read.
"""

from __future__ import annotations

from typing import Iterator

from mlm_pipeline.errors import InputError
from mlm_pipeline.read.base import InputFormat, Piece, ReadOptions, metadata_fields, record_document
from mlm_pipeline.read.compression import compression_of, open_decompressed
from mlm_pipeline.read.sample import InputSample
from mlm_pipeline.read.sentences import paragraphs_of, segment_documents
from mlm_pipeline.stats import ReadStats

BATCH_ROWS = 256
"""Rows per record batch: memory is one row group's compressed text column plus a batch."""


class ParquetFormat(InputFormat):
    """parquet: one document per row in column --text-field, split into sentences; detected by
    a ``.parquet`` name. A file is cut into runs of row groups (from its footer)."""

    name = "parquet"
    unit = "row groups"

    def claims_name(self, sample: InputSample) -> bool:
        if sample.extension != ".parquet":
            return False
        if sample.compression is not None:
            raise InputError(f"{sample.url}: a compressed Parquet file is not supported; decompress it")
        return True

    def binary_reason(self, sample: InputSample) -> str | None:
        return None  # binary by design; a file that is not Parquet fails on its footer

    def split(self, url: str, size: int, split_bytes: int, options: ReadOptions) -> list[Piece]:
        # the footer is read here anyway: a missing or non-text column stops the run at planning,
        # before the output is recorded, not in the middle of it
        return split_row_groups(url, split_bytes, text_field=options.text_field,
                                record_fields=tuple(record_fields(options, language=False)))

    def piece_bytes(self, piece: Piece, file_size: int, n_pieces: int) -> int:
        return max(1, file_size // max(1, n_pieces))  # row groups: the file shared evenly

    def read(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
        if piece.compression is not None:
            raise ValueError(f"{piece.url}: Parquet files cannot be compressed as a whole")
        return read_parquet(piece, options, stats)


def record_fields(options: ReadOptions, *, language: bool = True) -> list[str]:
    """The columns besides the text that ``options`` keeps of each row (its language, id, metadata)."""
    names = [options.language_field] if language and options.language_field is not None else []
    names += [options.id_field] if options.id_field is not None else []
    return names + list(metadata_fields(options.metadata_field))


def split_row_groups(url: str, split_bytes: int, *, text_field: str | None = None,
                     record_fields: tuple[str, ...] = ()) -> list[Piece]:
    """Runs of consecutive row groups of about ``split_bytes`` compressed bytes each (reads the
    footer). A file with no row group gives one piece (which yields nothing). With
    ``text_field``, ``InputError`` if the file has no such text column; ``InputError`` too if it
    lacks a column of ``record_fields`` (``--id-field``, ``--metadata-field``: a misspelt name
    would otherwise give every row an empty id)."""
    import pyarrow.parquet as pq

    if split_bytes < 1:
        raise ValueError(f"split_bytes must be >= 1, got {split_bytes}")
    if compression_of(url) is not None:
        raise InputError(f"{url}: a compressed Parquet file is not supported; decompress it")
    with open_decompressed(url, None) as f:
        try:
            meta = pq.read_metadata(f)
        except Exception as exc:  # pyarrow raises ArrowInvalid/OSError for a bad footer
            raise InputError(f"{url}: not a readable Parquet file ({exc})") from exc
    if text_field is not None:
        _check_text_column(url, meta.schema.to_arrow_schema(), text_field)
    missing = [name for name in record_fields if name not in meta.schema.to_arrow_schema().names]
    if missing:
        raise InputError(f"{url}: no column {', '.join(map(repr, missing))} (--id-field, --metadata-field); columns: "
                         f"{', '.join(meta.schema.to_arrow_schema().names)}")
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


def _check_text_column(url: str, schema, field: str) -> None:
    """``InputError`` unless ``schema`` has a string (or binary) column ``field``."""
    import pyarrow as pa

    if field not in schema.names:
        raise InputError(f"{url}: no column {field!r}; columns: {', '.join(schema.names)} (choose one with --text-field)")
    kind = schema.field(field).type
    if not (pa.types.is_string(kind) or pa.types.is_large_string(kind) or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)):
        raise InputError(f"{url}: column {field!r} has type {kind}, expected a string")


def read_parquet(piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
    """Documents of the row groups of ``piece``, each a list of sentences."""
    return segment_documents(_paragraph_docs(piece, options, stats), stats)


def _paragraph_docs(
    piece: Piece, options: ReadOptions, stats: ReadStats
) -> Iterator[tuple[list[str], bool]]:
    import pyarrow as pa
    import pyarrow.parquet as pq

    field = options.text_field
    policy = options.on_decode_error
    with open_decompressed(piece.url, None) as f:
        try:
            pf = pq.ParquetFile(f, pre_buffer=False)
        except Exception as exc:  # ArrowInvalid / OSError on a bad footer
            raise InputError(f"{piece.url}: not a readable Parquet file ({exc})") from exc
        _check_text_column(piece.url, pf.schema_arrow, field)
        kind = pf.schema_arrow.field(field).type
        n_groups = pf.metadata.num_row_groups
        stop = n_groups if piece.end is None else piece.end
        if stop > n_groups:
            raise InputError(
                f"{piece.describe()}: the file has only {n_groups} row groups"
            )
        groups = list(range(piece.start, stop))
        if not groups:
            return
        stats.bytes_read += _column_bytes(pf.metadata, groups, field)
        as_bytes = pa.large_binary() if pa.types.is_large_string(kind) else pa.binary()
        row = 0
        # --language-field, --id-field, --metadata-field: the record's columns the file has
        names = pf.schema_arrow.names
        kept = [name for name in dict.fromkeys(record_fields(options)) if name in names and name != field]
        columns = [field, *kept]
        for batch in pf.iter_batches(
            batch_size=BATCH_ROWS, row_groups=groups, columns=columns, use_threads=False
        ):
            column = batch.column(0)
            values = {name: batch.column(k + 1).to_pylist() for k, name in enumerate(kept)}
            if pa.types.is_string(kind) or pa.types.is_large_string(kind):
                column = column.cast(as_bytes)
            for i, value in enumerate(column.to_pylist()):
                row += 1
                if value is None:
                    stats.skip("bad_record")
                    continue
                if b"\x00" in value:
                    stats.skip("binary")
                    continue
                try:
                    text, replaced = value.decode("utf-8"), False
                except UnicodeDecodeError as exc:
                    if policy == "replace":
                        text, replaced = value.decode("utf-8", "replace"), True
                    elif policy == "skip":
                        stats.skip("invalid_utf8")
                        continue
                    else:
                        raise InputError(
                            f"{piece.url}: invalid UTF-8 in column {field!r}, row {row - 1} of "
                            f"row groups {piece.start}:{stop} (byte {exc.start} of the value); "
                            "use --on-decode-error replace or skip to continue past such bytes"
                        ) from exc
                paragraphs = paragraphs_of(text)
                if not paragraphs:
                    stats.skip("empty")
                    continue
                yield record_document(paragraphs, options, lambda name: values[name][i] if name in values else None,
                                      stats), replaced


def _column_bytes(meta, groups: list[int], field: str) -> int:
    total = 0
    for i in groups:
        rg = meta.row_group(i)
        for j in range(rg.num_columns):
            col = rg.column(j)
            if col.path_in_schema == field:
                total += col.total_compressed_size
    return total
