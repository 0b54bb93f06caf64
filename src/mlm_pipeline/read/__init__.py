"""Readers: turn one planned piece of input into documents (lists of sentence strings).

Contract (every format):

    iter_documents(piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]

* A ``Piece`` is (url, start, end) — a byte range of one file, or the whole file when ``end`` is
  ``None`` (compressed files, small files), or for Parquet a range of row groups.
* A byte-range reader yields exactly the documents that the range *owns* (see ``ranges.py``), so
  the union over the pieces of a file is every document of the file exactly once.
* Each yielded document is a non-empty list of non-empty sentence strings. What cannot be used is
  counted in ``stats.documents_skipped`` by reason, never dropped silently.
"""

from mlm_pipeline.read.base import Piece, ReadOptions, detect_format, iter_documents

__all__ = ["Piece", "ReadOptions", "detect_format", "iter_documents"]
