"""The stream of one epoch: which shard row stands at each position, for one or several outputs.

An epoch's *stream* is a sequence of ``N`` positions, each naming one row of one shard. Ranks
take contiguous slices of it and cut them into shuffle windows (:mod:`.epoch_plan`); this module
says what the stream is, in three steps (pure functions of the shard counts, their row groups,
the mix, ``seed``, ``epoch`` and the window length):

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
3. **Chunks.** Each piece of ``n`` rows of a group of ``T`` rows is cut into *chunks*: at its
   shard's row-group boundaries, and a row group of more than ``window * n // T`` rows into equal
   parts of at most that many (``window / k`` for ``k`` pieces of equal size), so that a piece
   has at least ``T / window`` chunks. The group's stretch of the stream lists its chunks, each
   as consecutive rows, ordered by ``(j + phase) / m`` for the ``j``-th of the ``m`` chunks of a
   piece, the ``i``-th piece of ``k`` having the phase ``(i + 1/2) / k``: the chunks of a piece
   are evenly spaced over the stretch and the pieces staggered. So any stretch of ``window``
   positions holds chunks of every piece of its group, in about the proportion of their sizes;
   and where a row group is one chunk, a cut between two readers (ranks, DataLoader workers)
   falls inside at most one chunk, so each row group is read by one reader, once per epoch. A
   larger row group is cut into parts that may go to different readers, each of which then reads
   it whole.

Without ``shuffle`` the stream is the sources' shards in manifest order (no mixing order, no
interleaving). :meth:`EpochStream.locate` maps positions to ``(shard, row)``.
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
    chunk_shard: np.ndarray  # [C] global shard of each chunk, in stream order
    chunk_row: np.ndarray  # [C] first row of each chunk in its shard
    chunk_starts: np.ndarray  # [C + 1] stream position where each chunk starts
    source_counts: np.ndarray  # rows of each source in this epoch

    @property
    def total(self) -> int:
        return int(self.chunk_starts[-1])

    def locate(self, pos: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Global shard and row of each stream position in ``pos`` (int64, any order)."""
        pos = np.asarray(pos, dtype=np.int64)
        k = np.searchsorted(self.chunk_starts, pos, side="right") - 1  # chunks are never empty
        return self.chunk_shard[k], self.chunk_row[k] + (pos - self.chunk_starts[k])

    def global_index(self, shard: np.ndarray, row: np.ndarray) -> np.ndarray:
        return self.shard_starts[shard] + row


def _chunks(pieces: np.ndarray, row_group_starts: list[np.ndarray], window: int):
    """Shard, first row and rows of the chunks of one group's ``pieces`` (``(shard, row, count)``
    rows), in stream order (step 3 of the module docstring)."""
    shard_of, row_of, count_of, due = [], [], [], []
    total = int(pieces[:, 2].sum())
    for shard, row, count in pieces.tolist():
        limit = max(1, window * count // total)
        starts = row_group_starts[shard]
        edges = np.concatenate([[row], starts[(starts > row) & (starts < row + count)], [row + count]])
        parts = -(-np.diff(edges) // limit)  # equal parts of at most ``limit`` rows
        first = np.repeat(edges[:-1], parts)
        size = np.repeat(np.diff(edges), parts)
        j = np.arange(len(first)) - np.repeat(np.cumsum(parts) - parts, parts)
        n = np.repeat(parts, parts)
        lo, hi = first + size * j // n, first + size * (j + 1) // n
        shard_of.append(np.full(len(lo), shard))
        row_of.append(lo)
        count_of.append(hi - lo)
        due.append((np.arange(len(lo)) + (len(due) + 0.5) / len(pieces)) / len(lo))
    order = np.lexsort((np.repeat(np.arange(len(due)), [len(d) for d in due]), np.concatenate(due)))
    return np.concatenate(shard_of)[order], np.concatenate(row_of)[order], np.concatenate(count_of)[order]


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
                 interleave: int, window: int, weights: Sequence[float] | None = None,
                 samples_per_epoch: int | None = None,
                 row_groups: Sequence[np.ndarray] | None = None) -> EpochStream:
    """The stream of ``epoch`` over sources with these shard counts (each in manifest order).

    ``row_groups``: the rows of each row group of each global shard (default: one per shard).
    """
    counts = [np.asarray(c, dtype=np.int64) for c in source_shard_counts]
    base = np.cumsum([0] + [len(c) for c in counts])
    flat = np.concatenate(counts) if counts else np.zeros(0, np.int64)
    shard_starts = np.concatenate([[0], np.cumsum(flat)])
    if row_groups is None:
        row_groups = [np.array([n]) for n in flat.tolist()]
    group_starts = [np.cumsum(np.asarray(g, dtype=np.int64)) - np.asarray(g, dtype=np.int64) for g in row_groups]
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
    bounds = [len(arr) * g // groups for g in range(groups + 1)] if groups else [0]
    shard = row = count = np.zeros(0, np.int64)
    if groups:
        chunks = [_chunks(arr[a:b], group_starts, window) for a, b in zip(bounds[:-1], bounds[1:])]
        shard, row, count = (np.concatenate(part) for part in zip(*chunks))
    return EpochStream(shard_starts=shard_starts, chunk_shard=shard.astype(np.int64), chunk_row=row.astype(np.int64),
                       chunk_starts=np.concatenate([[0], np.cumsum(count)]).astype(np.int64), source_counts=take)
