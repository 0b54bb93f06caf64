"""The Chinese x English ELECTRA path end to end on the bundled text, through the command line:
``vocab`` -> ``prepare --objective electra`` -> ``inspect`` -> the torch loader -> ``train``."""

from __future__ import annotations

import json
import math
import re
import unicodedata

import numpy as np
import pytest
from typer.testing import CliRunner

from conftest import DATA, WIKITEXT
from mlm_pipeline.cli import app

CHINESE = DATA / "hongloumeng-300KB.txt"


def invoke(*args) -> str:
    result = CliRunner().invoke(app, [*map(str, args)])
    assert result.exit_code == 0, result.output + repr(result.exception)
    return result.output


def is_cjk(token: str) -> bool:
    return len(token) == 1 and unicodedata.name(token, "").startswith("CJK UNIFIED IDEOGRAPH")


@pytest.mark.slow
def test_chinese_english_electra_from_vocab_to_training(tmp_path):
    # 1. a WordPiece vocabulary of both scripts, with ELECTRA's normalization
    tok_dir = tmp_path / "tok"
    invoke("vocab", CHINESE, WIKITEXT, "-o", tok_dir / "tokenizer.json", "--vocab-size", 8000,
           "--tokenizer-flavor", "electra")
    tokenizer = tok_dir / "tokenizer.json"
    assert tokenizer.is_file() and (tok_dir / "vocab.txt").is_file()

    # 2. ELECTRA examples with it (the flavor follows the objective)
    out = tmp_path / "out"
    invoke("prepare", CHINESE, WIKITEXT, "--objective", "electra", "-t", tokenizer, "--max-seq-length", 64,
           "--workers", 2, "--split-size", "1MiB", "-o", out, "--no-progress")  # a task (and shard) per file
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["config"]["tokenizer_flavor"] == "electra" and manifest["masking"] == "none"
    assert manifest["totals"]["instances"] > 1000

    # 3. inspect: single CJK characters and English wordpieces, hardly any [UNK] (the first shard
    # holds 红楼梦's examples, the last WikiText's)
    shown = "".join(invoke("inspect", out / manifest["shards"][i]["path"], "-n", 300) for i in (0, -1))
    tokens = [t for line in shown.splitlines() if line.startswith("  [CLS]") for t in line.split()]
    assert len(tokens) > 10000
    cjk = [t for t in tokens if is_cjk(t)]
    words = [t for t in tokens if re.fullmatch(r"[a-z]{2,}", t)]
    pieces = [t for t in tokens if re.fullmatch(r"##[a-z]+", t)]
    assert len(cjk) > 1000 and len(words) > 1000 and len(pieces) > 50
    assert not [t for t in tokens if len(t) > 1 and any(is_cjk(c) for c in t)]  # CJK never joined into words
    assert tokens.count("[UNK]") / len(tokens) < 0.005

    # 4. the loader masks as ELECTRA does, automatically
    from mlm_pipeline.torch import MLMDataLoader, MLMDataset

    dataset = MLMDataset(str(out), shuffle=True, seed=1)
    collator = dataset.collator()
    assert collator.masking == "electra" and not collator.nsp
    batch = next(iter(MLMDataLoader(dataset, batch_size=64, collate_fn=collator)))
    assert batch["input_ids"].shape == (64, 64) and "next_sentence_label" not in batch
    labels, ids = batch["labels"].numpy(), batch["input_ids"].numpy()
    chosen = labels != -100
    assert chosen.any(axis=1).all()
    assert (chosen.sum(1) <= int((0.15 + 0.005) * 64)).all()
    replaced = ids[chosen] == collator.mask_id
    assert 0.75 < replaced.mean() < 0.95  # 85% [MASK] per draw, the rest kept: never a random token
    assert (ids[chosen][~replaced] == labels[chosen][~replaced]).all()

    # 5. a tiny masked LM trains on it
    invoke("train", out, "--steps", 30, "--batch-size", 16, "--hidden", 64, "--heads", 2, "--layers", 1,
           "--lr", "3e-3", "-o", tmp_path / "train")
    summary = json.loads((tmp_path / "train" / "summary.json").read_text())
    assert summary["masking"] == "electra" and summary["steps_run"] == 30
    losses = [summary["first_train_loss"], summary["last_train_loss_mean"], summary["eval_mlm_loss_before"],
              summary["eval_mlm_loss_after"]]
    assert all(math.isfinite(x) for x in losses)
    assert summary["eval_mlm_loss_after"] < summary["eval_mlm_loss_before"]
    assert np.isclose(summary["eval_mlm_loss_before"], summary["uniform_loss"], rtol=0.1)  # starts near chance
