"""Streaming, resumable, DDP- and worker-aware reading of a prepared output.

The order of one epoch, in four steps (all pure functions of the manifest, ``seed``, ``epoch`` and
``world_size``; never of the worker count, the machine or timing):

1. **Shards.** The manifest's shards, permuted by ``(seed, epoch)`` when ``shuffle``. Their
   instances concatenated in that order form the epoch's *stream* of ``N`` positions.
2. **Ranks.** Rank ``r`` of ``R`` owns the contiguous stream slice ``[a_r, a_r + n_r)`` with
   ``n_r = N // R + (r < N % R)``: every instance goes to exactly one rank, none is dropped or
   repeated, and rank sizes differ by at most one. With ``pad_ranks=True`` the shorter ranks get
   one extra *padding* sample (a copy of the stream's next instance, ``weight`` 0, no labels), so
   every rank has ``ceil(N / R)`` samples and, for equal ``num_workers`` and ``batch_size``, the
   same number of batches (what DDP needs to keep its collectives in step).
3. **Windows.** A rank's slice is cut into windows of ``shuffle_buffer`` consecutive samples (the
   last one shorter). A window is read (only the row groups / records it covers) and emitted in
   a random order drawn from ``(seed, epoch, window start)``. Memory is one window per worker.
4. **Workers.** The windows still to read are split into ``num_workers`` contiguous runs, balanced
   by sample count. Each DataLoader worker reads only its run; the DataLoader interleaves the
   workers' batches round robin (skipping exhausted workers), which is deterministic.

So the *set* of samples of a rank and the content and order of each window never depend on the
worker count; the interleaving of windows does. Dynamic masks come from each sample's ``index``
(its position in the manifest), so they do not depend on any of this either.

Resumption. A position inside an epoch is recorded as the list of ``(num_workers, batch_size,
batches)`` segments consumed so far (see :meth:`MLMDataset.state_dict`). Replaying them (pure
arithmetic on window sizes, no data read) gives, for each window, how many of its samples were
already emitted; a resumed iteration reads only the rest. The state names no rank: in DDP, every
rank consumes the same number of batches, so rank 0's checkpoint restores every rank. It can be
loaded with another ``num_workers`` or ``batch_size`` (every remaining sample is still seen once);
with the same ones the remaining sequence is identical to the uninterrupted run. The world size,
seed, shuffle settings and shards must match (``ValueError`` otherwise).
"""

from __future__ import annotations

import hashlib
import itertools
import json
import math
import os
import struct
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from mlm_pipeline import fs
from mlm_pipeline.instances.batch import InstanceBatch

STATE_VERSION = 1
_PARQUET_COLUMNS = ["input_ids", "segment_ids", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"]


# --------------------------------------------------------------------------------------------
# The prepared output


@dataclass(frozen=True)
class ShardEntry:
    url: str
    instances: int

    @property
    def fmt(self) -> str:
        if self.url.endswith(".parquet"):
            return "parquet"
        if self.url.endswith(".tfrecord"):
            return "tfrecord"
        raise ValueError(f"{self.url}: not a .parquet or .tfrecord shard")


@dataclass(frozen=True)
class PreparedOutput:
    """What the loader needs from ``OUTPUT/manifest.json``."""

    url: str
    shards: tuple[ShardEntry, ...]
    objective: str  # "nsp" | "packed" | "tokens"
    masking: str  # "static" | "none"
    config: dict
    tokenizer_fingerprint: str | None = None

    @property
    def has_nsp(self) -> bool:
        return self.objective == "nsp"

    @property
    def is_masked(self) -> bool:
        return self.masking == "static"

    @property
    def total(self) -> int:
        return sum(s.instances for s in self.shards)

    @property
    def max_seq_length(self) -> int | None:
        return self.config.get("max_seq_length")

    def fingerprint(self) -> str:
        """sha256 of the shard list (paths and counts): a state only applies to the same shards."""
        blob = json.dumps([[s.url.rsplit("/", 2)[-2:], s.instances] for s in self.shards]).encode()
        return hashlib.sha256(blob).hexdigest()

    def tokenizer(self, path: str | None = None, do_lower_case: bool | None = None):
        """The tokenizer recorded in the manifest (or ``path``), loaded with ``load_tokenizer``.

        ``ValueError`` if it is not the tokenizer that prepared the shards (the manifest's
        fingerprint of its vocabulary and settings differs).
        """
        from mlm_pipeline.tokenize import load_tokenizer

        recorded = self.config.get("tokenizer")
        if not (path or recorded):
            raise ValueError(f"{self.url}: the manifest names no tokenizer; pass one explicitly")
        if not path and not os.path.exists(recorded):
            raise ValueError(
                f"the tokenizer recorded in {self.url}/manifest.json, {recorded!r}, is not found from "
                f"{os.getcwd()} (a relative path is relative to where prepare ran): pass the tokenizer explicitly"
            )
        lower = self.config.get("do_lower_case", True) if do_lower_case is None else do_lower_case
        tok = load_tokenizer(str(path or recorded), bool(lower))
        if self.tokenizer_fingerprint and tok.fingerprint != self.tokenizer_fingerprint:
            raise ValueError(
                f"tokenizer {path or recorded} (do_lower_case={bool(lower)}) is not the one that prepared "
                f"{self.url}: its fingerprint differs from the manifest's"
            )
        return tok


def load_prepared(url: str) -> PreparedOutput:
    """Read ``url/manifest.json`` (local path or fsspec URL such as ``s3://bucket/out``)."""
    manifest_url = fs.join(url, "manifest.json")
    try:
        manifest = json.loads(fs.read_bytes(manifest_url))
    except FileNotFoundError:
        raise ValueError(f"no manifest.json in {url}: not a prepared output, or its run is not complete") from None
    except json.JSONDecodeError as exc:
        raise ValueError(f"cannot parse {manifest_url}: {exc}") from exc
    shards = []
    for entry in manifest.get("shards", []):
        path = entry["path"]
        shard_url = path if "://" in path or path.startswith("/") else fs.join(url, path)
        shards.append(ShardEntry(url=shard_url, instances=int(entry["instances"])))
    for s in shards:
        s.fmt  # noqa: B018 — validates the extension up front
    objective = manifest.get("objective", "nsp")
    masking = manifest.get("masking", "static")
    if objective not in ("nsp", "packed", "tokens"):
        raise ValueError(f"{manifest_url}: unknown objective {objective!r}")
    if masking not in ("static", "none"):
        raise ValueError(f"{manifest_url}: unknown masking {masking!r}")
    return PreparedOutput(url=url, shards=tuple(shards), objective=objective, masking=masking,
                          config=dict(manifest.get("config", {})),
                          tokenizer_fingerprint=manifest.get("tokenizer_fingerprint"))


# --------------------------------------------------------------------------------------------
# Reading row ranges of shards


class _ShardReader:
    """Reads rows ``[start, stop)`` of shards, keeping the last shard open.

    Parquet: only the row groups that overlap the range are read. TFRecord: records before the
    range are skipped by their length headers (data not read when the file can seek); reading
    on from where the previous range ended needs no skip at all.
    """

    def __init__(self) -> None:
        self._url: str | None = None
        self._file = None
        self._parquet = None
        self._rg_offsets: np.ndarray | None = None
        self._next_record = 0

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
        self._url = self._file = self._parquet = self._rg_offsets = None
        self._next_record = 0

    def _open(self, url: str) -> None:
        self.close()
        self._file = fs.open_url(url, "rb")
        self._url = url

    def read(self, shard: ShardEntry, start: int, stop: int) -> InstanceBatch:
        if stop <= start:
            return InstanceBatch.empty()
        if shard.fmt == "parquet":
            batch = self._read_parquet(shard.url, start, stop)
        else:
            batch = self._read_tfrecord(shard.url, start, stop)
        if len(batch) != stop - start:
            raise ValueError(
                f"{shard.url}: expected rows {start}..{stop} but read {len(batch)} "
                f"(the manifest says {shard.instances} instances; was the shard changed?)"
            )
        return batch

    def _read_parquet(self, url: str, start: int, stop: int) -> InstanceBatch:
        import pyarrow.parquet as pq

        from mlm_pipeline.write.parquet import table_to_batch

        if url != self._url:
            self._open(url)
            self._parquet = pq.ParquetFile(self._file)
            meta = self._parquet.metadata
            counts = [meta.row_group(i).num_rows for i in range(meta.num_row_groups)]
            self._rg_offsets = np.concatenate([[0], np.cumsum(counts, dtype=np.int64)])
        offs = self._rg_offsets
        if stop > offs[-1]:
            raise ValueError(f"{url}: has {int(offs[-1])} rows, rows up to {stop} requested (manifest out of date?)")
        first = int(np.searchsorted(offs, start, side="right") - 1)
        last = int(np.searchsorted(offs, stop, side="left"))
        table = self._parquet.read_row_groups(list(range(first, last)), columns=_PARQUET_COLUMNS)
        table = table.slice(start - int(offs[first]), stop - start)
        return table_to_batch(table)

    def _read_tfrecord(self, url: str, start: int, stop: int) -> InstanceBatch:
        from mlm_pipeline.write.tfrecord import _features_from_buffer, iter_tfrecord_records

        if url != self._url or start < self._next_record:
            self._open(url)
        f = self._file
        while self._next_record < start:  # skip by headers
            header = f.read(12)
            if len(header) < 12:
                raise ValueError(f"{url}: ends after {self._next_record} records, record {start} requested")
            (length,) = struct.unpack("<Q", header[:8])
            f.seek(length + 4, 1)
            self._next_record += 1
        records = list(itertools.islice(iter_tfrecord_records(f), stop - start))
        self._next_record += len(records)
        if len(records) < stop - start:
            raise ValueError(f"{url}: ends after {self._next_record} records, rows up to {stop} requested")
        lengths = np.fromiter((len(r) for r in records), dtype=np.int64, count=len(records))
        ends = np.cumsum(lengths)
        features = _features_from_buffer(b"".join(records), (ends - lengths).tolist(), ends.tolist())
        return InstanceBatch.from_padded(features)


# --------------------------------------------------------------------------------------------
# The epoch plan: pure arithmetic, shared by the workers (to read) and the main process (to
# count batches and replay a resume state)


@dataclass(frozen=True)
class _RankPlan:
    order: np.ndarray  # shard indices in stream order
    stream_starts: np.ndarray  # [S + 1] stream position where each (ordered) shard starts
    total: int  # N
    start: int  # a_r
    real: int  # n_r: real samples of this rank
    length: int  # samples this rank emits (n_r, or ceil(N / R) with pad_ranks)
    window: int

    @property
    def window_sizes(self) -> np.ndarray:
        n = math.ceil(self.length / self.window) if self.length else 0
        sizes = np.full(n, self.window, dtype=np.int64)
        if n:
            sizes[-1] = self.length - (n - 1) * self.window
        return sizes


def _rng(*key: int) -> np.random.Generator:
    return np.random.default_rng(np.random.SeedSequence([int(k) for k in key]))


_SHARD_STREAM, _WINDOW_STREAM = 1, 2


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


def _balanced_runs(remaining: np.ndarray, workers: int) -> list[np.ndarray]:
    """Windows with samples left, cut into ``workers`` contiguous runs balanced by samples left."""
    live = np.flatnonzero(remaining > 0)
    return [live[idx] for idx in _split_contiguous(remaining[live], workers)]


@dataclass
class _Schedule:
    """Where an epoch stands: samples emitted per window, and each worker's windows."""

    done: np.ndarray  # samples already emitted, per window
    runs: list[np.ndarray] | None  # windows of each worker of the last segment, in resume order
    workers: int  # the worker count ``runs`` is for

    def runs_for(self, sizes: np.ndarray, workers: int) -> list[np.ndarray]:
        """Windows of each of ``workers`` for the rest of the epoch.

        With the worker count of the last segment, every worker keeps its windows and the runs
        are rotated so that the worker the DataLoader would have asked next comes first: the
        rest of the epoch is then the same sequence as without the interruption. With another
        count, the windows left are split afresh.
        """
        remaining = sizes - self.done
        if self.runs is None or workers != self.workers:
            return _balanced_runs(remaining, workers)
        return [r[remaining[r] > 0] for r in self.runs]


def _replay(sizes: np.ndarray, segments: Sequence[Sequence[int]]) -> _Schedule:
    """Replay ``(workers, batch_size, batches)`` segments: pure arithmetic, no data read."""
    schedule = _Schedule(done=np.zeros(len(sizes), dtype=np.int64), runs=None, workers=0)
    for workers, batch_size, batches in segments:
        runs = schedule.runs_for(sizes, workers)
        remaining = sizes - schedule.done
        per_worker = [int(remaining[r].sum()) for r in runs]
        per_worker_batches = [-(-n // batch_size) for n in per_worker]
        taken = _round_robin(per_worker_batches, batches)
        for run, n, t in zip(runs, per_worker, taken):
            left = remaining[run]
            before = np.cumsum(left) - left
            schedule.done[run] += np.clip(min(t * batch_size, n) - before, 0, left)
        nxt = _next_worker(per_worker_batches, taken)
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


def _resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return (
            torch.distributed.get_rank() if rank is None else rank,
            torch.distributed.get_world_size() if world_size is None else world_size,
        )
    return (0 if rank is None else rank), (1 if world_size is None else world_size)


# --------------------------------------------------------------------------------------------
# The dataset


class MLMDataset(IterableDataset):
    """The instances of a prepared output, one dict per sample, each exactly once per epoch.

    Args:
        source: a prepared output directory or URL (``s3://…``, ``gs://…``), or a
            :class:`PreparedOutput`.
        shuffle: permute shards by ``(seed, epoch)`` and samples within windows.
        seed: non-negative int; with ``epoch`` it fixes the order (and, through the collator's
            own seed, nothing else).
        shuffle_buffer: samples per window: the shuffle span and the memory bound per worker.
        rank, world_size: default from ``torch.distributed`` when initialised, else 0 and 1.
        pad_ranks: give shorter ranks one padding sample so all ranks have equal length (DDP).

    A sample is a dict of numpy arrays and ints: ``input_ids`` (int32), ``token_type_ids``
    (int8), ``masked_lm_positions`` / ``masked_lm_ids`` (int32, empty for unmasked data),
    ``next_sentence_label`` (int, -1 without NSP), ``index`` (position in the manifest's shard
    order, stable across epochs), ``epoch`` and ``weight`` (1.0, or 0.0 for a padding sample).
    Batch them with :class:`mlm_pipeline.torch.MLMCollator`.
    """

    def __init__(
        self,
        source: str | PreparedOutput,
        *,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 10_000,
        rank: int | None = None,
        world_size: int | None = None,
        pad_ranks: bool = False,
    ):
        super().__init__()
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be a positive int, got {shuffle_buffer!r}")
        if world_size is not None and world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if rank is not None and (rank < 0 or (world_size is not None and rank >= world_size)):
            raise ValueError(f"rank must be in [0, world_size), got rank {rank}, world_size {world_size}")
        self.prepared = source if isinstance(source, PreparedOutput) else load_prepared(source)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.pad_ranks = bool(pad_ranks)
        self._rank = rank
        self._world_size = world_size
        self.epoch = 0
        self._segments: list[tuple[int, int, int]] = []  # the position in the epoch
        self._yielded = 0  # samples yielded by the latest in-process iteration (num_workers=0)
        self._finished = False  # ... and whether it ran to the end
        counts = np.array([s.instances for s in self.prepared.shards], dtype=np.int64)
        self._index_base = np.concatenate([[0], np.cumsum(counts)])

    # -- geometry ------------------------------------------------------------------------

    @property
    def rank(self) -> int:
        return _resolve_rank(self._rank, self._world_size)[0]

    @property
    def world_size(self) -> int:
        return _resolve_rank(self._rank, self._world_size)[1]

    @property
    def total(self) -> int:
        """Instances in the output (all ranks)."""
        return int(self._index_base[-1])

    def _plan(self, epoch: int | None = None) -> _RankPlan:
        epoch = self.epoch if epoch is None else epoch
        rank, world = _resolve_rank(self._rank, self._world_size)
        if rank >= world:
            raise ValueError(f"rank {rank} is not below world_size {world}")
        counts = np.diff(self._index_base)
        order = np.arange(len(counts))
        if self.shuffle and len(counts):
            order = _rng(self.seed, epoch, _SHARD_STREAM).permutation(len(counts))
        stream_starts = np.concatenate([[0], np.cumsum(counts[order])])
        n = int(stream_starts[-1])
        q, extra = divmod(n, world)
        real = q + (rank < extra)
        length = (q + (extra > 0)) if (self.pad_ranks and n) else real
        return _RankPlan(order=order, stream_starts=stream_starts, total=n, start=rank * q + min(rank, extra),
                         real=real, length=length, window=self.shuffle_buffer)

    def _schedule(self, plan: _RankPlan) -> _Schedule:
        return _replay(plan.window_sizes, self._segments)

    def _runs(self, workers: int) -> tuple[_RankPlan, np.ndarray, list[np.ndarray]]:
        """The plan, samples left per window and each worker's windows for the rest of the epoch."""
        plan = self._plan()
        sizes = plan.window_sizes
        schedule = self._schedule(plan)
        return plan, sizes - schedule.done, schedule.runs_for(sizes, workers)

    def __len__(self) -> int:
        """Samples an iteration from the recorded position emits on this rank (all at epoch start)."""
        return int(self._runs(1)[1].sum())

    def num_batches(self, batch_size: int, num_workers: int = 0) -> int:
        """Batches a DataLoader with these settings yields for the rest of the epoch on this rank.

        Each worker batches its own samples, so up to ``num_workers`` batches per epoch are short.
        """
        _, remaining, runs = self._runs(max(1, num_workers))
        return sum(-(-int(remaining[r].sum()) // batch_size) for r in runs)

    def num_batches_of_epoch(self, batch_size: int, num_workers: int = 0) -> int:
        """Batches of a whole epoch on this rank (the same for every epoch)."""
        sizes = self._plan().window_sizes
        runs = _balanced_runs(sizes, max(1, num_workers))
        return sum(-(-int(sizes[r].sum()) // batch_size) for r in runs)

    # -- epochs and state ----------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (call before creating the DataLoader iterator)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)
        self._segments = []
        self._yielded = 0
        self._finished = False

    def _settings(self) -> dict:
        return {
            "fingerprint": self.prepared.fingerprint(),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "pad_ranks": self.pad_ranks,
            "world_size": self.world_size,
        }

    def state_dict(self, *, batches: int | None = None, batch_size: int | None = None,
                   num_workers: int = 0) -> dict:
        """The position in the epoch, as a small JSON-able dict.

        Iterating the dataset always starts from its recorded position (epoch start, or what
        :meth:`load_state_dict` set); it never moves that position itself. This returns the
        position after what the training loop consumed since. Without arguments: what the latest
        in-process iteration (``num_workers=0``) has yielded. With workers, the dataset copies live in the worker processes, so say what the training
        loop consumed: ``batches`` of ``batch_size`` from a DataLoader with ``num_workers``
        (:class:`MLMDataLoader` does this for you).
        """
        segments = list(self._segments)
        finished = self._finished and batches is None
        if batches is not None:
            if batch_size is None or batch_size < 1:
                raise ValueError("state_dict(batches=...) needs batch_size >= 1")
            if batches < 0:
                raise ValueError(f"batches must be >= 0, got {batches}")
            if batches:
                segments.append((max(1, int(num_workers)), int(batch_size), int(batches)))
        elif self._yielded:
            segments.append((1, 1, self._yielded))
        if not finished and segments:
            finished = self._remaining_after(segments) == 0
        state = {"version": STATE_VERSION, **self._settings()}
        if finished:
            state.update(epoch=self.epoch + 1, consumed=[])
        else:
            state.update(epoch=self.epoch, consumed=[list(s) for s in segments])
        return state

    def _remaining_after(self, segments) -> int:
        sizes = self._plan().window_sizes
        return int((sizes - _replay(sizes, segments).done).sum())

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` (of this rank or, in DDP, of any rank)."""
        if not isinstance(state, dict) or state.get("version") != STATE_VERSION:
            raise ValueError(f"not an MLMDataset state (version {STATE_VERSION}): {state!r:.200}")
        mine = self._settings()
        wrong = [f"{k}: saved {state.get(k)!r}, now {v!r}" for k, v in mine.items() if state.get(k) != v]
        if wrong:
            raise ValueError("cannot resume: the state belongs to other data or settings:\n  " + "\n  ".join(wrong))
        segments = []
        for seg in state["consumed"]:
            if len(seg) != 3 or min(seg) < 1:
                raise ValueError(f"bad consumed segment {seg!r} (want [num_workers, batch_size, batches])")
            segments.append(tuple(int(x) for x in seg))
        self.set_epoch(int(state["epoch"]))
        self._segments = segments

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        worker, workers = (0, 1) if info is None else (info.id, info.num_workers)
        plan, remaining, runs = self._runs(workers)
        mine = runs[worker]
        sizes = plan.window_sizes
        in_process = info is None
        if in_process:
            self._yielded, self._finished = 0, False
        reader = _ShardReader()
        try:
            for w in mine:
                window_start = int(w) * plan.window
                size = int(sizes[w])
                batch, index, weight = self._read_window(plan, window_start, size, reader)
                order = np.arange(size)
                if self.shuffle:
                    order = _rng(self.seed, self.epoch, _WINDOW_STREAM, plan.start + window_start).permutation(size)
                for k in order[size - int(remaining[w]):].tolist():
                    if in_process:
                        self._yielded += 1
                    yield self._sample(batch, k, int(index[k]), float(weight[k]))
        finally:
            reader.close()
        if in_process:
            self._finished = True

    def _read_window(self, plan: _RankPlan, window_start: int, size: int, reader: _ShardReader):
        """The window's rows (stream order), their manifest indices and weights."""
        j = np.arange(window_start, window_start + size, dtype=np.int64)
        g = (plan.start + j) % max(plan.total, 1)
        slot = np.searchsorted(plan.stream_starts, g, side="right") - 1
        row = g - plan.stream_starts[slot]
        breaks = np.flatnonzero((slot[1:] != slot[:-1]) | (row[1:] != row[:-1] + 1)) + 1
        pieces = []
        for a, b in zip(np.concatenate([[0], breaks]), np.concatenate([breaks, [size]])):
            shard = self.prepared.shards[int(plan.order[slot[a]])]
            pieces.append(reader.read(shard, int(row[a]), int(row[a]) + int(b - a)))
        batch = InstanceBatch.concat(pieces) if len(pieces) > 1 else pieces[0]
        index = self._index_base[plan.order[slot]] + row
        weight = (j < plan.real).astype(np.float32)
        return batch, index, weight

    def _sample(self, batch: InstanceBatch, k: int, index: int, weight: float) -> dict:
        s, e = batch.offsets[k], batch.offsets[k + 1]
        ms, me = batch.masked_offsets[k], batch.masked_offsets[k + 1]
        nsp = -1
        if self.prepared.has_nsp and batch.next_sentence_labels is not None:
            nsp = int(batch.next_sentence_labels[k])
        return {
            "input_ids": batch.input_ids[s:e],
            "token_type_ids": batch.segment_ids[s:e],
            "masked_lm_positions": batch.masked_lm_positions[ms:me],
            "masked_lm_ids": batch.masked_lm_ids[ms:me],
            "next_sentence_label": nsp,
            "index": index,
            "epoch": self.epoch,
            "weight": weight,
        }

    def collator(self, *, masking: str = "auto", tokenizer=None, **kwargs):
        """An :class:`MLMCollator` matching this output (tokenizer, NSP, static masks or not).

        ``masking="auto"`` uses the shards' static masks when they have them, else masks
        dynamically. Other keyword arguments go to :class:`MLMCollator`.
        """
        from mlm_pipeline.torch.collator import MLMCollator

        if masking == "auto":
            masking = "static" if self.prepared.is_masked else "dynamic"
        if masking == "static" and not self.prepared.is_masked:
            raise ValueError(f"{self.prepared.url} was prepared without masks (masking: none): use masking='dynamic'")
        tok = tokenizer if tokenizer is not None and not isinstance(tokenizer, str) else self.prepared.tokenizer(tokenizer)
        kwargs.setdefault("nsp", self.prepared.has_nsp)
        return MLMCollator(tok, masking=masking, **kwargs)


# --------------------------------------------------------------------------------------------
# The loader: a DataLoader that knows how far the training loop got


class MLMDataLoader:
    """A ``torch.utils.data.DataLoader`` over an :class:`MLMDataset` with exact resume state.

    It counts the batches it hands out, so :meth:`state_dict` is the position of the training
    loop, with or without worker processes; PyTorch Lightning saves and restores it in its
    checkpoints (it has ``state_dict``/``load_state_dict`` and an exact ``len``, so Lightning
    does not prefetch past the step being checkpointed).

    Iterating again after a partial pass continues the same epoch; after a full pass, the next
    epoch starts (``dataset.epoch`` + 1). Workers are never persistent (each pass sends the
    workers the current epoch and position) and ``drop_last`` is not offered: no sample is lost.
    Each worker batches its own samples, so an epoch ends with up to ``num_workers`` short
    batches; ``len(loader)`` counts them exactly.
    """

    def __init__(
        self,
        dataset: MLMDataset,
        *,
        batch_size: int,
        collate_fn,
        num_workers: int = 0,
        pin_memory: bool = False,
        prefetch_factor: int | None = None,
        timeout: float = 0,
        multiprocessing_context=None,
        worker_init_fn=None,
    ):
        if not isinstance(dataset, MLMDataset):
            raise ValueError(f"MLMDataLoader needs an MLMDataset, got {type(dataset).__name__}")
        if not isinstance(batch_size, int) or batch_size < 1:
            raise ValueError(f"batch_size must be a positive int, got {batch_size!r}")
        if num_workers < 0:
            raise ValueError(f"num_workers must be >= 0, got {num_workers}")
        self.dataset = dataset
        self.batch_size = batch_size
        self.collate_fn = collate_fn
        self.num_workers = num_workers
        self._loader_kwargs = {
            "pin_memory": pin_memory,
            "timeout": timeout,
            "multiprocessing_context": multiprocessing_context,
            "worker_init_fn": worker_init_fn,
        }
        if num_workers and prefetch_factor is not None:
            self._loader_kwargs["prefetch_factor"] = prefetch_factor
        self._consumed = 0  # batches handed out by the current pass
        self._pass_length: int | None = None  # batches of the current pass
        self._active = False
        self._finished = False  # the current pass ran to its end
        self._pass = 0  # invalidates iterators of earlier passes

    @property
    def _segment(self) -> tuple[int, int, int] | None:
        return (max(1, self.num_workers), self.batch_size, self._consumed) if self._consumed else None

    def _close_pass(self) -> None:
        """Fold the current pass into the dataset's position (the next epoch if it is complete)."""
        ds = self.dataset
        if self._consumed:
            ds._segments.append(self._segment)
        complete = self._finished or (self._consumed and ds._remaining_after(ds._segments) == 0)
        ds._yielded = 0
        ds._finished = False
        if complete:
            ds.set_epoch(ds.epoch + 1)
        self._consumed = 0
        self._pass_length = None
        self._active = False
        self._finished = False
        self._pass += 1

    def __iter__(self):
        self._close_pass()
        self._pass_length = self.dataset.num_batches(self.batch_size, self.num_workers)
        self._active = True
        loader = torch.utils.data.DataLoader(
            self.dataset,
            batch_size=self.batch_size,
            collate_fn=self.collate_fn,
            num_workers=self.num_workers,
            persistent_workers=False,
            drop_last=False,
            **self._loader_kwargs,
        )
        return _CountingIterator(self, iter(loader), self._pass)

    def __len__(self) -> int:
        """Batches of the current pass (or of the next one, if none is under way)."""
        if self._active:
            return self._pass_length
        ds = self.dataset
        if self._finished:
            return ds.num_batches_of_epoch(self.batch_size, self.num_workers)
        return ds.num_batches(self.batch_size, self.num_workers)

    def state_dict(self) -> dict:
        """Position after the batches handed out so far (see :meth:`MLMDataset.state_dict`)."""
        ds = self.dataset
        if self._finished:
            state = ds.state_dict(batches=0, batch_size=self.batch_size)
            state.update(epoch=ds.epoch + 1, consumed=[])
            return state
        seg = self._segment
        if seg is None:
            return ds.state_dict(batches=0, batch_size=self.batch_size)
        return ds.state_dict(batches=seg[2], batch_size=seg[1], num_workers=seg[0])

    def load_state_dict(self, state: dict) -> None:
        self.dataset.load_state_dict(state)
        self._consumed = 0
        self._pass_length = None
        self._active = False
        self._finished = False
        self._pass += 1


class _CountingIterator:
    def __init__(self, owner: MLMDataLoader, inner, pass_id: int):
        self._owner = owner
        self._inner = inner
        self._pass_id = pass_id

    def __iter__(self):
        return self

    def __len__(self) -> int:
        return self._owner._pass_length or 0

    def __next__(self):
        owner = self._owner
        if owner._pass != self._pass_id:
            raise RuntimeError("this iterator is stale: the loader started a new pass or loaded a state")
        try:
            batch = next(self._inner)
        except StopIteration:
            owner._finished = True
            owner._active = False
            raise
        owner._consumed += 1
        return batch
