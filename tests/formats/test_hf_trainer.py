"""Training proof for the ``hf`` format: Hugging Face's ``Trainer`` trains a tiny BERT masked LM
on ``datasets.load_from_disk(OUT)`` with a stock padding collator, and the loss falls."""

from __future__ import annotations

import pytest

from conftest import VOCAB, WIKITEXT

pytest.importorskip("torch")
pytest.importorskip("transformers")
pytest.importorskip("accelerate")
datasets = pytest.importorskip("datasets")

pytestmark = [pytest.mark.torch]


def test_trainer_learns_from_load_from_disk_with_a_padding_collator(tmp_path, monkeypatch):
    import torch
    from tokenizers import BertWordPieceTokenizer
    from transformers import (BertConfig, BertForMaskedLM, DataCollatorForTokenClassification, PreTrainedTokenizerFast,
                              Trainer, TrainingArguments)

    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    torch.set_num_threads(1)
    out = tmp_path / "out"
    run_prepare(build_config({"inputs": [str(WIKITEXT)], "output": str(out), "tokenizer": str(VOCAB), "format": "hf",
                              "workers": 1, "progress": False}), show_progress=False)
    train = datasets.load_from_disk(str(out))
    assert {"input_ids", "token_type_ids", "labels"} <= set(train.column_names)

    # (built from the tokenizers object: transformers 4 and 5 read a vocab.txt argument differently)
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=BertWordPieceTokenizer(str(VOCAB), lowercase=True),
                                        pad_token="[PAD]", unk_token="[UNK]", mask_token="[MASK]")
    assert tokenizer.vocab_size == 30_522 and tokenizer.pad_token_id == 0
    torch.manual_seed(0)
    model = BertForMaskedLM(BertConfig(vocab_size=tokenizer.vocab_size, hidden_size=32, num_hidden_layers=1,
                                       num_attention_heads=2, intermediate_size=64, max_position_embeddings=128))
    args = TrainingArguments(output_dir=str(tmp_path / "run"), max_steps=30, per_device_train_batch_size=16,
                             learning_rate=5e-3, warmup_steps=0, logging_steps=1, save_strategy="no", report_to=[],
                             use_cpu=True, dataloader_num_workers=0, seed=0, disable_tqdm=True)
    # remove_unused_columns (the default) drops next_sentence_label, not an argument of a masked LM;
    # the collator pads input_ids and token_type_ids, labels with -100, and adds the attention mask
    trainer = Trainer(model=model, args=args, train_dataset=train,
                      data_collator=DataCollatorForTokenClassification(tokenizer, pad_to_multiple_of=8))
    trainer.train()
    losses = [entry["loss"] for entry in trainer.state.log_history if "loss" in entry]
    assert len(losses) == 30
    first, last = sum(losses[:5]) / 5, sum(losses[-5:]) / 5
    assert first > 9.5  # about ln(30,522): the untrained model guesses
    assert last < first - 1.0, losses  # (a 10% fall: it learns the token distribution)
