"""An input edited between a killed run and its resume is refused, not mixed into the output."""

from __future__ import annotations

import os
import shutil

import pytest

from faults.helpers import run_config


def _first_run_one_task(corpus, out, **settings):
    """Start a run and complete one task of it (as a run killed early would have)."""
    from mlm_pipeline.executors.base import run_one
    from mlm_pipeline.run.state import start_run

    config = run_config(corpus, out, **settings)
    start = start_run(config)
    run_one(start.pending[0], config)
    return config


@pytest.fixture
def own_corpus(corpus, tmp_path):
    d = tmp_path / "corpus"
    shutil.copytree(corpus, d)
    return d


def _edit_in_place(path, offset: int, keep_mtime: bool) -> None:
    st = path.stat()
    data = bytearray(path.read_bytes())
    data[offset] = ord("Q") if data[offset] != ord("Q") else ord("R")
    path.write_bytes(bytes(data))
    if keep_mtime:
        os.utime(path, ns=(st.st_atime_ns, st.st_mtime_ns))


def test_an_input_edited_in_place_without_a_size_change_is_refused(own_corpus, tmp_path):
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path / "out"
    config = _first_run_one_task(own_corpus, out)
    victim = sorted(own_corpus.iterdir())[-1]
    _edit_in_place(victim, victim.stat().st_size // 3, keep_mtime=False)
    with pytest.raises(OutputError, match=f"input content changed .*: {victim}"):
        run_prepare(config, show_progress=False)


def test_a_sampled_block_changed_under_a_kept_mtime_is_refused(own_corpus, tmp_path):
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path / "out"
    config = _first_run_one_task(own_corpus, out)
    victim = sorted(own_corpus.iterdir())[0]
    _edit_in_place(victim, 10, keep_mtime=True)  # inside the first sampled block
    with pytest.raises(OutputError, match="input content changed"):
        run_prepare(config, show_progress=False)


def test_verify_inputs_finds_a_byte_changed_anywhere(own_corpus, tmp_path):
    """A byte outside the sampled blocks, the mtime kept: only the full hash sees it."""
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.pipeline import run_prepare
    victim = max(own_corpus.iterdir(), key=lambda p: p.stat().st_size)
    offset = 4096 + 1000  # between the first and the second sampled block
    assert victim.stat().st_size > 16 * 3 * 4096  # (sampled blocks are size / 15 apart)

    plain = tmp_path / "plain"
    config = _first_run_one_task(own_corpus, plain)
    checked = tmp_path / "checked"
    config_checked = _first_run_one_task(own_corpus, checked, verify_inputs=True)
    _edit_in_place(victim, offset, keep_mtime=True)

    run_prepare(config, show_progress=False)  # not seen without --verify-inputs (documented)
    with pytest.raises(OutputError, match=f"SHA-256 of its bytes\\): {victim}"):
        run_prepare(config_checked, show_progress=False)


def test_an_unchanged_input_resumes(own_corpus, tmp_path, clean_run):
    from faults.helpers import assert_as_clean
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path / "out"
    config = _first_run_one_task(own_corpus, out, verify_inputs=True)
    run_prepare(config, show_progress=False)
    assert_as_clean(out, clean_run("parquet"))
