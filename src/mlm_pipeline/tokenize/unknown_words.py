"""Where a report's unknown words are looked for: HF's offsets name them, but HF on a task's
sample of 200 long paragraphs cost more than the fast backend on the task's whole text (on
WikiText with an XLM-R-style Unigram, 0.64 s a task; 0.23 s with HF on the words only), so HF
sees only the words (or, in text without spaces, the clauses) that hold them, up to ``HF_CHARS``
characters a call."""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Callable

import numpy as np
from tokenizers import models

if TYPE_CHECKING:
    from mlm_pipeline.tokenize.loading import TextTokenizer

HF_CHARS = 8 << 10
"""Characters HF encodes again for one sample, at most (past the first piece): on whole lines of
红楼梦 (no spaces), HF took 0.5 s for 200 paragraphs, about what the fast backend takes for 3 MB of
it, and 0.18 s for 32K characters; on its clauses that hold an unknown character, 1 ms for a
task's sample. WikiText's ``<unk>`` words in a sample of 200 paragraphs: about 4K characters."""


CLAUSES = re.compile(r"[^!-/:-@\[-`{-~\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]+"
                     r"|[!-/:-@\[-`{-~\u3000-\u303f\uff01-\uff0f\uff1a-\uff20\uff3b-\uff40\uff5b-\uff65]")
"""A long word's pieces: the runs between punctuation marks (ASCII, CJK and full-width), and
each mark alone. Chinese has no spaces between its words, but clauses between its punctuation:
a 红楼梦 line is one "word" of a few hundred characters, a clause a dozen."""
LONG_WORD = 32
"""Words longer than this are cut into :data:`CLAUSES` (a short one is kept whole: an added token
such as ``<unk>`` must stay one piece to be matched)."""


def _pieces(text: str) -> list[str]:
    return [p for w in text.split() for p in (CLAUSES.findall(w) if len(w) > LONG_WORD else (w,))]


def unknown_word_texts(texts: list[str], encode: Callable, unk: int, budget: int = HF_CHARS) -> list[str]:
    """What HF encodes again with offsets: of each text, only its pieces (whitespace-separated
    words, long ones cut into :data:`CLAUSES`) that
    ``encode`` (the checked encoder) gives the unknown token ``unk``, when they hold as many as
    the whole text does, which they do where pre-tokenising splits at whitespace and
    punctuation, or the unknown characters are unknown in any context, as with WordPiece and
    SentencePiece; the whole text otherwise. In order, up to ``budget`` characters in all (the
    first piece whatever its size)."""
    pieces = list(map(_pieces, texts))
    flat = [w for words in pieces for w in words]
    ids, lens = encode(texts)
    word_ids, word_lens = encode(flat)
    per_text = np.bincount(np.repeat(np.arange(len(texts)), lens)[ids == unk], minlength=len(texts))
    per_word = np.bincount(np.repeat(np.arange(len(flat)), word_lens)[word_ids == unk], minlength=len(flat))
    out, start, size = [], 0, 0
    for text, words, found in zip(texts, pieces, per_text.tolist()):
        if size >= budget:
            break
        counts = per_word[start:start + len(words)]
        start += len(words)
        for piece in [w for w, c in zip(words, counts.tolist()) if c] if int(counts.sum()) == found else [text]:
            if size >= budget:
                break
            out.append(piece)
            size += len(piece)
    return out


def unknown_words(tok: "TextTokenizer", texts: list[str]) -> list[str]:
    """The words of ``texts`` that encode to the unknown token, one per unknown token, as the
    tokenizer saw them (after its Python-side rules): spans of HF's offsets; without an HF
    tokenizer (a BPE SentencePiece model), the whitespace words that encode to it. For the report
    (which words a vocabulary lacks), not the hot path: a run asks for a sample."""
    unk = tok.unk_id
    if unk is None or not texts:
        return []
    literal = literal_unknown(tok)
    if literal is not None:  # no HF pass (on RoBERTa's BPE, 1/4 of a packed run's time)
        return [literal] * int(np.count_nonzero(tok.encode_batch(texts)[0] == unk))
    texts = tok._preprocess(texts)
    words: list[str] = []
    if tok.tokenizer is not None:
        pieces = unknown_word_texts(texts, tok.checked.encode_batch, unk)
        # a piece that is the unknown token alone (WikiText's "<unk>", a word WordPiece cannot
        # spell) is that word: HF only for the others
        ids, lens = tok.checked.encode_batch(pieces)
        alone = (lens == 1) & (ids[np.minimum(np.cumsum(lens) - lens, max(len(ids) - 1, 0))] == unk)
        others = [p for p, a in zip(pieces, alone.tolist()) if not a]
        spans = iter(tok.tokenizer.encode_batch(others, add_special_tokens=False) if others else ())
        for piece, a in zip(pieces, alone.tolist()):
            if a:
                words.append(piece)
            else:
                enc = next(spans)
                words.extend(piece[s:e] for i, (s, e) in zip(enc.ids, enc.offsets) if i == unk)
        return words
    for text in texts:
        words.extend(w for w in text.split() if unk in tok.checked.encode_batch([w])[0])
    return words


def literal_unknown(tok: "TextTokenizer") -> str | None:
    """The unknown token's text where only it encodes to it (a BPE without an unknown token: its
    ``<unk>`` is an added token, made only where the text spells it)."""
    hf = tok.tokenizer
    plain = hf is not None and isinstance(hf.model, models.BPE) and hf.model.unk_token is None
    added = hf.get_added_tokens_decoder().get(tok.unk_id) if plain and hf.normalizer is None else None
    return None if added is None or added.lstrip or added.rstrip or added.single_word else added.content
