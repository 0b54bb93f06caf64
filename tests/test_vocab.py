"""``mlm-pipeline vocab``: a deterministic WordPiece vocabulary by character coverage, on real text."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer

from conftest import DATA, WIKITEXT
from mlm_pipeline.errors import ConfigError
from mlm_pipeline.vocab import VocabSettings, iter_corpus_documents, train_vocab

CHINESE = DATA / "hongloumeng-300KB.txt"
REFERENCE_VOCAB = DATA / "golden" / "electra" / "zh-en-wordpiece-vocab.txt"
SETTINGS = VocabSettings(vocab_size=8000)


@pytest.fixture(scope="module")
def split_corpus(tmp_path_factory) -> tuple[Path, list[str]]:
    """Every 10th non-blank line of the Chinese and English text held back; the rest to train on."""
    folder = tmp_path_factory.mktemp("corpus")
    held: list[str] = []
    for src in (CHINESE, WIKITEXT):
        train = []
        for i, line in enumerate(src.read_text(encoding="utf-8").splitlines()):
            if line.strip() and i % 10 == 0:
                held.append(line.strip())
            else:
                train.append(line)
        (folder / src.name).write_text("\n".join(train) + "\n", encoding="utf-8")
    return folder, held


@pytest.fixture(scope="module")
def trained(split_corpus, tmp_path_factory):
    folder, _ = split_corpus
    out = tmp_path_factory.mktemp("vocab") / "tokenizer.json"
    report = train_vocab(iter_corpus_documents([str(folder)]), str(out), SETTINGS)
    return out, report


def unk_rate(tok: Tokenizer, lines: list[str]) -> float:
    unk = tok.token_to_id("[UNK]")
    ids = [i for enc in tok.encode_batch(lines, add_special_tokens=False) for i in enc.ids]
    return sum(i == unk for i in ids) / len(ids)


def test_unk_rate_on_held_back_lines_is_low_and_beats_the_hf_trained_vocab(split_corpus, trained):
    _, held = split_corpus
    ours = unk_rate(Tokenizer.from_file(str(trained[0])), held)
    reference = unk_rate(BertWordPieceTokenizer(str(REFERENCE_VOCAB), lowercase=True)._tokenizer, held)
    assert ours < 0.005, ours
    assert ours < reference, (ours, reference)


def test_alphabet_is_chosen_by_character_coverage(trained):
    _, report = trained
    assert report.character_coverage >= SETTINGS.character_coverage
    assert report.alphabet_size < report.distinct_characters  # the rarest characters are left out
    assert report.vocab_size == SETTINGS.vocab_size and report.merges > 0


def test_both_scripts_tokenized_sensibly_and_vocab_txt_equals_tokenizer_json(trained):
    out, _ = trained
    tok = Tokenizer.from_file(str(out))
    text = "贾雨村风尘怀闺秀 The tower was unbelievably tall."
    tokens = tok.encode(text, add_special_tokens=False).tokens
    assert tokens[:7] == list("贾雨村风尘怀闺")  # CJK: one character a token
    assert "the" in tokens and "tower" in tokens
    assert any(t.startswith("##") for t in tokens)  # a rarer word in word pieces
    assert "[UNK]" not in tokens
    # prepare takes either file: vocab.txt gives the same ids
    from_txt = BertWordPieceTokenizer(str(out.parent / "vocab.txt"), lowercase=True)._tokenizer
    lines = [text, "第一回　甄士隐梦幻识通灵", "Valkyria Chronicles III is a tactical role @-@ playing game"]
    assert [e.ids for e in from_txt.encode_batch(lines)] == [e.ids for e in tok.encode_batch(lines)]


def test_training_is_deterministic_across_processes(split_corpus, trained, tmp_path):
    """HF's trainer gives another vocabulary per run; ours is the same bytes, whatever the hash seed."""
    folder, _ = split_corpus
    out = tmp_path / "again"
    code = ("import sys; from mlm_pipeline.vocab import *; "
            "train_vocab(iter_corpus_documents([sys.argv[1]]), sys.argv[2], VocabSettings(vocab_size=8000))")
    env = {**os.environ, "PYTHONHASHSEED": "123"}
    subprocess.run([sys.executable, "-c", code, str(folder), str(out)], check=True, env=env)
    first = trained[0].parent
    assert (out / "vocab.txt").read_bytes() == (first / "vocab.txt").read_bytes()
    assert (out / "tokenizer.json").read_bytes() == (first / "tokenizer.json").read_bytes()


def test_memory_bound_prunes_rare_words_deterministically(split_corpus, tmp_path):
    folder, _ = split_corpus
    settings = VocabSettings(vocab_size=4000, max_words=2000)
    a = train_vocab(iter_corpus_documents([str(folder)]), str(tmp_path / "a"), settings)
    b = train_vocab(iter_corpus_documents([str(folder)]), str(tmp_path / "b"), settings)
    assert a.pruned_words > 0 and a.distinct_words <= settings.max_words
    assert (tmp_path / "a" / "vocab.txt").read_bytes() == (tmp_path / "b" / "vocab.txt").read_bytes()


def test_electra_flavor_deletes_other_characters(tmp_path):
    docs = [["caf\u00e9 na\u00efve \u200bzero\u200bwidth \ue000private"]] * 3
    train_vocab(docs, str(tmp_path / "e"), VocabSettings(vocab_size=200, flavor="electra", lowercase=False,
                                                        min_frequency=1))
    tok = Tokenizer.from_file(str(tmp_path / "e" / "tokenizer.json"))
    assert tok.normalizer.normalize_str("a\u200bb\ue000c\u00e9") == "abc\u00e9"  # C* gone, accents kept


def test_bad_input_gives_a_clear_error_and_no_output(tmp_path):
    empty = tmp_path / "empty.txt"
    empty.write_text("\n\n", encoding="utf-8")
    with pytest.raises(ConfigError, match="no text"):
        train_vocab(iter_corpus_documents([str(empty)]), str(tmp_path / "out"), SETTINGS)
    assert not (tmp_path / "out").exists()
    with pytest.raises(ConfigError, match="vocab-size"):
        train_vocab([["红楼梦是一部小说 " * 3]], str(tmp_path / "out2"), VocabSettings(vocab_size=8, min_frequency=1))
    with pytest.raises(ConfigError, match="coverage"):
        VocabSettings(character_coverage=0)


def test_cli_vocab_then_prepare_takes_either_file(tmp_path):
    """``mlm-pipeline vocab`` writes both files; ``prepare -t`` takes each and gives the same shards."""
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app

    runner = CliRunner()
    out = tmp_path / "tok"
    result = runner.invoke(app, ["vocab", str(CHINESE), str(WIKITEXT), "-o", str(out), "--vocab-size", "6000"])
    assert result.exit_code == 0, result.output
    assert "6000 entries" in result.output and (out / "tokenizer.json").is_file() and (out / "vocab.txt").is_file()
    digests = []
    for tok in ("tokenizer.json", "vocab.txt"):
        result = runner.invoke(app, ["prepare", str(CHINESE), "-o", str(tmp_path / tok), "-t", str(out / tok),
                                     "-j", "1", "--no-progress"])
        assert result.exit_code == 0, result.output
        manifest = json.loads((tmp_path / tok / "manifest.json").read_text())
        digests.append([s["sha256"] for s in manifest["shards"]])
    assert digests[0] == digests[1]
    bad = runner.invoke(app, ["vocab", str(CHINESE), "-o", str(tmp_path / "bad"), "--vocab-size", "0"])
    assert bad.exit_code == 2 and "vocab size" in bad.output and not (tmp_path / "bad").exists()


def test_an_output_it_cannot_write_is_refused_before_the_corpus_is_read(tmp_path):
    """A wrong -o is said at once (exit 2, no traceback), not after counting a whole corpus."""
    from mlm_pipeline.errors import ConfigError

    def never_read():
        raise AssertionError("the corpus was read before the output was checked")
        yield

    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(ConfigError, match="afile is a file: -o takes a directory, or a path ending in .json"):
        train_vocab(never_read(), str(afile), VocabSettings())
    with pytest.raises(ConfigError, match=r"cannot write the vocabulary into .*afile"):
        train_vocab(never_read(), str(afile / "under" / "tok"), VocabSettings())
    from typer.testing import CliRunner

    from mlm_pipeline.cli import app

    result = CliRunner().invoke(app, ["vocab", str(CHINESE), "-o", str(afile), "--vocab-size", "6000"])
    assert result.exit_code == 2 and "afile is a file" in result.output and "Traceback" not in result.output


def test_inputs_it_skips_are_named(tmp_path, caplog):
    """As prepare does: an empty file and a vocab.txt among the inputs are skipped with a warning."""
    import shutil

    from conftest import VOCAB

    folder = tmp_path / "mixed"
    folder.mkdir()
    shutil.copy(VOCAB, folder / "vocab.txt")
    (folder / "empty.txt").write_text("")
    shutil.copy(CHINESE, folder / "novel.txt")
    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        docs = list(iter_corpus_documents([str(folder)]))
    assert docs and f"skipping {folder / 'vocab.txt'} (vocabulary)" in caplog.text
    assert f"skipping {folder / 'empty.txt'} (empty_file)" in caplog.text


def test_a_vocab_short_of_the_size_asked_says_why(trained, tmp_path, caplog):
    """The merges stop when no pair is seen --min-frequency times: on a small corpus the vocab is
    far below --vocab-size, which a model config built with that size would not match. Warned,
    and recorded in vocab-report.json; a corpus big enough gives the size and no warning."""
    import logging

    from conftest import SAMPLE_TEXT

    _, report = trained
    assert report.vocab_size == SETTINGS.vocab_size and report.short_of_size is None
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        small = train_vocab(iter_corpus_documents([str(SAMPLE_TEXT)]), str(tmp_path / "v" / "tokenizer.json"),
                            VocabSettings(vocab_size=30522))
    assert small.vocab_size < 1000
    why = (f"{small.vocab_size:,} entries, fewer than the 30,522 asked: no pair of pieces is seen 2 times "
           "(--min-frequency) any more")
    assert small.short_of_size.startswith(why) and any(why in r.getMessage() for r in caplog.records)
    assert json.loads((tmp_path / "v" / "vocab-report.json").read_text())["short_of_size"] == small.short_of_size


def _small_corpus(tmp_path: Path) -> Path:
    """The first 200 KB of WikiText-2 (whole lines): a vocabulary of 3,000 in a second."""
    text = WIKITEXT.read_bytes()
    path = tmp_path / "wikitext-200KB.txt"
    path.write_bytes(text[:text.index(b"\n", 200_000) + 1])
    return path


def test_a_write_that_fails_leaves_no_half_written_file_and_the_rerun_writes_them(tmp_path, monkeypatch):
    """A disk filling up while ``vocab`` wrote left a whole ``tokenizer.json`` beside a ``vocab.txt``
    cut short, which ``prepare -t`` took without complaint. The files are written under temporary
    names and renamed once every one is whole: a write that fails leaves the files of an earlier
    run as they were and no temporary file, and the rerun writes them."""
    import errno
    import pathlib

    corpus = _small_corpus(tmp_path)
    settings = VocabSettings(vocab_size=3000)
    train_vocab(iter_corpus_documents([str(corpus)]), str(tmp_path / "clean"), settings)
    out = tmp_path / "out"
    train_vocab(iter_corpus_documents([str(corpus)]), str(out), VocabSettings(vocab_size=2000))  # an earlier run
    before = {p.name: p.read_bytes() for p in out.iterdir()}
    real = pathlib.Path.write_text

    def disk_full_halfway(self, data, *args, **kwargs):  # the second file's write: half of it, then no space
        if "vocab.txt" in self.name:
            real(self, data[: len(data) // 2], *args, **kwargs)
            raise OSError(errno.ENOSPC, "No space left on device")
        return real(self, data, *args, **kwargs)

    monkeypatch.setattr(pathlib.Path, "write_text", disk_full_halfway)
    with pytest.raises(ConfigError, match="No space left on device"):
        train_vocab(iter_corpus_documents([str(corpus)]), str(out), settings)
    assert {p.name: p.read_bytes() for p in out.iterdir()} == before  # whole, and of one run
    monkeypatch.undo()
    train_vocab(iter_corpus_documents([str(corpus)]), str(out), settings)
    assert sorted(p.name for p in out.iterdir()) == ["tokenizer.json", "vocab-report.json", "vocab.txt"]
    for name in ("tokenizer.json", "vocab.txt"):
        assert (out / name).read_bytes() == (tmp_path / "clean" / name).read_bytes()
    assert len((out / "vocab.txt").read_text(encoding="utf-8").splitlines()) == 3000
