"""Packed rows keep their documents apart at training time: the collator's block-diagonal mask
and its unpadded (``cu_seqlens``) form, checked with a tiny BERT on real packed shards.

A packed batch run with the emitted mask and ``position_ids`` gives every document the same
logits as that document run alone, so no attention crosses a document start; the same holds for
the flat batch run through a variable-length attention that splits at ``cu_seqlens``.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")


def _prepare(out, *, packing="sentences", fmt="parquet", max_seq_length=64, inputs=(SAMPLE_TEXT,), **more):
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    config = build_config({"inputs": [str(p) for p in inputs], "output": str(out), "tokenizer": str(VOCAB),
                           "objective": "packed", "packing": packing, "format": fmt, "masking": "none",
                           "max_seq_length": max_seq_length, "workers": 1, "progress": False, **more})
    return run_prepare(config, show_progress=False)


def _paragraphs(path, size: int = 20_000):
    """The first ``size`` bytes of WikiText-2 (whole lines): read as Google's text format, each
    paragraph line is a document (a blank line follows it), about a hundred tokens."""
    lines, total = [], 0
    with open(WIKITEXT, encoding="utf-8") as f:
        for line in f:
            if total >= size:
                break
            lines.append(line)
            total += len(line.encode())
    path.write_text("".join(lines), encoding="utf-8")
    return path


@pytest.fixture(scope="module")
def outputs(tmp_path_factory):
    """Real packed shards of WikiText paragraphs: FULL-SENTENCES rows of 64 tokens (rows cross
    documents) and best-fit rows of 128 (several whole documents a row), Parquet and TFRecord."""
    root = tmp_path_factory.mktemp("packed")
    text = _paragraphs(root / "paragraphs.txt")
    made = {}
    for packing, length in (("sentences", 64), ("best-fit", 128)):
        for fmt in ("parquet", "tfrecord"):
            _prepare(root / f"{packing}-{fmt}", packing=packing, fmt=fmt, max_seq_length=length, inputs=(text,),
                     input_format="text", sentence_split=True)
            made[packing, fmt] = str(root / f"{packing}-{fmt}")
    return made


def _samples(out):
    from mlm_pipeline.torch import MLMDataset

    return list(MLMDataset(out, shuffle=False))


def _tiny_bert(vocab_size: int):
    from transformers import BertConfig, BertForMaskedLM

    torch.manual_seed(0)
    config = BertConfig(vocab_size=vocab_size, hidden_size=32, num_hidden_layers=2, num_attention_heads=4,
                        intermediate_size=64, max_position_embeddings=512, attn_implementation="sdpa")
    return BertForMaskedLM(config).double().eval()


def _alone(model, input_ids, token_type_ids):
    """Logits of one document run as a batch of its own (positions from 0, no mask)."""
    with torch.no_grad():
        return model(input_ids=input_ids[None], token_type_ids=token_type_ids[None]).logits[0]


def _documents(sample):
    bounds = [*sample["document_starts"].tolist(), len(sample["input_ids"])]
    return list(zip(bounds, bounds[1:]))


@pytest.mark.parametrize("packing", ["sentences", "best-fit"])
@pytest.mark.parametrize("fmt", ["parquet", "tfrecord"])
def test_packed_shards_read_back_with_their_document_starts(outputs, packing, fmt):
    samples = _samples(outputs[packing, fmt])
    assert samples and all("document_starts" in s for s in samples)
    many = [s for s in samples if len(s["document_starts"]) > 1]
    assert len(many) >= 10, "rows of these settings hold several documents"
    for s in samples:
        ids = s["input_ids"]
        for a, b in _documents(s):
            assert ids[b - 1] == 102 or b == len(ids)  # a document ends with its [SEP]
            if packing == "best-fit":
                assert ids[a] == 101  # each document is [CLS] ... [SEP] of its own
    if fmt == "tfrecord":  # the same rows and starts in both formats
        other = _samples(outputs[packing, "parquet"])
        assert [s["document_starts"].tolist() for s in samples] == [s["document_starts"].tolist() for s in other]


@pytest.mark.parametrize("packing", ["sentences", "best-fit"])
def test_block_diagonal_mask_gives_each_document_its_own_logits(outputs, packing):
    from mlm_pipeline.torch import MLMDataset

    dataset = MLMDataset(outputs[packing, "parquet"], shuffle=False)
    collate = dataset.collator(attention="block-diagonal", masking="dynamic")
    samples = [s for s in _samples(outputs[packing, "parquet"]) if len(s["document_starts"]) > 1][:6]
    batch = collate(samples)
    assert batch["attention_mask"].shape == (6, 1, batch["input_ids"].shape[1], batch["input_ids"].shape[1])
    model = _tiny_bert(collate.vocab_size)
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                       attention_mask=batch["attention_mask"], position_ids=batch["position_ids"]).logits
        padded = dataset.collator(attention="padded", masking="dynamic")(samples)  # (the same masks)
        crossing = model(input_ids=padded["input_ids"], token_type_ids=padded["token_type_ids"],
                         attention_mask=padded["attention_mask"], position_ids=batch["position_ids"]).logits
    checked = 0
    for r, s in enumerate(samples):
        for a, b in _documents(s):
            assert batch["position_ids"][r, a:b].tolist() == list(range(b - a))
            alone = _alone(model, batch["input_ids"][r, a:b], batch["token_type_ids"][r, a:b])
            torch.testing.assert_close(logits[r, a:b], alone, rtol=0, atol=1e-10)
            checked += 1
        # a row's documents seeing each other (the plain [B, L] mask) changes the logits: the
        # comparison above would catch attention across documents
        assert (crossing[r, : len(s["input_ids"])] - logits[r, : len(s["input_ids"])]).abs().max() > 1e-4
    assert checked >= 12


def _varlen_attention(module, query, key, value, attention_mask, scaling=None, dropout=0.0, cu_seqlens=None, **_):
    """A reference variable-length attention: the flat batch (1, heads, T, d) cut at ``cu_seqlens``,
    each document attending to itself alone (what FlashAttention's varlen kernel computes)."""
    assert attention_mask is None and cu_seqlens is not None
    bounds = cu_seqlens.tolist()
    out = torch.cat([torch.nn.functional.scaled_dot_product_attention(
        query[:, :, a:b], key[:, :, a:b], value[:, :, a:b], scale=scaling) for a, b in zip(bounds, bounds[1:])], dim=2)
    return out.transpose(1, 2).contiguous(), None


@pytest.mark.parametrize("packing", ["sentences", "best-fit"])
def test_unpadded_batch_through_varlen_attention_gives_each_document_its_own_logits(outputs, packing):
    from transformers import AttentionInterface

    from mlm_pipeline.torch import MLMDataset

    AttentionInterface.register("mlm_pipeline_varlen_reference", _varlen_attention)
    dataset = MLMDataset(outputs[packing, "parquet"], shuffle=False)
    collate = dataset.collator(attention="unpadded", masking="dynamic")
    samples = [s for s in _samples(outputs[packing, "parquet"]) if len(s["document_starts"]) > 1][:6]
    batch = collate(samples)
    total = sum(len(s["input_ids"]) for s in samples)
    assert batch["input_ids"].shape == (1, total) and "attention_mask" not in batch
    bounds = batch["cu_seqlens"].tolist()
    assert bounds[0] == 0 and bounds[-1] == total and batch["cu_seqlens"].dtype == torch.int32
    assert batch["max_seqlen"] == max(b - a for a, b in zip(bounds, bounds[1:]))
    # the flat ids are the rows' ids back to back, masked as the padded form masks them
    padded = dataset.collator(attention="padded", masking="dynamic")(samples)
    assert batch["input_ids"][0].tolist() == padded["input_ids"][padded["attention_mask"].bool()].tolist()
    assert batch["labels"][0].tolist() == padded["labels"][padded["attention_mask"].bool()].tolist()
    model = _tiny_bert(collate.vocab_size)
    model.config._attn_implementation = "mlm_pipeline_varlen_reference"
    with torch.no_grad():
        logits = model(input_ids=batch["input_ids"], token_type_ids=batch["token_type_ids"],
                       position_ids=batch["position_ids"], cu_seqlens=batch["cu_seqlens"],
                       max_seqlen=batch["max_seqlen"]).logits[0]
    model.config._attn_implementation = "sdpa"
    for a, b in zip(bounds, bounds[1:]):
        assert batch["position_ids"][0, a:b].tolist() == list(range(b - a))
        alone = _alone(model, batch["input_ids"][0, a:b], batch["token_type_ids"][0, a:b])
        torch.testing.assert_close(logits[a:b], alone, rtol=0, atol=1e-10)
    assert len(bounds) - 1 >= 12


def test_collator_document_forms_on_hand_made_samples():
    from mlm_pipeline.tokenize import load_tokenizer
    from mlm_pipeline.torch import MLMCollator

    tok = load_tokenizer(str(VOCAB))

    def sample(n, starts=None, index=0):
        s = {"input_ids": np.arange(1000, 1000 + n, dtype=np.int32), "token_type_ids": np.zeros(n, np.int8),
             "masked_lm_positions": np.zeros(0, np.int32), "masked_lm_ids": np.zeros(0, np.int32),
             "next_sentence_label": -1, "index": index}
        if starts is not None:
            s["document_starts"] = np.array(starts, np.int32)
        return s

    samples = [sample(6, [0, 2, 5]), sample(3, index=1), sample(4, [0, 1], index=2)]  # the second: one document
    block = MLMCollator(tok, nsp=False, attention="block-diagonal")(samples)
    assert block["position_ids"].tolist() == [[0, 1, 0, 1, 2, 0], [0, 1, 2, 0, 0, 0], [0, 0, 1, 2, 0, 0]]
    mask = block["attention_mask"][0, 0].int().tolist()
    assert mask[0] == [1, 1, 0, 0, 0, 0] and mask[3] == [0, 0, 1, 1, 1, 0] and mask[5] == [0, 0, 0, 0, 0, 1]
    third = block["attention_mask"][2, 0].int().tolist()
    assert third[1] == [0, 1, 1, 1, 0, 0] and third[4] == [0, 0, 0, 0, 1, 1]  # padding sees only padding
    flat = MLMCollator(tok, nsp=False, attention="unpadded")(samples)
    assert flat["cu_seqlens"].tolist() == [0, 2, 5, 6, 9, 10, 13]
    assert flat["max_seqlen"] == 3
    assert flat["position_ids"].tolist() == [[0, 1, 0, 1, 2, 0, 0, 1, 2, 0, 0, 1, 2]]
    assert flat["input_ids"].shape == flat["labels"].shape == (1, 13)
    with pytest.raises(ValueError, match="document_starts"):
        MLMCollator(tok, nsp=False, attention="unpadded")([sample(4, [1, 2])])
    with pytest.raises(ValueError, match="attention"):
        MLMCollator(tok, attention="flash")


def test_no_cross_document_never_puts_two_documents_in_a_row(tmp_path):
    from mlm_pipeline.formats import get_output_format

    for fmt in ("parquet", "tfrecord"):
        manifest = _prepare(tmp_path / fmt, max_seq_length=64, cross_document=False, fmt=fmt)
        rows = 0
        for shard in manifest["shards"]:
            batch = get_output_format(fmt).read(str(tmp_path / fmt / shard["path"]))
            assert np.array_equal(batch.document_offsets, np.arange(len(batch) + 1))  # one document a row
            assert not batch.document_starts.any()
            for i in range(len(batch)):
                body = batch.row(i)["input_ids"][1:-1]
                assert 102 not in body  # no document separator inside a row
            rows += len(batch)
        assert rows == manifest["totals"]["instances"]
        # the same text with FULL-SENTENCES puts documents together (so the check above has teeth)
        crossing = _prepare(tmp_path / f"{fmt}-full", max_seq_length=64, fmt=fmt)
        assert crossing["totals"]["instances"] < rows
