"""The command line as a user meets it: messages, exit codes, bad input accounted for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT


def cli(*args, check_code: int | None = 0):
    env = {**os.environ, "COLUMNS": "240"}  # rich wraps help text to the terminal width
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *map(str, args)], capture_output=True, text=True, env=env)
    if check_code is not None:
        assert proc.returncode == check_code, (proc.returncode, proc.stdout, proc.stderr)
    assert "Traceback" not in proc.stderr, proc.stderr
    return proc


def test_help_documents_the_reference_flags():
    out = cli("prepare", "--help").stdout
    for flag in ("--max-seq-length", "--max-predictions-per-seq", "--masked-lm-prob", "--dupe-factor",
                 "--short-seq-prob", "--random-seed", "--do-lower-case", "--do-whole-word-mask", "--format",
                 "--workers", "--input-format", "--text-field", "--config", "--objective", "--masking"):
        assert flag in out, flag


def test_user_errors_are_one_clear_line_and_exit_2(tmp_path):
    r = cli("prepare", tmp_path / "nope.txt", "-o", tmp_path / "o", "-t", VOCAB, check_code=2)
    assert "no input found at" in r.stderr and "nope.txt" in r.stderr
    r = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "o", "-t", tmp_path / "vocab.txt", check_code=2)
    assert "tokenizer path does not exist" in r.stderr
    blocker = tmp_path / "file"
    blocker.write_text("x")
    r = cli("prepare", SAMPLE_TEXT, "-o", blocker / "out", "-t", VOCAB, check_code=2)
    assert "cannot write to output" in r.stderr
    r = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "o", "-t", VOCAB, "--max-predictions-per-seq", "200", check_code=2)
    assert "cannot exceed max_seq_length" in r.stderr
    r = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "o", "-t", VOCAB, "--split-size", "lots", check_code=2)
    assert "not a size" in r.stderr


def _bad_corpus(d):
    d.mkdir()
    good = SAMPLE_TEXT.read_bytes()
    (d / "a_good.txt").write_bytes(good)
    (d / "b_empty.txt").write_bytes(b"")
    (d / "c_binary.txt").write_bytes(bytes(range(256)) * 64)
    (d / "d_mixed.txt").write_bytes(
        b"A fine first document .\nIt has two lines .\n\n"
        b"This one has a broken byte \xff\xfe here .\nAnd goes on .\n\n"
        b"This one has a NUL \x00 byte .\n\n"
        + b"giant " * 400_000 + b"\n\n"
        + b"  \n\t\n\n"
        b"The last document is fine too .\n"
    )
    return d


def test_bad_input_is_skipped_and_counted(tmp_path):
    corpus = _bad_corpus(tmp_path / "corpus")
    out = tmp_path / "o"
    r = cli("prepare", corpus, "-o", out, "-t", VOCAB, "--no-progress")
    assert "skipping" in r.stderr and "c_binary.txt" in r.stderr
    m = json.loads((out / "manifest.json").read_text())
    t = m["totals"]
    assert t["files_skipped"] == {"binary": 1, "empty_file": 1}
    assert t["documents_skipped"] == {"binary": 1, "line_too_long": 1}
    assert t["documents_with_replaced_bytes"] == 1
    n_good = len([b for b in SAMPLE_TEXT.read_text().split("\n\n") if b.strip()])
    assert t["documents_read"] == n_good + 3
    assert "wrote" in r.stdout and "line_too_long 1" in r.stdout


def test_decode_error_policies(tmp_path):
    corpus = _bad_corpus(tmp_path / "corpus")
    r = cli("prepare", corpus, "-o", tmp_path / "skip", "-t", VOCAB, "--on-decode-error", "skip", "--no-progress")
    t = json.loads((tmp_path / "skip" / "manifest.json").read_text())["totals"]
    assert t["documents_skipped"]["invalid_utf8"] == 1 and t.get("documents_with_replaced_bytes", 0) == 0
    r = cli("prepare", corpus, "-o", tmp_path / "fail", "-t", VOCAB, "--on-decode-error", "fail", check_code=2)
    assert "d_mixed.txt" in r.stderr and "offset" in r.stderr
    assert not list((tmp_path / "fail" / "shards").glob("*d_mixed*")) if (tmp_path / "fail" / "shards").exists() else True


@pytest.mark.parametrize("fmt", ["tfrecord", "parquet"])
def test_inspect_and_report(tmp_path, fmt):
    out = tmp_path / "o"
    cli("prepare", SAMPLE_TEXT, "-o", out, "-t", VOCAB, "--format", fmt, "--dupe-factor", "3", "--no-progress")
    shown = cli("inspect", out, "-n", "4").stdout
    assert shown.count("[CLS]") == 4 and "[MASK]" in shown and "masked: " in shown
    assert "next_sentence_label" in shown
    shard = next((out / "shards").iterdir())
    assert cli("inspect", shard, "-n", "1").stdout.count("[CLS]") == 1
    js = cli("inspect", shard, "-n", "2", "--json").stdout.splitlines()[1:]
    assert len(js) == 2 and "masked_lm_positions" in json.loads(js[0])
    rep = cli("report", out).stdout
    assert "masked tokens" in rep and "instance length" in rep and "random-next" in rep
    cli("inspect", tmp_path / "missing", check_code=2)


def test_config_file_with_command_line_override(tmp_path):
    yml = tmp_path / "prep.yaml"
    yml.write_text("max-seq-length: 64\nmax_predictions_per_seq: 10\ndupe-factor: 2\nformat: parquet\nsplit-size: 1MB\n")
    cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "y", "-t", VOCAB, "--config", yml, "--dupe-factor", "3", "--no-progress")
    m = json.loads((tmp_path / "y" / "manifest.json").read_text())
    assert m["config"]["max_seq_length"] == 64 and m["config"]["max_predictions_per_seq"] == 10
    assert m["config"]["dupe_factor"] == 3 and m["format"] == "parquet" and m["config"]["split_bytes"] == 1 << 20
    toml = tmp_path / "prep.toml"
    toml.write_text("[prepare]\nmax-seq-length = 96\ndo-whole-word-mask = true\n")
    cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "t", "-t", VOCAB, "--config", toml, "--no-progress")
    m = json.loads((tmp_path / "t" / "manifest.json").read_text())
    assert m["config"]["max_seq_length"] == 96 and m["config"]["do_whole_word_mask"] is True
    bad = tmp_path / "bad.yaml"
    bad.write_text("max-seq-lenght: 64\n")
    r = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "b", "-t", VOCAB, "--config", bad, check_code=2)
    assert "max-seq-lenght" in r.stderr


def test_reference_mode_through_the_cli_matches_golden(tmp_path):
    import gzip

    import numpy as np

    from mlm_pipeline.inspect import read_shard

    out = tmp_path / "ref"
    cli("prepare", SAMPLE_TEXT, "-o", out, "-t", VOCAB, "--reference", "--dupe-factor", "10", "--no-progress")
    batch = read_shard(str(next((out / "shards").iterdir())))
    padded = batch.padded(128, 20)
    golden = [json.loads(line) for line in gzip.open(WIKITEXT.parent.parent / "tests/data/golden/sample_text-d10.jsonl.gz", "rt")]
    assert len(golden) == len(batch) == 118
    for k in padded:
        assert np.array_equal(padded[k], np.array([g[k] for g in golden])), k
