"""Interleaved epochs, weighted mixing and length binning: exactly-once, resume, determinism, quality."""

from __future__ import annotations

import json
import math
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from loader.loader_helpers import assert_same_batches, indices, run  # noqa: E402

from mlm_pipeline.torch import MLMDataLoader, MLMDataset, load_prepared  # noqa: E402
from mlm_pipeline.instances.batch import InstanceBatch  # noqa: E402
from mlm_pipeline.torch.stream import epoch_stream, mix_counts  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:This DataLoader will create")]


def make_loader(out, *, batch_size=16, workers=0, rank=0, world=1, masking="auto", **ds_kw):
    ds_kw.setdefault("seed", 3)
    ds_kw.setdefault("shuffle_buffer", 96)
    ds = MLMDataset(out, rank=rank, world_size=world, **ds_kw)
    coll = ds.collator(masking=masking, sample_info=True)
    return MLMDataLoader(ds, batch_size=batch_size, collate_fn=coll, num_workers=workers)


# -- the stream -------------------------------------------------------------------------------


def _random_row_groups(rng, counts):
    """Row groups of each shard: up to 4 cuts at random rows."""
    return [np.diff(np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, rng.integers(0, 4))]))) for n in counts]


def test_stream_positions_are_each_row_once():
    """Any shard counts, row groups, groups and windows: the stream lists every row once, windows located apart."""
    rng = np.random.default_rng(0)
    for trial in range(150):
        sources = [rng.integers(0, 200, rng.integers(1, 15)) for _ in range(rng.integers(1, 4))]
        counts = np.concatenate(sources)
        stream = epoch_stream(sources, seed=1, epoch=int(rng.integers(0, 4)), shuffle=bool(trial % 4),
                              interleave=int(rng.integers(1, 30)), window=int(rng.integers(1, 300)),
                              row_groups=_random_row_groups(rng, counts) if trial % 2 else None)
        n = stream.total
        cuts = np.unique(np.concatenate([[0, n], rng.integers(0, n + 1, 6)]))
        shard, row = map(np.concatenate, zip(*(stream.locate(np.arange(a, b)) for a, b in zip(cuts[:-1], cuts[1:]))))
        assert ((row >= 0) & (row < counts[shard])).all()
        assert sorted(stream.global_index(shard, row).tolist()) == list(range(int(counts.sum())))


def test_chunks_spread_every_shard_over_the_group():
    """Within a group, each stretch of a window's length holds each shard in proportion."""
    counts = np.array([400, 100, 250, 50, 200])
    stream = epoch_stream([counts], seed=0, epoch=0, shuffle=True, interleave=8, window=100)
    shard, _ = stream.locate(np.arange(stream.total))
    for a in range(0, stream.total - 100, 100):
        got = np.bincount(shard[a:a + 100], minlength=5)
        assert np.abs(got - counts * 100 / counts.sum()).max() <= 20, (a, got)
        assert (got > 0).all()


def test_small_row_groups_are_whole_chunks():
    """Row groups of at most their shard's share of a window are never cut: a cut between two
    readers splits at most the one row group it falls in. Larger ones are cut into equal parts."""
    rng = np.random.default_rng(1)
    counts = rng.integers(100, 400, 12)
    groups = [np.diff(np.concatenate([np.arange(0, n, 40), [n]])) for n in counts]  # 40 rows, the last fewer
    window = int(41 * counts.sum() // counts.min())  # every shard's share of a window: over 40 rows
    stream = epoch_stream([counts], seed=0, epoch=1, shuffle=True, interleave=32, window=window, row_groups=groups)
    starts = {(s, int(r)) for s, g in enumerate(groups) for r in np.cumsum(g) - g}
    chunk_rows = np.diff(stream.chunk_starts)
    assert all((int(s), int(r)) in starts for s, r in zip(stream.chunk_shard, stream.chunk_row))
    assert all(n == groups[s][np.searchsorted(np.cumsum(groups[s]) - groups[s], r)]
               for s, r, n in zip(stream.chunk_shard, stream.chunk_row, chunk_rows))
    window = 20 * len(counts)
    big = epoch_stream([counts], seed=0, epoch=1, shuffle=True, interleave=32, window=window, row_groups=groups)
    limits = window * counts // counts.sum()
    assert len(big.chunk_starts) - 1 == sum(int((-(-g // m)).sum()) for g, m in zip(groups, limits))


def test_each_row_group_is_read_by_one_reader(parquet_out, tmp_path, monkeypatch):
    """Shards of 20-row row groups, each at most its shard's share of a window: over 2 ranks x 2
    workers, every row group is read (started) once in the epoch, but for at most one per cut
    between two readers, which both read."""
    from mlm_pipeline.formats.parquet import ParquetRows
    from mlm_pipeline.formats.sink import ShardSink
    from mlm_pipeline.inspect import read_shard

    from loader.loader_helpers import write_output

    rows = InstanceBatch.concat([read_shard(s.url) for s in load_prepared(parquet_out).shards])
    write_output(tmp_path, [], fmt="parquet", objective="nsp", masking="static")  # the manifest's frame
    shards = []
    for i in range(12):  # 12 shards of 6 row groups of 20 rows
        sink = ShardSink(str(tmp_path), f"{i:05d}", fmt="parquet", max_instances_per_shard=10**9,
                         max_seq_length=128, max_predictions=20)
        for g in range(6):
            sink.write(rows.slice(120 * i + 20 * g, 120 * i + 20 * g + 20))
        shards += sink.close()
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    (tmp_path / "manifest.json").write_text(json.dumps({**manifest, "shards": shards}))

    started, reader = [], [None]
    original = ParquetRows._start_group

    def counting(self, group):
        started.append((self._url, group, reader[0]))
        return original(self, group)

    monkeypatch.setattr(ParquetRows, "_start_group", counting)
    seen = []
    for rank in range(2):
        ds = MLMDataset(str(tmp_path), seed=2, shuffle_buffer=256, rank=rank, world_size=2, verify="none")
        for worker in range(2):
            reader[0] = (rank, worker)
            seen += [s["index"] for s in ds.iter_worker(worker, 2)]
    assert sorted(seen) == list(range(12 * 120))
    readers = Counter((url, group) for url, group, _ in set(started))
    assert len(readers) == 12 * 6 and len(started) == len(set(started))  # one start per reader and group
    assert sum(n - 1 for n in readers.values()) <= 3  # 4 readers: 3 cuts


# -- interleaving quality -------------------------------------------------------------------


def _expected_distinct(sizes, total, batch):
    lc = lambda n, k: math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)  # noqa: E731
    return len(sizes) - sum(math.exp(lc(total - t, batch) - lc(total, batch)) for t in sizes if total - t >= batch)


@pytest.mark.parametrize("interleave", [1, 128])
def test_batches_draw_from_many_shards(parquet_out, interleave):
    """Interleaved (the default): batches hold nearly as many shards as a global shuffle's;
    one shard at a time (interleave=1, the former order) holds a few."""
    counts = load_prepared(parquet_out).shard_counts
    starts = np.concatenate([[0], np.cumsum(counts)])
    ds = MLMDataset(parquet_out, seed=0, shuffle_buffer=512, interleave=interleave)
    batch, distinct = 64, []
    for w in range(2):
        shard = np.searchsorted(starts, [s["index"] for s in ds.iter_worker(w, 2)], side="right") - 1
        distinct += [len(set(shard[a:a + batch].tolist())) for a in range(0, len(shard) - batch + 1, batch)]
    ratio = np.mean(distinct) / _expected_distinct(counts.tolist(), int(counts.sum()), batch)
    if interleave == 1:
        assert ratio < 0.5
    else:
        assert ratio >= 0.9


# -- mixing ---------------------------------------------------------------------------------


def test_mix_counts():
    assert mix_counts([100, 50, 1000], [0.3, 0.2, 0.5], None).tolist() == [75, 50, 125]  # 50 / 0.2 = 250
    assert mix_counts([100, 50, 1000], [0.3, 0.2, 0.5], 2001).tolist() == [600, 400, 1001]  # largest remainder
    assert mix_counts([100, 50, 1000], [1, 0, 1], None).tolist() == [100, 0, 100]
    assert mix_counts([7, 9], None, None).tolist() == [7, 9]
    for bad in ([1], [-1, 2], [0, 0], [math.nan, 1]):
        with pytest.raises(ValueError):
            mix_counts([5, 5], bad, None)
    with pytest.raises(ValueError, match="needs weights"):
        mix_counts([5, 5], None, 10)


@pytest.fixture
def two(parquet_out, tfrecord_out):
    """The same text prepared as Parquet and as TFRecord: two sources (of two formats) to mix."""
    return [parquet_out, tfrecord_out]


@pytest.mark.parametrize("world, workers", [(1, 0), (2, 2)])
def test_mixed_epochs_are_exact_once_and_cycle(two, world, workers):
    weights = [0.7, 0.3]
    n = load_prepared(two[0]).total
    expected = mix_counts([n, n], weights, None)
    assert expected[0] == n and expected[1] == round(n * 0.3 / 0.7)
    seen_by_epoch = []
    loaders = [make_loader(two, weights=weights, rank=r, world=world, workers=workers) for r in range(world)]
    for epoch in range(3):
        got = []
        for dl in loaders:
            got += indices(run(dl))
        c = Counter(got)
        assert max(c.values()) == 1  # without replacement: no instance twice in an epoch
        per_source = [sum(1 for i in got if i < n), sum(1 for i in got if i >= n)]
        assert per_source == expected.tolist()  # exact proportions
        seen_by_epoch.append({i for i in got if i >= n})
    # the subsampled source is taken in turn: epochs 0 and 1 disjoint, epoch 2 wraps around
    assert not (seen_by_epoch[0] & seen_by_epoch[1])
    assert len(seen_by_epoch[0] | seen_by_epoch[1] | seen_by_epoch[2]) == n


def test_mixed_batches_hold_both_sources_in_proportion(two):
    n = load_prepared(two[0]).total
    ds = MLMDataset(two, weights=[0.5, 0.5], seed=1, shuffle_buffer=400)
    src = np.array([s["source"] for s in ds])
    assert (src == 1).sum() == (src == 0).sum() == n
    full = len(src) // 400 * 400  # the last window holds a few chunks of each source: shares drift there
    assert 0.45 < min(src[a:a + 400].mean() for a in range(0, full, 400))
    shares = [src[a:a + 64].mean() for a in range(0, full - 63, 64)]
    assert 0.3 < min(shares) and max(shares) < 0.7  # every batch mixes, near its weights
    assert 0 < src[full:].mean() < 1


def test_upsampling_repeats_evenly_and_deterministically(two):
    n = load_prepared(two[0]).total
    total = 3 * n + 101
    ds = MLMDataset(two, weights=[2, 1], samples_per_epoch=total, seed=2, shuffle_buffer=300)
    got = [s["index"] for s in ds]
    assert len(got) == total
    c = Counter(got)
    first = [c[i] for i in range(n)]
    share = (total * 2 // 3 + 1) / n  # source 0 gets 2/3 of the epoch: about 2.03 per instance
    assert set(first) <= {math.floor(share), math.ceil(share)}
    assert sum(first) + sum(c[i] for i in range(n, 2 * n)) == total
    assert [s["index"] for s in MLMDataset(two, weights=[2, 1], samples_per_epoch=total, seed=2,
                                           shuffle_buffer=300)] == got


@pytest.mark.parametrize("workers", [0, 2])
def test_mixed_resume_gives_the_same_remaining_sequence(two, workers):
    kw = dict(weights=[0.6, 0.4], workers=workers, rank=1, world=2, masking="dynamic")
    full = run(make_loader(two, **kw))
    for stop in (3, len(full) - 2):
        dl = make_loader(two, **kw)
        head = run(dl, stop)
        state = json.loads(json.dumps(dl.state_dict()))
        assert state["mix"]["weights"] == [0.6, 0.4] and sum(state["mix"]["per_epoch"]) == dl.dataset.total
        resumed = make_loader(two, **kw)
        resumed.load_state_dict(state)
        assert_same_batches(head + run(resumed), full)
    with pytest.raises(ValueError, match="cannot resume"):
        make_loader(two, **{**kw, "weights": [0.5, 0.5]}).load_state_dict(state)


def test_old_states_and_unmixable_sources_are_refused(parquet_out, short_out):
    dl = make_loader(parquet_out)
    run(dl, 2)
    old = {**dl.state_dict(), "version": 1}
    with pytest.raises(ValueError, match="older loader"):
        make_loader(parquet_out).load_state_dict(old)
    with pytest.raises(ValueError, match="cannot mix"):
        MLMDataset([parquet_out, _other_objective(short_out)])
    with pytest.raises(ValueError, match="interleave"):
        MLMDataset(parquet_out, interleave=0)


def _other_objective(out):
    from dataclasses import replace

    return replace(load_prepared(out), objective="packed")


# -- length binning ----------------------------------------------------------------------------


def _bins_of(batch, bins):
    lengths = batch["attention_mask"].sum(1)
    return set(np.searchsorted(bins, lengths.numpy(), side="left").tolist())


@pytest.mark.parametrize("world, workers", [(1, 0), (2, 2)])
def test_binned_batches_are_one_bin_and_every_instance_once(parquet_out, world, workers):
    total = load_prepared(parquet_out).total
    seen, pure, batches_per_rank = [], [], []
    for rank in range(world):
        dl = make_loader(parquet_out, rank=rank, world=world, workers=workers, batch_size=32,
                         shuffle_buffer=512, length_bins=4, bin_batch_size=32, pad_ranks=True)
        bins = dl.dataset.bins
        assert bins == (32, 64, 96, 128)
        batches = run(dl)
        assert len(batches) == dl.dataset.num_batches_of_epoch(32, workers)
        batches_per_rank.append(len(batches))
        for b in batches:
            seen += b["sample_index"][b["sample_weight"] > 0].tolist()
            pure.append(len(_bins_of(b, bins)) == 1)
    assert sorted(seen) == list(range(total))
    assert len(set(batches_per_rank)) == 1  # DDP stays in step
    windows = -(-total // world // 512) * world
    assert len(pure) - sum(pure) <= windows * 3  # only each window's last few batches mix bins
    assert np.mean(pure) > 0.75


def test_binning_cuts_padding(parquet_out):
    def waste(**kw):
        pad = tokens = 0
        dl = make_loader(parquet_out, batch_size=32, shuffle_buffer=512, **kw)
        dl.collate_fn.pad_to_multiple_of = 8
        for b in run(dl):
            m = b["attention_mask"]
            tokens += m.numel()
            pad += int((m == 0).sum())
        return pad / tokens

    plain, binned = waste(), waste(length_bins=8, bin_batch_size=32)
    assert binned < plain / 3, (plain, binned)


def _equal_bins(n):
    """``n`` bins of equal width up to 128 (an int ``length_bins`` rounds bounds to multiples of 8)."""
    return [128 * (i + 1) // n for i in range(n)]


def _dataloader_steps(ds, workers, batch):
    """A rank's batches (lists of samples) in the order a DataLoader with ``workers`` hands them out."""
    cut = [[s[a:a + batch] for a in range(0, len(s), batch)]
           for s in (list(ds.iter_worker(w, workers)) for w in range(workers))]
    return [c[k] for k in range(max(map(len, cut))) for c in cut if k < len(c)]


@pytest.mark.parametrize("world", [2, 4])
@pytest.mark.parametrize("n_bins", [8, 16, 32])
def test_every_rank_draws_the_same_bin_at_every_step(parquet_out, world, n_bins):
    """The k-th batch of every rank is of the same bin, at every step of the epoch (by
    construction: the bins come from every rank's counts); no sample is longer than its
    batch's bin; and every instance is seen once."""
    kw = dict(seed=4, shuffle_buffer=128, length_bins=_equal_bins(n_bins), bin_batch_size=16, pad_ranks=True,
              verify="none")
    ranks = [_dataloader_steps(MLMDataset(parquet_out, rank=r, world_size=world, **kw), 2, 16) for r in range(world)]
    assert len({len(steps) for steps in ranks}) == 1  # pad_ranks: the same number of steps
    bins = [[{s["bin"] for s in b} for b in steps] for steps in ranks]
    assert all(len(b) == 1 for steps in bins for b in steps)  # one bin per batch
    same = [len(set.union(*(steps[k] for steps in bins))) == 1 for k in range(len(ranks[0]))]
    assert np.mean(same) == 1.0
    bounds = _equal_bins(n_bins) + [10**9]
    assert all(len(s["input_ids"]) <= bounds[s["bin"]] for steps in ranks for b in steps for s in b)
    own_bin = [all(len(s["input_ids"]) > ([0] + bounds)[s["bin"]] for s in b) for steps in ranks for b in steps]
    assert np.mean(own_bin) > 0.6  # the rest hold a few samples moved up from the bin below
    seen = sorted(s["index"] for steps in ranks for b in steps for s in b if s["weight"] > 0)
    assert seen == list(range(load_prepared(parquet_out).total))


def _bins_only(samples):
    return [s["bin"] for s in samples]


def test_dataloader_ranks_step_through_the_same_bins_and_resume(parquet_out):
    """Through MLMDataLoader with 2 workers, 2 ranks without padding: the ranks' batches are of
    the same bin step by step (the shorter rank may have one batch fewer at the end); resumed
    mid-epoch, each rank gives the same remaining bins and samples."""
    kw = dict(seed=7, shuffle_buffer=128, length_bins=8, bin_batch_size=16)

    def loader(rank, collate=_bins_only):
        ds = MLMDataset(parquet_out, rank=rank, world_size=2, **kw)
        return MLMDataLoader(ds, batch_size=16, collate_fn=collate, num_workers=2)

    full = [run(loader(r)) for r in range(2)]
    assert abs(len(full[0]) - len(full[1])) <= 1
    assert all(len(set(b)) == 1 for f in full for b in f)
    assert [b[0] for b in full[0][:len(full[1])]] == [b[0] for b in full[1][:len(full[0])]]
    for rank in range(2):
        dl = loader(rank, collate=lambda samples: [(s["bin"], s["index"]) for s in samples])
        head = run(dl, 5)
        resumed = loader(rank, collate=lambda samples: [(s["bin"], s["index"]) for s in samples])
        resumed.load_state_dict(dl.state_dict())
        uninterrupted = run(loader(rank, collate=lambda samples: [(s["bin"], s["index"]) for s in samples]))
        assert head + run(resumed) == uninterrupted
        assert [[b for b, _ in batch] for batch in uninterrupted] == full[rank]


@pytest.mark.parametrize("world, weights", [(2, None), (4, [0.6, 0.4])])
def test_shared_bins_resume_over_ranks_and_other_workers(two, world, weights):
    """Shared bins, ranks resumed mid-epoch with other workers: every instance of the epoch once."""
    n = load_prepared(two[0]).total
    sources = two if weights else two[0]
    kw = dict(batch_size=16, shuffle_buffer=128, length_bins=_equal_bins(16), bin_batch_size=16, weights=weights)
    got = []
    for rank in range(world):
        dl = make_loader(sources, rank=rank, world=world, workers=2, **kw)
        got += indices(run(dl, 3))
        rest = make_loader(sources, rank=rank, world=world, workers=1, **kw)
        rest.load_state_dict(dl.state_dict())
        got += indices(run(rest))
    assert len(got) == len(set(got))
    if weights:
        per_source = [sum(1 for i in got if i < n), sum(1 for i in got if i >= n)]
        assert per_source == mix_counts([n, n], weights, None).tolist()
    else:
        assert sorted(got) == list(range(n))


def test_binned_order_gives_every_rank_the_same_bins():
    """Random windows of several ranks: the same bin sequence on each, a permutation of each
    window, nothing above its batch's bin."""
    from mlm_pipeline.torch.epoch_plan import binned_order

    rng = np.random.default_rng(0)
    for trial in range(200):
        world, batch, k = int(rng.integers(1, 5)), int(rng.integers(1, 9)), int(rng.integers(1, 7))
        size = batch * int(rng.integers(1, 12))
        sizes = [size - int(rng.integers(0, 2)) * (trial % 3 == 0) for _ in range(world)]  # last windows: +-1
        bounds = np.sort(rng.choice(np.arange(1, 60), k, replace=False))
        lengths = [rng.integers(1, bounds[-1] + 1, n) for n in sizes]
        classes = [np.searchsorted(bounds, x, side="left") for x in lengths]
        counts = np.array([np.bincount(c, minlength=k + 1) for c in classes])
        results = []
        for r in range(world):
            order = rng.permutation(sizes[r])
            out, bins = binned_order(order, lengths[r], classes[r], counts, batch, np.random.default_rng(trial))
            assert sorted(out.tolist()) == list(range(sizes[r]))
            assert (lengths[r][out] <= np.append(bounds, 10**9)[bins]).all()
            results.append(bins)
        common = min(map(len, results)) // batch * batch
        assert all((b[:common] == results[0][:common]).all() for b in results)


@pytest.mark.parametrize("workers", [0, 2])
def test_binned_resume_gives_the_same_remaining_sequence(parquet_out, workers):
    kw = dict(workers=workers, batch_size=32, shuffle_buffer=256, length_bins=4, bin_batch_size=32)
    full = run(make_loader(parquet_out, **kw))
    dl = make_loader(parquet_out, **kw)
    head = run(dl, 7)
    resumed = make_loader(parquet_out, **kw)
    resumed.load_state_dict(dl.state_dict())
    assert_same_batches(head + run(resumed), full)


def test_mixing_and_binning_together_over_ranks_and_workers(two):
    """Both at once, 2 ranks x 2 workers, resumed mid-epoch with other workers: exact mix, once each."""
    n = load_prepared(two[0]).total
    kw = dict(weights=[0.6, 0.4], batch_size=32, shuffle_buffer=256, length_bins=4, bin_batch_size=32)
    got = []
    for rank in range(2):
        dl = make_loader(two, rank=rank, world=2, workers=2, **kw)
        got += indices(run(dl, 5))
        rest = make_loader(two, rank=rank, world=2, workers=1, **kw)
        rest.load_state_dict(dl.state_dict())
        got += indices(run(rest))
    assert len(got) == len(set(got))
    assert [sum(1 for i in got if i < n), sum(1 for i in got if i >= n)] == mix_counts([n, n], [0.6, 0.4], None).tolist()


def test_binning_arguments(parquet_out):
    with pytest.raises(ValueError, match="bin_batch_size"):
        MLMDataset(parquet_out, length_bins=4)
    with pytest.raises(ValueError, match="dividing shuffle_buffer"):
        MLMDataset(parquet_out, length_bins=4, bin_batch_size=30, shuffle_buffer=100)
    with pytest.raises(ValueError, match="length_bins"):
        MLMDataset(parquet_out, length_bins=[64, 32], bin_batch_size=10, shuffle_buffer=100)
    ds = MLMDataset(parquet_out, length_bins=[40, 128], bin_batch_size=10, shuffle_buffer=100)
    with pytest.raises(ValueError, match="same batch size"):
        MLMDataLoader(ds, batch_size=20, collate_fn=ds.collator())


# -- the benchmark ---------------------------------------------------------------------------


def test_loader_bench_reports_what_it_measures(parquet_out, tmp_path):
    """benchmarks/loader_bench.py on the fixture: it counts the whole epoch once, and its
    figures say what the loader does (interleaved batches; binning cuts the padding)."""
    import subprocess
    import sys

    from loader.loader_helpers import REPO

    def bench(*extra):
        out = tmp_path / f"bench{len(extra)}.json"
        proc = subprocess.run(
            [sys.executable, str(REPO / "benchmarks" / "loader_bench.py"), parquet_out, "--batch-size", "32",
             "--shuffle-buffer", "256", "--workers", "2", "--world-size", "2", "--json", str(out), *extra],
            capture_output=True, text=True, timeout=300, env={**__import__("os").environ, "OMP_NUM_THREADS": "1"},
        )
        assert proc.returncode == 0, proc.stdout + proc.stderr
        return json.loads(out.read_text())

    plain, binned = bench(), bench("--length-bins", "8")
    total = load_prepared(parquet_out).total
    for r in (plain, binned):
        assert r["samples"] == total and r["tasks"] == 5  # 1 MB in tasks of 200 KB
        assert r["distinct_ratio"] >= 0.9
        assert r["read_amplification"] >= 1.0 and len(r["peak_rss_mib_per_worker"]) == 4
        assert r["mean_abs_position_diff"] > 0.8 * r["global_expectation_position_diff"]
    assert binned["padding_waste"] < plain["padding_waste"] / 2
    assert binned["same_bin_across_ranks"] == 1.0 and 0 < binned["batches_of_one_bin"] <= 1
