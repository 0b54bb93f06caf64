"""A hostile output directory: links planted where a run keeps its own files, and manifests that
name shards outside the output. No command may read, write or delete a file outside the output."""

from __future__ import annotations

import hashlib
import http.server
import json
import os
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from faults.helpers import SAMPLE, VOCAB

SMALL = SAMPLE / "sample_text.txt"  # Google's sample: one task, a second to prepare


def cli(*args: str, timeout: int = 300) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *args], capture_output=True, text=True,
                          timeout=timeout)


def prepare(out: Path, *extra: str) -> subprocess.CompletedProcess:
    return cli("prepare", str(SMALL), "-o", str(out), "-t", str(VOCAB), "--format", "parquet", "--workers", "1",
               "--no-progress", "--dupe-factor", "1", *extra)


@pytest.fixture
def victim(tmp_path) -> Path:
    """A file outside the output that no command may touch."""
    path = tmp_path / "elsewhere" / "precious.txt"
    path.parent.mkdir()
    path.write_text("precious data\n")
    return path


@pytest.fixture(scope="module")
def complete(tmp_path_factory) -> Path:
    """A complete output, copied by each test that changes it."""
    out = tmp_path_factory.mktemp("complete") / "out"
    done = prepare(out)
    assert done.returncode == 0, done.stderr
    return out


def copy_of(complete: Path, tmp_path: Path) -> Path:
    out = tmp_path / "out"
    subprocess.run(["cp", "-a", str(complete), str(out)], check=True)
    return out


def test_a_link_at_the_lock_is_refused_and_its_target_kept(complete, tmp_path, victim, tally):
    out = copy_of(complete, tmp_path)
    (out / "_prepare.lock").symlink_to(victim)
    rerun = prepare(out)
    assert rerun.returncode == 2, rerun.stderr
    assert f"{out}/_prepare.lock is a symbolic link" in rerun.stderr
    assert "Traceback" not in rerun.stderr
    assert victim.read_text() == "precious data\n"  # (was truncated and overwritten with {"pid": ...})
    (out / "_prepare.lock").unlink()
    again = prepare(out)
    assert again.returncode == 0, again.stderr
    tally.record("link at _prepare.lock")


def test_the_lock_is_never_opened_through_a_link_planted_after_the_check(tmp_path, victim):
    """The layout check and the open are two steps; the open itself refuses a link (O_NOFOLLOW)."""
    from mlm_pipeline.errors import OutputError
    from mlm_pipeline.run import layout
    from mlm_pipeline.run.lock import RunLock

    out = tmp_path / "out"
    out.mkdir()
    checked = layout.refuse_links

    def plant_after_check(output: str) -> None:
        checked(output)
        if not (out / "_prepare.lock").is_symlink():
            (out / "_prepare.lock").symlink_to(victim)

    layout.refuse_links = plant_after_check
    try:
        with pytest.raises(OutputError, match="_prepare.lock is a symbolic link"):
            with RunLock(str(out)):
                pass
    finally:
        layout.refuse_links = checked
    assert victim.read_text() == "precious data\n"


@pytest.mark.parametrize("command", ["finalize", "claim", "array"])
def test_a_link_at_tmp_deletes_nothing_it_points_to(command, complete, tmp_path, victim, tally):
    out = copy_of(complete, tmp_path)
    old = time.time() - 7200
    os.utime(victim, (old, old))  # older than any stall or lease time: what the cleanup removes
    (out / "_tmp").symlink_to(victim.parent, target_is_directory=True)
    if command == "finalize":
        done = cli("finalize", str(out), "--force")
    elif command == "claim":
        done = prepare(out, "--claim", "--stall-seconds", "60")
    else:
        done = prepare(out, "--task-count", "1", "--task-rank", "0", "--stall-seconds", "60")
    assert done.returncode == 2, done.stderr  # (exited 0, having removed every old file of the link's target)
    assert f"{out}/_tmp is a symbolic link" in done.stderr
    assert victim.read_text() == "precious data\n"
    tally.record(f"link at _tmp ({command})")


def test_the_cleanups_never_follow_a_link_in_place_of_a_directory(tmp_path, victim):
    """Beneath the refusal at the start: tidy_tmp and the leftover cleanup list a link's own
    directory, never its target's."""
    from mlm_pipeline import fs
    from mlm_pipeline.formats.sink import tidy_tmp

    out = tmp_path / "out"
    out.mkdir()
    old = time.time() - 7200
    os.utime(victim, (old, old))
    leftover = victim.parent / ".x.json.tmp-0123"
    leftover.write_text("{}")
    (out / "_tmp").symlink_to(victim.parent, target_is_directory=True)
    (out / "_tasks").symlink_to(victim.parent, target_is_directory=True)
    tidy_tmp(str(out), older_than=60)
    assert fs.remove_write_leftovers(str(out / "_tasks")) == 0
    assert victim.read_text() == "precious data\n" and leftover.exists()
    assert (out / "_tmp").is_symlink()


def _serve(tmp_path: Path):
    """A web server on 127.0.0.1 that records every request it gets."""
    requests: list[str] = []

    class Handler(http.server.SimpleHTTPRequestHandler):
        def do_GET(self):  # noqa: N802
            requests.append(self.path)
            super().do_GET()

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    return server, requests


@pytest.mark.parametrize("where", ["parent", "absolute", "http", "link"])
def test_a_manifest_naming_a_shard_outside_the_output_is_refused(where, complete, tmp_path, victim, tally):
    out = copy_of(complete, tmp_path)
    manifest = json.loads((out / "manifest.json").read_text())
    first = manifest["shards"][0]
    server = None
    if where == "parent":
        first["path"] = os.path.relpath(victim, out)  # ../elsewhere/precious.txt
    elif where == "absolute":
        first["path"] = str(victim)
    elif where == "http":
        server, requests = _serve(tmp_path)
        first["path"] = f"http://127.0.0.1:{server.server_address[1]}/elsewhere/precious.txt"
    else:  # the manifest as written, the shard replaced by a link
        shard = out / first["path"]
        shard.unlink()
        shard.symlink_to(victim)
    (out / "manifest.json").write_text(json.dumps(manifest))
    secret = hashlib.sha256(victim.read_bytes()).hexdigest()[:12]
    try:
        for args in (["verify", str(out)], ["inspect", str(out), "-n", "1"], ["verify", str(out), "--size-only"]):
            done = cli(*args)
            assert done.returncode == 2, (args, done.stdout, done.stderr)
            assert "Traceback" not in done.stderr
            assert secret not in done.stdout + done.stderr and "precious" not in done.stdout
            assert ("names a shard outside the output" if where != "link" else "is a symbolic link") in done.stderr
        from mlm_pipeline.errors import OutputError
        from mlm_pipeline.torch.manifest import load_prepared

        with pytest.raises(OutputError):
            load_prepared(str(out))
        if server is not None:
            assert requests == []  # (the URL was fetched)
    finally:
        if server is not None:
            server.shutdown()
    assert victim.read_text() == "precious data\n"
    tally.record(f"manifest shard outside ({where})")


@pytest.mark.parametrize("name", ["manifest.json", "_run.json", "_tasks", "shards"])
def test_a_link_in_place_of_a_run_file_is_refused_by_every_command(name, complete, tmp_path, victim):
    out = copy_of(complete, tmp_path)
    real = out / name
    if real.is_dir():
        subprocess.run(["cp", "-a", f"{real}/.", str(victim.parent)], check=True)
        subprocess.run(["rm", "-r", str(real)], check=True)
        real.symlink_to(victim.parent, target_is_directory=True)
    else:
        real.replace(victim.parent / name)
        real.symlink_to(victim.parent / name)
    before = sorted((p.name, p.stat().st_mtime_ns) for p in victim.parent.iterdir())
    for args in (["verify", str(out)], ["inspect", str(out), "-n", "1"], ["report", str(out)],
                 ["finalize", str(out), "--force"]):
        done = cli(*args)
        assert done.returncode == 2, (args, done.stdout, done.stderr)
        assert f"{out}/{name} is a symbolic link" in done.stderr, (args, done.stderr)
    assert prepare(out).returncode == 2
    assert sorted((p.name, p.stat().st_mtime_ns) for p in victim.parent.iterdir()) == before
