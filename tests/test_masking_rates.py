"""Masking rates from 1% to 50%, static (``prepare``) and dynamic (the collator).

Per instance BERT's budget is ``min(max_predictions, max(1, round(length * p)))``: the ``token``
scheme meets it exactly in every instance; ``whole-word`` never passes it (a word that would
overflow it is skipped) and falls short by little (a share of at least 85% of it). The 80/10/10
replacement of the static masks is within 4 standard deviations of its expectation.
"""

from __future__ import annotations

import math

import numpy as np
import pytest

from conftest import VOCAB, WIKITEXT

RATES = [0.01, 0.3, 0.5]
LENGTH = 128


@pytest.fixture(scope="module")
def text(tmp_path_factory):
    path = tmp_path_factory.mktemp("rates") / "t.txt"
    path.write_bytes(WIKITEXT.read_bytes()[:300_000])
    return path


def _prepare(text, out, **settings):
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    config = build_config({"inputs": [str(text)], "output": str(out), "tokenizer": str(VOCAB), "format": "parquet",
                           "objective": "packed", "workers": 1, "progress": False, "max_seq_length": LENGTH,
                           "max_predictions_per_seq": LENGTH, "random_seed": 11, **settings})
    return run_prepare(config, show_progress=False)


def _budget(lengths: np.ndarray, p: float) -> np.ndarray:
    return np.minimum(LENGTH, np.maximum(1, np.rint(lengths * p))).astype(np.int64)


def _check_counts(scheme: str, counts: np.ndarray, budget: np.ndarray) -> None:
    if scheme == "token":
        np.testing.assert_array_equal(counts, budget)
    else:
        assert (counts <= budget).all()
        assert counts.sum() >= 0.85 * budget.sum(), (counts.sum(), budget.sum())


@pytest.mark.parametrize("scheme", ["token", "whole-word"])
@pytest.mark.parametrize("p", RATES)
def test_static_masking_rate(text, tmp_path, p, scheme):
    from mlm_pipeline.inspect import read_shard
    from mlm_pipeline.instances.batch import InstanceBatch
    from mlm_pipeline.torch import load_prepared

    manifest = _prepare(text, tmp_path / "out", masked_lm_prob=p, masking_scheme=scheme)
    batch = InstanceBatch.concat([read_shard(s.url) for s in load_prepared(str(tmp_path / "out")).shards])
    _check_counts(scheme, batch.masked_counts, _budget(batch.lengths, p))
    totals = manifest["totals"]
    m = totals["masked_tokens"]
    assert m == len(batch.masked_lm_ids) and m > 0
    for key, share in (("masked_as_mask_token", 0.8), ("masked_as_random_token", 0.1), ("masked_kept", 0.1)):
        sd = math.sqrt(m * share * (1 - share))
        assert abs(totals[key] - m * share) <= 4 * sd + 1, (key, totals[key], m)
    share = m / totals["tokens"]
    assert abs(share - p) <= 0.5 / LENGTH + 0.02 * p + (0.06 * p if scheme != "token" else 0), share


@pytest.mark.torch
@pytest.mark.parametrize("scheme", ["token", "whole-word"])
@pytest.mark.parametrize("p", RATES)
def test_dynamic_masking_rate(text, tmp_path_factory, p, scheme):
    pytest.importorskip("torch")
    from mlm_pipeline.torch import MLMDataset

    out = tmp_path_factory.getbasetemp() / "rates-unmasked"
    if not (out / "manifest.json").exists():
        _prepare(text, out, masking="none")
    ds = MLMDataset(str(out), shuffle=False)
    samples = list(ds)
    collate = ds.collator(masking="dynamic", mlm_probability=p, masking_scheme=scheme, seed=5)
    counts, lengths = [], []
    for i in range(0, len(samples), 64):
        batch = collate(samples[i:i + 64])
        counts.append((batch["labels"] != -100).sum(1).numpy())
        lengths.append(batch["attention_mask"].sum(1).numpy())
    counts, lengths = np.concatenate(counts), np.concatenate(lengths)
    _check_counts(scheme, counts, _budget(lengths, p))


def test_the_default_prediction_cap_is_named_when_it_caps_the_rate(text, tmp_path, caplog):
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    settings = {"inputs": [str(text)], "tokenizer": str(VOCAB), "format": "parquet", "objective": "packed",
                "workers": 1, "progress": False, "max_seq_length": 512, "masked_lm_prob": 0.3}
    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        run_prepare(build_config({**settings, "output": str(tmp_path / "a")}), show_progress=False)
    assert "pass --max-predictions-per-seq 154 for the full rate" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        run_prepare(build_config({**settings, "output": str(tmp_path / "b"), "max_predictions_per_seq": 154}),
                    show_progress=False)
    assert "max-predictions-per-seq" not in caplog.text


@pytest.mark.torch
def test_dynamic_masking_takes_the_rate_the_output_recorded(text, tmp_path):
    """An unmasked output prepared with ``--masked-lm-prob 0.3`` is masked at 0.3 by its collator
    (a phase of a schedule masks at its own rate), unless ``mlm_probability`` is given."""
    pytest.importorskip("torch")
    from mlm_pipeline.torch import MLMDataset

    _prepare(text, tmp_path / "out", masking="none", masked_lm_prob=0.3)
    ds = MLMDataset(str(tmp_path / "out"), shuffle=False)
    samples = list(ds)[:256]
    for collate, p in ((ds.collator(), 0.3), (ds.collator(mlm_probability=0.05), 0.05)):
        batch = collate(samples)
        counts = (batch["labels"] != -100).sum(1).numpy()
        np.testing.assert_array_equal(counts, _budget(batch["attention_mask"].sum(1).numpy(), p))
