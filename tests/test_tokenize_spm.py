"""SentencePiece ``.model`` tokenizers: the ids are the ``sentencepiece`` library's (after ALBERT's
text rules for ALBERT's model), whichever backend encodes; HF's conversion is used only where it
gives them, and falls back to the library with a warning and a manifest entry where it does not;
``prepare`` runs end to end on English and Chinese, with the same bytes for any worker count;
ALBERT, XLM-R and CamemBERT model directories and hub names load from a local cache."""

from __future__ import annotations

import io
import json
import logging
import os
import subprocess
import sys
import unicodedata
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest
import sentencepiece

from conftest import DATA, SAMPLE_TEXT, VOCAB, WIKIEXTRACTOR, WIKITEXT
from mlm_pipeline.errors import TokenizerError
from mlm_pipeline.tokenize import TextTokenizer, load_tokenizer, spm
from mlm_pipeline.tokenize.selfcheck import PROBES

ALBERT_MODEL = DATA / "albert-spm-8k.model"
HONGLOUMENG = DATA / "hongloumeng-300KB.txt"


def albert_preprocess(text: str, lower: bool = True, keep_accents: bool = False) -> str:
    """HF ``AlbertTokenizer.preprocess_text``, written out here as transformers 4.x has it."""
    out = " ".join(text.strip().split())
    out = out.replace("``", '"').replace("''", '"')
    if not keep_accents:
        out = unicodedata.normalize("NFKD", out)
        out = "".join(c for c in out if not unicodedata.combining(c))
    return out.lower() if lower else out


def split_ids(ids: np.ndarray, lengths: np.ndarray) -> list[list[int]]:
    starts = np.concatenate([[0], np.cumsum(lengths)])
    return [ids[starts[i]:starts[i + 1]].tolist() for i in range(len(lengths))]


def real_lines() -> list[str]:
    """English (WikiText-2, a WikiExtractor sample) and Chinese (红楼梦) lines."""
    lines = WIKITEXT.read_text(encoding="utf-8").splitlines()[:3000]
    lines += WIKIEXTRACTOR.read_text(encoding="utf-8").splitlines()[:1500]
    lines += HONGLOUMENG.read_text(encoding="utf-8").splitlines()
    return [line for line in lines if line.strip()]


@pytest.fixture(scope="session")
def xlmr_like_model(tmp_path_factory) -> Path:
    """A small unigram model in XLM-R's layout (``<unk> <s> </s>`` first, no pad, no mask), trained
    here on English and Chinese (deterministic: one thread)."""
    text = WIKITEXT.read_text(encoding="utf-8")[:120_000] + HONGLOUMENG.read_text(encoding="utf-8")[:40_000]
    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([line for line in text.splitlines() if line.strip()]), model_writer=buf,
        vocab_size=1500, model_type="unigram", num_threads=1, character_coverage=0.98, minloglevel=2)
    path = tmp_path_factory.mktemp("xlmr") / "sentencepiece.bpe.model"
    path.write_bytes(buf.getvalue())
    return path


@pytest.mark.parametrize("backend", ["auto", "hf", "sentencepiece"])
def test_albert_model_gives_the_librarys_ids_after_albert_preprocessing_on_real_text(backend):
    """ALBERT's spiece.model: lower-cased, accents stripped, spaces squeezed (AlbertTokenizer), then
    sp.encode, on English and Chinese text; auto takes the library, hf its checked conversion."""
    tok = TextTokenizer(str(ALBERT_MODEL), backend=backend)
    assert tok.backend_info["backend"] == ("hf" if backend == "hf" else "sentencepiece")
    assert "fallback_from" not in tok.backend_info
    sp = sentencepiece.SentencePieceProcessor(model_file=str(ALBERT_MODEL))
    lines = real_lines() + list(PROBES)
    expected = sp.encode([albert_preprocess(t) for t in lines])
    assert split_ids(*tok.encode_batch(lines)) == expected
    assert tok.special == spm_special(cls=2, sep=3, mask=4, pad=0) and tok.unk_id == 1
    assert tok.model_type == "sentencepiece" and tok.word_marker == ("start", "\u2581") and tok.lowercases


def spm_special(**ids):
    from mlm_pipeline.tokenize import SpecialIds

    return SpecialIds(**ids)


def test_albert_rules_lower_case_strip_accents_squeeze_spaces_and_quotes():
    tok = TextTokenizer(str(ALBERT_MODEL))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(ALBERT_MODEL))
    text = "  Caf\u00e9 ``Na\u00efve''\t\tR\u00c9SUM\u00c9  \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35 "
    ids = split_ids(*tok.encode_batch([text]))[0]
    assert ids == sp.encode('cafe "naive" resume \u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35')  # Thai's U+0E31 kept
    # --no-do-lower-case keeps the case, and accents are still stripped
    cased = TextTokenizer(str(ALBERT_MODEL), do_lower_case=False)
    assert split_ids(*cased.encode_batch(["Caf\u00e9 WORLD"]))[0] == sp.encode("Cafe WORLD")
    assert not cased.lowercases and cased.fingerprint != tok.fingerprint


def test_a_model_without_albert_pieces_encodes_the_text_as_it_is(xlmr_like_model):
    """No ALBERT rules (no [CLS]/[SEP] pieces): case and accents kept; the roles the model lacks
    (pad, mask) are appended after its pieces, with a warning."""
    tok = TextTokenizer(str(xlmr_like_model))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(xlmr_like_model))
    lines = real_lines()[::7] + list(PROBES)
    assert split_ids(*tok.encode_batch(lines)) == sp.encode(lines)
    n = sp.get_piece_size()
    assert tok.special == spm_special(cls=1, sep=2, mask=n, pad=n + 1) and tok.unk_id == 0
    assert tok.vocab_size == n + 2 and tok.convert_ids_to_tokens([1, 2, n, n + 1]) == ["<s>", "</s>", "<mask>", "<pad>"]
    assert not tok.lowercases


@pytest.mark.parametrize("cls, first_ids", [("XLMRobertaTokenizer", {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}),
                                            ("CamembertTokenizer", {"<pad>": 1, "<unk>": 3, "<s>": 5, "</s>": 6})])
def test_xlmr_and_camembert_directories_give_fairseq_ids(xlmr_like_model, tmp_path, cls, first_ids):
    """A model directory whose tokenizer_config.json names XLM-R's or CamemBERT's tokenizer gives
    their HF tokenizers' ids (fairseq's: the library's id shifted, <mask> last)."""
    (tmp_path / "sentencepiece.bpe.model").write_bytes(xlmr_like_model.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"tokenizer_class": cls}))
    tok = TextTokenizer(str(tmp_path))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(xlmr_like_model))
    n = sp.get_piece_size()
    shift = 1 if cls.startswith("XLM") else 4
    lines = real_lines()[::11]
    expected = [[first_ids["<unk>"] if i == 0 else i + shift for i in row] for row in sp.encode(lines)]
    assert split_ids(*tok.encode_batch(lines)) == expected
    assert tok.special == spm_special(cls=first_ids["<s>"], sep=first_ids["</s>"], mask=n + shift, pad=1)
    assert tok.vocab_size == n + shift + 1
    transformers = pytest.importorskip("transformers")
    theirs = getattr(transformers, cls).from_pretrained(str(tmp_path))
    pieces = tok.convert_ids_to_tokens(range(tok.vocab_size))
    assert theirs.convert_tokens_to_ids(pieces) == list(range(tok.vocab_size))
    # HF's own encoding agrees on text that spells no special token and has no tie HF breaks otherwise
    chinese = HONGLOUMENG.read_text(encoding="utf-8").splitlines()[:100]
    assert [theirs(t, add_special_tokens=False)["input_ids"] for t in chinese] == split_ids(*tok.encode_batch(chinese))
    assert (theirs.cls_token_id, theirs.sep_token_id, theirs.mask_token_id, theirs.pad_token_id) == \
        (tok.special.cls, tok.special.sep, tok.special.mask, tok.special.pad)


def test_a_directory_without_a_tokenizer_class_is_known_by_its_config_json(tmp_path):
    """Older hub repositories name no tokenizer class: config.json's model_type tells ALBERT's, and
    its model file is read (not its tokenizer.json) with tokenizer_config.json's settings."""
    (tmp_path / "spiece.model").write_bytes(ALBERT_MODEL.read_bytes())
    (tmp_path / "config.json").write_text(json.dumps({"model_type": "albert", "vocab_size": 8000}))
    (tmp_path / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": False}))
    (tmp_path / "tokenizer.json").write_text("this file is not read")
    tok = TextTokenizer(str(tmp_path))
    sp = sentencepiece.SentencePieceProcessor(model_file=str(ALBERT_MODEL))
    assert tok.kind == "sentencepiece-model"
    assert split_ids(*tok.encode_batch(["Caf\u00e9  WORLD"]))[0] == sp.encode("Cafe WORLD")


def test_albert_directory_takes_its_tokenizer_config(tmp_path):
    (tmp_path / "spiece.model").write_bytes(ALBERT_MODEL.read_bytes())
    (tmp_path / "tokenizer_config.json").write_text(json.dumps(
        {"tokenizer_class": "AlbertTokenizer", "do_lower_case": False, "keep_accents": True}))
    tok = TextTokenizer(str(tmp_path))  # do_lower_case=True asked, the directory says otherwise
    sp = sentencepiece.SentencePieceProcessor(model_file=str(ALBERT_MODEL))
    assert split_ids(*tok.encode_batch(["Caf\u00e9  Na\u00efve"]))[0] == sp.encode("Caf\u00e9 Na\u00efve")


class _Degraded:
    """HF's conversion made wrong on purpose: ``piece`` is out of its vocabulary."""

    def __init__(self, piece: str):
        self.piece = piece
        self.real = spm.to_hf

    def __call__(self, model):
        pieces = list(model.pieces)
        pieces[pieces.index(self.piece)] = spm.NEVER.format("gone")
        return self.real(type(model)(**{**vars(model), "pieces": pieces}))


def test_a_degraded_conversion_fails_the_probe_set_and_the_library_encodes(monkeypatch, caplog):
    monkeypatch.setattr(spm, "to_hf", _Degraded("\u2581a"))  # "a" is in the probe set
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        tok = TextTokenizer(str(ALBERT_MODEL), backend="hf")
    assert tok.encoder.name == "sentencepiece"
    assert "hf: self-check: ids differ from sentencepiece on probe" in tok.backend_info["fallback_reason"]
    assert "falls back to sentencepiece" in caplog.text


def run(inputs, out, tokenizer=ALBERT_MODEL, **settings) -> dict:
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    load_tokenizer.cache_clear()  # a fresh process's tokenizer (a patched conversion is loaded)
    try:
        config = build_config({"inputs": [str(p) for p in inputs], "output": str(out), "tokenizer": str(tokenizer),
                               "random_seed": 7, "progress": False, "format": "parquet", **settings})
        return run_prepare(config, show_progress=False)
    finally:
        load_tokenizer.cache_clear()


def shard_table(manifest: dict) -> list:
    return [[s["path"], s["sha256"], s["instances"]] for s in manifest["shards"]]


def test_a_degraded_conversion_differing_on_a_tasks_text_falls_back_for_the_task(monkeypatch, tmp_path, caplog):
    """The probe set passes (no probe holds 宝玉), the task's own first block does not: the run
    warns, names the text, records the fallback, and writes the library's bytes."""
    assert not any("\u5b9d\u7389" in p for p in PROBES)
    expected = run([HONGLOUMENG], tmp_path / "library", tokenizer_backend="sentencepiece", workers=1)
    monkeypatch.setattr(spm, "to_hf", _Degraded("\u5b9d\u7389"))
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        manifest = run([HONGLOUMENG], tmp_path / "hf", tokenizer_backend="hf", workers=1)
    assert "ids differ from sentencepiece on text" in caplog.text and "\u5b9d\u7389" in caplog.text
    fallbacks = [b for b in manifest["tokenizer_backend"] if b.get("fallback_from") == "hf"]
    assert fallbacks and fallbacks[0]["backend"] == "sentencepiece"
    assert "\u5b9d\u7389" in fallbacks[0]["fallback_reason"]
    assert shard_table(manifest) == shard_table(expected)


def test_after_a_tasks_fallback_the_library_encodes_the_whole_run(monkeypatch, tmp_path, caplog):
    """Task a's first block shows the degraded conversion differing; task b's difference lies past
    what its own check reads. The run encodes both again with the library: the library's bytes."""
    chinese = [line for line in HONGLOUMENG.read_text(encoding="utf-8").splitlines()
               if line.strip() and "\u5b9d\u7389" not in line]
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("\u5b9d\u7389\u6765\u4e86\u3002\n" + "\n".join(chinese[:60]) + "\n", encoding="utf-8")
    b.write_text("\n".join(chinese[60:200]) + "\n\u5b9d\u7389\u8d70\u4e86\u3002\n", encoding="utf-8")
    settings = {"workers": 1, "split_bytes": "24KB", "max_seq_length": 64}
    expected = run([a, b], tmp_path / "library", tokenizer_backend="sentencepiece", **settings)
    monkeypatch.setattr(spm, "to_hf", _Degraded("\u5b9d\u7389"))
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        manifest = run([a, b], tmp_path / "hf", tokenizer_backend="hf", **settings)
    assert "run again with sentencepiece" in caplog.text
    assert len(manifest["shards"]) >= 2 and shard_table(manifest) == shard_table(expected)
    assert {b["backend"] for b in manifest["tokenizer_backend"]} == {"sentencepiece"}


def rows(out: Path) -> list[dict]:
    return [row for f in sorted((out / "shards").glob("*.parquet")) for row in pq.read_table(f).to_pylist()]


@pytest.fixture(scope="module")
def corpora(tmp_path_factory) -> dict[str, Path]:
    """English (WikiText-2) and Chinese (红楼梦), about 150 KB each, whole lines."""
    root = tmp_path_factory.mktemp("corpora")
    out = {}
    for name, path, chars in (("en", WIKITEXT, 150_000), ("zh", HONGLOUMENG, 50_000)):
        text = path.read_text(encoding="utf-8")
        cut = text.index("\n", chars) + 1
        (root / f"{name}.txt").write_text(text[:cut], encoding="utf-8")
        out[name] = root / f"{name}.txt"
    return out


def sentence_ids(path: Path) -> list[list[int]]:
    """The library's ids of each non-empty line after ALBERT's preprocessing (a document's sentences)."""
    sp = sentencepiece.SentencePieceProcessor(model_file=str(ALBERT_MODEL))
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines() if line.strip()]
    return [ids for ids in sp.encode([albert_preprocess(t) for t in lines]) if ids]


@pytest.mark.parametrize("lang", ["en", "zh"])
@pytest.mark.parametrize("objective", ["nsp", "packed", "tokens"])
def test_prepare_with_a_model_file_end_to_end(corpora, tmp_path, objective, lang):
    """`prepare -t spiece.model`: [CLS]/[SEP]/[MASK] by the model's roles, and the text between
    them the library's ids (the tokens objective keeps the stream whole: it is checked exactly)."""
    out = tmp_path / "out"
    manifest = run([corpora[lang]], out, objective=objective, workers=1, max_seq_length=64, masking="static",
                   dupe_factor=1)
    assert manifest["totals"]["instances"] > 100
    data = rows(out)
    assert data and all(r["input_ids"][0] == 2 and r["input_ids"][-1] == 3 for r in data)  # [CLS] ... [SEP]
    masked = [m for r in data for m in r["masked_lm_ids"]]
    assert masked and all(0 <= i < 8000 and i not in (0, 2, 3, 4) for i in masked)
    shown = [i for r in data for i in r["input_ids"]]
    assert shown.count(4) > 0.5 * len(masked)  # [MASK] is id 4, ~80% of the masked positions
    expected = sentence_ids(corpora[lang])
    vocab = {i for ids in expected for i in ids} | {2, 3}
    for r in data:  # outside the masked positions, only the corpus's ids and [CLS]/[SEP]
        kept = set(range(len(r["input_ids"]))) - set(r["masked_lm_positions"])
        assert {r["input_ids"][p] for p in kept} <= vocab
    if objective == "tokens":  # each window, unmasked, without [CLS]/[SEP], is a run of the corpus's ids
        flat = np.array([i for ids in expected for i in ids], dtype=np.int32).tobytes()
        total = 0
        for r in data:
            ids = list(r["input_ids"])
            for pos, label in zip(r["masked_lm_positions"], r["masked_lm_ids"]):
                ids[pos] = label
            window = np.array([i for i in ids[1:-1] if i != 3], dtype=np.int32).tobytes()
            at = flat.find(window)
            while at % 4:  # aligned on a whole id
                at = flat.find(window, at + 1)
            assert at >= 0
            total += len(window) // 4
        assert total == len(flat) // 4  # dupe factor 1: every token once


def test_same_bytes_with_one_and_two_workers_and_either_backend(corpora, tmp_path):
    inputs = [corpora["en"], corpora["zh"]]
    one = run(inputs, tmp_path / "one", workers=1, split_bytes="40KB", max_seq_length=64)
    two = run(inputs, tmp_path / "two", workers=2, split_bytes="40KB", max_seq_length=64)
    hf = run(inputs, tmp_path / "hf", workers=1, split_bytes="40KB", max_seq_length=64, tokenizer_backend="hf")
    assert len(one["shards"]) > 2 and shard_table(one) == shard_table(two) == shard_table(hf)
    assert {b["backend"] for b in one["tokenizer_backend"]} == {"sentencepiece"}
    assert {b["backend"] for b in hf["tokenizer_backend"]} == {"hf"}


def populate_cache(cache: Path, repo: str, files: dict[str, bytes]) -> None:
    """The HF hub cache layout (as tests/test_tokenize_hub.py builds it)."""
    import hashlib

    from test_tokenize_hub import REVISION

    model = cache / f"models--{repo.replace('/', '--')}"
    (model / "refs").mkdir(parents=True)
    (model / "refs" / "main").write_text(REVISION)
    (model / "blobs").mkdir()
    snapshot = model / "snapshots" / REVISION
    snapshot.mkdir(parents=True)
    for name, data in files.items():
        blob = model / "blobs" / hashlib.sha256(data).hexdigest()
        blob.write_bytes(data)
        (snapshot / name).symlink_to(os.path.relpath(blob, snapshot))


def test_hub_names_load_from_the_local_cache(tmp_path, xlmr_like_model):
    """`-t albert-base-v2` and `-t xlm-roberta-base`, offline, from the HF cache: the ALBERT repo's
    spiece.model with its tokenizer_config.json writes the same shards as the model file."""
    cache = tmp_path / "hub"
    populate_cache(cache, "albert-base-v2", {
        "spiece.model": ALBERT_MODEL.read_bytes(),
        "tokenizer_config.json": json.dumps({"tokenizer_class": "AlbertTokenizer", "do_lower_case": True,
                                             "keep_accents": False, "remove_space": True}).encode()})
    populate_cache(cache, "FacebookAI/xlm-roberta-base", {
        "sentencepiece.bpe.model": xlmr_like_model.read_bytes(),
        "tokenizer_config.json": json.dumps({"tokenizer_class": "XLMRobertaTokenizer"}).encode()})
    env = {k: v for k, v in os.environ.items() if not k.startswith("HF_")}
    env.update({"HF_HUB_CACHE": str(cache), "HF_HUB_OFFLINE": "1", "HF_HUB_DISABLE_TELEMETRY": "1"})

    def prepare(out, tokenizer):
        proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", str(SAMPLE_TEXT), "-o", str(out),
                               "-t", tokenizer, "--no-progress", "-j", "1"], capture_output=True, text=True, env=env,
                              cwd=tmp_path, timeout=300)
        assert proc.returncode == 0, proc.stderr
        return json.loads((out / "manifest.json").read_text())

    by_name, by_path = prepare(tmp_path / "name", "albert-base-v2"), prepare(tmp_path / "path", str(ALBERT_MODEL))
    assert shard_table(by_name) == shard_table(by_path) and by_name["config"]["tokenizer"] == "albert-base-v2"
    code = ("from mlm_pipeline.tokenize import TextTokenizer; t = TextTokenizer('FacebookAI/xlm-roberta-base'); "
            "print(t.special.cls, t.special.sep, t.special.pad, t.kind)")
    shown = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, timeout=120)
    assert shown.stdout.split() == ["0", "2", "1", "sentencepiece-model"], shown.stderr


def test_model_type_and_word_marker_say_how_words_start(tmp_path):
    from tokenizers import ByteLevelBPETokenizer, SentencePieceBPETokenizer

    wordpiece = TextTokenizer(str(VOCAB))
    assert (wordpiece.model_type, wordpiece.word_marker) == ("wordpiece", ("continuation", "##"))
    bpe = ByteLevelBPETokenizer()
    bpe.train([str(SAMPLE_TEXT)], vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
              show_progress=False)
    bpe.save(str(tmp_path / "tokenizer.json"))
    byte_level = TextTokenizer(str(tmp_path / "tokenizer.json"))
    assert (byte_level.model_type, byte_level.word_marker) == ("byte-level-bpe", ("start", "\u0120"))
    metaspace = SentencePieceBPETokenizer()  # a tokenizer.json with SentencePiece's ▁ (Metaspace)
    metaspace.train([str(SAMPLE_TEXT)], vocab_size=400, special_tokens=["<s>", "<pad>", "</s>", "<unk>", "<mask>"],
                    show_progress=False)
    metaspace.save(str(tmp_path / "metaspace.json"))
    assert TextTokenizer(str(tmp_path / "metaspace.json")).model_type == "sentencepiece"
    albert = TextTokenizer(str(ALBERT_MODEL))
    cont = albert.is_continuation
    pieces = albert.convert_ids_to_tokens(range(albert.vocab_size))
    assert not cont[[0, 1, 2, 3, 4, 5]].any()  # <pad> <unk> [CLS] [SEP] [MASK] "(": never inside a word
    assert all(cont[i] == (not p.startswith("\u2581")) for i, p in enumerate(pieces) if i >= 13)


def train(tmp_path: Path, name: str, **flags) -> Path:
    """A small model trained here on English and Chinese (deterministic: one thread)."""
    text = WIKITEXT.read_text(encoding="utf-8")[:60_000] + HONGLOUMENG.read_text(encoding="utf-8")[:20_000]
    buf = io.BytesIO()
    sentencepiece.SentencePieceTrainer.train(
        sentence_iterator=iter([line for line in text.splitlines() if line.strip()]), model_writer=buf,
        vocab_size=1000, num_threads=1, character_coverage=0.98, minloglevel=2, **flags)
    path = tmp_path / name
    path.write_bytes(buf.getvalue())
    return path


def test_t5_layout_gets_cls_and_mask_appended(tmp_path, caplog):
    """T5's layout: <pad> 0, </s> 1, <unk> 2, no <s>, no mask piece."""
    model = train(tmp_path, "spiece.model", model_type="unigram", pad_id=0, eos_id=1, unk_id=2, bos_id=-1)
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        tok = TextTokenizer(str(model))
    assert tok.special == spm_special(cls=1000, sep=1, mask=1001, pad=0) and tok.unk_id == 2
    assert tok.convert_ids_to_tokens([0, 1, 2, 1000, 1001]) == ["<pad>", "</s>", "<unk>", "<s>", "<mask>"]
    assert "no piece for <s>, <mask>" in caplog.text and "id 1000, 1001" in caplog.text


def test_a_bpe_model_is_encoded_by_the_library(tmp_path):
    model = train(tmp_path, "bpe.model", model_type="bpe")
    sp = sentencepiece.SentencePieceProcessor(model_file=str(model))
    lines = real_lines()[::13]
    for backend in ("auto", "hf"):  # hf: no conversion of a BPE model, the library encodes
        tok = TextTokenizer(str(model), backend=backend)
        assert tok.encoder.name == "sentencepiece" and tok.model_type == "sentencepiece"
        assert split_ids(*tok.encode_batch(lines)) == sp.encode(lines)
    assert "no HF conversion" in tok.backend_info["fallback_reason"]


def test_accent_stripping_matches_albert_on_every_combining_mark():
    """``strip_combining`` (distinct characters looked up) against ALBERT's loop over characters."""
    import random

    marks = [chr(c) for c in range(0x110000) if unicodedata.combining(chr(c))]
    rng = random.Random(3)
    for _ in range(500):
        text = "".join(rng.choice(marks) if rng.random() < 0.3 else chr(rng.randrange(0x20, 0x30000))
                       for _ in range(40))
        assert spm.strip_combining(text) == "".join(c for c in text if not unicodedata.combining(c))


def test_google_reference_mode_refuses_a_sentencepiece_model(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", str(SAMPLE_TEXT), "-o",
                           str(tmp_path / "out"), "-t", str(ALBERT_MODEL), "--reference", "--no-progress"],
                          capture_output=True, text=True, timeout=300)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "reads a WordPiece vocab.txt" in proc.stderr and "is a SentencePiece model" in proc.stderr


def test_electra_flavor_refuses_a_sentencepiece_model():
    with pytest.raises(TokenizerError, match="needs a WordPiece vocabulary"):
        TextTokenizer(str(ALBERT_MODEL), flavor="electra")


def test_a_file_that_is_not_a_model_is_refused(tmp_path):
    bad = tmp_path / "spiece.model"
    bad.write_bytes(b"\x00not a model at all\xff" * 10)
    with pytest.raises(TokenizerError, match="is not a SentencePiece model"):
        TextTokenizer(str(bad))
