"""``--format mds`` read by mosaicml-streaming itself: ``StreamingDataset`` over one and two ranks,
the raw shard readers ModernBERT's ``NoStreamingDataset`` uses, zstd shards, and a tiny BERT
trained from ``StreamingDataset`` through a torch ``DataLoader``.

Every comparison is against the Parquet output of the same settings, whose rows are numbered the
way MDS's ``id`` column numbers them: ``TASK-N``, the N-th instance of task TASK.

``import streaming`` imports its image datasets (``streaming.vision``), which import torchvision;
PyPI's torchvision is a CUDA build that cannot load beside PyTorch's CPU wheel. Where no working
torchvision is installed, :func:`import_streaming` leaves that subpackage out (nothing here reads
images); the rest of streaming is the real library.
"""

from __future__ import annotations

import functools
import hashlib
import io
import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.formats import OutputFormat, get_output_format
from mlm_pipeline.formats import mds
from mlm_pipeline.formats.sink import ShardSink
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets
from mlm_pipeline.pipeline import run_prepare
from mlm_pipeline.verify import verify_output

STREAMING_IMPORT = """
import sys, types
try:
    import torchvision  # noqa: F401  (streaming's image datasets need it)
except Exception:  # absent, or PyPI's CUDA build beside a CPU torch
    sys.modules.setdefault("streaming.vision", types.ModuleType("streaming.vision"))
import streaming
"""


def import_streaming():
    exec(STREAMING_IMPORT, {})
    import streaming

    return streaming


def _prepare(out: Path, fmt: str, **settings) -> dict:
    values = dict(inputs=[str(SAMPLE_TEXT), str(WIKITEXT)], output=str(out), tokenizer=str(VOCAB), format=fmt,
                  workers=1, progress=False, split_bytes=300_000, max_instances_per_shard=700)
    values.update(settings)
    return run_prepare(PrepareConfig(**values))


@functools.lru_cache(maxsize=None)
def _run(root: str, fmt: str, **settings) -> dict:
    """One run per (format, settings) for the module (runs are the slow part)."""
    return _prepare(Path(root) / "-".join([fmt, *(f"{k}={v}" for k, v in sorted(settings.items()))]), fmt, **settings)


@pytest.fixture(scope="module")
def root(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("mds-runs"))


def _out(root: str, fmt: str, **settings) -> Path:
    manifest = _run(root, fmt, **settings)
    return Path(root) / "-".join([fmt, *(f"{k}={v}" for k, v in sorted(settings.items()))]), manifest


def parquet_rows(out: Path, manifest: dict) -> dict[str, dict]:
    """The Parquet output's instances by MDS id (``TASK-N``), as plain lists."""
    fmt = get_output_format(manifest["format"])
    rows, counts = {}, {}
    for shard in manifest["shards"]:
        task = Path(shard["path"]).name.split("-")[1]
        batch = fmt.read_shard(str(out / shard["path"]))
        for i in range(len(batch)):
            n = counts.get(task, 0)
            rows[f"{task}-{n}"] = batch.row(i)
            counts[task] = n + 1
    return rows


def assert_same_instance(sample: dict, row: dict) -> None:
    assert sample["input_ids"].tolist() == row["input_ids"]
    assert sample["segment_ids"].tolist() == row["segment_ids"] if "segment_ids" in sample else not any(row["segment_ids"])
    for name in ("masked_lm_positions", "masked_lm_ids"):
        if row[name]:
            assert sample[name].tolist() == row[name], name
        else:
            assert name not in sample, name
    if "next_sentence_label" in row:
        assert int(sample["next_sentence_labels"]) == row["next_sentence_label"]
    else:
        assert "next_sentence_labels" not in sample
    if "token_boundary" in row:
        assert sample["token_boundary"].tolist() == row["token_boundary"]


# --------------------------------------------------------------------------------------------
# streaming reads every instance once, as the Parquet output holds it


@pytest.mark.parametrize("objective", ["nsp", "sop"])
def test_streaming_dataset_yields_every_instance_once_as_parquet_holds_it(root, objective):
    streaming = import_streaming()
    out, manifest = _out(root, "mds", objective=objective)
    pq_out, pq_manifest = _out(root, "parquet", objective=objective)
    expected = parquet_rows(pq_out, pq_manifest)
    dataset = streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    samples = list(dataset)
    ids = [s["id"] for s in samples]
    assert len(ids) == len(set(ids)) == len(expected) == manifest["totals"]["instances"] > 1000
    assert set(ids) == set(expected)
    for sample in samples:
        assert_same_instance(sample, expected[sample["id"]])
    assert samples[0]["input_ids"].dtype == np.uint16  # (BERT's 30,522 ids)
    # our own reader reads the same instances
    ours = InstanceBatch.concat([mds.read_mds(str(out / s["path"])) for s in manifest["shards"]])
    assert [ours.row(i) for i in range(len(ours))] == [expected[i] for i in ids]


def test_shards_are_byte_for_byte_what_streamings_writer_writes(root, tmp_path):
    """The same samples through streaming's own ``MDSWriter`` (with our columns, hashes and size
    limit) give the same shard file and the same index entry."""
    streaming = import_streaming()
    out, manifest = _out(root, "mds", objective="nsp")
    dataset = streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    ours = json.loads((out / "index.json").read_bytes())
    first = 0
    for k, shard in enumerate(manifest["shards"][:3]):
        entry = ours["shards"][k]
        columns = dict(zip(entry["column_names"], entry["column_encodings"]))
        with streaming.MDSWriter(out=str(tmp_path / str(k)), columns=columns, hashes=["sha256"],
                                 size_limit=entry["size_limit"]) as writer:
            for i in range(first, first + shard["instances"]):
                writer.write(dataset[i])
        first += shard["instances"]
        assert (tmp_path / str(k) / "shard.00000.mds").read_bytes() == (out / shard["path"]).read_bytes()
        theirs = json.loads((tmp_path / str(k) / "index.json").read_bytes())["shards"][0]
        assert theirs["raw_data"].pop("basename") == "shard.00000.mds"
        assert entry["raw_data"].pop("basename") == shard["path"]
        assert theirs == entry


def test_index_lists_every_shard_in_the_manifests_order(root):
    out, manifest = _out(root, "mds", objective="nsp")
    index = json.loads((out / "index.json").read_bytes())
    assert index["version"] == 2
    assert [s["raw_data"]["basename"] for s in index["shards"]] == [s["path"] for s in manifest["shards"]]
    assert [s["samples"] for s in index["shards"]] == [s["instances"] for s in manifest["shards"]]
    for entry, shard in zip(index["shards"], manifest["shards"]):
        data = (out / shard["path"]).read_bytes()
        assert entry["raw_data"]["bytes"] == len(data) and entry["zip_data"] is None
        assert entry["raw_data"]["hashes"] == {"sha256": hashlib.sha256(data).hexdigest()}
        assert entry["column_names"] == ["id", "input_ids", "masked_lm_ids", "masked_lm_positions",
                                         "next_sentence_labels", "segment_ids"]
        assert entry["column_encodings"] == ["str", "ndarray:uint16", "ndarray:uint16", "ndarray:uint16", "uint8",
                                             "ndarray:uint8"]


RANK = STREAMING_IMPORT + textwrap.dedent("""
    import json, os
    dataset = streaming.StreamingDataset(local=os.environ["MDS_OUT"], shuffle=False, batch_size=4)
    rows = [[s["id"], s["input_ids"].tolist()] for s in dataset]
    with open(os.environ["RANK_FILE"], "w") as f:
        json.dump(rows, f)
""")


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.mark.slow
def test_two_ranks_share_the_instances_between_them(root, tmp_path):
    """Two ranks on one node, as torchrun starts them: only the environment (RANK, WORLD_SIZE,
    LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR=127.0.0.1); streaming itself then starts
    torch.distributed (gloo on CPU) when WORLD_SIZE > 1, so ranks cannot be simulated in one
    process. Each yields its part; together every instance, the padding streaming adds to even
    them out aside."""
    out, manifest = _out(root, "mds", objective="nsp")
    expected = parquet_rows(*_out(root, "parquet", objective="nsp"))
    port = str(_free_port())
    procs = []
    for rank in range(2):
        env = {**os.environ, "RANK": str(rank), "WORLD_SIZE": "2", "LOCAL_RANK": str(rank), "LOCAL_WORLD_SIZE": "2",
               "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "MDS_OUT": str(out),
               "RANK_FILE": str(tmp_path / f"rank{rank}.json")}
        procs.append(subprocess.Popen([sys.executable, "-c", RANK], env=env, stderr=subprocess.PIPE, text=True))
    try:
        for proc in procs:
            _, err = proc.communicate(timeout=120)
            assert proc.returncode == 0, err[-3000:]
    finally:
        for proc in procs:
            if proc.poll() is None:
                proc.kill()
                proc.wait(10)
    parts = [json.loads((tmp_path / f"rank{rank}.json").read_text()) for rank in range(2)]
    ids = [[row[0] for row in part] for part in parts]
    total = manifest["totals"]["instances"]
    assert len(ids[0]) == len(ids[1]) >= total // 2
    assert set(ids[0]) | set(ids[1]) == set(expected)
    padding = len(ids[0]) + len(ids[1]) - total
    assert 0 <= padding < 2 * 4  # (streaming repeats a few samples so that every rank gets whole batches)
    assert len(set(ids[0]) & set(ids[1])) <= padding
    for part in parts:
        for sample_id, input_ids in part:
            assert input_ids == expected[sample_id]["input_ids"]


# --------------------------------------------------------------------------------------------
# tokens only, read as ModernBERT's NoStreamingDataset reads uncompressed MDS


def test_tokens_output_reads_as_modernberts_no_streaming_dataset_reads_it(root):
    """``NoStreamingDataset`` opens ``LOCAL/SPLIT/index.json``, a reader per shard entry
    (``reader_from_json``), checks each raw file exists, validates it, and maps a global index
    to (shard, row) with streaming's ``Spanner``. Here the same calls, by streaming's classes."""
    import_streaming()
    from streaming.base.format import reader_from_json
    from streaming.base.spanner import Spanner

    out, manifest = _out(root, "mds", objective="tokens", masking="none")
    pq_out, pq_manifest = _out(root, "parquet", objective="tokens", masking="none")
    expected = parquet_rows(pq_out, pq_manifest)
    local, split = str(out.parent), out.name
    index = json.loads(Path(local, split, "index.json").read_text())
    shards = []
    for info in index["shards"]:
        shard = reader_from_json(local, split, info)
        assert os.path.isfile(os.path.join(shard.dirname, shard.split, shard.raw_data.basename))
        shard.validate(True)
        shards.append(shard)
    spanner = Spanner(np.array([shard.samples for shard in shards], np.int64))
    total = int(sum(shard.samples for shard in shards))
    assert total == len(expected) == manifest["totals"]["instances"]
    seen = set()
    for index_ in range(total):
        shard_id, row = spanner[index_]
        sample = shards[shard_id][row]
        assert sorted(sample) == ["id", "input_ids"]  # (it takes every array column for token ids)
        assert sample["input_ids"].dtype == np.uint16
        assert sample["input_ids"].tolist() == expected[sample["id"]]["input_ids"]
        seen.add(sample["id"])
    assert len(seen) == total


# --------------------------------------------------------------------------------------------
# zstd


def test_zstd_shards_read_back_the_same_instances(root):
    streaming = import_streaming()
    out, manifest = _out(root, "mds", objective="nsp", mds_compression="zstd")
    plain, plain_manifest = _out(root, "mds", objective="nsp")
    assert manifest["config"]["mds_compression"] == "zstd"
    assert manifest["output_fingerprint"] != plain_manifest["output_fingerprint"]
    index = json.loads((out / "index.json").read_bytes())
    plain_index = json.loads((plain / "index.json").read_bytes())
    for entry, shard, plain_shard in zip(index["shards"], manifest["shards"], plain_manifest["shards"]):
        data = (out / shard["path"]).read_bytes()
        raw = (plain / plain_shard["path"]).read_bytes()
        assert entry["compression"] == "zstd" and data[:4] == b"\x28\xb5\x2f\xfd" and len(data) < len(raw)
        assert entry["zip_data"] == {"basename": shard["path"], "bytes": len(data),
                                     "hashes": {"sha256": hashlib.sha256(data).hexdigest()}}
        inside = mds.decompress(data)
        digest = hashlib.sha256(inside).hexdigest()
        assert entry["raw_data"] == {"basename": f"{shard['path']}.{digest[:16]}.raw", "bytes": len(inside),
                                     "hashes": {"sha256": digest}}
        # the samples inside are the uncompressed shard's (the header differs by the compression it names)
        assert inside[mds.parse_columns(inside)[1][0]:] == raw[mds.parse_columns(raw)[1][0]:]
        np.testing.assert_array_equal(mds.read_mds(str(out / shard["path"])).input_ids,
                                      mds.read_mds(str(plain / plain_shard["path"])).input_ids)
    assert [e["samples"] for e in index["shards"]] == [e["samples"] for e in plain_index["shards"]]
    samples = list(streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=1))
    plain_samples = list(streaming.StreamingDataset(local=str(plain), shuffle=False, batch_size=1))
    assert [s["id"] for s in samples] == [s["id"] for s in plain_samples]
    for a, b in zip(samples, plain_samples):
        assert a["input_ids"].tolist() == b["input_ids"].tolist()
        assert a["masked_lm_ids"].tolist() == b["masked_lm_ids"].tolist()


def test_mds_compression_needs_format_mds(tmp_path):
    with pytest.raises(ValueError, match="--mds-compression compresses MDS shards; it needs --format mds"):
        PrepareConfig(inputs=[str(SAMPLE_TEXT)], output=str(tmp_path / "o"), tokenizer=str(VOCAB),
                      format="parquet", mds_compression="zstd")


@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_row_ranges_read_as_the_whole_shard_holds_them(root, compression):
    out, manifest = _out(root, "mds", objective="sop", **({} if compression == "none" else {"mds_compression": "zstd"}))
    fmt = get_output_format("mds")
    rng = np.random.default_rng(0)
    for shard in manifest["shards"][:3]:
        url = str(out / shard["path"])
        whole = fmt.read(url)
        rows = fmt.rows(url)
        n = shard["instances"]
        ranges = [(0, n), (0, 1), (n - 1, n)] + [tuple(sorted(rng.integers(0, n + 1, 2))) for _ in range(5)]
        for start, stop in ranges:
            part = rows.read(int(start), int(stop))
            expected = whole.slice(int(start), int(stop))
            for name in ("input_ids", "segment_ids", "offsets", "masked_lm_positions", "masked_lm_ids",
                         "masked_offsets", "next_sentence_labels", "token_boundary"):
                np.testing.assert_array_equal(getattr(part, name), getattr(expected, name), err_msg=name)
        with pytest.raises(ValueError, match=f"has {n} rows, rows up to {n + 1} requested"):
            rows.read(0, n + 1)
        rows.close()


# --------------------------------------------------------------------------------------------
# shard size, document starts and languages, uint32 ids


def _batch(lengths, *, documents=None, languages=None, vocab=30522, seed=0) -> InstanceBatch:
    rng = np.random.default_rng(seed)
    offsets = lengths_to_offsets(np.array(lengths))
    n_tok = int(offsets[-1])
    masked = np.array([max(1, n // 7) for n in lengths])
    moff = lengths_to_offsets(masked)
    positions = np.concatenate([np.sort(rng.choice(n, m, replace=False)) for n, m in zip(lengths, masked)])
    doc_starts = doc_offsets = None
    if documents is not None:
        doc_starts = np.concatenate([np.array(d, np.int32) for d in documents])
        doc_offsets = lengths_to_offsets(np.array([len(d) for d in documents]))
    return InstanceBatch(
        input_ids=rng.integers(0, vocab, n_tok).astype(np.int32),
        segment_ids=(rng.random(n_tok) < 0.5).astype(np.int8),
        offsets=offsets,
        masked_lm_positions=positions.astype(np.int32),
        masked_lm_ids=rng.integers(0, vocab, int(moff[-1])).astype(np.int32),
        masked_offsets=moff,
        next_sentence_labels=None,
        document_starts=doc_starts,
        document_offsets=doc_offsets,
        languages=None if languages is None else np.array(languages),
    )


def _sink(out: Path, size_limit: int, **writer) -> ShardSink:
    small = OutputFormat(name="mds", open_writer=functools.partial(mds.MDSShardWriter, size_limit=size_limit),
                         read_shard=mds.read_mds)
    return ShardSink(str(out), "00007", fmt=small, max_instances_per_shard=1000, max_seq_length=512,
                     max_predictions=80, vocab_size=30522, writer_options=writer)


def test_shards_are_cut_at_the_size_limit_and_an_instance_over_it_is_refused(tmp_path):
    batch = _batch([300, 20, 511, 7, 260, 90] * 20)
    sink = _sink(tmp_path, 10_000)
    sink.write(batch.slice(0, 50))
    sink.write(batch.slice(50, 120))
    shards = sink.close()
    assert len(shards) > 5 and sum(s["instances"] for s in shards) == 120
    sizes = [(tmp_path / s["path"]).stat().st_size for s in shards]
    assert max(sizes) <= 10_000
    # each shard but the last was full: its next instance would not have fitted
    read = [mds.read_mds(str(tmp_path / s["path"])) for s in shards]
    got = InstanceBatch.concat(read)
    np.testing.assert_array_equal(got.input_ids, batch.input_ids)
    np.testing.assert_array_equal(got.masked_lm_positions, batch.masked_lm_positions)
    ids = [i for s in shards for i in mds.read_ids(str(tmp_path / s["path"]))]
    assert ids == [f"00007-{i}" for i in range(120)]
    with pytest.raises(ValueError, match=r"an instance takes 1,\d+ bytes of MDS data, more than a shard's limit"):
        _sink(tmp_path / "tiny", 1000).write(_batch([511]))
    with pytest.raises(ValueError, match="below 4 GiB"):
        mds.MDSShardWriter(None, size_limit=1 << 32)


def test_document_starts_languages_and_large_vocabularies_round_trip(tmp_path):
    streaming = import_streaming()
    lengths = [12, 300, 70000 // 1000, 9]
    documents = [[0, 5], [0], [0, 20, 40], [0]]
    batch = _batch(lengths, documents=documents, languages=["en", "zh", "sw", "en"], vocab=250_002)
    sink = ShardSink(str(tmp_path), "00001", fmt="mds", max_instances_per_shard=10, max_seq_length=512,
                     max_predictions=80, vocab_size=250_002)
    sink.write(batch)
    [shard] = sink.close()
    got = mds.read_mds(str(tmp_path / shard["path"]))
    for name in ("input_ids", "segment_ids", "offsets", "masked_lm_positions", "masked_lm_ids", "document_starts",
                 "document_offsets"):
        np.testing.assert_array_equal(getattr(got, name), getattr(batch, name), err_msg=name)
    assert got.languages.tolist() == ["en", "zh", "sw", "en"]
    manifest = {"shards": [shard]}
    (tmp_path / "index.json").write_bytes(mds.run_files(manifest)["index.json"])
    samples = list(streaming.StreamingDataset(local=str(tmp_path), shuffle=False, batch_size=1))
    assert [s["language"] for s in samples] == ["en", "zh", "sw", "en"]
    assert [s["document_starts"].tolist() for s in samples] == documents
    assert samples[1]["input_ids"].dtype == np.uint32
    assert samples[1]["input_ids"].tolist() == batch.row(1)["input_ids"]
    # the sizes that cut shards (from lengths alone) are those written, row by row
    writer = mds.MDSShardWriter(io.BytesIO(), max_seq_length=512, vocab_size=250_002, task_id="00001",
                                first_row=999_990)
    writer.room(batch)
    data = (tmp_path / shard["path"]).read_bytes()
    _, offsets, _ = mds.parse_columns(data)
    expected = np.diff(offsets) + 5  # ids 00001-999990.. take five digits more than 00001-0..3
    np.testing.assert_array_equal(writer._sample_sizes(batch), expected)


# --------------------------------------------------------------------------------------------
# the run's guarantees: worker count, verify, resume


def test_same_bytes_with_one_and_two_workers(root, tmp_path):
    out, manifest = _out(root, "mds", objective="nsp")
    two = _prepare(tmp_path / "two", "mds", objective="nsp", workers=2)
    assert [(s["path"], s["sha256"]) for s in two["shards"]] == [(s["path"], s["sha256"]) for s in manifest["shards"]]
    assert (tmp_path / "two" / "index.json").read_bytes() == (out / "index.json").read_bytes()


def test_verify_catches_a_corrupted_mds_shard(tmp_path):
    manifest = _prepare(tmp_path / "out", "mds")
    assert verify_output(str(tmp_path / "out")).ok
    path = tmp_path / "out" / manifest["shards"][1]["path"]
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01  # one bit of one token
    path.write_bytes(bytes(data))
    result = verify_output(str(tmp_path / "out"))
    assert not result.ok and [p.path for p in result.problems] == [manifest["shards"][1]["path"]]
    # a truncated shard: the reader names it
    path.write_bytes(bytes(data[: len(data) // 3]))
    from mlm_pipeline.errors import ShardDamaged

    with pytest.raises(ShardDamaged, match="offsets"):
        get_output_format("mds").read(str(path))


def test_resume_after_kill_gives_the_clean_runs_shards(tmp_path):
    from faults.helpers import SOURCES, assert_as_clean, prepare_args, run_config

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for src in SOURCES[:2]:
        (corpus / src.name).write_bytes(src.read_bytes() * 2)
    clean = run_prepare(run_config(corpus, tmp_path / "clean", fmt="mds"), show_progress=False)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, out, fmt="mds", workers=1)]
    proc = subprocess.Popen(args, stdout=subprocess.PIPE, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while not (out / "_tasks").exists() or not any((out / "_tasks").iterdir()):
            assert proc.poll() is None and time.monotonic() < deadline, "prepare ended before its first task was done"
            time.sleep(0.01)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(10)
    assert not (out / "manifest.json").exists() and not (out / "index.json").exists()
    done = subprocess.run(args, capture_output=True, text=True)
    assert done.returncode == 0, done.stderr
    manifest = assert_as_clean(out, clean)
    assert (out / "index.json").read_bytes() == (tmp_path / "clean" / "index.json").read_bytes()
    assert len(manifest["shards"]) == len(json.loads((out / "index.json").read_bytes())["shards"])


@pytest.mark.torch
@pytest.mark.parametrize("compression", ["none", "zstd"])
def test_our_loader_reads_mds_as_it_reads_parquet(root, compression):
    """MLMDataset picks the reader from the manifest's format: the same samples in the same order."""
    pytest.importorskip("torch")
    from mlm_pipeline.torch.dataset import MLMDataset

    out, _ = _out(root, "mds", objective="nsp", **({} if compression == "none" else {"mds_compression": "zstd"}))
    pq_out, _ = _out(root, "parquet", objective="nsp")
    ours = list(MLMDataset(str(out), shuffle=True, seed=3))
    theirs = list(MLMDataset(str(pq_out), shuffle=True, seed=3))
    assert len(ours) == len(theirs) > 1000
    for a, b in zip(ours, theirs):
        for name in ("input_ids", "token_type_ids", "masked_lm_positions", "masked_lm_ids"):
            np.testing.assert_array_equal(a[name], b[name], err_msg=name)
        assert a["next_sentence_label"] == b["next_sentence_label"]


# --------------------------------------------------------------------------------------------
# a tiny BERT learns from StreamingDataset through a torch DataLoader


@pytest.mark.torch
@pytest.mark.slow
def test_a_tiny_bert_trains_from_streaming_dataset(root):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    streaming = import_streaming()
    out, _ = _out(root, "mds", objective="nsp")

    def collate(samples: list[dict]) -> dict:
        width = max(len(s["input_ids"]) for s in samples)
        ids = torch.zeros(len(samples), width, dtype=torch.long)
        mask = torch.zeros_like(ids)
        labels = torch.full_like(ids, -100)
        for i, s in enumerate(samples):
            n = len(s["input_ids"])
            ids[i, :n] = torch.from_numpy(s["input_ids"].astype(np.int64))
            mask[i, :n] = 1
            labels[i, torch.from_numpy(s["masked_lm_positions"].astype(np.int64))] = torch.from_numpy(
                s["masked_lm_ids"].astype(np.int64))
        return {"input_ids": ids, "attention_mask": mask, "labels": labels}

    torch.manual_seed(0)
    dataset = streaming.StreamingDataset(local=str(out), shuffle=True, shuffle_seed=1, batch_size=8)
    loader = torch.utils.data.DataLoader(dataset, batch_size=8, collate_fn=collate)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128)
    model = transformers.BertForMaskedLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=5e-3)
    losses = []
    for step, batch in enumerate(loader):
        loss = model(**batch).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
        if step == 24:
            break
    assert len(losses) == 25
    assert np.mean(losses[-5:]) < np.mean(losses[:5]) - 1.0, losses


# --------------------------------------------------------------------------------------------
# output bytes are a contract (as tests/test_shard_digests.py pins TFRecord's and Parquet's)

MDS_DIGESTS = Path(__file__).resolve().parents[1] / "data" / "mds_shard_digests.json"
MDS_CASES = [dict(objective="nsp", format="mds", reference=False, do_whole_word_mask=False),
             dict(objective="tokens", format="mds", reference=False, do_whole_word_mask=False, dupe_factor=1)]


@pytest.mark.slow
@pytest.mark.parametrize("case", MDS_CASES, ids=lambda case: case["objective"])
def test_mds_shard_digests_unchanged(case, tmp_path):
    """The shard matrix's settings, MDS output: every shard's SHA-256 and index.json's.
    Regenerate (only for an intended change of output) with ``MLM_RECORD_DIGESTS=1``."""
    from test_shard_digests import case_id, run_case

    table = run_case(case, tmp_path / "out", 1)
    got = {"shards": table, "index.json": hashlib.sha256((tmp_path / "out" / "index.json").read_bytes()).hexdigest()}
    if os.environ.get("MLM_RECORD_DIGESTS"):
        recorded = json.loads(MDS_DIGESTS.read_text()) if MDS_DIGESTS.exists() else {}
        recorded[case_id(case)] = got
        MDS_DIGESTS.write_text(json.dumps(recorded, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(MDS_DIGESTS.read_text())[case_id(case)]
