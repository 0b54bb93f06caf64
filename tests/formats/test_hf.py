"""The ``hf`` format, read by Hugging Face ``datasets`` itself: ``load_from_disk(OUT)`` opens a run
with typed features, every instance equal to the Parquet output of the same run; the Hub's way in
(the dataset card's ``configs``) reads the same rows; our own readers (inspect, report, verify,
the torch loader) read it, chosen by the manifest's format; same bytes for any worker count;
resume; a damaged shard is named."""

from __future__ import annotations

import hashlib
import json
import shutil

import numpy as np
import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT
from mlm_pipeline.config import build_config
from mlm_pipeline.formats import get_output_format, output_format_for_file, output_format_names
from mlm_pipeline.formats.hf import IGNORE, ROWS_PER_BATCH, HfShardWriter, read_hf, read_layout
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets
from mlm_pipeline.pipeline import run_prepare

datasets = pytest.importorskip("datasets")

SETTINGS = {"split_bytes": 300_000, "max_instances_per_shard": 400}


def _prepare(out, fmt: str, *, workers: int = 1, inputs=(SAMPLE_TEXT, WIKITEXT), **settings) -> dict:
    config = build_config({"inputs": [str(p) for p in inputs], "output": str(out), "tokenizer": str(VOCAB),
                           "format": fmt, "workers": workers, "progress": False, **SETTINGS, **settings})
    return run_prepare(config, show_progress=False)


def _all(out, manifest: dict) -> InstanceBatch:
    fmt = get_output_format(manifest["format"])
    return InstanceBatch.concat([fmt.read(str(out / s["path"])) for s in manifest["shards"]])


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """The same nsp run written as hf and as Parquet."""
    root = tmp_path_factory.mktemp("hf-runs")
    return {fmt: (root / fmt, _prepare(root / fmt, fmt)) for fmt in ("hf", "parquet")}


@pytest.fixture(autouse=True)
def _offline_datasets(tmp_path, monkeypatch):
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_DATASETS_CACHE", str(tmp_path / "hf-cache"))
    monkeypatch.setattr(datasets.config, "HF_DATASETS_CACHE", tmp_path / "hf-cache", raising=False)
    datasets.disable_progress_bars()


def _assert_rows_are(ds, batch: InstanceBatch) -> None:
    """Every row of the ``datasets`` dataset ``ds`` is ``batch``'s row, in order."""
    assert len(ds) == len(batch) > 0
    for i, row in enumerate(ds):
        want = batch.row(i)
        assert row["input_ids"] == want["input_ids"] and row["token_type_ids"] == want["segment_ids"], i
        labels = np.array(row["labels"])
        assert len(labels) == len(want["input_ids"])
        assert np.flatnonzero(labels != IGNORE).tolist() == want["masked_lm_positions"], i
        assert labels[labels != IGNORE].tolist() == want["masked_lm_ids"], i
        assert row["next_sentence_label"] == want["next_sentence_label"], i


def test_load_from_disk_opens_the_whole_run_typed_with_the_parquet_output_s_instances(runs):
    out, manifest = runs["hf"]
    parquet = _all(*runs["parquet"])
    assert len(manifest["shards"]) >= 4 and {p.suffix for p in (out / "shards").iterdir()} == {".arrow"}
    ds = datasets.load_from_disk(str(out))
    assert ds.features == datasets.Features({
        "input_ids": datasets.Sequence(datasets.Value("uint16")),  # the 30,522-id vocabulary fits
        "token_type_ids": datasets.Sequence(datasets.Value("int8")),
        "labels": datasets.Sequence(datasets.Value("int32")),
        "next_sentence_label": datasets.Value("int8"),
    })
    assert ds.split == "train" and ds.num_rows == manifest["totals"]["instances"]
    _assert_rows_are(ds, parquet)
    # our reader gives the Parquet output's InstanceBatch exactly
    ours = _all(out, manifest)
    for name in ("input_ids", "segment_ids", "offsets", "masked_lm_positions", "masked_lm_ids", "masked_offsets",
                 "next_sentence_labels"):
        np.testing.assert_array_equal(getattr(ours, name), getattr(parquet, name), err_msg=name)
    assert ours.input_ids.dtype == parquet.input_ids.dtype and ours.segment_ids.dtype == parquet.segment_ids.dtype
    # each shard is an Arrow IPC stream, as datasets writes them (Dataset.from_file maps one)
    shard = datasets.Dataset.from_file(str(out / manifest["shards"][0]["path"]))
    assert shard.num_rows == manifest["shards"][0]["instances"] and shard.features == ds.features


def test_the_card_s_configs_give_the_hub_and_load_dataset_the_shards_alone(runs):
    """load_dataset(OUT) of Parquet output, and the hf output as the Hub reads it (the card's
    ``configs``: what load_dataset_builder uses; load_dataset refuses a local save_to_disk
    directory, as datasets does for every one): the same rows, never the run's JSON files."""
    parquet_out, parquet_manifest = runs["parquet"]
    parquet = _all(parquet_out, parquet_manifest)
    ds = datasets.load_dataset(str(parquet_out), split="train")
    assert ds.column_names == ["input_ids", "input_mask", "segment_ids", "masked_lm_positions", "masked_lm_ids",
                               "masked_lm_weights", "next_sentence_labels"]
    assert ds.features["input_ids"] == datasets.List(datasets.Value("uint16"))  # (Parquet ids: uint16 for a vocabulary that fits)
    assert len(ds) == len(parquet)
    for i in range(0, len(ds), 37):
        want = parquet.row(i)
        assert ds[i]["input_ids"] == want["input_ids"] and ds[i]["masked_lm_ids"] == want["masked_lm_ids"]

    hf_out, _ = runs["hf"]
    with pytest.raises(ValueError, match="load_from_disk"):
        datasets.load_dataset(str(hf_out))
    builder = datasets.load_dataset_builder(str(hf_out))
    builder.download_and_prepare()
    from_card = builder.as_dataset(split="train")
    assert from_card.features == datasets.load_from_disk(str(hf_out)).features
    _assert_rows_are(from_card, parquet)


def test_every_output_has_a_card_naming_its_shards_and_what_they_are(runs, tmp_path):
    import yaml

    for fmt, (out, manifest) in runs.items():
        text = (out / "README.md").read_text()
        header = yaml.safe_load(text.split("---\n")[1])
        glob = {"hf": "shards/part-*.arrow", "parquet": "shards/part-*.parquet"}[fmt]
        assert header["configs"] == [{"config_name": "default", "data_files": [{"split": "train", "path": glob}]}]
        assert header["task_categories"] == ["fill-mask"] and header["size_categories"] == ["1K<n<10K"]
        for fact in (f"{manifest['totals']['instances']:,} training instances", "objective: `nsp`",
                     "bert-base-uncased-vocab.txt", manifest["tokenizer_fingerprint"], "| `max_seq_length` | `128` |",
                     f"| tokens | {manifest['totals']['tokens']:,} |", "- `wikitext2-train-1MB.txt`"):
            assert fact in text, (fmt, fact)
        assert str(VOCAB.parent) not in text  # no path of the machine that ran prepare

    # TFRecord: datasets has no reader; load_dataset says it finds no data files (it would
    # otherwise have read manifest.json and the task markers as a JSON dataset)
    manifest = _prepare(tmp_path / "tf", "tfrecord", inputs=[SAMPLE_TEXT])
    text = (tmp_path / "tf" / "README.md").read_text()
    assert 'path: "shards/part-*.tfrecord"' in text and "`datasets` has no reader for tfrecord shards" in text
    with pytest.raises(datasets.exceptions.DataFilesNotFoundError):
        datasets.load_dataset(str(tmp_path / "tf"))
    assert manifest["totals"]["instances"] > 0


def test_the_format_is_chosen_by_the_manifest_for_the_loader_inspect_report_and_verify(runs):
    """hf shards are ``.arrow``, and no format is named ``arrow``: a reader chosen by file name
    would find none. Every reader of a run takes the manifest's ``hf``."""
    pytest.importorskip("torch")
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app
    from mlm_pipeline.inspect import inspect_lines
    from mlm_pipeline.torch import MLMDataset
    from mlm_pipeline.verify import verify_output

    out, manifest = runs["hf"]
    hf = get_output_format("hf")
    assert "arrow" not in output_format_names() and manifest["format"] == "hf"
    assert output_format_for_file("part-00000-00000.arrow") is hf  # (a shard file on its own: by extension)
    parquet = _all(*runs["parquet"])

    dataset = MLMDataset(str(out), shuffle=False)
    assert dataset.prepared.format is hf
    samples = list(dataset)
    assert len(samples) == len(parquet)
    for sample in samples[::41]:
        want = parquet.row(sample["index"])
        assert sample["input_ids"].tolist() == want["input_ids"]
        assert sample["masked_lm_positions"].tolist() == want["masked_lm_positions"]
        assert sample["next_sentence_label"] == want["next_sentence_label"]

    lines = list(inspect_lines(str(out), n=2, tokenizer=None, do_lower_case=None, as_json=True))
    first = manifest["shards"][0]
    assert lines[0] == f"== {out / first['path']}: {first['instances']:,} instances"
    assert [json.loads(line) for line in lines[1:]] == [parquet.row(i) for i in range(2)]
    report = CliRunner().invoke(app, ["report", str(out)])  # (the manifest's figures: no shard read)
    assert report.exit_code == 0 and "format hf  objective nsp" in report.output
    result = verify_output(str(out))
    assert result.ok and result.checked == len(manifest["shards"])


def test_same_bytes_with_one_and_two_workers_and_after_a_resume(runs, tmp_path):
    out, manifest = runs["hf"]
    two = _prepare(tmp_path / "two", "hf", workers=2)
    table = [(s["path"], s["instances"], s["bytes"], s["sha256"]) for s in manifest["shards"]]
    assert [(s["path"], s["instances"], s["bytes"], s["sha256"]) for s in two["shards"]] == table
    for name in ("state.json", "dataset_info.json", "README.md"):
        assert (tmp_path / "two" / name).read_bytes() == (out / name).read_bytes(), name

    # a run killed after some tasks: a task's marker and shards gone, a half-written shard left
    resumed = tmp_path / "resumed"
    shutil.copytree(out, resumed)
    victim = manifest["shards"][2]
    task = victim["path"].split("-")[1]
    for path in (resumed / "shards").glob(f"part-{task}-*"):
        path.unlink()
    (resumed / "_tasks" / f"{task}.json").unlink()
    for name in ("manifest.json", "state.json", "dataset_info.json", "README.md"):
        (resumed / name).unlink()
    (resumed / "_tmp").mkdir(exist_ok=True)
    (resumed / "_tmp" / f"{task}-0123.partial").write_bytes((out / victim["path"]).read_bytes()[:1000])
    again = _prepare(resumed, "hf")
    assert [(s["path"], s["instances"], s["bytes"], s["sha256"]) for s in again["shards"]] == table
    for name in ("state.json", "dataset_info.json", "README.md"):
        assert (resumed / name).read_bytes() == (out / name).read_bytes(), name
    assert len(datasets.load_from_disk(str(resumed))) == manifest["totals"]["instances"]


def test_a_damaged_shard_is_named_by_verify_the_loader_and_the_reader(runs, tmp_path):
    from mlm_pipeline.errors import ShardDamaged
    from mlm_pipeline.verify import verify_output

    out = tmp_path / "out"
    shutil.copytree(runs["hf"][0], out)
    manifest = runs["hf"][1]
    flipped, cut = (out / manifest["shards"][k]["path"] for k in (1, 3))
    data = bytearray(flipped.read_bytes())
    data[len(data) * 2 // 3] ^= 0x20  # a token id: Arrow IPC has no checksum, the SHA-256 catches it
    flipped.write_bytes(bytes(data))
    pytest.importorskip("torch")
    from mlm_pipeline.torch import MLMDataset
    from mlm_pipeline.torch import manifest as loader_manifest

    loader_manifest._VERIFIED.clear()
    with pytest.raises(ShardDamaged, match=rf"{flipped}.*sha256"):
        list(MLMDataset(str(out), shuffle=False))

    cut.write_bytes(cut.read_bytes()[: cut.stat().st_size // 2])
    result = verify_output(str(out))
    assert sorted(p.path for p in result.problems) == sorted(manifest["shards"][k]["path"] for k in (1, 3))
    with pytest.raises(ShardDamaged, match=str(cut)):
        get_output_format("hf").read(str(cut))  # a cut stream: the reader says so, naming the shard


def _batch(n: int, *, vocab: int, rng: np.random.Generator, **extra) -> InstanceBatch:
    lengths = rng.integers(3, 40, n)
    ids = rng.integers(0, vocab, int(lengths.sum())).astype(np.int32)
    counts = np.minimum(lengths, 2)
    positions = np.concatenate([np.sort(rng.choice(k, c, replace=False)) for k, c in zip(lengths, counts)])
    offsets = lengths_to_offsets(lengths)
    masked_offsets = lengths_to_offsets(counts)
    rows = np.repeat(np.arange(n), counts)
    return InstanceBatch(input_ids=ids, segment_ids=(rng.random(len(ids)) < 0.5).astype(np.int8), offsets=offsets,
                         masked_lm_positions=positions.astype(np.int32),
                         masked_lm_ids=rng.integers(0, vocab, len(positions)).astype(np.int32),
                         masked_offsets=masked_offsets, next_sentence_labels=None, **extra)


def test_ids_follow_the_vocabulary_and_packed_rows_keep_their_documents_and_language(tmp_path):
    """A 250,002-id vocabulary (XLM-R's) gets uint32 ids; document starts and languages, when
    a batch has them, become typed columns; record batches of 1,000 rows are the loader's row
    groups."""
    rng = np.random.default_rng(5)
    n = 2 * ROWS_PER_BATCH + 345
    docs = rng.integers(1, 4, n)
    batch = _batch(n, vocab=250_002, rng=rng, document_starts=np.concatenate([np.arange(k) * 2 for k in docs]).astype(np.int32),
                   document_offsets=lengths_to_offsets(docs), languages=np.array(["en", "zh", "sw"])[np.arange(n) % 3])
    assert batch.input_ids.max() > 65_535
    path = tmp_path / "part-00000-00000.arrow"
    with open(path, "wb") as f:
        writer = HfShardWriter(f, vocab_size=250_002, masking="static", max_seq_length=512, max_predictions=20)
        writer.write(batch.slice(0, 1500))
        writer.write(batch.slice(1500, n))
        writer.close()
    ds = datasets.Dataset.from_file(str(path))
    assert ds.features["input_ids"] == datasets.List(datasets.Value("uint32"))
    assert ds.features["document_starts"] == datasets.List(datasets.Value("int32"))
    assert ds.features["language"] == datasets.Value("string") and "next_sentence_label" not in ds.features
    assert ds[2]["language"] == "sw" and ds[2]["document_starts"] == batch.row(2)["document_starts"]
    back = read_hf(str(path))
    for name in ("input_ids", "segment_ids", "offsets", "masked_lm_positions", "masked_lm_ids", "masked_offsets",
                 "document_starts", "document_offsets", "languages"):
        np.testing.assert_array_equal(getattr(back, name), getattr(batch, name), err_msg=name)
    layout = read_layout(str(path), True)
    assert layout.row_groups.tolist() == [ROWS_PER_BATCH, 500, n - 1500]  # each write, cut at 1,000 rows
    np.testing.assert_array_equal(layout.lengths, batch.lengths)
    rows = get_output_format("hf").rows(str(path))
    part = rows.read(990, 1510)  # across record batches
    np.testing.assert_array_equal(part.input_ids, batch.slice(990, 1510).input_ids)
    np.testing.assert_array_equal(part.masked_lm_positions, batch.slice(990, 1510).masked_lm_positions)
    rows.close()

    # a vocabulary that fits uint16 refuses an id beyond it, rather than writing it wrapped
    with open(tmp_path / "small.arrow", "wb") as f, pytest.raises(ValueError, match="does not fit the shard's uint16"):
        HfShardWriter(f, vocab_size=30_522, masking="static").write(batch)


@pytest.mark.parametrize("objective, columns", [
    ("sop", ["input_ids", "token_type_ids", "labels", "next_sentence_label", "token_boundary"]),
    ("tokens", ["input_ids", "token_type_ids"]),  # --masking none: no labels, the collator masks
])
def test_each_objective_s_columns(objective, columns, tmp_path):
    manifest = _prepare(tmp_path / objective, "hf", inputs=[SAMPLE_TEXT], objective=objective)
    ds = datasets.load_from_disk(str(tmp_path / objective))
    assert ds.column_names == columns
    parquet = _prepare(tmp_path / "pq", "parquet", inputs=[SAMPLE_TEXT], objective=objective)
    ours, theirs = _all(tmp_path / objective, manifest), _all(tmp_path / "pq", parquet)
    for name in ("input_ids", "segment_ids", "offsets", "masked_lm_positions", "masked_lm_ids", "next_sentence_labels",
                 "token_boundary"):
        want, got = getattr(theirs, name), getattr(ours, name)
        assert (want is None) == (got is None), name
        if want is not None:
            np.testing.assert_array_equal(got, want, err_msg=name)
    if objective == "sop":
        assert ds[0]["token_boundary"] == theirs.row(0)["token_boundary"]


def test_the_run_files_are_built_from_the_manifest_alone(runs):
    from mlm_pipeline.formats import run_files

    out, manifest = runs["hf"]
    files = run_files(manifest)
    assert sorted(files) == ["README.md", "dataset_info.json", "state.json"]
    for name, data in files.items():
        assert (out / name).read_bytes() == data
    state = json.loads(files["state.json"])
    assert [f["filename"] for f in state["_data_files"]] == [s["path"] for s in manifest["shards"]]
    info = json.loads(files["dataset_info.json"])
    assert info["splits"]["train"]["num_examples"] == manifest["totals"]["instances"]
    digest = hashlib.sha256("".join(s["sha256"] for s in manifest["shards"]).encode()).hexdigest()[:16]
    assert state["_fingerprint"] == digest
    assert run_files({**manifest, "created": "another time"}) == files


@pytest.mark.slow
def test_kill_9_then_resume_gives_the_uninterrupted_run(tmp_path):
    """prepare --format hf killed with SIGKILL after some tasks, run again: the same shards and
    run files as a run never stopped, and every shard visible at the kill whole."""
    import os
    import signal
    import subprocess
    import sys
    import time

    args = ["prepare", str(WIKITEXT), "--tokenizer", str(VOCAB), "--format", "hf", "--split-size", "60KiB",
            "--dupe-factor", "3", "--workers", "1", "--no-progress"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    ref = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *args, "-o", str(tmp_path / "ref")], env=env,
                         capture_output=True, text=True, timeout=600)
    assert ref.returncode == 0, ref.stderr[-2000:]
    out = tmp_path / "killed"
    proc = subprocess.Popen([sys.executable, "-m", "mlm_pipeline.cli", *args, "-o", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.time() + 120
    while time.time() < deadline and len(list((out / "_tasks").glob("*.json"))) < 3:
        time.sleep(0.02)
    proc.send_signal(signal.SIGKILL)
    proc.wait()
    reference = json.loads((tmp_path / "ref" / "manifest.json").read_text())
    assert 3 <= len(list((out / "_tasks").glob("*.json"))) < reference["tasks"], "the kill landed outside the run"
    assert not (out / "manifest.json").exists() and not (out / "state.json").exists()
    for shard in (out / "shards").glob("*.arrow"):
        read_hf(str(shard))  # committed shards are whole
    resumed = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *args, "-o", str(out)], env=env,
                             capture_output=True, text=True, timeout=600)
    assert resumed.returncode == 0, resumed.stderr[-2000:]
    manifest = json.loads((out / "manifest.json").read_text())
    assert [(s["path"], s["sha256"]) for s in manifest["shards"]] == [(s["path"], s["sha256"]) for s in reference["shards"]]
    for name in ("state.json", "dataset_info.json", "README.md"):
        assert (out / name).read_bytes() == (tmp_path / "ref" / name).read_bytes(), name
    assert len(datasets.load_from_disk(str(out))) == reference["totals"]["instances"]


def test_the_card_of_electra_s_output_files_names_them_and_sizes_follow_the_hub_s_categories():
    import yaml

    from mlm_pipeline.formats.card import dataset_card, size_category

    manifest = {"format": "tfrecord", "objective": "electra", "masking": "none", "version": "0",
                "shards": [{"path": f"pretrain_tfrecords/pretrain_data.tfrecord-{i}-of-2", "instances": 600}
                           for i in range(2)],
                "inputs": [{"path": f"/data/corpus/part-{i}.txt", "bytes": 10} for i in range(25)]}
    text = dataset_card(manifest, ".tfrecord").decode()
    header = yaml.safe_load(text.split("---\n")[1])
    assert header["configs"][0]["data_files"] == [{"split": "train", "path": "pretrain_tfrecords/pretrain_data.tfrecord-*"}]
    assert header["size_categories"] == ["1K<n<10K"] and "1,200 training instances" in text
    assert "- `part-19.txt`" in text and "part-20.txt" not in text and "… and 5 more" in text and "/data/" not in text
    assert "(no masks stored: the training loader masks)" in text
    assert [size_category(n) for n in (0, 999, 1000, 10**6, 10**12 - 1, 10**12)] == [
        "n<1K", "n<1K", "1K<n<10K", "1M<n<10M", "100B<n<1T", "n>1T"]
