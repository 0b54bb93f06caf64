"""Streaming, resumable, DDP- and worker-aware reading of a prepared output: :class:`MLMDataset`.

The dataset composes the other pieces: :mod:`.manifest` says what the output holds and reads
its shards' layouts and rows (with the reader of the manifest's format), :mod:`.epoch_plan` says
which samples this rank and each DataLoader worker emit in which order, and where a resume starts.
What is left here is the position in the epoch (epoch number, segments consumed), iteration and
the sample dicts. :class:`~mlm_pipeline.torch.loader.MLMDataLoader` moves the position through
:meth:`MLMDataset.advance`.
"""

from __future__ import annotations

import hashlib
import json
from typing import Iterator, Sequence

import numpy as np
import torch
from torch.utils.data import IterableDataset, get_worker_info

from mlm_pipeline.formats import ShardLayout
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.torch.epoch_plan import (
    RankPlan,
    Segment,
    balanced_runs,
    count_batches,
    length_bins as length_bins_of,
    make_state,
    plan_rank,
    read_state,
    remaining_after,
    replay,
)
from mlm_pipeline.torch.manifest import PreparedOutput, ShardRowReader, load_prepared, read_layouts
from mlm_pipeline.torch.stream import EpochStream, epoch_stream, mix_counts

__all__ = ["MLMDataset", "language_weights"]


def _resolve_rank(rank: int | None, world_size: int | None) -> tuple[int, int]:
    if rank is not None and world_size is not None:
        return rank, world_size
    if torch.distributed.is_available() and torch.distributed.is_initialized():
        return (
            torch.distributed.get_rank() if rank is None else rank,
            torch.distributed.get_world_size() if world_size is None else world_size,
        )
    return (0 if rank is None else rank), (1 if world_size is None else world_size)


def _check_compatible(sources: list[PreparedOutput]) -> None:
    """Mixed sources must batch alike: one objective, one masking, one tokenizer."""
    first = sources[0]
    for other in sources[1:]:
        for what in ("objective", "masking", "tokenizer_fingerprint"):
            if getattr(other, what) != getattr(first, what):
                raise ValueError(f"cannot mix {first.url} and {other.url}: their {what} differs "
                                 f"({getattr(first, what)!r} and {getattr(other, what)!r})")


def language_weights(sources: Sequence[PreparedOutput], alpha: float) -> tuple[list[float], int]:
    """Each source's weight (in instances) that gives each language its share ``q_i ∝ p_i^α`` of
    the tokens, and the epoch's instances that keep the sources' tokens in total.

    ``p_i`` comes from the manifests' ``instance_tokens`` of each language; a source must hold one
    language. Source ``s`` of language ``L`` is to give ``q_L · T · T_s / T_L`` tokens (``T``
    all tokens, ``T_L`` its language's), so ``q_L · T · n_s / T_L`` of its ``n_s`` instances.
    """
    from mlm_pipeline.languages import target_shares

    if not (isinstance(alpha, (int, float)) and 0 < alpha <= 1):
        raise ValueError(f"language_alpha must be in (0, 1], got {alpha!r}")
    per_source = []
    for p in sources:
        if not p.languages or len(p.languages) != 1:
            what = "no language (prepared without --language)" if not p.languages else \
                f"{len(p.languages)} languages ({', '.join(sorted(p.languages))})"
            raise ValueError(f"language_alpha mixes outputs of one language each; {p.url} has {what}")
        ((code, counts),) = p.languages.items()
        per_source.append((code, int(counts.get("instance_tokens", 0)), int(counts.get("instances", 0))))
    by_language: dict[str, int] = {}
    for code, tokens, _ in per_source:
        by_language[code] = by_language.get(code, 0) + tokens
    q = target_shares(by_language, float(alpha))
    total = sum(by_language.values())
    wanted = [q[code] * total * n / by_language[code] if by_language[code] else 0.0 for code, _, n in per_source]
    return wanted, int(round(sum(wanted)))


def _raise(error: Exception) -> Iterator[dict]:
    raise error
    yield  # (a generator: the error comes with the first item)


class MLMDataset(IterableDataset):
    """The instances of one or more prepared outputs, one dict per sample, each exactly once per epoch.

    Args:
        source: a prepared output directory or URL (``s3://…``, ``gs://…``), or a
            :class:`PreparedOutput`; or a list of them, to mix (``weights``).
        weights: one non-negative weight per source: each epoch takes each source's share of its
            samples, exact to one sample (see :func:`mlm_pipeline.torch.stream.mix_counts`).
            Without ``samples_per_epoch``, an epoch is as long as it can be without repeating any
            instance; the other sources' instances are taken in turn over the epochs. Without
            weights, every instance of every source, once per epoch.
        samples_per_epoch: with ``weights``, the epoch's length; a source whose share exceeds its
            size is upsampled: its instances repeat, each ``floor`` or ``ceil`` of share / size
            times per epoch, deterministically.
        shuffle: permute and interleave shards by ``(seed, epoch)`` and shuffle samples within
            windows; ``False`` reads the sources' shards in manifest order.
        seed: non-negative int; with ``epoch`` it fixes the order (and, through the collator's
            own seed, nothing else).
        shuffle_buffer: samples per window: the shuffle span and the memory bound per worker.
        interleave: shards (pieces of shards, with mixing) read side by side: a window holds rows
            of up to this many shards, in proportion to their sizes, as whole row groups where a
            row group holds at most its shard's share of a window (``shuffle_buffer /
            interleave`` rows for equal shards): each is then read once per epoch. Also the
            number of shards a worker keeps open.
        rank, world_size: default from ``torch.distributed`` when initialised, else 0 and 1.
        pad_ranks: give shorter ranks one padding sample so all ranks have equal length (DDP).
        length_bins: group each window into batches of one length bin: ``n`` equal bins up to
            the output's ``max_seq_length``, or a list of upper bounds; the ``k``-th batch of
            every rank is of the same bin (see :func:`~mlm_pipeline.torch.epoch_plan.binned_order`
            for the samples moved up a bin). Needs ``bin_batch_size``, the loader's batch size,
            which must divide ``shuffle_buffer``, and the lengths of all instances, which every
            rank reads before its first epoch (Parquet: about 1% of the shards; other formats:
            all of them). Pad with the collator's ``pad_to_multiple_of=8``.
        language_alpha: mix the sources' languages by ``q_i ∝ p_i^α`` (XLM-R: 0.3), ``p_i`` each
            language's share of the sources' instance tokens (their manifests' counts): each
            source holds one language (prepared with ``--language``) and gets the weight that
            gives its language the token share ``q_i`` (several sources of one language share it
            by their tokens); the epoch keeps the sources' tokens (``samples_per_epoch`` by
            default: the instances that hold them). The rule of ``prepare --language-alpha``,
            at load time (:func:`language_weights`). Not with ``weights``.
        verify: how each shard is checked against the manifest when a process first opens it:
            ``sha256`` (reads it once more), ``size`` (one metadata request) or ``none``. A shard
            that differs raises :class:`~mlm_pipeline.errors.ShardDamaged` naming it.

    A sample is a dict of numpy arrays and ints: ``input_ids`` (int32), ``token_type_ids``
    (int8), ``masked_lm_positions`` / ``masked_lm_ids`` (int32, empty for unmasked data),
    ``next_sentence_label`` (int, -1 without NSP), ``index`` (position in the sources' shards in
    manifest order, concatenated; stable across epochs), ``source`` (number of its source),
    ``epoch``, ``weight`` (1.0, or 0.0 for a padding sample) and ``bin`` (the length bin of the
    batch it is emitted in, numbered from 0; -1 without length bins); for ``sop`` shards also
    ``token_boundary`` (int8, ALBERT's feature: 1 where a word starts); for ``packed`` shards
    ``document_starts`` (int32, where each document of the row starts, 0 first: the collator's
    ``attention`` keeps them apart); for outputs prepared with languages also ``language`` (its
    code); for outputs prepared with ``--id-field`` / ``--metadata-field``, ``document_ids`` /
    ``document_metadata`` (lists of str: the input records the row's tokens come from). ``next_sentence_label``
    is the pair label of any objective (for ``sop``, the sentence-order label).
    Batch them with :class:`mlm_pipeline.torch.MLMCollator`.
    """

    def __init__(
        self,
        source: str | PreparedOutput | Sequence[str | PreparedOutput],
        *,
        weights: Sequence[float] | None = None,
        samples_per_epoch: int | None = None,
        shuffle: bool = True,
        seed: int = 0,
        shuffle_buffer: int = 10_000,
        interleave: int = 128,
        rank: int | None = None,
        world_size: int | None = None,
        pad_ranks: bool = False,
        length_bins: int | Sequence[int] | None = None,
        bin_batch_size: int | None = None,
        verify: str = "sha256",
        language_alpha: float | None = None,
    ):
        super().__init__()
        from mlm_pipeline.verify import CHECKS

        if verify not in CHECKS:
            raise ValueError(f"verify must be one of {', '.join(CHECKS)}, got {verify!r}")
        self.verify = verify
        if not isinstance(seed, int) or isinstance(seed, bool) or seed < 0:
            raise ValueError(f"seed must be a non-negative int, got {seed!r}")
        if not isinstance(shuffle_buffer, int) or shuffle_buffer < 1:
            raise ValueError(f"shuffle_buffer must be a positive int, got {shuffle_buffer!r}")
        if world_size is not None and world_size < 1:
            raise ValueError(f"world_size must be >= 1, got {world_size}")
        if rank is not None and (rank < 0 or (world_size is not None and rank >= world_size)):
            raise ValueError(f"rank must be in [0, world_size), got rank {rank}, world_size {world_size}")
        if not isinstance(interleave, int) or interleave < 1:
            raise ValueError(f"interleave must be a positive int, got {interleave!r}")
        many = isinstance(source, (list, tuple))
        given = list(source) if many else [source]
        self.sources = [s if isinstance(s, PreparedOutput) else load_prepared(s) for s in given]
        if not self.sources:
            raise ValueError("no source given")
        _check_compatible(self.sources)
        self.prepared = self.sources[0]  # what the collator needs: the same for every source
        self.weights = None if weights is None else [float(w) for w in weights]
        self.language_alpha = language_alpha
        if language_alpha is not None:
            if weights is not None:
                raise ValueError("give weights or language_alpha, not both (language_alpha sets the weights)")
            self.weights, planned = language_weights(self.sources, language_alpha)
            samples_per_epoch = planned if samples_per_epoch is None else samples_per_epoch
        self.samples_per_epoch = samples_per_epoch
        self.interleave = interleave
        self._counts = [p.shard_counts for p in self.sources]
        self._source_starts = np.cumsum([0] + [int(c.sum()) for c in self._counts])
        self.bins = None
        if length_bins is not None:
            self.bins = length_bins_of(length_bins, max(p.max_seq_length or 0 for p in self.sources) or None)
            if not isinstance(bin_batch_size, int) or bin_batch_size < 1 or shuffle_buffer % bin_batch_size:
                raise ValueError(f"length_bins need bin_batch_size, the loader's batch size, dividing shuffle_buffer "
                                 f"({shuffle_buffer}); got {bin_batch_size!r}")
        elif bin_batch_size is not None:
            raise ValueError("bin_batch_size is only for length_bins")
        self.bin_batch_size = bin_batch_size if self.bins else None
        self.mix = mix_counts([int(c.sum()) for c in self._counts], self.weights, samples_per_epoch)
        self.shuffle = bool(shuffle)
        self.seed = seed
        self.shuffle_buffer = shuffle_buffer
        self.pad_ranks = bool(pad_ranks)
        self._rank = rank
        self._world_size = world_size
        self.epoch = 0
        self._layouts: list[ShardLayout] | None = None  # read once, by the process that plans
        self._lengths: np.ndarray | None = None  # with bins: every instance's length, by global index
        self._stream_cache: tuple[int, EpochStream] | None = None  # the latest epoch's stream
        self._segments: list[Segment] = []  # the position in the epoch
        self._yielded = 0  # samples yielded by the latest in-process iteration (num_workers=0)
        self._finished = False  # ... and whether it ran to the end
        self._worker_passes = 0  # passes this copy made in a DataLoader worker (more than one: a persistent worker)
        self.position_changes = 0  # set_epoch and load_state_dict calls: a loader's pass begun before one is void

    # -- geometry ------------------------------------------------------------------------

    def __getstate__(self) -> dict:
        """A copy for another process carries the rank and world size of this process's process
        group, if it has one: a DataLoader worker started by spawn or forkserver has none to ask,
        and would take itself for rank 0 of 1, reading the whole epoch on every rank. A copy made
        before a group exists (``mp.spawn(args=(dataset,))``) resolves them where it lands."""
        state = self.__dict__.copy()
        if torch.distributed.is_available() and torch.distributed.is_initialized():
            state["_rank"], state["_world_size"] = _resolve_rank(self._rank, self._world_size)
        return state

    @property
    def rank(self) -> int:
        return _resolve_rank(self._rank, self._world_size)[0]

    @property
    def world_size(self) -> int:
        return _resolve_rank(self._rank, self._world_size)[1]

    @property
    def total(self) -> int:
        """Samples in an epoch (all ranks): every instance, or the mix's total."""
        return int(self.mix.sum())

    def layouts(self) -> list[ShardLayout]:
        """Every shard's row groups (and with length bins its rows' lengths), global shard order.

        Read once, by the process that first plans (a training process, before its DataLoader
        starts workers, which get them with the dataset): Parquet footers, about 1% of small
        shards, and with bins the ``input_mask`` column, about 1% more.
        """
        if self._layouts is None:
            layouts = read_layouts(self.sources, lengths=self.bins is not None, verify=self.verify)
            if self.bins is not None:
                lengths = np.concatenate([lay.lengths for lay in layouts]) if layouts else np.zeros(0, np.int32)
                self._lengths = lengths.astype(np.uint16 if lengths.size == 0 or lengths.max() < 65536 else np.int32)
            self._layouts = layouts
        return self._layouts

    def stream(self, epoch: int | None = None) -> EpochStream:
        """The stream of ``epoch`` (default: the current one), before it is split over ranks."""
        epoch = self.epoch if epoch is None else epoch
        if self._stream_cache is not None and self._stream_cache[0] == epoch:
            return self._stream_cache[1]
        stream = epoch_stream(self._counts, seed=self.seed, epoch=epoch, shuffle=self.shuffle,
                              interleave=self.interleave, window=self.shuffle_buffer,
                              weights=self.weights, samples_per_epoch=self.samples_per_epoch,
                              row_groups=[lay.row_groups for lay in self.layouts()])
        self._stream_cache = (epoch, stream)
        return stream

    def plan(self, epoch: int | None = None) -> RankPlan:
        """This rank's plan of ``epoch`` (default: the current one)."""
        rank, world = _resolve_rank(self._rank, self._world_size)
        epoch = self.epoch if epoch is None else epoch
        stream = self.stream(epoch)  # (reads the layouts first)
        return plan_rank(stream, seed=self.seed, epoch=epoch, shuffle=self.shuffle, rank=rank,
                         world_size=world, pad_ranks=self.pad_ranks, window=self.shuffle_buffer,
                         bins=self.bins, bin_batch=self.bin_batch_size or 0, lengths=self._lengths)

    def _sizes(self) -> tuple[RankPlan, np.ndarray, np.ndarray]:
        """The plan, this rank's window sizes and the longest rank's (a shorter rank may have one
        window less: it is given size 0)."""
        plan = self.plan()
        split = plan.split_sizes
        sizes = np.zeros(len(split), np.int64)
        own = plan.window_sizes
        sizes[:len(own)] = own
        return plan, sizes, split

    def _runs(self, workers: int) -> tuple[RankPlan, np.ndarray, np.ndarray, list[np.ndarray]]:
        """The plan, window sizes, samples left per window and each worker's windows for the rest of the epoch."""
        plan, sizes, split = self._sizes()
        schedule = replay(sizes, self._segments, split)
        return plan, sizes, sizes - schedule.done, schedule.runs_for(sizes, split, workers)

    def _remaining_after(self, segments: list[Segment]) -> int:
        _, sizes, split = self._sizes()
        return remaining_after(sizes, segments, split)

    def __len__(self) -> int:
        """Samples an iteration from the recorded position emits on this rank (all at epoch start)."""
        return int(self._runs(1)[2].sum())

    def num_batches(self, batch_size: int, num_workers: int = 0) -> int:
        """Batches a DataLoader with these settings yields for the rest of the epoch on this rank.

        Each worker batches its own samples, so up to ``num_workers`` batches per epoch are short.
        """
        _, _, remaining, runs = self._runs(max(1, num_workers))
        return count_batches(remaining, runs, batch_size)

    def num_batches_of_epoch(self, batch_size: int, num_workers: int = 0) -> int:
        """Batches of a whole epoch on this rank (the same for every epoch)."""
        _, sizes, split = self._sizes()
        return count_batches(sizes, balanced_runs(split, max(1, num_workers)), batch_size)

    # -- epochs and state ----------------------------------------------------------------

    def set_epoch(self, epoch: int) -> None:
        """Start epoch ``epoch`` from its beginning (call before creating the DataLoader iterator)."""
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}")
        self.epoch = int(epoch)
        self.position_changes += 1
        self._segments = []
        self._worker_passes = 0  # (set in a worker's own copy: its next pass is a new one)
        self._yielded = 0
        self._finished = False

    def advance(self, *, batches: int, batch_size: int, num_workers: int = 0, epoch_complete: bool = False) -> None:
        """Move the recorded position past ``batches`` of ``batch_size`` that a DataLoader with
        ``num_workers`` handed out (what :class:`MLMDataLoader` does at the end of a pass).

        The next epoch starts when the epoch is complete: ``epoch_complete`` (the pass ran to its
        end) or nothing left after those batches. What the latest in-process iteration counted
        is dropped: the batches stand for it.
        """
        segments = list(self._segments)
        if batches:
            segments.append(self._segment(batches, batch_size, num_workers))
        complete = epoch_complete or (batches > 0 and self._remaining_after(segments) == 0)
        if complete:
            self.set_epoch(self.epoch + 1)
        else:
            self._segments = segments
            self._yielded, self._finished = 0, False

    @staticmethod
    def _segment(batches: int, batch_size: int | None, num_workers: int) -> Segment:
        if batch_size is None or batch_size < 1:
            raise ValueError("a position in batches needs batch_size >= 1")
        if batches < 0:
            raise ValueError(f"batches must be >= 0, got {batches}")
        return (max(1, int(num_workers)), int(batch_size), int(batches))

    def _fingerprint(self, *, contents: bool = True) -> str:
        if len(self.sources) == 1:
            return self.prepared.fingerprint(contents=contents)
        return hashlib.sha256(json.dumps([p.fingerprint(contents=contents) for p in self.sources]).encode()).hexdigest()

    def _settings(self) -> dict:
        return {
            "fingerprint": self._fingerprint(),
            "seed": self.seed,
            "shuffle": self.shuffle,
            "shuffle_buffer": self.shuffle_buffer,
            "interleave": self.interleave,
            "mix": {"weights": self.weights, "samples_per_epoch": self.samples_per_epoch,
                    "per_epoch": self.mix.tolist()},
            "pad_ranks": self.pad_ranks,
            "length_bins": None if self.bins is None else [list(self.bins), self.bin_batch_size],
            "world_size": self.world_size,
        }

    def state_dict(self, *, batches: int | None = None, batch_size: int | None = None,
                   num_workers: int = 0, epoch_complete: bool = False) -> dict:
        """The position in the epoch, as a small JSON-able dict.

        Iterating the dataset always starts from its recorded position (epoch start, or what
        :meth:`load_state_dict` set); it never moves that position itself. This returns the
        position after what the training loop consumed since. Without arguments: what the latest
        in-process iteration (``num_workers=0``) has yielded. With workers, the dataset copies
        live in the worker processes, so say what the training loop consumed: ``batches`` of
        ``batch_size`` from a DataLoader with ``num_workers`` (:class:`MLMDataLoader` does this
        for you), and ``epoch_complete`` when its pass ran to the end.
        """
        segments = list(self._segments)
        finished = epoch_complete or (self._finished and batches is None)
        if batches is not None:
            segment = self._segment(batches, batch_size, num_workers)
            if batches:
                segments.append(segment)
        elif self._yielded:
            segments.append((1, 1, self._yielded))
        if not finished and segments:
            finished = self._remaining_after(segments) == 0
        if finished:
            return make_state(self._settings(), self.epoch + 1, [])
        return make_state(self._settings(), self.epoch, segments)

    def load_state_dict(self, state: dict) -> None:
        """Continue from a :meth:`state_dict` (of this rank or, in DDP, of any rank)."""
        settings = self._settings()
        if isinstance(state, dict) and state.get("fingerprint") == self._fingerprint(contents=False):
            settings["fingerprint"] = state["fingerprint"]  # saved by an earlier loader: paths and counts only
        epoch, segments = read_state(state, settings)
        self.set_epoch(epoch)
        self._segments = segments

    # -- iteration -----------------------------------------------------------------------

    def __iter__(self) -> Iterator[dict]:
        info = get_worker_info()
        if info is None:
            return self._iterate(0, 1, in_process=True)
        self._worker_passes += 1
        if self._worker_passes > 1:  # raised by the first next(), where the DataLoader passes it on
            return _raise(RuntimeError(
                "MLMDataset iterated again in the same DataLoader worker with no set_epoch or load_state_dict in "
                "it since: it would repeat the pass's order and masks. A DataLoader with persistent_workers=True "
                "keeps its workers between passes, and set_epoch in the main process never reaches them. "
                "Create it with persistent_workers=False (Hugging Face TrainingArguments: "
                "dataloader_persistent_workers=False); MLMDataLoader does so itself"))
        return self._iterate(info.id, info.num_workers, in_process=False)

    def iter_worker(self, worker: int, num_workers: int) -> Iterator[dict]:
        """The samples DataLoader worker ``worker`` of ``num_workers`` emits from the recorded
        position (what a benchmark or a custom loader needs; the position does not move)."""
        if not 0 <= worker < num_workers:
            raise ValueError(f"worker must be in [0, {num_workers}), got {worker}")
        return self._iterate(worker, num_workers, in_process=False)

    def _iterate(self, worker: int, workers: int, *, in_process: bool) -> Iterator[dict]:
        plan, sizes, remaining, runs = self._runs(workers)
        if in_process:
            self._yielded, self._finished = 0, False
        reader = ShardRowReader(self.sources, max_open=self.interleave, verify=self.verify, layouts=self.layouts())
        try:
            for w in runs[worker].tolist():
                size = int(sizes[w])
                batch, index, weight = self._read_window(plan, w, size, reader)
                order, bins = plan.window_order(w, size)
                if bins is not None:
                    self._check_lengths(batch, index)
                skip = size - int(remaining[w])
                for pos, k in enumerate(order[skip:].tolist(), start=skip):
                    if in_process:
                        self._yielded += 1
                    bin_ = -1 if bins is None else int(bins[pos])
                    yield self._sample(batch, k, int(index[k]), float(weight[k]), bin_)
        finally:
            reader.close()
        if in_process:
            self._finished = True

    def _check_lengths(self, batch: InstanceBatch, index: np.ndarray) -> None:
        """The rows read are as long as the layouts said (else the bins were planned on other data)."""
        wrong = np.flatnonzero(np.diff(batch.offsets) != self._lengths[index])
        if len(wrong):
            starts = np.cumsum([0] + [len(p.shards) for p in self.sources])
            shard = int(np.searchsorted(self.stream().shard_starts, index[wrong[0]], side="right") - 1)
            source = int(np.searchsorted(starts, shard, side="right") - 1)
            url = self.sources[source].shards[shard - starts[source]].url
            raise ValueError(f"{url}: a row is {int(np.diff(batch.offsets)[wrong[0]])} tokens long, its layout said "
                             f"{int(self._lengths[index[wrong[0]]])} (was the shard changed while it was read?)")

    @staticmethod
    def _read_window(plan: RankPlan, w: int, size: int, reader: ShardRowReader):
        """The window's rows (stream order), their global indices and weights.

        An interleaved window holds one or more chunks of each shard; a shard's chunks in a window
        are often contiguous rows, so they are read as one range (one read per shard and window,
        not per chunk) and put back in stream order.
        """
        pieces, index, weight = plan.window_rows(w, size)
        if len(pieces) == 1:
            return reader.read(*pieces[0]), index, weight
        ranges: list[list[int]] = []  # merged [shard, start, stop, first piece], by shard and row
        where = {}  # piece number -> (range number, offset in the range)
        for p in sorted(range(len(pieces)), key=lambda p: pieces[p]):
            shard, start, stop = pieces[p]
            if ranges and ranges[-1][0] == shard and ranges[-1][2] == start:
                ranges[-1][2] = stop
                ranges[-1][3] = min(ranges[-1][3], p)
            else:
                ranges.append([shard, start, stop, p])
            where[p] = (len(ranges) - 1, start - ranges[-1][1])
        order = sorted(range(len(ranges)), key=lambda r: ranges[r][3])  # read in stream order
        batches = [reader.read(*ranges[r][:3]) for r in order]
        if len({b.languages is None for b in batches}) > 1:  # sources with and without languages, mixed
            for b in batches:
                b.languages = np.array([""] * len(b), dtype=str) if b.languages is None else b.languages
        base = np.zeros(len(ranges), dtype=np.int64)
        base[order] = np.cumsum([0] + [len(b) for b in batches])[:-1]
        rows = np.concatenate([np.arange(n) + base[where[p][0]] + where[p][1]
                               for p, n in enumerate(stop - start for _, start, stop in pieces)])
        merged = InstanceBatch.concat(batches) if len(batches) > 1 else batches[0]
        return merged.take(rows), index, weight

    @property
    def language_ids(self) -> dict[str, int] | None:
        """Language code -> id over all sources (the sorted codes from 0, as each manifest's
        ``languages.ids`` numbers its own), for ``MLMCollator(language_ids=...)``; None when no
        source has languages."""
        from mlm_pipeline.languages import language_ids

        codes = {code for p in self.sources for code in (p.languages or {})}
        return language_ids(codes) if codes else None

    def _sample(self, batch: InstanceBatch, k: int, index: int, weight: float, bin_: int) -> dict:
        s, e = batch.offsets[k], batch.offsets[k + 1]
        ms, me = batch.masked_offsets[k], batch.masked_offsets[k + 1]
        nsp = -1
        if self.prepared.has_nsp and batch.next_sentence_labels is not None:
            nsp = int(batch.next_sentence_labels[k])
        sample = {
            "input_ids": batch.input_ids[s:e],
            "token_type_ids": batch.segment_ids[s:e],
            "masked_lm_positions": batch.masked_lm_positions[ms:me],
            "masked_lm_ids": batch.masked_lm_ids[ms:me],
            "next_sentence_label": nsp,
            "index": index,
            "source": int(np.searchsorted(self._source_starts, index, side="right") - 1),
            "epoch": self.epoch,
            "weight": weight,
            "bin": bin_,
        }
        if batch.token_boundary is not None:
            sample["token_boundary"] = batch.token_boundary[s:e]
        if batch.document_starts is not None:  # packed rows: where each document starts
            sample["document_starts"] = batch.document_starts[batch.document_offsets[k]:batch.document_offsets[k + 1]]
        if batch.languages is not None and batch.languages[k]:
            sample["language"] = str(batch.languages[k])
        if batch.source_offsets is not None:  # --id-field, --metadata-field: the records the row comes from
            for name in ("document_ids", "document_metadata"):
                if getattr(batch, name) is not None:
                    sample[name] = getattr(batch, name)[batch.source_offsets[k]:batch.source_offsets[k + 1]].tolist()
        return sample

    def collator(self, *, masking: str = "auto", tokenizer=None, **kwargs):
        """An :class:`MLMCollator` matching this output (tokenizer, NSP, static masks or not).

        ``masking="auto"`` uses the shards' static masks when they have them, else the masking
        their objective trains with (``dynamic``: BERT's 80/10/10; ``electra``: ELECTRA's, for
        ``--objective electra``). Dynamic masking masks with the scheme and parameters the run
        recorded (``sop``: ALBERT's n-grams) unless ``masking_scheme`` or ``whole_word_mask`` is
        given, at the rate it recorded (``--masked-lm-prob``) unless ``mlm_probability`` is given, and groups words as the objective does (``sop``: ALBERT's ``token_boundary``
        words). The pair label is named for the model that reads it (``sop``:
        ``sentence_order_label``). Other keyword arguments go to :class:`MLMCollator`.
        """
        from mlm_pipeline.torch.collator import MLMCollator

        if masking == "auto":
            masking = self.prepared.auto_masking
        if masking == "electra" and self.prepared.max_seq_length:
            kwargs.setdefault("max_length", self.prepared.max_seq_length)  # ELECTRA pads to it
        if masking == "static" and not self.prepared.is_masked:
            raise ValueError(f"{self.prepared.url} was prepared without masks (masking: none): use masking='dynamic'")
        tok = tokenizer if tokenizer is not None and not isinstance(tokenizer, str) else self.prepared.tokenizer(tokenizer)
        kwargs.setdefault("nsp", self.prepared.has_nsp)
        kwargs.setdefault("sentence_label", self.prepared.sentence_label)
        if masking == "dynamic":
            kwargs.setdefault("mlm_probability", self.prepared.masked_lm_prob)
            if kwargs.get("masking_scheme") is None and not kwargs.get("whole_word_mask"):
                kwargs.update({**self.prepared.masking_scheme, **{k: v for k, v in kwargs.items() if v is not None}})
            if "word_continuation" not in kwargs:
                kwargs["word_continuation"] = self.prepared.word_continuation(tok)
        return MLMCollator(tok, masking=masking, **kwargs)
