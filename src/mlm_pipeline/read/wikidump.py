"""Wikipedia dumps (MediaWiki XML export): detect, split across workers, read pages.

One article is one document; its wikitext is cleaned by ``wikitext.clean_wikitext`` and its
paragraphs split into sentences by the segmenter. Accepted inputs: multistream dumps
(``*-multistream.xml.bz2`` with the ``*-multistream-index.txt.bz2`` beside it or given),
single-stream ``.xml.bz2`` (per-part dumps such as ``pages-articles1.xml-p1p41242.bz2`` too),
and plain ``.xml``; UTF-8 or UTF-16, with or without ``<siteinfo>``.

Pieces: ``split_dump`` gives ``(start, end, meta)`` byte ranges of the file (``end=None``: to
the end). A range owns the pages whose ``<page>`` tag starts in its data, and reads past its end
to finish its last page, so every page is read by exactly one piece:

* plain XML: the data is the file's bytes ``[start, end)``;
* bz2: the data is that of the bz2 blocks the range owns (``bz2blocks``). Without an index the
  ranges are even cuts of the compressed file; with a multistream index they are runs of whole
  100-page streams balanced by compressed bytes (the first also holds the header stream), so no
  page crosses a piece boundary and no block search is needed.

``meta`` holds what the whole file shares, read once at planning time from its head: the kind
(``xml``, ``bz2``, ``multistream``), the text encoding and the namespace names of
``<siteinfo>`` (which make ``[[Fichier:…]]`` a file link in French).

Filtering, each skip counted in ``ReadStats.documents_skipped`` by reason, in this order:
``namespace`` (from ``<ns>``; namespace 0 only by default), ``redirect`` (the ``<redirect``
element, or ``#REDIRECT`` text in exports without it), ``disambiguation`` (a disambiguation or
set-index template, any case: ``{{disambiguation}}``, ``{{dab}}``, ``{{geodis}}``, ...; titles
are not used: 3 of the 8 in the bundled sample lack "(disambiguation)"), ``empty`` (nothing
left after cleaning); before them ``bad_page`` (damaged XML: no ``</page>`` before the next
``<page>``, or no ``</text>`` before ``</page>``) and, by ``on_decode_error``, ``invalid_utf8``.
A page's XML past ``MAX_PAGE_BYTES`` is not read (counted ``pages_cut``).

Why a scan, not an XML parser: pages are found with ``bytes.find`` on ``<page>``/``</page>``
and their few fields with ``str.find``; export XML has one fixed layout and escapes ``<`` in
text, so the tags cannot occur inside text (a damaged or forged dump where they do loses the
page they cut, counted, never the next one). On the bundled sample, scanning and parsing pages
cost under a tenth of the read (decompressing and cleaning are the rest).

Why one module: splitting and reading share the page-ownership rule above, so they stay side by
side (a change to one must be made to the other); the plug-in is ``wikidump_format.py``.
"""

from __future__ import annotations

import bz2
import logging
import os
import re
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from mlm_pipeline import fs
from mlm_pipeline.errors import InputError
from mlm_pipeline.read.bz2blocks import TAIL_BYTES, data_end, owned_blocks, whole_streams
from mlm_pipeline.stats import ReadStats

log = logging.getLogger("mlm_pipeline")

KINDS = ("xml", "bz2", "multistream")
FILE_NS, CATEGORY_NS = 6, 14
READ_BYTES = 1 << 20
HEAD_BYTES = 1 << 20
"""At most this much of the decompressed head is read to find ``<siteinfo>``."""
MAX_PAGE_BYTES = 8 << 20
"""A page's XML past this many bytes is not read (the page is cut, counted ``pages_cut``): memory
stays bounded whatever a page holds. Wikipedia accepts at most 2 MiB of wikitext a page, so an
article is cut only in a damaged or forged dump (its XML escapes and UTF-16 have room too)."""
WARNED_PAGES = 3
"""Pages skipped as ``bad_page`` or cut that are named in a warning, per task (all are counted)."""


@dataclass(frozen=True)
class WikiOptions:
    """How pages become documents.

    namespaces: the namespace numbers kept (``<ns>``; 0 = articles).
    keep_headings: section headings become paragraphs of their own (default: dropped).
    keep_tables: table captions and cells become paragraphs (default: tables dropped).
    keep_references: keep the reference sections (See also, Notes, References, Further reading,
    External links, ...) and the list items that are citations (default: dropped; see
    ``wikitext.is_reference_section`` and ``is_reference_line``).
    skip_disambiguation: drop disambiguation and set-index pages.
    on_decode_error: ``replace``, ``skip`` (counted ``invalid_utf8``) or ``fail``; also for a
    character reference to a UTF-16 surrogate (``&#xD800;``), which is no character.
    max_page_bytes: a page's XML is read up to this many bytes (``MAX_PAGE_BYTES``).
    """

    namespaces: frozenset[int] = field(default_factory=lambda: frozenset({0}))
    keep_headings: bool = False
    keep_tables: bool = False
    keep_references: bool = False
    skip_disambiguation: bool = True
    on_decode_error: str = "replace"
    max_page_bytes: int = MAX_PAGE_BYTES

    def __post_init__(self) -> None:
        if self.max_page_bytes < 1024:
            raise ValueError(f"max_page_bytes must be >= 1024, got {self.max_page_bytes}")
        if self.on_decode_error not in ("replace", "skip", "fail"):
            raise ValueError(
                f"on_decode_error must be replace, skip or fail, got {self.on_decode_error!r}"
            )
        object.__setattr__(self, "namespaces", frozenset(int(n) for n in self.namespaces))


# --------------------------------------------------------------------------- detection


_ROOT = re.compile(r"\A\ufeff?\s*(?:<\?xml[^>]*\?>\s*)?(?:<!--.*?-->\s*)*<mediawiki[\s>]", re.S)


def dump_encoding(head: bytes) -> str:
    """The text encoding of a dump from its first bytes (byte-order mark or NUL pattern)."""
    if head.startswith(b"\xff\xfe") or head[:2] == b"<\0":
        return "utf-16-le"
    if head.startswith(b"\xfe\xff") or head[:2] == b"\0<":
        return "utf-16-be"
    return "utf-8"


def is_wikidump(head: bytes) -> bool:
    """Whether the (decompressed) first bytes of a file open a MediaWiki XML export: the root
    element is ``<mediawiki``, after an optional byte-order mark and XML declaration."""
    encoding = dump_encoding(head)
    text = head[: len(head) - len(head) % 2] if encoding != "utf-8" else head
    return _ROOT.match(text.decode(encoding, "replace")) is not None


def is_bz2(url: str) -> bool:
    return url.lower().endswith(".bz2")


_INDEX_NAMES = (
    # enwiki-20261101-pages-articles-multistream.xml.bz2 -> …-multistream-index.txt.bz2
    (re.compile(r"\.xml\.bz2$"), "-index.txt.bz2"),
    # …-pages-articles-multistream1.xml-p1p41242.bz2 -> …-multistream-index1.txt-p1p41242.bz2
    (re.compile(r"multistream(\d+)\.xml-(p\d+p\d+)\.bz2$"), r"multistream-index\1.txt-\2.bz2"),
)


def find_index(url: str) -> str | None:
    """The multistream index beside a dump, named as Wikimedia names it, if it exists."""
    base = url.rsplit("/", 1)[-1]
    if "multistream" not in base or "index" in base:
        return None
    for pattern, repl in _INDEX_NAMES:
        if pattern.search(url):
            candidate = pattern.sub(repl, url)
            if candidate != url and fs.exists(candidate):
                return candidate
    return None


# --------------------------------------------------------------------------- planning


def split_dump(
    url: str, target_bytes: int, index_url: str | None = None
) -> list[tuple[int, int | None, dict]]:
    """The pieces of a dump: ``(start, end, meta)`` byte ranges of the file, in file order,
    about ``target_bytes`` each (``end=None``: to the end of the file).

    A ``.bz2`` dump with a multistream index (``index_url``, or found beside it) is cut at
    stream starts, balancing compressed bytes; any other ``.bz2`` and a plain ``.xml`` are cut
    evenly (the reader aligns on bz2 blocks and ``<page>`` tags). Reads only the head of the
    dump and the index.
    """
    if target_bytes < 1:
        raise ValueError(f"target_bytes must be >= 1, got {target_bytes}")
    other = url.lower().rsplit(".", 1)[-1]
    if other in ("gz", "zst", "xz"):
        raise InputError(
            f"{url}: a dump compressed with .{other} cannot be shared among workers; use the "
            "bz2 dump as Wikimedia publishes it, or decompress it to plain XML"
        )
    meta = read_header(url)
    size = fs.file_size(url)
    if is_bz2(url):
        index_url = index_url or find_index(url)
        if index_url is not None:
            meta["kind"] = "multistream"
            first_ids = read_stream_index(index_url)
            offsets = list(first_ids)
            cuts = _stream_cuts(offsets, target_bytes)
            _check_cuts(url, index_url, size, offsets[-1])
            check_index(url, index_url, first_ids, size, meta.get("encoding", "utf-8"), cuts)
        else:
            meta["kind"] = "bz2"
            cuts = list(range(target_bytes, size, target_bytes))
    else:
        if index_url is not None:
            raise InputError(f"{url}: a multistream index goes with a .bz2 dump, not plain XML")
        meta["kind"] = "xml"
        cuts = list(range(target_bytes, size, target_bytes))
    starts = [0, *cuts]
    ends: list[int | None] = [*cuts, None]
    return [(s, e, dict(meta)) for s, e in zip(starts, ends)]


def _stream_cuts(offsets: list[int], target: int) -> list[int]:
    """Stream starts at which to cut so that each piece holds about ``target`` bytes (never at
    the first page stream: the header stream before it holds no page). Taken from the index
    alone, not the file's size: a dump cut short (a download not finished) is planned as the
    whole dump, so once it is whole the same command resumes the same tasks."""
    cuts = []
    last = 0
    for offset in offsets[1:]:
        if offset - last >= target:
            cuts.append(offset)
            last = offset
    return cuts


def _check_cuts(url: str, index_url: str, size: int, last: int) -> None:
    """A stream listed past the file's end (``last``): the dump is incomplete; the tasks that
    read there fail, naming it (the index itself: ``check_index``)."""
    if last >= size:
        log.warning("%s ends at byte %d, but its index %s lists streams up to byte %d: the dump is incomplete "
                    "(a download not finished?); the tasks that read past its end fail until it is whole",
                    url, size, index_url, last)


_STREAM_START = re.compile(rb"BZh[1-9]1AY&SY")  # a bz2 stream header, then its first block's magic
_PAGE_ID = re.compile(rb"<page>.*?<id>(\d+)</id>", re.S)
ID_CHECK_BYTES = 4 << 20
"""At most this much of a stream is decompressed to find its first page id (a stream of 100
pages: its first block holds the first page)."""


def check_index(url: str, index_url: str, first_ids: dict[int, int], size: int, encoding: str,
                cuts: list[int] = ()) -> None:
    """Refuse a multistream index that is not this dump's, checking a few sampled streams (the
    first, the middle one and the last within the file, and the first two and last ``cuts`` of
    the plan; the other cuts are their tasks' to check): each offset must be a bz2 stream start
    (``BZh`` and a block's magic) and the stream's first page id the one the index lists for it.
    Without this another dump's index was taken silently (its streams made one task of a whole
    dump, or tasks that fail far into the run)."""
    offsets = list(first_ids)
    inside = [o for o in offsets if o < size]
    advice = (f"give the dump's own index (--wiki-index), or none (move {index_url} away) to have the "
              "dump cut by compressed bytes")
    if not inside:
        raise InputError(f"{index_url}: its first stream offset {offsets[0]} lies past the end of {url} "
                         f"({size} bytes): not this dump's multistream index; {advice}")
    sampled = sorted({inside[0], inside[len(inside) // 2], inside[-1], *[c for c in (*cuts[:2], *cuts[-1:]) if c < size]})
    with _open(url) as f:
        for offset in sampled:
            f.seek(offset)
            head = f.read(10)
            if not _STREAM_START.match(head):
                raise InputError(f"{index_url}: its stream offset {offset} is not the start of a bz2 stream in "
                                 f"{url}: the index is damaged or another dump's; {advice}")
        if encoding != "utf-8":
            return  # (ids not sought in UTF-16 text)
        for offset in (sampled[0], sampled[-1]):
            found = _first_page_id(f, offset)
            if found is not None and found != first_ids[offset]:
                raise InputError(
                    f"{index_url}: lists page {first_ids[offset]} first in the stream at byte {offset} of {url}, "
                    f"but that stream starts with page {found}: the index of another dump; {advice}")


def _first_page_id(f: BinaryIO, offset: int) -> int | None:
    """The id of the first page of the bz2 stream at ``offset`` (None: none found in its first
    ``ID_CHECK_BYTES``, or the stream is damaged: the tasks say so)."""
    f.seek(offset)
    decompressor = bz2.BZ2Decompressor()
    out = b""
    read = 0
    try:
        while read < ID_CHECK_BYTES and not decompressor.eof:
            chunk = f.read(64 * 1024)
            if not chunk:
                break
            read += len(chunk)
            out += decompressor.decompress(chunk)
            found = _PAGE_ID.search(out)
            if found:
                return int(found.group(1))
    except (OSError, EOFError):
        return None
    return None


_INDEX_LINE = re.compile(rb"(?:^|\n)(\d+):(\d+):")


def read_stream_offsets(index_url: str) -> list[int]:
    """The sorted stream offsets of a multistream index (``offset:page_id:title`` lines;
    ``.bz2``-compressed or plain text). Decompressed with ``indexed_bzip2`` on every core."""
    return list(read_stream_index(index_url))


def read_stream_index(index_url: str) -> dict[int, int]:
    """Stream offset -> the page id its index lists first in that stream (the stream's first
    page), in offset order: what ``check_index`` compares with the dump."""
    offsets: dict[bytes, bytes] = {}  # (a stream's 100 lines repeat its offset: dedupe first)
    carry = b""
    with _open_index(index_url) as f:
        while True:
            chunk = f.read(16 << 20)
            data = carry + chunk
            if not chunk:
                cut = len(data)
            else:
                cut = data.rfind(b"\n") + 1
            # the first line of each offset in this chunk (reversed: dict keeps the last value),
            # then the ones not seen in earlier chunks
            for offset, page in dict(reversed(_INDEX_LINE.findall(data, 0, cut))).items():
                offsets.setdefault(offset, page)
            carry = data[cut:]
            if not chunk:
                break
    if not offsets:
        raise InputError(f"{index_url}: no 'offset:page_id:title' line; not a multistream index")
    return {int(o): int(offsets[o]) for o in sorted(offsets, key=int)}


def _open_index(index_url: str):
    if not is_bz2(index_url):
        return _open(index_url)
    import indexed_bzip2

    raw = _open(index_url)
    try:
        return indexed_bzip2.open(raw, parallelization=os.cpu_count() or 1)
    except Exception as exc:  # indexed_bzip2 raises RuntimeError/ValueError on bad data
        raw.close()
        raise InputError(f"{index_url}: not a readable bz2 file ({exc})") from exc


def _open(url: str) -> BinaryIO:
    try:
        return fs.open_url(url, "rb")
    except FileNotFoundError as exc:
        raise InputError(f"{url}: no such file") from exc
    except OSError as exc:
        raise InputError(f"{url}: cannot open ({exc})") from exc


_SITEINFO_END = re.compile(rb"</siteinfo>|<page>")
_NAMESPACE = re.compile(r'<namespace\b[^>]*?\bkey="(-?\d+)"[^>]*?(?:/>|>([^<]*)</namespace>)')


def read_header(url: str) -> dict:
    """``{"encoding": …, "namespaces": {name: number}}`` from the head of a dump (decompressed
    up to ``</siteinfo>``; ``namespaces`` is empty for a dump without ``<siteinfo>``)."""
    with _open(url) as raw:
        stream = bz2.BZ2File(raw) if is_bz2(url) else raw
        head = b""
        try:
            while len(head) < HEAD_BYTES:
                chunk = stream.read(64 * 1024)
                if not chunk:
                    break
                head += chunk
                encoding = dump_encoding(head)
                if _SITEINFO_END.search(head if encoding == "utf-8" else _ascii_of(head, encoding)):
                    break
        except (OSError, EOFError) as exc:
            raise InputError(f"{url}: corrupt or truncated bz2 data at its start ({exc})") from exc
    if not is_wikidump(head[:4096]):
        raise InputError(f"{url}: not a MediaWiki XML dump (no <mediawiki> root element)")
    encoding = dump_encoding(head)
    text = _decode_head(head, encoding)
    end = text.find("</siteinfo>")
    namespaces = {}
    if end >= 0:
        for m in _NAMESPACE.finditer(text, 0, end):
            name = _xml_unescape(m.group(2) or "").strip()
            if name:
                namespaces[name] = int(m.group(1))
    return {"encoding": encoding, "namespaces": namespaces}


def _ascii_of(head: bytes, encoding: str) -> bytes:
    """The ASCII bytes of UTF-16 text (enough to look for tags)."""
    return head[::2] if encoding == "utf-16-le" else head[1::2]


def _decode_head(head: bytes, encoding: str) -> str:
    if encoding != "utf-8":
        head = head[: len(head) - len(head) % 2]
    return head.decode(encoding, "replace").lstrip("\ufeff")


# --------------------------------------------------------------------------- reading


def read_dump_piece(
    url: str,
    start: int,
    end: int | None,
    meta: dict,
    options: WikiOptions,
    stats: ReadStats,
    index_url: str | None = None,
) -> Iterator[list[str]]:
    """Documents (non-empty lists of sentences), one per kept article, of the pages that the
    piece ``[start, end)`` of ``split_dump`` owns, in file order.

    Counts ``documents_read``, ``sentences``, ``documents_with_replaced_bytes``, every skip by
    reason and the piece's bytes (``end - start``, so pieces sum to the file size) in
    ``stats``. Raises ``InputError`` for corrupt or truncated data.
    """
    from mlm_pipeline.read.sentences import segment_documents

    return segment_documents(iter_articles(url, start, end, meta, options, stats, index_url), stats)


def iter_articles(
    url: str,
    start: int,
    end: int | None,
    meta: dict,
    options: WikiOptions,
    stats: ReadStats,
    index_url: str | None = None,
) -> Iterator[tuple[list[str], bool]]:
    """The paragraphs of each kept article, and whether bytes were replaced in it.
    ``index_url``: the multistream index the piece was cut by (named in errors)."""
    kind, encoding = meta["kind"], meta["encoding"]
    if kind not in KINDS:
        raise ValueError(f"{url}: unknown dump kind {kind!r}; expected one of {KINDS}")
    from mlm_pipeline.read.wikitext import CATEGORY_NAMESPACES, FILE_NAMESPACES  # (not for detection, which every run does)

    namespaces: dict[str, int] = meta.get("namespaces", {})
    files = [*FILE_NAMESPACES, *(n for n, k in namespaces.items() if k == FILE_NS)]
    categories = [*CATEGORY_NAMESPACES, *(n for n, k in namespaces.items() if k == CATEGORY_NS)]
    size = fs.file_size(url)
    span_end = size if end is None else end
    with _open(url) as f:
        try:
            if kind == "xml":
                chunks = _file_chunks(f, start, end)
                base, align = start, 0
            else:
                if kind == "multistream":
                    _check_streams(f, url, start, end, size, index_url)
                limit = None
                if end is None or (kind == "bz2" and size - end < 4 * TAIL_BYTES):
                    limit = data_end(f, url, size)
                    if end is None and limit < size:
                        _trailing(stats, url, limit, size)
                # a multistream piece, or a whole file, is made of whole streams
                whole = kind == "multistream" or (start == 0 and end is None)
                chunks = (whole_streams if whole else owned_blocks)(f, url, start, end, limit)
                base, align = 0, (0 if start == 0 else None)

            def report(problem: str, at: int, head: bytes) -> None:
                title = _title_of(head, encoding)
                if problem == "unclosed":
                    _bad_page(stats, url, "it has no </page> before the next page (or the end of the dump)", title)
                    return
                stats.pages_cut += 1
                if stats.pages_cut <= WARNED_PAGES:
                    log.warning("%s: the page %s is longer than %d bytes of XML: only its first %d bytes "
                                "are read", url, repr(title) if title else "(no title)",
                                options.max_page_bytes, options.max_page_bytes)

            pages = owned_pages(chunks, encoding, base=base, align=align, url=url,
                                max_page_bytes=options.max_page_bytes, report=report)
            for raw in pages:
                page = _decode_page(raw, encoding, url, options, stats)
                if page is None:
                    continue
                paragraphs = _article(page, namespaces, options, stats, files, categories)
                if paragraphs is not None:
                    yield paragraphs, page.replaced
        finally:
            stats.bytes_read += span_end - start


def _check_streams(f: BinaryIO, url: str, start: int, end: int | None, size: int, index_url: str | None) -> None:
    """A multistream piece's bounds, offsets of its index, are stream starts in the file: else
    the file is incomplete (it ends before them) or the index is wrong, and the error says
    which, naming the index (decoding would only find corrupt data in the dump)."""
    index = index_url or "its multistream index"
    for offset in (start, end):
        if offset is None or offset == 0:
            continue
        if offset >= size:
            raise InputError(
                f"{url}: truncated: the file ends at byte {size}, before the bz2 stream at byte {offset} "
                f"that {index} lists; the file is incomplete (a download not finished?), or the index is "
                "another dump's"
            )
        f.seek(offset)
        if not re.match(rb"BZh[1-9]", f.read(4)):
            raise InputError(
                f"{index}: its stream offset {offset} is not the start of a bz2 stream in {url}; the index "
                "is damaged or another dump's (Wikimedia publishes each dump with its own index)"
            )


def _trailing(stats: ReadStats, url: str, data_end: int, size: int) -> None:
    """Count bytes after a dump's last bz2 stream that are not bz2 data (ignored, as ``bzip2 -d``
    ignores them)."""
    stats.trailing_bytes_ignored += size - data_end
    log.warning("%s: the %d bytes after its last bz2 stream (from byte %d) are not bz2 data: ignored",
                url, size - data_end, data_end)


def _file_chunks(f: BinaryIO, start: int, end: int | None) -> Iterator[tuple[bytes, bool]]:
    f.seek(start)
    pos = start
    while True:
        data = f.read(READ_BYTES)
        if not data:
            return
        if end is None or pos + len(data) <= end:
            yield data, True
        elif pos >= end:
            yield data, False
        else:
            yield data[: end - pos], True
            yield data[end - pos :], False
        pos += len(data)


class _Buffer:
    """Decoded data of a piece, pulled from ``(data, owned)`` chunks on demand and addressed by
    absolute offset; ``owned_end`` is where the owned data stops, once known. Data before the
    end of the last ``take`` is dropped at the next pull (one copy per chunk, not per page)."""

    def __init__(self, chunks: Iterator[tuple[bytes, bool]], base: int) -> None:
        self._chunks = chunks
        self.base = base
        self.buf = b""
        self.taken = base
        self.owned_end: int | None = None

    def end(self) -> int:
        """Absolute offset just past the data held."""
        return self.base + len(self.buf)

    def pull(self) -> bool:
        for data, owned in self._chunks:
            if not owned and self.owned_end is None:
                self.owned_end = self.base + len(self.buf)
                if not data:
                    return True  # (the caller may not need what follows)
            if data:
                self.buf = self.buf[self.taken - self.base :] + data
                self.base = self.taken
                return True
        return False

    def find(
        self, pattern: bytes, frm: int, owned: bool = False, stop: int | None = None, drop: bool = False
    ) -> int:
        """Absolute offset of ``pattern`` at or after ``frm``, pulling data as needed; -1 at
        the end. ``owned``: only an occurrence that starts in the owned data is looked for, so
        nothing past the owned data is pulled unless a prefix of ``pattern`` ends it. ``stop``:
        only an occurrence that ends by ``stop`` (nothing past it is pulled). ``drop``: nothing
        before the occurrence is needed (memory stays bounded over a long search)."""
        while True:
            hi = None if stop is None else max(stop - self.base, 0)
            i = self.buf.find(pattern, max(frm - self.base, 0), hi)
            if i >= 0:
                return self.base + i
            frm = max(frm, self.end() - len(pattern) + 1)
            if drop:
                self.taken = max(self.taken, min(frm, self.end()))
            if stop is not None and self.end() >= stop:
                return -1
            if owned and self.owned_end is not None and not self._split_at_owned_end(pattern):
                return -1
            if not self.pull():
                return -1

    def _split_at_owned_end(self, pattern: bytes) -> bool:
        """Whether ``pattern`` may start in the owned data and end past what is held."""
        end = self.owned_end - self.base
        if self.base + len(self.buf) >= self.owned_end + len(pattern) or end < 0:
            return False
        tail = self.buf[max(end - len(pattern) + 1, 0) : end]
        return any(tail.endswith(pattern[:k]) for k in range(1, len(pattern)))

    def take(self, a: int, b: int) -> bytes:
        """Bytes ``[a, b)``; nothing before ``b`` is needed any more."""
        self.taken = b
        return self.buf[a - self.base : b - self.base]


def owned_pages(
    chunks: Iterator[tuple[bytes, bool]],
    encoding: str,
    *,
    base: int = 0,
    align: int | None = 0,
    url: str = "",
    max_page_bytes: int = MAX_PAGE_BYTES,
    report=None,
) -> Iterator[bytes]:
    """The raw bytes (``<page>`` … ``</page>``) of each page whose ``<page>`` tag starts in the
    owned part of ``chunks`` (see ``bz2blocks.owned_blocks``), in order.

    ``base``: the offset of the first chunk. For UTF-16, ``align`` is the parity of the offsets
    where characters start (None: unknown, taken from the first ``<page>`` found; a misaligned
    ``<\0p\0a\0g\0e\0>\0`` would be a run of CJK code points, which does not occur).

    A damaged page is not given out as if whole: ``report(problem, offset, head)`` is called
    (``head``: the page's first bytes, to name it), or without ``report`` an ``InputError``
    raised. ``unclosed``: another ``<page>`` (or the dump's end tag) comes before its
    ``</page>``; the page is dropped and the next one read (a missing ``</page>`` would
    otherwise join the two pages into one, under the first one's title). ``cut``: the page's
    XML goes on past ``max_page_bytes``; it is given out cut at a line end within that size,
    closed by ``</text></revision></page>``, and the rest is skipped without being held.
    """
    open_tag, close_tag = "<page>".encode(encoding), "</page>".encode(encoding)
    root_end = "</mediawiki>".encode(encoding)
    wide = encoding != "utf-8"
    data = _Buffer(chunks, base)

    def find(pattern: bytes, frm: int, **kw) -> int:
        at = data.find(pattern, frm, **kw)
        while wide and at >= 0 and align is not None and at % 2 != align:
            at = data.find(pattern, at + 1, **kw)
        return at

    def problem(kind: str, at: int, head: bytes | None = None) -> None:
        if head is None:
            head = bytes(data.buf[at - data.base : at - data.base + 4096])
        if report is None:
            raise InputError(f"{url}: a damaged page at byte {at} of the decompressed data ({kind})")
        report(kind, at, head)

    pos = base
    while True:
        i = data.find(open_tag, pos, owned=True, drop=True)
        if wide:
            while i >= 0 and align is not None and i % 2 != align:
                i = data.find(open_tag, i + 1, owned=True, drop=True)
            if i >= 0 and align is None:
                align = i % 2
        if i < 0 or (data.owned_end is not None and i >= data.owned_end):
            return
        body = i + len(open_tag)
        limit = i + max_page_bytes
        j = find(close_tag, body, stop=limit + len(close_tag))
        # another page (or the end of the pages) before this one's </page>: it was never closed
        k = find(open_tag, body, stop=j if j >= 0 else None if data.end() < limit else limit)
        if k < 0 and j < 0 and data.end() < limit:
            k = find(root_end, body, stop=data.end())
        if k >= 0:
            problem("unclosed", i)
            data.take(i, k)
            pos = k
            continue
        if j >= 0:
            pos = j + len(close_tag)
            yield data.take(i, pos)
            continue
        if data.end() < limit:
            raise InputError(
                f"{url}: the dump ends inside a page (its <page> tag at byte {i} of the "
                "decompressed data); the file is incomplete"
            )
        # a page longer than the cap: its head, cut at a line end, and the rest skipped
        head = bytes(data.buf[i - data.base : limit - data.base])
        cut = _cut_point(head, encoding)
        data.take(i, limit)
        after, ended = _skip_page_rest(data, find, (close_tag, open_tag, root_end), limit)
        if after < 0:
            raise InputError(
                f"{url}: the dump ends inside a page (its <page> tag at byte {i} of the "
                "decompressed data); the file is incomplete"
            )
        if ended != close_tag:
            problem("unclosed", i, head[:4096])
            pos = after
            continue
        problem("cut", i, head[:4096])
        pos = after + len(close_tag)
        data.take(after, pos)
        yield head[:cut] + "\n</text></revision></page>".encode(encoding)


def _skip_page_rest(data: _Buffer, find, tags: tuple[bytes, ...], frm: int) -> tuple[int, bytes | None]:
    """The first of ``tags`` at or after ``frm`` and which one (``(-1, None)`` at the end of the
    data), holding no more than a chunk or two of data while it looks."""
    width = max(map(len, tags))
    while True:
        end = data.end()
        found = [(at, tag) for tag in tags if (at := find(tag, frm, stop=end)) >= 0]
        if found:
            return min(found)
        frm = max(frm, end - width + 1)
        data.take(frm, frm)
        if not data.pull():
            return -1, None


def _cut_point(head: bytes, encoding: str) -> int:
    """Where to cut a page's first bytes: after its last line end, else (one long line) before
    a character or XML reference the cut would split."""
    newline = "\n".encode(encoding)
    wide = encoding != "utf-8"
    at = head.rfind(newline)
    while wide and at >= 0 and at % 2:
        at = head.rfind(newline, 0, at)
    if at > len(head) // 2:
        return at + len(newline)
    cut = len(head) - len(head) % 2 if wide else len(head)
    if wide:  # not between the two halves of a surrogate pair
        unit = head[cut - 2 : cut]
        high = unit[1] if encoding == "utf-16-le" else unit[0]
        if 0xD8 <= high <= 0xDB:
            cut -= 2
    else:  # not inside a character's bytes
        lead = cut
        while lead > 0 and cut - lead < 3 and 0x80 <= head[lead - 1] < 0xC0:
            lead -= 1
        if lead > 0 and head[lead - 1] >= 0xC0:
            first = head[lead - 1]
            if cut - (lead - 1) < (2 if first < 0xE0 else 3 if first < 0xF0 else 4):
                cut = lead - 1
    amp = head.rfind("&".encode(encoding), max(cut - 24, 0), cut)
    if amp >= 0 and head.find(";".encode(encoding), amp, cut) < 0:
        cut = amp
    return cut


@dataclass
class Page:
    title: str
    ns: int | None
    redirect: bool
    text: str
    replaced: bool = False
    bad_references: int = 0  # character references to surrogates, replaced by U+FFFD
    text_closed: bool = True  # (False: its <text> has no </text>: a raw </page> cut the page)


def _decode_page(
    raw: bytes, encoding: str, url: str, options: WikiOptions, stats: ReadStats
) -> Page | None:
    try:
        page, replaced = raw.decode(encoding), False
    except UnicodeDecodeError as exc:
        if options.on_decode_error == "skip":
            stats.skip("invalid_utf8")
            return None
        if options.on_decode_error == "fail":
            raise InputError(
                f"{url}: invalid {encoding} in a page ({exc.reason}); use --on-decode-error "
                "replace or skip to continue past such bytes"
            ) from exc
        page, replaced = raw.decode(encoding, "replace"), True
    parsed = parse_page(page)
    if not parsed.text_closed:
        _bad_page(stats, url, "its <text> has no </text> before </page>", parsed.title)
        return None
    if parsed.bad_references:
        if options.on_decode_error == "skip":
            stats.skip("invalid_utf8")
            return None
        if options.on_decode_error == "fail":
            raise InputError(
                f"{url}: the page {parsed.title!r} holds a character reference to a UTF-16 "
                "surrogate (such as &#xD800;), which is no character; use --on-decode-error "
                "replace or skip to continue past it"
            )
        replaced = True
    parsed.replaced = replaced
    return parsed


def _bad_page(stats: ReadStats, url: str, why: str, title: str | None) -> None:
    """Count a page skipped as ``bad_page``; name the first few of a task."""
    stats.skip("bad_page")
    if stats.documents_skipped["bad_page"] <= WARNED_PAGES:
        log.warning("%s: the page %s is skipped: %s", url, repr(title) if title else "(no title)", why)


def _title_of(head: bytes, encoding: str) -> str | None:
    text = head[: len(head) - len(head) % 2] if encoding != "utf-8" else head
    return _between(text.decode(encoding, "replace"), "<title>", "</title>")


def _between(page: str, open_tag: str, close_tag: str, frm: int = 0) -> str | None:
    a = page.find(open_tag, frm)
    if a < 0:
        return None
    a += len(open_tag)
    b = page.find(close_tag, a)
    return page[a:b] if b >= 0 else None


def parse_page(page: str) -> Page:
    """Title, namespace (None if the page has no ``<ns>``), redirect flag and wikitext of one
    ``<page>`` element (the last revision's text, XML escapes undone; a reference to a surrogate
    becomes U+FFFD and is counted in ``bad_references``)."""
    bad: list[int] = []
    title = _xml_unescape(_between(page, "<title>", "</title>") or "", bad)
    bad.clear()  # (a title is not read as text)
    ns_text = _between(page, "<ns>", "</ns>")
    ns = int(ns_text) if ns_text and ns_text.strip().lstrip("-").isdigit() else None
    revision = page.find("<revision")
    header = page if revision < 0 else page[:revision]
    text = ""
    closed = True
    t = page.rfind("<text")
    if t >= 0:
        close = page.find(">", t)
        if close >= 0 and page[close - 1] != "/":
            stop = page.find("</text>", close)
            closed = stop >= 0
            text = _xml_unescape(page[close + 1 : stop if stop >= 0 else len(page)], bad)
    return Page(title, ns, "<redirect" in header, text, bad_references=len(bad), text_closed=closed)


def _xml_unescape(s: str, bad: list[int] | None = None) -> str:
    """Undo XML escaping: ``&lt;`` ``&gt;`` ``&amp;`` ``&quot;`` ``&apos;`` and numeric
    references, in one pass (so ``&amp;nbsp;`` becomes the wikitext ``&nbsp;``). A reference to
    a surrogate (``&#xD800;``: no character, and no UTF-8 for it) becomes U+FFFD, its offset
    appended to ``bad``."""
    if "&" not in s:
        return s
    if bad is None:
        return _XML_REF.sub(_xml_ref, s)

    def ref(m: re.Match) -> str:
        char = _xml_ref(m)
        if char == "\ufffd" and _SURROGATE <= _code_of(m.group(1)) <= 0xDFFF:
            bad.append(m.start())
        return char

    return _XML_REF.sub(ref, s)


_XML_REF = re.compile(r"&(lt|gt|amp|quot|apos|#[0-9]+|#x[0-9a-fA-F]+);")
_XML_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}
_SURROGATE = 0xD800


def _code_of(name: str) -> int:
    if name[0] != "#":
        return -1
    return int(name[2:], 16) if name[1] == "x" else int(name[1:])


def _xml_ref(m: re.Match) -> str:
    name = m.group(1)
    char = _XML_ENTITIES.get(name)
    if char is not None:
        return char
    code = _code_of(name)
    if _SURROGATE <= code <= 0xDFFF:
        return "\ufffd"
    return chr(code) if 0 < code < 0x110000 else m.group(0)


# --------------------------------------------------------------------------- filtering

DISAMBIGUATION_TEMPLATES = (
    "disambiguation", "disambiguation cleanup", "disambig", "disamb", "dab", "dbig", "geodis",
    "hndis", "hndab", "numberdis", "mathdab", "math dab", "letter-number combination "
    "disambiguation", "airport disambiguation", "place name disambiguation", "school "
    "disambiguation", "species latin name disambiguation", "genus disambiguation", "taxonomy "
    "disambiguation", "chinese title disambiguation", "call sign disambiguation", "hospital "
    "disambiguation", "mil-unit-dis", "roaddis", "schooldis", "callsigndis", "set index",
    "set index article", "sia", "shipindex", "ship index", "mountainindex", "mountain index",
    "sportindex", "roadindex", "road index", "lakeindex", "chemistry index",
    "molecular formula index",
)
"""Template names (any case; ``_`` = space) that make a page a disambiguation or set-index page."""

_DISAMBIGUATION = re.compile(
    r"\{\{[ \t]*(?:template[ \t]*:[ \t]*)?(?:"
    + "|".join(
        re.escape(n).replace(r"\ ", "[ _]+")
        for n in sorted(DISAMBIGUATION_TEMPLATES, key=len, reverse=True)
    )
    + r")[ \t\n]*(?:\||\}\})",
    re.I,
)


def is_disambiguation(wikitext: str) -> bool:
    """Whether the page carries a disambiguation or set-index template (not in a comment)."""
    if _DISAMBIGUATION.search(wikitext) is None:
        return False
    from mlm_pipeline.read.wikitext import strip_comments

    return _DISAMBIGUATION.search(strip_comments(wikitext)) is not None


def _namespace_of(page: Page, namespaces: dict[str, int]) -> int:
    if page.ns is not None:
        return page.ns
    prefix, colon, _ = page.title.partition(":")  # exports older than <ns>: the title prefix
    return namespaces.get(prefix.strip(), 0) if colon else 0


def _article(
    page: Page,
    namespaces: dict[str, int],
    options: WikiOptions,
    stats: ReadStats,
    files: list[str],
    categories: list[str],
) -> list[str] | None:
    """The paragraphs of a page that is kept, else None after counting why it is skipped."""
    if _namespace_of(page, namespaces) not in options.namespaces:
        stats.skip("namespace")
        return None
    if page.redirect or page.text.lstrip()[:9].upper() == "#REDIRECT":
        stats.skip("redirect")
        return None
    if options.skip_disambiguation and is_disambiguation(page.text):
        stats.skip("disambiguation")
        return None
    from mlm_pipeline.read.wikitext import clean_wikitext

    paragraphs = clean_wikitext(
        page.text,
        keep_headings=options.keep_headings,
        keep_tables=options.keep_tables,
        keep_references=options.keep_references,
        file_namespaces=files,
        category_namespaces=categories,
    )
    if not paragraphs:
        stats.skip("empty")
        return None
    return paragraphs
