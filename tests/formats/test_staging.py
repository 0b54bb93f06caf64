"""Where shards bound for an object store wait before their upload."""

from __future__ import annotations


def test_staging_for_an_object_store_removes_what_dead_processes_left(tmp_path, monkeypatch):
    """Shards bound for an object store are staged under the system temp dir, one directory per
    process: a process killed mid-task leaves its partial shard there, and the next process that
    stages removes it once that process no longer runs (a running one's files are left alone)."""
    import os
    import socket
    import subprocess
    import tempfile

    from mlm_pipeline.formats import sink

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sink, "_staging", None)
    root = tmp_path / f"mlm-pipeline-staging-{os.getuid()}-{socket.gethostname()}"
    root.mkdir(mode=0o700)
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "30"])
    try:
        for pid in (dead.pid, alive.pid):
            (root / f"process-{pid}").mkdir()
            (root / f"process-{pid}" / "00003-abc.partial").write_bytes(b"x" * 1000)
        mine = sink.tmp_dir_for("s3://bucket/out")
        assert mine == str(root / f"process-{os.getpid()}")
        assert sorted(p.name for p in root.iterdir()) == sorted([f"process-{alive.pid}", f"process-{os.getpid()}"])
    finally:
        alive.kill()
        alive.wait()


def test_a_staging_directory_others_can_write_is_not_shared(tmp_path, monkeypatch):
    """A staging root that other users may write (or that is not a directory of this user's) is
    not used: the process stages in a fresh private directory of its own, and removes nothing."""
    import os
    import socket
    import tempfile

    from mlm_pipeline.formats import sink

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sink, "_staging", None)
    root = tmp_path / f"mlm-pipeline-staging-{os.getuid()}-{socket.gethostname()}"
    root.mkdir()
    root.chmod(0o777)
    (root / "process-999999999").mkdir()
    mine = sink.tmp_dir_for("s3://bucket/out")
    assert not mine.startswith(str(root) + os.sep) and os.path.isdir(mine)
    assert os.stat(mine).st_mode & 0o077 == 0
    assert (root / "process-999999999").exists()


def test_a_shard_write_that_fills_the_disk_names_the_file():
    """``[Errno 28] No space left on device`` names no file: the shard file being written is named."""
    import os

    import pytest

    from mlm_pipeline.formats.sink import HashingFile

    if not os.path.exists("/dev/full"):
        pytest.skip("no /dev/full (a device whose every write fails with ENOSPC) on this system")
    f = HashingFile("/dev/full")
    f.write(b"x" * 100)  # (buffered)
    with pytest.raises(OSError, match=r"^\[Errno 28\] No space left on device: '/dev/full'$"):
        f.close()
    f = HashingFile("/dev/full")
    with pytest.raises(OSError, match=r"No space left on device: '/dev/full'$"):
        f.write(b"x" * (1 << 20))  # (past the buffer)
