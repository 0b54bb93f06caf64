"""The stream of one epoch: which shard row stands at each position, for one or several outputs.

An epoch's *stream* is a sequence of ``N`` positions, each naming one row of one shard. Ranks
take contiguous slices of it and cut them into shuffle windows (:mod:`.epoch_plan`); this module
says what the stream is, in three steps (pure functions of the shard counts, the mix, ``seed``
and ``epoch``):

1. **Mix.** Each source (a prepared output) contributes ``m_i`` rows to the epoch
   (:func:`mix_counts`: proportional to its weight, exact to one row; with one source, all its
   rows). A source's shards, in an order fixed by ``(seed, source)``, form a cycle of its ``n_i``
   rows; epoch ``e`` takes the ``m_i`` rows that follow on from where epoch ``e - 1`` stopped
   (``[e * m_i, (e + 1) * m_i)`` modulo ``n_i``). When ``m_i <= n_i`` no row repeats within an
   epoch and every row is seen once before any is seen again; when ``m_i > n_i`` (upsampling) the
   cycle is gone through ``m_i / n_i`` times, so a row repeats ``floor`` or ``ceil`` of that. The
   rows taken form *pieces*: runs of consecutive rows of one shard.
2. **Groups.** The pieces are permuted by ``(seed, epoch)`` and dealt into ``ceil(P /
   interleave)`` groups of consecutive pieces, of nearly equal numbers of pieces; the groups follow
   each other in the stream.
3. **Rounds.** Within a group of total ``T`` rows, the stream goes in ``C = ceil(T /
   round_size)`` rounds; round ``c`` takes rows ``[c * n_k // C, (c + 1) * n_k // C)`` of every
   piece ``k`` of the group, the pieces in group order. Every piece is thus spread evenly over the
   group's stretch of the stream, and a stretch of ``round_size`` positions (a shuffle window)
   holds rows of every piece of its group, in proportion to their sizes.

Without ``shuffle`` the stream is the sources' shards in manifest order (no mixing order, no
interleaving). :meth:`EpochStream.locate` maps positions to ``(shard, row)`` without building the
whole stream: per group, only the rounds a window touches are computed.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

__all__ = ["EpochStream", "epoch_stream", "mix_counts"]

_PIECE_STREAM, _SOURCE_STREAM = 3, 4


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(k) for k in key]))


def mix_counts(sizes: Sequence[int], weights: Sequence[float] | None, samples_per_epoch: int | None) -> np.ndarray:
    """Rows each source contributes to an epoch.

    No weights: every row of every source. With weights: ``samples_per_epoch`` rows (default:
    the most there can be without repeating a row, set by the scarcest source relative to its
    weight) shared by largest remainders, so each source's count is within one row of its share.
    """
    sizes = np.asarray(sizes, dtype=np.int64)
    if weights is None:
        if samples_per_epoch is not None:
            raise ValueError("samples_per_epoch needs weights")
        return sizes.copy()
    w = np.asarray(weights, dtype=np.float64)
    if w.shape != sizes.shape or not np.all(np.isfinite(w)) or (w < 0).any() or w.sum() <= 0:
        raise ValueError(f"weights must be one non-negative number per source, not all 0; got {list(weights)}")
    p = w / w.sum()
    if ((p > 0) & (sizes == 0)).any():
        raise ValueError("a source with a positive weight has no instances")
    if samples_per_epoch is None:
        total = int(min(math.floor(n / q + 1e-9) for n, q in zip(sizes.tolist(), p.tolist()) if q > 0))
    else:
        if not isinstance(samples_per_epoch, int) or samples_per_epoch < 1:
            raise ValueError(f"samples_per_epoch must be a positive int, got {samples_per_epoch!r}")
        total = samples_per_epoch
    exact = p * total
    counts = np.floor(exact + 1e-9).astype(np.int64)
    short = total - int(counts.sum())
    if short > 0:
        order = np.lexsort((np.arange(len(p)), -(exact - counts)))  # largest remainder, then source order
        counts[order[:short]] += 1
    if samples_per_epoch is None:
        counts = np.minimum(counts, sizes)
    return counts


@dataclass(frozen=True)
class EpochStream:
    """One epoch's stream (see the module docstring); shard numbers are global (sources concatenated)."""

    shard_starts: np.ndarray  # [S + 1] global index where each global shard starts
    piece_shard: np.ndarray  # [P] global shard of each piece, in stream order
    piece_row: np.ndarray  # [P] first row of each piece in its shard
    piece_count: np.ndarray  # [P] rows of each piece
    group_bounds: np.ndarray  # [G + 1] piece index where each group starts
    group_starts: np.ndarray  # [G + 1] stream position where each group starts
    round_size: int
    source_counts: np.ndarray  # rows of each source in this epoch

    @property
    def total(self) -> int:
        return int(self.group_starts[-1])

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global shard and row of each stream position in ``pos`` (int64, any order)."""
        pos = np.asarray(pos, dtype=np.int64)
        shard = np.empty(len(pos), dtype=np.int64)
        row = np.empty(len(pos), dtype=np.int64)
        grp = np.searchsorted(self.group_starts, pos, side="right") - 1
        for g in np.unique(grp).tolist():
            sel = np.flatnonzero(grp == g)
            a, b = int(self.group_bounds[g]), int(self.group_bounds[g + 1])
            k, r = self._locate_in_group(pos[sel] - self.group_starts[g], self.piece_count[a:b])
            shard[sel] = self.piece_shard[a + k]
            row[sel] = self.piece_row[a + k] + r
        return shard, row

    def _locate_in_group(self, q: np.ndarray, n: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Piece (within the group) and row (within the piece) of group offsets ``q``."""
        total, pieces = int(n.sum()), len(n)
        rounds = max(1, -(-total // self.round_size))
        if rounds == 1 or pieces == 1:
            starts = np.cumsum(n) - n
            k = np.searchsorted(starts, q, side="right") - 1
            # pieces of 0 rows never occur (they are not made), so the last start <= q is q's piece
            return k, q - starts[k]
        # Round c starts at R(c) = sum_k c * n_k // C, within (c * T / C - pieces, c * T / C]: the
        # round of q lies in [q * C // T, (q + pieces) * C // T + 1].
        lo_c = int(q.min()) * rounds // total
        hi_c = min(rounds - 1, (int(q.max()) + pieces) * rounds // total + 1)
        cs = np.arange(lo_c, hi_c + 1, dtype=np.int64)
        first = cs[:, None] * n[None, :] // rounds  # [c, k] first row of piece k in round c
        size = (cs[:, None] + 1) * n[None, :] // rounds - first
        flat = (first.sum(1)[:, None] + np.cumsum(size, 1) - size).ravel()  # stream offset of each (c, k) chunk
        j = np.searchsorted(flat, q, side="right") - 1  # chunks of 0 rows share an offset: the last is q's
        c, k = np.divmod(j, pieces)
        return k, first[c, k] + (q - flat[j])

    def global_index(self, shard: np.ndarray, row: np.ndarray) -> np.ndarray:
        return self.shard_starts[shard] + row


def _cycle_pieces(counts: np.ndarray, order: np.ndarray, start: int, length: int):
    """Pieces ``(shard, row, rows)`` of ``length`` rows of the cycle of shards ``order``
    (concatenated), from cycle position ``start`` on, wrapping around."""
    sizes = counts[order]
    starts = np.concatenate([[0], np.cumsum(sizes)])
    n = int(starts[-1])
    out, pos, left = [], start % n if n else 0, length
    while left > 0:
        i = int(np.searchsorted(starts, pos, side="right") - 1)
        row = pos - int(starts[i])
        take = min(left, int(sizes[i]) - row)
        if take > 0:
            out.append((int(order[i]), row, take))
        left -= take
        pos = (pos + take) % n
    return out


def epoch_stream(source_shard_counts: Sequence[np.ndarray], *, seed: int, epoch: int, shuffle: bool,
                 interleave: int, round_size: int, weights: Sequence[float] | None = None,
                 samples_per_epoch: int | None = None) -> EpochStream:
    """The stream of ``epoch`` over sources with these shard counts (each in manifest order)."""
    counts = [np.asarray(c, dtype=np.int64) for c in source_shard_counts]
    base = np.cumsum([0] + [len(c) for c in counts])
    flat = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    shard_starts = np.concatenate([[0], np.cumsum(flat)])
    take = mix_counts([int(c.sum()) for c in counts], weights, samples_per_epoch)
    pieces = []
    for i, c in enumerate(counts):
        if not take[i]:
            continue
        order = _rng(seed, _SOURCE_STREAM, i).permutation(len(c)) if shuffle else np.arange(len(c))
        start = epoch * int(take[i]) if shuffle or weights is not None else 0
        pieces += [(int(base[i]) + s, r, n) for s, r, n in _cycle_pieces(c, order, start, int(take[i]))]
    arr = np.array(pieces, dtype=np.int64).reshape(-1, 3)
    if shuffle and len(arr):
        arr = arr[_rng(seed, epoch, _PIECE_STREAM).permutation(len(arr))]
    per_group = max(1, interleave) if shuffle else 1
    groups = -(-len(arr) // per_group) if len(arr) else 0
    bounds = np.array([len(arr) * g // groups for g in range(groups + 1)] if groups else [0], dtype=np.int64)
    group_starts = np.concatenate([[0], np.cumsum(arr[:, 2])])[bounds]
    return EpochStream(shard_starts=shard_starts, piece_shard=arr[:, 0].copy(), piece_row=arr[:, 1].copy(),
                       piece_count=arr[:, 2].copy(), group_bounds=bounds, group_starts=group_starts,
                       round_size=max(1, round_size), source_counts=take)
