"""Long texts encoded in pieces (``tokenize/long_texts.py``): the ids of the whole text.

Each tokenizer family the pipeline meets (BERT's WordPiece with both backends, ELECTRA's rules,
byte-level BPE as RoBERTa's, Unigram with Metaspace as XLM-R's) encodes real text cut at the
chosen places exactly as it encodes the text whole. Small limits make many cuts in a few KB.
"""

from __future__ import annotations

import numpy as np
import pytest

from conftest import DATA, VOCAB, WIKITEXT
from mlm_pipeline.tokenize import load_tokenizer
from mlm_pipeline.tokenize.long_texts import LONG_TEXT_CHARS, cut_points, encode_cut, pieces_of

LIMITS = (300, 1337)


def lines_of(path, limit: int) -> list[str]:
    with open(path, encoding="utf-8") as f:
        return [line.strip() for line in f if line.strip()][:limit]


@pytest.fixture(scope="module")
def english() -> str:
    """WikiText-2 as one line (accents, names in other scripts, `` @-@ `` and runs of punctuation)."""
    return " ".join(lines_of(WIKITEXT, 400))


@pytest.fixture(scope="module")
def chinese() -> str:
    """Chinese text as one line: no space to cut at, only punctuation and ideographs."""
    return "".join(lines_of(DATA / "hongloumeng-300KB.txt", 200))


def whole_and_cut(encode, text: str, limit: int) -> tuple[list[int], list[int]]:
    ids, lens = encode([text])
    cut_ids, cut_lens = encode_cut(encode, [text], limit)
    assert cut_lens.tolist() == [len(cut_ids)]
    return ids.tolist(), cut_ids.tolist()


@pytest.mark.parametrize("backend", ["hf", "nanotoken"])
@pytest.mark.parametrize("flavor", ["bert", "electra"])
@pytest.mark.parametrize("limit", LIMITS)
def test_wordpiece_gives_the_whole_texts_ids(backend, flavor, limit, english, chinese):
    tok = load_tokenizer(str(VOCAB), True, flavor, backend=backend)
    encode = tok.checked.encode_batch
    for text in (english, chinese, "[[" * 5000, "(" + "a.b," * 3000):
        assert len(cut_points(text, limit)) >= len(text) // limit
        whole, cut = whole_and_cut(encode, text, limit)
        assert cut == whole


def _trained(kind: str, tmp_path):
    from tokenizers import Regex, Tokenizer, models, normalizers, pre_tokenizers, trainers

    specials = ["<s>", "</s>", "<mask>", "<pad>", "<unk>"]
    if kind == "bpe":  # RoBERTa's layout
        tok = Tokenizer(models.BPE(unk_token="<unk>"))
        tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        trainer = trainers.BpeTrainer(vocab_size=2000, special_tokens=specials,
                                      initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    else:  # XLM-R's: spaces folded, split at whitespace, then Metaspace
        tok = Tokenizer(models.Unigram())
        tok.normalizer = normalizers.Sequence([normalizers.NFKC(), normalizers.Replace(Regex(" {2,}"), " ")])
        tok.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.WhitespaceSplit(), pre_tokenizers.Metaspace()])
        trainer = trainers.UnigramTrainer(vocab_size=2000, special_tokens=specials, unk_token="<unk>")
    tok.train_from_iterator(lines_of(WIKITEXT, 3000), trainer)
    path = tmp_path / f"{kind}.json"
    tok.save(str(path))
    return load_tokenizer(str(path))


@pytest.mark.parametrize("kind", ["bpe", "unigram"])
def test_bpe_and_unigram_give_the_whole_texts_ids_at_spaces(kind, english, tmp_path):
    tok = _trained(kind, tmp_path)
    for limit in LIMITS:
        text = english + "  double  spaces and  'quotes' it's"
        assert len(cut_points(text, limit)) >= len(text) // limit
        whole, cut = whole_and_cut(tok.checked.encode_batch, text, limit)
        assert cut == whole


def test_a_run_with_no_place_to_cut_is_cut_at_the_limit():
    """The documented difference: a 'word' longer than the window, [UNK] per piece for WordPiece."""
    tok = load_tokenizer(str(VOCAB), True)
    text = "a" * 1150
    assert [len(p) for p in pieces_of(text, 300)] == [300, 300, 300, 250]
    ids, lens = encode_cut(tok.checked.encode_batch, [text], 300)
    assert ids.tolist() == [tok.unk_id] * 4 and lens.tolist() == [4]


def test_pieces_are_bounded_and_join_to_the_text(english, chinese):
    for text in (english, chinese, "x" * 777, english[:299]):
        for limit in LIMITS:
            pieces = pieces_of(text, limit)
            assert "".join(pieces) == text
            assert all(len(p) <= limit for p in pieces)
            assert all(len(p) >= limit // 2 for p in pieces[:-1])


@pytest.mark.parametrize("backend", ["hf", "nanotoken"])
def test_encode_batch_cuts_texts_over_the_limit_with_the_same_ids(backend, english):
    """The pipeline's own call, at its own limit, on a batch mixing short texts and long ones."""
    tok = load_tokenizer(str(VOCAB), True, backend=backend)
    long_text = (english + " ") * (2 * LONG_TEXT_CHARS // len(english) + 1)
    texts = ["a short one .", long_text, "", "[[" * LONG_TEXT_CHARS, "another short one"]
    assert len(long_text) > 2 * LONG_TEXT_CHARS
    ids, lens = tok.encode_batch(texts)
    expected = [e.ids for e in tok.tokenizer.encode_batch(texts, add_special_tokens=False)]
    assert lens.tolist() == [len(e) for e in expected]
    assert ids.tolist() == [i for e in expected for i in e]


def test_hf_calls_are_bounded_in_characters(monkeypatch, english):
    """HF's sub-batches hold at most ENCODE_CHARS characters (or one text), same ids."""
    from mlm_pipeline.tokenize.backends import hf

    tok = load_tokenizer(str(VOCAB), True, backend="hf")
    texts = lines_of(WIKITEXT, 500)
    before = tok.encode_batch(texts)
    monkeypatch.setattr(hf, "ENCODE_CHARS", 2000)
    bounds = hf._sub_batches(texts)
    assert bounds[0][0] == 0 and bounds[-1][1] == len(texts) and len(bounds) > len(texts) * 100 // 2000
    assert all(a == b for (_, a), (b, _) in zip(bounds, bounds[1:]))
    assert all(stop - start == 1 or sum(map(len, texts[start:stop])) <= 2000 for start, stop in bounds)
    after = tok.encode_batch(texts)
    assert np.array_equal(before[0], after[0]) and np.array_equal(before[1], after[1])
