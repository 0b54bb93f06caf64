"""``sop``'s reference mode against goldens of google-research/albert's create_pretraining_data.py,
and ALBERT's tokenization and reading rules on real data."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given, strategies as st

from conftest import DATA, SAMPLE, VOCAB
from mlm_pipeline.errors import ConfigError, InputError
from mlm_pipeline.instances.albert_reference import (
    AlbertSettings,
    albert_reference_batches,
    gfile_lines,
    read_albert_corpus,
    shuffle_draws,
    shuffled_range,
)
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.tokenize.albert_rules import (
    AlbertSentencePiece,
    is_start_piece,
    preprocess_text,
)

from instances.golden_tools import ALBERT_FEATURES, describe_first_difference, load_golden

GOLDEN = DATA / "golden" / "albert"
SPM_MODEL = DATA / "albert-spm-8k.model"
ZH_EN = DATA / "golden" / "electra" / "zh-en-200KB"
CASES = {
    "sample_text-s128-seed12345": [SAMPLE / "sample_text.txt"],
    "spm-zh-en-200KB-s256-seed7": [ZH_EN / "hongloumeng-zh-200KB.txt", ZH_EN / "wikitext2-train-200KB.txt"],
}
FLAGS = ("max_seq_length", "max_predictions_per_seq", "masked_lm_prob", "dupe_factor", "short_seq_prob",
         "do_whole_word_mask", "ngram", "favor_shorter_ngram", "random_next_sentence", "random_seed")


def _tokenizer(flags: dict, tok):
    if flags["spm_model_file"]:
        return AlbertSentencePiece(str(SPM_MODEL), lower=flags["do_lower_case"])
    assert flags["vocab_file"].endswith("bert-base-uncased-vocab.txt") and flags["do_lower_case"]
    return tok


def _pieces(tokenizer):
    if isinstance(tokenizer, AlbertSentencePiece):
        return lambda ids: [tokenizer.sp.IdToPiece(int(i)) for i in ids]
    return tokenizer.convert_ids_to_tokens


@pytest.mark.parametrize("name", CASES)
def test_matches_golden(name, tok):
    settings, expected = load_golden(GOLDEN, name, ALBERT_FEATURES)
    flags = settings["upstream_flags"]
    assert [i["sha256"] for i in settings["inputs"]] == [__import__("hashlib").sha256(p.read_bytes()).hexdigest()
                                                         for p in CASES[name]]
    tokenizer = _tokenizer(flags, tok)
    out = list(albert_reference_batches([str(p) for p in CASES[name]], tokenizer,
                                        AlbertSettings(**{k: flags[k] for k in FLAGS})))
    batch = InstanceBatch.concat([b for b, _ in out])
    assert len(batch) == settings["examples"] == len(expected["input_ids"])
    # as many numpy draws as upstream made (the golden checked numpy's global state after its run)
    assert out[0][1]["numpy_ngram_draws"] == settings["numpy_choice_calls"]
    actual = batch.padded(flags["max_seq_length"], flags["max_predictions_per_seq"])
    assert set(actual) == set(ALBERT_FEATURES)
    report = describe_first_difference(actual, expected, _pieces(tokenizer), ALBERT_FEATURES)
    assert report is None, f"{name}: reference mode differs from ALBERT's output\n{report}"


def test_golden_difference_is_reported_on_token_boundary(tok):
    _, expected = load_golden(GOLDEN, "sample_text-s128-seed12345", ALBERT_FEATURES)
    actual = {k: v.copy() for k, v in expected.items()}
    actual["token_boundary"][3, 5] ^= 1
    report = describe_first_difference(actual, expected, tok.convert_ids_to_tokens, ALBERT_FEATURES)
    assert "first differing instance: 3 " in report and "feature token_boundary differs, first at column 5" in report


def test_preprocess_text_follows_albert():
    assert preprocess_text("  Café\t\u00a0 NAÏVE  ") == "cafe naive"
    assert preprocess_text("Café", lower=False) == "Cafe"
    assert preprocess_text("\u00a8") == " "  # NFKD gives a space and a combining mark: not blank
    assert preprocess_text("\u0301\u0308") == ""  # combining marks only: "" (a document boundary)
    assert preprocess_text("ﬁ ①") == "fi 1"  # NFKD compatibility forms


@pytest.mark.parametrize("piece, start", [
    ("\u2581the", True), ("ing", False), ("x", False), ("<unk>", True), ("'s", True), ("=", True),
    ("a-b", False), (",", True), ("12", True), ("\u7ea2", True), ("\u2013", True), ("Ab", False), ("\u00e9", True),
])
def test_start_piece_rule(piece, start):
    assert is_start_piece(piece) is start


def test_sentencepiece_ids_are_the_models(tmp_path):
    sp = AlbertSentencePiece(str(SPM_MODEL))
    lines = [preprocess_text(line) for line in ZH_EN.joinpath("wikitext2-train-200KB.txt").read_text().splitlines()[:300]]
    ids, kinds, lengths = sp.encode(lines)
    expected = [i for line in lines for i in sp.sp.encode(line)]
    assert ids.tolist() == expected and lengths.sum() == len(ids)
    assert (sp.cls_id, sp.sep_id, sp.mask_id, sp.vocab_size) == (2, 3, 4, 8000)


def test_digit_comma_rule_on_a_model_whose_pieces_end_so(tmp_path):
    """ALBERT re-encodes a piece ending in digit + ',' without its '▁' and appends ','; the '▁' the
    re-encoding adds stays (upstream's test to drop it compares str with bytes)."""
    import sentencepiece as spm

    text = tmp_path / "text.txt"
    text.write_text("\n".join(f"in 1990, the {w} rose by 12, then fell" for w in ("town", "river", "price")) * 20)
    spm.SentencePieceTrainer.train(input=str(text), model_prefix=str(tmp_path / "m"), vocab_size=24,
                                   user_defined_symbols=["1990,", "12,"], bos_id=-1, eos_id=-1,
                                   minloglevel=2)
    sp = AlbertSentencePiece(str(tmp_path / "m.model"))
    line = "in 1990, the town rose by 12, then fell"
    pieces = sp.sp.EncodeAsPieces(line)
    assert "1990," in pieces and "12," in pieces
    expected = []
    for p in pieces:
        if len(p) > 1 and p[-1] == "," and p[-2].isdigit():
            expected += [*sp.sp.EncodeAsPieces(p[:-1].replace("\u2581", "")), ","]
        else:
            expected.append(p)
    again = sp.sp.EncodeAsPieces("1990")
    assert again[0].startswith("\u2581")  # the '▁' the re-encoding adds, kept
    assert any(expected[i : i + len(again) + 1] == [*again, ","] for i in range(len(expected)))
    ids, kinds, lengths = sp.encode([line])
    assert ids.tolist() == [sp.sp.PieceToId(p) for p in expected] and lengths.tolist() == [len(expected)]
    assert kinds.tolist() == [int(is_start_piece(p)) for p in expected]


def test_gfile_lines(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"one\r\ntw\ro\n\nlast")
    assert list(gfile_lines(str(f))) == ["one", "two", "", "last"]
    f.write_bytes(b"ok\n\xff\xfe bad\n")
    with pytest.raises(InputError, match="line 2 is not valid UTF-8"):
        list(gfile_lines(str(f)))


def test_a_file_boundary_is_not_a_document_boundary(tmp_path, tok):
    a, b = tmp_path / "a.txt", tmp_path / "b.txt"
    a.write_text("the cat sat .\nit was red .\n")
    b.write_text("so it went .\n\n   \nanother one .\n\u0301\n")
    from mlm_pipeline.instances.albert_reference import _WordPiece

    corpus = read_albert_corpus([str(a), str(b)], _WordPiece(tok, None))
    # a's two lines and b's first make one document; the blank lines end it; "\u0301" alone is
    # stripped by Google's tokenizer to nothing: no sentence, no boundary
    assert np.diff(corpus.doc_offsets).tolist() == [3, 1]
    corpus = read_albert_corpus([str(b), str(a)], AlbertSentencePiece(str(SPM_MODEL)))
    # SentencePiece path: "\u0301" prepares to "" and starts a new document, here followed by a's lines
    assert np.diff(corpus.doc_offsets).tolist() == [1, 1, 2]


@given(st.integers(0, 2**32 - 1), st.lists(st.integers(0, 600), max_size=8))
def test_inlined_shuffles_draw_as_cpython(seed, sizes):
    import random

    ours, theirs = random.Random(seed), random.Random(seed)
    for n in sizes:
        x = list(range(n))
        theirs.shuffle(x)
        assert shuffled_range(ours, n) == x
        theirs.shuffle(list(range(n)))
        shuffle_draws(ours, n)
    assert ours.getstate() == theirs.getstate()


def test_settings_are_validated():
    with pytest.raises(ConfigError, match="np.random.seed"):
        AlbertSettings(random_seed=-1)
    with pytest.raises(ConfigError, match="ngram"):
        AlbertSettings(ngram=0)
    assert AlbertSettings(ngram=2).ngram_cdf() == [float.fromhex("0x1.5555555555555p-1"), 1.0]
    assert AlbertSettings().ngram_cdf() == [float.fromhex("0x1.1745d1745d175p-1"), float.fromhex("0x1.a2e8ba2e8ba2fp-1"), 1.0]
    assert AlbertSettings(favor_shorter_ngram=False).ngram_cdf()[:2] == [
        float.fromhex("0x1.745d1745d1746p-3"), float.fromhex("0x1.d1745d1745d18p-2")]


def _cli(*args, code=0):
    import subprocess
    import sys

    proc = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", *map(str, args)], capture_output=True,
                          text=True)
    assert proc.returncode == code, proc.stderr
    return proc


def test_albert_command_line_as_written(tmp_path):
    """ALBERT's own flags (as in its README) with --objective sop --reference write the golden's
    examples, every feature, in order; --do_permutation is refused with the reason."""
    settings, expected = load_golden(GOLDEN, "sample_text-s128-seed12345", ALBERT_FEATURES)
    out = tmp_path / "out"
    _cli(f"--input_file={SAMPLE / 'sample_text.txt'}", f"--output_file={out}", f"--vocab_file={VOCAB}",
         "--do_lower_case=true", "--max_seq_length=128", "--max_predictions_per_seq=20", "--dupe_factor=2",
         "--random_seed=12345", "--do_whole_word_mask=True", "--ngram=3", "--favor_shorter_ngram=True",
         "--random_next_sentence=False", "--do_permutation=False", "--objective", "sop", "--reference",
         "--no-progress")
    from mlm_pipeline.formats.tfrecord import read_tfrecord_features

    shards = sorted(out.rglob("*.tfrecord"))
    assert len(shards) == 1
    features = read_tfrecord_features(str(shards[0]))
    assert set(features) == set(ALBERT_FEATURES)
    for name in ALBERT_FEATURES:
        assert np.array_equal(features[name], expected[name]), name
    refused = _cli("x.txt", "-o", tmp_path / "no", "-t", VOCAB, "--objective", "sop", "--do_permutation", code=2)
    assert "--do_permutation, ALBERT's permuted-token targets, is not" in refused.stderr


def test_spm_model_file_names_the_tokenizer(tmp_path):
    from mlm_pipeline.config import build_config

    config = build_config({"inputs": ["a.txt"], "output": "out", "tokenizer": "albert-spm-8k.vocab",
                           "spm_model_file": str(SPM_MODEL), "objective": "sop", "reference": True})
    assert config.tokenizer == str(SPM_MODEL) and config.do_whole_word_mask
    assert not build_config({"inputs": ["a.txt"], "output": "out", "tokenizer": "v.txt"}).do_whole_word_mask
    with pytest.raises(ConfigError, match="random-next-sentence"):
        build_config({"inputs": ["a.txt"], "output": "out", "tokenizer": "v.txt", "random_next_sentence": True})


def test_albert_command_line_with_sentencepiece(tmp_path):
    """ALBERT's command line with --spm_model_file (its --vocab_file is not read) reproduces the
    SentencePiece golden through prepare: two files read as one corpus, in the order given."""
    settings, expected = load_golden(GOLDEN, "spm-zh-en-200KB-s256-seed7", ALBERT_FEATURES)
    out = tmp_path / "out"
    inputs = ",".join(str(p) for p in CASES["spm-zh-en-200KB-s256-seed7"])
    _cli(f"--input_file={inputs}", f"--output_file={out}", f"--vocab_file={tmp_path / 'not-read.vocab'}",
         f"--spm_model_file={SPM_MODEL}", "--do_lower_case=true", "--max_seq_length=256",
         "--max_predictions_per_seq=40", "--dupe_factor=1", "--random_seed=7", "--objective", "sop", "--reference",
         "--no-progress")
    from mlm_pipeline.formats.tfrecord import read_tfrecord_features

    (shard,) = sorted(out.rglob("*.tfrecord"))
    features = read_tfrecord_features(str(shard))
    assert len(features["input_ids"]) == settings["examples"]
    for name in ALBERT_FEATURES:
        assert np.array_equal(features[name], expected[name]), name
