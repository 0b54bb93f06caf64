"""Small helpers shared by the reader tests."""

from __future__ import annotations

import json
import os
import re
import shlex

from mlm_pipeline.read import Piece, ReadOptions, get_input_format, iter_documents
from mlm_pipeline.stats import ReadStats


def split_file(path, fmt: str, size: int, split_bytes: int, options: ReadOptions | None = None):
    """The pieces the planner gets for one file (its format's ``split``)."""
    return get_input_format(fmt).split(str(path), size, split_bytes, options or ReadOptions())


def read_whole(path, fmt: str, options: ReadOptions | None = None, **piece_kw):
    stats = ReadStats()
    docs = list(iter_documents(Piece(str(path), fmt, **piece_kw), options or ReadOptions(), stats))
    return docs, stats


def read_pieces(pieces, options: ReadOptions | None = None):
    stats = ReadStats()
    docs = []
    for piece in pieces:
        docs.extend(iter_documents(piece, options or ReadOptions(), stats))
    return docs, stats


def read_split(path, fmt: str, split_bytes: int, options: ReadOptions | None = None):
    path = str(path)
    return read_pieces(split_file(path, fmt, os.path.getsize(path), split_bytes), options)


def read_cuts(path, fmt: str, cuts, options: ReadOptions | None = None):
    """Read a file through arbitrary byte ranges ending at the sorted ``cuts``."""
    path = str(path)
    bounds = [0, *sorted(set(c for c in cuts if 0 < c < os.path.getsize(path)))]
    pieces = [Piece(path, fmt, s, e) for s, e in zip(bounds, bounds[1:] + [None])]
    return read_pieces(pieces, options)


def text_oracle(data: str) -> list[list[str]]:
    """Documents of a BERT text file, as the reference script reads them: strip every line;
    an empty stripped line ends a document."""
    docs, cur = [], []
    for line in data.split("\n"):
        line = line.strip()
        if line:
            cur.append(line)
        elif cur:
            docs.append(cur)
            cur = []
    if cur:
        docs.append(cur)
    return docs


def docs_recipe(page, name: str) -> tuple[str, list[str]]:
    """A recipe of a docs page (the Python block after its ``<!-- recipe: NAME`` marker) and the
    arguments of the ``mlm-pipeline`` command after it."""
    text = page.read_text(encoding="utf-8")
    after = text[text.index(f"<!-- recipe: {name}"):]
    python = re.search(r"```python\n(.*?)```", after, re.S).group(1)
    command = re.search(r"```bash\n(.*?)```", after, re.S).group(1).strip()
    argv = shlex.split(command)
    assert argv[:2] == ["mlm-pipeline", "prepare"], command
    return python, argv[1:]


def wikitext_articles(path) -> list[str]:
    """The articles of a WikiText file, as the curation recipes cut their crawl from it."""
    text = path.read_text(encoding="utf-8")
    return [a.strip() for a in re.split(r"\n(?= = [^=].* = \n)", text) if a.strip()]


def prepare_as_typed(cwd, args: list[str]) -> dict:
    """``mlm-pipeline ARGS`` run from ``cwd`` (its paths relative, as a user types them), one
    worker; the manifest it wrote."""
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app

    before = os.getcwd()
    os.chdir(cwd)
    try:
        result = CliRunner().invoke(app, [*args, "--workers", "1", "--no-progress"])
        assert result.exit_code == 0, result.output
    finally:
        os.chdir(before)
    return json.loads((cwd / args[args.index("-o") + 1] / "manifest.json").read_text())
