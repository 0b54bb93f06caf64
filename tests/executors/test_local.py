"""The executor contract on the local process pool: run the tasks given, report progress, yield
markers; completion (markers on disk) is the tasks', the manifest is the driver's."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from helpers_run import INPUTS, make_config


@pytest.mark.parametrize("workers", [1, 2])
def test_local_executor_runs_exactly_the_share_it_is_given(tmp_path, workers):
    from mlm_pipeline.executors.array import task_share
    from mlm_pipeline.executors.local import LocalExecutor
    from mlm_pipeline.run.state import done_task_ids, start_run

    config = make_config(INPUTS, tmp_path, workers=workers)
    start = start_run(config)
    share = task_share(start.pending, 1, 3)
    assert [t.index for t in share] == list(range(1, len(start.plan.tasks), 3)) and len(share) >= 3
    progress: list[dict] = []
    markers = list(LocalExecutor(config).run(share, progress.append))
    assert sorted(m["task_id"] for m in markers) == [t.task_id for t in share]
    assert done_task_ids(config.output) == {t.task_id for t in share}  # each task wrote its marker
    assert sum(p["bytes"] for p in progress) == sum(m["stats"]["bytes_read"] for m in markers) > 0
    assert sum(p["documents"] for p in progress) == sum(m["stats"]["documents_read"] for m in markers)
    assert not (tmp_path / "manifest.json").exists()
    # a second start sees them done: what remains is the other ranks' tasks
    again = start_run(config)
    assert {t.task_id for t in again.pending} == {t.task_id for t in start.plan.tasks} - set(done_task_ids(config.output))


def test_a_failing_task_raises_task_failed_naming_it(tmp_path):
    from mlm_pipeline.errors import InputError, TaskFailed
    from mlm_pipeline.executors.local import LocalExecutor
    from mlm_pipeline.run.state import start_run

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"A good sentence here.\nAnother one.\n\nBroken \xff\xfe bytes in this line.\n")
    config = make_config([bad], tmp_path / "out", on_decode_error="fail")
    start = start_run(config)
    with pytest.raises(TaskFailed) as info:
        list(LocalExecutor(config).run(start.pending, lambda delta: None))
    assert isinstance(info.value.cause, InputError)
    assert f"{bad} [bytes 0:end]" in str(info.value)
    assert not list((tmp_path / "out").glob("_tasks/*.json"))


@pytest.mark.parametrize("workers", [1, 2])
def test_other_tasks_complete_when_one_fails(tmp_path, workers):
    """One bad piece costs one task: every other task runs to its marker, then the run fails
    naming the bad task and saying how many completed."""
    from mlm_pipeline.errors import TaskFailed
    from mlm_pipeline.executors.local import LocalExecutor
    from mlm_pipeline.run.state import done_task_ids, start_run

    bad = tmp_path / "in" / "b-bad.txt"
    bad.parent.mkdir()
    bad.write_bytes(b"A good sentence here.\n\nBroken \xff\xfe bytes in this line.\n")
    config = make_config([*INPUTS, bad], tmp_path / "out", workers=workers, on_decode_error="fail")
    start = start_run(config)
    bad_tasks = {t.task_id for t in start.pending if any(p.url == str(bad) for p in t.pieces)}
    assert len(bad_tasks) == 1 and len(start.pending) > 3
    with pytest.raises(TaskFailed) as info:
        list(LocalExecutor(config).run(start.pending, lambda delta: None))
    n = len(start.pending)
    assert f"1 of {n} tasks failed, the other {n - 1} completed" in str(info.value)
    assert done_task_ids(config.output) == {t.task_id for t in start.pending} - bad_tasks


def test_more_workers_than_cpus_are_lowered_to_the_cpu_count_with_a_warning(caplog):
    from mlm_pipeline.executors.base import default_workers, worker_count

    cpus = default_workers()
    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        assert worker_count(1000) == cpus
    assert f"--workers 1000 is more than the {cpus} CPU(s) this process may use: starting {cpus}" in caplog.text
    assert worker_count(0) == cpus and worker_count(1) == 1


def test_a_pool_that_never_finishes_shutting_down_does_not_hang_the_run(monkeypatch, caplog):
    """A pool whose worker died can leave its shutdown waiting for good (its manager thread
    joining a call-queue feeder that never ends): the executor waits a bounded time, ends the
    workers, warns, and keeps the stuck thread out of the interpreter's exit hook."""
    import concurrent.futures.process as cfp
    import logging
    import multiprocessing as mp
    import threading
    import time

    from mlm_pipeline.executors import local

    never = threading.Event()

    class StuckShutdown(cfp.ProcessPoolExecutor):
        def shutdown(self, wait=True, *, cancel_futures=False):
            never.wait()  # as the manager thread's join of a blocked feeder

    pool = StuckShutdown(max_workers=1, mp_context=mp.get_context("spawn"))
    assert pool.submit(abs, -3).result(timeout=60) == 3
    procs = list(pool._processes.values())
    manager = pool._executor_manager_thread
    assert manager in cfp._threads_wakeups
    monkeypatch.setattr(local, "SHUTDOWN_SECONDS", 0.5)
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        local._shut_down(pool)
    assert "did not shut down within" in caplog.text
    for proc in procs:
        proc.join(10)
        # the pool's manager thread may reap the killed worker first; its exit code then shows
        # in the shared process object a moment later
        deadline = time.monotonic() + 10
        while proc.exitcode is None and time.monotonic() < deadline:
            time.sleep(0.01)
        assert proc.exitcode is not None
    assert manager not in cfp._threads_wakeups
    never.set()
    cfp.ProcessPoolExecutor.shutdown(pool, wait=True)


_POOL_RUN = """
import json, os, sys, threading, time
if sys.argv[1] == "with-a-thread":  # as an application's thread or fsspec's S3 event loop
    threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()
threads_at_fork = []
os.register_at_fork(before=lambda: threads_at_fork.append(threading.active_count()))
sys.path.insert(0, sys.argv[3])
from helpers_run import INPUTS, make_config
from mlm_pipeline.executors import local
from mlm_pipeline.pipeline import run_prepare

methods = []
start_pool = local.TaskPool._start_pool
def recording(self):
    start_pool(self)
    methods.append(self.start_method)
local.TaskPool._start_pool = recording
run_prepare(make_config(INPUTS, sys.argv[2], workers=2, claim=sys.argv[1] == "claim"))
print(json.dumps({"methods": methods, "threads_at_fork": sorted(set(threads_at_fork))}))
"""


def test_pool_workers_are_forked_only_from_a_single_threaded_process_and_write_the_same_shards(tmp_path):
    """Forking copies locks held by other threads, so a driver with a thread of its own spawns its
    workers; a single-threaded one forks them (fast start), before any thread of its own starts
    (a claim worker's lease heartbeat starts after its pool). All write the same shards as one
    worker does."""
    import json
    import subprocess
    import sys

    from helpers_run import REPO, comparable
    from mlm_pipeline.pipeline import run_prepare

    manifests = {}
    for mode, expected in [("single-threaded", "fork"), ("claim", "fork"), ("with-a-thread", "spawn")]:
        out = tmp_path / mode
        done = subprocess.run([sys.executable, "-c", _POOL_RUN, mode, str(out), str(REPO / "tests")],
                              capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr
        seen = json.loads(done.stdout.splitlines()[-1])
        assert seen["methods"] == [expected]
        if expected == "fork":  # each fork came from a process with only its main thread
            assert seen["threads_at_fork"] == [1]
        manifests[mode] = json.loads((out / "manifest.json").read_text())
    one = run_prepare(make_config(INPUTS, tmp_path / "one-worker"))
    assert one["tasks"] > 2
    assert {comparable(m) == comparable(one) for m in manifests.values()} == {True}


_SPAWNED_WORKER = """
import os, threading, time
from pathlib import Path
threading.Thread(target=time.sleep, args=(3600,), daemon=True).start()  # the driver spawns
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.executors.local import TaskPool
pool = TaskPool(PrepareConfig(inputs=["x"], output=os.devnull, tokenizer="bert-base-uncased"), 2)
status = pool._pool.submit(Path.read_text, Path("/proc/self/status")).result()
print(pool.start_method, pool._pool.submit(os.getenv, "OPENBLAS_NUM_THREADS").result(),
      status.split("Threads:")[1].split()[0])
pool.close(cancel=False)
"""


@pytest.mark.skipif(not sys.platform.startswith("linux") or (os.cpu_count() or 1) < 2,
                    reason="counts a worker's threads in /proc; OpenBLAS starts none on one core")
def test_a_spawned_worker_starts_with_one_blas_thread_unless_the_user_says_otherwise():
    """A spawned worker imports numpy before any code of ours runs in it, so the driver sets
    OPENBLAS_NUM_THREADS for it: the worker has its main thread and its parent watch, and no
    OpenBLAS thread spinning beside the others' start-up. A user's own setting is kept."""
    env = {k: v for k, v in os.environ.items() if k not in ("OPENBLAS_NUM_THREADS", "OMP_NUM_THREADS")}
    done = subprocess.run([sys.executable, "-c", _SPAWNED_WORKER], capture_output=True, text=True, env=env,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["spawn", "1", "2"]
    done = subprocess.run([sys.executable, "-c", _SPAWNED_WORKER], capture_output=True, text=True,
                          env={**env, "OPENBLAS_NUM_THREADS": "2"}, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.split() == ["spawn", "2", "3"]  # and its OpenBLAS thread


def test_a_task_given_to_a_pool_a_worker_broke_since_the_last_wait_runs_in_a_new_pool(tmp_path):
    """A worker that dies while the driver is submitting (workers killed as they start) breaks the
    pool before the next ``wait``; the pool then refuses new work. That task is not lost and the
    run does not crash: it fails as the pool's other tasks do, and runs in the new pool."""
    import signal
    import time

    from mlm_pipeline.executors.local import TaskPool
    from mlm_pipeline.run.state import start_run

    config = make_config(INPUTS, tmp_path / "out", workers=2)
    first, second = start_run(config).pending[:2]
    pool = TaskPool(config, 2)
    try:
        pool._pool.submit(os.getpid).result(timeout=60)  # a worker is up (a spawning pool starts them on demand)
        for pid in list(pool._pool._processes):
            os.kill(pid, signal.SIGKILL)
        deadline = time.monotonic() + 30
        while not pool._pool._broken:  # the pool's manager thread has seen the deaths
            assert time.monotonic() < deadline
            time.sleep(0.01)
        futures = {pool.submit(first, lambda delta: None), pool.submit(second, lambda delta: None)}
        done: set = set()
        while len(done) < 2 and time.monotonic() < deadline + 60:
            done |= pool.wait(futures - done, lambda delta: None)
        assert sorted(f.result()["task_id"] for f in done) == sorted([first.task_id, second.task_id])
    finally:
        pool.close(cancel=True)


def test_an_alarm_going_off_as_a_task_returns_keeps_the_task_and_later_alarms(tmp_path, monkeypatch):
    """The stall alarm may go off after the task's body, as the alarm's ``with`` exits: the task's
    marker is kept (not run again, not failed), and the handler is the previous one again, so the
    next task in this process (a Ray worker runs many) has its alarm."""
    import signal

    from mlm_pipeline.executors import local
    from mlm_pipeline.plan import Task

    marker = {"task_id": "00000"}
    monkeypatch.setattr(local, "run_one", lambda task, config, progress=None: marker)
    exit_once = local._StallAlarm.__exit__
    fired = []

    def exit_with_the_signal_arriving(self, *exc):
        if not fired:
            fired.append(True)
            self._fire(signal.SIGALRM, None)  # as the kernel's signal would, at this point
        return exit_once(self, *exc)

    monkeypatch.setattr(local._StallAlarm, "__exit__", exit_with_the_signal_arriving)
    config = make_config(INPUTS, tmp_path / "out", stall_seconds=30)
    task = Task(task_id="00000", index=0, pieces=(), input_bytes=0)
    assert local.run_with_stall_alarm(task, config) is marker and fired
    assert signal.getsignal(signal.SIGALRM) is signal.SIG_DFL
    assert local._StallAlarm(30, "00001").active
