"""ALBERT from ``sop`` shards: the loader's batches (the sentence-order label, ``token_boundary``),
the collator's n-gram masking of ALBERT's words, and ``train`` with ``AlbertForPreTraining``.

The text is Chinese and English (红楼梦 and WikiText-2) with ALBERT's SentencePiece model: there
ALBERT's words (``token_boundary``: a CJK piece is a word of its own) differ from the
tokenizer's ``▁`` words (a run of Chinese pieces is one), so the tests tell the two apart.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from loader.loader_helpers import REPO, WIKITEXT  # noqa: E402
from mlm_pipeline.torch import MLMDataset  # noqa: E402

pytestmark = [pytest.mark.torch, pytest.mark.filterwarnings("ignore::UserWarning"),
              pytest.mark.filterwarnings("ignore::DeprecationWarning")]

SPM = REPO / "tests" / "data" / "albert-spm-8k.model"
ZH = REPO / "tests" / "data" / "hongloumeng-300KB.txt"


def _head(path, size: int) -> bytes:
    data = path.read_bytes()[:size]
    return data[: data.rindex(b"\n") + 1]


@pytest.fixture(scope="module")
def zh_en(tmp_path_factory):
    """60 KB of 红楼梦 then 30 KB of WikiText-2, one file (a blank line between the two)."""
    path = tmp_path_factory.mktemp("text") / "zh-en.txt"
    path.write_bytes(_head(ZH, 60_000) + b"\n" + _head(WIKITEXT, 30_000))
    return path


def _prepare(out, text, **settings) -> str:
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare

    run_prepare(PrepareConfig(inputs=[str(text)], output=str(out), tokenizer=str(SPM), objective="sop",
                              max_seq_length=128, workers=1, progress=False, sentence_split=True, **settings))
    return str(out)


@pytest.fixture(scope="module", params=["parquet", "tfrecord"])
def sop_unmasked(request, zh_en, tmp_path_factory):
    return _prepare(tmp_path_factory.mktemp(f"sop-none-{request.param}"), zh_en, masking="none",
                    format=request.param)


@pytest.fixture(scope="module")
def sop_unmasked_parquet(zh_en, tmp_path_factory):
    return _prepare(tmp_path_factory.mktemp("sop-none"), zh_en, masking="none")


@pytest.fixture(scope="module")
def sop_static(zh_en, tmp_path_factory):
    return _prepare(tmp_path_factory.mktemp("sop-static"), zh_en)


def _shard_rows(out: str) -> list[dict]:
    """Every instance of the output, read with the pipeline's own shard reader."""
    from mlm_pipeline.inspect import read_shard
    from mlm_pipeline.torch import load_prepared

    rows = []
    for shard in load_prepared(out).shards:
        batch = read_shard(shard.url)
        for i in range(len(batch)):
            s, e = batch.offsets[i], batch.offsets[i + 1]
            ms, me = batch.masked_offsets[i], batch.masked_offsets[i + 1]
            rows.append({"ids": batch.input_ids[s:e], "boundary": batch.token_boundary[s:e],
                         "label": int(batch.next_sentence_labels[i]), "positions": batch.masked_lm_positions[ms:me],
                         "masked_ids": batch.masked_lm_ids[ms:me]})
    return rows


def _boundary(samples, width: int) -> np.ndarray:
    out = np.zeros((len(samples), width), dtype=np.int64)
    for i, s in enumerate(samples):
        out[i, :len(s["token_boundary"])] = s["token_boundary"]
    return out


def test_sop_samples_carry_token_boundary_and_batches_the_sentence_order_label(sop_unmasked):
    """Parquet and TFRecord: each sample holds its shard row's token_boundary, and a batch names
    the pair label as AlbertForPreTraining does, with the shards' values (both labels occur)."""
    rows = _shard_rows(sop_unmasked)
    ds = MLMDataset(sop_unmasked, shuffle=False)
    samples = list(ds)
    assert len(samples) == len(rows) > 100
    for sample, row in zip(samples, rows):
        np.testing.assert_array_equal(sample["input_ids"], row["ids"])
        np.testing.assert_array_equal(sample["token_boundary"], row["boundary"])
    batch = ds.collator()(samples)
    assert "next_sentence_label" not in batch
    expected = [row["label"] for row in rows]
    assert batch["sentence_order_label"].tolist() == expected
    assert 0.3 < np.mean(expected) < 0.7


def test_static_sop_batches_carry_the_stored_masks_and_the_sentence_order_label(sop_static):
    rows = _shard_rows(sop_static)
    ds = MLMDataset(sop_static, shuffle=False)
    collator = ds.collator()
    assert collator.masking == "static"
    batch = collator(list(ds))
    assert batch["sentence_order_label"].tolist() == [row["label"] for row in rows]
    for i, row in enumerate(rows):
        labels = batch["labels"][i].numpy()
        np.testing.assert_array_equal(np.flatnonzero(labels != -100), row["positions"])
        np.testing.assert_array_equal(labels[row["positions"]], row["masked_ids"])


def _masked_runs(batch, boundary: np.ndarray):
    """(runs of adjacent masked positions: ALBERT words in each, whether each splits a word of
    the tokenizer's own ▁ marking; masked share of the tokens)."""
    labels = batch["labels"].numpy()
    masked = labels != -100
    flat, tb = masked.reshape(-1), boundary.reshape(-1)
    pos = np.flatnonzero(flat)
    new = np.ones(len(pos), dtype=bool)
    new[1:] = pos[1:] != pos[:-1] + 1
    first = np.flatnonzero(new)
    ends = np.r_[pos[first[1:] - 1], pos[-1]]
    words = np.add.reduceat(tb[pos], first)
    return pos[first], ends, words, masked.sum() / batch["attention_mask"].sum().item()


def test_dynamic_masking_of_unmasked_sop_shards_masks_albert_words_by_ngram(sop_unmasked_parquet, sop_static):
    """--masking none: the collator masks as the run recorded (sop: ngram, n <= 3, P(n) ∝ 1/n) on
    ALBERT's words (token_boundary), with the masked share and n-gram lengths of prepare's static
    masks of the same text (which match ALBERT's script). The tokenizer's ▁ words (a run of
    Chinese pieces as one word) would leave whole words of many pieces unmasked or masked whole."""
    from mlm_pipeline.tokenize import load_tokenizer

    ds = MLMDataset(sop_unmasked_parquet, shuffle=False)
    samples = list(ds)
    collator = ds.collator(seed=1)
    assert (collator.masking, collator.masking_scheme) == ("dynamic", "ngram")
    batch = collator(samples)
    width = batch["input_ids"].shape[1]
    boundary = _boundary(samples, width)
    starts, ends, words, share = _masked_runs(batch, boundary)
    # whole ALBERT words: a run starts at a word start (or right after [CLS] or [SEP], where a
    # truncated segment may begin inside a word) and the token after it starts a word
    tok = load_tokenizer(str(SPM), True)
    ids = batch["input_ids"].numpy().reshape(-1)
    assert ((boundary.reshape(-1)[starts] == 1) | np.isin(ids[starts - 1], tok.special_id_array)).all()
    after = ends + 1
    inside = after % width != 0
    assert (boundary.reshape(-1)[after[inside]] == 1).all()
    # ... which are not the tokenizer's words: most runs end inside a ▁-word (before a Chinese piece)
    labels = batch["labels"].numpy().reshape(-1)
    originals = np.where(labels != -100, labels, batch["input_ids"].numpy().reshape(-1))
    unmasked_next = inside.copy()
    unmasked_next[inside] = labels[after[inside]] == -100
    splits = unmasked_next & tok.is_continuation[originals[np.minimum(after, len(originals) - 1)]]
    assert splits.mean() > 0.5, splits.mean()
    # the statistics of prepare's static n-gram masks (ALBERT's): masked share, words per run
    static = MLMDataset(sop_static, shuffle=False)
    static_samples = list(static)
    static_batch = static.collator()(static_samples)
    _, _, static_words, static_share = _masked_runs(static_batch, _boundary(static_samples, width))
    assert abs(share - static_share) < 0.01 and abs(share - 0.15) < 0.01, (share, static_share)
    assert abs(words.mean() - static_words.mean()) < 0.1 * static_words.mean(), (words.mean(), static_words.mean())
    # n-grams: longer runs than whole words alone
    whole_words = ds.collator(seed=1, masking_scheme="whole-word")(samples)
    assert words.mean() > 1.25 * _masked_runs(whole_words, boundary)[2].mean()


def test_hf_trainer_trains_albert_for_pretraining_on_the_batches(sop_unmasked_parquet, tmp_path):
    """The collator's batch is AlbertForPreTraining's arguments as they are (MLM + SOP loss), through
    HF's Trainer: its loss falls over a few steps."""
    pytest.importorskip("accelerate")
    from transformers import AlbertConfig, AlbertForPreTraining, Trainer, TrainingArguments

    ds = MLMDataset(sop_unmasked_parquet, seed=0, shuffle_buffer=64, rank=0, world_size=1)
    collator = ds.collator()
    batch = collator(list(MLMDataset(sop_unmasked_parquet, shuffle=False))[:4])
    assert set(batch) == {"input_ids", "attention_mask", "token_type_ids", "labels", "sentence_order_label"}
    torch.manual_seed(0)
    model = AlbertForPreTraining(AlbertConfig(vocab_size=collator.vocab_size, embedding_size=16, hidden_size=32,
                                              num_hidden_layers=1, num_attention_heads=2, intermediate_size=64,
                                              max_position_embeddings=128))
    args = TrainingArguments(output_dir=str(tmp_path / "hf"), max_steps=12, per_device_train_batch_size=16,
                             learning_rate=1e-2, logging_steps=1, save_strategy="no", report_to=[], use_cpu=True,
                             remove_unused_columns=False, accelerator_config={"dispatch_batches": False},
                             dataloader_num_workers=0, disable_tqdm=True, seed=0)
    trainer = Trainer(model=model, args=args, train_dataset=ds, data_collator=collator)
    trainer.train()
    losses = [row["loss"] for row in trainer.state.log_history if "loss" in row]
    assert len(losses) == 12
    assert np.mean(losses[-3:]) < np.mean(losses[:3]) - 0.3, losses


@pytest.mark.parametrize("which", ["static", "dynamic"])
def test_train_pretrains_a_tiny_albert_from_sop_shards(which, sop_static, sop_unmasked_parquet, tmp_path):
    from mlm_pipeline.torch.train import TrainConfig, main

    data = sop_static if which == "static" else sop_unmasked_parquet
    summary = main(TrainConfig(data=data, steps=30, batch_size=16, lr=3e-3, layers=2, hidden=64, heads=2,
                               output_dir=str(tmp_path / "run"), threads=1, eval_batches=2, log_every=0))
    assert summary["model"] == "AlbertForPreTraining"
    assert summary["masking"] == which and (which == "static" or summary["masking_scheme"] == "ngram")
    before, after = summary["eval_mlm_loss_before"], summary["eval_mlm_loss_after"]
    assert before > 8.5  # ~ln(8000) = 9.0 untrained
    assert after < before - 0.6, summary  # (30 steps: about 1 nat)
    config = json.loads((tmp_path / "run" / "model" / "config.json").read_text())
    assert config["model_type"] == "albert" and config["embedding_size"] == 16 < config["hidden_size"] == 64
    rows = (tmp_path / "run" / "loss.csv").read_text().splitlines()
    header = rows[0].split(",")
    sop_losses = [float(r.split(",")[header.index("nsp_loss")]) for r in rows[1:]]
    assert len(sop_losses) == 30 and all(0 < x < 2 for x in sop_losses)  # the SOP head trains too


def test_train_model_flag_picks_bert_or_albert(sop_static, tmp_path):
    """--model bert on sop shards: BertForPreTraining on the same labels; --model albert on nsp
    shards; a bad name or an ALBERT-only size for BERT is refused."""
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app

    common = ["--steps", "2", "--batch-size", "4", "--hidden", "32", "--layers", "1", "--threads", "1"]
    got = CliRunner().invoke(app, ["train", sop_static, "--model", "bert", "-o", str(tmp_path / "b"), *common])
    assert got.exit_code == 0, got.output
    assert json.loads((tmp_path / "b" / "summary.json").read_text())["model"] == "BertForPreTraining"
    got = CliRunner().invoke(app, ["train", sop_static, "--model", "albert", "--embedding-size", "8",
                                   "-o", str(tmp_path / "a"), *common])
    assert got.exit_code == 0, got.output
    assert json.loads((tmp_path / "a" / "model" / "config.json").read_text())["embedding_size"] == 8
    got = CliRunner().invoke(app, ["train", sop_static, "--model", "bert", "--embedding-size", "8",
                                   "-o", str(tmp_path / "c"), *common])
    assert got.exit_code != 0 and "embedding_size applies to ALBERT" in got.output


def test_train_albert_on_nsp_shards(tiny_out, tmp_path):
    from mlm_pipeline.torch.train import TrainConfig, main

    summary = main(TrainConfig(data=tiny_out, model="albert", steps=2, batch_size=4, layers=1, hidden=32, heads=2,
                               output_dir=str(tmp_path / "run"), threads=1, eval_batches=1, log_every=0))
    assert summary["model"] == "AlbertForPreTraining"
