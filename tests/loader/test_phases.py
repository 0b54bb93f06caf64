"""Training phases: each phase its own output (masking rate, sequence length), trained in order.

mmBERT's schedule as three ``prepare`` commands: 30% masking at 64 tokens, then 15% and 5% at 128
(its α per phase is ``--language-alpha``; here one language). One model is trained through the
three outputs in order, the loop a user writes: each phase's batches come from its own output
(its lengths, its masking rate), and the weights carry over from phase to phase.
"""

from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from loader.loader_helpers import VOCAB, WIKITEXT  # noqa: E402

pytestmark = pytest.mark.torch

PHASES = [(0.3, 64), (0.15, 128), (0.05, 128)]  # (--masked-lm-prob, --max-seq-length)


def _prepare_phase(text, out, p: float, length: int) -> None:
    from mlm_pipeline.cli import app
    from typer.testing import CliRunner

    result = CliRunner().invoke(app, [
        "prepare", str(text), "-o", str(out), "-t", str(VOCAB), "--objective", "packed", "--format", "parquet",
        "--masked-lm-prob", str(p), "--max-seq-length", str(length),
        "--max-predictions-per-seq", str(round(p * length)), "--workers", "1", "--no-progress"])
    assert result.exit_code == 0, result.output


def test_three_phases_are_built_by_three_commands_and_trained_in_order(tmp_path):
    from mlm_pipeline.torch import MLMDataLoader, MLMDataset

    text = tmp_path / "t.txt"
    text.write_bytes(WIKITEXT.read_bytes()[:150_000])
    outs = [tmp_path / f"phase{i + 1}" for i in range(len(PHASES))]
    for out, (p, length) in zip(outs, PHASES):
        _prepare_phase(text, out, p, length)
        settings = json.loads((out / "manifest.json").read_text())["config"]
        assert (settings["masked_lm_prob"], settings["max_seq_length"]) == (p, length)

    torch.manual_seed(0)
    config = transformers.BertConfig(vocab_size=30522, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                                     intermediate_size=64, max_position_embeddings=128)
    model = transformers.BertForMaskedLM(config)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-3)
    seen = []
    for out, (p, length) in zip(outs, PHASES):  # the user's loop: one phase after the other
        before = model.bert.embeddings.word_embeddings.weight.detach().clone()
        dataset = MLMDataset(str(out), seed=1)
        loader = MLMDataLoader(dataset, batch_size=8, collate_fn=dataset.collator(nsp=False))
        masked = tokens = 0
        for step, batch in enumerate(loader):
            if step == 4:
                break
            assert batch["input_ids"].shape[1] <= length
            masked += int((batch["labels"] != -100).sum())
            tokens += int(batch["attention_mask"].sum())
            loss = model(**batch).loss
            assert torch.isfinite(loss)
            loss.backward()
            optimizer.step()
            optimizer.zero_grad()
        seen.append(masked / tokens)
        assert abs(masked / tokens - p) <= 0.5 / length + 0.02, (p, masked / tokens)
        assert not torch.equal(before, model.bert.embeddings.word_embeddings.weight)  # trained in this phase
    assert seen[0] > seen[1] > seen[2]
    np.testing.assert_allclose(seen, [p for p, _ in PHASES], atol=0.02)
