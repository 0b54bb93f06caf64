"""scripts/setup.sh leaves the interpreter it is given as it was: uv goes into ./.venv."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import venv
from pathlib import Path

import pytest

from conftest import REPO


@pytest.mark.slow
def test_setup_installs_uv_inside_the_venv_not_into_the_base_python(tmp_path):
    # a base interpreter of our own (a venv with pip, no uv) and a PATH on which no uv is found
    base = tmp_path / "base"
    venv.EnvBuilder(with_pip=True).create(base)
    base_py = base / "bin" / "python"
    assert subprocess.run([base_py, "-c", "import uv"], capture_output=True).returncode != 0
    path = os.pathsep.join([str(base / "bin"), "/usr/local/bin", "/usr/bin", "/bin"])
    assert shutil.which("uv", path=path) is None
    # a clone of the project's files (what `git clone` gives), without this checkout's .venv
    clone = tmp_path / "clone"
    files = subprocess.run(["git", "ls-files", "-z"], cwd=REPO, capture_output=True, check=True).stdout
    for name in filter(None, files.decode().split("\0")):
        if (REPO / name).is_file():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(REPO / name, clone / name)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("VIRTUAL_ENV", "PYTHON"))}
    env.update(PATH=path, PYTHON=str(base_py), HOME=os.environ.get("HOME", str(tmp_path)))
    proc = subprocess.run(["bash", "scripts/setup.sh", "core"], cwd=clone, env=env, capture_output=True,
                          text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "setup (core) done" in proc.stdout
    # the base interpreter has no uv; the venv has it, and the package runs from it
    assert subprocess.run([base_py, "-c", "import uv"], capture_output=True).returncode != 0
    assert (clone / ".venv" / "bin" / "uv").exists()
    version = subprocess.run([clone / ".venv" / "bin" / "mlm-pipeline", "--version"], capture_output=True, text=True)
    assert version.returncode == 0 and "mlm-pipeline" in version.stdout
