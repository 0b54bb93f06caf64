"""``prepare --dry-run``: the checks a run makes before its first task and its plan, with nothing
written. VM groups run it before starting their VMs (tests/deploy): what fails here would fail
every VM the same way."""

from __future__ import annotations

import json
import re

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT
from test_cli import cli

ARGS = ["--split-size", "128KiB", "--max-seq-length", "64"]


def test_dry_run_prints_the_plan_of_the_run_and_writes_nothing(tmp_path):
    out = tmp_path / "runs" / "one"
    r = cli("prepare", SAMPLE_TEXT, WIKITEXT, "-o", out, "-t", VOCAB, *ARGS, "--claim", "--dry-run")
    assert not (tmp_path / "runs").exists()  # not even the output's parent
    plan = re.search(r"^plan: (\d+) task\(s\), ([\d,]+) bytes in 2 input file\(s\) \(split size 131,072 bytes\); "
                     r"0 file\(s\) skipped$", r.stdout, re.M)
    assert plan, r.stdout
    assert f"{SAMPLE_TEXT}  4,394 bytes, text, 1 piece(s)" in r.stdout
    assert f"without --dry-run the run writes into {out}" in r.stdout

    cli("prepare", SAMPLE_TEXT, WIKITEXT, "-o", out, "-t", VOCAB, *ARGS)  # the run itself
    manifest = json.loads((out / "manifest.json").read_text())
    assert int(plan[1]) == len(manifest["task_timings"]) > 1
    assert int(plan[2].replace(",", "")) == SAMPLE_TEXT.stat().st_size + WIKITEXT.stat().st_size


def test_dry_run_fails_as_the_run_would_on_a_bad_tokenizer_or_input(tmp_path):
    out = tmp_path / "out"
    r = cli("prepare", SAMPLE_TEXT, "-o", out, "-t", SAMPLE_TEXT, "--dry-run", check_code=2)
    run = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "real", "-t", SAMPLE_TEXT, check_code=2)
    assert r.stderr.splitlines()[-1] == run.stderr.splitlines()[-1].replace(str(tmp_path / "real"), str(out))
    r = cli("prepare", tmp_path / "missing.txt", "-o", out, "-t", VOCAB, "--dry-run", check_code=2)
    assert "no input found at" in r.stderr
    assert not out.exists()
