"""Reading and tokenizing like create_pretraining_data.py: TF's line reader, Google's tokenizer."""

from __future__ import annotations

import pytest

from mlm_pipeline.errors import TokenizerError
from mlm_pipeline.instances.reference_text import (
    read_reference_documents,
    reference_continuation_table,
    split_reference_lines,
    tokenize_reference_documents,
    vocab_strings,
)
from mlm_pipeline.tokenize import load_tokenizer, read_google_vocab

from conftest import VOCAB

from .google_tokenizer import code_point_probes, google_ids, mark_runs, write_char_vocab


def test_lines_are_cut_like_tf_readline():
    # TF's line reader ends lines at \n only and drops every \r, also inside a line.
    assert split_reference_lines("a b\r\nc\rd\x0be\u2028f\n\r\ng") == ["a b", "cd\x0be\u2028f", "", "g"]


def test_documents_split_on_lines_that_strip_to_nothing():
    lines = ["", " first one ", "\t", "second", "more", "\x1c", "", "third", ""]
    assert read_reference_documents(lines) == [["first one"], ["second", "more"], ["third"]]
    assert read_reference_documents([]) == []


def test_tokenize_drops_empty_sentences_and_documents(tok):
    docs = [["\x00\u200b", "Hello there."], ["\ufffd"], ["A [SEP] b", "x" * 150]]
    out = tokenize_reference_documents(docs, tok)
    assert len(out) == 2
    assert [len(d) for d in out] == [1, 2]
    toks = tok.convert_ids_to_tokens
    assert toks(out[0][0]) == ["hello", "there", "."]
    # Google's tokenizer has no special-token matching and a 200-character word limit.
    assert toks(out[1][0]) == ["a", "[", "sep", "]", "b"]
    assert "[UNK]" not in toks(out[1][1])


def test_word_final_capital_sigma_lowercases_like_python(tok):
    # Google lower-cases with str.lower ("ΟΔΟΣ" -> "οδος"); HF alone would give "οδοσ".
    out = tokenize_reference_documents([["ΟΔΟΣ ΣΑΣ\u00adΣ."]], tok)
    assert tok.convert_ids_to_tokens(out[0][0]) == ["ο", "##δ", "##ος", "σ", "##α", "##σ", "##ς", "."]


def test_continuation_table_uses_the_reference_rule(tok):
    vocab = tok.tokenizer.get_vocab()
    strings = sorted(vocab, key=vocab.get)
    table = reference_continuation_table(strings)
    assert table[vocab["##ing"]] and table[vocab["###"]] and not table[vocab["#"]]
    assert table.sum() == sum(s.startswith("##") for s in strings)


def test_vocab_ids_must_be_line_numbers(tmp_path):
    words = ["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "cat", "the"]  # "the" twice
    (tmp_path / "vocab.txt").write_text("\n".join(words) + "\n", encoding="utf-8")
    tokenizer = load_tokenizer(str(tmp_path / "vocab.txt"), True)
    with pytest.raises(TokenizerError, match="without duplicate entries"):
        vocab_strings(tokenizer)


def test_private_use_characters_make_their_word_unk_like_googles_tokenizer(tok):
    """Google's text cleaning keeps private-use characters (it drops Cc and Cf only), so a word
    holding one matches no WordPiece and is [UNK]; HF's drops them. As Google's FullTokenizer
    (google-research/bert, tokenization.py) gives: ['private', 'use', '[UNK]', 'here', '.']."""
    out = tokenize_reference_documents([["Private use \ue000 here.", "ab\U000f0001cd and \uf8ff."]], tok)
    assert tok.convert_ids_to_tokens(out[0][0]) == ["private", "use", "[UNK]", "here", "."]
    assert tok.convert_ids_to_tokens(out[0][1]) == ["[UNK]", "and", "[UNK]", "."]


@pytest.fixture(scope="module")
def char_vocab(tmp_path_factory):
    return write_char_vocab(tmp_path_factory.mktemp("char-vocab") / "vocab.txt")


@pytest.mark.parametrize("lower", [True, False])
def test_every_code_point_tokenizes_like_googles_tokenizer(lower, char_vocab):
    """Each code point between two letters and alone, over all of Unicode, and runs of combining
    marks give the words of Google's FullTokenizer with Python's tables (the oracle in
    ``google_tokenizer.py``). HF's tables alone differ on some 760 assigned characters, every
    private-use one, the capitals of Unicode 15-16 (Rust lower-cases them) and the order of marks
    whose combining class they give otherwise."""
    tokenizer = load_tokenizer(str(char_vocab), lower)
    vocab = read_google_vocab(str(char_vocab))
    sentences = code_point_probes() + mark_runs()
    got = tokenize_reference_documents([sentences], tokenizer)[0]
    assert len(got) == len(sentences)
    wrong = [s for s, ids in zip(sentences, got) if ids.tolist() != google_ids(s, vocab, lower, "bert")]
    assert not wrong, f"{len(wrong)} sentences, first {ascii(wrong[0])}"


def test_sentences_of_recent_characters_mixed_with_plain_ones(tok):
    """Routed sentences keep their places among the fast encoder's (a document of each kind)."""
    docs = [["Plain text here.", "Mark a\u0898b and \u2e43 dash.", "More plain text."], ["\u0890", "x\u0890y"]]
    out = tokenize_reference_documents(docs, tok)
    toks = [[tok.convert_ids_to_tokens(s) for s in d] for d in out]
    # U+0898 is a non-spacing mark (stripped), U+2E43 punctuation, U+0890 a format character (deleted)
    assert toks == [[["plain", "text", "here", "."], ["mark", "ab", "and", "[UNK]", "dash", "."], ["more", "plain", "text", "."]],
                    [["x", "##y"]]]


def test_text_whose_characters_agree_is_never_routed():
    """Accents, dashes, quotes, Greek and Chinese split alike in both tables: nothing is routed,
    and the tokenizer for routed text is never built (it costs about 0.2 s)."""
    from mlm_pipeline.instances.reference_text import _google_router

    _google_router.cache_clear()  # a router of its own: no other test's routed text
    tok = load_tokenizer(str(VOCAB), True)
    docs = [["Café – “naïve” façade", "Ελληνικά κείμενα.", "中国人 第一"]]
    out = tokenize_reference_documents(docs, tok)
    router = _google_router(tok)
    assert [tok.convert_ids_to_tokens(s)[:2] for s in out[0]] == [["cafe", "–"], ["ε", "##λ"], ["中", "国"]]
    assert router.routed(docs[0]) == [] and "google" not in vars(router)
    assert router.routed(["ab\ue000", "plain", "x\u2e43"]) == [0, 2]


def test_a_vocab_without_unk_encodes_a_routed_sentence_google_can(tmp_path):
    """Google's tokenizer deletes U+0890 (a format character HF's tables do not know): with a
    vocab that has no [UNK], ``hello .`` is encoded, not refused for HF's sake."""
    (tmp_path / "vocab.txt").write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\nhello\n.\n", encoding="utf-8")
    tokenizer = load_tokenizer(str(tmp_path / "vocab.txt"), True)
    assert tokenize_reference_documents([["hello \u0890 ."]], tokenizer)[0][0].tolist() == [4, 5]


def test_a_tokenizer_that_is_not_googles_is_warned_about(tmp_path, caplog):
    """--reference splits like Google's only with Google's BERT tokenizer as HF writes it; another
    (here: accents kept while lower-casing) gets one warning before any task. The bundled vocab
    and the electra flavor (ELECTRA's rules by construction) get none."""
    import logging

    from tokenizers.implementations import BertWordPieceTokenizer

    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.instances.reference_text import google_tokenizer_warning
    from mlm_pipeline.run.state import start_run

    custom = BertWordPieceTokenizer(str(VOCAB), lowercase=True, strip_accents=False)
    custom.save(str(tmp_path / "tokenizer.json"))
    other = load_tokenizer(str(tmp_path / "tokenizer.json"), True)
    assert "is not Google's BERT tokenizer as HF writes it" in google_tokenizer_warning(other)
    assert google_tokenizer_warning(load_tokenizer(str(VOCAB), True)) is None
    assert google_tokenizer_warning(load_tokenizer(str(VOCAB), True, "electra")) is None
    text = tmp_path / "in.txt"
    text.write_text("Café au lait.\nNaïve art.\n\nSecond document here.\nIt has two lines.\n", encoding="utf-8")
    with caplog.at_level(logging.WARNING, logger="mlm_pipeline"):
        start_run(PrepareConfig(inputs=[str(text)], output=str(tmp_path / "o"), tokenizer=str(tmp_path / "tokenizer.json"),
                                reference=True, progress=False))
    assert [r.getMessage() for r in caplog.records if "--reference: the tokenizer" in r.getMessage()] == [
        google_tokenizer_warning(other)]
