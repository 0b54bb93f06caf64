"""The NeMo Curator recipe of docs/inputs.md, run as written: a real NeMo Curator pipeline (reader,
word-count filter keeping its score, removal of listed exact duplicates, JSONL and Parquet writers)
on Ray, on the bundled WikiText, then ``prepare`` on what it wrote. The figures the page gives are
checked, and the two writers' outputs give the same shards.

The recipe runs in a child process, which starts and stops its own local Ray (as a user's script
does): nothing here imports ray or nemo_curator, whose import starts Ray's, in the test process."""

from __future__ import annotations

import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile

import pyarrow.parquet as pq
import pytest

from conftest import REPO

from .helpers import docs_recipe, prepare_as_typed, wikitext_articles

if importlib.util.find_spec("nemo_curator") is None:
    pytest.skip("nemo-curator is not installed (the test extra installs it)", allow_module_level=True)

pytestmark = pytest.mark.ray  # the recipe starts a local Ray

PAGE = REPO / "docs" / "inputs.md"


def test_the_nemo_curator_recipe_runs_and_prepare_reads_what_it_wrote(tmp_path):
    python, args = docs_recipe(PAGE, "nemo-curator")
    (tmp_path / "sample").symlink_to(REPO / "sample")
    (tmp_path / "recipe.py").write_text(python, encoding="utf-8")
    ray_tmp = tempfile.mkdtemp(prefix="mlc", dir="/tmp")  # short: Ray's socket paths have a length limit
    # its own Ray: a private temp dir, so ray.init neither finds another test's cluster nor leaves files
    env = {k: v for k, v in os.environ.items() if k != "RAY_ADDRESS"}
    env.update(HF_HUB_OFFLINE="1", OMP_NUM_THREADS="1", RAY_TMPDIR=ray_tmp, RAY_USAGE_STATS_ENABLED="0",
               RAY_AUTH_MODE="disabled")
    try:
        done = subprocess.run([sys.executable, "recipe.py"], cwd=tmp_path, env=env, capture_output=True,
                              text=True, timeout=600)
    finally:
        shutil.rmtree(ray_tmp, ignore_errors=True)
    assert done.returncode == 0, done.stderr[-3000:]

    articles = wikitext_articles(REPO / "sample" / "wikitext2-train-1MB.txt")
    crawl = [json.loads(line) for line in (tmp_path / "crawl.jsonl").read_text().splitlines()]
    assert len(crawl) == len(articles) + 5 == 69  # as the page says: 64 articles, the first 5 twice
    stubs = [a for a in articles if len(a.split()) < 300]
    assert len(stubs) == 3 and not set(stubs) & set(articles[:5])  # the filter's 3; no repeat is a stub
    kept = [r for r in crawl if len(r["text"].split()) >= 300 and int(r["id"].split("-")[1]) < len(articles)]
    assert len(kept) == 61

    files = sorted((tmp_path / "curator-jsonl").iterdir())
    assert [p.suffix for p in files] == [".jsonl"]
    records = [json.loads(line) for line in files[0].read_text(encoding="utf-8").splitlines()]
    assert [r["id"] for r in records] == [r["id"] for r in kept]  # in the crawl's order, first copies kept
    assert all(set(r) == {"text", "id", "metadata", "word_count"} for r in records)
    assert [r["word_count"] for r in records] == [len(r["text"].split()) for r in kept]
    assert [r["metadata"] for r in records] == [r["metadata"] for r in kept]
    parquet = sorted((tmp_path / "curator-parquet").iterdir())
    assert [p.suffix for p in parquet] == [".parquet"]
    table = pq.read_table(parquet[0])
    assert set(table.column_names) == {"text", "id", "metadata", "word_count", "__index_level_0__"}
    assert table.column("text").to_pylist() == [r["text"] for r in kept]

    manifest = prepare_as_typed(tmp_path, args)
    assert manifest["totals"]["documents_read"] == 61  # 3 stubs, 5 repeats gone
    assert manifest["totals"]["documents_skipped"] == {} and manifest["format"] == "hf"
    assert [i["path"].rsplit("/", 1)[-1] for i in manifest["inputs"]] == [files[0].name]
    parquet_args = [a.replace("curator-jsonl/", "curator-parquet/").replace("curator-out/", "curator-parquet-out/")
                    for a in args]
    assert parquet_args != args
    from_parquet = prepare_as_typed(tmp_path, parquet_args)
    assert from_parquet["totals"]["documents_read"] == 61
    assert [s["sha256"] for s in from_parquet["shards"]] == [s["sha256"] for s in manifest["shards"]]
