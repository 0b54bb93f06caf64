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
