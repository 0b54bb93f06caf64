"""Dynamic masking in the collator with every masking scheme, from tokens-only shards
(``--objective tokens --masking none``) of real text."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from loader.loader_helpers import VOCAB, WIKITEXT  # noqa: E402
from mlm_pipeline.masking.span import mean_span_length  # noqa: E402
from mlm_pipeline.tokenize import load_tokenizer  # noqa: E402
from mlm_pipeline.torch import MLMCollator, MLMDataset  # noqa: E402

pytestmark = [pytest.mark.torch]


@pytest.fixture(scope="module")
def tokens_out(tmp_path_factory):
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path_factory.mktemp("tokens")
    run_prepare(PrepareConfig(inputs=[str(WIKITEXT)], output=str(out), tokenizer=str(VOCAB), objective="tokens",
                              max_seq_length=256, workers=1, progress=False))
    return str(out)


@pytest.fixture(scope="module")
def tokens_samples(tokens_out):
    return list(MLMDataset(tokens_out, shuffle=False))


@pytest.fixture(scope="module")
def wordpiece():
    return load_tokenizer(str(VOCAB), True)


def _runs(batch, tok):
    """(words per run of adjacent masked positions, [MASK]-share per run, masked share)."""
    labels, ids = batch["labels"].numpy(), batch["input_ids"].numpy()
    masked = labels != -100
    flat = masked.reshape(-1)
    pos = np.flatnonzero(flat)
    new = np.ones(len(pos), dtype=bool)
    new[1:] = pos[1:] != pos[:-1] + 1
    starts = np.flatnonzero(new)
    orig = labels.reshape(-1)[pos]
    word_start = ~tok.is_continuation[orig]
    word_start[starts] = True
    words = np.add.reduceat(word_start.astype(np.int64), starts)
    as_mask = (ids.reshape(-1)[pos] == tok.special.mask).astype(np.float64)
    per_run = np.add.reduceat(as_mask, starts) / np.diff(np.r_[starts, len(pos)])
    return words, per_run, masked.sum() / batch["attention_mask"].sum().item()


@pytest.mark.parametrize("prob", [0.15, 0.30])
def test_span_masking_at_load_time(tokens_samples, wordpiece, prob):
    collator = MLMCollator(wordpiece, masking="dynamic", masking_scheme="span", mlm_probability=prob, nsp=False,
                           seed=3)
    batch = collator(tokens_samples[:600])
    words, per_run, share = _runs(batch, wordpiece)
    assert abs(words.mean() - mean_span_length(0.2, 1, 10)) < 0.1 * 3.797, words.mean()
    assert abs(share - prob) < 0.01
    assert np.mean((per_run > 0) & (per_run < 1)) < 0.002  # one choice per span
    assert abs(np.mean(per_run == 1) - 0.8) < 0.03


@pytest.mark.parametrize("scheme", ["ngram", "span", "whole-word", "token"])
def test_each_scheme_masks_at_load_time_by_sample_only(tokens_samples, wordpiece, scheme):
    """A sample's mask depends on (seed, epoch, index), not on the batch it is in."""
    collator = MLMCollator(wordpiece, masking="dynamic", masking_scheme=scheme, nsp=False, seed=5)
    whole = collator(tokens_samples[:40])
    parts = [collator(tokens_samples[i:min(i + 7, 40)]) for i in range(0, 40, 7)]
    for key in ("input_ids", "labels"):
        joined = torch.cat([torch.nn.functional.pad(p[key], (0, whole[key].shape[1] - p[key].shape[1]),
                                                    value=-100 if key == "labels" else wordpiece.special.pad)
                            for p in parts])
        assert torch.equal(joined, whole[key]), key
    _, _, share = _runs(whole, wordpiece)
    assert abs(share - 0.15) < 0.02
    other = MLMCollator(wordpiece, masking="dynamic", masking_scheme=scheme, nsp=False, seed=6)(tokens_samples[:40])
    assert not torch.equal(other["labels"], whole["labels"])


def test_ngram_masks_longer_runs_than_whole_words(tokens_samples, wordpiece):
    runs = {}
    for scheme in ("whole-word", "ngram"):
        batch = MLMCollator(wordpiece, masking="dynamic", masking_scheme=scheme, nsp=False, seed=1)(tokens_samples[:400])
        runs[scheme] = _runs(batch, wordpiece)[0].mean()
    assert runs["ngram"] > 1.3 * runs["whole-word"]


@pytest.mark.parametrize("kwargs", [
    {"masking_scheme": "spans"},
    {"masking_scheme": "span", "masking": "static"},
    {"masking_scheme": "span", "whole_word_mask": True},
    {"masking_scheme": "span", "span_lower": 5, "span_upper": 2},
])
def test_bad_scheme_settings_are_value_errors(wordpiece, kwargs):
    with pytest.raises(ValueError):
        MLMCollator(wordpiece, **{"masking": "dynamic", **kwargs})


def test_train_masks_with_a_scheme(tokens_out, tmp_path):
    from mlm_pipeline.torch.train import TrainConfig, main

    common = dict(data=tokens_out, steps=3, batch_size=8, layers=1, hidden=32, heads=2, threads=1, eval_batches=1,
                  log_every=0)
    summary = main(TrainConfig(**common, masking_scheme="span", output_dir=str(tmp_path / "span")))
    assert summary["masking"] == "dynamic" and summary["masking_scheme"] == "span"
    assert summary["steps_run"] == 3
    with pytest.raises(ValueError, match="--masking-scheme ngram needs dynamic masking, and --masking electra"):
        main(TrainConfig(**common, masking="electra", masking_scheme="ngram", output_dir=str(tmp_path / "x")))
