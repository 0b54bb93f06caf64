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

from mlm_pipeline.read.base import InputError, Piece, ReadOptions
from mlm_pipeline.read.ranges import open_decompressed
from mlm_pipeline.read.sentences import paragraphs_of, segment_documents
from mlm_pipeline.stats import ReadStats

BATCH_ROWS = 256
"""Rows per record batch: memory is one row group's compressed text column plus a batch."""


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
        schema = pf.schema_arrow
        if field not in schema.names:
            raise InputError(
                f"{piece.url}: no column {field!r}; columns: {', '.join(schema.names)} "
                "(choose one with --text-field)"
            )
        kind = schema.field(field).type
        if not (
            pa.types.is_string(kind)
            or pa.types.is_large_string(kind)
            or pa.types.is_binary(kind)
            or pa.types.is_large_binary(kind)
        ):
            raise InputError(f"{piece.url}: column {field!r} has type {kind}, expected a string")
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
        for batch in pf.iter_batches(
            batch_size=BATCH_ROWS, row_groups=groups, columns=[field], use_threads=False
        ):
            column = batch.column(0)
            if pa.types.is_string(kind) or pa.types.is_large_string(kind):
                column = column.cast(as_bytes)
            for value in column.to_pylist():
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
                yield paragraphs, replaced


def _column_bytes(meta, groups: list[int], field: str) -> int:
    total = 0
    for i in groups:
        rg = meta.row_group(i)
        for j in range(rg.num_columns):
            col = rg.column(j)
            if col.path_in_schema == field:
                total += col.total_compressed_size
    return total
