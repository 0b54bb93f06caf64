"""Output bytes are a contract: the sha256 of every shard for a fixed matrix of runs.

The expected digests in ``data/shard_digests.json`` were recorded before the package was
re-laid out; a refactor must keep them. Each case runs with 1 and 2 workers against the same
expected table, so this also checks that output does not depend on the worker count.
Regenerate (only for an intended change of output, with the reason in the commit) with
``MLM_RECORD_DIGESTS=1 pytest tests/test_shard_digests.py``.
"""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest

from conftest import DATA, SAMPLE_TEXT, VOCAB, WIKIEXTRACTOR, WIKITEXT

DIGESTS = DATA / "shard_digests.json"
INPUTS = [WIKITEXT, SAMPLE_TEXT, WIKIEXTRACTOR, DATA / "hongloumeng-300KB.txt"]

CASES = [
    # (tokens writes no masks, so its dupe-factor 2 would only copy: one pass)
    dict(objective=objective, format=fmt, reference=False, do_whole_word_mask=wwm,
         **({"dupe_factor": 1} if objective == "tokens" else {}))
    for objective in ("nsp", "packed", "tokens", "electra")
    for fmt in ("tfrecord", "parquet")
    for wwm in ((False,) if objective in ("tokens", "electra") else (False, True))
] + [
    # packed's other packings: best-fit of whole documents, DOC-SENTENCES
    dict(objective="packed", format=fmt, reference=False, do_whole_word_mask=False, **packing)
    for fmt in ("tfrecord", "parquet")
    for packing in ({"packing": "best-fit"}, {"cross_document": False})
] + [
    # (read as raw lines, as Google's script reads any file: the WikiExtractor file's <doc> lines included)
    dict(objective="nsp", format=fmt, reference=True, do_whole_word_mask=wwm, input_format="text")
    for fmt in ("tfrecord", "parquet")
    for wwm in (False, True)
]


def case_id(case: dict) -> str:
    return "-".join([case["objective"], case["format"], "ref" if case["reference"] else "fast",
                     "wwm" if case["do_whole_word_mask"] else "tok"]
                    + ([case["packing"]] if "packing" in case else [])
                    + (["no-cross-document"] if case.get("cross_document") is False else []))


def run_case(case: dict, out: Path, workers: int, *, with_manifest: bool = False, **settings):
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    config = build_config({
        "inputs": [str(p) for p in INPUTS], "output": str(out), "tokenizer": str(VOCAB),
        "split_bytes": "256KiB", "block_bytes": "128KiB", "max_instances_per_shard": 2000,
        "dupe_factor": 2, "random_seed": 777, "workers": workers, "progress": False, **case, **settings,
    })
    manifest = run_prepare(config, show_progress=False)
    table = [[s["path"], s["sha256"], s["instances"]] for s in manifest["shards"]]
    return (table, manifest) if with_manifest else table


@pytest.mark.slow
@pytest.mark.parametrize("workers", [1, 2])
@pytest.mark.parametrize("case", CASES, ids=case_id)
def test_shard_digests_unchanged(case, workers, tmp_path):
    got = run_case(case, tmp_path / "out", workers)
    assert got, "a run of this matrix must write shards"
    if os.environ.get("MLM_RECORD_DIGESTS") and workers == 1:
        table = json.loads(DIGESTS.read_text()) if DIGESTS.exists() else {}
        table[case_id(case)] = got
        DIGESTS.write_text(json.dumps(table, indent=1, sort_keys=True) + "\n")
    expected = json.loads(DIGESTS.read_text())[case_id(case)]
    assert got == expected
