"""The Unigram backend (splintr): ``auto`` takes it for an XLM-R-style ``tokenizer.json`` and the
shards are the bytes HF writes; ALBERT's accent stripping falls back to HF on its own (refused at
build, and caught by the probe set if it were not); a driver that used it does not hang its
workers."""

from __future__ import annotations

import json
import logging
import subprocess
import sys
import textwrap

import numpy as np
import pyarrow.parquet as pq
import pytest

from conftest import DATA, REPO
from mlm_pipeline.tokenize import TextTokenizer, load_tokenizer
from mlm_pipeline.tokenize.backends.hf import HFEncoder
from mlm_pipeline.tokenize.selfcheck import PROBE_SETS, probes_for
from mlm_pipeline.tokenize.unknown_words import HF_CHARS, unknown_word_texts
from test_shard_digests import INPUTS, run_case

pytest.importorskip("splintr", reason="the fast-unigram extra (splintr-rs) is not installed")

from mlm_pipeline.tokenize.backends.splintr import SplintrEncoder  # noqa: E402

XLMR = DATA / "xlmr-unigram-32k-tokenizer.json"
ALBERT_MODEL = DATA / "albert-spm-8k.model"


def albert_tokenizer_json(path, *, keep_accents: bool = False) -> str:
    """ALBERT's ``tokenizer.json`` for ``albert-spm-8k.model`` as ``transformers``' converter
    (5.24, ``AlbertTokenizer``) lays it out: ```` `` ```` and ``''`` made ``"``, NFKD and
    StripAccents unless ``keep_accents``, Lowercase; WhitespaceSplit + Metaspace; the model's
    pieces and scores; ``<pad> <unk> [CLS] [SEP] [MASK]`` as added special tokens."""
    from tokenizers import AddedToken, Tokenizer, models, normalizers, pre_tokenizers

    from mlm_pipeline.tokenize import spm

    model = spm.read_model(str(ALBERT_MODEL))
    tok = Tokenizer(models.Unigram(list(zip(model.pieces, model.scores)), unk_id=model.unk_id, byte_fallback=False))
    steps = [normalizers.Replace("``", '"'), normalizers.Replace("''", '"')]
    if not keep_accents:
        steps += [normalizers.NFKD(), normalizers.StripAccents()]
    tok.normalizer = normalizers.Sequence([*steps, normalizers.Lowercase()])
    tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(),
                                                 pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always")])
    tok.add_special_tokens([AddedToken(t, special=True, normalized=False)
                            for t in ("<pad>", "<unk>", "[CLS]", "[SEP]", "[MASK]")])
    tok.save(str(path))
    return str(path)


def corpus_lines() -> list[str]:
    return [line for p in INPUTS for line in p.read_text(encoding="utf-8").splitlines() if line.strip()]


def split_ids(ids, lengths) -> list[list[int]]:
    return [a.tolist() for a in np.split(ids, np.cumsum(lengths)[:-1])] if len(lengths) else []


def test_auto_takes_splintr_for_an_xlmr_unigram_tokenizer_with_hfs_ids_on_every_bundled_corpus():
    tok = TextTokenizer(str(XLMR))
    assert tok.backend_info == {"backend": "splintr", "version": SplintrEncoder.version(), "requested": "auto"}
    lines = corpus_lines() + list(probes_for("sentencepiece"))
    assert any("\u4e2d" in line for line in lines)  # Chinese (红楼梦) among them
    got = tok.encoder.encode_batch(lines)
    want = HFEncoder(tok.tokenizer, ascii_route=False).encode_batch(lines)
    assert got[0].dtype == np.int32 and got[0].flags.writeable
    assert split_ids(*got) == split_ids(*want)


def test_the_unigram_probe_set_covers_the_hard_cases():
    text = "".join(PROBE_SETS["sentencepiece"])
    for needle in (" <unk> ", "<id>666</id>", "\x85", "\u0301", "\u0488", "\u2581", "a<mask>b", "un<unk>known",
                   "a  b", "\u3000", "1234567890"):
        assert needle in text
    assert set(PROBE_SETS["sentencepiece"]) <= set(probes_for("sentencepiece"))


def test_albert_accent_stripping_is_refused_at_build_with_a_warning(tmp_path, caplog):
    path = albert_tokenizer_json(tmp_path / "albert.json")
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        tok = TextTokenizer(path)
    assert tok.backend_info["backend"] == "hf"
    assert "splintr: UnsupportedConfiguration: splintr strips accents unlike HF" in tok.backend_info["fallback_reason"]
    assert "falls back to hf" in caplog.text and "strips accents" in caplog.text


def test_albert_accent_stripping_would_fail_the_probe_set_if_it_were_not_refused(tmp_path, monkeypatch):
    """The refusal is a shortcut: built anyway, splintr differs from HF on the Unigram probes
    (accents splintr strips otherwise), and the self-check falls back."""
    from mlm_pipeline.tokenize.backends import splintr

    monkeypatch.setattr(splintr, "unsupported", lambda spec: None)
    tok = TextTokenizer(albert_tokenizer_json(tmp_path / "albert.json"))
    assert tok.backend_info["backend"] == "hf"
    assert "splintr: self-check: ids differ from HF on probe" in tok.backend_info["fallback_reason"]


def test_albert_keeping_accents_is_encoded_by_splintr(tmp_path):
    """The refusal is of accent stripping only: ALBERT's layout with keep_accents passes the
    probes, and gives HF's ids on every bundled corpus."""
    tok = TextTokenizer(albert_tokenizer_json(tmp_path / "albert.json", keep_accents=True))
    assert tok.backend_info["backend"] == "splintr"
    lines = corpus_lines()
    assert split_ids(*tok.encoder.encode_batch(lines)) == \
        split_ids(*HFEncoder(tok.tokenizer, ascii_route=False).encode_batch(lines))


def test_the_manifest_records_albert_falling_back(tmp_path):
    path = albert_tokenizer_json(tmp_path / "albert.json")
    load_tokenizer.cache_clear()
    try:
        _, manifest = run_case(dict(objective="tokens", format="parquet", reference=False, do_whole_word_mask=False,
                                    dupe_factor=1, inputs=[str(INPUTS[1])], tokenizer=path),
                               tmp_path / "out", 1, with_manifest=True)
    finally:
        load_tokenizer.cache_clear()
    (entry,) = manifest["tokenizer_backend"]
    assert entry["backend"] == "hf" and "strips accents" in entry["fallback_reason"]


OBJECTIVES = [
    dict(objective="packed", format="parquet", do_whole_word_mask=True),
    dict(objective="packed", format="tfrecord", do_whole_word_mask=False),
    dict(objective="tokens", format="parquet", do_whole_word_mask=False, dupe_factor=1),
    dict(objective="nsp", format="parquet", do_whole_word_mask=False),
    dict(objective="sop", format="parquet", do_whole_word_mask=True),
]


@pytest.mark.parametrize("case", OBJECTIVES, ids=lambda c: f"{c['objective']}-{c['format']}-"
                         f"{'wwm' if c['do_whole_word_mask'] else 'tok'}")
def test_splintr_and_hf_write_the_same_bytes_on_every_bundled_corpus(case, tmp_path):
    """``--tokenizer-backend hf`` and the default (splintr) give byte-identical shards for the
    XLM-R-style Unigram on English and Chinese inputs."""
    case = dict(reference=False, tokenizer=str(XLMR), **case)
    load_tokenizer.cache_clear()
    try:
        fast, manifest = run_case(case, tmp_path / "auto", 1, with_manifest=True)
        hf, hf_manifest = run_case(case, tmp_path / "hf", 1, with_manifest=True, tokenizer_backend="hf")
    finally:
        load_tokenizer.cache_clear()
    assert {b["backend"] for b in manifest["tokenizer_backend"]} == {"splintr"}
    assert {b["backend"] for b in hf_manifest["tokenizer_backend"]} == {"hf"}
    assert fast and fast == hf


def test_whole_word_masking_keys_off_the_word_start_marker(tmp_path):
    """``▁`` starts a word: every other piece continues one, and whole-word masking masks a word
    whole or not at all (in a packed Parquet run of the XLM-R-style tokenizer; a word cut by the
    start of an instance starts after its special token)."""
    tok = TextTokenizer(str(XLMR))
    assert tok.word_marker == ("start", "\u2581")
    for piece, cont in (("\u2581the", False), ("ing", True), ("<s>", False), ("<mask>", False), ("\u2581", False)):
        assert tok.is_continuation[tok.tokenizer.token_to_id(piece)] == cont, piece
    load_tokenizer.cache_clear()
    try:
        run_case(dict(objective="packed", format="parquet", reference=False, do_whole_word_mask=True,
                      tokenizer=str(XLMR), inputs=[str(INPUTS[0])]), tmp_path / "out", 1)
    finally:
        load_tokenizer.cache_clear()
    table = pq.read_table(sorted((tmp_path / "out" / "shards").glob("*.parquet"))[0]).to_pylist()
    split_words = 0
    for row in table[:300]:
        ids = list(row["input_ids"])
        positions = list(row["masked_lm_positions"])
        for p, original in zip(positions, row["masked_lm_ids"]):
            ids[p] = original
        masked = set(positions)
        cont = tok.is_continuation[np.asarray(ids)]
        special = np.isin(ids, tok.special_id_array)
        for p in masked:  # the word's other pieces are masked with it (a text may start mid-word)
            if cont[p] and not special[p - 1]:
                assert p - 1 in masked
            if p + 1 < len(ids) and cont[p + 1]:
                assert p + 1 in masked
        split_words += sum(1 for p in masked if cont[p])
    assert split_words > 0  # words of several pieces were masked


@pytest.mark.parametrize("method", ["fork", "spawn"])
def test_a_driver_that_used_splintr_does_not_hang_its_workers(method, tmp_path):
    """The driver loads the tokenizer (splintr passes the self-check, encoding the probes), then
    two local-pool workers, forked or spawned, encode with splintr too; the run ends in time."""
    script = textwrap.dedent(f"""
        import json, sys
        from mlm_pipeline.executors import local
        from mlm_pipeline.tokenize import load_tokenizer
        local.start_method = lambda: {method!r}
        tok = load_tokenizer({str(XLMR)!r})
        assert tok.backend_info["backend"] == "splintr", tok.backend_info
        tok.encode_batch(["used in the driver", "\\u4e2d\\u6587"] * 2500)  # past the size splintr batches in parallel
        from mlm_pipeline.config import build_config
        from mlm_pipeline.pipeline import run_prepare
        manifest = run_prepare(build_config({{
            "inputs": {[str(p) for p in INPUTS]!r}, "output": {str(tmp_path / "out")!r},
            "tokenizer": {str(XLMR)!r}, "split_bytes": "256KiB", "block_bytes": "128KiB", "objective": "tokens",
            "dupe_factor": 1, "workers": 2, "progress": False}}), show_progress=False)
        print(json.dumps(manifest["tokenizer_backend"]))
    """)
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=180,
                          cwd=REPO)
    assert done.returncode == 0, done.stderr[-2000:]
    backends = json.loads(done.stdout.strip().splitlines()[-1])
    assert {b["backend"] for b in backends} == {"splintr"}


@pytest.mark.parametrize("path", [XLMR, REPO / "sample" / "bert-base-uncased-vocab.txt"], ids=["xlmr", "bert"])
def test_unknown_words_are_hfs_spans_found_in_the_words_that_hold_them(path):
    """The report's unknown words: HF's offsets on only the pieces the fast backend gives an
    unknown token (whitespace words, long ones cut into clauses at punctuation; not whole
    paragraphs, where HF cost more than the task's whole tokenization), the same words as HF's
    offsets on the whole texts, English and Chinese, those of the first pieces up to a character
    budget. Chinese, without spaces, goes to HF a clause at a time, not a line."""
    tok = TextTokenizer(str(path))
    for corpus in (INPUTS[0], INPUTS[2], INPUTS[3]):
        lines = [line for line in corpus.read_text(encoding="utf-8").splitlines() if line.strip()][:4000]
        ids, lens = tok.encode_batch(lines)
        holding = np.flatnonzero(np.bincount(np.repeat(np.arange(len(lines)), lens)[ids == tok.unk_id],
                                             minlength=len(lines)))
        sample = [lines[i] for i in holding[:200]]
        if not sample:
            continue
        whole = [t[a:b] for t, e in zip(sample, tok.tokenizer.encode_batch(sample, add_special_tokens=False))
                 for i, (a, b) in zip(e.ids, e.offsets) if i == tok.unk_id]
        got = tok.unknown_words(sample)
        assert got and got == whole[:len(got)]
        spans = unknown_word_texts(sample, tok.checked.encode_batch, tok.unk_id)
        assert sum(map(len, spans[:-1])) < HF_CHARS
        if corpus == INPUTS[0] and path == XLMR:  # WikiText's <unk> words: a small part of its paragraphs
            assert got == whole and sum(map(len, spans)) < sum(map(len, sample)) / 20
        if corpus == INPUTS[3]:  # 红楼梦: clauses of about a dozen characters, not its lines of hundreds
            assert len(spans) > 100 and sum(map(len, spans)) / len(spans) < 20, (len(spans), spans[:5])
