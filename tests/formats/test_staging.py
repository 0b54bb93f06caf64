"""Where shards bound for an object store wait before their upload."""

from __future__ import annotations


def test_staging_for_an_object_store_removes_what_dead_processes_left(tmp_path, monkeypatch):
    """Shards bound for an object store are staged under the system temp dir, one directory per
    process: a process killed mid-task leaves its partial shard there, and the next process that
    stages removes it once that process no longer runs (a running one's files are left alone)."""
    import os
    import subprocess
    import tempfile

    from mlm_pipeline.formats import sink

    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path))
    monkeypatch.setattr(sink, "_staging", None)
    dead = subprocess.Popen(["true"])
    dead.wait()
    alive = subprocess.Popen(["sleep", "30"])
    try:
        root = tmp_path / f"mlm-pipeline-staging-{os.getuid()}"
        for pid in (dead.pid, alive.pid):
            (root / f"process-{pid}").mkdir(parents=True)
            (root / f"process-{pid}" / "00003-abc.partial").write_bytes(b"x" * 1000)
        mine = sink.tmp_dir_for("s3://bucket/out")
        assert mine == str(root / f"process-{os.getpid()}")
        assert sorted(p.name for p in root.iterdir()) == sorted([f"process-{alive.pid}", f"process-{os.getpid()}"])
    finally:
        alive.kill()
        alive.wait()
