"""``ngram``: ALBERT's and Megatron-LM's n-gram masking (google-research/albert
``create_masked_lm_predictions``), vectorised over the rows of a batch.

Each word of a row (with ``--no-do-whole-word-mask``, each token) is a candidate start; a row
visits its candidates in random order until its budget is met. At each visit an n is drawn with
``P(n) ∝ 1/n`` on ``1..--ngram`` (reversed with ``--no-favor-shorter-ngram``, as ALBERT does),
the n-gram is the words from the start on (fewer at the row's end), and while it would overflow
the budget it is shortened a word at a time; it is skipped if even one word overflows or if it
overlaps a word already masked. Words are grouped as ALBERT groups them: a continuation piece
right after ``[SEP]`` joins the word before it, and n-grams run over the words of the whole
instance. The replacement is per token (80/10/10), as ALBERT's.

The draws differ from ALBERT's (one key per word for the visit order, one uniform per visit for
n, from the run's generator) but the distribution of what is masked is the same; ``--reference``
reproduces ALBERT's script draw for draw.
"""

from __future__ import annotations

import numpy as np

from mlm_pipeline.masking import base
from mlm_pipeline.masking.base import (
    PURPOSE_NGRAM,
    PURPOSE_ORDER,
    Chosen,
    Draws,
    MaskingScheme,
    Selection,
    find_words,
    visit_order,
)


def ngram_cdf(ngram: int, favor_shorter: bool) -> np.ndarray:
    """Cumulative P(n) for n = 1..ngram: ∝ 1/n, reversed when not favouring shorter n-grams."""
    p = 1.0 / np.arange(1, ngram + 1)
    p /= p.sum()
    if not favor_shorter:
        p = p[::-1]
    cdf = np.cumsum(p)
    return cdf / cdf[-1]


def choose_ngrams(sel: Selection, draws: Draws) -> Chosen:
    spec = sel.spec
    words = find_words(sel, whole_words=spec.do_whole_word_mask, cross_specials=True)
    if len(words) == 0:
        return Chosen(words.cand_pos)
    top = spec.ngram
    cdf = ngram_cdf(top, spec.favor_shorter_ngram)
    before = words.bounds  # candidate tokens before word w
    nw = len(words)
    covered = np.zeros(nw + top, dtype=bool)  # (spare slots past the last word, never set)
    per_row = np.diff(words.first)
    step = base.chunk_rows(int(per_row.max()) if sel.n else 0)
    for r0 in range(0, sel.n, step):
        r1 = min(sel.n, r0 + step)
        wpr = per_row[r0:r1]
        width = int(wpr.max())
        if width == 0:
            continue
        rows = np.arange(r0, r1)
        keys = draws.grid(rows, width, PURPOSE_ORDER)
        np.copyto(keys, np.float32(2.0), where=np.arange(width) >= wpr[:, None])
        order, bits = visit_order(keys)
        column = (1 << bits) - 1
        u_n = draws.grid(rows, width, PURPOSE_NGRAM)
        first, end = words.first[r0:r1], words.first[r0 + 1 : r1 + 1]
        # the rows still short of their budget, and for each its budget left, words and end
        live = np.flatnonzero((wpr > 0) & (sel.k[r0:r1] > 0))
        left, lim, stop = sel.k[r0:r1][live], wpr[live], end[live]
        for j in range(width):  # visit rank, vectorised over the live rows
            keep = (left > 0) & (lim > j)
            if not keep.all():  # (the set only shrinks)
                live, left, lim, stop = live[keep], left[keep], lim[keep], stop[keep]
            if len(live) == 0:
                break
            w = first[live] + (order[live, j] & column)
            n = 1 + np.searchsorted(cdf, u_n[live, j].astype(np.float64), side="right")
            np.minimum(n, top, out=n)
            e = np.minimum(w + n, stop)
            took = before[e] - before[w]
            for _ in range(top - 1):  # shorten while it overflows
                over = (took > left) & (n > 1)
                if not over.any():
                    break
                n = n - over
                e = np.minimum(w + n, stop)
                took = before[e] - before[w]
            span = e - w  # words in the n-gram (at least 1)
            hit = covered[w]
            for d in range(1, top):
                hit |= covered[w + d] & (span > d)
            ok = (took <= left) & ~hit
            if not ok.any():
                continue
            w, span = w[ok], span[ok]
            covered[w] = True
            for d in range(1, top):
                covered[w[span > d] + d] = True
            left[ok] -= took[ok]
    return Chosen(words.positions(covered[:nw]))


def _check(settings) -> None:
    if settings.ngram < 1:
        raise ValueError(f"--ngram must be at least 1, got {settings.ngram}")


SCHEME = MaskingScheme(
    name="ngram",
    choose=choose_ngrams,
    help="ALBERT's n-grams of whole words, P(n) ∝ 1/n",
    whole_words="option",
    parameters=("ngram", "favor_shorter_ngram"),
    check=_check,
)
