"""``span``: SpanBERT's span masking (Joshi et al. 2020), vectorised over the rows of a batch.

A row draws spans until its budget is met. A span's length in whole words is geometric,
``P(L) ∝ (1 - p)^(L - 1)`` truncated to ``[--span-lower, --span-upper]`` (SpanBERT: p = 0.2 on
1..10, mean 3.8 words); its anchor is a word of the row drawn uniformly, and the span runs from
there, moved back as far as needed to fit inside the anchor's segment (a span never crosses
``[SEP]`` or any special token, nor does a word). A span that overlaps or touches a masked word
is placed again (same length, a new anchor: collisions, more likely for long spans, would
otherwise bias the lengths; after four places with no room it loses a word, which only happens
in nearly full rows), so each span stays a run of its own. The 80/10/10 choice is made
once per span.

Budget: spans are taken whole while they fit ``k`` (``num_to_predict``). The first one that
does not fit is taken whole with probability ``(k - masked) / its tokens`` when
``--max-predictions-per-seq`` leaves room for it, and the row stops either way: a row masks ``k``
tokens on average and no span is cut, so span lengths keep their distribution. Where the cap
leaves no room, the span is cut to the words that fit (a shorter last span) and drawing goes on.
"""

from __future__ import annotations

import numpy as np

from mlm_pipeline.masking import base
from mlm_pipeline.masking.base import (
    PURPOSE_SPAN_ACCEPT,
    PURPOSE_SPAN_ANCHOR,
    PURPOSE_SPAN_LENGTH,
    Chosen,
    Draws,
    MaskingScheme,
    Selection,
    find_words,
)


_TRIES = 4


def span_length_cdf(p: float, lower: int, upper: int) -> np.ndarray:
    """Cumulative P(L) for L = lower..upper: the geometric distribution truncated there."""
    weights = (1.0 - p) ** np.arange(upper - lower + 1, dtype=np.float64)
    cdf = np.cumsum(weights)
    return cdf / cdf[-1]


def mean_span_length(p: float, lower: int, upper: int) -> float:
    """The mean of that truncated geometric distribution (3.80 words for 0.2 on 1..10)."""
    pmf = np.diff(span_length_cdf(p, lower, upper), prepend=0.0)
    return float(np.dot(pmf, np.arange(lower, upper + 1)))


def choose_spans(sel: Selection, draws: Draws) -> Chosen:
    spec = sel.spec
    words = find_words(sel, whole_words=True, cross_specials=False)
    if len(words) == 0:
        return Chosen(words.cand_pos, words.cand_pos)
    lower, upper = spec.span_lower, spec.span_upper
    cdf = span_length_cdf(spec.geometric_p, lower, upper)
    lengths = np.arange(lower, upper + 1)
    pmf = np.diff(cdf, prepend=0.0)
    straddling = float(np.dot(pmf, lengths ** 2) / np.dot(pmf, lengths))  # size-biased mean length
    nw = len(words)
    before = words.bounds  # tokens of the words before word w (words tile the candidates)
    # segments: runs of words with no special token between them
    prev = words.start - 1
    begins = (prev < sel.offsets[words.row]) | ~sel.cand[np.maximum(prev, 0)]
    seg = np.cumsum(begins) - 1
    seg_first = np.flatnonzero(begins)
    seg_end = np.append(seg_first[1:], nw)
    span_of = np.full(nw + 1, -1, dtype=np.int64)  # (one spare slot, never masked, for clipped indices)
    spans = 0
    per_row = np.diff(words.first)
    attempts = 4 * int(sel.k.max()) + 32 if sel.n else 0
    step = base.chunk_rows(attempts)
    for r0 in range(0, sel.n, step):
        r1 = min(sel.n, r0 + step)
        rows = np.arange(r0, r1)
        u_len = draws.grid(rows, attempts, PURPOSE_SPAN_LENGTH).astype(np.float64)
        u_anchor = draws.grid(rows, attempts, PURPOSE_SPAN_ANCHOR)
        u_accept = draws.grid(rows, attempts, PURPOSE_SPAN_ACCEPT)
        wpr, first = per_row[r0:r1], words.first[r0:r1]
        k = sel.k[r0:r1]
        count = np.zeros(r1 - r0, dtype=np.int64)
        done = (wpr == 0) | (k == 0)
        pending = np.zeros(r1 - r0, dtype=np.int64)
        tries = np.zeros(r1 - r0, dtype=np.int64)
        # the expected tokens of the span that meets the budget in this row: spans that straddle a
        # point are size-biased (longer than the mean), times the row's tokens per word
        expected = straddling * (before[words.first[r0 + 1 : r1 + 1]] - before[first]) / np.maximum(wpr, 1)
        for t in range(attempts):  # vectorised over the rows
            live = np.flatnonzero(~done)
            if len(live) == 0:
                break
            fresh = pending[live] == 0  # a span that collided keeps its length: only its place is drawn again
            drawn = lower + np.searchsorted(cdf, u_len[live, t], side="right")
            length = np.where(fresh, np.minimum(drawn, upper), pending[live])
            anchor = first[live] + np.minimum((u_anchor[live, t] * wpr[live]).astype(np.int64), wpr[live] - 1)
            lo, hi = seg_first[seg[anchor]], seg_end[seg[anchor]]
            start = np.maximum(lo, np.minimum(anchor, hi - length))
            end = np.minimum(start + length, hi)
            # overlapping or touching a masked word of the segment: drawn again
            free = np.ones(len(live), dtype=bool)
            for d in range(upper + 2):
                w = start - 1 + d
                inside = (w >= lo) & (w <= end) & (w < hi)
                free &= ~(inside & (span_of[np.where(inside, w, nw)] >= 0))
            room = k[live] - count[live]
            tokens = before[end] - before[start]
            over = free & (tokens > room)
            can_overshoot = over & (count[live] + tokens <= spec.max_predictions)
            lucky = can_overshoot & (u_accept[live, t] < room / expected[live])
            cut = over & ~can_overshoot
            if cut.any():  # the words that fit, if any
                fit = np.zeros(len(live), dtype=np.int64)
                for n in range(1, upper + 1):
                    fit = np.where((start + n <= end) & (before[np.minimum(start + n, nw)] - before[start] <= room),
                                   n, fit)
                end = np.where(cut, start + fit, end)
                tokens = before[end] - before[start]
            take = free & (~over | lucky | (cut & (end > start)))
            for d in range(upper):
                at = take & (start + d < end)
                span_of[start[at] + d] = spans + np.flatnonzero(take).searchsorted(np.flatnonzero(at))
            spans += int(take.sum())
            # a span that does not find room in _TRIES places is shortened by a word (a nearly full
            # row, at rates near 0.5: the lengths skew short only there)
            tries[live] = np.where(free, 0, tries[live] + 1)
            stuck = tries[live] >= _TRIES
            pending[live] = np.where(free, 0, np.where(stuck, np.maximum(lower, length - 1), length))
            tries[live[stuck]] = 0
            count[live[take]] += tokens[take]
            done[live[can_overshoot]] = True  # taken or not, the row stops
            done[live] |= count[live] >= k[live]
    chosen = span_of[:-1] >= 0
    at = chosen[words.of_cand]
    return Chosen(words.cand_pos[at], span_of[words.of_cand[at]])


def _check(settings) -> None:
    if settings.span_lower > settings.span_upper:
        raise ValueError(f"--span-lower ({settings.span_lower}) cannot exceed --span-upper ({settings.span_upper})")


SCHEME = MaskingScheme(
    name="span",
    choose=choose_spans,
    help="SpanBERT's spans of whole words, geometric lengths, 80/10/10 per span",
    whole_words="always",
    parameters=("geometric_p", "span_lower", "span_upper"),
    per_group=True,
    check=_check,
)
