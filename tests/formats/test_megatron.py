"""``--format megatron``: megatron-core's own readers read our ``.bin``/``.idx``.

The input is real text (Google's sample text and WikiText-2 paragraphs, grouped into documents of
one to four lines, some lines over 512 tokens), written one sentence a line. Every check compares
with megatron-core itself: ``IndexedDataset`` reads the documents and sentences of our own
tokenizer's encoding of that text, ``IndexedDatasetBuilder`` writes the same bytes from it, the
BERT dataset's sample index (its compiled helpers, which ship built in the wheel and run on CPU)
leaves out exactly the documents our counts say, and its samples hold our sentences.
"""

from __future__ import annotations

import os
import warnings
from pathlib import Path

import numpy as np
import pytest

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets
from tests.conftest import SAMPLE_TEXT, VOCAB, WIKITEXT, bert_text_documents

megatron_indexed = pytest.importorskip("megatron.core.datasets.indexed_dataset")
IndexedDataset = megatron_indexed.IndexedDataset


def _documents() -> list[list[str]]:
    """Google's sample documents, then WikiText-2 lines grouped 1, 2, 3, 4, 1, 2, ... a document."""
    docs = bert_text_documents(SAMPLE_TEXT)
    lines = [line.strip() for line in open(WIKITEXT, encoding="utf-8").read().splitlines()[:700] if line.strip()]
    size = 0
    while lines:
        size = size % 4 + 1
        docs.append(lines[:size])
        lines = lines[size:]
    return docs


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("corpus") / "docs.txt"
    path.write_text("\n\n".join("\n".join(doc) for doc in _documents()) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def expected(tok) -> list[list[np.ndarray]]:
    """Every document as our tokenizer encodes it, a sentence at a time (empty ones dropped)."""
    docs = []
    for doc in _documents():
        ids, lens = tok.encode_batch(doc)
        sentences = np.split(ids, np.cumsum(lens)[:-1])
        docs.append([s for s in sentences if len(s)])
    return [d for d in docs if d]


def _prepare(corpus: Path, out: Path, objective: str = "sentences", **settings) -> dict:
    from mlm_pipeline.pipeline import prepare
    from tests.helpers_run import make_config, read_manifest

    prepare(make_config([corpus], out, format="megatron", objective=objective,
                        **{"split_bytes": "64KiB", "block_bytes": "16KiB", **settings}))
    return read_manifest(str(out))


@pytest.fixture(scope="module")
def sentence_run(corpus, tmp_path_factory) -> tuple[Path, dict]:
    out = tmp_path_factory.mktemp("run") / "out"
    return out, _prepare(corpus, out)


def _prefixes(out: Path, manifest: dict) -> list[str]:
    return [str(out / s["path"][: -len(".bin")]) for s in manifest["shards"]]


def _read_all(prefixes: list[str]) -> list[list[np.ndarray]]:
    """Every document of the shards, in order, as megatron-core reads them: its sequences."""
    docs = []
    for prefix in prefixes:
        dataset = IndexedDataset(prefix)
        bounds = dataset.document_indices
        # (copies: a dataset's arrays are views of its memory map, which closes when it is collected)
        docs += [[np.array(dataset[i]) for i in range(bounds[d], bounds[d + 1])] for d in range(len(bounds) - 1)]
    return docs


def _same(a: list[list[np.ndarray]], b: list[list[np.ndarray]]) -> bool:
    return len(a) == len(b) and all(len(x) == len(y) and all(np.array_equal(p, q) for p, q in zip(x, y))
                                    for x, y in zip(a, b))


def test_indexed_dataset_reads_our_sentences(sentence_run, expected):
    out, manifest = sentence_run
    assert manifest["tasks"] >= 3 and len(manifest["shards"]) == manifest["tasks"]  # a prefix a task
    prefixes = _prefixes(out, manifest)
    for prefix in prefixes:
        dataset = IndexedDataset(prefix)
        assert dataset.index.dtype == np.uint16  # (30,522 ids: Megatron's optimal_dtype)
    got = _read_all(prefixes)
    assert _same(got, expected)
    assert sum(len(d) for d in got) == manifest["totals"]["megatron_sequences"] == manifest["totals"]["sentences"]
    assert len(got) == manifest["totals"]["instances"] == sum(s["instances"] for s in manifest["shards"])


def _builder_bytes(tmp: Path, docs: list[list[np.ndarray]], *, dtype, document_level: bool) -> tuple[bytes, bytes]:
    """The .bin and .idx megatron-core's own builder writes for these documents (as
    preprocess_data.py does: add_document with each sentence's length, or the document whole)."""
    builder = megatron_indexed.IndexedDatasetBuilder(str(tmp / "ref.bin"), dtype=dtype)
    for doc in docs:
        tokens = np.concatenate(doc)
        builder.add_document(tokens, [len(tokens)] if document_level else [len(s) for s in doc])
    builder.finalize(str(tmp / "ref.idx"))
    return (tmp / "ref.bin").read_bytes(), (tmp / "ref.idx").read_bytes()


@pytest.mark.parametrize("objective", ["sentences", "documents"])
def test_same_bytes_as_megatron_core_builder(objective, sentence_run, corpus, expected, tmp_path):
    out, manifest = sentence_run if objective == "sentences" else (tmp_path / "out", None)
    if manifest is None:
        manifest = _prepare(corpus, out, objective)
    dtype = megatron_indexed.DType.optimal_dtype(30522)
    first = 0
    for shard, prefix in zip(manifest["shards"], _prefixes(out, manifest)):
        docs = expected[first: first + shard["instances"]]
        first += shard["instances"]
        data, index = _builder_bytes(tmp_path, docs, dtype=dtype, document_level=objective == "documents")
        assert Path(prefix + ".bin").read_bytes() == data
        assert Path(prefix + ".idx").read_bytes() == index
    assert first == len(expected)
    if objective == "documents":
        assert _same(_read_all(_prefixes(out, manifest)), [[np.concatenate(d)] for d in expected])


def test_int32_ids_for_a_large_vocabulary(tmp_path, expected):
    """From 65,500 ids Megatron writes int32 (DType.optimal_dtype): the writer follows vocab_size."""
    from mlm_pipeline.formats.megatron import FORMAT, read_megatron
    from mlm_pipeline.instances.base import TokenizedDocs
    from mlm_pipeline.instances.documents import document_rows

    docs = [[s + 40_000 for s in doc] for doc in expected[:20]]  # ids past uint16
    sentences = [s for doc in docs for s in doc]
    batch = document_rows(TokenizedDocs(ids=np.concatenate(sentences).astype(np.int32),
                                        sentence_lengths=np.array([len(s) for s in sentences]),
                                        doc_sentences=np.array([len(d) for d in docs])), sentence_starts=True)
    with open(tmp_path / "ours.bin", "wb") as f:
        writer = FORMAT.open_writer(f, max_seq_length=128, max_predictions=20, vocab_size=250_002)
        writer.write(batch.slice(0, 7))
        writer.write(batch.slice(7, 20))
        (tmp_path / "ours.idx").write_bytes(writer.close()[".idx"])
    data, index = _builder_bytes(tmp_path, docs, dtype=np.int32, document_level=False)
    assert (tmp_path / "ours.bin").read_bytes() == data and (tmp_path / "ours.idx").read_bytes() == index
    assert IndexedDataset(str(tmp_path / "ours")).index.dtype == np.int32
    back = read_megatron(str(tmp_path / "ours.bin"))
    assert np.array_equal(back.input_ids, batch.input_ids) and np.array_equal(back.offsets, batch.offsets)
    assert np.array_equal(back.document_starts, batch.document_starts)
    assert np.array_equal(back.document_offsets, batch.document_offsets)
    with open(tmp_path / "small.bin", "wb") as f:  # a uint16 run cannot hold them: refused, not wrapped
        with pytest.raises(ValueError, match="do not fit Megatron's uint16"):
            FORMAT.open_writer(f, vocab_size=30522).write(batch)


def test_data_args_file_is_megatrons_blend(sentence_run):
    """megatron_data_args.txt parses with megatron-core's own --data-path parser: every prefix, in
    order, weighted by its tokens."""
    from megatron.core.datasets.utils import get_blend_from_list

    out, manifest = sentence_run
    prefixes, weights = get_blend_from_list((out / "megatron_data_args.txt").read_text().split())
    assert prefixes == [s["path"][: -len(".bin")] for s in manifest["shards"]]
    datasets = [IndexedDataset(str(out / p)) for p in prefixes]  # (held: their arrays map their files)
    tokens = [int(d.sequence_lengths.sum()) for d in datasets]
    assert np.allclose(np.array(weights) / sum(weights), np.array(tokens) / sum(tokens))  # (Megatron normalizes)


@pytest.fixture()
def gloo(tmp_path):
    """A one-process torch.distributed group: megatron-core's dataset index builders ask for the rank."""
    import torch.distributed as dist

    dist.init_process_group("gloo", init_method=f"file://{tmp_path / 'store'}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


def _vocab() -> list[str]:
    return [line.rstrip("\n") for line in open(VOCAB, encoding="utf-8")]


def _bert_dataset(prefix: str, *, binary_head: bool, samples: int, cache: str):
    from megatron.core.datasets.bert_dataset import BERTMaskedWordPieceDataset, BERTMaskedWordPieceDatasetConfig
    from megatron.core.datasets.megatron_tokenizer import MegatronLegacyTokenizer
    from megatron.core.datasets.utils import Split

    vocab = _vocab()

    class Vocab(MegatronLegacyTokenizer):  # what the BERT dataset asks of a tokenizer: its ids
        def tokenize(self, text):
            raise NotImplementedError

        vocab = property(lambda self: {t: i for i, t in enumerate(vocab)})
        inv_vocab = property(lambda self: dict(enumerate(vocab)))
        vocab_size = property(lambda self: len(vocab))
        cls = property(lambda self: vocab.index("[CLS]"))
        sep = property(lambda self: vocab.index("[SEP]"))
        pad = property(lambda self: vocab.index("[PAD]"))
        mask = property(lambda self: vocab.index("[MASK]"))

    config = BERTMaskedWordPieceDatasetConfig(
        random_seed=1234, sequence_length=128, tokenizer=Vocab(), split="100,0,0", path_to_cache=cache,
        masking_probability=0.15, short_sequence_probability=0.1, masking_max_ngram=3, masking_do_full_word=True,
        masking_do_permutation=False, masking_use_longer_ngrams=False, masking_use_geometric_distribution=False,
        classification_head=binary_head)
    indexed = IndexedDataset(prefix)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        return BERTMaskedWordPieceDataset(indexed, prefix, np.arange(len(indexed.document_indices) - 1), samples,
                                          Split.train, config)


@pytest.mark.torch
def test_bert_dataset_skips_what_we_count_and_builds_our_sentences(sentence_run, gloo, tmp_path):
    """megatron-core's BERT sample index leaves out the documents our totals count (one sentence:
    with its binary head; a sentence over 512 tokens: always), and its samples are our sentences."""
    out, manifest = sentence_run
    totals = manifest["totals"]
    assert totals["megatron_one_sentence_documents"] > 0 and totals["megatron_long_sentence_documents"] > 0
    for binary_head in (True, False):
        left_out = 0
        for prefix in _prefixes(out, manifest):
            indexed = IndexedDataset(prefix)
            bounds = indexed.document_indices
            # enough samples for a whole epoch over every document (each sample takes at least one sentence)
            bert = _bert_dataset(prefix, binary_head=binary_head, samples=2 * len(indexed), cache=str(tmp_path))
            starts = np.asarray(bert.sample_index)[:, 0]
            used = set(np.searchsorted(bounds, starts, side="right") - 1)
            left_out += len(bounds) - 1 - len(used)
            if binary_head:
                for k in range(0, len(bert), 40):  # the samples: [CLS] A [SEP] B [SEP] of our sentences
                    begin, end, _ = (int(v) for v in bert.sample_index[k])
                    sample = bert[k]
                    tokens = np.where(sample["labels"] >= 0, sample["labels"], sample["text"])
                    tokens = tokens[sample["padding_mask"] == 1]
                    sentences = np.concatenate([indexed[i] for i in range(begin, end)])
                    assert tokens[0] == 101 and tokens[-1] == 102 and np.count_nonzero(tokens == 102) == 2
                    body = tokens[(tokens != 101) & (tokens != 102)]
                    if not sample["truncated"] and not sample["is_random"]:
                        assert np.array_equal(body, sentences)
                    else:  # parts of the same sentences, in another order or cut
                        assert np.isin(body, sentences).all()
        expected = totals["megatron_long_sentence_documents"] + \
            (totals["megatron_one_sentence_documents"] if binary_head else 0)
        assert left_out == expected, (binary_head, left_out, expected)


def test_same_bytes_with_two_workers(sentence_run, corpus, tmp_path):
    from tests.helpers_run import shard_table

    out, manifest = sentence_run
    again = _prepare(corpus, tmp_path / "two", workers=2)
    assert shard_table(again) == shard_table(manifest)
    assert [s["companions"] for s in again["shards"]] == [s["companions"] for s in manifest["shards"]]
    assert (tmp_path / "two" / "megatron_data_args.txt").read_bytes() == (out / "megatron_data_args.txt").read_bytes()


def test_verify_catches_a_damaged_bin_or_idx_and_resume_rewrites_it(sentence_run, corpus, tmp_path):
    import shutil

    from mlm_pipeline.verify import forget_bad_tasks, verify_output
    from tests.helpers_run import shard_table

    source, manifest = sentence_run
    out = tmp_path / "out"
    shutil.copytree(source, out)
    assert verify_output(str(out)).ok
    shard = manifest["shards"][1]
    idx = out / shard["companions"][0]["path"]
    data = bytearray(idx.read_bytes())
    data[40] ^= 1  # a sequence length
    idx.write_bytes(bytes(data))
    result = verify_output(str(out))
    assert [p.path for p in result.problems] == [shard["companions"][0]["path"]]
    assert "content changed" in result.problems[0].problem
    binary = out / manifest["shards"][2]["path"]
    binary.write_bytes(binary.read_bytes()[:-2])  # truncated
    problems = verify_output(str(out), check="size").problems
    assert [p.path for p in problems] == [manifest["shards"][2]["path"]] and "truncated" in problems[0].problem
    assert sorted(forget_bad_tasks(str(out), verify_output(str(out)))) == ["00001", "00002"]
    again = _prepare(corpus, out)  # redoes those two tasks: the same bytes
    assert shard_table(again) == shard_table(manifest) and verify_output(str(out)).ok


def test_a_missing_idx_makes_resume_redo_its_task(sentence_run, corpus, tmp_path):
    """A shard counts as done only with its .idx: resume checks the companion's size as the shard's."""
    import json
    import shutil

    source, manifest = sentence_run
    out = tmp_path / "out"
    shutil.copytree(source, out)
    idx = out / manifest["shards"][0]["companions"][0]["path"]
    before = idx.read_bytes()
    idx.unlink()
    (out / "manifest.json").unlink()
    _prepare(corpus, out)
    assert idx.read_bytes() == before
    assert json.loads((out / "manifest.json").read_bytes())["shards"] == manifest["shards"]


def test_loader_and_inspect_read_it_by_the_manifest_format(sentence_run, expected):
    from mlm_pipeline.inspect import inspect_lines
    import json

    out, manifest = sentence_run
    lines = list(inspect_lines(str(out), n=2, tokenizer=None, do_lower_case=None, as_json=True))
    rows = [json.loads(line) for line in lines[1:]]
    assert rows[0]["input_ids"] == np.concatenate(expected[0]).tolist()
    assert rows[0]["document_starts"] == lengths_to_offsets([len(s) for s in expected[0]])[:-1].tolist()
    from mlm_pipeline.report.text import render_report

    report = render_report(manifest)
    totals = manifest["totals"]
    assert (f"Megatron BERT leaves out {totals['megatron_long_sentence_documents']:,} document(s) with a sentence "
            f"over 512 tokens, and {totals['megatron_one_sentence_documents']:,} of one sentence") in report


@pytest.mark.torch
def test_mlm_dataset_reads_the_documents(sentence_run, expected):
    from mlm_pipeline.torch import MLMDataset

    out, manifest = sentence_run
    samples = list(MLMDataset(str(out), shuffle=False))
    assert [s["input_ids"].tolist() for s in samples] == [np.concatenate(d).tolist() for d in expected]


@pytest.mark.parametrize("settings,message", [
    ({"objective": "nsp"}, "--format megatron writes tokenized documents, not instances"),
    ({"objective": "packed"}, "Use --objective sentences"),
    ({"masking": "static"}, "Megatron masks as it builds its samples"),
    ({"dupe_factor": 3}, "identical copies"),
    ({"format": "parquet"}, "needs --format megatron"),
])
def test_meaningless_settings_are_refused(settings, message, tmp_path):
    from tests.helpers_run import make_config

    with pytest.raises(ValueError, match=message):
        make_config([SAMPLE_TEXT], tmp_path / "o", **{"format": "megatron", "objective": "sentences", **settings})


@pytest.mark.torch
def test_a_tiny_bert_trains_from_indexed_dataset(sentence_run):
    """Training proof: BertForMaskedLM learns from IndexedDataset's sequences (masked in this
    test's collate, 15% of tokens to [MASK]; the model's vocabulary is the ids they hold): the loss falls."""
    import torch
    from transformers import BertConfig, BertForMaskedLM

    out, manifest = sentence_run
    sequences = []
    for prefix in _prefixes(out, manifest)[:2]:
        indexed = IndexedDataset(prefix)
        sequences += [np.array(indexed[i][:62]) for i in range(len(indexed)) if indexed.sequence_lengths[i] >= 8]
    # the model's vocabulary: the ids these sequences hold (a small output layer keeps the test fast)
    present = np.unique(np.concatenate([np.concatenate(sequences), [0, 101, 102, 103]]))
    compact = np.zeros(30522, np.int64)
    compact[present] = np.arange(len(present))
    sequences = [compact[s] for s in sequences]
    cls, sep, mask = (int(compact[i]) for i in (101, 102, 103))
    generator = torch.Generator().manual_seed(0)
    torch.manual_seed(0)

    def collate(rows: list[np.ndarray]) -> dict:
        width = max(len(r) for r in rows) + 2
        ids = torch.zeros(len(rows), width, dtype=torch.long)
        for k, r in enumerate(rows):
            ids[k, : len(r) + 2] = torch.tensor([cls, *r.tolist(), sep])
        attention = torch.zeros_like(ids)
        for k, r in enumerate(rows):
            attention[k, : len(r) + 2] = 1
        maskable = attention.bool() & (ids != cls) & (ids != sep)
        chosen = maskable & (torch.rand(ids.shape, generator=generator) < 0.15)
        labels = torch.where(chosen, ids, torch.full_like(ids, -100))
        return {"input_ids": torch.where(chosen, torch.full_like(ids, mask), ids), "attention_mask": attention,
                "labels": labels}

    model = BertForMaskedLM(BertConfig(vocab_size=len(present), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                                       intermediate_size=64, max_position_embeddings=64))
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    batches = [collate(sequences[k: k + 16]) for k in range(0, 16 * 8, 16)]
    losses = []
    for step in range(40):
        loss = model(**batches[step % len(batches)]).loss
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
        losses.append(loss.item())
    assert np.mean(losses[-8:]) < np.mean(losses[:8]) - 1.5, losses  # (seeded: 7.7 -> 5.4 nats)


@pytest.mark.slow
def test_resume_after_kill_gives_the_clean_runs_bytes(tmp_path):
    """``prepare`` killed (SIGKILL, its process group) with some tasks done, then run again: the
    same .bin, .idx and blend file as a run never stopped."""
    import signal
    import subprocess
    import sys
    import time

    from tests.helpers_run import make_config, shard_table
    from mlm_pipeline.pipeline import run_prepare

    corpus = tmp_path / "corpus.txt"
    corpus.write_bytes(WIKITEXT.read_bytes() * 3)
    settings = {"split_bytes": "192KiB", "block_bytes": "32KiB", "input_format": "wikitext"}
    clean = run_prepare(make_config([corpus], tmp_path / "clean", format="megatron", objective="sentences",
                                    **settings), show_progress=False)
    out = tmp_path / "out"
    args = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", str(corpus), "-o", str(out), "-t", str(VOCAB),
            "--format", "megatron", "--objective", "sentences", "--workers", "1", "--no-progress",
            "--split-size", settings["split_bytes"], "--block-size", settings["block_bytes"], "--input-format", "wikitext"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, start_new_session=True)
    try:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and proc.poll() is None:
            if (out / "_tasks").exists() and len(list((out / "_tasks").glob("*.json"))) >= 3:
                break
            time.sleep(0.02)
        assert proc.poll() is None, "prepare ended before it could be killed"
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(30)
    assert not (out / "manifest.json").exists()
    rerun = subprocess.run(args, capture_output=True, text=True, timeout=300)
    assert rerun.returncode == 0, rerun.stderr
    from tests.helpers_run import read_manifest

    again = read_manifest(str(out))
    assert shard_table(again) == shard_table(clean)
    assert [s["companions"] for s in again["shards"]] == [s["companions"] for s in clean["shards"]]
    assert sorted(p.name for p in (out / "shards").iterdir()) == sorted(p.name for p in (tmp_path / "clean" / "shards").iterdir())
    assert (out / "megatron_data_args.txt").read_bytes() == (tmp_path / "clean" / "megatron_data_args.txt").read_bytes()


def test_verify_counts_a_pair_as_one_shard(sentence_run):
    from mlm_pipeline.verify import verify_output

    out, manifest = sentence_run
    result = verify_output(str(out))
    assert result.ok and result.checked == len(manifest["shards"])
    assert result.bytes_checked == manifest["totals"]["bytes_written"] == \
        sum(p.stat().st_size for p in (out / "shards").iterdir())
