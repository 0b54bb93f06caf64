"""One long run of tokens: a worker's memory stays bounded whatever a line holds.

A 16 MB line with no sentence break (the longest ``--max-line-bytes`` allows) and a 5 MB line of
``[[`` are each one sentence of millions of tokens. ``prepare --workers 1`` runs the task in its
own process; its peak RSS (``ru_maxrss`` of a child, measured by a wrapper process that runs
nothing else) must stay within 500 MB, and the tokens written must be those of the whole line.
"""

from __future__ import annotations

import json
import random
import subprocess
import sys
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from faults.helpers import SAMPLE, VOCAB

pytestmark = pytest.mark.slow  # four runs of 5-30 s

PEAK_RSS_LIMIT_MB = 500

# runs a command and prints its peak RSS in KB (Linux: ru_maxrss of the waited-for children)
_MEASURE = ("import resource, subprocess, sys; rc = subprocess.call(sys.argv[1:]); "
            "print(resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss); sys.exit(rc)")


@pytest.fixture(scope="module")
def long_lines(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("long-lines")
    words = (SAMPLE / "wikitext2-train-1MB.txt").read_text(encoding="utf-8").split()
    draw = random.Random(7)
    line = " ".join(draw.choices(words, k=3_200_000))
    line = line[: line.rfind(" ", 0, 16_000_000)]
    (d / "unbroken-16MB.txt").write_text(line + "\n", encoding="utf-8")
    (d / "brackets-5MB.txt").write_text("[[" * 2_500_000 + "\n", encoding="utf-8")
    assert 15_000_000 < (d / "unbroken-16MB.txt").stat().st_size <= 16 << 20
    return {"unbroken": d / "unbroken-16MB.txt", "brackets": d / "brackets-5MB.txt"}


def _peak_rss_mb(args: list[str]) -> float:
    cmd = [sys.executable, "-c", _MEASURE, sys.executable, "-m", "mlm_pipeline.cli", "prepare", *args]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    return int(done.stdout.strip().splitlines()[-1]) / 1000


def _window_tokens(out: Path) -> list[int]:
    """Every token of the ``tokens`` objective's windows, [CLS]/[SEP] dropped, in stream order
    (windows are shuffled: their position in the stream is recovered by sorting the windows
    of the whole line's ids the same way)."""
    rows = [r for p in sorted((out / "shards").iterdir()) for r in pq.read_table(p).column("input_ids").to_pylist()]
    return sorted(tuple(r[1:-1]) for r in rows)


@pytest.mark.parametrize("name", ["unbroken", "brackets"])
@pytest.mark.parametrize("backend", ["auto", "hf"])
def test_one_long_line_stays_within_the_memory_bound(long_lines, name, backend, tmp_path, tally):
    from mlm_pipeline.tokenize import load_tokenizer

    path = long_lines[name]
    out = tmp_path / "out"
    objective = ["--objective", "tokens", "--format", "parquet", "--max-seq-length", "512"] if backend == "hf" else []
    peak = _peak_rss_mb([str(path), "-o", str(out), "-t", str(VOCAB), "--workers", "1", "--no-progress",
                         "--max-line-bytes", "16MiB", "--tokenizer-backend", backend, *objective])
    manifest = json.loads((out / "manifest.json").read_text())
    totals = manifest["totals"]
    assert totals["documents_read"] == 1 and totals["sentences"] == 1 and totals["instances"] >= 1
    # the whole line's tokens: what the fast backend (not bounded by HF's memory) gives for it whole
    text = path.read_text(encoding="utf-8").strip()
    whole, _ = load_tokenizer(str(VOCAB), True, backend="nanotoken").checked.encode_batch([text])
    assert totals["tokens"] == len(whole)
    if backend == "hf":  # every token of the line is in the windows, as the uncut line gives them
        cap = 510
        expected = sorted(tuple(whole[i : i + cap].tolist()) for i in range(0, len(whole), cap))
        assert _window_tokens(out) == expected
    assert peak <= PEAK_RSS_LIMIT_MB, f"peak RSS {peak:.0f} MB for {path.name} ({backend})"
    tally.record(f"long line: {path.name}, --tokenizer-backend {backend}")


@pytest.fixture(scope="module")
def hostile_pages(tmp_path_factory) -> dict[str, Path]:
    """A Wikipedia dump page whose text is 5 MB of ``[[``, and one of 16,000 ``<ref>`` never closed
    (the bundled table-markup excerpt, its first page's text replaced)."""
    import bz2
    import re

    from faults.helpers import REPO

    xml = bz2.decompress((REPO / "tests" / "data" / "wiki" / "enwiki-table-markup.xml.bz2").read_bytes())
    text = re.search(rb"<text[^>]*>(.*?)</text>", xml, re.S)
    d = tmp_path_factory.mktemp("pages")
    bodies = {"brackets": b"[[" * 2_500_000, "refs": b"Some words about it.&lt;ref&gt;a citation " * 16_000}
    for name, body in bodies.items():
        (d / f"{name}-pages-articles.xml").write_bytes(xml[:text.start(1)] + body + xml[text.end(1):])
    return {name: d / f"{name}-pages-articles.xml" for name in bodies}


@pytest.mark.parametrize("name", ["brackets", "refs"])
def test_a_hostile_dump_page_stays_within_the_memory_bound_and_takes_seconds(hostile_pages, name, tmp_path, tally):
    """A 5 MB page of ``[[`` (it cost 2.5 GB) and a page of 16,000 unclosed ``<ref>`` (the cleaner
    was quadratic in them: minutes): each dump is read whole, in bounded memory, in seconds."""
    import time

    started = time.monotonic()
    peak = _peak_rss_mb([str(hostile_pages[name]), "-o", str(tmp_path / "out"), "-t", str(VOCAB), "--workers", "1",
                         "--no-progress"])
    seconds = time.monotonic() - started
    totals = json.loads((tmp_path / "out" / "manifest.json").read_text())["totals"]
    assert totals["documents_read"] + sum(totals["documents_skipped"].values()) == 5  # every page accounted for
    assert peak <= PEAK_RSS_LIMIT_MB, f"peak RSS {peak:.0f} MB for the {name} page"
    assert seconds < 60, f"{seconds:.0f} s for the {name} page"  # (1.5 and 3 s on a 2-core VM)
    tally.record(f"dump page: {name}")
