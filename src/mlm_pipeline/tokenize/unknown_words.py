"""Where a report's unknown words are looked for: HF's offsets name them, but HF on a task's
sample of long paragraphs cost more than the fast backend's whole tokenization of the task
(WikiText with an XLM-R-style Unigram: 0.64 s against 0.23 s a task), so HF sees only the words
that hold them."""

from __future__ import annotations

from typing import Callable

import numpy as np


def unknown_word_texts(texts: list[str], encode: Callable, unk: int) -> list[str]:
    """What HF encodes again with offsets: of each text, only its whitespace-separated words that
    ``encode`` (the checked encoder) gives the unknown token ``unk``, when they hold as many as
    the whole text does, which they do where pre-tokenising splits at whitespace, as WordPiece's
    and SentencePiece's do; the whole text otherwise."""
    pieces = [text.split() for text in texts]
    flat = [w for words in pieces for w in words]
    ids, lens = encode(texts)
    word_ids, word_lens = encode(flat)
    per_text = np.bincount(np.repeat(np.arange(len(texts)), lens)[ids == unk], minlength=len(texts))
    per_word = np.bincount(np.repeat(np.arange(len(flat)), word_lens)[word_ids == unk], minlength=len(flat))
    out, start = [], 0
    for text, words, found in zip(texts, pieces, per_text.tolist()):
        counts = per_word[start:start + len(words)]
        start += len(words)
        if int(counts.sum()) == found:
            out.extend(w for w, c in zip(words, counts.tolist()) if c)
        else:
            out.append(text)
    return out
