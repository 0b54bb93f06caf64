"""ELECTRA objective: reference mode against goldens of google-research/electra's
build_pretraining_dataset.py, default mode within tolerances of them, the builder's rules on
scripted draws, and the ELECTRA tokenizer flavor against a plain implementation of its rules."""

from __future__ import annotations

import gzip
import hashlib
import json
import shutil
import unicodedata
from pathlib import Path

import numpy as np
import pytest
from tokenizers.implementations import BertWordPieceTokenizer

from mlm_pipeline.errors import ConfigError, InputError, TokenizerError
from mlm_pipeline.instances.base import TokenizedDocs
from mlm_pipeline.instances.electra import (
    FEATURES,
    ElectraStats,
    ExampleBuilder,
    build_electra_instances,
    build_with_draws,
    check_settings,
    electra_reference_examples,
    examples_to_batch,
    list_corpus_files,
    next_target,
    output_file_index,
    output_file_name,
    padded_features,
    plan_example,
    read_gfile_lines,
    round_robin_rows,
    shuffled_files,
)
from mlm_pipeline.tokenize import load_tokenizer, read_google_vocab

from .google_tokenizer import code_point_probes, code_points_sample, electra_ids, electra_words, mark_runs, write_char_vocab

ROOT = Path(__file__).resolve().parents[2]
GOLDEN = ROOT / "tests" / "data" / "golden" / "electra"
SAMPLE = ROOT / "sample"
ZH_EN_VOCAB = GOLDEN / "zh-en-wordpiece-vocab.txt"
BERT_VOCAB = SAMPLE / "bert-base-uncased-vocab.txt"
CASES = {
    "sample_text-s128-seed12345": (BERT_VOCAB, [SAMPLE / "sample_text.txt"]),
    "zh-en-200KB-s128-seed7": (ZH_EN_VOCAB, sorted((GOLDEN / "zh-en-200KB").iterdir())),
}


def corpus_dir(name: str, tmp_path: Path) -> Path:
    """A copy of the golden's corpus files in a directory of their own (ELECTRA reads a directory)."""
    d = tmp_path / "corpus"
    d.mkdir()
    for f in CASES[name][1]:
        shutil.copy(f, d / f.name)
    return d


def load_golden(name: str) -> tuple[dict, list[dict]]:
    settings = json.loads((GOLDEN / f"{name}.json").read_text())
    with gzip.open(GOLDEN / f"{name}.jsonl.gz", "rt", encoding="utf-8") as f:
        rows = [json.loads(line) for line in f]
    return settings, rows


def tokenizer_for(name: str, settings: dict):
    vocab = CASES[name][0]
    assert hashlib.sha256(vocab.read_bytes()).hexdigest() == settings["vocab_sha256"]
    return load_tokenizer(str(vocab), settings["do_lower_case"], "electra")


def reference_run(name: str, tmp_path: Path):
    settings, rows = load_golden(name)
    files = list_corpus_files(str(corpus_dir(name, tmp_path)))
    stats = ElectraStats()
    examples = list(
        electra_reference_examples(
            files,
            tokenizer_for(name, settings),
            max_seq_length=settings["max_seq_length"],
            random_seed=settings["seed"],
            stats=stats,
        )
    )
    return settings, rows, files, examples, stats


# --------------------------------------------------------------------------------------------
# Reference mode: every golden example, file for file
# --------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(CASES))
def test_reference_reproduces_every_golden_example(name, tmp_path):
    settings, rows, files, examples, _ = reference_run(name, tmp_path)
    # the inputs are the golden's, read in the golden's (shuffled) order
    order = shuffled_files(files, settings["seed"])
    assert [Path(f).name for f in order] == [f["name"] for f in settings["input_files"]]
    for url, meta in zip(order, settings["input_files"]):
        assert hashlib.sha256(Path(url).read_bytes()).hexdigest() == meta["sha256"]

    assert len(examples) == settings["examples"] == len(rows)
    features = padded_features(examples_to_batch(examples), settings["max_seq_length"])
    num_out_files = settings["num_out_files"]
    made = []  # (file name, example index) in golden row order: by file index, then record
    for i, indices in enumerate(round_robin_rows(len(examples), num_out_files)):
        made += [(output_file_name(i, num_out_files), int(n)) for n in indices]
    assert len(made) == len(rows)
    for row_number, ((file_name, n), row) in enumerate(zip(made, rows)):
        assert file_name == row["file"], f"row {row_number}"
        assert output_file_index(n, num_out_files) == int(file_name.split("-")[1])
        for feature in FEATURES:
            assert features[feature][n].tolist() == row[feature], f"row {row_number} ({file_name}), {feature}"
    assert features["input_ids"].dtype == np.int64
    # every non-empty output file of the golden, with its example count
    counts = {output_file_name(i, num_out_files): len(ix) for i, ix in enumerate(round_robin_rows(len(examples)))}
    assert {f["file"]: f["examples"] for f in settings["output_files"]} == {k: v for k, v in counts.items() if v}


def test_round_robin_output_files():
    assert round_robin_rows(5, 2)[0].tolist() == [0, 2, 4]
    assert round_robin_rows(5, 2)[1].tolist() == [1, 3]
    assert [r.tolist() for r in round_robin_rows(2, 3)] == [[0], [1], []]
    assert output_file_name(7) == "pretrain_data.tfrecord-7-of-1000"
    assert output_file_name(3, 7) == "pretrain_data.tfrecord-3-of-7"
    assert output_file_index(2345) == 345
    with pytest.raises(ConfigError, match="num-out-files"):
        round_robin_rows(5, 0)
    with pytest.raises(ConfigError, match="num-out-files"):
        check_settings(max_seq_length=128, num_out_files=0)
    with pytest.raises(ConfigError, match="max-seq-length"):
        check_settings(max_seq_length=4)


# --------------------------------------------------------------------------------------------
# Reading like ELECTRA
# --------------------------------------------------------------------------------------------


def test_gfile_lines_split_at_newline_only_and_drop_every_carriage_return(tmp_path):
    f = tmp_path / "a.txt"
    f.write_bytes(b"a\r\nb\rc\n  d \x0b\n\n" + "\u3000e\u2028".encode() + b"\nlast")
    assert read_gfile_lines(str(f)) == ["a", "bc", "d", "", "e", "last"]
    f.write_bytes(b"x\n\n")
    assert read_gfile_lines(str(f)) == ["x", ""]  # a final newline starts no extra line
    f.write_bytes(b"")
    assert read_gfile_lines(str(f)) == []
    f.write_bytes(b"ok\nbad \xff byte\n")
    with pytest.raises(InputError, match="line 2 is not valid UTF-8"):
        read_gfile_lines(str(f))


def test_corpus_directory_is_listed_flat_in_code_point_order(tmp_path):
    for name in ("b.txt", "B.txt", "a.txt", ".hidden", "é.txt"):
        (tmp_path / name).write_text("x\n")
    assert [Path(f).name for f in list_corpus_files(str(tmp_path))] == [".hidden", "B.txt", "a.txt", "b.txt", "é.txt"]
    (tmp_path / "sub").mkdir()
    with pytest.raises(InputError, match="sub-directories \\(sub\\)"):
        list_corpus_files(str(tmp_path))
    empty = tmp_path / "sub"
    with pytest.raises(InputError, match="empty"):
        list_corpus_files(str(empty))
    with pytest.raises(InputError, match="not one"):
        list_corpus_files(str(tmp_path / "a.txt"))


def test_file_shuffle_is_pythons_seeded_shuffle():
    files = [f"f{i}" for i in range(10)]
    import random

    expected = list(files)
    random.Random(3).shuffle(expected)
    assert shuffled_files(files, 3) == expected
    assert shuffled_files(["only"], 3) == ["only"]


def test_reference_flushes_at_each_file_end(tmp_path):
    """Two files without blank lines: each file's end makes an example; nothing spans files."""
    tok = load_tokenizer(str(BERT_VOCAB), True, "electra")
    (tmp_path / "1.txt").write_text("alpha beta gamma\ndelta")
    (tmp_path / "2.txt").write_text("\n\n\nepsilon zeta\n")
    examples = list(
        electra_reference_examples(list_corpus_files(str(tmp_path)), tok, max_seq_length=64, random_seed=0)
    )
    # one example per file (in the shuffled file order), whatever its segments
    words = [set(tok.convert_ids_to_tokens(ids)) - {"[CLS]", "[SEP]"} for ids, _ in examples]
    assert sorted(map(sorted, words)) == [["alpha", "beta", "delta", "gamma"], ["epsilon", "zeta"]]


# --------------------------------------------------------------------------------------------
# The builder's rules, with scripted draws
# --------------------------------------------------------------------------------------------


class Scripted:
    """Draws from fixed lists; fails if the builder asks for a draw the rules do not make."""

    def __init__(self, uniforms, ints=()):
        self.uniforms = list(uniforms)
        self.ints = list(ints)

    def random(self) -> float:
        return self.uniforms.pop(0)

    def randint(self, a: int, b: int) -> int:
        value = self.ints.pop(0)
        assert a <= value <= b
        return value

    def done(self) -> bool:
        return not self.uniforms and not self.ints


def test_coin_is_drawn_only_when_the_first_two_clauses_fail():
    # target 128: first-segment target (128 - 3) // 2 = 62
    draws = Scripted([0.5, 0.3])  # two segments; coin < 0.5: the 20 joins the first segment
    plan = plan_example([50, 20, 5], 128, 128, draws)
    # 5: 70 + 5 >= 62 and the first is no longer below its target: no draw, second segment
    assert plan.to_first == [True, True, False] and draws.done()
    assert (plan.kept_first, plan.kept_second, plan.one_segment) == (70, 5, False)

    draws = Scripted([0.5, 0.7])  # coin >= 0.5: the 20 goes second, the 5 still fits first
    plan = plan_example([50, 20, 5], 128, 128, draws)
    assert plan.to_first == [True, False, True] and draws.done()  # segment A is not contiguous

    draws = Scripted([0.5])  # the first sentence alone is over the target: no coin for it
    plan = plan_example([100, 30, 1], 128, 128, draws)
    assert plan.to_first == [True, False, False] and draws.done()
    assert (plan.kept_first, plan.kept_second) == (100, 25)  # 128 - 100 - 3

    draws = Scripted([0.5, 0.9])  # second segment non-empty: later overflows draw nothing
    plan = plan_example([40, 30, 30, 10], 128, 128, draws)
    assert plan.to_first == [True, False, False, True] and draws.done()


def test_one_segment_and_trimming():
    draws = Scripted([0.09])  # < 0.1: one segment, everything fits the 100000 target
    plan = plan_example([100, 60, 7], 128, 128, draws)
    assert plan.to_first == [True, True, True] and plan.one_segment and draws.done()
    assert (plan.first_total, plan.kept_first, plan.kept_second) == (167, 126, 0)
    # the first-segment target follows the CURRENT target: 20 -> (20 - 3) // 2 = 8
    draws = Scripted([0.5, 0.6])
    plan = plan_example([5, 4, 3, 2], 20, 128, draws)  # 5 + 3 < 8 fails (strict), 5 + 2 fits
    assert plan.to_first == [True, False, False, True] and draws.done()


def test_next_target():
    assert next_target(128, Scripted([0.05])) == (128, False)
    draws = Scripted([0.049], [5])
    assert next_target(128, draws) == (5, True) and draws.done()


def test_builder_blank_lines_and_empty_sentences():
    stats = ElectraStats()
    draws = Scripted([0.5, 0.5])
    b = ExampleBuilder(16, 101, 102, draws, stats)
    assert b.add_line(None) is None  # blank line on an empty buffer: nothing
    assert b.add_line([]) is None  # a line of nothing (e.g. control characters): no flush
    assert b.add_line([1, 2, 3]) is None
    assert b.add_line([]) is None
    # blank line flushes however short; draws: one-segment 0.5 (no), next target 0.5 (no)
    assert b.add_line(None) == ([101, 1, 2, 3, 102], [0] * 5)
    # reaching the target makes the example at once; first-segment target (16 - 3) // 2 = 6
    draws.uniforms += [0.2, 0.7, 0.9]  # two segments; coin 0.7: [5..16] goes second; no random target
    assert b.add_line([1, 2, 3, 4]) is None
    ids, seg = b.add_line(list(range(5, 17)))
    # first [1..4], second [5..16] cut to 16 - 4 - 3 = 9 tokens
    assert ids == [101, 1, 2, 3, 4, 102, 5, 6, 7, 8, 9, 10, 11, 12, 13, 102]
    assert seg == [0] * 6 + [1] * 10
    assert draws.done()
    assert stats.instances == 2 and stats.single_segment == 1
    # a flush (blank line, or a file's end) draws the next target, which the following lines keep
    draws.uniforms += [0.5, 0.01]
    draws.ints += [10]
    assert b.add_line([1, 2, 3]) is None
    assert b.add_line(None) is not None and b.target == 10 and draws.done()
    draws.uniforms += [0.5, 0.99]  # 6 + 6 >= 10: made at once; first target (10 - 3) // 2 = 3
    assert b.add_line([1, 2, 3, 4, 5, 6]) is None
    ids, seg = b.add_line([7, 8, 9, 10, 11, 12])
    assert ids == [101, 1, 2, 3, 4, 5, 6, 102, 7, 8, 9, 10, 11, 12, 102] and b.target == 16
    assert stats.random_target == 1 and draws.done()


# --------------------------------------------------------------------------------------------
# Default mode
# --------------------------------------------------------------------------------------------


def tokenized_docs(files, tok) -> TokenizedDocs:
    """Documents as the text reader gives them: blank lines and file ends separate them."""
    docs: list[list[str]] = []
    for url in files:
        current: list[str] = []
        for line in read_gfile_lines(url):
            if line:
                current.append(line)
            elif current:
                docs.append(current)
                current = []
        if current:
            docs.append(current)
    sentences = [s for d in docs for s in d]
    ids, lens = tok.encode_batch(sentences)
    doc_of = np.repeat(np.arange(len(docs)), [len(d) for d in docs])
    keep = lens > 0
    per_doc = np.bincount(doc_of[keep], minlength=len(docs))
    return TokenizedDocs(ids=ids, sentence_lengths=lens[keep], doc_sentences=per_doc[per_doc > 0])


def summary(batch, stats: ElectraStats) -> dict:
    n = len(batch)
    return {
        "examples": n,
        "mean_length": float(batch.lengths.mean()),
        "single_segment": stats.single_segment / n,
        "random_target": stats.random_target / n,
    }


@pytest.mark.parametrize("name", sorted(CASES))
def test_default_mode_within_tolerances_of_the_golden(name, tmp_path):
    settings, rows, files, examples, ref_stats = reference_run(name, tmp_path)
    ref = summary(examples_to_batch(examples), ref_stats)
    # the golden's own figures (the reference reproduces it, so its stats are the golden's)
    masks = np.array([r["input_mask"] for r in rows])
    segs = np.array([r["segment_ids"] for r in rows])
    assert ref["examples"] == len(rows)
    assert ref["mean_length"] == pytest.approx(masks.sum(1).mean())
    assert ref["single_segment"] == pytest.approx((segs.max(1) == 0).mean())

    tok = tokenizer_for(name, settings)
    docs = tokenized_docs(shuffled_files(files, settings["seed"]), tok)
    batch, stats = build_electra_instances(
        docs,
        max_seq_length=settings["max_seq_length"],
        cls_id=tok.special.cls,
        sep_id=tok.special.sep,
        rng=np.random.default_rng(settings["seed"]),
    )
    got = summary(batch, stats)
    assert abs(got["examples"] - ref["examples"]) <= 0.05 * ref["examples"]
    assert abs(got["mean_length"] - ref["mean_length"]) <= 0.03 * ref["mean_length"]
    assert abs(got["single_segment"] - ref["single_segment"]) <= 0.02
    if ref["examples"] >= 100:
        # with the 8 examples of sample_text one example is 0.125 of this share: no test there
        assert abs(got["random_target"] - ref["random_target"]) <= 0.02


@pytest.mark.parametrize("name", sorted(CASES))
def test_block_builder_with_pythons_draws_makes_the_golden(name, tmp_path):
    """The default builder's logic is the reference's: fed the reference's draw stream it makes
    the golden's examples exactly (so only the random source differs in default mode)."""
    import random

    settings, rows = load_golden(name)
    tok = tokenizer_for(name, settings)
    files = list_corpus_files(str(corpus_dir(name, tmp_path)))
    draws = random.Random(settings["seed"])
    order = list(files)
    draws.shuffle(order)
    L = settings["max_seq_length"]
    batch, _ = build_with_draws(
        tokenized_docs(order, tok), max_seq_length=L, cls_id=tok.special.cls, sep_id=tok.special.sep,
        draws=draws, start_target=L,
    )
    features = padded_features(batch, L)
    assert len(batch) == len(rows)  # fewer than 1000 examples: row n is example n
    for feature in FEATURES:
        assert features[feature].tolist() == [r[feature] for r in rows]


def test_default_mode_draw_rates_over_many_blocks():
    """Pooled over 30 seeds (~17,600 examples): the draws happen at their rates."""
    tok = load_tokenizer(str(ZH_EN_VOCAB), True, "electra")
    docs = tokenized_docs([str(p) for p in CASES["zh-en-200KB-s128-seed7"][1]], tok)
    n = one = rand = 0
    for seed in range(30):
        batch, stats = build_electra_instances(
            docs, max_seq_length=128, cls_id=tok.special.cls, sep_id=tok.special.sep, rng=np.random.default_rng(seed)
        )
        n += stats.instances
        one += stats.one_segment_draws
        rand += stats.random_target
    assert n > 15000
    assert abs(one / n - 0.1) < 0.01  # 4.4 standard deviations
    assert abs(rand / n - 0.05) < 0.008  # 4.8 standard deviations (random targets also shift n)


def test_default_mode_examples_are_well_formed_and_deterministic():
    tok = load_tokenizer(str(ZH_EN_VOCAB), True, "electra")
    docs = tokenized_docs([str(p) for p in CASES["zh-en-200KB-s128-seed7"][1]], tok)
    cls, sep, L = tok.special.cls, tok.special.sep, 128

    def build(seed):
        return build_electra_instances(docs, max_seq_length=L, cls_id=cls, sep_id=sep, rng=np.random.default_rng(seed))

    batch, stats = build(11)
    again, _ = build(11)
    other, _ = build(12)
    assert np.array_equal(batch.input_ids, again.input_ids) and np.array_equal(batch.offsets, again.offsets)
    assert not (len(other) == len(batch) and np.array_equal(other.input_ids, batch.input_ids))
    assert batch.next_sentence_labels is None and len(batch.masked_lm_ids) == 0
    doc_tokens = np.split(docs.ids, np.cumsum(np.add.reduceat(docs.sentence_lengths, docs.doc_offsets[:-1]))[:-1])
    doc_text = [t.tobytes() for t in doc_tokens]
    d = 0
    for i in range(len(batch)):
        row = batch.row(i)
        ids, seg = row["input_ids"], row["segment_ids"]
        assert len(ids) <= L and ids[0] == cls and ids[-1] == sep
        n_a = seg.count(0)
        assert seg == [0] * n_a + [1] * (len(ids) - n_a)
        assert ids[n_a - 1] == sep and sep not in ids[1 : n_a - 1] and sep not in ids[n_a:-1]
        # every token comes from one document, in example order through the documents
        body = np.asarray([t for t in ids if t not in (cls, sep)][:3], np.int32).tobytes()
        while body not in doc_text[d]:
            d += 1
    assert stats.instances == len(batch)
    assert stats.single_segment == sum(1 for i in range(len(batch)) if 1 not in batch.row(i)["segment_ids"])
    # padded, ELECTRA's three features only
    features = padded_features(batch, L)
    assert set(features) == set(FEATURES) and features["input_ids"].shape == (len(batch), L)
    assert (features["input_mask"].sum(1) == batch.lengths).all()


def test_default_mode_empty_block_and_bad_settings():
    empty = TokenizedDocs(ids=np.zeros(0, np.int32), sentence_lengths=np.zeros(0, np.int64), doc_sentences=np.zeros(0, np.int64))
    batch, stats = build_electra_instances(empty, max_seq_length=128, cls_id=2, sep_id=3, rng=np.random.default_rng(0))
    assert len(batch) == 0 and stats.instances == 0 and batch.next_sentence_labels is None
    with pytest.raises(ConfigError):
        build_electra_instances(empty, max_seq_length=4, cls_id=2, sep_id=3, rng=np.random.default_rng(0))


# --------------------------------------------------------------------------------------------
# The tokenizer flavor: ELECTRA's rules, written out plainly here as the oracle
# --------------------------------------------------------------------------------------------

ADVERSARIAL = [
    "Héllo WÖRLD, naïve café",  # accents: stripped only when lower-casing
    "ÅNGSTRÖM İstanbul ǅ",  # İ lower-cases to i + U+0307
    "ΟΔΥΣΣΕΥΣ ΣΑΣ Σ. ΑΣ.Α aΣ\u00adb",  # capital sigma: final form by context; soft hyphen is Cf
    "a\u200bb c\u200dd e\ufeffg",  # zero-width space/joiner, BOM: format (Cf), deleted
    "x\ue000y \U000f0000z \U00100001",  # private use (Co): ELECTRA deletes, BERT keeps
    "p\u0378q r\U000e0080s \U0003134bt",  # unassigned (Cn): deleted
    "ctl\x01\x02\x7f\x85end\x00\ufffd",  # controls, NUL, U+FFFD
    "tab\tnew\nline\rcr\u3000ideo\u00a0nbsp\u2028ls\u2029ps",  # whitespace of every kind
    "中文汉字\U0002b820\U0002b91f\U0002cea1混合english",  # CJK incl. the range HF misses
    "\U0001f600 emoji❤️ ⸻ ꧁ ᐀ \u166d",  # symbols, new punctuation, re-categorised U+166D
    "[SEP] [MASK] [CLS]text",  # special tokens are plain text to ELECTRA
    "a" * 150 + " " + "b" * 201,  # WordPiece's 200-character limit
    "e\u0301 \u0065\u0301\u0323 \U00011938 ᾯ \u1fef",  # combining marks, NFD patch, Greek
    "",
    "   ",
]


@pytest.mark.parametrize("lower", [True, False])
def test_flavor_matches_electra_rules_on_adversarial_strings(lower):
    tok = load_tokenizer(str(ZH_EN_VOCAB), lower, "electra")
    vocab = read_google_vocab(str(ZH_EN_VOCAB))
    ids, lens = tok.encode_batch(ADVERSARIAL)
    got = [part.tolist() for part in np.split(ids, np.cumsum(lens)[:-1])]
    assert got == [electra_ids(t, vocab, lower) for t in ADVERSARIAL]
    bert_vocab = read_google_vocab(str(BERT_VOCAB))  # a vocab with Latin accents and Greek
    tok = load_tokenizer(str(BERT_VOCAB), lower, "electra")
    ids, lens = tok.encode_batch(ADVERSARIAL)
    got = [part.tolist() for part in np.split(ids, np.cumsum(lens)[:-1])]
    assert got == [electra_ids(t, bert_vocab, lower) for t in ADVERSARIAL]


def test_flavor_differs_from_bert_where_electra_does():
    electra = load_tokenizer(str(BERT_VOCAB), True, "electra")
    bert = load_tokenizer(str(BERT_VOCAB), True)
    text = ["ca\u0378t"]  # unassigned (Cn): HF's BERT normalizer keeps it ([UNK]), ELECTRA deletes it
    assert electra.convert_ids_to_tokens(electra.encode_batch(text)[0]) == ["cat"]
    assert "[UNK]" in bert.convert_ids_to_tokens(bert.encode_batch(text)[0])
    cased_e = load_tokenizer(str(BERT_VOCAB), False, "electra")
    # without lower-casing ELECTRA keeps accents (é is not in this uncased vocab: [UNK])
    assert cased_e.convert_ids_to_tokens(cased_e.encode_batch(["café"])[0]) == ["[UNK]"]
    assert electra.convert_ids_to_tokens(electra.encode_batch(["café"])[0]) == ["cafe"]
    assert electra.fingerprint != bert.fingerprint
    assert load_tokenizer(str(BERT_VOCAB), True, "bert").fingerprint == bert.fingerprint  # default: bert


@pytest.mark.parametrize("lower", [True, False])
def test_flavor_matches_electra_rules_on_the_golden_inputs(lower):
    vocab = read_google_vocab(str(ZH_EN_VOCAB))
    tok = load_tokenizer(str(ZH_EN_VOCAB), lower, "electra")
    lines = [line for p in CASES["zh-en-200KB-s128-seed7"][1] for line in read_gfile_lines(str(p))]
    lines += read_gfile_lines(str(SAMPLE / "sample_text.txt"))
    ids, lens = tok.encode_batch(lines)
    got = [part.tolist() for part in np.split(ids, np.cumsum(lens)[:-1])]
    assert got == [electra_ids(t, vocab, lower) for t in lines]


@pytest.mark.parametrize("lower", [True, False])
def test_flavor_normalizes_every_code_point_like_electra(lower):
    """Each code point alone and between two letters, over all of Unicode (Python's tables)."""
    hf = load_tokenizer(str(ZH_EN_VOCAB), lower, "electra").tokenizer
    code_points = code_points_sample()
    for start in range(0, len(code_points), 8192):
        text = " ".join(f"a{chr(cp)}b {chr(cp)}" for cp in code_points[start : start + 8192])
        words = [w for w, _ in hf.pre_tokenizer.pre_tokenize_str(hf.normalizer.normalize_str(text))]
        assert words == electra_words(text, lower), f"code points from U+{code_points[start]:04X}"


@pytest.mark.parametrize("lower", [True, False])
def test_flavor_gives_electras_ids_on_every_code_point_and_runs_of_marks(lower, tmp_path):
    """With a vocab of single characters (ids show every word): each code point between two
    letters and alone, and runs of combining marks, give ELECTRA's ids. HF's NFD alone, with its
    older combining classes, ordered 1,046 of these runs otherwise."""
    path = write_char_vocab(tmp_path / "vocab.txt")
    tok = load_tokenizer(str(path), lower, "electra")
    vocab = read_google_vocab(str(path))
    texts = code_point_probes() + mark_runs()
    ids, lens = tok.encode_batch(texts)
    got = np.split(ids, np.cumsum(lens)[:-1])
    wrong = [t for t, g in zip(texts, got) if g.tolist() != electra_ids(t, vocab, lower)]
    assert not wrong, f"{len(wrong)} texts, first {ascii(wrong[0])}"


def test_a_tokenizer_json_or_model_directory_sets_the_flavors_case_and_accents(tmp_path):
    """Its BertNormalizer (or a directory's tokenizer_config.json) says whether to lower-case and
    strip accents, as for the bert flavor: lower-casing without stripping is ELECTRA's
    --no-strip-accents, with its ids on every code point and the runs of marks. The flavor took
    the vocab alone and lower-cased and stripped by --do-lower-case (the default: on)."""
    path = write_char_vocab(tmp_path / "vocab.txt")
    vocab = read_google_vocab(str(path))
    texts = code_point_probes() + mark_runs()
    model_dir = tmp_path / "model"
    model_dir.mkdir()
    (model_dir / "vocab.txt").write_bytes(path.read_bytes())
    (model_dir / "tokenizer_config.json").write_text('{"do_lower_case": true, "strip_accents": false}')
    for lower, strip in ((True, False), (False, False), (True, True)):
        json_path = tmp_path / f"tokenizer-{lower}-{strip}.json"
        BertWordPieceTokenizer(str(path), lowercase=lower, strip_accents=strip).save(str(json_path))
        for given in ([json_path, model_dir] if (lower, strip) == (True, False) else [json_path]):
            tok = load_tokenizer(str(given), not lower, "electra")  # (the flag says otherwise: the file wins)
            ids, lens = tok.encode_batch(texts)
            wrong = [t for t, g in zip(texts, np.split(ids, np.cumsum(lens)[:-1]))
                     if g.tolist() != electra_ids(t, vocab, lower, strip)]
            assert not wrong, (given.name, lower, strip, len(wrong), ascii(wrong[0]))
            assert tok.lowercases is lower


def test_flavor_from_tokenizer_json_and_bad_vocabularies(tmp_path):
    hf = BertWordPieceTokenizer(str(ZH_EN_VOCAB), lowercase=True)
    hf.save(str(tmp_path / "tokenizer.json"))
    from_json = load_tokenizer(str(tmp_path / "tokenizer.json"), True, "electra")
    from_txt = load_tokenizer(str(ZH_EN_VOCAB), True, "electra")
    texts = ADVERSARIAL + ["贾宝玉 said: Hello!"]
    assert np.array_equal(from_json.encode_batch(texts)[0], from_txt.encode_batch(texts)[0])
    no_unk = tmp_path / "no-unk.txt"
    no_unk.write_text("[PAD]\n[CLS]\n[SEP]\n[MASK]\na\n")
    with pytest.raises(TokenizerError, match="UNK"):
        load_tokenizer(str(no_unk), True, "electra")
    with pytest.raises(TokenizerError, match="flavor"):
        load_tokenizer(str(ZH_EN_VOCAB), True, "roberta")
    from tokenizers import Tokenizer, models

    bpe = Tokenizer(models.BPE(vocab={"a": 0, "[CLS]": 1}, merges=[]))
    bpe.save(str(tmp_path / "bpe.json"))
    with pytest.raises(TokenizerError, match="WordPiece"):
        load_tokenizer(str(tmp_path / "bpe.json"), True, "electra")


def test_google_vocab_reading(tmp_path):
    v = tmp_path / "v.txt"
    v.write_bytes(b"[PAD]\r\n  [UNK] \nx\nx\n\nlast")
    assert read_google_vocab(str(v)) == {"[PAD]": 0, "[UNK]": 1, "x": 3, "": 4, "last": 5}
