"""``whole-word``: Google's whole-word masking (``--do_whole_word_mask``). The words of a row (a
token plus its continuation pieces) are visited in random order and taken whole while they fit
the budget: a word that would overflow it is skipped, so no word is ever partly masked.

A word starts at a candidate that is not a continuation piece, or at a row's first candidate (a
continuation right after a special token joins the word before it, as in Google's script). Each
word gets one uniform key; a row visits its words by ascending key (equal keys: word order),
which only needs the few smallest keys of the row.
"""

from __future__ import annotations

import numpy as np

from mlm_pipeline.masking import base
from mlm_pipeline.masking.base import (
    PURPOSE_ORDER,
    Chosen,
    Draws,
    MaskingScheme,
    Selection,
    find_words,
    nonzero_2d,
    visit_order,
)


def _greedy_words(lengths: np.ndarray, k: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Visit words in column order (lengths [rows, words], 0 = no word), taking each that still
    fits the row's budget ``k``: (accepted [rows, words], tokens taken per row)."""
    m, width = lengths.shape
    count = np.zeros(m, dtype=np.int64)
    accepted = np.zeros((m, width), dtype=bool)
    for j in range(width):  # loop over word rank, vectorised over all instances
        lj = lengths[:, j]
        take = (lj > 0) & (count + lj <= k)
        accepted[:, j] = take
        count += np.where(take, lj, 0)
        if np.all(count >= k):
            break
    return accepted, count


def choose_whole_words(sel: Selection, draws: Draws) -> Chosen:
    """Positions (ascending) of whole words visited in random order, each taken if it fits."""
    words = find_words(sel, whole_words=True, cross_specials=True)
    n, k = sel.n, sel.k
    if len(words) == 0:
        return Chosen(words.cand_pos)
    keys = draws.at(words.row, words.start - sel.offsets[words.row], PURPOSE_ORDER)
    words_per_row = np.diff(words.first)
    row_start = words.first
    chosen_word = np.zeros(len(words), dtype=bool)
    step = base.chunk_rows(int(words_per_row.max()) if n else 0)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        wpr = words_per_row[r0:r1]
        width = int(wpr.max())
        if width == 0:
            continue
        inside = np.arange(width) < wpr[:, None]
        wkeys = np.full(inside.shape, 2.0, dtype=np.float32)
        wkeys[inside] = keys[row_start[r0] : row_start[r1]]
        wlen = np.zeros(inside.shape, dtype=np.int64)
        wlen[inside] = words.length[row_start[r0] : row_start[r1]]
        kk = k[r0:r1]
        # (key, column) packed in one int64: distinct, so the ``visit`` smallest are exactly the
        # first ``visit`` of a stable argsort, ties at the cut included
        packed, bits = visit_order(wkeys, sort=False)
        column = (1 << bits) - 1
        visit = min(width, int(kk.max()) + base.WORD_SLACK)
        if visit < width:
            head = np.partition(packed, visit - 1, axis=1)[:, :visit]
            head.sort(axis=1)
            cols = head & column
            accepted, count = _greedy_words(np.take_along_axis(wlen, cols, axis=1), kk)
            redo = (wpr > visit) & (count < kk)  # rows with unvisited words that could still matter
        else:
            packed.sort(axis=1)
            cols = packed & column
            accepted, _ = _greedy_words(np.take_along_axis(wlen, cols, axis=1), kk)
            redo = np.zeros(len(kk), dtype=bool)
        rows, ranks = nonzero_2d(accepted & ~redo[:, None])
        chosen_word[row_start[r0 + rows] + cols[rows, ranks]] = True
        if redo.any():
            again = np.flatnonzero(redo)
            cols = np.sort(packed[again], axis=1) & column
            accepted, _ = _greedy_words(np.take_along_axis(wlen[again], cols, axis=1), kk[again])
            rows, ranks = nonzero_2d(accepted)
            chosen_word[row_start[r0 + again[rows]] + cols[rows, ranks]] = True
    return Chosen(words.positions(chosen_word))


SCHEME = MaskingScheme(
    name="whole-word",
    choose=choose_whole_words,
    help="Google's whole-word masking: a word and its continuation pieces together",
    whole_words="always",
)
