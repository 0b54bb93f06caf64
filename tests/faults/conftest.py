"""The fault suite: real ``prepare`` runs on a 5 MB corpus, a fault injected, then a rerun.

Every case asserts what a clean run gives: byte-identical shards, every input document read or
counted as skipped, no process left behind, no temporary file left behind, and a message that
names the fault. Each records what it injected in :data:`TALLY`; the suite prints the table at
the end (faults injected, runs recovered, documents lost).
"""

from __future__ import annotations

import os
import shutil
from dataclasses import dataclass, field
from pathlib import Path

import pytest

from faults.helpers import SOURCES, run_config

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


@dataclass
class Tally:
    rows: list = field(default_factory=list)

    def record(self, case: str, *, injected: int = 1, recovered: int = 1, documents_lost: int = 0) -> None:
        self.rows.append((case, injected, recovered, documents_lost))


TALLY = Tally()


def pytest_terminal_summary(terminalreporter):
    if not TALLY.rows:
        return
    tr = terminalreporter
    tr.section("fault suite")
    width = max(len(r[0]) for r in TALLY.rows)
    tr.write_line(f"{'case':<{width}}  injected  recovered  documents lost")
    for case, injected, recovered, lost in TALLY.rows:
        tr.write_line(f"{case:<{width}}  {injected:>8}  {recovered:>9}  {lost:>14}")
    tr.write_line(f"{'total':<{width}}  {sum(r[1] for r in TALLY.rows):>8}  {sum(r[2] for r in TALLY.rows):>9}  "
                  f"{sum(r[3] for r in TALLY.rows):>14}")


@pytest.fixture(scope="session")
def corpus(tmp_path_factory) -> Path:
    """A 5 MB corpus of the bundled real text: 5 files, some of them several tasks long."""
    d = tmp_path_factory.mktemp("corpus")
    for i in (1, 2):
        for src in SOURCES[:2]:
            shutil.copyfile(src, d / f"{src.stem}-{i}.txt")
    shutil.copyfile(SOURCES[2], d / SOURCES[2].name)
    assert sum(p.stat().st_size for p in d.iterdir()) >= 4_000_000
    return d


_CLEAN: dict = {}


@pytest.fixture(scope="session")
def clean_run(corpus, tmp_path_factory):
    """``clean_run(fmt)``: the manifest of a fault-free run (made once per format)."""
    from mlm_pipeline.pipeline import run_prepare

    def get(fmt: str = "parquet") -> dict:
        if fmt not in _CLEAN:
            out = tmp_path_factory.mktemp(f"clean-{fmt}") / "out"
            _CLEAN[fmt] = (run_prepare(run_config(corpus, out, fmt=fmt, workers=2), show_progress=False), out)
        return _CLEAN[fmt][0]

    return get


@pytest.fixture
def tally():
    return TALLY
