"""The process environment (mlm_pipeline.environment): the S3 settings a driver hands to its Ray
workers, and the allocator setting of a process that runs tasks."""

from __future__ import annotations

import pickle
import platform
import subprocess
import sys
import textwrap

import pytest

from mlm_pipeline.environment import StorageEnvironment

from conftest import SAMPLE


def test_storage_settings_travel_and_credentials_only_to_a_worker_without_its_own(monkeypatch):
    for key, value in {"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_DEFAULT_REGION": "eu-west-3",
                       "AWS_ACCESS_KEY_ID": "driver-key", "AWS_SECRET_ACCESS_KEY": "driver-secret-value"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    storage = pickle.loads(pickle.dumps(StorageEnvironment.of_this_process()))  # as Ray ships it
    assert "driver-secret-value" not in repr(storage) and "driver-key" not in f"{storage}"
    assert "AWS_ENDPOINT_URL" in repr(storage) and "AWS_SECRET_ACCESS_KEY=<not shown>" in repr(storage)
    # a worker with its own credentials (an instance role's keys) and another endpoint
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://elsewhere:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "worker-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-secret")
    storage.apply()
    import os

    assert os.environ["AWS_ENDPOINT_URL"] == "http://minio:9000" and os.environ["AWS_DEFAULT_REGION"] == "eu-west-3"
    assert (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]) == ("worker-key", "worker-secret")
    # a worker with none gets the driver's
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    storage.apply()
    assert (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]) == ("driver-key", "driver-secret-value")


@pytest.mark.skipif(not sys.platform.startswith("linux") or platform.libc_ver()[0] != "glibc", reason="glibc's mallopt")
def test_a_task_process_takes_large_arrays_from_the_heap_and_keeps_them():
    """After ``keep_freed_memory`` a 64 MB array lies in the ``[heap]`` mapping (not a fresh
    ``mmap`` of its own), and freeing it leaves the heap as large: the next block reuses it."""
    script = textwrap.dedent("""
        import ctypes
        import numpy as np
        from mlm_pipeline.environment import keep_freed_memory

        sbrk = ctypes.CDLL(None).sbrk
        sbrk.restype = ctypes.c_void_p
        start = next(int(line.split("-")[0], 16) for line in open("/proc/self/maps") if line.rstrip().endswith("[heap]"))

        def in_heap(a):
            return start <= a.ctypes.data < sbrk(0)

        before = np.ones(64 << 20, np.uint8)
        print(in_heap(before))
        del before
        print(keep_freed_memory(), keep_freed_memory())
        a = np.ones(64 << 20, np.uint8)
        print(in_heap(a))
        top = sbrk(0)
        del a
        print(sbrk(0) == top)
    """)
    proc = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split("\n")[:4] == ["False", "True True", "True", "True"], proc.stdout


def test_a_task_runs_with_the_collector_off_what_was_alive_before_it(tmp_path, monkeypatch):
    """A run in this process (one worker): during each task the objects alive when it started are
    frozen and the youngest generation waits for 10,000 new objects, so no full collection walks
    the process's imports; both are put back when the task ends."""
    import gc

    import mlm_pipeline.executors.base as base
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare

    seen = []
    original = base.run_task

    def recording(task, config, progress=None):
        seen.append((gc.get_freeze_count(), gc.get_threshold()[0]))
        return original(task, config, progress=progress)

    monkeypatch.setattr(base, "run_task", recording)
    threshold, frozen = gc.get_threshold(), gc.get_freeze_count()
    run_prepare(PrepareConfig(inputs=[str(SAMPLE / "wikitext2-train-1MB.txt")], output=str(tmp_path / "out"),
                              tokenizer=str(SAMPLE / "bert-base-uncased-vocab.txt"), workers=1,
                              split_bytes=300_000, progress=False))
    assert len(seen) == 4
    # (the imports alone are tens of thousands of objects)
    assert all(count > 1000 and young >= 10_000 for count, young in seen), seen
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, frozen)


def test_the_collector_keeps_what_a_pool_worker_froze_before_its_tasks(monkeypatch):
    """A pool worker froze what it inherited: its tasks leave that frozen, and do not count it
    (``gc.get_freeze_count`` walks every frozen object, milliseconds at each task's start)."""
    import gc

    import mlm_pipeline.environment as environment

    assert gc.get_freeze_count() == 0
    monkeypatch.setattr(environment, "_inherited_frozen", False)  # (put back: this process is no worker)
    environment.freeze_inherited_objects()
    try:
        frozen = gc.get_freeze_count()
        assert frozen > 1000
        with monkeypatch.context() as m:
            m.setattr(gc, "get_freeze_count", lambda: pytest.fail("counted the frozen objects"))
            with environment.quiet_collector():
                assert gc.get_threshold()[0] >= 10_000
        assert gc.get_freeze_count() == frozen
    finally:
        gc.unfreeze()


def test_overlapping_tasks_leave_the_collector_as_it_was_and_a_switched_off_one_off():
    """Two tasks in threads of one process (in-process runs), the first out while the second
    runs, and a task that raises: the tuning holds until the last one ends, then all is put back;
    a collector switched off (threshold 0) is not switched on by a task."""
    import gc

    from mlm_pipeline.environment import quiet_collector

    threshold = gc.get_threshold()
    first, second = quiet_collector(), quiet_collector()
    first.__enter__()
    second.__enter__()
    first.__exit__(None, None, None)
    assert gc.get_threshold()[0] >= 10_000 and gc.get_freeze_count() > 0  # the second still runs
    second.__exit__(None, None, None)
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, 0)
    with pytest.raises(RuntimeError):
        with quiet_collector():
            raise RuntimeError("a task failed")
    assert (gc.get_threshold(), gc.get_freeze_count()) == (threshold, 0)
    gc.set_threshold(0)
    try:
        with quiet_collector():
            assert gc.get_threshold()[0] == 0
    finally:
        gc.set_threshold(*threshold)
