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
from mlm_pipeline.tokenize import load_tokenizer


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
