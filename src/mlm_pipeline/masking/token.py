"""``token``: BERT's masking. The ``k`` positions of a row are drawn uniformly without
replacement among its candidates: one uniform key per (row, column) of the padded
``[rows, max length]`` layout, 2.0 added to the keys of non-candidates, the ``k`` smallest keys
chosen."""

from __future__ import annotations

import numpy as np

from mlm_pipeline.masking import base
from mlm_pipeline.masking.base import (
    PURPOSE_ORDER,
    Chosen,
    Draws,
    MaskingScheme,
    Selection,
    nonzero_2d,
    row_counts,
)


def smallest(keys: np.ndarray, k: np.ndarray) -> np.ndarray:
    """Boolean [rows, width]: the ``k[i]`` smallest keys of row ``i`` (equal keys: lower column
    first), i.e. the positions of rank ``< k[i]`` in a stable argsort of the row, found with a
    partition instead of a sort."""
    m, width = keys.shape
    top = int(k.max()) if m else 0
    if top == 0:
        return np.zeros(keys.shape, dtype=bool)
    part = np.partition(keys, top - 1, axis=1)[:, :top] if top < width else keys.copy()
    part.sort(axis=1)
    thr = part[np.arange(m), np.maximum(k, 1) - 1]
    thr[k == 0] = -np.inf
    chosen = keys <= thr[:, None]
    if np.count_nonzero(chosen) > k.sum():  # equal keys at the threshold (~never)
        for i in np.flatnonzero(row_counts(chosen) > k):
            chosen[i] = False
            chosen[i, np.argsort(keys[i], kind="stable")[: k[i]]] = True
    return chosen


def choose_tokens(sel: Selection, draws: Draws) -> Chosen:
    """Positions (row by row, ascending within one) of ``k`` candidates per row."""
    n, offsets, lens = sel.n, sel.offsets, sel.lens
    width = int(lens.max())
    columns = np.arange(width)
    out = []
    step = base.chunk_rows(width)
    for r0 in range(0, n, step):
        r1 = min(n, r0 + step)
        keys = draws.grid(np.arange(r0, r1), width, PURPOSE_ORDER)
        inside = columns < lens[r0:r1, None]
        cand_2d = np.zeros(inside.shape, dtype=bool)
        cand_2d[inside] = sel.cand[offsets[r0] : offsets[r1]]
        keys += ~cand_2d * np.float32(2.0)  # non-candidates past every candidate (7x a putmask of 2.0)
        rows, cols = nonzero_2d(smallest(keys, sel.k[r0:r1]))  # row-major: ascending positions
        out.append(offsets[rows + r0] + cols)
    return Chosen(np.concatenate(out))


SCHEME = MaskingScheme(
    name="token",
    choose=choose_tokens,
    help="BERT's: tokens drawn uniformly",
)
