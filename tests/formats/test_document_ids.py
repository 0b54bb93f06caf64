"""``--id-field`` / ``--metadata-field``: each instance names the input records its tokens come from.

The inputs are written by datatrove's own writers (``JsonlWriter``, ``ParquetWriter``: ``text``,
``id`` and a ``metadata`` object, a struct column in Parquet) from the bundled WikiText, an
article a record. Every row's ``document_ids`` must be ids of the input, and its tokens must
really come from those records: each document's part of a row is a contiguous run of that
record's own tokens (an independent tokenization of its text with HF ``tokenizers``).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from conftest import VOCAB, WIKITEXT

pytest.importorskip("datatrove")

ARTICLES = 24  # about 400 KB of text: several blocks, rows across documents


def _articles() -> list[str]:
    text = WIKITEXT.read_text(encoding="utf-8")
    return [a.strip() for a in re.split(r"\n(?= = [^=].* = \n)", text) if a.strip()][:ARTICLES]


@pytest.fixture(scope="module")
def curated(tmp_path_factory) -> dict:
    """datatrove's JSONL (gzip and plain) and Parquet outputs of the articles, and what each id holds."""
    from datatrove.data import Document
    from datatrove.pipeline.writers import JsonlWriter, ParquetWriter

    root = tmp_path_factory.mktemp("curated")
    records = {f"wikitext-{n}": {"text": a, "metadata": {"title": a.splitlines()[0].strip(" ="), "n": n}}
               for n, a in enumerate(_articles())}
    for writer, folder in ((JsonlWriter(str(root / "jsonl")), "jsonl"),
                           (JsonlWriter(str(root / "plain"), compression=None), "plain"),
                           (ParquetWriter(str(root / "parquet")), "parquet")):
        with writer as w:
            for doc_id, r in records.items():
                w.write(Document(text=r["text"], id=doc_id, metadata=dict(r["metadata"])), rank=0)
    return {"root": root, "records": records}


def _prepare(inputs, out: Path, **settings) -> dict:
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    values = {"inputs": [str(i) for i in inputs], "output": str(out), "tokenizer": str(VOCAB), "format": "parquet",
              "workers": 1, "progress": False, "masking": "none", "max_seq_length": 128,
              "id_field": "id", "metadata_field": "metadata", **settings}
    run_prepare(build_config(values), show_progress=False)
    return json.loads((out / "manifest.json").read_text())


def _rows(out: Path):
    """Every instance of a run, read back through the loader's shard list and the format's reader."""
    from mlm_pipeline.inspect import read_shard
    from mlm_pipeline.instances.batch import InstanceBatch
    from mlm_pipeline.torch import load_prepared

    return InstanceBatch.concat([read_shard(s.url) for s in load_prepared(str(out)).shards])


@pytest.fixture(scope="module")
def token_text(curated):
    """Each record's tokens (HF ``tokenizers``' BERT WordPiece on its whole text) as text
    ``" 12 34 56 "``, so that a run of tokens is found with ``in``."""
    from tokenizers import BertWordPieceTokenizer

    tok = BertWordPieceTokenizer(str(VOCAB), lowercase=True)
    return {doc_id: " " + " ".join(map(str, tok.encode(r["text"], add_special_tokens=False).ids)) + " "
            for doc_id, r in curated["records"].items()}


def _is_run_of(tokens, doc_id: str, token_text: dict) -> bool:
    return len(tokens) > 0 and (" " + " ".join(map(str, tokens)) + " ") in token_text[doc_id]


CLS, SEP = 101, 102  # bert-base-uncased


def _check_metadata(row: dict, records: dict) -> None:
    assert len(row["document_metadata"]) == len(row["document_ids"])
    for doc_id, meta in zip(row["document_ids"], row["document_metadata"]):
        assert json.loads(meta) == records[doc_id]["metadata"]


@pytest.mark.parametrize("source", ["jsonl", "parquet"])
def test_packed_rows_name_their_documents_and_each_part_is_that_records_tokens(curated, token_text, tmp_path, source):
    manifest = _prepare([curated["root"] / source], tmp_path / "out", objective="packed")
    batch = _rows(tmp_path / "out")
    assert len(batch) == manifest["totals"]["instances"] > 100
    records = curated["records"]
    several = 0
    for i in range(len(batch)):
        row = batch.row(i)
        ids, starts = row["document_ids"], row["document_starts"]
        assert len(ids) == len(starts) and set(ids) <= set(records)
        several += len(ids) > 1
        bounds = starts + [len(row["input_ids"])]
        for k, doc_id in enumerate(ids):  # [CLS] doc [SEP] doc [SEP]: each part without its markers
            part = row["input_ids"][bounds[k] + (k == 0): bounds[k + 1] - 1]
            assert _is_run_of(part, doc_id, token_text), (i, k, doc_id)
        _check_metadata(row, records)
    assert several > 10  # rows that cross documents name each of them
    # every record is named, and the ids come in the order the row's tokens do
    assert {d for d in batch.document_ids} == set(records)


def test_nsp_segment_a_is_its_first_documents_and_b_its_last(curated, token_text, tmp_path):
    _prepare([curated["root"] / "parquet"], tmp_path / "out", objective="nsp", dupe_factor=2)
    batch = _rows(tmp_path / "out")
    records = curated["records"]
    random_other = 0
    for i in range(len(batch)):
        row = batch.row(i)
        ids, tokens, seg = row["document_ids"], row["input_ids"], row["segment_ids"]
        assert 1 <= len(ids) <= 2 and set(ids) <= set(records)
        n_a = seg.count(0)
        a, b = tokens[1: n_a - 1], tokens[n_a:-1]
        assert _is_run_of(a, ids[0], token_text) and _is_run_of(b, ids[-1], token_text), i
        if len(ids) == 2:
            assert row["next_sentence_label"] == 1  # only a random next comes from another record
            random_other += 1
        _check_metadata(row, records)
    assert random_other > len(batch) // 4


def test_token_windows_name_each_document_they_cross(curated, token_text, tmp_path):
    _prepare([curated["root"] / "jsonl"], tmp_path / "out", objective="tokens")
    batch = _rows(tmp_path / "out")
    crossing = 0
    for i in range(len(batch)):
        row = batch.row(i)
        body = row["input_ids"][1:-1]
        cuts = [k for k, t in enumerate(body) if t == SEP]  # the stream's separators between documents
        parts = [p for p in np.split(np.array(body), cuts) if len(p)]
        parts = [p[1:] if p[0] == SEP else p for p in parts]
        parts = [p.tolist() for p in parts if len(p)]
        assert len(parts) == len(row["document_ids"]), i
        for part, doc_id in zip(parts, row["document_ids"]):
            assert _is_run_of(part, doc_id, token_text), (i, doc_id)
        crossing += len(parts) > 1
    assert crossing > 5


@pytest.mark.parametrize("objective,settings", [("packed", {"packing": "best-fit"}), ("sop", {"masking": "static"}),
                                                ("electra", {})])
def test_other_objectives_name_records_their_tokens_come_from(curated, token_text, tmp_path, objective, settings):
    _prepare([curated["root"] / "jsonl"], tmp_path / "out", objective=objective, **settings)
    batch = _rows(tmp_path / "out")
    assert len(batch) > 50
    for i in range(len(batch)):
        row = batch.row(i)
        ids = row["document_ids"]
        assert ids and set(ids) <= set(curated["records"])
        if objective == "electra":  # an example never spans two documents; its sentences may come in another order
            assert len(ids) == 1
            body = Counter(t for t in row["input_ids"] if t not in (CLS, SEP))
            assert not body - Counter(map(int, token_text[ids[0]].split())), i
        elif objective == "packed":  # best-fit: whole documents (or full-row pieces), [CLS] doc [SEP] each
            bounds = row["document_starts"] + [len(row["input_ids"])]
            assert len(ids) == len(row["document_starts"])
            for k, doc_id in enumerate(ids):
                assert _is_run_of(row["input_ids"][bounds[k] + 1: bounds[k + 1] - 1], doc_id, token_text)
        _check_metadata(row, curated["records"])


def test_the_same_bytes_with_one_and_two_workers(curated, tmp_path):
    small = {"objective": "packed", "split_bytes": "64KiB", "block_bytes": "32KiB", "max_instances_per_shard": 200}
    one = _prepare([curated["root"] / "plain"], tmp_path / "one", workers=1, **small)
    two = _prepare([curated["root"] / "plain"], tmp_path / "two", workers=2, **small)
    assert one["tasks"] > 2
    assert [(s["path"], s["sha256"]) for s in one["shards"]] == [(s["path"], s["sha256"]) for s in two["shards"]]


def test_records_without_an_id_are_counted_and_integer_ids_kept_as_text(tmp_path):
    """NeMo Curator's layout: extra fields at the top level, picked with a comma list."""
    articles = _articles()[:6]
    lines = [{"text": a, "id": 1000 + n, "url": f"https://example.org/{n}", "score": n / 2}
             for n, a in enumerate(articles)]
    del lines[2]["id"]
    (tmp_path / "nemo.jsonl").write_text("".join(json.dumps(r) + "\n" for r in lines), encoding="utf-8")
    manifest = _prepare([tmp_path / "nemo.jsonl"], tmp_path / "out", objective="packed", metadata_field="url,score")
    assert manifest["totals"]["documents_without_id"] == 1
    batch = _rows(tmp_path / "out")
    assert set(batch.document_ids) == {str(1000 + n) for n in (0, 1, 3, 4, 5)} | {""}
    for i in range(len(batch)):
        row = batch.row(i)
        for doc_id, meta in zip(row["document_ids"], row["document_metadata"]):
            n = int(doc_id) - 1000 if doc_id else 2
            assert json.loads(meta) == {"url": f"https://example.org/{n}", "score": n / 2}


def test_the_training_loader_gives_each_samples_records(curated, tmp_path):
    pytest.importorskip("torch")
    from mlm_pipeline.torch import MLMDataset

    _prepare([curated["root"] / "jsonl"], tmp_path / "out", objective="packed", max_instances_per_shard=100)
    expected = _rows(tmp_path / "out")
    dataset = MLMDataset(str(tmp_path / "out"), shuffle=False)
    samples = list(dataset)
    assert len(samples) == len(expected)
    for sample in samples:
        row = expected.row(sample["index"])
        assert sample["document_ids"] == row["document_ids"] and sample["document_metadata"] == row["document_metadata"]
        assert sample["input_ids"].tolist() == row["input_ids"]
    batch = dataset.collator()(samples[:8])  # the collator takes such samples as any others
    assert batch["input_ids"].shape[0] == 8


def test_inspect_shows_each_rows_records(curated, tmp_path):
    from mlm_pipeline.inspect import inspect_lines

    _prepare([curated["root"] / "jsonl"], tmp_path / "out", objective="packed")
    text = list(inspect_lines(str(tmp_path / "out"), n=3, tokenizer=None, do_lower_case=None, as_json=False))
    assert sum("\n  from: wikitext-" in instance for instance in text) == 3
    rows = [json.loads(line) for line in inspect_lines(str(tmp_path / "out"), n=3, tokenizer=None,
                                                       do_lower_case=None, as_json=True) if line.startswith("{")]
    assert all(r["document_ids"] and r["document_metadata"] for r in rows)


def test_without_the_flags_no_column_is_added(curated, tmp_path):
    import pyarrow.parquet as pq

    _prepare([curated["root"] / "jsonl"], tmp_path / "out", objective="packed", id_field=None, metadata_field=None)
    names = pq.ParquetFile(next((tmp_path / "out").rglob("*.parquet"))).schema_arrow.names
    assert "document_ids" not in names and "document_metadata" not in names


@pytest.mark.parametrize("settings,refusal", [
    ({"format": "tfrecord"}, "--format tfrecord has no column"),
    ({"format": "megatron", "objective": "documents"}, "--format megatron has no column"),
    ({"input_format": "text"}, "--input-format text has no such fields"),
    ({"objective": "nsp", "reference": True, "masking": "static", "format": "tfrecord"}, "--reference writes"),
    ({"metadata_field": ","}, "names no field"),
])
def test_settings_that_cannot_carry_ids_are_refused(tmp_path, settings, refusal):
    from mlm_pipeline.config import build_config
    from mlm_pipeline.errors import ConfigError

    values = {"inputs": ["a.jsonl"], "output": str(tmp_path / "o"), "tokenizer": str(VOCAB), "format": "parquet",
              "id_field": "id", **settings}
    with pytest.raises(ConfigError, match=re.escape(refusal)):
        build_config(values)


def test_a_parquet_input_without_the_id_column_is_refused_at_planning(curated, tmp_path):
    from mlm_pipeline.errors import InputError

    with pytest.raises(InputError, match="no column 'doc_id'"):
        _prepare([curated["root"] / "parquet"], tmp_path / "out", objective="packed", id_field="doc_id")


@pytest.fixture(scope="module")
def three_formats(curated, tmp_path_factory) -> dict:
    """The same nsp run (the datatrove Parquet input) written as Parquet, MDS and HF."""
    root = tmp_path_factory.mktemp("formats")
    return {fmt: (root / fmt, _prepare([curated["root"] / "parquet"], root / fmt, objective="nsp", format=fmt,
                                       masking="static", max_instances_per_shard=150))
            for fmt in ("parquet", "mds", "hf")}


def _expected_rows(three_formats) -> list[tuple[list, list]]:
    batch = _rows(three_formats["parquet"][0])
    return [(r["document_ids"], r["document_metadata"]) for r in map(batch.row, range(len(batch)))]


def test_hf_load_from_disk_gives_the_records_typed(three_formats):
    datasets = pytest.importorskip("datasets")

    ds = datasets.load_from_disk(str(three_formats["hf"][0]))
    for name in ("document_ids", "document_metadata"):
        assert ds.features[name] in (datasets.List(datasets.Value("string")),
                                     datasets.Sequence(datasets.Value("string")))
    assert list(zip(ds["document_ids"], ds["document_metadata"])) == _expected_rows(three_formats)
    back = _rows(three_formats["hf"][0])  # and through our own reader
    assert back.document_ids.tolist() == [i for ids, _ in _expected_rows(three_formats) for i in ids]


def test_streaming_dataset_gives_each_instances_records(three_formats):
    from test_mds import import_streaming  # (its way round streaming's torchvision import)

    streaming = import_streaming()
    out, manifest = three_formats["mds"]
    assert len(manifest["shards"]) > 1
    dataset = streaming.StreamingDataset(local=str(out), shuffle=False, batch_size=1)
    got = [(sample["document_ids"], sample["document_metadata"]) for sample in dataset]
    assert got == _expected_rows(three_formats)
    back = _rows(out)  # and through our own reader
    assert [(r["document_ids"], r["document_metadata"]) for r in map(back.row, range(len(back)))] == got
    # the first shard is byte for byte what streaming's own MDSWriter writes of the same samples
    entry = json.loads((out / "index.json").read_bytes())["shards"][0]
    columns = dict(zip(entry["column_names"], entry["column_encodings"]))
    assert columns["document_ids"] == columns["document_metadata"] == "json"
    with streaming.MDSWriter(out=str(out.parent / "theirs"), columns=columns, hashes=["sha256"],
                             size_limit=entry["size_limit"]) as writer:
        for i in range(manifest["shards"][0]["instances"]):
            writer.write(dataset[i])
    assert (out.parent / "theirs" / "shard.00000.mds").read_bytes() == (out / manifest["shards"][0]["path"]).read_bytes()


def test_a_run_of_an_earlier_version_resumes_and_one_asking_for_ids_is_refused(curated, tmp_path):
    """A run recorded before these settings existed (its record lacks them, its task markers carry
    the fingerprint of its settings) resumes with every task done; the same output asked for
    ids is refused, as any other change of settings."""
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.run import layout

    out = tmp_path / "out"
    plain = {"objective": "packed", "id_field": None, "metadata_field": None, "split_bytes": "64KiB"}
    first = _prepare([curated["root"] / "plain"], out, **plain)
    record = json.loads((out / layout.RUN_FILE).read_text())
    for name in ("id_field", "metadata_field"):
        del record["settings"][name]
    (out / layout.RUN_FILE).write_text(json.dumps(record))
    # its markers' fingerprint: as an earlier version computed it, from settings without these two
    from mlm_pipeline.config import build_config

    earlier = build_config({"inputs": [str(curated["root"] / "plain")], "output": str(out), "tokenizer": str(VOCAB),
                            "format": "parquet", "masking": "none", "max_seq_length": 128, **plain}).compared_settings()
    fingerprint = hashlib.sha256(json.dumps({k: v for k, v in earlier.items() if k not in ("id_field", "metadata_field")},
                                            sort_keys=True).encode()).hexdigest()
    for path in (out / layout.TASKS_DIR).glob("*.json"):
        marker = json.loads(path.read_text())
        assert marker["output_fingerprint"] == fingerprint  # (unset, they leave the fingerprint as it was)
    markers = {p: p.read_bytes() for p in (out / layout.TASKS_DIR).glob("*.json")}
    (out / "manifest.json").unlink()
    again = _prepare([curated["root"] / "plain"], out, **plain)
    assert again["shards"] == first["shards"] and len(markers) == first["tasks"] > 1
    assert all(p.read_bytes() == data for p, data in markers.items())  # no task ran again
    with pytest.raises(OutputError, match="id-field"):
        _prepare([curated["root"] / "plain"], out, objective="packed", split_bytes="64KiB")


def test_the_dataset_card_describes_the_columns(three_formats):
    for fmt in ("parquet", "hf", "mds"):
        card = (three_formats[fmt][0] / "README.md").read_text()
        assert "`document_ids`" in card and "the `id` of each input record" in card, fmt
        assert "`document_metadata`" in card and "their `metadata`, as JSON text" in card, fmt
