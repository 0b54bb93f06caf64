"""The oldest Python the package declares (3.10, which has no ``tomllib``) runs a TOML config for
real: a fresh 3.10 environment with the package installed from this checkout."""

from __future__ import annotations

import glob
import json
import shutil
import subprocess
import sys

import pytest

from conftest import REPO, SAMPLE_TEXT, VOCAB


def _uv() -> list[str] | None:
    found = shutil.which("uv")
    if found:
        return [found]
    probe = subprocess.run([sys.executable, "-m", "uv", "--version"], capture_output=True)
    return [sys.executable, "-m", "uv"] if probe.returncode == 0 else None


def _python310() -> str | None:
    """A Python 3.10 that runs: on PATH, or one of pyenv's installs (whose shim needs selecting)."""
    candidates = [shutil.which("python3.10")]
    if shutil.which("pyenv"):
        root = subprocess.run(["pyenv", "root"], capture_output=True, text=True).stdout.strip()
        candidates += sorted(glob.glob(f"{root}/versions/3.10*/bin/python3.10"))
    for candidate in filter(None, candidates):
        if subprocess.run([candidate, "--version"], capture_output=True).returncode == 0:
            return candidate
    return None


@pytest.mark.slow
def test_toml_config_on_python_3_10(tmp_path):
    python310, uv = _python310(), _uv()
    if python310 is None or uv is None:
        pytest.skip("needs a python3.10 interpreter and uv to build its environment")
    venv = tmp_path / "py310"
    subprocess.run([*uv, "venv", "-q", "-p", python310, str(venv)], check=True)
    install = subprocess.run([*uv, "pip", "install", "-q", "--python", str(venv / "bin" / "python"), "-e", str(REPO)],
                             capture_output=True, text=True)
    assert install.returncode == 0, install.stderr
    config = tmp_path / "prepare.toml"
    config.write_text(f'[prepare]\ninput_file = "{SAMPLE_TEXT}"\nvocab_file = "{VOCAB}"\n'
                      f'output_file = "{tmp_path / "out"}"\nmax_seq_length = 64\n', encoding="utf-8")
    run = subprocess.run([str(venv / "bin" / "mlm-pipeline"), "prepare", "--config", str(config), "--no-progress"],
                         capture_output=True, text=True)
    assert run.returncode == 0, run.stderr
    version = subprocess.run([str(venv / "bin" / "python"), "-c", "import sys; print(sys.version_info[:2])"],
                             capture_output=True, text=True).stdout
    assert version.strip() == "(3, 10)"
    manifest = json.loads((tmp_path / "out" / "manifest.json").read_text())
    assert manifest["config"]["max_seq_length"] == 64 and manifest["totals"]["instances"] > 0
