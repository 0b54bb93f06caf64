"""Reference mode against the golden outputs of google-research/bert's create_pretraining_data.py."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, strategies as st

from conftest import GOLDEN, SAMPLE
from mlm_pipeline.errors import ConfigError
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.instances.reference import (
    ReferenceSettings,
    ReferenceVocab,
    create_training_instances,
    reference_instances_for_file,
    truncate_seq_pair,
)

from instances.golden_tools import describe_first_difference, load_golden as _load_golden

CASES = [
    "sample_text-d10",
    "sample_text-wwm-d5",
    "wikitext2-train-1MB-d2",
    "wikitext2-train-1MB-wwm-s512-d1",
]
SETTINGS = (
    "max_seq_length",
    "max_predictions_per_seq",
    "masked_lm_prob",
    "dupe_factor",
    "short_seq_prob",
    "do_whole_word_mask",
    "random_seed",
)


def load_golden(name: str) -> tuple[dict, dict[str, np.ndarray]]:
    return _load_golden(GOLDEN, name)


@pytest.mark.parametrize("name", CASES)
def test_matches_golden(name, tok):
    settings, expected = load_golden(name)
    assert settings["do_lower_case"] is True
    batch = reference_instances_for_file(
        str(SAMPLE / settings["input_file"]), tok, **{k: settings[k] for k in SETTINGS}
    )
    assert len(batch) == settings["instances"] == len(expected["input_ids"])
    actual = batch.padded(settings["max_seq_length"], settings["max_predictions_per_seq"])
    report = describe_first_difference(actual, expected, tok.convert_ids_to_tokens)
    assert report is None, f"{name}: reference mode differs from the golden output\n{report}"


def test_difference_report_names_instance_feature_and_tokens(tok):
    _, expected = load_golden("sample_text-d10")
    actual = {k: v.copy() for k, v in expected.items()}
    # Instance 7: a masked position's label changes, and its token in input_ids too.
    pos = int(actual["masked_lm_positions"][7, 0])
    actual["masked_lm_ids"][7, 0] = tok.tokenizer.token_to_id("zebra")
    actual["input_ids"][7, pos] = tok.special.mask
    # A later instance differs as well; the report must name the first one.
    actual["next_sentence_labels"][20, 0] ^= 1

    report = describe_first_difference(actual, expected, tok.convert_ids_to_tokens)
    assert report is not None
    assert "first differing instance: 7 " in report
    assert "feature masked_lm_ids differs, first at column 0" in report
    assert "feature next_sentence_labels" not in report
    actual_part, expected_part = report.split("\nexpected:\n")
    assert "[CLS]" in actual_part and "[SEP]" in actual_part
    assert "{[MASK]->zebra}" in actual_part
    assert "->zebra}" not in expected_part
    exp_tokens = tok.convert_ids_to_tokens(expected["input_ids"][7][: int(expected["input_mask"][7].sum())])
    assert exp_tokens[1] in expected_part

    assert describe_first_difference(expected, expected, tok.convert_ids_to_tokens) is None
    short = {k: v[:-1] for k, v in expected.items()}
    assert "instance count differs: actual 117, expected 118" in describe_first_difference(
        short, expected, tok.convert_ids_to_tokens
    )


def test_settings_are_validated():
    docs = [[np.array([5, 6], np.int32)]]
    vocab = ReferenceVocab(size=10, cls_id=1, sep_id=2, mask_id=3, is_continuation=np.zeros(10, bool))
    assert isinstance(create_training_instances(docs, vocab, ReferenceSettings(dupe_factor=1)), InstanceBatch)
    with pytest.raises(ConfigError, match="max_seq_length"):
        ReferenceSettings(max_seq_length=4)
    with pytest.raises(ConfigError, match="masked_lm_prob"):
        ReferenceSettings(masked_lm_prob=1.5)
    with pytest.raises(ConfigError, match="vocab"):
        ReferenceVocab(size=0, cls_id=1, sep_id=2, mask_id=3, is_continuation=np.zeros(0, bool))
    with pytest.raises(ValueError, match="empty"):
        create_training_instances([[np.zeros(0, np.int32)]], vocab, ReferenceSettings())


def _truncate_lists(tokens_a: list, tokens_b: list, max_num_tokens: int, rng: random.Random) -> None:
    """The script's truncation on token lists: the longer list (B on ties) loses its first or
    last token on a coin, until the pair fits."""
    while len(tokens_a) + len(tokens_b) > max_num_tokens:
        longer = tokens_a if len(tokens_a) > len(tokens_b) else tokens_b
        if rng.random() < 0.5:
            del longer[0]
        else:
            longer.pop()


@given(st.integers(1, 300), st.integers(1, 300), st.integers(2, 509), st.integers(0, 2**32))
def test_truncate_seq_pair_moves_range_ends_like_the_script_pops_tokens(len_a, len_b, max_num_tokens, seed):
    script_rng, our_rng = random.Random(seed), random.Random(seed)
    tokens_a, tokens_b = list(range(len_a)), list(range(1000, 1000 + len_b))
    _truncate_lists(tokens_a, tokens_b, max_num_tokens, script_rng)
    a, b = truncate_seq_pair((0, len_a), (1000, 1000 + len_b), max_num_tokens, our_rng)
    assert (list(range(*a)), list(range(*b))) == (tokens_a, tokens_b)
    assert our_rng.getstate() == script_rng.getstate()  # the same draws, in the same number
