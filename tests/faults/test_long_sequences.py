"""``--max-seq-length 8192`` in flat memory: a worker's peak RSS does not grow with the input.

BERT pairs (``nsp``, the objective that pads the most: the sample's short documents make rows far
shorter than 8,192) masked at 30%, written as TFRecord (padded to 8,192) and as Parquet, on 10 MB
and on 50 MB of real text, one worker: each peak within 500 MB, and the larger input's within
25 MB of the smaller's. (Before masking chunks and TFRecord padding were bounded in cells, the
TFRecord case peaked at 517 MB on 10 MB and 544 MB on 50 MB.) ``benchmarks/prepare_bench.py``
runs the 10 MB -> 1 GB case.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from faults.helpers import SAMPLE, VOCAB
from faults.test_long_runs import PEAK_RSS_LIMIT_MB, _peak_rss_mb

pytestmark = pytest.mark.slow  # four runs, 10 s to a minute each on a 2-core VM

FLAT_MB = 25


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[int, Path]:
    d = tmp_path_factory.mktemp("long-seq")
    text = b"".join((SAMPLE / name).read_bytes() for name in ("wikitext2-train-1MB.txt", "wikiextractor-AA.txt"))
    paths = {}
    for mb in (10, 50):
        path = d / f"text-{mb}MB.txt"
        with open(path, "wb") as f:
            while f.tell() < mb * 1_000_000:
                f.write(text)
        paths[mb] = path
    return paths


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_peak_rss_at_8192_is_flat_and_bounded(inputs, fmt, tmp_path, tally):
    peaks = {}
    for mb, path in inputs.items():
        out = tmp_path / f"out-{mb}"
        peaks[mb] = _peak_rss_mb([str(path), "-o", str(out), "-t", str(VOCAB), "--workers", "1", "--no-progress",
                                  "--format", fmt, "--objective", "nsp", "--max-seq-length", "8192",
                                  "--masked-lm-prob", "0.3", "--max-predictions-per-seq", "2458"])
        totals = json.loads((out / "manifest.json").read_text())["totals"]
        assert totals["instances"] > 0 and totals["masked_tokens"] > 0.25 * totals["tokens"]
    assert max(peaks.values()) <= PEAK_RSS_LIMIT_MB, f"peak RSS {peaks} MB ({fmt})"
    assert abs(peaks[50] - peaks[10]) <= FLAT_MB, f"peak RSS grows with the input: {peaks} MB ({fmt})"
    tally.record(f"--max-seq-length 8192, 10 and 50 MB: {fmt}")
