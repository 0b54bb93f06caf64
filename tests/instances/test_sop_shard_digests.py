"""Output bytes of ``--objective sop`` are a contract too: the sha256 of every shard for sop
with each masking scheme (ALBERT's n-grams of words by default, n-grams of tokens, whole words,
spans), TFRecord and Parquet, as ``test_shard_digests.py`` holds them for the other objectives.

The expected digests in ``data/sop_shard_digests.json`` were recorded on the code before the
n-gram masking was vectorised further (a change that must not move a byte). Regenerate (only for
an intended change of output, with the reason in the commit) with
``MLM_RECORD_DIGESTS=1 pytest tests/instances/test_sop_shard_digests.py``.
"""

from __future__ import annotations

import json
import os

import pytest

from conftest import DATA
from test_shard_digests import run_case

DIGESTS = DATA / "sop_shard_digests.json"

CASES = [
    dict(objective="sop", format=fmt, reference=False, do_whole_word_mask=wwm, **scheme)
    for fmt in ("tfrecord", "parquet")
    for scheme, wwm in (({}, True), ({}, False), ({"masking_scheme": "whole-word"}, True),
                        ({"masking_scheme": "span"}, True))
] + [dict(objective="sop", format="tfrecord", reference=False, do_whole_word_mask=True, masked_lm_prob=0.4,
          max_predictions_per_seq=60, ngram=4, favor_shorter_ngram=False, max_seq_length=256)]


def case_id(case: dict) -> str:
    scheme = case.get("masking_scheme", "ngram")
    words = "words" if case["do_whole_word_mask"] else "tokens"
    extra = "-p0.4-n4-long" if "ngram" in case else ""
    return f"sop-{case['format']}-{scheme}-{words}{extra}"


@pytest.mark.slow
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_sop_shard_digests_unchanged(case, tmp_path):
    got = run_case(case, tmp_path / "out", 1)
    assert got, "a run of this matrix must write shards"
    if os.environ.get("MLM_RECORD_DIGESTS"):
        table = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
        table[case_id(case)] = got
        DIGESTS.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    assert got == json.loads(DIGESTS.read_text())[case_id(case)]
