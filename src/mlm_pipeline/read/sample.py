"""What the planner may look at before reading an input: its name and its (decompressed) head.

Format detection and the binary-file check both work from an ``InputSample``, so a file's head
is read (and decompressed) at most once, and only when a question needs it: a name that decides
the format never opens the file.
"""

from __future__ import annotations

import os
import re

from mlm_pipeline.read.compression import compression_of, read_head, strip_compression_ext

SNIFF_BYTES = 8192
"""Head size for the binary check."""

DETECT_BYTES = 64 * 1024
"""Head size for content-based format detection (enough to pass a run of blank lines)."""

BOM = b"\xef\xbb\xbf"


class InputSample:
    """One input file as detection sees it.

    ``compression`` is named by the file extension; ``name`` is the lower-cased base name
    without a compression extension and ``extension`` its last extension (``Corpus.JSON.gz``:
    ``corpus.json`` and ``.json``). ``head(n)`` is the first ``n`` decompressed bytes, read on
    first use and kept.
    """

    def __init__(self, url: str, size: int | None = None) -> None:
        self.url = url
        self.size = size  # the file's size, if the caller knows it (spares a metadata request)
        self.compression = compression_of(url)
        self.name = os.path.basename(strip_compression_ext(url)).lower()
        self.extension = os.path.splitext(self.name)[1]
        self._head: bytes | None = None
        self._asked = 0
        self._first_line: bytes | None = None
        self._first_line_whole = False

    def head(self, n: int = DETECT_BYTES) -> bytes:
        """The first ``n`` bytes (decompressed). Raises ``InputError`` if the file cannot be read.

        At least ``SNIFF_BYTES`` are read at once, and read again only when more is asked."""
        if self._head is None or (n > self._asked and len(self._head) == self._asked):
            self._asked = max(n, SNIFF_BYTES)
            self._head = read_head(self.url, self._asked, size=self.size)
        return self._head[:n]

    def first_line(self) -> bytes:
        """The first non-blank line of the first ``DETECT_BYTES``, stripped (a UTF-8 byte-order
        mark dropped).

        Looked for in the first ``SNIFF_BYTES`` (which the binary check reads anyway), and in
        ``DETECT_BYTES`` only when no whole non-blank line is there: a planner sniffing 100,000
        files then fetches 0.8 GB, not 6.4 GB."""
        if self._first_line is None:
            line, whole = _first_line(self.head(SNIFF_BYTES), SNIFF_BYTES)
            if not whole:
                line, whole = _first_line(self.head(DETECT_BYTES), DETECT_BYTES)
            self._first_line, self._first_line_whole = line, whole
        return self._first_line

    def first_line_is_whole(self) -> bool:
        """Whether :meth:`first_line` is the whole line (not cut at ``DETECT_BYTES``)."""
        self.first_line()
        return self._first_line_whole

    def binary_reason(self) -> str | None:
        """A reason string if the head does not look like text, else None (see ``binary_reason``)."""
        return binary_reason(self.head(SNIFF_BYTES), SNIFF_BYTES)

    def paragraph_lines(self) -> str | None:
        """What shows that the file's lines are paragraphs, not sentences, else None (see
        ``paragraph_lines``)."""
        return paragraph_lines(self.head(SNIFF_BYTES), SNIFF_BYTES)

    def vocabulary_reason(self) -> str | None:
        """A reason string if the file looks like a tokenizer vocabulary, else None (see
        ``vocabulary_reason``)."""
        return vocabulary_reason(self.head(SNIFF_BYTES), SNIFF_BYTES, self.name)

    def wiki_index_reason(self) -> str | None:
        """A reason string if the file looks like a Wikipedia multistream index, else None (see
        ``wiki_index_reason``)."""
        return wiki_index_reason(self.head(SNIFF_BYTES), SNIFF_BYTES, self.name)


def _first_line(head: bytes, asked: int) -> tuple[bytes, bool]:
    """The first non-blank line of ``head`` (the first ``asked`` bytes of a file, or all of a
    shorter one), stripped, and whether it is whole: ended by a newline or by the end of the file.
    Found line by line, not by splitting the whole head."""
    start = 3 if head.startswith(BOM) else 0
    while True:
        end = head.find(b"\n", start)
        if end < 0:
            return head[start:].strip(), len(head) < asked
        line = head[start:end].strip()
        if line:
            return line, True
        start = end + 1


# Control characters that do not occur in text (tab, LF, FF, CR, BS and ESC are allowed).
_NON_TEXT = re.compile("[\x00-\x07\x0b\x0e-\x1a\x1c-\x1f\x7f]")

_SIGNATURES = (
    (b"PAR1", "Parquet (name it *.parquet)"),
    (b"\x1f\x8b", "gzip-compressed (name it *.gz)"),
    (b"\x28\xb5\x2f\xfd", "zstd-compressed (name it *.zst)"),
    (b"BZh", "bzip2-compressed (name it *.bz2)"),
    (b"\xfd7zXZ\x00", "xz-compressed (name it *.xz)"),
    (b"PK\x03\x04", "a zip archive"),
    (b"\x7fELF", "an executable (ELF)"),
    (b"%PDF-", "a PDF document (extract its text first)"),
    (b"\x89PNG\r\n\x1a\n", "a PNG image"),
    (b"\xff\xd8\xff", "a JPEG image"),
    (b"SQLite format 3\x00", "an SQLite database"),
)


_CONVERT_UTF16 = "convert it to UTF-8 first: iconv -f {} -t UTF-8 FILE > FILE.txt"


def binary_reason(head: bytes, asked: int) -> str | None:
    """Why ``head`` (the first ``asked`` bytes of a file, or all of a shorter one) is not text.

    Names a known binary container (Parquet, gzip, zstd, ...) by its signature; else flags
    more than 1% NUL bytes (at least 2), or a head where more than 30% of the characters are
    control characters or invalid UTF-8. A stray NUL costs one document (the reader skips it as
    ``binary``); many NULs mean the file is not text at all.
    """
    if not head:
        return None
    for magic, what in _SIGNATURES:
        if head.startswith(magic):
            return f"binary data; it looks like {what}"
    if head.startswith((b"\xff\xfe", b"\xfe\xff")):
        return f"text in UTF-16 (it starts with a byte-order mark); {_CONVERT_UTF16.format('UTF-16')}"
    nuls = head.count(b"\x00")
    if nuls > max(1, len(head) // 100):
        even, odd = head[0::2].count(0), head[1::2].count(0)
        encoding = "UTF-16LE" if odd > even else "UTF-16BE"
        # ASCII as UTF-16: the high bytes are NUL, and the rest reads as text (a zero-padded binary does not)
        if max(even, odd) > 0.9 * (len(head) // 2) and _reads_as_text(head[: len(head) // 2 * 2].decode(encoding, "replace")):
            return (f"{nuls} NUL bytes in the first {len(head)} bytes, every other byte: text in {encoding}; "
                    f"{_CONVERT_UTF16.format(encoding)}")
        return f"{nuls} NUL bytes in the first {len(head)} bytes"
    text = head.decode("utf-8", "replace")
    if len(head) == asked:  # the head may end inside a character
        text = text[:-1] if text.endswith("\ufffd") else text
    bad = text.count("\ufffd") + len(_NON_TEXT.findall(text))
    if text and bad / len(text) > 0.30:
        return (
            f"{100 * bad / len(text):.0f}% control characters or invalid UTF-8 in the first "
            f"{len(head)} bytes"
        )
    return None


def _reads_as_text(text: str) -> bool:
    """At least 95% of ``text`` is printable or whitespace."""
    return bool(text) and sum(c.isprintable() or c in "\t\n\r" for c in text) >= 0.95 * len(text)


_SPECIAL_TOKENS = {b"[PAD]", b"[UNK]", b"[CLS]", b"[SEP]", b"[MASK]", b"<pad>", b"<unk>", b"<s>", b"</s>", b"<mask>"}


_INDEX_LINE = re.compile(rb"\d+:\d+:[^\n]*")


def wiki_index_reason(head: bytes, asked: int, name: str = "") -> str | None:
    """Why ``head`` (the first ``asked`` bytes of a file named ``name``) is a Wikipedia dump's
    multistream index (``offset:page_id:title`` lines), not text: every line of the head is such
    a line, and there are 20 of them or the name says ``index``. Read as text, each line was a
    "sentence" of offsets and titles; the dump beside it is what to give (it reads its index)."""
    lines = head.split(b"\n")
    if len(head) == asked:  # the last line may be cut
        lines = lines[:-1]
    lines = [line.strip(b"\r") for line in lines if line.strip()]
    if not lines or not all(_INDEX_LINE.fullmatch(line) for line in lines):
        return None
    if len(lines) < 20 and "index" not in name:
        return None
    return ("looks like a Wikipedia multistream index (offset:page_id:title lines), not text; give the dump "
            "beside it (…-multistream.xml.bz2), which reads it, or name it with --wiki-index")


def vocabulary_reason(head: bytes, asked: int, name: str = "") -> str | None:
    """Why ``head`` (the first ``asked`` bytes of a file named ``name``) is a vocabulary, not text.

    A vocabulary (BERT's ``vocab.txt``, a word list of a tokenizer) is one token per line: at
    least 20 lines, 98% of them one short token without a space, and besides either special
    tokens (``[UNK]``, ``<pad>``, ...), ``##`` continuation pieces (5% of the lines) or
    ``vocab`` in the file name. A corpus of one word per line has none of those and is read.
    """
    lines = head.split(b"\n")
    if len(head) == asked:  # the last line may be cut
        lines = lines[:-1]
    lines = [line.strip(b"\r") for line in lines]
    lines = [line for line in lines if line]
    if len(lines) < 20:
        return None
    tokens = sum(1 for line in lines if len(line) <= 50 and not any(c in line for c in b" \t"))
    if tokens < 0.98 * len(lines):
        return None
    specials = sorted(t.decode() for t in _SPECIAL_TOKENS.intersection(lines))
    pieces = sum(1 for line in lines if line.startswith(b"##") and len(line) > 2)
    if specials:
        why = f"special tokens {', '.join(specials)}"
    elif pieces >= 0.05 * len(lines):
        why = "## word pieces"
    elif "vocab" in name:
        why = "its name"
    else:
        return None
    return f"looks like a tokenizer vocabulary (one token per line, {why}), not text; give it with -t"


# a sentence end followed by more text on the same line: . ! ? (or a full-width one), closing
# quotes or brackets, then a space (none after a full-width stop) and a non-space character
_SENTENCE_END_INSIDE = re.compile(r"(?:[.!?][\"'”’)\]]*\s+|[。！？][”’」』）]*\s*)(?=\S)")


def paragraph_lines(head: bytes, asked: int) -> str | None:
    """Why the lines of ``head`` (the first ``asked`` bytes of a text file) look like paragraphs.

    Google's text format has a sentence per line. When at least half of the whole non-blank
    lines (3 at least) hold three sentences or more (two sentence ends followed by more text),
    the file is a paragraph per line, and each paragraph would be taken as one sentence.
    """
    lines = head.split(b"\n")
    if len(head) == asked:
        lines = lines[:-1]
    text_lines = [line.decode("utf-8", "replace").strip() for line in lines]
    text_lines = [line for line in text_lines if line]
    if len(text_lines) < 3:
        return None
    long = sum(1 for line in text_lines if len(_SENTENCE_END_INSIDE.findall(line)) >= 2)
    if long < 0.5 * len(text_lines):
        return None
    return f"{long} of its first {len(text_lines)} lines hold several sentences"
