"""What a whole ``mlm-pipeline prepare`` process loads: a local run must not pay for modules it never
uses (each is start-up CPU time of every run, what a user timing the command from the shell sees)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import REPO, SAMPLE_TEXT, VOCAB

# Run the CLI as ``mlm-pipeline`` does, then list which of the given modules were imported.
_RUN = """
import json, runpy, sys
watched = json.loads(sys.argv[1])
sys.argv = ["mlm-pipeline", *sys.argv[2:]]
try:
    runpy.run_module("mlm_pipeline.cli", run_name="__main__")
except SystemExit as exc:
    if exc.code:
        raise
print(json.dumps(sorted(m for m in watched if m in sys.modules)))
"""

NOT_IN_A_LOCAL_RUN = ["pandas", "fsspec", "asyncio", "rich"]
"""Modules a local TFRecord or Parquet ``prepare`` does not import (pyarrow's ``pa.scalar`` and
``pa.array`` import pandas, when it is installed, just to probe for its types: ~0.2 s). fsspec
(with the asyncio it imports) is for URLs of object stores: local paths go to ``os``
(:mod:`mlm_pipeline.fs`); rich draws progress bars and help pages, neither shown here."""


def modules_loaded(args: list[str], watched: list[str]) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO / "src"), "TOKENIZERS_PARALLELISM": "false"}
    done = subprocess.run([sys.executable, "-c", _RUN, json.dumps(watched), *args], env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout.strip().splitlines()[-1])


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_a_local_prepare_loads_no_module_it_does_not_use(tmp_path, fmt):
    args = ["prepare", str(SAMPLE_TEXT), "-o", str(tmp_path / "out"), "-t", str(VOCAB), "--workers", "1",
            "--no-progress", "--format", fmt, "--dupe-factor", "2"]
    assert modules_loaded(args, NOT_IN_A_LOCAL_RUN) == []
    assert (tmp_path / "out" / "manifest.json").exists()


def test_a_parquet_run_carrying_record_ids_loads_no_pandas_either(tmp_path):
    """The ``document_ids`` and ``document_metadata`` columns are built from buffers too."""
    lines = [line for line in SAMPLE_TEXT.read_text(encoding="utf-8").splitlines() if line.strip()]
    records = tmp_path / "records.jsonl"
    records.write_text("".join(json.dumps({"text": line, "id": f"r{n}", "metadata": {"n": n}}) + "\n"
                               for n, line in enumerate(lines)), encoding="utf-8")
    args = ["prepare", str(records), "-o", str(tmp_path / "out"), "-t", str(VOCAB), "--workers", "1",
            "--no-progress", "--format", "parquet", "--id-field", "id", "--metadata-field", "metadata"]
    assert modules_loaded(args, NOT_IN_A_LOCAL_RUN) == []
    import pyarrow.parquet as pq

    shard = next((tmp_path / "out").rglob("*.parquet"))
    ids = [i for row in pq.read_table(shard, columns=["document_ids"]).column(0).to_pylist() for i in row]
    assert ids and set(ids) <= {f"r{n}" for n in range(len(lines))}


NOT_IN_A_PACKED_RUN = [*(f"mlm_pipeline.instances.{m}" for m in ("nsp", "reference", "sop", "tokens", "electra")),
                       *(f"mlm_pipeline.masking.{m}" for m in ("whole_word", "ngram", "span")),
                       "mlm_pipeline.read.wikitext", "html", "mlm_pipeline.report.html", "numpy.ma"]
"""What a ``--objective packed`` run of text does not use: the other objectives and masking
schemes (their registries name them without importing them, also to list ``--objective``'s
choices), the converter of Wikipedia dumps' markup (detecting a dump needs none), the HTML report,
numpy's masked arrays (a plain ``np.unique`` imports them)."""


def test_a_run_imports_only_its_own_objective_and_scheme(tmp_path, roberta_bpe):
    """RoBERTa's recipe: packed instances of a byte-level BPE's tokens."""
    args = ["prepare", str(SAMPLE_TEXT), "-o", str(tmp_path / "out"), "-t", str(roberta_bpe), "--workers", "1",
            "--no-progress", "--objective", "packed", "--dupe-factor", "2"]
    assert modules_loaded(args, NOT_IN_A_PACKED_RUN + ["mlm_pipeline.instances.packed", "mlm_pipeline.masking.token"]) \
        == ["mlm_pipeline.instances.packed", "mlm_pipeline.masking.token"]
    assert (tmp_path / "out" / "manifest.json").exists()
