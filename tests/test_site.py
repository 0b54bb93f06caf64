"""The documentation site: ``mkdocs build --strict`` succeeds offline (no broken link, anchor or
reference), its home page is the README, its CLI reference is generated from the code (every
setting and every option, none written by hand), its Python reference comes from the docstrings,
and no page shows a machine's path or a tracker number."""

from __future__ import annotations

import html
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from conftest import REPO
from test_docs import MACHINE_PATH, TRACKER

pytest.importorskip("mkdocs", reason="the site is built with MkDocs (the docs extra, in `all`)")
pytest.importorskip("material", reason="the site's theme, Material for MkDocs (the docs extra)")
pytest.importorskip("mkdocstrings_handlers.python", reason="the Python reference (the docs extra)")


def _build(config: Path, site: Path) -> subprocess.CompletedProcess:
    """``mkdocs build --strict`` with no network: any fetch goes to a closed port and fails."""
    env = {**os.environ, "NO_MKDOCS_2_WARNING": "1", "HTTP_PROXY": "http://127.0.0.1:9",
           "HTTPS_PROXY": "http://127.0.0.1:9", "http_proxy": "http://127.0.0.1:9", "https_proxy": "http://127.0.0.1:9"}
    env.pop("NO_PROXY", None), env.pop("no_proxy", None)
    return subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "-f", str(config), "-d", str(site)],
                          capture_output=True, text=True, env=env, timeout=300)


def _text(page: Path) -> str:
    """What a reader sees of a page: its article, tags stripped, entities decoded."""
    article = re.search(r"<article\b.*?</article>", page.read_text(encoding="utf-8"), flags=re.S)
    assert article, page
    return html.unescape(re.sub(r"<[^>]+>", " ", article.group(0)))


@pytest.fixture(scope="module")
def site(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("site")
    proc = _build(REPO / "mkdocs.yml", out)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-5000:]
    assert "WARNING" not in proc.stderr, proc.stderr
    return out


def test_every_page_builds_and_none_shows_a_machine_path_or_a_tracker_number(site):
    pages = sorted(site.rglob("index.html"))
    built = {str(p.parent.relative_to(site)) for p in pages}
    expected = {"."} | {p.stem for p in (REPO / "docs").glob("*.md")}
    assert expected <= built, expected - built
    for page in pages:
        text = " ".join(_text(page).split())
        assert not MACHINE_PATH.search(text), (page, MACHINE_PATH.search(text).group(0))
        assert not TRACKER.search(text), (page, TRACKER.search(text).group(0))


def test_the_home_page_is_the_readme_with_site_links(site):
    home = site / "index.html"
    text = " ".join(_text(home).split())
    assert "Five ways in" in text and "bash scripts/quickstart.sh" in text and "bash scripts/test.sh" in text
    raw = home.read_text(encoding="utf-8")
    assert 'href="getting-started/"' in raw and 'href="docs/' not in raw


def test_the_cli_reference_is_generated_from_the_code(site):
    """Every setting of the settings model and every option of every command is on the page,
    with its help text, though ``docs/cli.md`` holds no table of them."""
    import click
    import typer

    from mlm_pipeline.cli import app
    from mlm_pipeline.config import settings_of

    source = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    assert not re.search(r"^\s*\|", source, flags=re.M), "docs/cli.md holds a table written by hand"
    assert "<!-- cli-reference -->" in source
    text = " ".join(_text(site / "cli" / "index.html").split())
    for s in settings_of():
        if s.positional:
            continue
        assert s.flags[0] in text, s.flags[0]
        assert " ".join(s.help.split())[:60] in text, s.help
        if s.google:
            assert f"--{s.google}" in text
    group = typer.main.get_command(app)
    for name, command in group.commands.items():
        assert f"mlm-pipeline {name}" in text, name
        for param in command.get_params(click.Context(command)):
            if isinstance(param, click.Option) and not param.hidden:
                assert param.opts[-1] in text, (name, param.opts)


def test_the_python_reference_comes_from_the_docstrings(site):
    from mlm_pipeline import pipeline
    from mlm_pipeline.torch import dataset

    text = " ".join(_text(site / "api-reference" / "index.html").split())
    first_line = lambda obj: " ".join(obj.__doc__.strip().splitlines()[0].split())  # noqa: E731
    assert first_line(pipeline.prepare).replace("``", "") in text
    assert first_line(dataset.MLMDataset).replace("``", "")[:50] in text
    for name in ("MLMDataLoader", "MLMCollator", "PrepareConfig", "report_data", "ConfigError"):
        assert name in text, name
    assert ":class:" not in text and ":func:" not in text  # Sphinx roles shown as code


def test_a_broken_link_fails_the_build(tmp_path):
    """Strict mode is on: a page linking to a page or an anchor that does not exist stops the build."""
    for name in ("mkdocs.yml", "README.md"):
        shutil.copy2(REPO / name, tmp_path / name)
    shutil.copytree(REPO / "docs", tmp_path / "docs")
    (tmp_path / "src").symlink_to(REPO / "src")
    page = tmp_path / "docs" / "inputs.md"
    page.write_text(page.read_text(encoding="utf-8") + "\nSee [the missing page](missing.md).\n", encoding="utf-8")
    proc = _build(tmp_path / "mkdocs.yml", tmp_path / "site")
    assert proc.returncode != 0 and "missing.md" in proc.stderr, proc.stderr[-3000:]
