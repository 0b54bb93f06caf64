"""Inputs edited between a killed run and its resume: an edit in what a completed task read is
refused, not mixed into the output; an edit where no completed task read (a damaged part
repaired after its task failed) is read as it is now."""

from __future__ import annotations

import shutil

import pytest

from faults.helpers import run_config


def _first_run_one_task(corpus, out, **settings):
    """Start a run and complete its first task (as a run killed early would have); returns the
    config and that task."""
    from mlm_pipeline.executors.base import run_one
    from mlm_pipeline.run.state import start_run

    config = run_config(corpus, out, **settings)
    start = start_run(config)
    task = start.pending[0]
    run_one(task, config)
    return config, start


@pytest.fixture
def own_corpus(corpus, tmp_path):
    d = tmp_path / "corpus"
    shutil.copytree(corpus, d)
    return d


def _flip(path, offset: int) -> None:
    data = bytearray(path.read_bytes())
    data[offset] = ord("Q") if data[offset] != ord("Q") else ord("R")
    path.write_bytes(bytes(data))


def _piece(task):
    from pathlib import Path

    piece = task.pieces[0]
    path = Path(piece.url)
    return path, piece.start, piece.end if piece.end is not None else path.stat().st_size


def test_an_edit_without_a_size_change_in_a_completed_task_is_refused(own_corpus, tmp_path):
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.pipeline import run_prepare

    config, start = _first_run_one_task(own_corpus, tmp_path / "out")
    path, begin, _ = _piece(start.plan.tasks[0])
    _flip(path, begin + 10)  # inside the range's first sampled block
    with pytest.raises(OutputError, match="input bytes of completed tasks changed .*task 00000"):
        run_prepare(config, show_progress=False)


def test_an_edit_where_no_completed_task_read_is_read_as_it_is_now(own_corpus, tmp_path, caplog):
    from mlm_pipeline.pipeline import run_prepare

    config, start = _first_run_one_task(own_corpus, tmp_path / "out")
    path, begin, _ = _piece(start.plan.tasks[1])
    assert start.plan.tasks[1].task_id not in start.done
    _flip(path, begin + 10)
    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        manifest = run_prepare(config, show_progress=False)
    assert manifest["tasks"] == len(start.plan.tasks)
    assert "modified since the run started; the parts that completed tasks read show no change" in caplog.text


def test_verify_inputs_finds_a_byte_changed_between_sampled_blocks(own_corpus, tmp_path):
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.pipeline import run_prepare

    plain, start = _first_run_one_task(own_corpus, tmp_path / "plain")
    checked, _ = _first_run_one_task(own_corpus, tmp_path / "checked", verify_inputs=True)
    path, begin, end = _piece(start.plan.tasks[0])
    assert end - begin > 8 * 3 * 4096  # (sampled blocks are a seventh of the range apart)
    _flip(path, begin + 4096 + 1000)  # between the first and the second sampled block

    run_prepare(plain, show_progress=False)  # not seen without --verify-inputs (documented)
    with pytest.raises(OutputError, match="SHA-256 of its bytes\\): task 00000"):
        run_prepare(checked, show_progress=False)


@pytest.mark.parametrize("verify_inputs", [False, True], ids=["sampled", "sha256"])
def test_an_edit_past_a_completed_range_in_its_last_document_is_refused(verify_inputs, own_corpus, tmp_path):
    """A range's reader goes past its end to finish its last document: those bytes are its input
    too. The first WikiExtractor range of the corpus ends 36 KB into a document; an edit there,
    in the block the sampled check reads last (and, with --verify-inputs, anywhere in it), is
    refused. The range's own bytes are untouched."""
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.executors.base import run_one
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.read import get_input_format
    from mlm_pipeline.read.base import ReadOptions
    from mlm_pipeline.run.state import start_run

    config = run_config(own_corpus, tmp_path / "out", verify_inputs=verify_inputs)
    start = start_run(config)
    task = next(t for t in start.plan.tasks if "wikiextractor-AA" in t.pieces[0].url and t.pieces[0].start == 0)
    run_one(task, config)
    piece = task.pieces[0]
    path, _, _ = _piece(task)
    text = path.read_bytes()
    next_doc = text.index(b"\n<doc ", piece.end) + 1
    stop = text.index(b"\n", next_doc) + 1  # where the range's reader stops: past the next <doc line
    assert stop - piece.end > 30_000  # the document the range finishes
    assert get_input_format(piece.fmt).read_extent(piece, ReadOptions.from_config(config)) == (0, stop)
    _flip(path, stop - 300 if not verify_inputs else piece.end + 20_000)
    with pytest.raises(OutputError, match=f"input bytes of completed tasks changed .*task {task.task_id}"):
        run_prepare(config, show_progress=False)


def test_an_unchanged_input_resumes(own_corpus, tmp_path, clean_run):
    from faults.helpers import assert_as_clean
    from mlm_pipeline.pipeline import run_prepare

    out = tmp_path / "out"
    config, _ = _first_run_one_task(own_corpus, out, verify_inputs=True)
    run_prepare(config, show_progress=False)
    assert_as_clean(out, clean_run("parquet"))


def test_a_run_that_recorded_range_fingerprints_resumes(own_corpus, tmp_path, clean_run):
    """A run started by an earlier version recorded fingerprints of the nominal ranges only (no
    ``input_extent``): its resume compares those, and finishes the run."""
    import json

    from faults.helpers import assert_as_clean
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.run.state import input_fingerprints

    out = tmp_path / "out"
    config, start = _first_run_one_task(own_corpus, out)
    record = json.loads((out / "_run.json").read_text())
    assert record.pop("input_extent") == "read"
    ranges_only = input_fingerprints(start.plan)
    assert ranges_only != record["input_fingerprints"]
    record["input_fingerprints"] = ranges_only
    (out / "_run.json").write_text(json.dumps(record))
    run_prepare(config, show_progress=False)
    assert_as_clean(out, clean_run("parquet"))


def test_a_truncated_gzip_repaired_after_its_task_failed_finishes_the_run(tmp_path):
    """A .gz cut short fails its task (the others complete); once the file is whole again, the
    same command finishes the run, though the file's size (and so its task) changed: the output
    is a fresh run's on the repaired inputs. An edit to a completed task's file is still refused."""
    import gzip

    from conftest import SAMPLE_TEXT, WIKITEXT
    from faults.helpers import shard_table
    from mlm_pipeline.errors import OutputError, TaskFailed
    from mlm_pipeline.pipeline import run_prepare

    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(WIKITEXT, corpus / "a.txt")
    whole = gzip.compress(SAMPLE_TEXT.read_bytes() * 400)
    (corpus / "b.txt.gz").write_bytes(whole[: len(whole) // 2])
    settings = {"split_bytes": "256KiB", "fmt": "tfrecord"}
    with pytest.raises(TaskFailed, match="b.txt.gz"):
        run_prepare(run_config(corpus, tmp_path / "out", **settings))
    (corpus / "b.txt.gz").write_bytes(whole)
    # stopped between saving the new plan and the new run record: the same command still takes the repair
    from mlm_pipeline.run.state import start_run

    old_record = (tmp_path / "out" / "_run.json").read_bytes()
    start_run(run_config(corpus, tmp_path / "out", **settings))
    (tmp_path / "out" / "_run.json").write_bytes(old_record)
    manifest = run_prepare(run_config(corpus, tmp_path / "out", **settings))
    fresh = run_prepare(run_config(corpus, tmp_path / "fresh", **settings))
    assert shard_table(manifest) == shard_table(fresh)
    assert manifest["totals"] == fresh["totals"]
    (corpus / "a.txt").write_bytes((corpus / "a.txt").read_bytes() + b"One more line.\n")
    with pytest.raises(OutputError, match="the input files changed since the existing run started"):
        run_prepare(run_config(corpus, tmp_path / "out", **settings))


def test_verify_inputs_finds_each_pieces_extent_once(own_corpus, tmp_path, monkeypatch):
    """The record's two fingerprints (sampled, and SHA-256 with --verify-inputs) cover the same
    extents: each piece's is found by reading once, not once per fingerprint."""
    from collections import Counter

    from mlm_pipeline.run.state import run_record, start_run
    from mlm_pipeline.read import get_input_format

    config = run_config(own_corpus, tmp_path / "out", verify_inputs=True)
    plan = start_run(config).plan
    fmt = type(get_input_format(plan.tasks[0].pieces[0].fmt))
    calls: Counter = Counter()
    found = fmt.read_extent

    def counted(self, piece, options, following=None):
        calls[piece] += 1
        return found(self, piece, options, following)

    monkeypatch.setattr(fmt, "read_extent", counted)
    record = run_record(config, "tokenizer", plan)
    assert set(record["input_sha256"]) == set(record["input_fingerprints"]) == {t.task_id for t in plan.tasks}
    assert len(calls) >= 2 and set(calls.values()) == {1}  # (the text pieces: the corpus has other formats too)
