"""Helpers of the loader tests: prepared and hand-made outputs, iteration."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np

REPO = Path(__file__).resolve().parents[2]
VOCAB = REPO / "sample" / "bert-base-uncased-vocab.txt"
WIKITEXT = REPO / "sample" / "wikitext2-train-1MB.txt"


def prepare_output(out: Path, *, fmt: str, max_seq_length: int = 128) -> str:
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare

    config = PrepareConfig(
        inputs=[str(WIKITEXT)], output=str(out), tokenizer=str(VOCAB), format=fmt, workers=1,
        progress=False, split_bytes=200_000, max_instances_per_shard=333, max_seq_length=max_seq_length,
    )
    run_prepare(config)
    return str(out)


def prepare_tiny_output(out: Path) -> str:
    """139 unmasked instances of 32 tokens from the first 25 KB of WikiText-2: an epoch of 14 batches
    of 10, for training tests that cross epochs in a few steps."""
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare

    text = out.parent / f"{out.name}-input.txt"
    lines, size = [], 0
    with open(WIKITEXT, encoding="utf-8") as f:
        for line in f:
            if size >= 25_000:
                break
            lines.append(line)
            size += len(line.encode())
    text.write_text("".join(lines), encoding="utf-8")
    config = PrepareConfig(
        inputs=[str(text)], output=str(out), tokenizer=str(VOCAB), format="parquet", workers=1, progress=False,
        max_seq_length=32, masking="none", input_format="wikitext",
    )
    run_prepare(config)
    return str(out)


def write_output(out: Path, batches: list, *, fmt: str, objective: str, masking: str,
                 max_seq_length: int = 128, max_predictions: int = 20) -> str:
    """A hand-made prepared output: one shard per batch (empty batches give empty shards)."""
    from mlm_pipeline.formats.sink import ShardSink

    shards = []
    for i, batch in enumerate(batches):
        sink = ShardSink(str(out), f"{i:05d}", fmt=fmt, max_instances_per_shard=10**9,
                         max_seq_length=max_seq_length, max_predictions=max_predictions)
        sink.write(batch)
        written = sink.close()
        shards.extend(written)
    manifest = {
        "format": fmt, "objective": objective, "masking": masking,
        "config": {"max_seq_length": max_seq_length, "max_predictions_per_seq": max_predictions,
                   "tokenizer": str(VOCAB), "do_lower_case": True},
        "shards": shards,
    }
    (out / "manifest.json").write_text(json.dumps(manifest))
    return str(out)


def loader(out, *, rank=0, world=1, workers=0, batch_size=16, seed=3, buffer=100, pad=False, masking="auto", **kw):
    from mlm_pipeline.torch import MLMDataLoader, MLMDataset

    ds = MLMDataset(out, seed=seed, shuffle_buffer=buffer, rank=rank, world_size=world, pad_ranks=pad)
    coll = ds.collator(masking=masking, sample_info=True, **kw)
    return MLMDataLoader(ds, batch_size=batch_size, collate_fn=coll, num_workers=workers)


def run(dl, stop: int | None = None) -> list[dict]:
    """Batches of one pass (the first ``stop`` only, if given)."""
    out = []
    for batch in dl:
        out.append(batch)
        if stop is not None and len(out) == stop:
            break
    return out


def indices(batches) -> list[int]:
    return [i for b in batches for i in b["sample_index"].tolist()]


def shard_rows(out: str) -> dict[int, np.ndarray]:
    """Manifest index -> input_ids, read directly with the pipeline's shard readers."""
    from mlm_pipeline.inspect import read_shard
    from mlm_pipeline.torch import load_prepared

    rows, base = {}, 0
    for shard in load_prepared(out).shards:
        batch = read_shard(shard.url)
        for i in range(len(batch)):
            rows[base + i] = batch.input_ids[batch.offsets[i]:batch.offsets[i + 1]]
        base += len(batch)
    return rows


def assert_same_batches(a: list[dict], b: list[dict]) -> None:
    """The same batches: same keys, equal tensors (samples, order, masks, batch boundaries)."""
    import torch

    assert len(a) == len(b)
    for x, y in zip(a, b):
        assert x.keys() == y.keys()
        for key in x:
            assert torch.equal(x[key], y[key]), key
