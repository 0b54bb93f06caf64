"""What the read-back commands say when they meet something unexpected: a reader that goes
away, a file that is not a shard, an output already finalized, a run stopped by Ctrl-C."""

from __future__ import annotations

import io
import json
import os
import shutil
import subprocess
import sys

import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT
from mlm_pipeline.progress import Progress


def cli(*args, check_code: int | None = 0, cwd=None):
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *map(str, args)], capture_output=True,
                          text=True, cwd=cwd, env={**os.environ, "COLUMNS": "200"})
    if check_code is not None:
        assert proc.returncode == check_code, (proc.returncode, proc.stdout, proc.stderr)
    return proc


@pytest.fixture(scope="module")
def prepared(tmp_path_factory):
    """The sample text prepared ten times over: about 125 instances, 100 KB of `inspect` text,
    more than a pipe holds, so a reader that stops early makes the writer meet a closed pipe."""
    out = tmp_path_factory.mktemp("prepared") / "out"
    cli("prepare", SAMPLE_TEXT, "-o", out, "-t", VOCAB, "--dupe-factor", "10", "--no-progress")
    return out


def _instances(out) -> int:
    """The instance count the run's manifest records (what the messages must repeat)."""
    n = json.loads((out / "manifest.json").read_text())["totals"]["instances"]
    assert 100 < n < 150  # the sample text, ten passes
    return n


def test_inspect_piped_into_head_exits_quietly(prepared):
    proc = subprocess.Popen([sys.executable, "-m", "mlm_pipeline.cli", "inspect", str(prepared), "-n", "1000"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    first = proc.stdout.readline()  # what `| head -1` does: read a line, then close the pipe
    proc.stdout.close()
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=60) == 0, err
    assert first.startswith(b"== ") and f"{_instances(prepared)} instances".encode() in first
    assert err == ""  # no "error: [Errno 32] Broken pipe", no traceback


def test_inspect_names_the_file_and_what_it_expected(prepared, tmp_path):
    cases = {}
    (tmp_path / "plain").mkdir()
    cases[tmp_path / "plain"] = ["plain: a directory without manifest.json or _run.json",
                                 "expected a prepared output directory or a shard file (.tfrecord, .parquet, .mds, .bin, .arrow)"]
    cases[SAMPLE_TEXT] = ["sample_text.txt: not a shard of a known output format (.tfrecord, .parquet, .mds, .bin, .arrow)",
                          "expected a shard file written by mlm-pipeline prepare, or its output directory"]
    for name in ("manifest.json", "_run.json"):
        cases[prepared / name] = [f"{prepared / name}: a file of the prepared output {prepared}, not a shard",
                                  f"run: mlm-pipeline inspect {prepared}"]
    (tmp_path / "text.tfrecord").write_bytes(SAMPLE_TEXT.read_bytes())
    cases[tmp_path / "text.tfrecord"] = ["text.tfrecord: not a readable tfrecord shard ("]
    (tmp_path / "text.parquet").write_bytes(SAMPLE_TEXT.read_bytes())
    cases[tmp_path / "text.parquet"] = ["text.parquet: not a readable parquet shard ("]
    for path, expected in cases.items():
        err = cli("inspect", path, check_code=2).stderr
        assert err.count("\n") == 1 and "Traceback" not in err, err  # one line
        for part in expected:
            assert part in err, (path, err)
    # a shard of the output moved elsewhere is still read by its extension
    shard = next((prepared / "shards").iterdir())
    shutil.copy(shard, tmp_path / shard.name)
    assert f"{_instances(prepared)} instances" in cli("inspect", tmp_path / shard.name, "-t", VOCAB, "-n", "1").stdout


def test_finalize_of_a_finished_run_says_it_wrote_nothing(prepared):
    out = cli("finalize", prepared).stdout
    assert out.startswith("manifest.json already exists; nothing written")
    n = _instances(prepared)
    assert "wrote" not in out and f"{prepared} holds {n} instances in 1 shard(s)" in out
    forced = cli("finalize", prepared, "--force").stdout
    assert forced.startswith(f"wrote {n} instances in 1 shard(s)")


def _final_line(raise_inside: BaseException | None) -> str:
    stream = io.StringIO()  # not a terminal: plain progress lines
    try:
        with Progress(total_bytes=1000, total_tasks=2, enabled=True, stream=stream) as progress:
            progress.update({"bytes": 500, "documents": 3, "tokens": 90})
            progress.task_done({})
            if raise_inside is not None:
                raise raise_inside
    except BaseException as exc:  # noqa: BLE001 - re-raised by the context manager, as it must be
        assert exc is raise_inside
    return stream.getvalue().splitlines()[-1]


def test_progress_line_says_how_the_run_ended():
    assert _final_line(None).endswith("tasks 1/2, done")
    assert _final_line(KeyboardInterrupt()).endswith("tasks 1/2, interrupted")
    assert _final_line(RuntimeError("task 3 failed")).endswith("tasks 1/2, stopped by an error")


def test_progress_of_a_resumed_run_ends_at_its_tasks_planned_bytes(tmp_path):
    """Two of six tasks run again: the last line shows their planned bytes, 100% (a task's reader
    counts the documents it owns, which cross its range's edges: it ended at 99.5%)."""
    out = tmp_path / "o"
    args = ["prepare", WIKITEXT, "-o", out, "-t", VOCAB, "--split-size", "200KB", "--workers", "2"]
    cli(*args, "--no-progress")
    for name in ("00001.json", "00004.json", "manifest.json"):
        (out / ("_tasks" if name[0] == "0" else "") / name).unlink()
    last = [line for line in cli(*args, "--progress").stderr.splitlines() if line.startswith("prepare:")][-1]
    assert last.startswith("prepare: 100.0% 0.4/0.4 MB,") and last.endswith("tasks 2/2, done"), last


def test_progress_counts_a_task_run_again_once_and_never_goes_back():
    """Task a reports part of a first try, dies, and reports its whole second try; task b reads
    past its range: each task ends at its final counts, counted once, and the bytes shown never
    decrease (they did: a task brought back to its planned bytes)."""
    stream = io.StringIO()
    mb = 1_000_000
    with Progress(total_bytes=10 * mb, total_tasks=2, enabled=True, stream=stream, interval=0) as progress:
        progress.update({"bytes": 3 * mb, "documents": 3, "tokens": 90, "_task": "a"})  # the first try
        progress.update({"bytes": 4.8 * mb, "documents": 5, "tokens": 150, "_task": "a"})  # the second, whole
        progress.task_done({"task_id": "a", "task": {"input_bytes": 5 * mb},
                            "stats": {"bytes_read": 4.8 * mb, "documents_read": 5, "tokens": 150}})
        progress.update({"bytes": 5.3 * mb, "documents": 4, "tokens": 100, "_task": "b"})
        progress.task_done({"task_id": "b", "task": {"input_bytes": 5 * mb},
                            "stats": {"bytes_read": 5.3 * mb, "documents_read": 4, "tokens": 100}})
    lines = stream.getvalue().splitlines()
    assert [line.split()[2] for line in lines] == ["3.0/10.0", "7.8/10.0", "7.8/10.0", "10.0/10.0", "10.0/10.0", "10.0/10.0"]
    assert lines[-1].startswith("prepare: 100.0% 10.0/10.0 MB, 9 docs,") and lines[-1].endswith("tasks 2/2, done")


def test_report_says_what_a_run_did_not_count(tmp_path):
    """Reference mode does not count short targets or truncated pairs: the report says so rather
    than showing 0; an output without masks says the loader masks, not "0 masked tokens"."""
    ref, plain, unmasked = tmp_path / "ref", tmp_path / "plain", tmp_path / "unmasked"
    cli("prepare", SAMPLE_TEXT, "-o", ref, "-t", VOCAB, "--reference", "--no-progress")
    cli("prepare", SAMPLE_TEXT, "-o", plain, "-t", VOCAB, "--no-progress")
    cli("prepare", SAMPLE_TEXT, "-o", unmasked, "-t", VOCAB, "--objective", "tokens", "--no-progress")
    text = cli("report", ref).stdout
    assert "(reference mode)" in text
    assert "documents with a short target length, truncated pairs: not tracked in reference mode" in text
    assert "truncated pairs 0" not in text and "truncated pairs: 0" not in text
    assert "tokens of the documents read 1,019" in text and "masked tokens 180" in text
    text = cli("report", plain).stdout
    totals = json.loads((plain / "manifest.json").read_text())["totals"]
    assert totals["truncated_pairs"] > 0  # counted, so the report must show the number
    assert (f"documents with a short target length: {totals['short_target_documents']}; "
            f"truncated pairs: {totals['truncated_pairs']}") in text
    assert "tokens of the documents read 1,019" in text and "not tracked" not in text
    text = cli("report", unmasked).stdout
    assert "masks: none in the shards (--masking none): the training loader masks at load time" in text
    assert "masked tokens 0" not in text and "masked positions per instance" not in text


def test_the_progress_bar_is_drawn_without_a_thread_of_its_own():
    """On a terminal the bar is redrawn from the updates: a refresh thread would make the
    driver spawn its pool workers instead of forking them."""
    import io
    import threading

    from mlm_pipeline.progress import Progress

    class Terminal(io.StringIO):
        def isatty(self) -> bool:
            return True

    stream = Terminal()
    before = threading.active_count()
    with Progress(total_bytes=2_000_000, total_tasks=2, enabled=True, stream=stream) as progress:
        assert progress._bar is not None  # the live bar, not log lines
        assert threading.active_count() == before
        progress.update({"bytes": 1_000_000, "documents": 7, "tokens": 900})
        assert "7 docs" in stream.getvalue()  # the first update is drawn at once
        progress.task_done({})  # (redrawn at most every 0.1 s, and when the bar stops)
    assert "tasks 1/2" in stream.getvalue()
    assert threading.active_count() == before


def test_a_latin1_corpus_is_warned_about_in_the_summary_and_the_report(tmp_path):
    """WikiText in Latin-1: 130 of its 2,183 paragraphs hold accented characters, which are then not UTF-8."""
    from conftest import WIKITEXT

    latin1 = tmp_path / "latin1.txt"
    latin1.write_bytes(WIKITEXT.read_text(encoding="utf-8").encode("latin-1", errors="replace"))
    out = tmp_path / "out"
    summary = cli("prepare", latin1, "-o", out, "-t", VOCAB, "--no-progress").stdout
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    replaced = totals["documents_with_replaced_bytes"]
    assert replaced > 0.03 * totals["documents_read"]
    assert f"warning: {replaced:,} of the " in summary and "is the input in another encoding?" in summary
    assert "is the input in another encoding?" in cli("report", out).stdout
    clean = cli("prepare", WIKITEXT, "-o", tmp_path / "utf8", "-t", VOCAB, "--no-progress").stdout
    assert "another encoding" not in clean


def test_inspect_after_the_vocab_moved_and_report_of_a_shard_say_what_to_do(tmp_path):
    vocab = tmp_path / "my-vocab.txt"
    shutil.copy(VOCAB, vocab)
    out = tmp_path / "out"
    cli("prepare", SAMPLE_TEXT, "-o", out, "-t", vocab, "--no-progress")
    vocab.rename(tmp_path / "moved.txt")
    err = cli("inspect", out, "-n", "1", check_code=2).stderr
    assert "the tokenizer this output was made with" in err and "--tokenizer/-t" in err and str(vocab) in err
    assert "[CLS]" in cli("inspect", out, "-n", "1", "-t", tmp_path / "moved.txt").stdout
    shard = next((out / "shards").iterdir())
    lines = (tmp_path / "moved.txt").read_text().splitlines(keepends=True)
    (tmp_path / "other.txt").write_text("".join(lines[:2000] + [lines[2001], lines[2000]] + lines[2002:]))
    for path in (out, shard):  # another vocab's words for these ids: refused, not shown
        err = cli("inspect", path, "-n", "1", "-t", tmp_path / "other.txt", check_code=2).stderr
        assert f"tokenizer {tmp_path / 'other.txt'} (do_lower_case=True) is not the one that prepared {path}" in err
        assert "--json" in err
    err = cli("report", shard, check_code=2).stderr
    assert "is a file: report reads an output directory" in err and f"mlm-pipeline inspect {shard}" in err
    for command in ("finalize", "verify"):  # (not "Not a directory: .../_run.json")
        err = cli(command, shard, check_code=2).stderr
        assert f"{shard} is a file: expected the output directory of a prepare run" in err, (command, err)
    assert "no such directory" in cli("report", tmp_path / "nowhere", check_code=2).stderr
    assert "greater than or equal to 1" in cli("inspect", out, "-n", "-1", check_code=2).stderr


def test_the_same_prepare_on_a_finished_output_says_what_it_holds(tmp_path):
    args = ("prepare", SAMPLE_TEXT, "-o", tmp_path / "out", "-t", VOCAB, "--no-progress")
    first = cli(*args).stdout
    assert first.startswith("wrote ")
    again = cli(*args)
    assert "resuming: 1 of 1 tasks already complete" in again.stderr
    assert again.stdout.startswith(f"{tmp_path / 'out'} holds ") and "wrote" not in again.stdout


def test_reference_mode_refuses_inputs_and_flags_it_would_ignore(tmp_path):
    """--reference reads plain text line by line, as Google's script: a WikiExtractor file is
    refused (its <doc> lines would be trained on), unless --input-format text asks for exactly
    that; --sentence-split and another --input-format are refused."""
    from conftest import SAMPLE

    wx = SAMPLE / "wikiextractor-AA.txt"
    got = cli("prepare", wx, "-o", tmp_path / "a", "-t", VOCAB, "--reference", "--no-progress", check_code=2)
    assert f"--reference reads plain text line by line, as its reference script does; {wx} is read as " \
           "wikiextractor" in got.stderr and "--input-format text" in got.stderr
    assert not (tmp_path / "a" / "shards").exists()
    raw = cli("prepare", wx, "-o", tmp_path / "b", "-t", VOCAB, "--reference", "--input-format", "text", "--no-progress")
    assert raw.returncode == 0
    assert '"format": "text"' in (tmp_path / "b" / "manifest.json").read_text()
    for flags, message in ((["--sentence-split"], "--sentence-split does not apply"),
                           (["--input-format", "jsonl"], "--input-format jsonl does not apply")):
        got = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "c", "-t", VOCAB, "--reference", *flags, check_code=2)
        assert message in got.stderr


def test_whole_word_masking_without_masks_in_the_shards_is_the_loaders(tmp_path):
    """With --masking none the scheme is recorded and the loader masks with it: no warning that
    it has no effect (the loader used to mask tokens, whatever the run asked for)."""
    from mlm_pipeline.torch.manifest import load_prepared

    err = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "none", "-t", VOCAB, "--no-progress", "--masking", "none",
              "--do-whole-word-mask").stderr
    assert "has no effect" not in err
    assert load_prepared(str(tmp_path / "none")).masking_scheme["masking_scheme"] == "whole-word"
    err = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "static", "-t", VOCAB, "--no-progress",
              "--do-whole-word-mask").stderr
    assert "--do-whole-word-mask" not in err


def test_a_vocab_without_its_unknown_token_is_warned_about_and_named_where_it_fails(tmp_path):
    """HF's WordPiece fails the first word it cannot spell when [UNK] is missing, as Google's
    script does (a KeyError there), with a message that names no file: a warning at the start,
    and the task's error names the tokenizer and the fix. Text it can spell is prepared."""
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in VOCAB.read_text(encoding="utf-8").splitlines() if t != "[UNK]"),
                     encoding="utf-8")
    snowman = tmp_path / "snowman.txt"
    snowman.write_text("A snowman \u2603 stands here.\nIt melts.\n\nAnother document.\nIt ends.\n", encoding="utf-8")
    warned = f"tokenizer {vocab} has no [UNK] token: a word its vocabulary cannot spell will stop the run's task there"
    for reference in ([], ["--reference"]):
        out = tmp_path / f"out{len(reference)}"
        got = cli("prepare", snowman, "-o", out, "-t", vocab, *reference, "--no-progress", check_code=2)
        assert warned in got.stderr
        assert f"TokenizerError: tokenizer {vocab} has no [UNK] token: a text holds a word its vocabulary cannot " \
               "spell; add a line [UNK] to the vocabulary" in got.stderr, got.stderr
        assert "Traceback" not in got.stderr and "WordPiece error" not in got.stderr
        spelled = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / f"spelled{len(reference)}", "-t", vocab, *reference,
                      "--no-progress")
        assert warned in spelled.stderr and spelled.stdout.startswith("wrote ")


def test_a_text_file_without_blank_lines_is_cut_into_block_sized_parts_and_warned_about(tmp_path):
    """Google's text format makes a file with no blank line one document. It is read in parts of
    --block-size (a task's block holds a whole part: with 64 MiB parts a worker passed 1 GB), the
    cuts are counted, and the summary says why one task read the whole file."""
    lines = WIKITEXT.read_text(encoding="utf-8").splitlines()
    text = tmp_path / "noblank.txt"
    text.write_text("".join(line.strip() + "\n" for line in lines if line.strip()), encoding="utf-8")
    out = tmp_path / "out"
    got = cli("prepare", text, "-o", out, "-t", VOCAB, "--block-size", "128KiB", "--split-size", "256KiB",
              "--no-progress")
    totals = json.loads((out / "manifest.json").read_text())["totals"]
    size = text.stat().st_size  # about 1 MB: 8 parts of at most 128 KiB
    assert totals["documents_read"] == totals["documents_cut"] + 1 >= size // (128 << 10)
    assert totals["bytes_read"] == size
    assert "documents longer than --block-size were cut into parts at line ends" in got.stderr + got.stdout
    report = cli("report", out).stdout
    assert "documents longer than --block-size were cut" in report
    plain = cli("prepare", WIKITEXT, "-o", tmp_path / "plain", "-t", VOCAB, "--no-progress")
    assert "cut into parts" not in plain.stderr + plain.stdout
    assert "documents_cut" not in json.loads((tmp_path / "plain" / "manifest.json").read_text())["totals"]


def test_a_refused_run_leaves_no_directory_it_made(tmp_path):
    """A missing input, a text file given as the vocabulary, an empty input: the run is refused
    (exit 2) and the output directory it was to write, parents included, is not left behind; a
    directory that existed before stays."""
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    cases = [("/nonexistent/corpus.txt", VOCAB), (SAMPLE_TEXT, SAMPLE_TEXT), (empty, VOCAB)]
    for i, (corpus, vocab) in enumerate(cases):
        out = tmp_path / f"new-{i}" / "deeper" / "out"
        cli("prepare", corpus, "-o", out, "-t", vocab, "--no-progress", check_code=2)
        assert not (tmp_path / f"new-{i}").exists()
    kept = tmp_path / "kept"
    kept.mkdir()
    cli("prepare", empty, "-o", kept, "-t", VOCAB, "--no-progress", check_code=2)
    assert kept.is_dir() and list(kept.iterdir()) == []
    cli("prepare", empty, "-o", kept / "out", "-t", VOCAB, "--no-progress", check_code=2)
    assert list(kept.iterdir()) == []


def test_a_failed_task_is_told_once(tmp_path):
    """The failure is logged as it happens (the run goes on with the other tasks); the closing
    error says how the run went and names the task, without printing the failure a second time."""
    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"a sentence.\n\xff\xfe not UTF-8.\n")
    proc = cli("prepare", bad, "-o", tmp_path / "out", "-t", VOCAB, "--on-decode-error", "fail", "--no-progress",
               check_code=2)
    assert proc.stderr.count("invalid UTF-8 at byte offset") == 1, proc.stderr
    assert "error: 1 of 1 tasks failed, the other 0 completed (task 00000: the error above)" in proc.stderr


def test_an_unsupported_backend_in_auto_mode_is_not_told_at_every_load(tmp_path):
    """The fast backend does not implement ELECTRA's rules, so auto mode encodes with HF: that is
    recorded in the manifest, and not logged by every command that loads the tokenizer, even with
    -v (inspect only decodes)."""
    out = tmp_path / "out"
    prepared = cli("-v", "prepare", SAMPLE_TEXT, "-o", out, "-t", VOCAB, "--objective", "electra", "--no-progress")
    assert "falls back" not in prepared.stderr, prepared.stderr
    manifest = json.loads((out / "manifest.json").read_text())
    [backend] = manifest["tokenizer_backend"]
    assert backend["backend"] == "hf" and "fallback_reason" in backend
    shown = cli("-v", "inspect", out, "-n", "1")
    assert "falls back" not in shown.stderr, shown.stderr


def test_messages_name_the_flags_as_the_user_spelt_them(tmp_path):
    """Google's command line gets advice in Google's spelling (it said "drop --no-do-lower-case"
    to a user who typed --do_lower_case=False), ours in ours; an existing file given as
    --output_file is refused without first being called "the output directory here"."""
    google = cli("prepare", f"--input_file={SAMPLE_TEXT}", f"--output_file={tmp_path / 'g'}", f"--vocab_file={VOCAB}",
                 "--do_lower_case=False", "--no-progress")
    assert "drop --do_lower_case=False" in google.stderr and "--no-do-lower-case" not in google.stderr
    ours = cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "o", "-t", VOCAB, "--no-do-lower-case", "--no-progress")
    assert "drop --no-do-lower-case" in ours.stderr and "do_lower_case" not in ours.stderr
    existing = tmp_path / "existing.tfrecord"
    existing.write_text("")
    refused = cli("prepare", f"--input_file={SAMPLE_TEXT}", f"--output_file={existing}", f"--vocab_file={VOCAB}",
                  "--no-progress", check_code=2)
    assert "note:" not in refused.stderr and "is the output directory here" not in refused.stderr
    assert f"the output {existing} is a file, not a directory: give a directory for --output_file" in refused.stderr


def test_a_url_with_credentials_is_refused_and_never_echoed(tmp_path):
    """``s3://user:password@bucket`` was echoed, password included, in a storage error (exit 1):
    every command refuses such a URL before any work (exit 2), quoting it redacted."""
    secret = "s3cr3t-Pa55"
    cases = [
        ("prepare", f"s3://user:{secret}@bucket/x.txt", "-o", tmp_path / "o1", "-t", VOCAB),
        ("prepare", SAMPLE_TEXT, "-o", f"s3://AKIA:{secret}@bucket/out", "-t", VOCAB),
        ("prepare", SAMPLE_TEXT, "-o", tmp_path / "o2", "-t", VOCAB, "--s3-endpoint-url", f"http://ak:{secret}@minio:9000"),
        ("inspect", f"gs://user:{secret}@bucket/out"),
        ("verify", f"s3://user:{secret}@bucket/out"),
        ("report", f"s3://user:{secret}@bucket/out"),
    ]
    for args in cases:
        got = cli(*args, *(["--no-progress"] if args[0] == "prepare" else []), check_code=2)
        text = got.stdout + got.stderr
        assert secret not in text and "holds credentials (user:password@)" in text, text
        assert "://***@" in text and "Traceback" not in text
    assert not (tmp_path / "o1").exists() and not (tmp_path / "o2").exists()
    from mlm_pipeline.errors import redact_credentials  # (what every error message goes through)

    assert redact_credentials(f"at s3://u:{secret}@b/x and http://k:p@ss@h:9/ and /a@b/c") == \
        "at s3://***@b/x and http://***@h:9/ and /a@b/c"


def test_a_command_line_s_spelling_is_not_carried_into_the_next_in_one_process(tmp_path):
    """The CLI run in-process twice (a notebook, a test runner): advice follows each command
    line's own spelling, not the previous one's."""
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app

    runner = CliRunner()
    google = runner.invoke(app, ["prepare", f"--input_file={SAMPLE_TEXT}", f"--output_file={tmp_path / 'g'}",
                                 f"--vocab_file={VOCAB}", "--do_lower_case=False", "--no-progress"])
    ours = runner.invoke(app, ["prepare", str(SAMPLE_TEXT), "-o", str(tmp_path / "o"), "-t", str(VOCAB),
                               "--no-do-lower-case", "--no-progress"])
    assert google.exit_code == 0 and ours.exit_code == 0, (google.output, ours.output)
    from mlm_pipeline.config import flag_for

    assert flag_for("do_lower_case", False) == "--no-do-lower-case"
