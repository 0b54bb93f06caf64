"""The objective registry: the built-in objectives, and a new objective added from this file alone.

"single_sentences" below is a complete objective (each sentence one ``[CLS] s [SEP]`` instance)
with a reference mode that reads a whole corpus in one task, as ELECTRA's script does; a
``prepare`` run uses both without any change to the package.
"""

from __future__ import annotations

import json
import shutil

import numpy as np
import pytest
import typer
from typer.testing import CliRunner

from conftest import SAMPLE_TEXT, VOCAB, bert_text_documents
from mlm_pipeline.cli import add_prepare_command
from mlm_pipeline.config import build_config
from mlm_pipeline.errors import ConfigError
from mlm_pipeline.inspect import read_shard
from mlm_pipeline.instances import (
    BuildContext,
    Objective,
    ReferenceContext,
    ReferenceMode,
    TokenizedDocs,
    get_objective,
    objective_names,
    register_objective,
    unregister_objective,
)
from mlm_pipeline.instances.base import repeat_shuffled
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, ranges_to_indices
from mlm_pipeline.pipeline import run_prepare


def test_built_in_objectives_and_what_they_declare():
    assert objective_names()[:3] == ("nsp", "packed", "tokens")
    nsp, packed, tokens = (get_objective(n) for n in ("nsp", "packed", "tokens"))
    assert nsp.has_nsp_labels and not packed.has_nsp_labels and not tokens.has_nsp_labels
    assert (nsp.default_masking, packed.default_masking, tokens.default_masking) == ("static", "static", "none")
    assert nsp.reference.unit == "file" and nsp.reference.masking == "static"
    assert packed.reference is None and tokens.reference is None
    with pytest.raises(ConfigError, match=r"unknown objective 'electro' \(known: nsp, packed, tokens"):
        get_objective("electro")
    assert objective_names() == ("nsp", "packed", "tokens", "electra", "sop", "sentences", "documents")
    assert all(get_objective(name).name == name for name in objective_names())  # (each built-in under its name)


def test_settings_take_defaults_and_checks_from_the_registry(tmp_path):
    base = {"inputs": [str(SAMPLE_TEXT)], "output": str(tmp_path), "tokenizer": str(VOCAB)}
    assert build_config({**base, "objective": "tokens"}).masking == "none"
    assert build_config({**base, "objective": "packed"}).masking == "static"
    with pytest.raises(ConfigError, match="objective: .*unknown objective 'bert'"):
        build_config({**base, "objective": "bert"})
    with pytest.raises(ConfigError, match="objective packed has no reference mode"):
        build_config({**base, "objective": "packed", "reference": True})
    with pytest.raises(ConfigError, match="needs --masking static"):
        build_config({**base, "reference": True, "masking": "none"})


# ---------------------------------------------------------------------------------------------
# A new objective, defined and registered here
# ---------------------------------------------------------------------------------------------


def sentence_instances(ids: np.ndarray, sentence_lengths: np.ndarray, max_seq_length: int, cls_id: int,
                       sep_id: int) -> InstanceBatch:
    """``[CLS] sentence [SEP]`` per sentence (cut to fit), in order."""
    starts = lengths_to_offsets(sentence_lengths)[:-1]
    lens = np.minimum(sentence_lengths, max_seq_length - 2)
    offsets = lengths_to_offsets(lens + 2)
    out = np.empty(int(offsets[-1]), np.int32)
    out[offsets[:-1]] = cls_id
    out[offsets[1:] - 1] = sep_id
    out[ranges_to_indices(offsets[:-1] + 1, lens)] = ids[ranges_to_indices(starts, lens)]
    n = len(lens)
    return InstanceBatch(input_ids=out, segment_ids=np.zeros(len(out), np.int8), offsets=offsets,
                         masked_lm_positions=np.zeros(0, np.int32), masked_lm_ids=np.zeros(0, np.int32),
                         masked_offsets=np.zeros(n + 1, np.int64), next_sentence_labels=None)


def build_single_sentences(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    once = sentence_instances(docs.ids, docs.sentence_lengths, ctx.settings.max_seq_length,
                              ctx.special.cls, ctx.special.sep)
    batch = repeat_shuffled(once, ctx.settings.dupe_factor, ctx.rng)
    return batch, {"instances": len(batch)}


def build_single_sentences_reference(urls, ctx: ReferenceContext):
    """Every file of the corpus in name order, each line one instance, one batch per file."""
    for url in sorted(urls):
        with open(url, encoding="utf-8") as f:
            lines = [line.strip() for line in f if line.strip()]
        ids, lengths = ctx.tokenizer.encode_batch(lines)
        keep = lengths > 0
        ctx.read_stats.bytes_read += sum(len(line.encode()) for line in lines)
        ctx.read_stats.sentences += int(keep.sum())
        batch = sentence_instances(ids, lengths[keep], ctx.settings.max_seq_length,
                                   ctx.tokenizer.special.cls, ctx.tokenizer.special.sep)
        yield batch, {"instances": len(batch), "tokens": len(ids)}


SINGLE_SENTENCES = Objective(
    name="single_sentences",
    build=build_single_sentences,
    help="each sentence one instance",
    has_nsp_labels=False,
    default_masking="none",
    reference=ReferenceMode(
        build=build_single_sentences_reference, unit="corpus", masking="none",
        help="each line of the corpus one instance, files in name order",
    ),
)


@pytest.fixture
def single_sentences():
    register_objective(SINGLE_SENTENCES)
    yield SINGLE_SENTENCES
    unregister_objective(SINGLE_SENTENCES.name)


def test_a_name_is_registered_once(single_sentences):
    assert objective_names()[-1] == "single_sentences"
    with pytest.raises(ValueError, match="already registered"):
        register_objective(single_sentences)
    assert register_objective(single_sentences, replace=True) is single_sentences
    with pytest.raises(ValueError, match="objective name"):
        register_objective(Objective(name="two words", build=build_single_sentences, help="", has_nsp_labels=False))


def test_prepare_runs_an_objective_registered_by_a_test(single_sentences, tok, tmp_path):
    out = tmp_path / "out"
    config = build_config({"inputs": [str(SAMPLE_TEXT)], "output": str(out), "tokenizer": str(VOCAB),
                           "objective": "single_sentences", "dupe_factor": 2, "max_seq_length": 32,
                           "workers": 1, "progress": False})
    assert config.masking == "none"  # the objective's default
    manifest = run_prepare(config)
    batch = InstanceBatch.concat([read_shard(str(out / s["path"])) for s in manifest["shards"]])

    sentences = [s for doc in bert_text_documents(SAMPLE_TEXT) for s in doc]
    ids, lengths = tok.encode_batch(sentences)
    expected = sentence_instances(ids, lengths[lengths > 0], 32, tok.special.cls, tok.special.sep)
    # every sentence twice (dupe_factor 2), in a shuffled order, unmasked
    assert manifest["objective"] == "single_sentences" and manifest["totals"]["instances"] == 2 * len(expected)
    got = sorted(tuple(batch.row(i)["input_ids"]) for i in range(len(batch)))
    want = sorted(tuple(expected.row(i)["input_ids"]) for i in range(len(expected)) for _ in range(2))
    assert got == want
    assert got != [tuple(batch.row(i)["input_ids"]) for i in range(len(batch))]
    assert len(batch.masked_lm_positions) == 0


def test_the_command_line_offers_and_runs_a_registered_objective(single_sentences, tmp_path):
    app = typer.Typer(rich_markup_mode="rich")
    app.callback()(lambda: None)  # keep `prepare` a subcommand
    add_prepare_command(app)  # a command built after the registration lists it among the choices
    help_text = CliRunner().invoke(app, ["prepare", "--help"], env={"COLUMNS": "240"}).output
    assert "nsp|packed|tokens|electra|sop|sentences|documents|single_sentences" in help_text
    out = tmp_path / "out"
    result = CliRunner().invoke(app, ["prepare", str(SAMPLE_TEXT), "-o", str(out), "-t", str(VOCAB),
                                      "--objective", "single_sentences", "--workers", "1", "--no-progress"])
    assert result.exit_code == 0, result.output
    manifest = json.loads((out / "manifest.json").read_text())
    assert (manifest["objective"], manifest["masking"]) == ("single_sentences", "none")


def test_a_corpus_reference_mode_reads_every_file_in_one_task(single_sentences, tok, tmp_path):
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    shutil.copy(SAMPLE_TEXT, corpus / "b.txt")
    (corpus / "a.txt").write_text("First line of a.\n\nSecond line of a.\n", encoding="utf-8")
    out = tmp_path / "out"
    config = build_config({"inputs": [str(corpus / "b.txt"), str(corpus / "a.txt")], "output": str(out),
                           "tokenizer": str(VOCAB), "objective": "single_sentences", "reference": True,
                           "split_bytes": 1024, "workers": 1, "progress": False})
    manifest = run_prepare(config)
    assert manifest["tasks"] == 1 and manifest["reference_mode"]  # 5 KB of input, 1 KB tasks otherwise
    batch = InstanceBatch.concat([read_shard(str(out / s["path"])) for s in manifest["shards"]])
    first_two = [tok.convert_ids_to_tokens(batch.row(i)["input_ids"]) for i in range(2)]
    assert first_two == [["[CLS]", "first", "line", "of", "a", ".", "[SEP]"],
                         ["[CLS]", "second", "line", "of", "a", ".", "[SEP]"]]
    lines = [s for doc in bert_text_documents(SAMPLE_TEXT) for s in doc]
    assert len(batch) == manifest["totals"]["instances"] == 2 + len(lines)
