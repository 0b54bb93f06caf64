"""A second ``prepare`` on an output in use, a run that completed nothing, an output that is a file."""

from __future__ import annotations

import signal
import subprocess
import sys
import time

import pytest

from faults.helpers import assert_as_clean, prepare_args, run_config


def test_a_second_run_on_the_same_output_is_refused_naming_the_first(corpus, clean_run, tmp_path, tally):
    clean = clean_run("parquet")
    out = tmp_path / "out"
    first = subprocess.Popen([sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, out)],
                             stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    lock = out / "_prepare.lock"
    deadline = time.monotonic() + 60
    while not (lock.exists() and lock.stat().st_size):  # taken (and its holder written) before planning
        assert time.monotonic() < deadline and first.poll() is None, first.stderr.read()
        time.sleep(0.002)
    first.send_signal(signal.SIGSTOP)  # it holds the output while the second starts, however fast it runs
    assert first.poll() is None and lock.exists(), "the first run ended before it could be held"
    try:
        second = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, out)],
                                capture_output=True, text=True, timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
    assert second.returncode == 2
    assert f"is in use by another prepare run (pid {first.pid} on " in second.stderr
    assert "Traceback" not in second.stderr
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert_as_clean(out, clean)
    assert not (out / "_prepare.lock").exists()
    tally.record("concurrent second run")


def test_a_run_that_completed_no_task_is_replaced(corpus, clean_run, tmp_path, caplog):
    """A first attempt with other settings that stopped before any task completed does not lock
    the output to those settings; one with a completed task does."""
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.run.state import start_run

    clean = clean_run("parquet")
    out = tmp_path / "out"
    start_run(run_config(corpus, out, max_seq_length=64))  # recorded, planned, nothing run
    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        run_prepare(run_config(corpus, out, workers=2), show_progress=False)
    assert "it completed no task, or read no document (max-seq-length: 64 in the existing run, 128 now)" in caplog.text
    assert_as_clean(out, clean)
    with pytest.raises(OutputError, match="already holds a run with other settings"):
        run_prepare(run_config(corpus, out, max_seq_length=64), show_progress=False)


def test_an_output_that_is_a_file_is_named_as_such(corpus, tmp_path):
    target = tmp_path / "out.txt"
    target.write_text("not a directory")
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, target)],
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 2
    assert f"the output {target} is a file, not a directory" in proc.stderr
    assert "File exists" not in proc.stderr


def _held(proc, out, *, written: bool):
    """Wait until ``proc`` holds ``out``'s lock (a plain run writes its name into the file), then stop it."""
    lock = out / "_prepare.lock"
    deadline = time.monotonic() + 60
    while not (lock.exists() and (out / "_run.json").exists() and (lock.stat().st_size or not written)):
        assert time.monotonic() < deadline and proc.poll() is None, proc.stderr.read()
        time.sleep(0.002)
    proc.send_signal(signal.SIGSTOP)
    assert proc.poll() is None


def test_a_plain_run_and_workers_sharing_the_output_keep_out_of_each_other(corpus, clean_run, tmp_path, tally):
    """A plain run cleans up an output's unfinished files as its own leftovers: it must not start
    while claim or array workers write there, nor they while it runs."""
    clean = clean_run("parquet")
    out = tmp_path / "out"
    cli = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, out)]
    worker = subprocess.Popen([*cli, "--claim"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _held(worker, out, written=False)
    try:
        plain = subprocess.run(cli, capture_output=True, text=True, timeout=120)
    finally:
        worker.send_signal(signal.SIGCONT)
    assert plain.returncode == 2 and "is in use by another prepare run (array or claim workers)" in plain.stderr
    _, stderr = worker.communicate(timeout=300)
    assert worker.returncode == 0, stderr
    assert_as_clean(out, clean)
    assert not (out / "_prepare.lock").exists()  # the last sharing worker out removed it

    again = tmp_path / "again"
    cli = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, again)]
    first = subprocess.Popen(cli, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    _held(first, again, written=True)
    try:
        shared = subprocess.run([*cli, "--task-count", "1", "--task-rank", "0"], capture_output=True, text=True,
                                timeout=120)
    finally:
        first.send_signal(signal.SIGCONT)
    assert shared.returncode == 2
    assert f"is in use by a plain prepare run (pid {first.pid} on " in shared.stderr
    _, stderr = first.communicate(timeout=300)
    assert first.returncode == 0, stderr
    assert_as_clean(again, clean)
    tally.record("plain run beside sharing workers")


def test_sharing_workers_never_refuse_each_other_and_clear_a_dead_runs_name(tmp_path):
    """Workers sharing an output come and go at once without refusing each other (the last one
    out holds the lock whole for an instant to remove its file), and a plain run killed earlier
    (its name left in the file) is not named to a later plain run as a holder."""
    import json
    import threading

    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.run.lock import RunLock

    out = tmp_path / "out"
    out.mkdir()
    (out / "_prepare.lock").write_text(json.dumps({"pid": 4711, "host": "gone", "started": "then"}))
    refused = []

    def churn() -> None:
        for _ in range(150):
            try:
                with RunLock(str(out), shared=True):
                    pass
            except OutputError as exc:
                refused.append(str(exc))

    with RunLock(str(out), shared=True):
        with pytest.raises(OutputError, match=r"in use by another prepare run \(array or claim workers\)"):
            with RunLock(str(out)):
                pass
    threads = [threading.Thread(target=churn) for _ in range(3)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert refused == []
    assert not (out / "_prepare.lock").exists()
