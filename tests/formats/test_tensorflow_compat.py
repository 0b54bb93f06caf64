"""Real TensorFlow reads our TFRecord shards with run_pretraining.py's exact feature spec.

CI installs tensorflow-cpu (scripts/setup.sh all); without it these tests skip with the reason.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.pipeline import run_prepare
from mlm_pipeline.formats.parquet import read_parquet

tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed (CI installs tensorflow-cpu)")

pytestmark = pytest.mark.tensorflow


def _spec(max_seq: int, max_pred: int) -> dict:
    # the name_to_features of google-research/bert run_pretraining.py input_fn_builder
    return {
        "input_ids": tf.io.FixedLenFeature([max_seq], tf.int64),
        "input_mask": tf.io.FixedLenFeature([max_seq], tf.int64),
        "segment_ids": tf.io.FixedLenFeature([max_seq], tf.int64),
        "masked_lm_positions": tf.io.FixedLenFeature([max_pred], tf.int64),
        "masked_lm_ids": tf.io.FixedLenFeature([max_pred], tf.int64),
        "masked_lm_weights": tf.io.FixedLenFeature([max_pred], tf.float32),
        "next_sentence_labels": tf.io.FixedLenFeature([1], tf.int64),
    }


@pytest.mark.parametrize("seq,pred,wwm", [(128, 20, False), (512, 76, True)])
def test_tensorflow_parses_prepare_output_equal_to_parquet(tmp_path, seq, pred, wwm):
    common = dict(
        inputs=[str(WIKITEXT), str(SAMPLE_TEXT)], tokenizer=str(VOCAB), max_seq_length=seq,
        max_predictions_per_seq=pred, do_whole_word_mask=wwm, split_bytes=400_000, workers=1, progress=False,
    )
    tf_m = run_prepare(PrepareConfig(output=str(tmp_path / "tf"), format="tfrecord", **common))
    pq_m = run_prepare(PrepareConfig(output=str(tmp_path / "pq"), format="parquet", **common))
    files = [str(tmp_path / "tf" / s["path"]) for s in tf_m["shards"]]
    # TFRecordDataset checks each record's length and data CRC32C as it reads
    ds = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, _spec(seq, pred)))
    parsed: dict[str, list] = {}
    for ex in ds:
        for k, v in ex.items():
            parsed.setdefault(k, []).append(v.numpy())
    got = {k: np.stack(v) for k, v in parsed.items()}
    expected = InstanceBatch.concat(
        [read_parquet(str(tmp_path / "pq" / s["path"])) for s in pq_m["shards"]]
    ).padded(seq, pred)
    assert len(got["input_ids"]) == tf_m["totals"]["instances"] > 500
    for k, v in expected.items():
        assert got[k].dtype == (np.float32 if k == "masked_lm_weights" else np.int64), k
        assert np.array_equal(got[k], v), k


def test_tensorflow_rejects_a_corrupted_record(tmp_path):
    m = run_prepare(PrepareConfig(inputs=[str(SAMPLE_TEXT)], output=str(tmp_path / "o"), tokenizer=str(VOCAB),
                                  workers=1, progress=False))
    path = tmp_path / "o" / m["shards"][0]["path"]
    data = bytearray(path.read_bytes())
    data[200] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(tf.errors.DataLossError):
        for _ in tf.data.TFRecordDataset([str(path)]):
            pass


def test_tensorflow_parses_sop_output_with_albert_spec(tmp_path):
    """ALBERT's run_pretraining.py input spec (BERT's plus token_boundary) parses a sop run's
    TFRecords, equal to the same run's Parquet shards."""
    common = dict(inputs=[str(SAMPLE_TEXT)], tokenizer=str(VOCAB), objective="sop", dupe_factor=3, workers=1,
                  progress=False)
    tf_m = run_prepare(PrepareConfig(output=str(tmp_path / "tf"), format="tfrecord", **common))
    pq_m = run_prepare(PrepareConfig(output=str(tmp_path / "pq"), format="parquet", **common))
    spec = {**_spec(128, 20), "token_boundary": tf.io.FixedLenFeature([128], tf.int64)}
    files = [str(tmp_path / "tf" / s["path"]) for s in tf_m["shards"]]
    got: dict[str, list] = {}
    for ex in tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec)):
        for k, v in ex.items():
            got.setdefault(k, []).append(v.numpy())
    expected = InstanceBatch.concat([read_parquet(str(tmp_path / "pq" / s["path"])) for s in pq_m["shards"]]
                                    ).padded(128, 20)
    assert set(expected) == set(spec) and len(got["input_ids"]) == tf_m["totals"]["instances"] > 20
    for k, v in expected.items():
        assert np.array_equal(np.stack(got[k]), v), k


@pytest.mark.parametrize("packing", ["sentences", "best-fit"])
def test_tensorflow_reads_packed_document_starts_as_a_varlen_feature(tmp_path, packing):
    """packed's TFRecords: BERT's spec still parses them (the extra feature is ignored), and
    ``tf.io.VarLenFeature`` reads each row's document starts, equal to the Parquet column."""
    common = dict(inputs=[str(WIKITEXT)], tokenizer=str(VOCAB), objective="packed", packing=packing,
                  max_seq_length=256, max_predictions_per_seq=40, workers=1, progress=False)
    tf_m = run_prepare(PrepareConfig(output=str(tmp_path / "tf"), format="tfrecord", **common))
    pq_m = run_prepare(PrepareConfig(output=str(tmp_path / "pq"), format="parquet", **common))
    spec = {**_spec(256, 40), "document_starts": tf.io.VarLenFeature(tf.int64)}
    files = [str(tmp_path / "tf" / s["path"]) for s in tf_m["shards"]]
    starts, ids = [], []
    for ex in tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, spec)):
        starts.append(ex["document_starts"].values.numpy().tolist())
        ids.append(ex["input_ids"].numpy())
    expected = InstanceBatch.concat([read_parquet(str(tmp_path / "pq" / s["path"])) for s in pq_m["shards"]])
    assert len(starts) == len(expected) == tf_m["totals"]["instances"] > 100
    assert starts == [expected.row(i)["document_starts"] for i in range(len(expected))]
    assert sum(len(s) > 1 for s in starts) > 10  # rows holding several documents
    assert np.array_equal(np.stack(ids), expected.padded(256, 40)["input_ids"])
    bert_only = tf.data.TFRecordDataset(files).map(lambda r: tf.io.parse_single_example(r, _spec(256, 40)))
    assert sum(1 for _ in bert_only) == len(expected)


def test_document_starts_written_by_tensorflow_read_back(tmp_path):
    """Records serialized by TensorFlow itself (its own field order) with a variable-length
    ``document_starts`` come back as the rows' document starts."""
    from mlm_pipeline.formats.tfrecord import read_tfrecord

    def ints(values):
        return tf.train.Feature(int64_list=tf.train.Int64List(value=values))

    rows = [([101, 7, 8, 102, 9, 102], [0, 4]), ([101, 5, 102], [0]), ([101, 1, 102, 101, 2, 102, 3, 102], [0, 3, 6])]
    path = str(tmp_path / "tf.tfrecord")
    with tf.io.TFRecordWriter(path) as writer:
        for ids, starts in rows:
            pad = [0] * (8 - len(ids))
            features = {"input_ids": ints(ids + pad), "input_mask": ints([1] * len(ids) + pad),
                        "segment_ids": ints([0] * 8), "masked_lm_positions": ints([0, 0]), "masked_lm_ids": ints([0, 0]),
                        "masked_lm_weights": tf.train.Feature(float_list=tf.train.FloatList(value=[0.0, 0.0])),
                        "next_sentence_labels": ints([0]), "document_starts": ints(starts)}
            writer.write(tf.train.Example(features=tf.train.Features(feature=features)).SerializeToString())
    batch = read_tfrecord(path)
    assert [batch.row(i)["input_ids"] for i in range(3)] == [ids for ids, _ in rows]
    assert [batch.row(i)["document_starts"] for i in range(3)] == [starts for _, starts in rows]
