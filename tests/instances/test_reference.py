"""Reference mode against the golden outputs of google-research/bert's create_pretraining_data.py."""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import numpy as np
import pytest

from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.instances.reference import (
    FEATURES,
    create_reference_instances,
    describe_first_difference,
    read_reference_documents,
    reference_continuation_table,
    reference_instances_for_file,
    split_reference_lines,
    tokenize_reference_documents,
)
from mlm_pipeline.tokenize import load_tokenizer

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden"
SAMPLE = ROOT / "sample"
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


@pytest.fixture(scope="module")
def tokenizer():
    return load_tokenizer(str(SAMPLE / "bert-base-uncased-vocab.txt"), True)


def load_golden(name: str) -> tuple[dict, dict[str, np.ndarray]]:
    settings = json.loads((GOLDEN / f"{name}.json").read_text())
    with gzip.open(GOLDEN / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    features = {k: np.array([r[k] for r in rows]) for k in FEATURES}
    return settings, features


@pytest.mark.parametrize("name", CASES)
def test_matches_golden(name, tokenizer):
    settings, expected = load_golden(name)
    assert settings["do_lower_case"] is True
    batch = reference_instances_for_file(
        str(SAMPLE / settings["input_file"]), tokenizer, **{k: settings[k] for k in SETTINGS}
    )
    assert len(batch) == settings["instances"] == len(expected["input_ids"])
    actual = batch.padded(settings["max_seq_length"], settings["max_predictions_per_seq"])
    report = describe_first_difference(actual, expected, tokenizer.convert_ids_to_tokens)
    assert report is None, f"{name}: reference mode differs from the golden output\n{report}"


def test_difference_report_names_instance_feature_and_tokens(tokenizer):
    _, expected = load_golden("sample_text-d10")
    actual = {k: v.copy() for k, v in expected.items()}
    # Instance 7: a masked position's label changes, and its token in input_ids too.
    pos = int(actual["masked_lm_positions"][7, 0])
    actual["masked_lm_ids"][7, 0] = tokenizer.tokenizer.token_to_id("zebra")
    actual["input_ids"][7, pos] = tokenizer.special.mask
    # A later instance differs as well; the report must name the first one.
    actual["next_sentence_labels"][20, 0] ^= 1

    report = describe_first_difference(actual, expected, tokenizer.convert_ids_to_tokens)
    assert report is not None
    assert "first differing instance: 7 " in report
    assert "feature masked_lm_ids differs, first at column 0" in report
    assert "feature next_sentence_labels" not in report
    actual_part, expected_part = report.split("\nexpected:\n")
    assert "[CLS]" in actual_part and "[SEP]" in actual_part
    assert "{[MASK]->zebra}" in actual_part
    assert "->zebra}" not in expected_part
    exp_tokens = tokenizer.convert_ids_to_tokens(expected["input_ids"][7][: int(expected["input_mask"][7].sum())])
    assert exp_tokens[1] in expected_part

    assert describe_first_difference(expected, expected, tokenizer.convert_ids_to_tokens) is None
    short = {k: v[:-1] for k, v in expected.items()}
    assert "instance count differs: actual 117, expected 118" in describe_first_difference(
        short, expected, tokenizer.convert_ids_to_tokens
    )


def test_lines_are_cut_like_tf_readline():
    # TF's line reader ends lines at \n only and drops every \r, also inside a line.
    assert split_reference_lines("a b\r\nc\rd\x0be\u2028f\n\r\ng") == ["a b", "cd\x0be\u2028f", "", "g"]


def test_documents_split_on_lines_that_strip_to_nothing():
    lines = ["", " first one ", "\t", "second", "more", "\x1c", "", "third", ""]
    assert read_reference_documents(lines) == [["first one"], ["second", "more"], ["third"]]
    assert read_reference_documents([]) == []


def test_tokenize_drops_empty_sentences_and_documents(tokenizer):
    docs = [["\x00\u200b", "Hello there."], ["\ufffd"], ["A [SEP] b", "x" * 150]]
    out = tokenize_reference_documents(docs, tokenizer)
    assert len(out) == 2
    assert [len(d) for d in out] == [1, 2]
    toks = tokenizer.convert_ids_to_tokens
    assert toks(out[0][0]) == ["hello", "there", "."]
    # Google's tokenizer has no special-token matching and a 200-character word limit.
    assert toks(out[1][0]) == ["a", "[", "sep", "]", "b"]
    assert "[UNK]" not in toks(out[1][1])


def test_word_final_capital_sigma_lowercases_like_python(tokenizer):
    # Google lower-cases with str.lower ("ΟΔΟΣ" -> "οδος"); HF alone would give "οδοσ".
    out = tokenize_reference_documents([["ΟΔΟΣ ΣΑΣ\u00adΣ."]], tokenizer)
    assert tokenizer.convert_ids_to_tokens(out[0][0]) == ["ο", "##δ", "##ος", "σ", "##α", "##σ", "##ς", "."]


def test_continuation_table_uses_the_reference_rule(tokenizer):
    vocab = tokenizer.tokenizer.get_vocab()
    strings = sorted(vocab, key=vocab.get)
    table = reference_continuation_table(strings)
    assert table[vocab["##ing"]] and table[vocab["###"]] and not table[vocab["#"]]
    assert table.sum() == sum(s.startswith("##") for s in strings)


def test_settings_are_validated():
    docs = [[np.array([5, 6], np.int32)]]
    kwargs = dict(
        vocab_size=10, cls_id=1, sep_id=2, mask_id=3, is_continuation=np.zeros(10, bool),
        max_seq_length=128, dupe_factor=1, short_seq_prob=0.1, masked_lm_prob=0.15,
        max_predictions_per_seq=20, do_whole_word_mask=False, random_seed=1,
    )
    assert isinstance(create_reference_instances(docs, **kwargs), InstanceBatch)
    with pytest.raises(ValueError, match="max_seq_length"):
        create_reference_instances(docs, **{**kwargs, "max_seq_length": 4})
    with pytest.raises(ValueError, match="masked_lm_prob"):
        create_reference_instances(docs, **{**kwargs, "masked_lm_prob": 1.5})
    with pytest.raises(ValueError, match="empty"):
        create_reference_instances([[np.zeros(0, np.int32)]], **kwargs)
