"""The command line as a user meets it: messages, exit codes, bad input accounted for."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import shutil

import pytest
import typer
import yaml
from typer.testing import CliRunner

from conftest import REPO, SAMPLE_TEXT, VOCAB, WIKITEXT
from mlm_pipeline.cli import add_prepare_command
from mlm_pipeline.config import PANELS, PrepareConfig, build_config, setting, settings_of


def cli(*args, check_code: int | None = 0, cwd=None):
    env = {**os.environ, "COLUMNS": "240"}  # rich wraps help text to the terminal width
    if env.get("PYTHONPATH"):  # the same package from another working directory
        env["PYTHONPATH"] = os.pathsep.join(os.path.abspath(p) for p in env["PYTHONPATH"].split(os.pathsep))
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", *map(str, args)], capture_output=True, text=True,
                          env=env, cwd=cwd)
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
    assert "--max-predictions-per-seq (200) cannot exceed --max-seq-length" in r.stderr
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
    shown = cli("inspect", shard, "-n", "2", "--json")
    js = [json.loads(line) for line in shown.stdout.splitlines()]  # JSON lines only: `| jq` works
    assert len(js) == 2 and "masked_lm_positions" in js[0]
    assert shown.stderr.startswith(f"== {shard}: ")  # the shard's name goes to stderr
    rep = cli("report", out).stdout
    assert "masked tokens" in rep and "instance length" in rep and "random-next" in rep
    cli("inspect", tmp_path / "missing", check_code=2)
    # an objective without next-sentence labels: TFRecord stores 0 there, which is no label to show
    packed = tmp_path / "packed"
    cli("prepare", SAMPLE_TEXT, "-o", packed, "-t", VOCAB, "--format", fmt, "--objective", "packed", "--no-progress")
    shown = cli("inspect", packed, "-n", "2").stdout
    assert shown.count("[CLS]") == 2 and "next_sentence_label" not in shown


def test_inspect_reads_electras_numbered_files_on_their_own(tmp_path):
    """ELECTRA's files (pretrain_data.tfrecord-I-of-N), as its own script names them, copied out
    of their output: inspect reads them with -t, as any .tfrecord file."""
    import shutil

    out = tmp_path / "e"
    cli("prepare", SAMPLE_TEXT, "-o", out, "-t", VOCAB, "--objective", "electra", "--num-out-files", "2",
        "--no-progress")
    copy = tmp_path / "pretrain_data.tfrecord-1-of-2"
    shutil.copy(out / "pretrain_tfrecords" / copy.name, copy)
    shown = cli("inspect", copy, "-t", VOCAB, "-n", "2").stdout
    assert shown.count("[CLS]") == 2 and "next_sentence_label" not in shown


def test_config_file_with_command_line_override(tmp_path):
    yml = tmp_path / "prep.yaml"
    yml.write_text("max-seq-length: 64\nmax_predictions_per_seq: 10\ndupe-factor: 2\nformat: parquet\nsplit-size: 1MiB\n")
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
    assert "--reference with" not in cli("prepare", SAMPLE_TEXT, "-o", tmp_path / "one", "-t", VOCAB, "--reference",
                                         "--no-progress").stderr
    # several files: each as the script's run on that file alone, which one run over the list is not
    two = cli("prepare", SAMPLE_TEXT, WIKITEXT, "-o", tmp_path / "two", "-t", VOCAB, "--reference", "--no-progress")
    assert "--reference with 2 input files writes, for each, what the reference script writes for that file " \
           "alone" in two.stderr


# ---- the command line is derived from the settings model ------------------------------------------

REQUIRED = {"inputs": ["a.txt"], "output": "out", "tokenizer": "vocab.txt"}
# settings valid only together with another one
COMPANIONS = {"task_rank": {"task_count": 2}, "task_count": {"task_rank": 0}, "random_next_sentence": {"objective": "sop"},
              # a masking scheme's parameters go with that scheme
              **{name: {"masking_scheme": "ngram"} for name in ("ngram", "favor_shorter_ngram")},
              **{name: {"masking_scheme": "span"} for name in ("geometric_p", "span_lower", "span_upper")},
              # packed's packings, MDS's compression, language sampling (of labelled inputs)
              **{name: {"objective": "packed"} for name in ("packing", "cross_document")},
              "mds_compression": {"format": "mds"}, "language_alpha": {"language": ["en=x.txt"]},
              # an instance's source records go to a format with columns for them
              **{name: {"format": "parquet"} for name in ("id_field", "metadata_field")}}
# settings parsed from text that is not a size
OTHER_VALUES = {"wiki_namespaces": "0,14", "language": ["en=x.txt", "zh=y.txt"], "language_alpha": 0.3}


def parsing_app(model=PrepareConfig):
    """A CLI with ``prepare`` built from ``model`` that records the settings instead of running."""
    seen = []
    app = typer.Typer(rich_markup_mode="rich")
    app.callback()(lambda: None)  # keep `prepare` a subcommand
    add_prepare_command(app, model, action=seen.append)
    return app, seen


def parse(args, model=PrepareConfig):
    app, seen = parsing_app(model)
    result = CliRunner().invoke(app, ["prepare", *map(str, args)])
    assert result.exit_code == 0 and len(seen) == 1, result.output
    return seen[0]


def other_value(s):
    """A value of setting ``s`` that differs from its default, as a user would write it."""
    default = getattr(build_config(REQUIRED), s.name)
    if s.name in OTHER_VALUES:
        return OTHER_VALUES[s.name]
    if s.value_type is bool:
        return not default
    if s.choices:
        return next(c for c in s.choices if c != default)
    if s.text:
        return "3MB"
    if s.is_list:
        return ["x.txt", "y.txt"]
    if s.value_type is int:
        return (default or 0) + 1
    if s.value_type is float:
        return default / 2
    return f"custom-{s.name}"


def cli_args(param, value) -> list[str]:
    """How the built command takes ``value`` for its click parameter ``param``."""
    if param.param_type_name == "argument":
        return list(value)
    if isinstance(value, bool):
        return [param.opts[0] if value else param.secondary_opts[0]]
    if isinstance(value, list):  # an option given once per value
        return [x for v in value for x in (param.opts[0], v)]
    return [param.opts[0], str(value)]


def expected(s, value):
    """What the model makes of ``value`` given directly (sizes parsed, paths made absolute)."""
    got = getattr(build_config({**REQUIRED, **COMPANIONS.get(s.name, {}), s.name: value}), s.name)
    assert got != getattr(build_config(REQUIRED), s.name)
    return got


def required_args(but: str) -> list[str]:
    return [*(["a.txt"] if but != "inputs" else []), *(["-o", "out"] if but != "output" else []),
            *(["-t", "vocab.txt"] if but != "tokenizer" else [])]


def companion_args(name: str) -> list[str]:
    return [x for k, v in COMPANIONS.get(name, {}).items() for item in (v if isinstance(v, list) else [v])
            for x in (f"--{k.replace('_', '-')}", str(item))]


@pytest.mark.parametrize("s", settings_of(PrepareConfig), ids=lambda s: s.name)
def test_every_setting_has_a_flag(s):
    app, _ = parsing_app()
    command = typer.main.get_command(app).commands["prepare"]
    param = next(p for p in command.params if p.name == s.name)
    if s.positional:
        assert param.param_type_name == "argument"
    else:
        assert set(s.flags) == set(param.opts), (s.flags, param.opts)
        assert param.rich_help_panel == s.panel.capitalize()
        if s.choices:  # choices come from the Literal, nowhere else
            help_text = CliRunner().invoke(app, ["prepare", "--help"], env={"COLUMNS": "240"}).output
            assert "|".join(s.choices) in help_text
    value = other_value(s)
    config = parse([*required_args(s.name), *companion_args(s.name), *cli_args(param, value)])
    assert getattr(config, s.name) == expected(s, value)


SPELLINGS = [(s, key) for s in settings_of(PrepareConfig) for key in sorted(s.names())
             for key in {key, key.replace("_", "-")}]


@pytest.mark.parametrize("s,key", SPELLINGS, ids=[f"{s.name}:{k}" for s, k in SPELLINGS])
def test_every_setting_and_spelling_works_in_a_config_file(s, key, tmp_path):
    value = other_value(s)
    file = tmp_path / "prep.yaml"
    file.write_text(yaml.safe_dump({key: value, **COMPANIONS.get(s.name, {})}))
    config = parse([*required_args(s.name), "--config", file])
    assert getattr(config, s.name) == expected(s, value)


GOOGLE_COMMAND = [  # google-research/bert README, "Pre-training data generation"
    "--input_file=./sample_text.txt",
    "--output_file=/tmp/tf_examples.tfrecord",
    "--vocab_file=$BERT_BASE_DIR/vocab.txt",
    "--do_lower_case=True",
    "--max_seq_length=128",
    "--max_predictions_per_seq=20",
    "--masked_lm_prob=0.15",
    "--random_seed=12345",
    "--dupe_factor=5",
]


def test_googles_command_from_the_bert_readme_gives_the_native_shards(tmp_path):
    shutil.copy(SAMPLE_TEXT, tmp_path / "sample_text.txt")
    (tmp_path / "bert").mkdir()
    shutil.copy(VOCAB, tmp_path / "bert" / "vocab.txt")
    google = [a.replace("/tmp/tf_examples", f"{tmp_path}/tf_examples").replace("$BERT_BASE_DIR", str(tmp_path / "bert"))
              for a in GOOGLE_COMMAND]
    said = cli("prepare", *google, "--no-progress", cwd=tmp_path).stderr
    # Google's --output_file names a file; here it is the directory, and the note gives the glob
    assert f"run_pretraining.py --input_file='{tmp_path}/tf_examples.tfrecord/shards/*.tfrecord'" in said
    cli("prepare", "./sample_text.txt", "-o", "native", "--tokenizer", "bert/vocab.txt", "--do-lower-case",
        "--max-seq-length", "128", "--max-predictions-per-seq", "20", "--masked-lm-prob", "0.15",
        "--random-seed", "12345", "--dupe-factor", "5", "--no-progress", cwd=tmp_path)

    def shards(out):
        return {p.name: p.read_bytes() for p in sorted((out / "shards").iterdir())}

    google_shards = shards(tmp_path / "tf_examples.tfrecord")
    assert google_shards and google_shards == shards(tmp_path / "native")
    m = json.loads((tmp_path / "tf_examples.tfrecord" / "manifest.json").read_text())
    assert m["config"]["dupe_factor"] == 5 and m["config"]["do_lower_case"] is True


def test_googles_flag_syntax(tmp_path):
    for name in ("a.txt", "b1.txt", "b2.txt"):
        (tmp_path / name).write_text("x\n")
    config = parse([f"--input_file={tmp_path}/a.txt,{tmp_path}/b*.txt", "--output_file", "out",
                    "--vocab_file=vocab.txt", "--do_lower_case=False", "--do_whole_word_mask",
                    "--max_seq_length", "64", "--short_seq_prob=0.2"])
    assert config.inputs == [f"{tmp_path}/a.txt", f"{tmp_path}/b*.txt"]  # globs expand when the run plans
    assert (config.output, config.do_lower_case, config.do_whole_word_mask) == ("out", False, True)
    assert (config.max_seq_length, config.short_seq_prob) == (64, 0.2)
    assert parse(["a.txt", "-o", "o", "-t", "v", "--nodo_lower_case"]).do_lower_case is False
    assert parse(["a.txt", "-o", "o", "-t", "v", "--do_lower_case=true"]).do_lower_case is True
    app, _ = parsing_app()
    bad = CliRunner().invoke(app, ["prepare", "a.txt", "-o", "o", "-t", "v", "--do_lower_case=maybe"])
    assert bad.exit_code == 2 and "expected True or False" in bad.output
    listed = CliRunner().invoke(app, ["prepare", "a.txt", "-t", "v", "--output_file=o/a.tfrecord,o/b.tfrecord"],
                                env={"COLUMNS": "240"})
    assert listed.exit_code == 2 and "writes one output directory of shards" in listed.output


def test_a_new_field_is_a_new_flag_and_config_key(tmp_path):
    class Extended(PrepareConfig):
        mask_token_share: float = setting(0.8, "masking", "Share of masked positions that become [MASK].",
                                          google="mask_token_share", ge=0.0, le=1.0)

    app, _ = parsing_app(Extended)
    help_text = CliRunner().invoke(app, ["prepare", "--help"], env={"COLUMNS": "240"}).output
    masking_panel = help_text[help_text.index("─ Masking "):help_text.index("─ Output ")]
    assert "--mask-token-share" in masking_panel and "positions that become [MASK]" in masking_panel
    assert "--mask_token_share" in help_text  # in the list of Google-style flags
    assert parse(["a.txt", "-o", "o", "-t", "v", "--mask-token-share", "0.5"], Extended).mask_token_share == 0.5
    assert parse(["a.txt", "-o", "o", "-t", "v", "--mask_token_share=0.6"], Extended).mask_token_share == 0.6
    file = tmp_path / "x.toml"
    file.write_text("mask-token-share = 0.25\n")
    assert parse(["a.txt", "-o", "o", "-t", "v", "--config", file], Extended).mask_token_share == 0.25
    assert parse(["a.txt", "-o", "o", "-t", "v"], Extended).mask_token_share == 0.8


def test_help_shows_the_panels_and_brackets_literally():
    out = cli("prepare", "--help").stdout
    titles = [f"─ {panel.capitalize()} " for panel in PANELS]
    assert all(t in out for t in titles), out
    assert [out.index(t) for t in titles] == sorted(out.index(t) for t in titles)  # in PANELS order
    assert "[prepare] table" in out and "[CLS] and [SEP]" in out  # rich markup swallows neither
    assert "<bool>" not in out and "--do-lower-case" in out and "--no-do-lower-case" in out
    assert "--input_file=a.txt,b.txt" in out and "--do_lower_case=True" in out
    assert len(out.splitlines()) < 121  # (118 lines before --id-field and --metadata-field)
    assert "pip install 'mlm-pipeline[torch]'" in cli("train", "--help").stdout
    assert "with [MASK] visible" in cli("inspect", "--help").stdout


def test_toml_config_with_googles_names(tmp_path):
    toml = tmp_path / "prep.toml"
    toml.write_text(f'[prepare]\ninput_file = "{SAMPLE_TEXT},{SAMPLE_TEXT}"\nvocab_file = "{VOCAB}"\n'
                    f'output_file = "{tmp_path / "out"}"\ndo_lower_case = true\nmax_seq_length = 64\n'
                    'max-predictions-per-seq = 10\nsplit-size = "1MiB"\n')
    config = parse(["--config", toml, "--max-seq-length", "96"])  # the command line overrides the file
    assert config.inputs == [str(SAMPLE_TEXT)] * 2 and config.tokenizer == str(VOCAB)
    assert (config.max_seq_length, config.max_predictions_per_seq, config.split_bytes) == (96, 10, 1 << 20)
    cli("prepare", "--config", toml, "--no-progress")
    assert json.loads((tmp_path / "out" / "manifest.json").read_text())["config"]["max_seq_length"] == 64


def test_settings_errors_name_the_flag_or_key(tmp_path):
    app, _ = parsing_app()
    run = CliRunner().invoke
    missing = run(app, ["prepare", "--max-seq-length", "64"])
    assert missing.exit_code == 2 and "missing INPUT, --output/-o, --tokenizer/--vocab-file/-t" in missing.output
    small = run(app, ["prepare", "a.txt", "-o", "o", "-t", "v", "--block-size", "0MB"])
    assert small.exit_code == 2 and "block-size: Input should be greater than or equal to 1" in small.output
    for flag, value, floor in (("--split-size", "1", 1024), ("--block-size", "1", 1024), ("--random-seed", "-1", 0)):
        refused = run(app, ["prepare", "a.txt", "-o", "o", "-t", "v", flag, value])
        assert refused.exit_code == 2 and f"{flag[2:]}: Input should be greater than or equal to {floor}\n" in refused.output
    file = tmp_path / "twice.yaml"
    file.write_text("vocab_file: a.txt\ntokenizer: b.txt\n")
    twice = run(app, ["prepare", "a.txt", "-o", "o", "--config", str(file)])
    assert twice.exit_code == 2 and "gives tokenizer twice" in twice.output


def test_only_blank_inputs_exit_2_like_only_empty_ones(tmp_path):
    blank = tmp_path / "blank.txt"
    blank.write_text("   \n\n \t\n")
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    got = cli("prepare", blank, "-o", tmp_path / "o1", "-t", VOCAB, "--no-progress", check_code=2)
    assert "warning: no document was read: every input was empty, blank or skipped" in got.stdout
    got = cli("prepare", empty, "-o", tmp_path / "o2", "-t", VOCAB, "--no-progress", check_code=2)
    assert "no usable input" in got.stderr


def test_a_vocabulary_that_does_not_fit_the_text_is_warned_about(tmp_path):
    zh = REPO / "tests" / "data" / "hongloumeng-300KB.txt"
    got = cli("prepare", zh, "-o", tmp_path / "o", "-t", VOCAB, "--no-progress", "--split-size", "1MB")
    assert "warning: 62.5% of the tokens are [UNK]: the vocabulary does not fit this text" in got.stdout
    assert "the words most often read as [UNK] (in a sample of each task's text): '了'" in got.stdout
    manifest = json.loads((tmp_path / "o" / "manifest.json").read_text())
    assert manifest["totals"]["unk_tokens"] / manifest["totals"]["tokens"] > 0.6


def test_bad_jsonl_records_are_logged_with_their_byte_offset(tmp_path):
    lines = [b'{"text": "A good record. It has two sentences."}\n', b"not json\n", b'["a list"]\n',
             b'{"title": "no text"}\n', b'{"text": 3}\n', b'{"text": "Another good one."}\n']
    path = tmp_path / "c.jsonl"
    path.write_bytes(b"".join(lines))
    got = cli("prepare", path, "-o", tmp_path / "o", "-t", VOCAB, "--no-progress")
    offsets = [sum(len(x) for x in lines[:i]) for i in range(len(lines))]
    assert f"{path}: the record at byte {offsets[1]} is skipped: not JSON" in got.stderr
    assert f"{path}: the record at byte {offsets[2]} is skipped: not a JSON object" in got.stderr
    assert (f"{path}: the record at byte {offsets[3]} is skipped: no 'text' field (it has 'title': --text-field "
            "names the one with the text) (further bad records of this task are only counted)") in got.stderr
    assert f"byte {offsets[4]}" not in got.stderr
    assert "bad_record 4" in got.stdout


def test_a_run_that_read_no_document_is_replaced_by_the_corrected_command(tmp_path):
    """JSON lines with the text under "content": the first run reads nothing (exit 2) and says which
    fields there are; the same output then takes the run with --text-field content."""
    lines = [json.dumps({"id": i, "content": line}) for i, line in
             enumerate(SAMPLE_TEXT.read_text(encoding="utf-8").splitlines()) if line.strip()]
    path = tmp_path / "docs.jsonl"
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    out = tmp_path / "o"
    first = cli("prepare", path, "-o", out, "-t", VOCAB, "--no-progress", check_code=2)
    assert "no 'text' field (it has 'id', 'content': --text-field names the one with the text)" in first.stderr
    again = cli("prepare", path, "-o", out, "-t", VOCAB, "--no-progress", "--text-field", "content")
    assert "replacing the run" in again.stderr and "read no document" in again.stderr
    assert again.stdout.startswith("wrote ")  # its tasks ran now, though a manifest was there before
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["totals"]["documents_read"] == len(lines) and manifest["config"]["text_field"] == "content"
