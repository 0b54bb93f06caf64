"""Readers: one plug-in per input format, and the registry that the rest of the package asks.

A new input format is one module here (an ``InputFormat`` subclass, see ``base.py`` for the
contract) plus one ``register_input_format`` line below. Registration order decides ties in
auto-detection (the first format that claims a file wins).

Reading contract (every format): ``iter_documents(piece, options, stats)`` yields the documents
a ``Piece`` owns, each a non-empty list of non-empty sentence strings; over the pieces of a file,
every document exactly once (``iter_document_runs``: the same, a list of documents at a time).
What cannot be used is counted in ``stats.documents_skipped`` by reason, never dropped silently.
"""

from mlm_pipeline.read.base import (
    InputFormat,
    Piece,
    ReadOptions,
    detect_format,
    get_input_format,
    input_format_names,
    iter_document_runs,
    iter_documents,
    register_input_format,
    sniff,
    unregister_input_format,
)
from mlm_pipeline.read.jsonl import JsonLinesFormat
from mlm_pipeline.read.parquet import ParquetFormat
from mlm_pipeline.read.sample import InputSample
from mlm_pipeline.read.text import TextFormat
from mlm_pipeline.read.wikidump_format import WikiDumpFormat
from mlm_pipeline.read.wikiextractor import WikiExtractorFormat
from mlm_pipeline.read.wikitext_dataset import WikiTextDatasetFormat

register_input_format(TextFormat())
register_input_format(WikiExtractorFormat())
register_input_format(WikiTextDatasetFormat())
register_input_format(WikiDumpFormat())
register_input_format(JsonLinesFormat())
register_input_format(ParquetFormat())

__all__ = [
    "InputFormat",
    "InputSample",
    "Piece",
    "ReadOptions",
    "detect_format",
    "get_input_format",
    "input_format_names",
    "iter_document_runs",
    "iter_documents",
    "register_input_format",
    "sniff",
    "unregister_input_format",
]
