"""A new output format is one registration: ``prepare`` writes it, ``inspect`` and the loader read it.

The format below (JSON lines, one instance per line) is defined in this file alone; nothing in
the package knows it. A real run on the bundled corpus writes it through the shard sink, and the
shards are read back through the registry by the format the manifest records.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT
from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig, build_config
from mlm_pipeline.errors import ConfigError, InspectError
from mlm_pipeline.formats import (
    OutputFormat,
    get_output_format,
    output_format_for_file,
    output_format_names,
    register_output_format,
    unregister_output_format,
)
from mlm_pipeline.formats.sink import ShardSink
from mlm_pipeline.inspect import inspect_lines, read_shard
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets
from mlm_pipeline.pipeline import run_prepare

# --------------------------------------------------------------------------------------------
# The whole format: a writer and a reader


class JsonLinesWriter:
    def __init__(self, f, *, max_seq_length: int, max_predictions: int, **_settings):
        self.f = f

    def write(self, batch: InstanceBatch) -> None:
        for i in range(len(batch)):
            self.f.write(json.dumps(batch.row(i)).encode() + b"\n")

    def close(self) -> None:
        pass


def batch_of_rows(rows: list[dict]) -> InstanceBatch:
    if not rows:
        return InstanceBatch.empty()
    return InstanceBatch(
        input_ids=np.array([t for r in rows for t in r["input_ids"]], np.int32),
        segment_ids=np.array([t for r in rows for t in r["segment_ids"]], np.int8),
        offsets=lengths_to_offsets(np.array([len(r["input_ids"]) for r in rows])),
        masked_lm_positions=np.array([t for r in rows for t in r["masked_lm_positions"]], np.int32),
        masked_lm_ids=np.array([t for r in rows for t in r["masked_lm_ids"]], np.int32),
        masked_offsets=lengths_to_offsets(np.array([len(r["masked_lm_ids"]) for r in rows])),
        next_sentence_labels=np.array([r["next_sentence_label"] for r in rows], np.int8)
        if "next_sentence_label" in rows[0] else None,
    )


def read_json_lines(url: str) -> InstanceBatch:
    return batch_of_rows([json.loads(line) for line in fs.read_bytes(url).splitlines()])


JSON_LINES = OutputFormat(name="jsonl", open_writer=JsonLinesWriter, read_shard=read_json_lines)

# --------------------------------------------------------------------------------------------


@pytest.fixture
def json_lines():
    register_output_format(JSON_LINES)
    yield JSON_LINES
    unregister_output_format("jsonl")


def _prepare(out, fmt: str, **settings) -> dict:
    config = PrepareConfig(inputs=[str(SAMPLE_TEXT), str(WIKITEXT)], output=str(out), tokenizer=str(VOCAB),
                           format=fmt, workers=1, progress=False, split_bytes=300_000,
                           max_instances_per_shard=700, **settings)
    return run_prepare(config)


def _all_instances(out, manifest: dict) -> InstanceBatch:
    fmt = get_output_format(manifest["format"])
    return InstanceBatch.concat([fmt.read_shard(str(out / s["path"])) for s in manifest["shards"]])


def _assert_same(a: InstanceBatch, b: InstanceBatch) -> None:
    assert len(a) == len(b) > 0
    for name in ("input_ids", "segment_ids", "offsets", "masked_lm_positions", "masked_lm_ids", "masked_offsets",
                 "next_sentence_labels"):
        np.testing.assert_array_equal(getattr(a, name), getattr(b, name), err_msg=name)


def test_prepare_writes_a_format_registered_here_and_inspect_and_the_loader_read_it(json_lines, tmp_path):
    manifest = _prepare(tmp_path / "jl", "jsonl")
    assert manifest["format"] == "jsonl"
    assert len(manifest["shards"]) >= 3
    for shard in manifest["shards"]:
        path = tmp_path / "jl" / shard["path"]
        assert path.name.startswith("part-") and path.suffix == ".jsonl"
        data = path.read_bytes()
        assert shard["sha256"] == hashlib.sha256(data).hexdigest() and shard["bytes"] == len(data)
        assert shard["instances"] == data.count(b"\n")
    # the same instances as a built-in format writes for the same settings
    parquet = _prepare(tmp_path / "pq", "parquet")
    ours = _all_instances(tmp_path / "jl", manifest)
    _assert_same(ours, _all_instances(tmp_path / "pq", parquet))

    # inspect: the output directory (its manifest's format) and one shard of it
    first = json_lines.read_shard(str(tmp_path / "jl" / manifest["shards"][0]["path"]))
    lines = list(inspect_lines(str(tmp_path / "jl"), n=3, tokenizer=None, do_lower_case=None, as_json=True))
    assert lines[0].startswith("== ") and lines[0].endswith(f"{len(first):,} instances")
    assert [json.loads(line) for line in lines[1:]] == [first.row(i) for i in range(3)]
    text = list(inspect_lines(str(tmp_path / "jl" / manifest["shards"][0]["path"]), n=1, tokenizer=None,
                              do_lower_case=None, as_json=False))
    assert text[1].startswith(f"#0  length {len(first.row(0)['input_ids'])}") and "[CLS]" in text[1]

    # the loader: every instance once, each equal to its row in the manifest's order
    torch = pytest.importorskip("torch")
    from mlm_pipeline.torch import MLMDataLoader, MLMDataset

    torch.set_num_threads(1)
    dataset = MLMDataset(str(tmp_path / "jl"), seed=1, shuffle_buffer=256, rank=1, world_size=2)
    assert dataset.prepared.format is json_lines
    seen = {}
    for sample in dataset:
        seen[sample["index"]] = sample
    first_rank = MLMDataset(str(tmp_path / "jl"), seed=1, shuffle_buffer=256, rank=0, world_size=2)
    seen.update({s["index"]: s for s in first_rank})
    assert sorted(seen) == list(range(len(ours)))
    for index, sample in seen.items():
        row = ours.row(index)
        assert sample["input_ids"].tolist() == row["input_ids"]
        assert sample["masked_lm_ids"].tolist() == row["masked_lm_ids"]
        assert sample["next_sentence_label"] == row["next_sentence_label"]
    loader = MLMDataLoader(dataset, batch_size=32, collate_fn=dataset.collator(sample_info=True), num_workers=0)
    assert sum(len(b["sample_index"]) for b in loader) == len(MLMDataset(str(tmp_path / "jl"), rank=1, world_size=2))


def test_a_format_is_known_only_while_registered(tmp_path):
    settings = {"inputs": [str(SAMPLE_TEXT)], "output": str(tmp_path / "o"), "tokenizer": str(VOCAB)}
    with pytest.raises(ConfigError, match="format: .*unknown output format 'jsonl'; known: tfrecord, parquet"):
        build_config({**settings, "format": "jsonl"})
    built_in = output_format_names()
    assert built_in[:2] == ("tfrecord", "parquet") and "jsonl" not in built_in
    register_output_format(JSON_LINES)
    try:
        assert output_format_names() == (*built_in, "jsonl")
        assert build_config({**settings, "format": "jsonl"}).format == "jsonl"
        assert get_output_format("jsonl") is JSON_LINES
        with pytest.raises(ValueError, match="'jsonl' is already registered"):
            register_output_format(JSON_LINES)
        with pytest.raises(ValueError, match="'tfrecord' is already registered"):
            register_output_format(OutputFormat(name="tfrecord", open_writer=JsonLinesWriter, read_shard=read_json_lines))
    finally:
        unregister_output_format("jsonl")
    assert output_format_names() == built_in
    with pytest.raises(ConfigError, match=rf"^unknown output format 'jsonl'; known formats: {', '.join(built_in)}$"):
        get_output_format("jsonl")


@pytest.mark.parametrize("name", ["", "JSONL", "json.lines", "1x", "a-b"])
def test_a_format_name_must_be_usable_as_an_extension(name):
    with pytest.raises(ValueError, match="lowercase letters, digits and _"):
        OutputFormat(name=name, open_writer=JsonLinesWriter, read_shard=read_json_lines)


HAND_MADE = [
    {"input_ids": [101, 7592, 103, 102], "segment_ids": [0, 0, 0, 0], "masked_lm_positions": [2],
     "masked_lm_ids": [2088], "next_sentence_label": 0},
    {"input_ids": [101, 2023, 102, 2003, 102], "segment_ids": [0, 0, 0, 1, 1], "masked_lm_positions": [],
     "masked_lm_ids": [], "next_sentence_label": 1},
    {"input_ids": [101, 103, 103, 102], "segment_ids": [0, 0, 0, 0], "masked_lm_positions": [1, 2],
     "masked_lm_ids": [1037, 3899], "next_sentence_label": 0},
]


def test_readers_come_from_the_recorded_format_not_the_file_name(json_lines, tmp_path):
    """A shard inside a run is read with the format its manifest records, whatever the file's name;
    a shard file on its own is recognised by its extension, through the registry."""
    batch = batch_of_rows(HAND_MADE)
    out = tmp_path / "out"
    sink = ShardSink(str(out), "00000", fmt="parquet", max_instances_per_shard=10**6, max_seq_length=128,
                     max_predictions=20)
    sink.write(batch)
    (entry,) = sink.close()
    assert entry["path"] == "shards/part-00000-00000.parquet" and entry["instances"] == len(batch)
    renamed = out / "shards" / "part-00000-00000.jsonl"
    (out / entry["path"]).rename(renamed)
    entry["path"] = "shards/part-00000-00000.jsonl"
    (out / "manifest.json").write_text(json.dumps({"format": "parquet", "shards": [entry], "config": {}}))
    for path in (out, renamed):  # the output, or a shard inside it: Parquet, as the manifest says
        lines = list(inspect_lines(str(path), n=3, tokenizer=None, do_lower_case=None, as_json=True))
        assert [json.loads(line) for line in lines[1:]] == HAND_MADE
    _assert_same(read_shard(str(renamed), "parquet"), batch)

    lone = tmp_path / "lone.jsonl"  # on its own: the extension names the format
    with open(lone, "wb") as f:
        writer = json_lines.open_writer(f, max_seq_length=128, max_predictions=20)
        writer.write(batch)
        writer.close()
    assert output_format_for_file(str(lone)) is json_lines
    _assert_same(read_shard(str(lone)), batch)
    (tmp_path / "lone.dat").write_bytes(lone.read_bytes())
    with pytest.raises(InspectError, match=r"lone.dat: not a shard of a known output format \(\.tfrecord, \.parquet, .*\.jsonl\)"):
        list(inspect_lines(str(tmp_path / "lone.dat"), n=1, tokenizer=None, do_lower_case=None, as_json=True))


def _line_index(manifest: dict) -> dict[str, bytes]:
    """A run-level index, as MDS's index.json is: every shard with its rows, in the run's order."""
    rows = [{"path": s["path"], "rows": s["instances"]} for s in manifest["shards"]]
    return {"index.jsonl": b"".join(json.dumps(r).encode() + b"\n" for r in rows)}


def test_a_format_s_run_files_are_written_from_the_manifest_before_it(tmp_path):
    """A format's ``run_files`` (an index of its shards) lie beside the shards once the manifest
    exists, built from the manifest; ``finalize --force`` writes the same bytes again."""
    from mlm_pipeline.run.manifest import finalize

    seen_manifest_missing = []

    def index_before_manifest(manifest: dict) -> dict[str, bytes]:
        seen_manifest_missing.append(not (tmp_path / "jl" / "manifest.json").exists())
        return _line_index(manifest)

    register_output_format(OutputFormat(name="jsonl", open_writer=JsonLinesWriter, read_shard=read_json_lines,
                                        run_files=index_before_manifest))
    try:
        manifest = _prepare(tmp_path / "jl", "jsonl")
        index = (tmp_path / "jl" / "index.jsonl").read_bytes()
        assert index == _line_index(manifest)["index.jsonl"]
        assert [json.loads(line)["rows"] for line in index.splitlines()] == [s["instances"] for s in manifest["shards"]]
        assert seen_manifest_missing == [True]
        (tmp_path / "jl" / "index.jsonl").unlink()
        finalize(str(tmp_path / "jl"), force=True)
        assert (tmp_path / "jl" / "index.jsonl").read_bytes() == index
    finally:
        unregister_output_format("jsonl")


def test_a_writer_is_told_the_tokenizer_s_vocabulary_size(tmp_path):
    """Formats whose id type follows the vocabulary (uint16 or uint32) are told its size."""
    sizes = []

    def open_writer(f, **settings):
        sizes.append(settings["vocab_size"])
        return JsonLinesWriter(f, **settings)

    register_output_format(OutputFormat(name="jsonl", open_writer=open_writer, read_shard=read_json_lines))
    try:
        _prepare(tmp_path / "jl", "jsonl")
    finally:
        unregister_output_format("jsonl")
    assert sizes and set(sizes) == {30522}


def test_a_link_planted_where_a_run_file_goes_is_replaced_never_followed(tmp_path):
    """The run's files (the dataset card here) are compared with what lies there without
    following a link, and a link is replaced by the file: its target is neither read nor written."""
    from mlm_pipeline.run.manifest import finalize

    _prepare(tmp_path / "pq", "parquet")
    card = tmp_path / "pq" / "README.md"
    written = card.read_bytes()
    outside = tmp_path / "outside.txt"
    outside.write_bytes(written)  # the same bytes: a followed link would look up to date
    card.unlink()
    card.symlink_to(outside)
    finalize(str(tmp_path / "pq"), force=True)
    assert not card.is_symlink() and card.read_bytes() == written
    assert outside.read_bytes() == written
