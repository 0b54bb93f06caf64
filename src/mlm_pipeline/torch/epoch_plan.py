"""Which samples a rank and its workers emit in an epoch, in which order, and where a resume starts.

The order of one epoch, in four steps (all pure functions of the shard counts and row groups, the
mix, ``seed``, ``epoch`` and ``world_size``, and with length bins of the rows' lengths; never of
the worker count, the machine or timing):

1. **Stream.** The epoch's *stream* of ``N`` positions, each a row of a shard
   (:mod:`.stream`): the rows each source contributes (all of them, or its weighted share), in
   pieces permuted by ``(seed, epoch)`` and interleaved in groups of ``interleave`` pieces as
   chunks of whole row groups, so that any stretch of a window's length holds rows of every piece
   of its group and a cut between two readers splits at most one row group.
2. **Ranks.** Rank ``r`` of ``R`` owns the contiguous stream slice ``[a_r, a_r + n_r)`` with
   ``n_r = N // R + (r < N % R)``: every position goes to exactly one rank, none is dropped or
   repeated, and rank sizes differ by at most one. With ``pad_ranks=True`` the shorter ranks get
   one extra *padding* sample (a copy of the stream's next instance, ``weight`` 0, no labels), so
   every rank has ``ceil(N / R)`` samples and, for equal ``num_workers`` and ``batch_size``, the
   same number of batches (what DDP needs to keep its collectives in step).
3. **Windows.** A rank's slice is cut into windows of ``shuffle_buffer`` consecutive samples (the
   last one shorter). A window is read (only the rows it covers) and emitted in a random order
   drawn from ``(seed, epoch, window start)``; with length bins, regrouped into batches of one
   bin each, the bins of its batches being the same on every rank (:func:`binned_order`). Memory
   is one window per worker.
4. **Workers.** The windows still to read are split into ``num_workers`` contiguous runs, balanced
   by sample count. Each DataLoader worker reads only its run; the DataLoader interleaves the
   workers' batches round robin (skipping exhausted workers), which is deterministic. The runs are
   cut by the windows of the longest rank, so that they are the same on every rank: the ``k``-th
   batch of every rank comes from the same worker and window number.

So the *set* of samples of a rank and the content and order of each window never depend on the
worker count; the interleaving of windows does. Dynamic masks come from each sample's ``index``
(its position in the manifest), so they do not depend on any of this either.

Resumption. A position inside an epoch is recorded as the list of ``(num_workers, batch_size,
batches)`` *segments* consumed so far. Replaying them (:func:`replay`: pure arithmetic on window
sizes, no data read) gives, for each window, how many of its samples were already emitted; a
resumed iteration reads only the rest. The state (:func:`make_state`) names no rank: in DDP,
every rank consumes the same number of batches, so rank 0's checkpoint restores every rank. It
can be loaded with another ``num_workers`` or ``batch_size`` (every remaining sample is still seen
once); with the same ones the remaining sequence is identical to the uninterrupted run. The world
size, seed, shuffle settings and shards must match (:func:`read_state` raises ``ValueError``
otherwise).
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Sequence

import numpy as np

from mlm_pipeline.torch.stream import EpochStream

__all__ = [
    "STATE_VERSION",
    "RankPlan",
    "Schedule",
    "Segment",
    "balanced_runs",
    "binned_order",
    "count_batches",
    "length_bins",
    "make_state",
    "plan_rank",
    "read_state",
    "remaining_after",
    "replay",
]

STATE_VERSION = 3  # 3: row-group chunks, bins shared by ranks; 2: interleaved rounds; 1: no interleaving
Segment = tuple[int, int, int]  # (num_workers, batch_size, batches) consumed from one DataLoader pass
_WINDOW_STREAM, _BIN_STREAM = 2, 5


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(k) for k in key]))


def rank_slice(total: int, world_size: int, rank: int, pad_ranks: bool) -> tuple[int, int, int]:
    """Rank ``rank``'s stream slice: its start, its real samples and the samples it emits."""
    q, extra = divmod(total, world_size)
    real = q + (rank < extra)
    return rank * q + min(rank, extra), real, (q + (extra > 0)) if (pad_ranks and total) else real


def _window_sizes(length: int, window: int) -> np.ndarray:
    n = math.ceil(length / window) if length else 0
    sizes = np.full(n, window, dtype=np.int64)
    if n:
        sizes[-1] = length - (n - 1) * window
    return sizes


@dataclass(frozen=True)
class RankPlan:
    """One rank's share of one epoch: its stream slice, cut into windows."""

    seed: int
    epoch: int
    shuffle: bool
    stream: EpochStream  # which shard row stands at each stream position
    total: int  # N
    rank: int
    world_size: int
    pad_ranks: bool
    window: int
    bins: tuple[int, ...] | None = None  # length bins' upper bounds (inclusive), ascending
    bin_batch: int = 0  # batch size the bins are cut for (divides ``window``)
    lengths: np.ndarray | None = None  # with bins: tokens of every instance, by global index

    @property
    def start(self) -> int:  # a_r
        return rank_slice(self.total, self.world_size, self.rank, self.pad_ranks)[0]

    @property
    def real(self) -> int:  # n_r: real samples of this rank
        return rank_slice(self.total, self.world_size, self.rank, self.pad_ranks)[1]

    @property
    def length(self) -> int:  # samples this rank emits (n_r, or ceil(N / R) with pad_ranks)
        return rank_slice(self.total, self.world_size, self.rank, self.pad_ranks)[2]

    @property
    def window_sizes(self) -> np.ndarray:
        return _window_sizes(self.length, self.window)

    @property
    def split_sizes(self) -> np.ndarray:
        """The window sizes of the longest rank (rank 0): what the workers' runs are cut by, on every rank."""
        return _window_sizes(rank_slice(self.total, self.world_size, 0, self.pad_ranks)[2], self.window)

    def _positions(self, rank: int, w: int) -> np.ndarray:
        """Stream positions of ``rank``'s window ``w``, in stream order (a padding sample wraps around)."""
        start, _, length = rank_slice(self.total, self.world_size, rank, self.pad_ranks)
        j = np.arange(w * self.window, min(length, (w + 1) * self.window), dtype=np.int64)
        return (start + j) % max(self.total, 1)

    def window_order(self, w: int, size: int) -> tuple[np.ndarray, np.ndarray | None]:
        """Positions ``0..size-1`` of window ``w`` in the order it emits them, and with length bins
        the bin of the batch each is emitted in (:func:`binned_order`; else None)."""
        if not self.shuffle:
            order = np.arange(size)
        else:
            order = _rng(self.seed, self.epoch, _WINDOW_STREAM, self.start + w * self.window).permutation(size)
        if self.bins is None:
            return order, None
        lengths = [self.lengths[self.stream.global_index(*self.stream.locate(self._positions(r, w)))]
                   for r in range(self.world_size)]
        classes = [np.searchsorted(np.asarray(self.bins), x, side="left") for x in lengths]
        counts = np.array([np.bincount(c, minlength=len(self.bins) + 1) for c in classes], dtype=np.int64)
        return binned_order(order, lengths[self.rank], classes[self.rank], counts, self.bin_batch,
                            _rng(self.seed, self.epoch, _BIN_STREAM, w))

    def window_rows(self, w: int, size: int) -> tuple[list[tuple[int, int, int]], np.ndarray, np.ndarray]:
        """What window ``w`` (of ``size`` samples) reads: its rows and what they are.

        Returns the runs of consecutive rows to read, in stream order, as ``(shard, row start,
        row stop)`` (global shard numbers: the sources' shards in manifest order, concatenated),
        then each sample's global index and its weight (0 for a padding sample, which repeats the
        stream's next instance).
        """
        j = np.arange(w * self.window, w * self.window + size, dtype=np.int64)
        shard, row = self.stream.locate(self._positions(self.rank, w))
        breaks = np.flatnonzero((shard[1:] != shard[:-1]) | (row[1:] != row[:-1] + 1)) + 1
        pieces = [
            (int(shard[a]), int(row[a]), int(row[a]) + int(b - a))
            for a, b in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [size]]))
        ]
        index = self.stream.global_index(shard, row)
        weight = (j < self.real).astype(np.float32)
        return pieces, index, weight


def binned_order(order: np.ndarray, lengths: np.ndarray, classes: np.ndarray, counts: np.ndarray, batch: int,
                 rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """``order`` (a window's shuffled positions) regrouped into batches of one length bin each, the
    bins of the window's batches coming in the same sequence on every rank.

    ``lengths`` and ``classes``: this rank's samples' lengths and bins (stream order);
    ``counts[r, b]``: samples of bin ``b`` in rank ``r``'s window of this number, which every
    rank computes from the length index. From the shortest bin up, bin ``b`` gets as many batches
    as its smallest pool fills, a rank's pool being its samples of ``b`` and those moved up from
    ``b - 1``; each rank moves what is left of its pool, its longest samples, up to ``b + 1``. So
    every rank has the same number of batches of each bin, a moved sample is padded no further
    than its new bin's bound, and a full window is used up exactly (at the top the pools are
    equal). A rank's last, shorter window ends with one short batch of what is left, its bin
    being the highest any rank has in that window.

    The batches are emitted one at a time, the bin of each drawn with probability proportional to
    the batches it still has (LDDL's rule), from ``rng``, which is the same on every rank: every
    rank draws the same bins. Within a bin, batches take the samples in ``order``. Returns the
    permutation of ``order`` and the bin of each of its positions; it depends on the window's
    lengths, every rank's, never on the worker count.
    """
    k_bins = counts.shape[1]
    rank_of = np.empty(len(order), np.int64)
    rank_of[order] = np.arange(len(order))
    n = np.zeros(k_bins, np.int64)
    pool = np.zeros(len(counts), np.int64)
    for b in range(k_bins):
        pool += counts[:, b]
        n[b] = pool.min() // batch
        pool -= n[b] * batch
    full, moved = [], np.zeros(0, np.int64)
    for b in range(k_bins):
        mine = np.concatenate([moved, np.flatnonzero(classes == b)])
        by_length = np.argsort(lengths[mine], kind="stable")
        kept, moved = mine[by_length[:n[b] * batch]], mine[by_length[n[b] * batch:]]
        full.append(_bin_batches(kept[np.argsort(rank_of[kept])], classes, b, int(n[b]), batch))
    left = n.astype(np.float64)
    taken = np.zeros(k_bins, np.int64)
    out, bins_out = [], []
    for u in rng.random(int(n.sum())):
        cdf = np.cumsum(left) / left.sum()
        k = min(int(np.searchsorted(cdf, u, side="right")), k_bins - 1)
        while left[k] == 0:  # float edge: step back to a bin that has batches
            k -= 1
        out.append(full[k][taken[k]])
        bins_out.append(k)
        taken[k] += 1
        left[k] -= 1
    tail = moved[np.argsort(rank_of[moved])]
    present = np.flatnonzero(counts.sum(0))
    top = int(present[-1]) if len(present) else k_bins - 1
    result = np.concatenate(out + [tail]).astype(np.int64) if out else tail.astype(np.int64)
    labels = np.concatenate([np.repeat(np.array(bins_out, np.int64), batch), np.full(len(tail), top, np.int64)])
    return result, labels


def _bin_batches(kept: np.ndarray, classes: np.ndarray, b: int, n: int, batch: int) -> np.ndarray:
    """The ``n`` batches of bin ``b`` from ``kept`` (its samples and those moved up to it, in the
    window's order): one of its own samples first in each, so that each batch's longest is of
    bin ``b`` (as on every other rank); then the moved samples, so that they fill few batches;
    then its other samples."""
    own = classes[kept] == b
    if own.sum() < n:
        return kept.reshape(n, batch)
    head, rest = kept[own][:n], np.concatenate([kept[~own], kept[own][n:]])
    return np.concatenate([head[:, None], rest.reshape(n, batch - 1)], axis=1)


def length_bins(bins: int | Sequence[int], max_length: int | None) -> tuple[int, ...]:
    """Upper bounds of length bins: ``n`` equal bins up to ``max_length`` (multiples of 8), or as given."""
    if isinstance(bins, int) and not isinstance(bins, bool):
        if bins < 1 or not max_length:
            raise ValueError(f"length_bins={bins} needs bins >= 1 and the output's max_seq_length")
        edges = sorted({min(max_length, -(-max_length * (i + 1) // bins // 8) * 8) for i in range(bins)})
        return tuple(int(e) for e in edges)
    edges = [int(e) for e in bins]
    if not edges or edges != sorted(set(edges)) or edges[0] < 1:
        raise ValueError(f"length_bins must be an int or increasing positive upper bounds, got {bins!r}")
    return tuple(edges)


def plan_rank(stream: EpochStream, *, seed: int, epoch: int, shuffle: bool, rank: int, world_size: int,
              pad_ranks: bool, window: int, bins: tuple[int, ...] | None = None, bin_batch: int = 0,
              lengths: np.ndarray | None = None) -> RankPlan:
    """The plan of ``rank`` for ``epoch`` over the epoch's ``stream``."""
    if rank >= world_size:
        raise ValueError(f"rank {rank} is not below world_size {world_size}")
    if bins is not None and lengths is None:
        raise ValueError("a plan with length bins needs the instances' lengths")
    return RankPlan(seed=seed, epoch=epoch, shuffle=shuffle, stream=stream, total=stream.total, rank=rank,
                    world_size=world_size, pad_ranks=pad_ranks, window=window, bins=bins, bin_batch=bin_batch,
                    lengths=lengths)


# --------------------------------------------------------------------------------------------
# Workers and resumption


def _split_contiguous(sizes: np.ndarray, parts: int) -> list[np.ndarray]:
    """Indices of ``sizes`` cut into ``parts`` contiguous runs of about equal total size."""
    if len(sizes) == 0:
        return [np.zeros(0, np.int64) for _ in range(parts)]
    before = np.cumsum(sizes) - sizes
    total = int(sizes.sum())
    targets = [-(-total * w // parts) for w in range(parts + 1)]  # ceil(total * w / parts)
    cuts = np.searchsorted(before, targets, side="left")
    cuts[-1] = len(sizes)
    return [np.arange(cuts[w], cuts[w + 1]) for w in range(parts)]


def _round_robin(batches: Sequence[int], k: int) -> list[int]:
    """Batches taken from each worker after ``k`` batches of a round robin over unfinished ones.

    The order of ``torch.utils.data.DataLoader`` with an iterable dataset: worker 0, 1, ... in
    turn, an exhausted worker skipped.
    """
    if k >= sum(batches):
        return list(batches)
    lo, hi = 0, max(batches)
    while lo < hi:  # largest t with sum(min(b, t)) <= k
        mid = (lo + hi + 1) // 2
        if sum(min(b, mid) for b in batches) <= k:
            lo = mid
        else:
            hi = mid - 1
    taken = [min(b, lo) for b in batches]
    rest = k - sum(taken)
    for w, b in enumerate(batches):
        if rest and b > lo:
            taken[w] += 1
            rest -= 1
    return taken


def balanced_runs(remaining: np.ndarray, workers: int) -> list[np.ndarray]:
    """Windows with samples left, cut into ``workers`` contiguous runs balanced by samples left."""
    live = np.flatnonzero(remaining > 0)
    return [live[idx] for idx in _split_contiguous(remaining[live], workers)]


def count_batches(remaining: np.ndarray, runs: list[np.ndarray], batch_size: int) -> int:
    """Batches the workers yield when each batches the samples left in its own windows."""
    return sum(-(-int(remaining[r].sum()) // batch_size) for r in runs)


@dataclass
class Schedule:
    """Where an epoch stands: samples emitted per window, and each worker's windows.

    The runs are cut by the longest rank's windows (``split``, see :attr:`RankPlan.split_sizes`),
    whose progress (``split_done``) every rank replays alike: all ranks have the same runs.
    """

    done: np.ndarray  # samples already emitted, per window
    split_done: np.ndarray  # ... and what the longest rank has emitted
    runs: list[np.ndarray] | None  # windows of each worker of the last segment, in resume order
    workers: int  # the worker count ``runs`` is for

    def _split_runs(self, split: np.ndarray, workers: int) -> list[np.ndarray]:
        left = split - self.split_done
        if self.runs is None or workers != self.workers:
            return balanced_runs(left, workers)
        return [r[left[r] > 0] for r in self.runs]

    def runs_for(self, sizes: np.ndarray, split: np.ndarray, workers: int) -> list[np.ndarray]:
        """Windows with samples left of each of ``workers`` for the rest of the epoch.

        With the worker count of the last segment, every worker keeps its windows and the runs
        are rotated so that the worker the DataLoader would have asked next comes first: the
        rest of the epoch is then the same sequence as without the interruption. With another
        count, the windows left are split afresh.
        """
        remaining = sizes - self.done
        return [r[remaining[r] > 0] for r in self._split_runs(split, workers)]


def _consume(done: np.ndarray, sizes: np.ndarray, runs: list[np.ndarray], batch_size: int, batches: int) -> int:
    """Add what ``batches`` of a round robin over workers with these ``runs`` emit to ``done``;
    the worker asked next."""
    remaining = sizes - done
    per_worker = [int(remaining[r].sum()) for r in runs]
    per_worker_batches = [-(-n // batch_size) for n in per_worker]
    taken = _round_robin(per_worker_batches, batches)
    for run, n, t in zip(runs, per_worker, taken):
        left = remaining[run]
        before = np.cumsum(left) - left
        done[run] += np.clip(min(t * batch_size, n) - before, 0, left)
    return _next_worker(per_worker_batches, taken)


def replay(sizes: np.ndarray, segments: Sequence[Sequence[int]], split: np.ndarray | None = None) -> Schedule:
    """Replay ``(workers, batch_size, batches)`` segments: pure arithmetic, no data read.

    ``split``: the longest rank's window sizes (default ``sizes``), of which ``sizes`` has the
    first ``len(sizes)`` (a shorter rank may have one window less).
    """
    split = np.asarray(sizes if split is None else split, dtype=np.int64)
    sizes = np.concatenate([sizes, np.zeros(len(split) - len(sizes), np.int64)]).astype(np.int64)
    schedule = Schedule(done=np.zeros(len(split), np.int64), split_done=np.zeros(len(split), np.int64),
                        runs=None, workers=0)
    for workers, batch_size, batches in segments:
        runs = schedule._split_runs(split, workers)
        nxt = _consume(schedule.split_done, split, runs, batch_size, batches)
        _consume(schedule.done, sizes, runs, batch_size, batches)
        schedule.runs = runs[nxt:] + runs[:nxt]
        schedule.workers = workers
    return schedule


def _next_worker(batches: Sequence[int], taken: Sequence[int]) -> int:
    """The worker a round robin serves next, after ``taken`` of ``batches`` from each.

    Unfinished workers are at most one batch apart, the ones ahead first: the next one is the
    first unfinished worker with the fewest batches taken.
    """
    unfinished = [w for w in range(len(batches)) if taken[w] < batches[w]]
    if not unfinished:
        return 0
    fewest = min(taken[w] for w in unfinished)
    return next(w for w in unfinished if taken[w] == fewest)


def remaining_after(sizes: np.ndarray, segments: Sequence[Sequence[int]], split: np.ndarray | None = None) -> int:
    """Samples left in the epoch after ``segments`` (``split``: as for :func:`replay`)."""
    return int(sizes.sum() - replay(sizes, segments, split).done.sum())


def make_state(settings: dict, epoch: int, segments: Sequence[Segment]) -> dict:
    """A JSON-able resume state: the settings it holds for, the epoch and the segments consumed in it."""
    return {"version": STATE_VERSION, **settings, "epoch": int(epoch), "consumed": [list(s) for s in segments]}


def read_state(state: dict, settings: dict) -> tuple[int, list[Segment]]:
    """The epoch and segments of a :func:`make_state` state, checked against the current ``settings``.

    ``ValueError`` if it is not such a state or was made for other data or settings.
    """
    if isinstance(state, dict) and isinstance(state.get("version"), int) and "consumed" in state \
            and state["version"] < STATE_VERSION:
        raise ValueError(
            f"cannot resume: this state was saved by an older loader (state version {state['version']}, now "
            f"{STATE_VERSION}) whose epochs were ordered otherwise; its position does not apply to this loader's "
            "order. Start the epoch afresh (set_epoch) or finish it with the older version."
        )
    if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
        raise ValueError(f"not an MLMDataset state (version {STATE_VERSION}): {state!r:.200}")
    wrong = [f"{k}: saved {state.get(k)!r}, now {v!r}" for k, v in settings.items() if state.get(k) != v]
    if wrong:
        raise ValueError("cannot resume: the state belongs to other data or settings:\n  " + "\n  ".join(wrong))
    segments = []
    for seg in state["consumed"]:
        if len(seg) != 3 or min(seg) < 1:
            raise ValueError(f"bad consumed segment {seg!r} (want [num_workers, batch_size, batches])")
        segments.append(tuple(int(x) for x in seg))
    return int(state["epoch"]), segments
