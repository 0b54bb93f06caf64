"""``MLMDataset(..., language_alpha=α)``: outputs of one language each, mixed at load time by
q_i ∝ p_i^α of their tokens; the collator's ``langs`` (XLM's per-token language ids).

Real text: English from WikiText-2 (200 KB) and Chinese from 红楼梦 (its first 60 paragraphs,
about 22 KB), each prepared as its own output (see ``tests/test_languages.py``)."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from mlm_pipeline.pipeline import prepare  # noqa: E402
from mlm_pipeline.torch import MLMDataset  # noqa: E402

DATA = Path(__file__).resolve().parents[1] / "data"
VOCAB = DATA / "golden" / "electra" / "zh-en-wordpiece-vocab.txt"


@pytest.fixture(scope="module")
def outputs(tmp_path_factory) -> tuple[str, str]:
    root = tmp_path_factory.mktemp("lang")
    en, zh = root / "en.txt", root / "zh.txt"
    en.write_bytes((DATA / "golden" / "electra" / "zh-en-200KB" / "wikitext2-train-200KB.txt").read_bytes())
    paragraphs = [line.strip() for line in (DATA / "hongloumeng-300KB.txt").read_text("utf-8").splitlines()
                  if line.strip()][:60]
    zh.write_text("\n\n".join(paragraphs) + "\n", "utf-8")
    made = []
    for code, path in (("en", en), ("zh", zh)):
        out = root / f"out-{code}"
        prepare({"language": [f"{code}={path}"], "output": str(out), "tokenizer": str(VOCAB), "objective": "packed",
                 "format": "parquet", "workers": 1, "max_instances_per_shard": 100})
        made.append(str(out))
    return made[0], made[1]


def test_alpha_mix_gives_each_language_its_target_share(outputs):
    dataset = MLMDataset(list(outputs), language_alpha=0.3, seed=3, shuffle_buffer=256, verify="size")
    tokens = {"en": 0, "zh": 0}
    for sample in dataset:
        tokens[sample["language"]] += len(sample["input_ids"])
    counts = {code: p.languages[code]["instance_tokens"] for p, code in zip(dataset.sources, ("en", "zh"))}
    assert counts["en"] > 5 * counts["zh"]
    p = {code: n / sum(counts.values()) for code, n in counts.items()}
    q = {code: p[code] ** 0.3 / sum(v ** 0.3 for v in p.values()) for code in p}
    for code in tokens:
        assert abs(tokens[code] / sum(tokens.values()) - q[code]) <= 0.02, (code, tokens, q)
    # the epoch keeps the sources' tokens: Chinese repeated, English subsampled
    assert abs(sum(tokens.values()) - sum(counts.values())) <= 0.02 * sum(counts.values())
    assert tokens["zh"] > 2 * counts["zh"]


def test_alpha_1_takes_every_instance_once(outputs):
    mixed = MLMDataset(list(outputs), language_alpha=1.0, seed=3, verify="size")
    plain = MLMDataset(list(outputs), seed=3, verify="size")
    assert mixed.mix.tolist() == plain.mix.tolist()


def test_sources_must_hold_one_language(outputs, tmp_path):
    with pytest.raises(ValueError, match="weights or language_alpha"):
        MLMDataset(list(outputs), language_alpha=0.3, weights=[1, 1], verify="size")
    plain = tmp_path / "plain"
    prepare({"inputs": [str(DATA / "hongloumeng-300KB.txt")], "output": str(plain), "tokenizer": str(VOCAB),
             "format": "parquet", "workers": 1, "objective": "packed"})
    with pytest.raises(ValueError, match="no language"):
        MLMDataset([outputs[0], str(plain)], language_alpha=0.3, verify="size")


def test_collator_emits_langs(outputs):
    dataset = MLMDataset(list(outputs), language_alpha=0.3, seed=3, shuffle_buffer=64, verify="size")
    assert dataset.language_ids == {"en": 0, "zh": 1}
    collate = dataset.collator(language_ids=dataset.language_ids)
    samples = [s for s, _ in zip(dataset, range(64))]
    batch = collate(samples)
    assert batch["langs"].shape == batch["input_ids"].shape and batch["langs"].dtype == torch.int64
    expected = np.array([dataset.language_ids[s["language"]] for s in samples])
    assert (batch["langs"].numpy() == expected[:, None]).all()
    assert set(expected.tolist()) == {0, 1}


def test_langs_follow_the_tokens_into_the_unpadded_form(outputs):
    """FlashAttention's unpadded batch flattens the rows: ``langs`` is flattened with the ids."""
    dataset = MLMDataset(list(outputs), language_alpha=0.3, seed=3, shuffle_buffer=64, verify="size")
    samples = [s for s, _ in zip(dataset, range(32))]
    padded = dataset.collator(language_ids=dataset.language_ids)(samples)
    flat = dataset.collator(language_ids=dataset.language_ids, attention="unpadded")(samples)
    assert flat["langs"].shape == flat["input_ids"].shape == (1, int(padded["attention_mask"].sum()))
    keep = padded["attention_mask"].bool()
    assert flat["langs"][0].tolist() == padded["langs"][keep].tolist()
