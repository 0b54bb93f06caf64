"""The Wikipedia dump benchmark still runs (seconds, on a small bundled dump). Never asserts on
speed."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from conftest import REPO


def test_wikidump_bench_smoke(tmp_path):
    out = tmp_path / "bench.json"
    dump = REPO / "tests" / "data" / "wiki" / "enwiki-table-markup-multistream.xml.bz2"
    proc = subprocess.run(
        [sys.executable, str(REPO / "benchmarks" / "wikidump_bench.py"), str(dump),
         "--repeats", "1", "--json", str(out)],
        capture_output=True, text=True, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
        timeout=300,
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "x mwparserfromhell" in proc.stdout
    (entry,) = json.loads(out.read_text())["dumps"]
    assert entry["kind"] == "multistream" and entry["xml_mb"] > 0.2
    assert set(entry["variants"]) == {
        "decompress", "decompress-stdlib", "ours", "ours-stdlib", "ours+sent", "mwph", "prepare"
    }
    assert "x the reader's MB/s" in proc.stdout and entry["prepare_vs_reader_median_ratio"] > 0
    assert all(v["best_mb_per_cpu_s"] > 0 for v in entry["variants"].values())
