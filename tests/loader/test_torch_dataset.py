"""MLMDataset / MLMDataLoader: exactly-once over ranks and workers, epochs, resume, odd outputs."""

from __future__ import annotations

import json
import warnings
from collections import Counter

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from loader.loader_helpers import assert_same_batches, indices, loader, run, shard_rows, write_output  # noqa: E402

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets  # noqa: E402
from mlm_pipeline.torch import MLMDataLoader, MLMDataset, load_prepared  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore:This DataLoader will create")]


@pytest.fixture(params=["parquet", "tfrecord"])
def out(request, parquet_out, tfrecord_out):
    return parquet_out if request.param == "parquet" else tfrecord_out


def test_fixture_has_uneven_shards(parquet_out, tfrecord_out):
    for o in (parquet_out, tfrecord_out):
        counts = [s.instances for s in load_prepared(o).shards]
        assert len(counts) >= 8 and len(set(counts)) >= 4, counts


@pytest.mark.parametrize("world", [1, 2, 3])
@pytest.mark.parametrize("workers", [0, 1, 2])
def test_every_instance_exactly_once(out, world, workers):
    total = load_prepared(out).total
    seen, per_rank = [], []
    for rank in range(world):
        dl = loader(out, rank=rank, world=world, workers=workers, batch_size=16, buffer=100)
        expected_batches, expected_samples = len(dl), len(dl.dataset)
        batches = run(dl)
        assert len(batches) == expected_batches  # len(loader) is exact, short batches included
        got = indices(batches)
        assert len(got) == expected_samples
        per_rank.append(len(got))
        seen += got
    assert sorted(seen) == list(range(total))  # each once, none dropped, none repeated
    assert max(per_rank) - min(per_rank) <= 1  # uneven totals: some ranks have one more
    assert per_rank == sorted(per_rank, reverse=True)


def test_samples_match_the_shards(out):
    rows = shard_rows(out)
    ds = MLMDataset(out, seed=1, shuffle_buffer=77, rank=1, world_size=2)
    n = 0
    for sample in ds:
        np.testing.assert_array_equal(sample["input_ids"], rows[sample["index"]])
        assert sample["weight"] == 1.0 and sample["epoch"] == 0
        assert sample["next_sentence_label"] in (0, 1)
        assert len(sample["masked_lm_positions"]) == len(sample["masked_lm_ids"]) > 0
        n += 1
    assert n == len(MLMDataset(out, rank=1, world_size=2))


def test_rank_sets_do_not_depend_on_workers(parquet_out):
    for rank in range(3):
        sets = [sorted(indices(run(loader(parquet_out, rank=rank, world=3, workers=w)))) for w in (0, 1, 2)]
        assert sets[0] == sets[1] == sets[2]


def test_epochs_reshuffle_and_cover(parquet_out):
    total = load_prepared(parquet_out).total
    dls = [loader(parquet_out, rank=r, world=2, workers=1) for r in range(2)]
    epochs = []
    for _ in range(2):
        order = [indices(run(dl)) for dl in dls]
        epochs.append(order)
        assert sorted(order[0] + order[1]) == list(range(total))
    assert epochs[0] != epochs[1]
    assert all(dl.dataset.epoch == 1 for dl in dls)
    assert all(dl.state_dict()["epoch"] == 2 and len(dl) == dl.dataset.num_batches_of_epoch(16, 1) for dl in dls)
    # same seed and epoch: same order; other seed: other order
    again = indices(run(loader(parquet_out, rank=0, world=2, workers=1)))
    assert again == epochs[0][0]
    assert indices(run(loader(parquet_out, rank=0, world=2, workers=1, seed=4))) != again


def test_no_shuffle_is_manifest_order(parquet_out):
    ds = MLMDataset(parquet_out, shuffle=False, shuffle_buffer=50)
    assert [s["index"] for s in ds] == list(range(ds.total))


@pytest.mark.parametrize("workers", [0, 1, 2])
@pytest.mark.parametrize("masking", ["static", "dynamic"])
def test_resume_mid_epoch_gives_the_same_remaining_sequence(parquet_out, workers, masking):
    make = lambda: loader(parquet_out, rank=1, world=2, workers=workers, batch_size=16, buffer=64, masking=masking)  # noqa: E731
    full = run(make())
    for stop in (1, 9, len(full) - 1) if workers != 1 else (5,):
        dl = make()
        head = run(dl, stop)
        state = json.loads(json.dumps(dl.state_dict()))  # JSON-able
        resumed = make()
        resumed.load_state_dict(state)
        assert len(resumed) == len(full) and resumed.remaining() == len(full) - stop  # len: the whole epoch
        tail = run(resumed)
        assert len(tail) == len(full) - stop
        assert_same_batches(head + tail, full)  # same samples, order, masks, batch boundaries


@pytest.mark.parametrize("workers", [0, 2])
def test_resume_repeatedly(parquet_out, workers):
    full = indices(run(loader(parquet_out, workers=workers, batch_size=32, buffer=64)))
    got, dl = [], loader(parquet_out, workers=workers, batch_size=32, buffer=64)
    for stop in [3, 1, 17, 5, 40, 2] * 10:
        got += indices(run(dl, stop))
        state = dl.state_dict()
        if state["epoch"] == 1:
            break
        dl = loader(parquet_out, workers=workers, batch_size=32, buffer=64)
        dl.load_state_dict(state)
    assert got == full


def test_resume_with_other_workers_or_batch_size_sees_the_rest_once(parquet_out):
    total = load_prepared(parquet_out).total
    rng = np.random.default_rng(0)
    got, dl = [], loader(parquet_out, workers=2, batch_size=8, buffer=64)
    while True:
        got += indices(run(dl, int(rng.integers(1, 12))))
        state = dl.state_dict()
        if state["epoch"] == 1:
            break
        dl = loader(parquet_out, workers=int(rng.integers(0, 3)), batch_size=int(rng.integers(8, 40)), buffer=64)
        dl.load_state_dict(state)
    assert sorted(got) == list(range(total))


def test_ddp_state_of_rank_zero_restores_every_rank(parquet_out):
    """DDP ranks step together: rank 0's checkpointed state is each rank's position."""
    world, stop = 3, 7
    make = lambda rank: loader(parquet_out, rank=rank, world=world, batch_size=8, pad=True)  # noqa: E731
    state0 = make(0)
    run(state0, stop)
    for rank in range(world):
        full = indices(run(make(rank)))
        mine = make(rank)
        head = indices(run(mine, stop))
        mine = make(rank)
        mine.load_state_dict(state0.state_dict())
        assert head + indices(run(mine)) == full


def test_in_process_dataset_state_without_a_loader(parquet_out):
    ds = MLMDataset(parquet_out, seed=2, shuffle_buffer=40)
    full = [s["index"] for s in ds]
    assert ds.state_dict()["epoch"] == 1  # the pass ran to the end
    assert [s["index"] for s in ds] == full  # iterating never moves the recorded position
    ds.set_epoch(1)
    assert [s["index"] for s in ds] != full
    ds = MLMDataset(parquet_out, seed=2, shuffle_buffer=40)
    it = iter(ds)
    head = [next(it)["index"] for _ in range(123)]
    state = ds.state_dict()
    again = MLMDataset(parquet_out, seed=2, shuffle_buffer=40)
    again.load_state_dict(state)
    assert len(again) == len(full) - 123
    assert head + [s["index"] for s in again] == full


@pytest.mark.parametrize("workers", [0, 2])
def test_pad_ranks_equalises_batches_with_weightless_copies(parquet_out, workers):
    total = load_prepared(parquet_out).total
    world = 3
    assert total % world  # the fixture's total is uneven across 3 ranks
    counts, real = [], []
    for rank in range(world):
        dl = loader(parquet_out, rank=rank, world=world, workers=workers, batch_size=16, pad=True)
        batches = run(dl)
        counts.append((len(batches), sum(len(b["sample_index"]) for b in batches)))
        for b in batches:
            pad = b["sample_weight"] == 0
            assert (b["labels"][pad] == -100).all() and (b["next_sentence_label"][pad] == -100).all()
            real += b["sample_index"][~pad].tolist()
    assert len(set(counts)) == 1 and counts[0][1] == -(-total // world)
    assert sorted(real) == list(range(total))


def test_state_for_other_settings_is_refused(parquet_out):
    dl = loader(parquet_out, world=2, workers=0)
    run(dl, 3)
    state = dl.state_dict()
    for other in (dict(world=3), dict(seed=9), dict(buffer=99), dict(pad=True)):
        with pytest.raises(ValueError, match="cannot resume"):
            loader(parquet_out, **{"world": 2, **other}).load_state_dict(state)
    with pytest.raises(ValueError, match="not an MLMDataset state"):
        loader(parquet_out).load_state_dict({"epoch": 0})


def test_state_of_an_output_prepared_again_into_the_same_files_is_refused(tmp_path):
    """Two real runs with other seeds write files of the same names and counts, whose contents
    differ: a position saved on one does not apply to the other. A state saved by an earlier
    loader (paths and counts only) still resumes on its own data."""
    from loader.loader_helpers import VOCAB, WIKITEXT

    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare

    outs = []
    for seed in (1, 2):
        out = tmp_path / f"seed{seed}"
        run_prepare(PrepareConfig(inputs=[str(WIKITEXT)], output=str(out), tokenizer=str(VOCAB), format="parquet",
                                  workers=1, progress=False, split_bytes=200_000, max_instances_per_shard=333,
                                  objective="tokens", masking="static", random_seed=seed))
        outs.append(str(out))
    a, b = (load_prepared(o) for o in outs)
    assert [(s.url.rsplit("/", 1)[-1], s.instances) for s in a.shards] == \
        [(s.url.rsplit("/", 1)[-1], s.instances) for s in b.shards]
    assert all(x.sha256 != y.sha256 for x, y in zip(a.shards, b.shards))
    dl = loader(outs[0])
    run(dl, 3)
    state = dl.state_dict()
    with pytest.raises(ValueError, match="cannot resume: the state belongs to other data"):
        loader(outs[1]).load_state_dict(state)
    again = loader(outs[0])
    again.load_state_dict(state)
    earlier = json.loads(json.dumps(state))
    earlier["fingerprint"] = a.fingerprint(contents=False)
    older = loader(outs[0])
    older.load_state_dict(earlier)
    assert indices(run(older)) == indices(run(again))


def test_bad_arguments_are_value_errors(parquet_out, tmp_path):
    for kwargs in (dict(seed=-1), dict(shuffle_buffer=0), dict(rank=2, world_size=2), dict(world_size=0)):
        with pytest.raises(ValueError):
            MLMDataset(parquet_out, **kwargs)
    with pytest.raises(ValueError, match="no manifest.json"):
        MLMDataset(str(tmp_path))
    ds = MLMDataset(parquet_out)
    with pytest.raises(ValueError):
        MLMDataLoader(ds, batch_size=0, collate_fn=list)


def test_stale_iterator_is_refused(parquet_out):
    dl = loader(parquet_out)
    it = iter(dl)
    next(it)
    iter(dl)
    with pytest.raises(RuntimeError, match="stale"):
        next(it)


def _batch(rng, n, *, nsp: bool, masked: bool, lo=5, hi=40):
    lens = rng.integers(lo, hi, n)
    ids = rng.integers(1000, 2000, int(lens.sum())).astype(np.int32)
    offsets = lengths_to_offsets(lens)
    ids[offsets[:-1]] = 101  # [CLS]
    ids[offsets[1:] - 1] = 102  # [SEP]
    if masked:
        mlens = np.minimum(3, lens - 2)
        pos = np.concatenate([np.arange(1, 1 + m) for m in mlens]).astype(np.int32)
        mids = ids[np.repeat(offsets[:-1], mlens) + pos]
        ids[np.repeat(offsets[:-1], mlens) + pos] = 103  # [MASK]
    else:
        mlens = np.zeros(n, np.int64)
        pos = mids = np.zeros(0, np.int32)
    return InstanceBatch(
        input_ids=ids, segment_ids=np.zeros(len(ids), np.int8), offsets=offsets,
        masked_lm_positions=pos, masked_lm_ids=mids.astype(np.int32), masked_offsets=lengths_to_offsets(mlens),
        next_sentence_labels=rng.integers(0, 2, n).astype(np.int8) if nsp else None,
    )


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
@pytest.mark.parametrize("objective", ["packed", "tokens"])
def test_unmasked_outputs_without_nsp(tmp_path, fmt, objective):
    """The other builders' shards: no NSP labels, no stored masks, segment ids all 0, an empty shard."""
    rng = np.random.default_rng(0)
    batches = [_batch(rng, n, nsp=False, masked=False) for n in (17, 0, 5, 31)]
    out = write_output(tmp_path, batches, fmt=fmt, objective=objective, masking="none")
    assert [s.instances for s in load_prepared(out).shards] == [17, 5, 31]  # an empty task writes no shard
    for world, workers in ((1, 0), (2, 2)):
        seen = []
        for rank in range(world):
            dl = loader(out, rank=rank, world=world, workers=workers, batch_size=4, buffer=8)
            assert dl.collate_fn.masking == "dynamic" and not dl.collate_fn.nsp
            for b in run(dl):
                assert "next_sentence_label" not in b
                assert (b["token_type_ids"] == 0).all()
                assert ((b["labels"] != -100).sum(1) >= 1).all()
                seen += b["sample_index"].tolist()
        assert sorted(seen) == list(range(53))
    ds = MLMDataset(out)
    assert all(s["next_sentence_label"] == -1 and len(s["masked_lm_ids"]) == 0 for s in ds)
    with pytest.raises(ValueError, match="without masks"):
        ds.collator(masking="static")


@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_nsp_with_static_masks_hand_made(tmp_path, fmt):
    rng = np.random.default_rng(1)
    batches = [_batch(rng, n, nsp=True, masked=True) for n in (9, 2, 14)]
    out = write_output(tmp_path, batches, fmt=fmt, objective="nsp", masking="static")
    by_index = {}
    for b in run(loader(out, batch_size=5, buffer=4)):
        for i, idx in enumerate(b["sample_index"].tolist()):
            by_index[idx] = (b["input_ids"][i], b["labels"][i], int(b["next_sentence_label"][i]))
    flat = InstanceBatch.concat(batches)
    for idx, (ids, labels, nsp) in by_index.items():
        row = flat.row(idx)
        n = len(row["input_ids"])
        assert ids[:n].tolist() == row["input_ids"]
        assert torch.nonzero(labels != -100).squeeze(1).tolist() == row["masked_lm_positions"]
        assert labels[labels != -100].tolist() == row["masked_lm_ids"]
        assert nsp == row["next_sentence_label"]
    assert len(by_index) == 25


def test_reads_through_a_non_local_filesystem(parquet_out, tfrecord_out):
    fsspec = pytest.importorskip("fsspec")
    mem = fsspec.filesystem("memory")
    for o, name in ((parquet_out, "pq"), (tfrecord_out, "tf")):
        mem.put(o, f"/loader-test/{name}", recursive=True)
        url = f"memory://loader-test/{name}"
        local = indices(run(loader(o, world=2, rank=1, workers=1)))
        remote = indices(run(loader(url, world=2, rank=1, workers=1)))
        assert remote == local


def test_windows_bound_what_is_read(parquet_out, monkeypatch):
    """A worker reads each of its rows once, and only rows of its own windows."""
    from mlm_pipeline.torch.manifest import ShardRowReader

    reads = Counter()
    original = ShardRowReader.read

    def counting(self, shard, start, stop):
        reads.update((shard, r) for r in range(start, stop))
        return original(self, shard, start, stop)

    monkeypatch.setattr(ShardRowReader, "read", counting)
    ds = MLMDataset(parquet_out, seed=5, shuffle_buffer=64, rank=1, world_size=3)
    n = sum(1 for _ in ds)
    assert len(reads) == n and set(reads.values()) == {1}
    # resumed near the end: only the last window(s) are read again
    reads.clear()
    ds2 = MLMDataset(parquet_out, seed=5, shuffle_buffer=64, rank=1, world_size=3)
    ds2.load_state_dict(ds.state_dict(batches=n // 8 - 1, batch_size=8))
    with warnings.catch_warnings():
        rest = sum(1 for _ in ds2)
    assert rest == n - (n // 8 - 1) * 8
    assert len(reads) <= 2 * 64


def test_tokenizer_must_be_the_one_that_prepared_the_shards(parquet_out, tmp_path, monkeypatch):
    prepared = load_prepared(parquet_out)
    assert prepared.tokenizer_fingerprint
    assert prepared.tokenizer().vocab_size == 30522
    with pytest.raises(ValueError, match="not the one that prepared"):
        prepared.tokenizer(do_lower_case=False)  # another normaliser: another tokenizer
    manifest = json.loads(open(f"{parquet_out}/manifest.json").read())
    manifest["config"]["tokenizer"] = "sample/bert-base-uncased-vocab.txt"
    (tmp_path / "manifest.json").write_text(json.dumps(manifest))
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ValueError, match="relative to where prepare ran"):
        load_prepared(str(tmp_path)).tokenizer()


def test_persistent_dataloader_workers_are_refused_on_their_second_pass(parquet_out):
    """Persistent workers keep their copy of the dataset: set_epoch never reaches them, and the
    second epoch would repeat the first one's order and masks. That pass fails, saying why."""
    import torch

    ds = MLMDataset(parquet_out, shuffle_buffer=64)
    dl = torch.utils.data.DataLoader(ds, batch_size=64, collate_fn=ds.collator(), num_workers=1,
                                     persistent_workers=True)
    first = sum(len(b["input_ids"]) for b in dl)
    assert first == ds.total
    ds.set_epoch(1)
    with pytest.raises(RuntimeError, match="persistent_workers=False"):
        next(iter(dl))
    # fresh workers each pass (the default) see every epoch
    dl = torch.utils.data.DataLoader(ds, batch_size=64, collate_fn=ds.collator(), num_workers=1)
    assert sum(len(b["input_ids"]) for b in dl) == ds.total

    class TwoEpochs(torch.utils.data.IterableDataset):
        """Epochs run inside the worker, set_epoch on the worker's own copy: allowed."""

        def __iter__(self):
            for epoch in range(2):
                ds.set_epoch(epoch)
                yield from ds

    samples = list(torch.utils.data.DataLoader(TwoEpochs(), batch_size=None, num_workers=1))
    assert len(samples) == 2 * ds.total and [s["epoch"] for s in samples[:: ds.total]] == [0, 1]


def _sample_indices(samples):
    return [int(s["index"]) for s in samples]


def _ddp_rank_reads(rank: int, out: str, store: str, record: str) -> None:
    """One of two gloo ranks: the dataset without rank arguments, one DataLoader worker started by
    spawn (the default on macOS, and on Linux from Python 3.14)."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{store}", rank=rank, world_size=2)
    try:
        dataset = MLMDataset(out, seed=0, shuffle_buffer=64)
        dl = MLMDataLoader(dataset, batch_size=8, collate_fn=_sample_indices, num_workers=1,
                           multiprocessing_context="spawn")
        seen = [i for batch in dl for i in batch]
        with open(f"{record}.{rank}", "w") as f:
            json.dump({"len": len(dataset), "seen": seen}, f)
    finally:
        dist.destroy_process_group()


def test_spawned_workers_of_ddp_ranks_read_their_rank_only(parquet_out, tmp_path):
    """Rank and world size come from torch.distributed in the training process; a worker started
    by spawn has no process group, so it must get them with the dataset: each rank reads its own
    half of the epoch, not the whole epoch."""
    import torch.multiprocessing as mp

    record = tmp_path / "rank"
    mp.spawn(_ddp_rank_reads, args=(str(parquet_out), str(tmp_path / "store"), str(record)), nprocs=2, join=True)
    ranks = [json.loads(record.with_name(f"rank.{r}").read_text()) for r in (0, 1)]
    total = load_prepared(parquet_out).total
    assert [len(r["seen"]) for r in ranks] == [r["len"] for r in ranks]
    assert sum(len(r["seen"]) for r in ranks) == total
    assert not set(ranks[0]["seen"]) & set(ranks[1]["seen"])
    # copied before any process group exists (a dataset handed to mp.spawn): resolved where it lands
    import pickle

    copy = pickle.loads(pickle.dumps(MLMDataset(parquet_out, seed=0)))
    assert copy._rank is None and copy._world_size is None


@pytest.mark.parametrize("workers", [0, 2])
def test_set_epoch_after_a_partial_pass_starts_that_epoch_whole(parquet_out, workers):
    """The DDP idiom ``dataset.set_epoch(e)`` at each epoch's start, with the loop leaving epoch 0
    after 10 batches (a step limit, a break): epoch 1 is whole, not short of those 10 batches,
    and the epochs run are the ones set, with the state saying so."""
    dataset = MLMDataset(parquet_out, seed=0, shuffle_buffer=64)
    dl = MLMDataLoader(dataset, batch_size=8, collate_fn=_sample_indices, num_workers=workers)
    seen = {}
    for epoch in range(3):
        dataset.set_epoch(epoch)
        seen[epoch] = []
        for i, batch in enumerate(dl):
            seen[epoch] += batch
            if epoch == 0 and i == 9:
                break
        assert dataset.epoch == epoch
    assert len(seen[0]) == 80
    assert sorted(seen[1]) == sorted(seen[2]) == list(range(dataset.total))
    assert dl.state_dict() == dataset.state_dict(epoch_complete=True)
    dataset.set_epoch(5)  # after a whole pass too: the state is epoch 5's start
    assert dl.state_dict()["epoch"] == 5 and dl.remaining() == len(dl)
