"""ELECTRA's load-time masking: exact counts, the with-replacement draw and its statistics, on the
examples of the ELECTRA golden (real Chinese × English data)."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from mlm_pipeline.electra_masking import (
    electra_mask,
    electra_mask_random,
    max_predictions_per_seq,
    num_to_predict,
)

GOLDEN = Path(__file__).resolve().parent / "data" / "golden" / "electra"
PAD, UNK, CLS, SEP, MASK = 0, 1, 2, 3, 4  # ids in the golden's zh-en vocab
IGNORE = [SEP, CLS, MASK, PAD]


@pytest.fixture(scope="module")
def batch():
    with gzip.open(GOLDEN / "zh-en-200KB-s128-seed7.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return np.array([r["input_ids"] for r in rows]), np.array([r["input_mask"] for r in rows])


def test_max_predictions_per_seq():
    assert max_predictions_per_seq(128) == 19  # int(0.155 * 128 = 19.84)
    assert max_predictions_per_seq(512) == 79
    assert max_predictions_per_seq(256, 0.2) == 52


def test_num_to_predict_rounds_a_float32_product_half_to_even():
    mask = np.zeros((7, 128), np.int64)
    for i, n in enumerate([1, 3, 10, 30, 50, 128, 0]):
        mask[i, :n] = 1
    # 10 * float32(0.15) = 1.5 -> 2 (float64 gives 1.4999... -> 1); 30 -> 4.5 -> 4 (to even);
    # 50 -> 7.5000005 -> 8; never below 1, never above the cap
    assert num_to_predict(mask, 0.15, 19).tolist() == [1, 1, 2, 4, 8, 19, 1]
    assert num_to_predict(mask, 0.15, 5).tolist() == [1, 1, 2, 4, 5, 5, 1]


@pytest.mark.tensorflow
def test_num_to_predict_equals_tensorflows():
    tf = pytest.importorskip("tensorflow", reason="tensorflow is not installed (CI installs tensorflow-cpu)")
    mask = (np.arange(512)[None, :] < np.arange(1, 513)[:, None]).astype(np.int64)
    n = tf.cast(tf.reduce_sum(mask, -1), tf.float32)
    expected = tf.maximum(1, tf.minimum(79, tf.cast(tf.round(n * 0.15), tf.int32))).numpy()
    assert num_to_predict(mask, 0.15, 79).tolist() == expected.tolist()


def test_scripted_uniforms_pick_candidates_with_replacement():
    ids = np.array([[CLS, 10, 11, SEP, 12, 13, SEP, PAD]])
    mask = np.array([[1, 1, 1, 1, 1, 1, 1, 0]])
    # candidates: positions 1, 2, 4, 5; with p = 0.5, round(7 * 0.5) = 4, capped to the 3 slots
    out = electra_mask(
        ids, mask, mask_id=MASK, ignore_ids=IGNORE, max_predictions=3, mask_prob=0.5,
        choose_u=np.array([[0.0, 0.99, 0.1]]),  # candidates 0, 3, 0: position 1 twice, position 5
        replace_u=np.array([[0.9, 0.5, 0.2]]),  # position 1: its second draw masks it
    )
    assert out.masked_lm_positions.tolist() == [[1, 5, 1]]
    assert out.masked_lm_ids.tolist() == [[10, 13, 10]]
    assert out.masked_lm_weights.tolist() == [[1.0, 1.0, 1.0]]
    assert out.input_ids.tolist() == [[CLS, MASK, 11, SEP, 12, MASK, SEP, PAD]]
    labels = out.labels()
    assert labels.tolist() == [[-100, 10, -100, -100, -100, 13, -100, -100]]
    # unused slots: position 0, id 0, weight 0, nothing replaced
    out = electra_mask(
        ids, mask, mask_id=MASK, ignore_ids=IGNORE, max_predictions=3,
        choose_u=np.array([[0.3, 0.5, 0.5]]), replace_u=np.array([[0.99, 0.0, 0.0]]),
    )
    assert out.masked_lm_positions.tolist() == [[2, 0, 0]] and out.masked_lm_weights.tolist() == [[1, 0, 0]]
    assert out.masked_lm_ids.tolist() == [[11, 0, 0]]
    assert np.array_equal(out.input_ids, ids)  # 0.99 >= 0.85: kept as it is


def test_rows_without_candidates_get_no_prediction():
    ids = np.array([[CLS, SEP, PAD, PAD], [CLS, 9, SEP, PAD]])
    mask = np.array([[1, 1, 0, 0], [1, 1, 1, 0]])
    out = electra_mask_random(ids, mask, mask_id=MASK, ignore_ids=IGNORE, rng=np.random.default_rng(0), max_predictions=2)
    assert out.masked_lm_weights.tolist() == [[0, 0], [1, 0]]
    assert out.masked_lm_positions.tolist() == [[0, 0], [1, 0]]
    assert out.input_ids[0].tolist() == ids[0].tolist()


def test_statistics_on_real_examples(batch):
    ids, mask = batch
    n_pred = max_predictions_per_seq(ids.shape[1])
    rng = np.random.default_rng(2024)
    k_expected = num_to_predict(mask, 0.15, n_pred)
    cand = mask.astype(bool) & ~np.isin(ids, IGNORE)
    draws = single = single_masked = 0
    distinct = expected_distinct = 0.0
    hits = np.zeros(ids.shape, np.int64)
    rounds = 40
    for _ in range(rounds):
        out = electra_mask_random(ids, mask, mask_id=MASK, ignore_ids=IGNORE, rng=rng)
        used = out.masked_lm_weights > 0
        assert out.masked_lm_positions.shape == (len(ids), n_pred) == (len(ids), 19)
        assert (used.sum(1) == k_expected).all()
        rows = np.broadcast_to(np.arange(len(ids))[:, None], used.shape)
        pos = out.masked_lm_positions
        # only candidates are drawn; the recorded ids are the originals
        assert cand[rows[used], pos[used]].all()
        assert np.array_equal(out.masked_lm_ids[used], ids[rows[used], pos[used]])
        # no random tokens: a changed position became [MASK] and was drawn
        changed = out.input_ids != ids
        assert (out.input_ids[changed] == MASK).all()
        assert (out.labels()[changed] == ids[changed]).all()
        counts = np.zeros(ids.shape, np.int64)
        np.add.at(counts, (rows[used], pos[used]), 1)
        assert not (changed & (counts == 0)).any()
        hits += counts
        draws += int(used.sum())
        once = counts == 1
        single += int(once.sum())
        single_masked += int((once & changed).sum())
        distinct += int((counts > 0).sum())
        c = cand.sum(1)
        expected_distinct += float((c * (1 - (1 - 1 / c) ** k_expected)).sum())
    # 85% of single draws become [MASK], 15% stay (binomial sd ~0.0015)
    assert abs(single_masked / single - 0.85) < 0.008
    # with replacement: distinct positions as many as k uniform draws with replacement give
    assert abs(distinct / expected_distinct - 1) < 0.005
    assert distinct < draws  # some positions were drawn twice
    # uniform over a row's candidates: each candidate's share of its row's draws ~ 1/c
    share = hits[cand] / np.repeat(k_expected * rounds, cand.sum(1))
    expected = np.repeat(1 / cand.sum(1), cand.sum(1))
    assert abs(share.sum() / expected.sum() - 1) < 1e-9  # all draws land on candidates
    assert abs(np.mean(share / expected) - 1) < 0.01


def test_same_uniforms_same_masks(batch):
    ids, mask = batch
    a = electra_mask_random(ids, mask, mask_id=MASK, ignore_ids=IGNORE, rng=np.random.default_rng(5))
    b = electra_mask_random(ids, mask, mask_id=MASK, ignore_ids=IGNORE, rng=np.random.default_rng(5))
    assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.masked_lm_positions, b.masked_lm_positions)
    with pytest.raises(ValueError, match="shape"):
        electra_mask(ids, mask, mask_id=MASK, ignore_ids=IGNORE, max_predictions=19,
                     choose_u=np.zeros((1, 19)), replace_u=np.zeros((1, 19)))
