"""A newcomer's path, as a test: build the wheel, install it into a fresh environment, and run
every command block of the README and of the getting-started page in a copy of the repository.

Every ```bash block of README.md, then of docs/getting-started.md, runs, in order, in one copy of
the repository (so a block may use what an earlier one wrote), with the fresh environment's
``bin/`` first on ``PATH``. An HTML comment
on the line before a block says more about it:

* ``<!-- readme-test: skip (REASON) -->``: not run (placeholders, a cluster, minutes of training),
  with the reason for the reader;
* ``<!-- readme-test: writes PATH... -->``: these files must exist, non-empty, after the block.

Beyond those, what a block names with ``-o``/``--output``/``--html``/``--png`` or ``> FILE`` must
exist after it. The wheel is built with ``python -m build`` and installed with its ``report``
extra; the ``torch`` extra is left out (no README block that runs needs it, and uv would otherwise
fetch a CUDA build of torch).
"""

from __future__ import annotations

import os
import re
import shlex
import shutil
import subprocess
import sys
import zipfile
from dataclasses import dataclass
from pathlib import Path

import pytest

from conftest import REPO

README = REPO / "README.md"
PAGES = ("README.md", "docs/getting-started.md")  # the pages whose command blocks run, in this order
MARK = re.compile(r"<!--\s*readme-test:\s*(skip|writes)\b\s*(.*?)\s*-->")
OUTPUT_FLAGS = ("-o", "--output", "--html", "--png")


@dataclass
class Block:
    line: int
    code: str
    skip: str | None
    writes: list[str]


def readme_blocks(text: str) -> list[Block]:
    """The ```bash blocks of a Markdown text, with the readme-test mark of the line before each."""
    blocks, lines, i = [], text.split("\n"), 0
    while i < len(lines):
        if lines[i].strip() == "```bash":
            start, body = i, []
            i += 1
            while lines[i].strip() != "```":
                body.append(lines[i])
                i += 1
            mark = MARK.search(lines[start - 1]) if start else None
            skip = writes = None
            if mark and mark.group(1) == "skip":
                skip = mark.group(2).strip("() ") or "no reason given"
            elif mark:
                writes = mark.group(2).split()
            blocks.append(Block(start + 1, "\n".join(body), skip, writes or []))
        i += 1
    return blocks


def named_outputs(code: str) -> list[str]:
    """What the commands of a block say they write: ``-o X``, ``--html X``, ``--png X``, ``> X``."""
    found = []
    for line in code.replace("\\\n", " ").split("\n"):
        words = shlex.split(line, comments=True)
        for k, word in enumerate(words[:-1]):
            if word in OUTPUT_FLAGS or word == ">":
                found.append(words[k + 1])
    return found


def test_readme_blocks_parse_with_their_marks():
    blocks = readme_blocks(README.read_text())
    assert len(blocks) >= 8
    run = [b for b in blocks if b.skip is None]
    assert any("quickstart" in b.code for b in run) and any("report" in b.code for b in run)
    assert all(b.skip != "no reason given" for b in blocks)
    started = readme_blocks((REPO / "docs" / "getting-started.md").read_text())
    assert sum(b.skip is None for b in started) >= 3 and all(b.skip != "no reason given" for b in started)
    assert any("inspect" in b.code for b in started if b.skip is None)
    assert named_outputs("mlm-pipeline report out --html r.html --png pngs  # x\nmlm-pipeline report out --json > r.json") == \
        ["r.html", "pngs", "r.json"]


def _copy_repo(dest: Path) -> None:
    """The repository as a clone has it: tracked files and untracked ones git does not ignore."""
    files = subprocess.run(["git", "ls-files", "-z", "--cached", "--others", "--exclude-standard"], cwd=REPO,
                           capture_output=True, check=True).stdout.decode().split("\0")
    for name in filter(None, files):
        src = REPO / name
        if src.is_file():
            (dest / name).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(src, dest / name)


def _fresh_env(venv: Path, wheel: Path, env: dict) -> None:
    spec = f"{wheel}[report]"
    uv = shutil.which("uv")
    if uv:
        subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, env=env)
        extra = ["--find-links", env["PIP_FIND_LINKS"]] if env.get("PIP_FIND_LINKS") else []
        subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"), *extra, spec],
                       check=True, env=env)
    else:
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True, env=env)
        subprocess.run([str(venv / "bin" / "python"), "-m", "pip", "install", "--quiet", spec], check=True, env=env)


@pytest.mark.slow
def test_newcomer_path_wheel_then_every_readme_block(tmp_path):
    pytest.importorskip("build", reason="the wheel is built with `python -m build` (the test extra)")
    clone = tmp_path / "mlm-pipeline"
    _copy_repo(clone)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}

    # the wheel, as docs and README build it
    dist = tmp_path / "dist"
    proc = subprocess.run([sys.executable, "-m", "build", "--wheel", "--outdir", str(dist), str(clone)],
                          capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    (wheel,) = dist.glob("mlm_pipeline-*-py3-none-any.whl")
    names = zipfile.ZipFile(wheel).namelist()
    packages = {str(p.parent.relative_to(REPO / "src")) for p in (REPO / "src" / "mlm_pipeline").rglob("__init__.py")}
    assert packages == {n.rsplit("/", 1)[0] for n in names if n.endswith("/__init__.py")}
    assert any(n.endswith("licenses/LICENSE") for n in names)
    assert not any(n.startswith(("tests/", "sample/")) for n in names)
    entry = next(n for n in names if n.endswith("entry_points.txt"))
    assert "mlm-pipeline = mlm_pipeline.cli:main" in zipfile.ZipFile(wheel).read(entry).decode()

    venv = tmp_path / "venv"
    _fresh_env(venv, wheel, env)
    env["PATH"] = f"{venv / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    where = subprocess.run(["python", "-c", "import mlm_pipeline, matplotlib; print(mlm_pipeline.__file__)"],
                           capture_output=True, text=True, env=env, cwd=tmp_path, check=True).stdout
    assert where.startswith(str(venv)), where  # the installed wheel, not the source tree
    version = subprocess.run(["mlm-pipeline", "--version"], capture_output=True, text=True, env=env, check=True)
    assert "0.1.0" in version.stdout

    ran = {page: 0 for page in PAGES}
    for page in PAGES:
        for block in readme_blocks((clone / page).read_text()):
            if block.skip:
                continue
            where = f"{page} line {block.line}"
            proc = subprocess.run(["bash", "-eo", "pipefail", "-c", block.code], cwd=clone, env=env,
                                  capture_output=True, text=True, timeout=600)
            assert proc.returncode == 0, (f"{where}: exit {proc.returncode}\n{block.code}\n"
                                          f"{proc.stdout[-2000:]}\n{proc.stderr[-3000:]}")
            assert "Traceback" not in proc.stderr, proc.stderr
            for path in [*block.writes, *named_outputs(block.code)]:
                target = clone / path
                assert target.exists(), f"{where} should write {path}"
                if target.is_dir():
                    assert any(target.iterdir()), f"{where}: {path} is empty"
                else:
                    assert target.stat().st_size > 0, f"{where}: {path} is empty"
            ran[page] += 1
    assert ran["README.md"] >= 6 and ran["docs/getting-started.md"] >= 3, ran


@pytest.mark.slow
def test_install_from_a_git_url(tmp_path):
    """The README's ``pip install "mlm-pipeline[...] @ git+URL"``, with a ``file://`` URL of a repository
    made from this working tree (the same resolver path as a remote one, without the network to it)."""
    uv = shutil.which("uv")
    if uv is None:
        pytest.skip("uv is not installed (scripts/setup.sh installs it)")
    repo = tmp_path / "repo"
    _copy_repo(repo)
    git = ["git", "-c", "user.name=t", "-c", "user.email=t@example.org", "-c", "init.defaultBranch=main"]
    for args in (["init", "-q"], ["add", "-A"], ["commit", "-q", "-m", "snapshot"], ["tag", "v0.1.0"]):
        subprocess.run([*git, *args], cwd=repo, check=True, capture_output=True)
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "VIRTUAL_ENV", "PYTHONHOME")}
    venv = tmp_path / "venv"
    subprocess.run([uv, "venv", "--quiet", "--python", sys.executable, str(venv)], check=True, env=env)
    proc = subprocess.run([uv, "pip", "install", "--quiet", "--python", str(venv / "bin" / "python"),
                           f"mlm-pipeline @ git+{repo.as_uri()}@v0.1.0"], capture_output=True, text=True, env=env)
    assert proc.returncode == 0, proc.stderr
    out = subprocess.run([str(venv / "bin" / "mlm-pipeline"), "--version"], capture_output=True, text=True, env=env)
    assert out.returncode == 0 and "0.1.0" in out.stdout
    sample = REPO / "sample" / "sample_text.txt"
    run = subprocess.run([str(venv / "bin" / "mlm-pipeline"), "prepare", str(sample), "-o", str(tmp_path / "out"),
                          "-t", str(REPO / "sample" / "bert-base-uncased-vocab.txt"), "--no-progress"],
                         capture_output=True, text=True, env=env)
    assert run.returncode == 0, run.stderr
    assert (tmp_path / "out" / "manifest.json").exists()
