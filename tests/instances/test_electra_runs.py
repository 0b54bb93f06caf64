"""``prepare --objective electra`` end to end, through the command line: reference mode against
every golden of google-research/electra's build_pretraining_dataset.py (file for file, example
for example, parsed features), default mode within tolerances of them and independent of the
worker count, and bad input refused with a clear message and no output."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
from typer.testing import CliRunner

from instances.test_electra import BERT_VOCAB, CASES, GOLDEN, ZH_EN_VOCAB, corpus_dir, load_golden
from mlm_pipeline.cli import app
from mlm_pipeline.formats.tfrecord import read_tfrecord_features

FEATURES = ("input_ids", "input_mask", "segment_ids")


def prepare(*args) -> tuple[int, str]:
    result = CliRunner().invoke(app, ["prepare", *map(str, args), "--no-progress"])
    return result.exit_code, result.output + (repr(result.exception) if result.exception else "")


def golden_args(name: str, settings: dict, corpus: Path, out: Path) -> list:
    return [corpus, "--objective", "electra", "-t", CASES[name][0], "--max-seq-length", settings["max_seq_length"],
            "--random-seed", settings["seed"], *([] if settings["do_lower_case"] else ["--no-do-lower-case"]),
            "-o", out]


def output_rows(out: Path) -> tuple[list[dict], dict]:
    """Every example of a run's output files, in manifest order, and the manifest."""
    manifest = json.loads((out / "manifest.json").read_text())
    rows = []
    for shard in manifest["shards"]:
        features = read_tfrecord_features(str(out / shard["path"]))
        if features:
            assert sorted(features) == list(FEATURES)  # ELECTRA's features, nothing else
            assert all(features[k].dtype == np.int64 for k in FEATURES)
        n = len(features["input_ids"]) if features else 0
        assert n == shard["instances"]
        name = shard["path"].rsplit("/", 1)[-1]
        rows += [{"file": name, **{k: features[k][r].tolist() for k in FEATURES}} for r in range(n)]
    return rows, manifest


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_run_reproduces_every_golden_file_for_file(name, tmp_path):
    settings, golden = load_golden(name)
    out = tmp_path / "out"
    code, log = prepare(*golden_args(name, settings, corpus_dir(name, tmp_path), out), "--reference", "--workers", 2)
    assert code == 0, log
    rows, manifest = output_rows(out)
    # ELECTRA's 1000 files, empty ones included, where its glob DATA_DIR/pretrain_tfrecords/pretrain_data.tfrecord*
    # finds them; the manifest lists them in ELECTRA's numeric order
    n_files = settings["num_out_files"]
    assert [s["path"] for s in manifest["shards"]] == [
        f"pretrain_tfrecords/pretrain_data.tfrecord-{i}-of-{n_files}" for i in range(n_files)
    ]
    assert sorted(p.name for p in (out / "pretrain_tfrecords").iterdir()) == sorted(
        f"pretrain_data.tfrecord-{i}-of-{n_files}" for i in range(n_files)
    )
    assert not (out / "shards").exists()
    nonempty = {s["path"].rsplit("/", 1)[-1]: s["instances"] for s in manifest["shards"] if s["instances"]}
    assert nonempty == {f["file"]: f["examples"] for f in settings["output_files"]}
    assert len(rows) == settings["examples"] == len(golden)
    for k, (got, want) in enumerate(zip(rows, golden)):
        assert got == want, f"row {k} ({want['file']})"
    assert manifest["objective"] == "electra" and manifest["masking"] == "none" and manifest["reference_mode"]
    assert manifest["config"]["tokenizer_flavor"] == "electra"
    assert manifest["totals"]["instances"] == settings["examples"]


def summary(rows: list[dict]) -> dict:
    mask = np.array([r["input_mask"] for r in rows])
    seg = np.array([r["segment_ids"] for r in rows])
    return {"examples": len(rows), "mean_length": float(mask.sum(1).mean()),
            "single_segment": float((seg.max(1) == 0).mean())}


def test_default_mode_within_tolerances_of_the_golden_and_independent_of_workers(tmp_path):
    name = "zh-en-200KB-s128-seed7"
    settings, golden = load_golden(name)
    corpus = corpus_dir(name, tmp_path)
    runs = {}
    for workers in (1, 2):
        out = tmp_path / f"out{workers}"
        # small tasks and blocks: several of each, so the worker count could matter
        code, log = prepare(*golden_args(name, settings, corpus, out), "--workers", workers,
                            "--split-size", "64KiB", "--block-size", "32KiB")
        assert code == 0, log
        runs[workers] = output_rows(out)
    (rows, manifest), (rows2, manifest2) = runs[1], runs[2]
    assert manifest["tasks"] > 2
    assert rows == rows2 and manifest["shards"] == manifest2["shards"] and manifest["totals"] == manifest2["totals"]
    assert all(s["path"].startswith("shards/part-") for s in manifest["shards"])  # no --num-out-files: shards
    got, ref = summary(rows), summary(golden)
    assert abs(got["examples"] - ref["examples"]) <= 0.05 * ref["examples"]
    assert abs(got["mean_length"] - ref["mean_length"]) <= 0.03 * ref["mean_length"]
    assert abs(got["single_segment"] - ref["single_segment"]) <= 0.02
    # the share of random target lengths, from the run's counts; the golden's is in its settings' stats
    t = manifest["totals"]
    assert abs(t["random_target"] / t["instances"] - 0.05) <= 0.02
    assert t["single_segment"] == round(got["single_segment"] * got["examples"])


@pytest.mark.parametrize("blocks", [[], ["--block-size", "2KB"]], ids=["one-block", "blocks-of-fewer-than-7"])
def test_num_out_files_in_default_mode_deals_examples_round_robin(tmp_path, blocks):
    """With 2 KB blocks, most blocks build fewer examples than there are files, starting at
    another file each time: every example still lands in file n % 7."""
    name = "zh-en-200KB-s128-seed7"
    settings, _ = load_golden(name)
    corpus = corpus_dir(name, tmp_path)
    plain, dealt = tmp_path / "plain", tmp_path / "dealt"
    assert prepare(*golden_args(name, settings, corpus, plain), "--workers", 1, *blocks)[0] == 0
    code, log = prepare(*golden_args(name, settings, corpus, dealt), "--workers", 2, "--num-out-files", 7, *blocks)
    assert code == 0, log
    rows, _ = output_rows(plain)
    dealt_rows, manifest = output_rows(dealt)
    assert manifest["tasks"] == 1
    assert [s["path"].rsplit("/", 1)[-1] for s in manifest["shards"]] == [
        f"pretrain_data.tfrecord-{i}-of-7" for i in range(7)
    ]
    # example n of the run is in file n % 7
    expected = [{**rows[n], "file": f"pretrain_data.tfrecord-{i}-of-7"} for i in range(7) for n in range(i, len(rows), 7)]
    assert dealt_rows == expected


def test_inspect_and_report_show_electra_outputs(tmp_path):
    name = "zh-en-200KB-s128-seed7"
    settings, _ = load_golden(name)
    out = tmp_path / "out"
    assert prepare(*golden_args(name, settings, corpus_dir(name, tmp_path), out), "--reference", "--workers", 1)[0] == 0
    shown = CliRunner().invoke(app, ["inspect", str(out), "-n", "3"])
    assert shown.exit_code == 0, shown.output
    assert "pretrain_tfrecords/pretrain_data.tfrecord-0-of-1000" in shown.output
    assert "[CLS]" in shown.output and "masked: (none)" in shown.output
    report = CliRunner().invoke(app, ["report", str(out)])
    assert report.exit_code == 0, report.output
    assert "objective electra" in report.output and "one segment:" in report.output
    assert "random target length:" in report.output and "random-next" not in report.output
    # the run's state knows its output files: a rerun resumes (nothing to redo), finalize rebuilds
    # the manifest from the output alone (the corpus directory recorded as given)
    manifest = json.loads((out / "manifest.json").read_text())
    code, log = prepare(*golden_args(name, settings, tmp_path / "corpus", out), "--reference", "--workers", 1)
    assert code == 0, log
    again = json.loads((out / "manifest.json").read_text())
    assert again["shards"] == manifest["shards"] and again["totals"] == manifest["totals"]
    done = CliRunner().invoke(app, ["finalize", str(out), "--force"])
    assert done.exit_code == 0, done.output
    assert json.loads((out / "manifest.json").read_text())["shards"] == manifest["shards"]


# --------------------------------------------------------------------------------------------
# Bad input: a clear message and no output at all
# --------------------------------------------------------------------------------------------


def assert_refused(code: int, log: str, out: Path, message: str) -> None:
    assert code != 0
    assert message in log, log
    assert "Traceback" not in log
    assert not out.exists() or not any(out.iterdir()), sorted(p.name for p in out.iterdir())


def test_vocab_without_mask_token_is_refused(tmp_path):
    vocab = tmp_path / "vocab.txt"
    vocab.write_text("".join(t + "\n" for t in ZH_EN_VOCAB.read_text(encoding="utf-8").split("\n")[:-1]
                             if t != "[MASK]"), encoding="utf-8")
    for reference in ([], ["--reference"]):
        out = tmp_path / f"out{len(reference)}"
        code, log = prepare(GOLDEN / "zh-en-200KB", "--objective", "electra", *reference, "-t", vocab, "-o", out)
        assert_refused(code, log, out, "has no token for mask")


def test_empty_corpus_is_refused(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    with_empty_file = tmp_path / "corpus"
    with_empty_file.mkdir()
    (with_empty_file / "a.txt").write_bytes(b"")
    for corpus, message in ((empty, "no input found"), (with_empty_file, "no usable input")):
        for reference in ([], ["--reference"]):
            out = tmp_path / f"out-{corpus.name}-{len(reference)}"
            code, log = prepare(corpus, "--objective", "electra", *reference, "-t", ZH_EN_VOCAB, "-o", out)
            assert_refused(code, log, out, message)


def test_zero_output_files_and_other_bad_settings_are_refused(tmp_path):
    corpus = GOLDEN / "zh-en-200KB"
    out = tmp_path / "out"
    cases = [
        (["--num-out-files", 0], "num-out-files: Input should be greater than or equal to 1"),
        (["--num-out-files", 4, "--format", "parquet"], "--num-out-files writes ELECTRA's TFRecord files"),
        (["--max-seq-length", 4], "max-seq-length"),
    ]
    for args, message in cases:
        for reference in ([], ["--reference"]):
            code, log = prepare(corpus, "--objective", "electra", *reference, "-t", ZH_EN_VOCAB, "-o", out, *args)
            assert_refused(code, log, out, message)
    # the files --reference writes by itself, not a flag the user gave, are what parquet cannot hold
    code, log = prepare(corpus, "--objective", "electra", "--reference", "-t", ZH_EN_VOCAB, "-o", out, "--format", "parquet")
    assert_refused(code, log, out, "TFRecord files (--reference writes them as its script does, 1000 files); it needs "
                                   "--format tfrecord, not parquet")
    # reference mode reads one corpus directory, as ELECTRA's --corpus-dir
    for inputs, message in (([corpus / "wikitext2-train-200KB.txt"], "is not a directory"),
                            ([corpus, corpus], "got 2 inputs")):
        code, log = prepare(*inputs, "--objective", "electra", "--reference", "-t", ZH_EN_VOCAB, "-o", out)
        assert_refused(code, log, out, message)
    # more tasks than output files: each task needs files of its own
    code, log = prepare(corpus, "--objective", "electra", "-t", ZH_EN_VOCAB, "-o", out, "--split-size", "64KiB",
                        "--num-out-files", 2)
    assert_refused(code, log, out, "is fewer than the run's")
