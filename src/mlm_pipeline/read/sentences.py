"""Sentence segmentation for formats that carry paragraphs (WikiExtractor, JSONL, Parquet).

Why blingfire (``blingfire.text_to_sentences``): it is a compiled finite-state segmenter, so it
stays far off the hot path. Measured on this (shared, 2-core) machine on the 37 articles of
``sample/wikiextractor-AA.txt`` (1.03 MB of paragraphs, ``split_sentences`` once per article,
stripping included): about 32 MB/s, against about 0.27 MB/s for pysbd
(``Segmenter(language="en", clean=False)`` on the first 150 paragraphs, 92 KB) — over 100x. It
ships its model inside the wheel (no download at run time, nothing to cache on workers), handles
abbreviations and initials ("Mr. Jones", "5 p.m. yesterday", "Dr. Smith") and splits on CJK
full-width ``。！？``. Its output keeps every non-space character of the input (checked on the
English and Chinese test data), only changing whitespace.

Paragraph boundaries: blingfire treats ``\n`` as ordinary whitespace (``"a\n\nb."`` becomes
one sentence), so paragraphs cannot be joined with newlines alone. U+2029 PARAGRAPH SEPARATOR
works: blingfire always ends a sentence there and keeps the character, so a document's
paragraphs go through one call and the output is cut back into paragraphs at U+2029. Two
details, found on the sample corpora, make a paragraph come out as it does alone:

* each paragraph, the last included, is followed by the separator: blingfire decides
  differently at the very end of its input (``'or both . ""'`` ends as ``'or both .' / '""'``
  at the end, stays whole before U+2029; 63 of 2,183 WikiText paragraphs differ);
* the separator is followed by ``\n``: right after a bare U+2029 an initial abbreviation is cut
  off (``'Dr.' / 'Ruy d'Andrade gave…'``, ``'J.' / 'Stuart Blackton…'``; 8 of 4,279 paragraphs).

With ``"\u2029\n"`` all 4,279 paragraphs of the two English samples come out exactly as when
segmented one per call (``test_sentences.py`` checks it), at ~33 MB/s against ~20 MB/s one call
per paragraph. Calls never span documents, so a document's sentences depend on that document
only, never on which byte range read it. If the pieces do not match (a paragraph contained
U+2029, or blingfire returned nothing), the paragraphs are segmented one by one; a paragraph
blingfire returns nothing for is kept whole as one sentence, so no text is lost here.

One fix-up: blingfire starts the next sentence with the closing quote after a CJK sentence end
(``你去罢。”宝玉…`` -> ``你去罢。`` / ``”宝玉…``; about a quarter of the sentences of the
Chinese test text). Leading closing quotes/brackets after a full-width sentence end are moved
back to the previous sentence.
"""

from __future__ import annotations

import re
from typing import Iterable, Iterator, Sequence

from mlm_pipeline.read.base import Document
from mlm_pipeline.stats import ReadStats

PARAGRAPH_SEPARATOR = "\u2029"
_JOIN = PARAGRAPH_SEPARATOR + "\n"

CLOSERS = "”’」』）》〉】〕〗〙〛﹂﹄"
"""Closing quotes and brackets moved back onto the previous sentence when it ends with a
full-width terminator (``FULL_STOPS``) — the CJK case only; ASCII text is left as blingfire
cuts it."""

FULL_STOPS = "。！？…" + CLOSERS


def _text_to_sentences(text: str) -> str:
    # imported on first use: every format module is imported with the registry, and reading
    # plain text never needs the segmenter (~0.05-0.2 s to import)
    import blingfire

    return blingfire.text_to_sentences(text)

SEGMENT_CHARS = 1 << 20
"""The most characters in one blingfire call: it holds about 25 bytes per byte of its input (a
16 MB paragraph took 520 MB), so a longer document is segmented in calls of up to this size
(each paragraph comes out as alone whatever it is called with) and a longer paragraph in pieces
(:func:`_pieces`)."""

_SENTENCE_END = re.compile(r"(?<=[.!?]) (?=[A-Z])")
_SPACE = re.compile(r"(?<=\S)\s")


def split_sentences(paragraphs: Sequence[str]) -> list[list[str]]:
    """Split each paragraph into stripped, non-empty sentences, in one blingfire call (for a
    document over ``SEGMENT_CHARS``, one per that many characters).

    Returns one list per input paragraph (empty for a blank paragraph). Every paragraph is
    followed by U+2029 and a newline in the call, which makes each come out as it does alone
    (see the module notes). Call it with one document's paragraphs.
    """
    if not paragraphs:
        return []
    if sum(map(len, paragraphs)) + 2 * len(paragraphs) > SEGMENT_CHARS:
        return _split_long(paragraphs)
    out = _text_to_sentences(_JOIN.join(paragraphs) + _JOIN)
    chunks = out.split(PARAGRAPH_SEPARATOR)
    if len(chunks) != len(paragraphs) + 1:
        return [_split_one(p) for p in paragraphs]
    result = []
    for chunk, para in zip(chunks, paragraphs):
        sents = _sentences(chunk)
        if not sents and para.strip():
            sents = _split_one(para)
        result.append(sents)
    return result


def _split_long(paragraphs: Sequence[str]) -> list[list[str]]:
    """:func:`split_sentences` of a document over ``SEGMENT_CHARS``: runs of paragraphs up to that
    size per call, a longer paragraph cut into pieces, each segmented alone. A sentence of such a
    paragraph may end at a cut (one that is not a sentence end)."""
    result: list[list[str]] = []
    group: list[str] = []
    size = 0
    for para in paragraphs:
        if len(para) + 2 > SEGMENT_CHARS:
            result.extend(split_sentences(group) if group else [])
            group, size = [], 0
            result.append([s for piece in _pieces(para) for ss in split_sentences([piece]) for s in ss])
            continue
        if size + len(para) + 2 > SEGMENT_CHARS:
            result.extend(split_sentences(group))
            group, size = [], 0
        group.append(para)
        size += len(para) + 2
    result.extend(split_sentences(group) if group else [])
    return result


def _pieces(paragraph: str) -> list[str]:
    """A paragraph over ``SEGMENT_CHARS`` in pieces of at least half that: each ends at the last
    likely sentence end (``. `` before a capital) of its window, else at its last space, else at
    the window's end."""
    pieces, start, limit = [], 0, SEGMENT_CHARS - 2
    while len(paragraph) - start > limit:
        lo, hi = start + limit // 2, start + limit
        cut = None
        for pattern in (_SENTENCE_END, _SPACE):
            for found in pattern.finditer(paragraph, lo, hi):
                cut = found.start()
            if cut is not None:
                break
        cut = hi if cut is None else cut
        pieces.append(paragraph[start:cut])
        start = cut
    pieces.append(paragraph[start:])
    return pieces


def _split_one(paragraph: str) -> list[str]:
    sents: list[str] = []
    for part in paragraph.split(PARAGRAPH_SEPARATOR):
        if not part.strip():
            continue
        segmented = _text_to_sentences(part + _JOIN)
        found = _sentences(segmented.replace(PARAGRAPH_SEPARATOR, ""))
        sents.extend(found if found else [part.strip()])
    return sents


def _sentences(segmented: str) -> list[str]:
    sents: list[str] = []
    for s in segmented.split("\n"):
        s = s.strip()
        if not s:
            continue
        if s[0] in CLOSERS and sents and sents[-1][-1] in FULL_STOPS:
            rest = s.lstrip(CLOSERS)
            sents[-1] += s[: len(s) - len(rest)]
            s = rest.strip()
            if not s:
                continue
        sents.append(s)
    return sents


def paragraphs_of(text: str) -> list[str]:
    """Stripped non-empty paragraphs of a document's text (split at any line boundary)."""
    return [p for p in (line.strip() for line in text.splitlines()) if p]


def segment_documents(
    docs: Iterable[tuple[list[str], bool]], stats: ReadStats
) -> Iterator[list[str]]:
    """Turn ``(paragraphs, had_replaced_bytes)`` documents into sentence lists, in order.

    One ``split_sentences`` call per document. Counts ``documents_read``, ``sentences`` and
    ``documents_with_replaced_bytes`` for each yielded document; a document with no sentence is
    counted as skipped ``empty``.
    """
    for paragraphs, replaced in docs:
        sents = [s for ss in split_sentences(paragraphs) for s in ss]
        if stats.count_document(sents, replaced):
            # (a record's own language, id and metadata: --language-field, --id-field, --metadata-field)
            yield paragraphs.with_sentences(sents) if isinstance(paragraphs, Document) else sents
