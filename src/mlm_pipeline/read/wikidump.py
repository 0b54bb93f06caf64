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
left after cleaning).

Why a scan, not an XML parser: pages are found with ``bytes.find`` on ``<page>``/``</page>``
and their few fields with ``str.find``; export XML has one fixed layout and escapes ``<`` in
text, so the tags cannot occur inside text. On the bundled sample, scanning and parsing pages
cost under a tenth of the read (decompressing and cleaning are the rest).

Why one module: splitting and reading share the page-ownership rule above, so they stay side by
side (a change to one must be made to the other); the plug-in is ``wikidump_format.py``.
"""

from __future__ import annotations

import bz2
import os
import re
from dataclasses import dataclass, field
from typing import BinaryIO, Iterator

from mlm_pipeline import fs
from mlm_pipeline.errors import InputError
from mlm_pipeline.read.bz2blocks import owned_blocks, whole_streams
from mlm_pipeline.read.wikitext import (
    CATEGORY_NAMESPACES,
    FILE_NAMESPACES,
    clean_wikitext,
    strip_comments,
)
from mlm_pipeline.stats import ReadStats

KINDS = ("xml", "bz2", "multistream")
FILE_NS, CATEGORY_NS = 6, 14
READ_BYTES = 1 << 20
HEAD_BYTES = 1 << 20
"""At most this much of the decompressed head is read to find ``<siteinfo>``."""


@dataclass(frozen=True)
class WikiOptions:
    """How pages become documents.

    namespaces: the namespace numbers kept (``<ns>``; 0 = articles).
    keep_headings: section headings become paragraphs of their own (default: dropped).
    keep_tables: table captions and cells become paragraphs (default: tables dropped).
    skip_disambiguation: drop disambiguation and set-index pages.
    on_decode_error: ``replace``, ``skip`` (counted ``invalid_utf8``) or ``fail``.
    """

    namespaces: frozenset[int] = field(default_factory=lambda: frozenset({0}))
    keep_headings: bool = False
    keep_tables: bool = False
    skip_disambiguation: bool = True
    on_decode_error: str = "replace"

    def __post_init__(self) -> None:
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
            cuts = _stream_cuts(read_stream_offsets(index_url), size, target_bytes)
            _check_cuts(url, index_url, cuts)
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


def _stream_cuts(offsets: list[int], size: int, target: int) -> list[int]:
    """Stream starts at which to cut so that each piece holds about ``target`` bytes (never at
    the first page stream: the header stream before it holds no page)."""
    cuts = []
    last = 0
    for offset in offsets[1:]:
        if offset >= size:
            break
        if offset - last >= target:
            cuts.append(offset)
            last = offset
    return cuts


def _check_cuts(url: str, index_url: str, cuts: list[int]) -> None:
    """A bz2 stream header at the first and last cuts: the index belongs to this dump."""
    with _open(url) as f:
        for offset in {*cuts[:2], *cuts[-1:]}:
            f.seek(offset)
            if not re.match(rb"BZh[1-9]", f.read(4)):
                raise InputError(
                    f"{index_url}: its stream offset {offset} is not the start of a bz2 stream "
                    f"in {url}; is it the index of another dump?"
                )


_INDEX_OFFSET = re.compile(rb"(?:^|\n)(\d+):")


def read_stream_offsets(index_url: str) -> list[int]:
    """The sorted stream offsets of a multistream index (``offset:page_id:title`` lines;
    ``.bz2``-compressed or plain text). Decompressed with ``indexed_bzip2`` on every core."""
    offsets: dict[bytes, None] = {}  # (a stream's 100 lines repeat its offset: dedupe first)
    carry = b""
    with _open_index(index_url) as f:
        while True:
            chunk = f.read(16 << 20)
            data = carry + chunk
            if not chunk:
                cut = len(data)
            else:
                cut = data.rfind(b"\n") + 1
            offsets.update(dict.fromkeys(_INDEX_OFFSET.findall(data, 0, cut)))
            carry = data[cut:]
            if not chunk:
                break
    if not offsets:
        raise InputError(f"{index_url}: no 'offset:page_id:title' line; not a multistream index")
    return sorted(map(int, offsets))


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
) -> Iterator[list[str]]:
    """Documents (non-empty lists of sentences), one per kept article, of the pages that the
    piece ``[start, end)`` of ``split_dump`` owns, in file order.

    Counts ``documents_read``, ``sentences``, ``documents_with_replaced_bytes``, every skip by
    reason and the piece's bytes (``end - start``, so pieces sum to the file size) in
    ``stats``. Raises ``InputError`` for corrupt or truncated data.
    """
    from mlm_pipeline.read.sentences import segment_documents

    return segment_documents(iter_articles(url, start, end, meta, options, stats), stats)


def iter_articles(
    url: str, start: int, end: int | None, meta: dict, options: WikiOptions, stats: ReadStats
) -> Iterator[tuple[list[str], bool]]:
    kind, encoding = meta["kind"], meta["encoding"]
    if kind not in KINDS:
        raise ValueError(f"{url}: unknown dump kind {kind!r}; expected one of {KINDS}")
    namespaces: dict[str, int] = meta.get("namespaces", {})
    files = [*FILE_NAMESPACES, *(n for n, k in namespaces.items() if k == FILE_NS)]
    categories = [*CATEGORY_NAMESPACES, *(n for n, k in namespaces.items() if k == CATEGORY_NS)]
    span_end = fs.file_size(url) if end is None else end
    with _open(url) as f:
        try:
            if kind == "xml":
                chunks = _file_chunks(f, start, end)
                base, align = start, 0
            else:
                # a multistream piece, or a whole file, is made of whole streams
                whole = kind == "multistream" or (start == 0 and end is None)
                chunks = (whole_streams if whole else owned_blocks)(f, url, start, end)
                base, align = 0, (0 if start == 0 else None)
            for raw in owned_pages(chunks, encoding, base=base, align=align, url=url):
                page = _decode_page(raw, encoding, url, options, stats)
                if page is None:
                    continue
                paragraphs = _article(page, namespaces, options, stats, files, categories)
                if paragraphs is not None:
                    yield paragraphs, page.replaced
        finally:
            stats.bytes_read += span_end - start


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

    def find(self, pattern: bytes, frm: int, owned: bool = False) -> int:
        """Absolute offset of ``pattern`` at or after ``frm``, pulling data as needed; -1 at
        the end. ``owned``: only an occurrence that starts in the owned data is looked for, so
        nothing past the owned data is pulled unless a prefix of ``pattern`` ends it."""
        while True:
            i = self.buf.find(pattern, max(frm - self.base, 0))
            if i >= 0:
                return self.base + i
            frm = max(frm, self.base + len(self.buf) - len(pattern) + 1)
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
) -> Iterator[bytes]:
    """The raw bytes (``<page>`` … ``</page>``) of each page whose ``<page>`` tag starts in the
    owned part of ``chunks`` (see ``bz2blocks.owned_blocks``), in order.

    ``base``: the offset of the first chunk. For UTF-16, ``align`` is the parity of the offsets
    where characters start (None: unknown, taken from the first ``<page>`` found; a misaligned
    ``<\\0p\\0a\\0g\\0e\\0>\\0`` would be a run of CJK code points, which does not occur).
    """
    open_tag, close_tag = "<page>".encode(encoding), "</page>".encode(encoding)
    wide = encoding != "utf-8"
    data = _Buffer(chunks, base)
    pos = base
    while True:
        i = data.find(open_tag, pos, owned=True)
        if wide:
            while i >= 0 and align is not None and i % 2 != align:
                i = data.find(open_tag, i + 1, owned=True)
            if i >= 0 and align is None:
                align = i % 2
        if i < 0 or (data.owned_end is not None and i >= data.owned_end):
            return
        j = data.find(close_tag, i + len(open_tag))
        while wide and j >= 0 and j % 2 != align:
            j = data.find(close_tag, j + 1)
        if j < 0:
            raise InputError(
                f"{url}: the dump ends inside a page (its <page> tag at byte {i} of the "
                "decompressed data); the file is incomplete"
            )
        pos = j + len(close_tag)
        yield data.take(i, pos)


@dataclass
class Page:
    title: str
    ns: int | None
    redirect: bool
    text: str
    replaced: bool = False


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
    parsed.replaced = replaced
    return parsed


def _between(page: str, open_tag: str, close_tag: str, frm: int = 0) -> str | None:
    a = page.find(open_tag, frm)
    if a < 0:
        return None
    a += len(open_tag)
    b = page.find(close_tag, a)
    return page[a:b] if b >= 0 else None


def parse_page(page: str) -> Page:
    """Title, namespace (None if the page has no ``<ns>``), redirect flag and wikitext of one
    ``<page>`` element (the last revision's text, XML escapes undone)."""
    title = _xml_unescape(_between(page, "<title>", "</title>") or "")
    ns_text = _between(page, "<ns>", "</ns>")
    ns = int(ns_text) if ns_text and ns_text.strip().lstrip("-").isdigit() else None
    revision = page.find("<revision")
    header = page if revision < 0 else page[:revision]
    text = ""
    t = page.rfind("<text")
    if t >= 0:
        close = page.find(">", t)
        if close >= 0 and page[close - 1] != "/":
            stop = page.find("</text>", close)
            text = _xml_unescape(page[close + 1 : stop if stop >= 0 else len(page)])
    return Page(title, ns, "<redirect" in header, text)


def _xml_unescape(s: str) -> str:
    """Undo XML escaping: ``&lt;`` ``&gt;`` ``&amp;`` ``&quot;`` ``&apos;`` and numeric
    references, in one pass (so ``&amp;nbsp;`` becomes the wikitext ``&nbsp;``)."""
    return _XML_REF.sub(_xml_ref, s) if "&" in s else s


_XML_REF = re.compile(r"&(lt|gt|amp|quot|apos|#[0-9]+|#x[0-9a-fA-F]+);")
_XML_ENTITIES = {"lt": "<", "gt": ">", "amp": "&", "quot": '"', "apos": "'"}


def _xml_ref(m: re.Match) -> str:
    name = m.group(1)
    char = _XML_ENTITIES.get(name)
    if char is not None:
        return char
    code = int(name[2:], 16) if name[1] == "x" else int(name[1:])
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
    paragraphs = clean_wikitext(
        page.text,
        keep_headings=options.keep_headings,
        keep_tables=options.keep_tables,
        file_namespaces=files,
        category_namespaces=categories,
    )
    if not paragraphs:
        stats.skip("empty")
        return None
    return paragraphs
