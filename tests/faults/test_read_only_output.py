"""A complete run on a read-only output: rerunning the command reports it complete.

The lock file could not be created there, so the rerun failed on ``_prepare.lock`` (exit 1)
although nothing was left to write. The output is made read-only by a read-only bind mount
(root) or, for other users, by taking the write permission away.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from faults.helpers import SAMPLE, VOCAB


@pytest.fixture
def read_only(tmp_path):
    """``read_only(directory)``: a read-only view of ``directory``; the views are undone at the end."""
    mounts, modes = [], []

    def view(directory):
        if os.geteuid() == 0:
            target = tmp_path / f"ro-{len(mounts)}"
            target.mkdir()
            for cmd in (["mount", "--bind", str(directory), str(target)],
                        ["mount", "-o", "remount,ro,bind", str(target)]):
                done = subprocess.run(cmd, capture_output=True, text=True)
                if done.returncode:
                    pytest.skip(f"cannot make a read-only bind mount here: {done.stderr.strip()}")
                if cmd[1] == "--bind":
                    mounts.append(target)
            return target
        for root, dirs, _ in os.walk(directory):
            for d in [root, *(os.path.join(root, d) for d in dirs)]:
                modes.append((d, os.stat(d).st_mode))
                os.chmod(d, 0o555)
        return directory

    yield view
    for target in mounts:
        subprocess.run(["umount", str(target)], capture_output=True)
    for d, mode in reversed(modes):
        os.chmod(d, mode)


def _prepare(out, *extra):
    return subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", str(SAMPLE / "sample_text.txt"),
                           str(SAMPLE / "wikiextractor-AA.txt"), "-o", str(out), "-t", str(VOCAB), "--no-progress",
                           "--workers", "1", "--split-size", "256KB", *extra], capture_output=True, text=True, timeout=300)


def test_a_complete_run_on_a_read_only_output_is_reported_complete(tmp_path, read_only, tally):
    out = tmp_path / "rw" / "out"
    first = _prepare(out)
    assert first.returncode == 0, first.stderr
    before = sorted(p.relative_to(out) for p in out.rglob("*"))
    view = read_only(out.parent) / "out"
    again = _prepare(view)
    assert again.returncode == 0, again.stderr
    assert f"{view} holds" in again.stdout and "resuming: 6 of 6 tasks already complete" in again.stderr
    assert "Traceback" not in again.stderr
    assert sorted(p.relative_to(out) for p in out.rglob("*")) == before  # nothing written, no lock file left
    tally.record("complete run rerun on a read-only output")


def test_an_incomplete_run_on_a_read_only_output_fails_naming_the_file(tmp_path, read_only):
    out = tmp_path / "rw" / "out"
    assert _prepare(out).returncode == 0
    (out / "_tasks" / "00001.json").unlink()
    (out / "manifest.json").unlink()
    view = read_only(out.parent) / "out"
    again = _prepare(view)
    assert again.returncode != 0 and "Traceback" not in again.stderr
    assert ("Read-only file system" in again.stderr or "Permission denied" in again.stderr) and str(view) in again.stderr
