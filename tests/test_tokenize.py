"""``TextTokenizer.encode_batch``: the ids of the plain tokenizer, whichever backend and route.

Every test runs with each backend (HF, and the fast one). With HF, plain-ASCII texts skip the
Rust ``BertNormalizer`` (lower-cased in Python instead, see ``backends.hf.AsciiPath``). These
tests compare every text's ids with what the unmodified HF tokenizer gives for it, on the
bundled real corpora and on generated text aimed at the cases where routes or backends could
part: control characters, added-token strings in any case, non-ASCII text interleaved with
ASCII, over-long words.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import DATA, SAMPLE_TEXT, VOCAB, WIKIEXTRACTOR, WIKITEXT
from mlm_pipeline.tokenize import TextTokenizer, load_tokenizer

BACKENDS = ["hf", "nanotoken"]


@pytest.fixture(params=BACKENDS)
def tok(request):
    """The bert-base-uncased tokenizer with each backend (it must really be that backend)."""
    loaded = load_tokenizer(str(VOCAB), True, backend=request.param)
    assert loaded.encoder.name == request.param
    return loaded


def plain_ids(tok: TextTokenizer, texts: list[str]) -> list[list[int]]:
    """What the tokenizer itself gives, normaliser included, one text at a time."""
    return [e.ids for e in tok.tokenizer.encode_batch(texts, add_special_tokens=False)]


def encoded_ids(tok: TextTokenizer, texts: list[str]) -> list[list[int]]:
    ids, lengths = tok.encode_batch(texts)
    assert ids.dtype == np.int32 and lengths.dtype == np.int64 and len(lengths) == len(texts)
    assert int(lengths.sum()) == len(ids)
    return [part.tolist() for part in np.split(ids, np.cumsum(lengths)[:-1])] if texts else []


def lines_of(path, limit: int | None = None) -> list[str]:
    with open(path, encoding="utf-8") as f:
        lines = [line.strip() for line in f if line.strip()]
    return lines[:limit]


def fast_share(tok: TextTokenizer, texts: list[str]) -> float:
    take, _ = tok.reference._ascii.split(texts)
    return len(take) / len(texts)


@pytest.mark.parametrize(
    "path, min_fast, max_fast",
    [
        (WIKITEXT, 0.7, 0.9),  # English with names in other scripts and accents
        (SAMPLE_TEXT, 0.95, 1.0),
        (WIKIEXTRACTOR, 0.5, 1.0),
        (DATA / "hongloumeng-300KB.txt", 0.0, 0.01),  # Chinese: everything takes the full route
    ],
)
def test_real_corpora_give_the_plain_tokenizers_ids(tok, path, min_fast, max_fast):
    texts = lines_of(path)
    # the share checks that both routes are really exercised by this data
    assert min_fast <= fast_share(tok, texts) <= max_fast
    assert encoded_ids(tok, texts) == plain_ids(tok, texts)


@pytest.mark.parametrize("backend", BACKENDS)
def test_cased_vocabulary_skips_lower_casing(backend):
    cased = TextTokenizer(str(VOCAB), do_lower_case=False, backend=backend)
    assert cased.encoder.name == backend
    assert cased.reference._ascii is not None and not cased.reference._ascii.lowercase
    texts = lines_of(WIKITEXT, 2000) + ["Hello World", "HELLO", "[MASK] x [mask]"]
    assert encoded_ids(cased, texts) == plain_ids(cased, texts)


EDGE_CASES = [
    "",
    "   ",
    "The Quick BROWN fox.",
    "tab\there\x0bvertical\x0cfeed",  # \x0b and \x0c are deleted, not spaces
    "nul\x00in\x01the\x1fmiddle\x7fdel",
    "[MASK] is special",
    "lower [mask] and [Mask] are not",
    "glued[SEP]tokens[CLS]",
    "x" * 99 + " " + "y" * 100 + " " + "z" * 101,  # WordPiece's 100-character word limit
    "caf\u00e9 na\u00efve",  # accents: full route
    "\u4e2d\u6587 and ascii",
    "a\u00a0b",  # no-break space
    "emoji \U0001f600 here",
    "UPPER-case, hyphen-ated; punct!?",
]


def test_edge_cases_in_any_order(tok):
    assert encoded_ids(tok, EDGE_CASES) == plain_ids(tok, EDGE_CASES)
    reordered = EDGE_CASES[::-1] + EDGE_CASES
    assert encoded_ids(tok, reordered) == plain_ids(tok, reordered)


def test_texts_with_control_or_added_tokens_take_the_full_route(tok):
    texts = ["plain text", "[MASK] here", "[mask] here", "ctrl\x01", "tab\tok", "caf\u00e9"]
    take, normalised = tok.reference._ascii.split(texts)
    assert take == [0, 4]
    assert normalised == ["plain text", "tab\tok"]


@pytest.mark.parametrize("backend", BACKENDS)
def test_added_tokens_are_checked_in_any_case(tmp_path, backend):
    """A lower-case added token ("<mask>") is matched in the raw text only: "<MASK>" must not
    become it after lower-casing in Python."""
    from tokenizers import Tokenizer

    custom = Tokenizer.from_str(load_tokenizer(str(VOCAB)).tokenizer.to_str())
    custom.add_special_tokens(["<mask>"])
    custom.save(str(tmp_path / "tokenizer.json"))
    cased_token = TextTokenizer(str(tmp_path / "tokenizer.json"), backend=backend)
    assert cased_token.encoder.name == backend
    assert cased_token.reference._ascii is not None and cased_token.reference._ascii.lowercase
    texts = ["<MASK> upper", "<mask> lower", "x<Mask>y", "plain words"]
    assert encoded_ids(cased_token, texts) == plain_ids(cased_token, texts)
    assert cased_token.reference._ascii.split(texts)[0] == [3]


def test_batches_larger_than_one_tokenizer_call(tok):
    from mlm_pipeline import tokenize

    texts = lines_of(WIKITEXT, 3 * tokenize.ENCODE_BATCH + 17)
    assert encoded_ids(tok, texts) == plain_ids(tok, texts)


def test_tokenizers_without_bert_normaliser_use_the_plain_route(tmp_path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.train_from_iterator(lines_of(WIKITEXT, 2000), trainers.BpeTrainer(
        vocab_size=1000, special_tokens=["<s>", "</s>", "<mask>", "<unk>"]))
    bpe.save(str(tmp_path / "tokenizer.json"))
    tok = TextTokenizer(str(tmp_path / "tokenizer.json"))
    assert tok.reference._ascii is None
    # no fast backend takes it: nanotoken is WordPiece-only, and fastokens has no token for a byte
    # this small vocabulary lacks (a tab in the probes), where HF gives <unk>; the reason says so
    reason = tok.backend_info["fallback_reason"]
    assert tok.encoder.name == "hf" and "nanotoken" in reason and "fastokens: self-check" in reason
    texts = lines_of(WIKITEXT, 300)
    assert encoded_ids(tok, texts) == plain_ids(tok, texts)


_PIECES = st.one_of(
    st.text(alphabet=st.characters(min_codepoint=0, max_codepoint=127), max_size=30),
    st.sampled_from(["[MASK]", "[mask]", "[Sep]", "[UNK]", "[PAD]x", "\u00e9", "\u4e2d", "\u00a0",
                     "\x00", "\ufffd", " ", "\t", "\n", "##", "don't", "U.S.A."]),
    st.text(max_size=5),
)


@pytest.mark.parametrize("backend", BACKENDS)
def test_generated_text_gives_the_plain_tokenizers_ids(backend):
    tok = load_tokenizer(str(VOCAB), True, backend=backend)

    @settings(max_examples=200, deadline=None)
    @given(st.lists(st.lists(_PIECES, max_size=6).map("".join), max_size=12))
    def check(texts):
        assert encoded_ids(tok, texts) == plain_ids(tok, texts)

    check()


@pytest.fixture(scope="module")
def cased_vocab(tmp_path_factory):
    """bert-base-uncased's entries with every fourth word capitalised: a cased vocabulary."""
    words = VOCAB.read_text(encoding="utf-8").split("\n")
    path = tmp_path_factory.mktemp("cased") / "vocab.txt"
    path.write_text("\n".join(w.capitalize() if i % 4 == 0 and not w.startswith("[") else w
                              for i, w in enumerate(words)), encoding="utf-8")
    return path


def test_case_mismatch_between_vocab_and_do_lower_case_is_named(cased_vocab, tmp_path, caplog):
    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.tokenize import case_mismatch

    assert case_mismatch(load_tokenizer(str(VOCAB), True)) is None
    assert "uncased" in case_mismatch(load_tokenizer(str(VOCAB), False))
    assert "is cased" in case_mismatch(load_tokenizer(str(cased_vocab), True))
    assert case_mismatch(load_tokenizer(str(cased_vocab), False)) is None
    # a model directory whose tokenizer_config.json says do_lower_case false: the flag's default is overridden
    model = tmp_path / "cased-model"
    model.mkdir()
    (model / "vocab.txt").write_bytes(cased_vocab.read_bytes())
    (model / "tokenizer_config.json").write_text('{"do_lower_case": false}')
    assert case_mismatch(load_tokenizer(str(model), True)) is None
    # prepare says it before any work (Google's --do_lower_case=False with an uncased vocab)
    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        manifest = run_prepare(PrepareConfig(inputs=[str(SAMPLE_TEXT)], output=str(tmp_path / "out"), tokenizer=str(VOCAB),
                                             do_lower_case=False, workers=1, progress=False), show_progress=False)
    assert "drop --no-do-lower-case" in caplog.text
    assert manifest["totals"]["unk_tokens"] > 0.05 * manifest["totals"]["tokens"]  # what it costs on real text


def test_do_lower_case_given_with_a_tokenizer_json_is_said_to_have_no_effect(tmp_path, caplog):
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.run.state import start_run

    load_tokenizer(str(VOCAB)).tokenizer.save(str(tmp_path / "tokenizer.json"))  # lower-cases by its normalizer
    settings = dict(inputs=[str(SAMPLE_TEXT)], tokenizer=str(tmp_path / "tokenizer.json"), progress=False)
    with caplog.at_level("WARNING", logger="mlm_pipeline"):
        start_run(PrepareConfig(output=str(tmp_path / "default"), **settings))
        assert "no effect" not in caplog.text
        start_run(PrepareConfig(output=str(tmp_path / "given"), do_lower_case=False, **settings))
    assert "--do-lower-case/--no-do-lower-case has no effect" in caplog.text


@pytest.mark.parametrize("flavor", ["bert", "electra"])
def test_a_file_that_is_no_tokenizer_is_named_with_what_a_tokenizer_is(tmp_path, flavor):
    """A text file given as the vocab said HF's "sep_token not found in the vocabulary"; a valid
    JSON file that is no tokenizer (a vocab report) a JSON parse error. Both now say what the
    file is and what a tokenizer must be."""
    from mlm_pipeline.errors import TokenizerError

    what = r"a tokenizer is a WordPiece vocab.txt \(one token per line, with \[CLS\], \[SEP\], \[MASK\] and \[UNK\]\)"
    with pytest.raises(TokenizerError, match=rf"{SAMPLE_TEXT} looks like text \(\d+ of its first \d+ lines hold several "
                                             rf"words\), not a vocabulary; {what}"):
        TextTokenizer(str(SAMPLE_TEXT), flavor=flavor)
    report = tmp_path / "vocab-report.json"
    report.write_text('{"vocab_size": 8000, "unk_rate": 0.01, "top_unknown": []}\n')
    with pytest.raises(TokenizerError, match=rf"{report} is JSON but not a tokenizer.json \(it holds vocab_size, "
                                             rf"unk_rate, top_unknown; .*\); {what}"):
        TextTokenizer(str(report), flavor=flavor)
    broken = tmp_path / "tokenizer.json"
    broken.write_text('{"model": ')
    with pytest.raises(TokenizerError, match=rf"{broken} is not a tokenizer.json: not valid JSON"):
        TextTokenizer(str(broken), flavor=flavor)
    words = tmp_path / "vocab.txt"  # one token per line but no BERT specials
    words.write_text("\n".join(["the", "a", "cat", "##s"]) + "\n")
    with pytest.raises(TokenizerError, match=rf"{words} is no BERT vocabulary: it has no line \[CLS\], \[SEP\], "
                                             rf"\[MASK\], \[UNK\]; {what}"):
        TextTokenizer(str(words), flavor=flavor)
