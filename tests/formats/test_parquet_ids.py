"""Parquet ids as uint16 where the vocabulary fits (<= 65,536 entries) and uint32 where it does not.

A WordPiece vocabulary of 75,522 entries (bert-base-uncased's 30,522 and 45,000 generated words)
on text that uses the generated words: ids above 65,535 appear in ``input_ids`` and
``masked_lm_ids`` and come back exactly through Parquet (uint32), TFRecord (int64), the shard
readers, the torch loader and the collator. Parquet shards written with int32 ids (before) still
read, and a Parquet run started with int32 ids is not resumed by this version.
"""

from __future__ import annotations

import json
import random
import string
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from conftest import VOCAB, WIKITEXT

EXTRA = 45_000


def _word(i: int) -> str:
    letters = string.ascii_lowercase
    return "zq" + "".join(letters[(i // 26 ** j) % 26] for j in range(4))


@pytest.fixture(scope="module")
def big(tmp_path_factory) -> dict[str, Path]:
    """A vocab of 75,522 entries and 300 KB of WikiText-2 with every fourth word a generated one."""
    d = tmp_path_factory.mktemp("big-vocab")
    base = VOCAB.read_text(encoding="utf-8").splitlines()
    extra = [_word(i) for i in range(EXTRA)]
    assert not set(extra) & set(base)
    (d / "vocab.txt").write_text("\n".join(base + extra) + "\n", encoding="utf-8")
    draw = random.Random(5)
    lines = []
    for line in WIKITEXT.read_text(encoding="utf-8").splitlines()[:1500]:
        words = line.split()
        lines.append(" ".join(draw.choice(extra) if i % 4 == 3 else w for i, w in enumerate(words)))
    (d / "text.txt").write_text("\n".join(lines) + "\n", encoding="utf-8")
    return {"vocab": d / "vocab.txt", "text": d / "text.txt", "dir": d}


def _prepare(inp: Path, out: Path, vocab: Path, fmt: str, **settings) -> dict:
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    config = build_config({"inputs": [str(inp)], "output": str(out), "tokenizer": str(vocab), "format": fmt,
                           "workers": 1, "progress": False, "split_bytes": "128KiB", "max_seq_length": 64,
                           "masked_lm_prob": 0.3, "max_predictions_per_seq": 20, "random_seed": 3, **settings})
    return run_prepare(config, show_progress=False)


def _all(out: Path):
    from mlm_pipeline.inspect import read_shard
    from mlm_pipeline.instances.batch import InstanceBatch
    from mlm_pipeline.torch import load_prepared

    return InstanceBatch.concat([read_shard(s.url) for s in load_prepared(str(out)).shards])


@pytest.fixture(scope="module")
def big_outputs(big, tmp_path_factory) -> dict[str, Path]:
    outs = {}
    for fmt in ("parquet", "tfrecord"):
        outs[fmt] = tmp_path_factory.mktemp(fmt) / "out"
        _prepare(big["text"], outs[fmt], big["vocab"], fmt)
    return outs


def test_a_vocab_past_65536_writes_uint32_ids_that_round_trip(big_outputs):
    shards = sorted((big_outputs["parquet"] / "shards").iterdir())
    schema = pq.read_schema(shards[0])
    assert schema.field("input_ids").type == pa.list_(pa.uint32())
    assert schema.field("masked_lm_ids").type == pa.list_(pa.uint32())
    pq_batch, tf_batch = _all(big_outputs["parquet"]), _all(big_outputs["tfrecord"])
    assert int(pq_batch.input_ids.max()) > 65_535 and int(pq_batch.masked_lm_ids.max()) > 65_535
    assert np.count_nonzero(pq_batch.input_ids > 65_535) > 1000
    # the same instances and masks through both formats, id for id
    for name in ("input_ids", "offsets", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels"):
        np.testing.assert_array_equal(getattr(pq_batch, name), getattr(tf_batch, name), err_msg=name)
    # and as any Parquet reader sees them
    raw = np.concatenate([np.concatenate(pq.read_table(p).column("input_ids").to_numpy(zero_copy_only=False))
                          for p in shards])
    np.testing.assert_array_equal(raw, pq_batch.input_ids)


@pytest.mark.torch
def test_the_loader_and_collator_give_ids_past_65535(big, big_outputs):
    pytest.importorskip("torch")
    from mlm_pipeline.torch import MLMDataset

    tf_batch = _all(big_outputs["tfrecord"])
    rows = {i: tf_batch.input_ids[tf_batch.offsets[i]:tf_batch.offsets[i + 1]] for i in range(len(tf_batch))}
    ds = MLMDataset(str(big_outputs["parquet"]), shuffle=False)
    samples = list(ds)
    assert len(samples) == len(rows)
    for sample in samples:
        np.testing.assert_array_equal(sample["input_ids"], rows[sample["index"]])
    collate = ds.collator(tokenizer=str(big["vocab"]))
    batch = collate(samples[:64])
    labels = batch["labels"][batch["labels"] != -100]
    assert int(labels.max()) > 65_535 and int(batch["input_ids"].max()) > 65_535


def test_a_vocab_that_fits_writes_uint16_ids(tmp_path):
    out = tmp_path / "out"
    text = tmp_path / "t.txt"
    text.write_bytes(WIKITEXT.read_bytes()[:100_000])
    _prepare(text, out, VOCAB, "parquet")
    schema = pq.read_schema(next((out / "shards").iterdir()))
    assert schema.field("input_ids").type == pa.list_(pa.uint16())
    assert schema.field("masked_lm_ids").type == pa.list_(pa.uint16())
    tf = tmp_path / "tf"
    _prepare(text, tf, VOCAB, "tfrecord")
    np.testing.assert_array_equal(_all(out).input_ids, _all(tf).input_ids)


def _as_int32_ids(out: Path) -> None:
    """Rewrite every shard of ``out`` with int32 ids, as earlier versions wrote them (manifest updated)."""
    import hashlib

    from mlm_pipeline.formats.parquet import SCHEMA, WRITE_OPTIONS

    manifest_path = out / "manifest.json"
    manifest = json.loads(manifest_path.read_text())
    for shard in manifest["shards"]:
        path = out / shard["path"]
        table = pq.read_table(path)
        pq.write_table(table.cast(SCHEMA), path, **WRITE_OPTIONS)
        data = path.read_bytes()
        shard["sha256"], shard["bytes"] = hashlib.sha256(data).hexdigest(), len(data)
    manifest_path.write_text(json.dumps(manifest, indent=1))


@pytest.mark.torch
def test_shards_with_int32_ids_still_read(tmp_path):
    pytest.importorskip("torch")
    from mlm_pipeline.formats.parquet import FORMAT
    from mlm_pipeline.torch import MLMDataset

    out = tmp_path / "out"
    text = tmp_path / "t.txt"
    text.write_bytes(WIKITEXT.read_bytes()[:100_000])
    _prepare(text, out, VOCAB, "parquet")
    new = _all(out)
    new_samples = [s["input_ids"] for s in MLMDataset(str(out), shuffle=False)]
    _as_int32_ids(out)
    shard = next((out / "shards").iterdir())
    assert pq.read_schema(shard).field("input_ids").type == pa.list_(pa.int32())
    old = _all(out)
    for name in ("input_ids", "masked_lm_ids", "masked_lm_positions", "offsets"):
        np.testing.assert_array_equal(getattr(old, name), getattr(new, name), err_msg=name)
    rows = FORMAT.open_rows(str(shard))
    part = rows.read(3, 9)
    rows.close()
    np.testing.assert_array_equal(part.input_ids, new.slice(3, 9).input_ids)
    old_samples = [s["input_ids"] for s in MLMDataset(str(out), shuffle=False)]
    assert len(old_samples) == len(new_samples)
    for a, b in zip(old_samples, new_samples):
        np.testing.assert_array_equal(a, b)


def test_a_run_started_with_int32_ids_is_not_resumed(tmp_path):
    from mlm_pipeline.errors import OutputError

    text = tmp_path / "t.txt"
    text.write_bytes(WIKITEXT.read_bytes()[:300_000])
    out = tmp_path / "out"
    _prepare(text, out, VOCAB, "parquet")
    record_path = out / "_run.json"
    record = json.loads(record_path.read_text())
    assert record["shard_layout"] == 2
    _prepare(text, out, VOCAB, "parquet")  # the same version resumes (nothing left to do)
    del record["shard_layout"]  # as a version that wrote int32 ids recorded it
    record_path.write_text(json.dumps(record))
    with pytest.raises(OutputError, match="lays out parquet shards otherwise"):
        _prepare(text, out, VOCAB, "parquet")
