"""Each kind of extension is one module plus one registry line: here all three are defined in this
file alone — an input format, an output format and an objective — and one ``prepare`` run uses
them together; ``inspect`` and the torch loader read the result back through the registries.
"""

from __future__ import annotations

import json
from typing import Iterator

import numpy as np
import pytest

from conftest import VOCAB
from mlm_pipeline import fs
from mlm_pipeline.config import build_config
from mlm_pipeline.formats import OutputFormat, register_output_format, unregister_output_format
from mlm_pipeline.instances import Objective, register_objective, unregister_objective
from mlm_pipeline.instances.base import BuildContext, TokenizedDocs
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, ranges_to_indices
from mlm_pipeline.pipeline import run_prepare
from mlm_pipeline.read import InputFormat, Piece, ReadOptions, register_input_format, unregister_input_format
from mlm_pipeline.read.sample import InputSample
from mlm_pipeline.stats import ReadStats


class PipeDocs(InputFormat):
    """``*.pipe``: one document a line, sentences separated by `` | ``; read whole."""

    name = "pipe-docs"

    def claims_name(self, sample: InputSample) -> bool:
        return sample.extension == ".pipe"

    def split(self, url: str, size: int, split_bytes: int, options: ReadOptions) -> list[Piece]:
        return [Piece(url, self.name)]

    def read(self, piece: Piece, options: ReadOptions, stats: ReadStats) -> Iterator[list[str]]:
        text = fs.read_bytes(piece.url).decode("utf-8")
        stats.bytes_read += len(text.encode())
        for line in text.splitlines():
            sentences = [s.strip() for s in line.split(" | ") if s.strip()]
            if sentences:
                stats.documents_read += 1
                stats.sentences += len(sentences)
                yield sentences


class JsonRowsWriter:
    def __init__(self, f, *, max_seq_length: int, max_predictions: int, **_settings):
        self.f = f

    def write(self, batch: InstanceBatch) -> None:
        for i in range(len(batch)):
            self.f.write(json.dumps({"ids": batch.row(i)["input_ids"]}).encode() + b"\n")

    def close(self) -> None:
        pass


def read_json_rows(url: str) -> InstanceBatch:
    rows = [json.loads(line)["ids"] for line in fs.read_bytes(url).splitlines()]
    lengths = np.array([len(r) for r in rows], np.int64)
    return InstanceBatch(
        input_ids=np.array([t for r in rows for t in r], np.int32), segment_ids=np.zeros(int(lengths.sum()), np.int8),
        offsets=lengths_to_offsets(lengths), masked_lm_positions=np.zeros(0, np.int32),
        masked_lm_ids=np.zeros(0, np.int32), masked_offsets=np.zeros(len(rows) + 1, np.int64),
        next_sentence_labels=None)


def sentence_per_instance(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    """``[CLS] sentence [SEP]`` for every sentence, cut to the length, in input order."""
    lens = np.minimum(docs.sentence_lengths, ctx.settings.max_seq_length - 2)
    offsets = lengths_to_offsets(lens + 2)
    ids = np.empty(int(offsets[-1]), np.int32)
    ids[offsets[:-1]], ids[offsets[1:] - 1] = ctx.special.cls, ctx.special.sep
    ids[ranges_to_indices(offsets[:-1] + 1, lens)] = docs.ids[ranges_to_indices(docs.sentence_offsets[:-1], lens)]
    batch = InstanceBatch(input_ids=ids, segment_ids=np.zeros(len(ids), np.int8), offsets=offsets,
                          masked_lm_positions=np.zeros(0, np.int32), masked_lm_ids=np.zeros(0, np.int32),
                          masked_offsets=np.zeros(len(lens) + 1, np.int64), next_sentence_labels=None)
    return batch, {"instances": len(batch)}


@pytest.fixture
def plugins():
    register_input_format(PipeDocs())
    register_output_format(OutputFormat(name="jsonrows", open_writer=JsonRowsWriter, read_shard=read_json_rows))
    register_objective(Objective(name="sentence", build=sentence_per_instance, help="one sentence an instance",
                                 has_nsp_labels=False, default_masking="none"))
    yield
    unregister_input_format("pipe-docs")
    unregister_output_format("jsonrows")
    unregister_objective("sentence")


def test_a_run_uses_an_input_format_output_format_and_objective_defined_here(plugins, tmp_path):
    corpus = tmp_path / "corpus.pipe"
    corpus.write_text("The cat sat. | It purred.\n\nA second document | with two sentences\n", encoding="utf-8")
    out = tmp_path / "out"
    config = build_config({"inputs": [str(corpus)], "output": str(out), "tokenizer": str(VOCAB), "workers": 1,
                           "progress": False, "format": "jsonrows", "objective": "sentence"})
    manifest = run_prepare(config, show_progress=False)
    assert manifest["format"] == "jsonrows" and manifest["objective"] == "sentence"
    assert manifest["inputs"][0]["format"] == "pipe-docs"
    assert manifest["totals"]["instances"] == 4 and manifest["totals"]["documents_read"] == 2
    assert all(s["path"].endswith(".jsonrows") for s in manifest["shards"])

    from mlm_pipeline.inspect import inspect_lines

    shown = "\n".join(inspect_lines(str(out), n=4, tokenizer=None, do_lower_case=None, as_json=False))
    for words in ("[CLS] the cat sat . [SEP]", "[CLS] it pu ##rred . [SEP]", "[CLS] with two sentences [SEP]"):
        assert words in shown

    pytest.importorskip("torch")
    from mlm_pipeline.torch import MLMDataset

    written = read_json_rows(str(out / manifest["shards"][0]["path"]))
    loaded = [s["input_ids"].tolist() for s in MLMDataset(str(out), shuffle=False)]
    assert loaded == [written.row(i)["input_ids"] for i in range(len(written))]
