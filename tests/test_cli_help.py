"""``--help`` as a newcomer reads it on an ordinary terminal: short enough to read, grouped in
panels, switches as switches, text as written (rich markup swallows no ``[torch]``)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from mlm_pipeline.cli_help import flag_text
from mlm_pipeline.config import PANELS, PrepareConfig, settings_of

COMMANDS = ("prepare", "inspect", "report", "train", "finalize", "vocab")


def help_of(command: str, columns: int) -> str:
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", command, "--help"], capture_output=True,
                          text=True, env={**os.environ, "COLUMNS": str(columns), "TERM": "dumb"})
    assert proc.returncode == 0 and not proc.stderr, proc.stderr
    return proc.stdout


# (sop's two flags: +5 lines; --wiki-keep-references: +3 at 80 columns; packed's --packing and
# --no-cross-document: +6 at 80, +6 at 100; mds and --mds-compression: +4 at 80, +3 at 100; the four
# --language flags: +8 at 80 columns, +7 at 100; --format megatron: +1; --id-field and
# --metadata-field: +4 at 80, +2 at 100)
@pytest.mark.parametrize("columns,most", [(80, 216), (100, 184)])
def test_prepare_help_fits_an_ordinary_terminal(columns, most):
    out = help_of("prepare", columns)
    lines = out.splitlines()
    assert len(lines) <= most, len(lines)
    assert max(len(line) for line in lines) <= columns
    titles = [f"─ {panel.capitalize()} " for panel in PANELS]
    assert [out.index(t) for t in titles] == sorted(out.index(t) for t in titles)
    for s in settings_of(PrepareConfig):  # every setting, with its flag and value, in its own panel
        panel = out[out.index(f"─ {'Arguments' if s.positional else s.panel.capitalize()} "):]
        panel = panel[:panel.index("╰")]
        assert flag_text(s) in panel, (s.name, flag_text(s))
    assert "--do-lower-case / --no-do-lower-case" in out and "--max-seq-length N " in out
    assert "--format tfrecord|parquet|mds" in out and "-o, --output TEXT" in out


@pytest.mark.parametrize("command", COMMANDS)
def test_no_type_placeholders_for_switches(command):
    out = help_of(command, 100)
    assert "<bool>" not in out
    if command == "prepare":
        assert not re.search(r"<(str|int|float|list\[str\])>", out), out


def test_brackets_in_help_are_shown_as_written():
    assert "pip install 'mlm-pipeline[torch]'" in help_of("train", 100)
    prepare = help_of("prepare", 100)
    assert "[prepare] table" in prepare and "[CLS] and [SEP]" in prepare and "80% [MASK]" in prepare
    assert "[MASK] visible" in help_of("inspect", 100)


def test_help_is_escaped_as_rich_escapes_it():
    """The CLI escapes help without importing rich (a run shows none): the same result as rich's
    own ``escape``, on every setting's and command's help and on brackets and backslashes."""
    from rich.markup import escape as rich_escape

    from mlm_pipeline import cli

    texts = [s.help for s in settings_of(PrepareConfig)] + [c.callback.__doc__ or "" for c in cli.app.registered_commands]
    texts += ["[CLS]", "[/b]", "[#fff]", "[@click]", "[A] [b", "\\[b]", "a\\\\[i]x[/i]", "ends\\", "ends\\\\", "[x]\\"]
    for text in texts:
        assert cli.escape(text) == rich_escape(text), text


def test_a_docstring_paragraph_is_wrapped_by_the_terminal_not_by_the_source():
    text = help_of("verify", 240)
    assert "Reads the manifest (or, before the run is finalized, the task markers). Exits 0 when the run is complete" in text


@pytest.mark.parametrize("command", [c for c in (*COMMANDS, "verify") if c != "prepare"])
def test_every_command_shows_each_flag_whole_on_an_80_column_terminal(command):
    """rich's option table cut long flags at 80 columns (``--tokenizer-fla…``, ``--character-cov…``);
    every command now lays its options out as ``prepare --help`` does, each flag whole."""
    import typer.main

    from mlm_pipeline.cli import app

    out = help_of(command, 80)
    assert "…" not in out and max(len(line) for line in out.splitlines()) <= 80
    assert not re.search(r"<(str|int|float|list\[str\])>", out), out
    params = typer.main.get_command(app).commands[command].params
    for param in params:
        for flag in (*param.opts, *param.secondary_opts):
            if flag.startswith("-"):
                assert re.search(rf"(^|[\s,/]){re.escape(flag)}([\s,]|$)", out, re.M), (command, flag)
