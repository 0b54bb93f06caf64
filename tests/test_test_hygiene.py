"""The test suite cleans up after itself: a passing test's temporary files are removed when the
session ends, and the SeaweedFS server leaves no socket file behind."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

from conftest import REPO

CHILD_CONFTEST = f"""
import sys
sys.path.insert(0, {str(REPO / "tests")!r})
pytest_plugins = ["conftest_servers"]
"""

CHILD_TEST = """
import json
import os


def test_writes_a_temporary_file(tmp_path):
    (tmp_path / "big.bin").write_bytes(os.urandom(1 << 20))


def test_uses_seaweedfs(seaweedfs, tmp_path):
    seaweedfs.client().put_object(Bucket=seaweedfs.bucket, Key="k", Body=b"x")
    assert seaweedfs.sockets and any(s.exists() for s in seaweedfs.sockets)
    with open(os.environ["SOCKETS_LIST"], "w") as f:
        json.dump([str(s) for s in seaweedfs.sockets], f)
"""


@pytest.mark.s3
def test_a_passing_session_leaves_no_temporary_files_and_no_sockets(tmp_path):
    child = tmp_path / "child"
    child.mkdir()
    (child / "conftest.py").write_text(CHILD_CONFTEST)
    (child / "test_child.py").write_text(CHILD_TEST)
    temp = tmp_path / "temp"
    temp.mkdir()
    sockets_list = tmp_path / "sockets.json"
    env = {k: v for k, v in __import__("os").environ.items() if not k.startswith("PYTEST_")}
    env.update(TMPDIR=str(temp), SOCKETS_LIST=str(sockets_list))
    proc = subprocess.run(
        [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "-c", str(REPO / "pyproject.toml"),
         "--rootdir", str(child), str(child / "test_child.py")],
        cwd=child, env=env, capture_output=True, text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    left = [p for p in temp.rglob("*") if p.is_file() or p.is_socket()]
    assert not left, left  # pytest's own temporary directories held no file of the passing tests
    sockets = json.loads(sockets_list.read_text())
    assert sockets and not [s for s in sockets if __import__("os").path.exists(s)]
