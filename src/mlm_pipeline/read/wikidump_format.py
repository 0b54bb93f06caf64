"""Input format ``wikidump``: a Wikipedia dump (MediaWiki XML export) as a plug-in of the registry.

The reading is done by ``wikidump`` (pages, filters, pieces), ``wikitext`` (wikitext to plain
text) and ``bz2blocks`` (entering a bz2 file in the middle); this module answers the registry's
questions with them:

* **detect**: a Wikimedia dump name (``…pages-articles….xml…``, not its index), else a head whose
  root element is ``<mediawiki`` (UTF-8 or UTF-16, so the generic binary check, which flags
  UTF-16's NUL bytes, is not applied to a dump).
* **side files**: the multistream index (``--wiki-index``, else the one beside the dump), so a
  directory holding both is read once, as a dump.
* **split**: ``split_dump``. A ``.bz2`` dump is cut by this format itself (whole streams by the
  index, else bz2 blocks), so its pieces carry no ``Piece.compression``: the shared
  decompression would read the file as one whole piece and decompress it a second time. A
  piece's ``extra`` holds what the whole dump shares (kind, encoding, namespace names of
  ``<siteinfo>``), read once at planning time.
* **read**: ``read_dump_piece`` with the ``--wiki-*`` settings.
"""

from __future__ import annotations

import re
from typing import Iterator

from mlm_pipeline import fs
from mlm_pipeline.errors import InputError
from mlm_pipeline.read.base import InputFormat, Piece, ReadOptions
from mlm_pipeline.read.sample import SNIFF_BYTES, InputSample
from mlm_pipeline.read.wikidump import WikiOptions, find_index, is_wikidump, read_dump_piece, split_dump
from mlm_pipeline.stats import ReadStats

_DUMP_NAME = re.compile(r"pages-articles[^/]*\.xml")
"""Wikimedia's names: ``enwiki-20261101-pages-articles-multistream.xml.bz2``,
``…-pages-articles1.xml-p1p41242.bz2``, ``…-pages-articles.xml`` (the index is a ``.txt``)."""


def is_dump_name(url: str) -> bool:
    """Whether a file is named as Wikimedia names a ``pages-articles`` dump (its index is not)."""
    base = url.rsplit("/", 1)[-1].lower()
    return _DUMP_NAME.search(base) is not None and "-index" not in base


def wiki_options(options: ReadOptions) -> WikiOptions:
    """The dump reader's settings from a run's reader settings."""
    return WikiOptions(
        namespaces=frozenset(int(n) for n in options.wiki_namespaces.split(",") if n.strip()),
        keep_headings=options.wiki_keep_headings,
        keep_tables=options.wiki_keep_tables,
        keep_references=options.wiki_keep_references,
        on_decode_error=options.on_decode_error,
    )


class WikiDumpFormat(InputFormat):
    """wikidump: a Wikipedia dump (multistream or single-stream .xml.bz2, or .xml), one document
    per article; detected by its ``pages-articles`` name or its ``<mediawiki`` root element."""

    name = "wikidump"

    def claims_name(self, sample: InputSample) -> bool:
        return is_dump_name(sample.url)

    def claims_head(self, sample: InputSample) -> bool:
        return is_wikidump(sample.head(4096))

    def binary_reason(self, sample: InputSample) -> str | None:
        if is_wikidump(sample.head(SNIFF_BYTES)[:4096]):
            return None
        return sample.binary_reason()

    def side_files(self, url: str, options: ReadOptions) -> tuple[str, ...]:
        index = self._index(url, options)
        return (index,) if index is not None else ()

    def split(self, url: str, size: int, split_bytes: int, options: ReadOptions) -> list[Piece]:
        pieces = split_dump(url, split_bytes, index_url=self._index(url, options))
        return [Piece(url, self.name, start, end, None, meta) for start, end, meta in pieces]

    def read_extent(self, piece: Piece, options: ReadOptions, following=None) -> tuple[int, int | None] | None:
        """A multistream piece is whole streams, whose pages end in them: exactly its range. A
        piece of a plain XML or single-stream dump finishes its last page past its end: unknown."""
        return (piece.start, piece.end) if (piece.extra or {}).get("kind") == "multistream" else None

    def read(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
        if piece.compression is not None or not piece.extra:
            raise ValueError(f"{piece.describe()}: a dump piece comes from WikiDumpFormat.split")
        index = self._index(piece.url, options) if piece.extra.get("kind") == "multistream" else None
        return read_dump_piece(piece.url, piece.start, piece.end, piece.extra, wiki_options(options), stats, index)

    @staticmethod
    def _index(url: str, options: ReadOptions) -> str | None:
        """The multistream index of the dump: the one set (``split_dump`` refuses it for a plain
        XML dump), else the one beside a ``.bz2`` dump, if any."""
        if options.wiki_index is None:
            return find_index(url)
        if not fs.exists(options.wiki_index):
            raise InputError(f"{options.wiki_index}: no such file (the --wiki-index of {url})")
        found = fs.expand_inputs([options.wiki_index])  # spelled as the planner spells inputs
        if len(found) != 1:
            raise InputError(f"--wiki-index {options.wiki_index} names {len(found)} files; name one")
        return found[0]
