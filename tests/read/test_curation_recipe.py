"""The curation recipe of docs/inputs.md, run as written: a real datatrove pipeline (reader, filter,
exact dedup, JSONL and Parquet writers) on the bundled WikiText, then ``prepare`` on what it
wrote. The figures the page gives are checked, and the two writers' outputs give the same shards."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO

from .helpers import docs_recipe, prepare_as_typed, wikitext_articles

pytest.importorskip("datatrove")
pytest.importorskip("orjson")  # (datatrove's JSONL reader needs it)

PAGE = REPO / "docs" / "inputs.md"


def _expected_documents() -> int:
    """What the recipe should keep, counted without datatrove: articles of 2,000 characters or
    more, each text once."""
    articles = wikitext_articles(REPO / "sample" / "wikitext2-train-1MB.txt")
    return len({a for a in articles if len(a) >= 2000})


def test_the_datatrove_recipe_runs_and_prepare_reads_what_it_wrote(tmp_path):
    python, args = docs_recipe(PAGE, "datatrove")
    (tmp_path / "sample").symlink_to(REPO / "sample")
    (tmp_path / "recipe.py").write_text(python, encoding="utf-8")
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1"}
    done = subprocess.run([sys.executable, "recipe.py"], cwd=tmp_path, env=env, capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    records = [json.loads(line) for line in (tmp_path / "crawl.jsonl").read_text().splitlines()]
    assert len(records) == 69  # as the page says: 64 articles, the first 5 twice
    assert sorted(p.name for p in (tmp_path / "curated").iterdir()) == ["00000.jsonl.gz"]

    manifest = prepare_as_typed(tmp_path, args)
    assert manifest["totals"]["documents_read"] == _expected_documents() == 61  # 3 stubs, 5 repeats gone
    assert manifest["totals"]["documents_skipped"] == {} and manifest["format"] == "hf"
    assert [i["path"].rsplit("/", 1)[-1] for i in manifest["inputs"]] == ["00000.jsonl.gz"]
    from_parquet = prepare_as_typed(tmp_path, [a.replace("curated/", "curated-parquet/")
                                               .replace("curated-out/", "curated-parquet-out/") for a in args])
    assert [s["sha256"] for s in from_parquet["shards"]] == [s["sha256"] for s in manifest["shards"]]
