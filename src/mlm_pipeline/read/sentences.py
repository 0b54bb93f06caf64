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

from typing import Iterable, Iterator, Sequence

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

def split_sentences(paragraphs: Sequence[str]) -> list[list[str]]:
    """Split each paragraph into stripped, non-empty sentences, in one blingfire call.

    Returns one list per input paragraph (empty for a blank paragraph). Every paragraph is
    followed by U+2029 and a newline in the call, which makes each come out as it does alone
    (see the module notes). Call it with one document's paragraphs.
    """
    if not paragraphs:
        return []
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
            yield sents
