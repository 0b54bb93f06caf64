"""The ``ngram`` and ``span`` masking schemes on real text (WikiText-2): their distributions,
statistically, against ALBERT's algorithm and SpanBERT's settings."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import rng
from mlm_pipeline.instances.nsp import build_nsp_instances
from mlm_pipeline.masking import MaskingSpec, mask_batch, num_to_predict
from mlm_pipeline.masking.base import GeneratorDraws, Selection, not_special
from mlm_pipeline.masking.ngram import ngram_cdf
from mlm_pipeline.masking.span import choose_spans, mean_span_length


def _instances(docs, tok, seq):
    batch, _ = build_nsp_instances(docs, max_seq_length=seq, short_seq_prob=0.1, dupe_factor=1,
                                   cls_id=tok.special.cls, sep_id=tok.special.sep, rng=rng(0))
    return batch


def _spec(tok, scheme, prob, max_pred, **params):
    return MaskingSpec(prob, max_pred, tok.vocab_size, tok.special.mask, tok.special_id_array,
                       params.pop("wwm", True), tok.is_continuation, scheme=scheme, **params)


def _runs(masked, tok):
    """Runs of adjacent masked positions: (flat position of each masked token, run id of each,
    words per run: a run's first token and every non-continuation token start a word)."""
    rows = np.repeat(np.arange(len(masked)), masked.masked_counts)
    pos = masked.offsets[rows] + masked.masked_lm_positions
    new = np.ones(len(pos), dtype=bool)
    new[1:] = pos[1:] != pos[:-1] + 1
    starts = np.flatnonzero(new)
    word_start = ~tok.is_continuation[masked.masked_lm_ids]
    word_start[starts] = True
    return pos, np.cumsum(new) - 1, np.add.reduceat(word_start.astype(np.int64), starts)


def _words_are_whole(plain, masked, tok, *, cross_specials):
    """No word is partly masked. A word: a candidate token and the continuation pieces after it
    (past a special token too, as Google and ALBERT group, when ``cross_specials``)."""
    ids = plain.input_ids
    hit = np.zeros(len(ids), dtype=bool)
    rows = np.repeat(np.arange(len(masked)), masked.masked_counts)
    hit[masked.offsets[rows] + masked.masked_lm_positions] = True
    cand_pos = np.flatnonzero(not_special(ids, tok.special_id_array))
    cand_row = np.searchsorted(plain.offsets, cand_pos, side="right") - 1
    starts = ~tok.is_continuation[ids[cand_pos]]
    starts[0] = True
    starts[1:] |= cand_row[1:] != cand_row[:-1]
    if not cross_specials:
        starts[1:] |= cand_pos[1:] != cand_pos[:-1] + 1
    first = np.flatnonzero(starts)
    h = hit[cand_pos].astype(np.int8)
    return bool(np.all(np.minimum.reduceat(h, first) == np.maximum.reduceat(h, first)))


# ---- ngram ----------------------------------------------------------------------------------


def _albert_ngram_plain(batch, tok, prob, max_pred, ngram, favor, seed):
    """ALBERT's ``create_masked_lm_predictions`` (n-gram branch, whole words) in plain Python,
    written from its documented rules: groups (a continuation piece joins the group before,
    across [SEP] too), candidates = n-gram lists from every group, in random order; per candidate
    n ~ P(n), shortened while it overflows, skipped if it still does or overlaps."""
    g = rng(seed)
    cdf = ngram_cdf(ngram, favor)
    special = set(tok.special_id_array.tolist())
    cont = tok.is_continuation
    chosen = []
    for i in range(len(batch)):
        ids = batch.input_ids[batch.offsets[i]:batch.offsets[i + 1]].tolist()
        groups = []
        for j, t in enumerate(ids):
            if t in special:
                continue
            if groups and cont[t]:
                groups[-1].append(j)
            else:
                groups.append([j])
        k = min(max_pred, max(1, round(len(ids) * prob)), sum(len(x) for x in groups))
        order = g.permutation(len(groups))
        covered, count = set(), 0
        for s in order:
            if count >= k:
                break
            n = int(np.searchsorted(cdf, g.random(), side="right")) + 1
            idx = [p for grp in groups[s:s + n] for p in grp]
            while count + len(idx) > k and n > 1:
                n -= 1
                idx = [p for grp in groups[s:s + n] for p in grp]
            if count + len(idx) > k or covered & set(idx):
                continue
            covered |= set(idx)
            count += len(idx)
        chosen.append(sorted(covered))
    return chosen


def _run_words(chosen_rows, batch, tok):
    runs = []
    for i, cols in enumerate(chosen_rows):
        ids = batch.input_ids[batch.offsets[i]:batch.offsets[i + 1]]
        prev, words = None, 0
        for c in cols:
            if prev is not None and c == prev + 1:
                words += 0 if tok.is_continuation[ids[c]] else 1
            else:
                if prev is not None:
                    runs.append(words)
                words = 1
            prev = c
        if prev is not None:
            runs.append(words)
    return np.array(runs)


@pytest.mark.parametrize("prob", [0.05, 0.15, 0.30])
@pytest.mark.parametrize("favor", [True, False])
def test_ngram_masks_as_albert_does(wikitext_docs, tok, prob, favor):
    """Same masked share, and the same distribution of runs of masked words (lengths 1 to 6+,
    each share within 0.025; mean within 3%), as ALBERT's algorithm run plainly on the same
    instances with its own draws."""
    plain = _instances(wikitext_docs, tok, 128)
    max_pred = 40
    masked, stats = mask_batch(plain, _spec(tok, "ngram", prob, max_pred, favor_shorter_ngram=favor), rng(1))
    _, _, ours = _runs(masked, tok)
    theirs = _run_words(_albert_ngram_plain(plain, tok, prob, max_pred, 3, favor, seed=2), plain, tok)
    k = np.minimum(num_to_predict(plain.lengths, prob, max_pred), plain.lengths - 3)
    assert stats.masked == pytest.approx(k.sum(), rel=0.01)
    assert abs(ours.mean() - theirs.mean()) < 0.03 * theirs.mean(), (ours.mean(), theirs.mean())
    hist = lambda r: np.bincount(np.minimum(r, 6), minlength=7)[1:] / len(r)  # noqa: E731
    assert np.abs(hist(ours) - hist(theirs)).max() < 0.025, (hist(ours), hist(theirs))
    assert _words_are_whole(plain, masked, tok, cross_specials=True)


def test_ngram_probabilities_favour_short_ngrams_as_one_over_n():
    assert np.diff(ngram_cdf(3, True), prepend=0).tolist() == pytest.approx([6 / 11, 3 / 11, 2 / 11])
    assert np.diff(ngram_cdf(3, False), prepend=0).tolist() == pytest.approx([2 / 11, 3 / 11, 6 / 11])
    assert ngram_cdf(2, True).tolist() == pytest.approx([2 / 3, 1.0])


def test_ngram_of_single_words_is_whole_word_masking_in_law(wikitext_docs, tok):
    """--ngram 1: every visit takes one word, as whole-word masking does; the longer n-grams of
    --ngram 3 make longer runs."""
    plain = _instances(wikitext_docs, tok, 128).slice(0, 600)
    one, _ = mask_batch(plain, _spec(tok, "ngram", 0.15, 20, ngram=1), rng(1))
    ww, _ = mask_batch(plain, _spec(tok, "whole-word", 0.15, 20), rng(1))
    three, _ = mask_batch(plain, _spec(tok, "ngram", 0.15, 20), rng(1))
    r1, rw, r3 = (_runs(m, tok)[2].mean() for m in (one, ww, three))
    assert abs(r1 - rw) < 0.05 * rw and r3 > 1.3 * r1


def test_ngram_of_tokens_without_whole_words(wikitext_docs, tok):
    plain = _instances(wikitext_docs, tok, 128).slice(0, 600)
    masked, _ = mask_batch(plain, _spec(tok, "ngram", 0.15, 20, wwm=False), rng(1))
    assert not _words_are_whole(plain, masked, tok, cross_specials=True)  # pieces alone now occur
    assert np.array_equal(masked.masked_counts, num_to_predict(plain.lengths, 0.15, 20))


# ---- span -----------------------------------------------------------------------------------


def test_truncated_geometric_mean_is_spanberts():
    assert mean_span_length(0.2, 1, 10) == pytest.approx(3.797, abs=0.001)
    assert mean_span_length(1.0, 2, 10) == 2.0


@pytest.mark.parametrize("prob", [0.05, 0.15, 0.30])
def test_span_masking_statistics(wikitext_docs, tok, prob):
    """SpanBERT's settings on 512-token instances: the mean span length in whole words within
    10% of the truncated geometric mean (3.80), the masked share the rate within 0.01, the
    80/10/10 choice the same for every token of a span and 80/10/10 over spans."""
    plain = _instances(wikitext_docs, tok, 512)
    masked, stats = mask_batch(plain, _spec(tok, "span", prob, 512), rng(3))
    pos, run, words = _runs(masked, tok)
    assert abs(words.mean() - 3.797) < 0.1 * 3.797, words.mean()
    assert abs(stats.masked / len(plain.input_ids) - prob) < 0.01
    now, orig = masked.input_ids[pos], masked.masked_lm_ids
    kind = np.where(now == tok.special.mask, 0, np.where(now == orig, 2, 1))
    first = np.flatnonzero(np.r_[True, run[1:] != run[:-1]])
    lo, hi = np.minimum.reduceat(kind, first), np.maximum.reduceat(kind, first)
    assert np.count_nonzero(lo != hi) <= 0.002 * len(first)  # (a random id equal to [MASK] or the original)
    shares = np.bincount(lo, minlength=3) / len(first)
    assert abs(shares[0] - 0.8) < 0.02 and abs(shares[1] - 0.1) < 0.02 and abs(shares[2] - 0.1) < 0.02
    assert _words_are_whole(plain, masked, tok, cross_specials=False)


def test_spans_are_contiguous_whole_words_inside_one_segment(wikitext_docs, tok):
    plain = _instances(wikitext_docs, tok, 128)
    spec = _spec(tok, "span", 0.3, 128)
    cand = not_special(plain.input_ids, spec.special_ids)
    k = np.minimum(num_to_predict(plain.lengths, 0.3, 128), plain.lengths - 3)
    chosen = choose_spans(Selection(plain.input_ids, plain.offsets, cand, k, spec), GeneratorDraws(rng(4)))
    assert np.all(np.diff(chosen.positions) > 0) and cand[chosen.positions].all()  # never a special token
    first = np.flatnonzero(np.r_[True, chosen.groups[1:] != chosen.groups[:-1]])
    assert len(np.unique(chosen.groups)) == len(first)  # a span's positions are together
    size = np.diff(np.r_[first, len(chosen.positions)])
    start, end = chosen.positions[first], chosen.positions[first] + size  # one run: no gap, so no [SEP] inside
    assert np.array_equal(np.add.reduceat(np.diff(np.r_[chosen.positions, -1]) == 1, first), size - 1)
    cont = tok.is_continuation[plain.input_ids]
    row_start = np.isin(start, plain.offsets)
    assert np.all(~cont[start] | row_start | ~cand[start - 1])  # starts a word
    assert not np.any(cont[end] & cand[end])  # the next token is no piece of its last word


@pytest.mark.parametrize("scheme", ["ngram", "span"])
def test_schemes_are_seeded(wikitext_docs, tok, scheme):
    plain = _instances(wikitext_docs, tok, 128).slice(0, 300)
    spec = _spec(tok, scheme, 0.15, 20)
    a, _ = mask_batch(plain, spec, rng(9))
    b, _ = mask_batch(plain, spec, rng(9))
    c, _ = mask_batch(plain, spec, rng(10))
    assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.masked_lm_positions, b.masked_lm_positions)
    assert not np.array_equal(a.masked_lm_positions, c.masked_lm_positions)


# ---- prepare: settings, manifest, worker count ----------------------------------------------


def _prepare(tmp_path, name, workers=1, **settings):
    from conftest import SAMPLE_TEXT, VOCAB, WIKITEXT
    from mlm_pipeline.config import build_config
    from mlm_pipeline.pipeline import run_prepare

    config = build_config({"inputs": [str(WIKITEXT), str(SAMPLE_TEXT)], "output": str(tmp_path / name),
                           "tokenizer": str(VOCAB), "split_bytes": "384KiB", "block_bytes": "128KiB",
                           "workers": workers, "progress": False, "random_seed": 5, **settings})
    return run_prepare(config, show_progress=False)


@pytest.mark.parametrize("settings", [
    {"masking_scheme": "ngram"},
    {"masking_scheme": "span", "masked_lm_prob": 0.3, "max_predictions_per_seq": 60, "format": "parquet"},
])
def test_prepare_with_a_scheme_gives_the_same_bytes_with_any_worker_count_and_backend(tmp_path, settings):
    one = _prepare(tmp_path, "one", 1, **settings)
    two = _prepare(tmp_path, "two", 2, **settings)
    hf = _prepare(tmp_path, "hf", 2, tokenizer_backend="hf", **settings)
    assert [s["sha256"] for s in one["shards"]] == [s["sha256"] for s in two["shards"]] \
        == [s["sha256"] for s in hf["shards"]]
    assert len(one["shards"]) >= 2 and one["tasks"] >= 3
    record = one["masking_scheme"]
    assert record["name"] == settings["masking_scheme"] and record["whole_words"] is True
    if record["name"] == "span":
        assert (record["geometric_p"], record["span_lower"], record["span_upper"]) == (0.2, 1, 10)
        hist = one["totals"]["instance_length_histogram"]
        in_instances = sum(int(length) * count for length, count in hist.items())
        assert one["totals"]["masked_tokens"] / in_instances == pytest.approx(0.3, abs=0.01)
    else:
        assert (record["ngram"], record["favor_shorter_ngram"]) == (3, True)
    assert one["config"]["masking_scheme"] == record["name"]


def test_a_resume_with_another_scheme_is_refused(tmp_path):
    from mlm_pipeline.errors import OutputError

    _prepare(tmp_path, "out", masking_scheme="ngram")
    with pytest.raises(OutputError, match="masking-scheme: 'ngram' in the existing run, 'span' now"):
        _prepare(tmp_path, "out", masking_scheme="span")
    with pytest.raises(OutputError, match="ngram: 3 in the existing run, 2 now"):
        _prepare(tmp_path, "out", masking_scheme="ngram", ngram=2)


def test_scheme_settings_resolve_and_are_validated():
    from conftest import VOCAB
    from mlm_pipeline.config import build_config
    from mlm_pipeline.errors import ConfigError

    base = {"inputs": ["a.txt"], "output": "out", "tokenizer": str(VOCAB)}
    plain = build_config(base)
    assert (plain.masking_scheme, plain.do_whole_word_mask) == ("token", False)
    alias = build_config({**base, "do_whole_word_mask": True})
    assert (alias.masking_scheme, alias.do_whole_word_mask) == ("whole-word", True)
    assert alias.output_fingerprint() == build_config({**base, "masking_scheme": "whole-word"}).output_fingerprint()
    assert build_config({**base, "masking_scheme": "ngram"}).do_whole_word_mask is True
    assert build_config({**base, "masking_scheme": "ngram", "do_whole_word_mask": False}).do_whole_word_mask is False
    for values, message in [
        ({"masking_scheme": "token", "do_whole_word_mask": True}, "use --masking-scheme whole-word"),
        ({"masking_scheme": "span", "do_whole_word_mask": False}, "masks whole words"),
        ({"masking_scheme": "spans"}, "unknown masking scheme 'spans'"),
        ({"geometric_p": 0.3}, "--geometric-p applies to --masking-scheme span, not token"),
        ({"masking_scheme": "ngram", "span_upper": 5}, "--span-upper applies to --masking-scheme span"),
        ({"masking_scheme": "span", "span_lower": 4, "span_upper": 3}, "--span-lower (4) cannot exceed --span-upper"),
        ({"masking_scheme": "span", "geometric_p": 0}, "geometric-p"),
        ({"masking_scheme": "ngram", "ngram": 0}, "ngram"),
        ({"masking_scheme": "ngram", "reference": True}, "--masking-scheme token or whole-word, not ngram"),
    ]:
        with pytest.raises(ConfigError, match=message.replace("(", r"\(").replace(")", r"\)")):
            build_config({**base, **values})


def test_albert_flag_spellings_are_read(tmp_path):
    from conftest import VOCAB
    from mlm_pipeline.cli import native_args
    from mlm_pipeline.config import settings_of

    args = native_args(["--input_file=a.txt", "--output_file=o", f"--vocab_file={VOCAB}", "--ngram=2",
                        "--nofavor_shorter_ngram", "--do_whole_word_mask"], settings_of())
    assert "--ngram" in args and "--no-favor-shorter-ngram" in args and "--do-whole-word-mask" in args


# ---- word starts from the tokenizer's own marker --------------------------------------------


def _trained(kind: str, path):
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    from conftest import VOCAB, WIKITEXT
    from mlm_pipeline.tokenize.loading import TextTokenizer

    lines = [ln.strip() for ln in open(WIKITEXT, encoding="utf-8").readlines()[:1500] if ln.strip()]
    specials = ["[PAD]", "[CLS]", "[SEP]", "[UNK]", "[MASK]"]
    if kind == "unigram":
        tok = Tokenizer(models.Unigram())
        tok.pre_tokenizer = pre_tokenizers.Metaspace()
        trainer = trainers.UnigramTrainer(vocab_size=1500, special_tokens=specials, unk_token="[UNK]")
    else:
        tok = Tokenizer(models.BPE(unk_token="[UNK]"))
        tok.pre_tokenizer = (pre_tokenizers.ByteLevel(add_prefix_space=True) if kind == "byte-level"
                             else pre_tokenizers.Whitespace())
        trainer = trainers.BpeTrainer(vocab_size=1500, special_tokens=specials,
                                      **({"initial_alphabet": pre_tokenizers.ByteLevel.alphabet()}
                                         if kind == "byte-level" else {}))
    tok.train_from_iterator(lines, trainer)
    tok.save(str(path))
    return TextTokenizer(str(path))


def test_word_starts_come_from_the_tokenizers_own_marker(tok, tmp_path):
    assert tok.word_marker == ("continuation", "##")
    assert tok.is_continuation[tok.tokenizer.token_to_id("##ing")] and not tok.is_continuation[tok.special.mask]
    for kind, marker in (("byte-level", ("start", "Ġ")), ("unigram", ("start", "▁")), ("whitespace-bpe", None)):
        trained = _trained(kind, tmp_path / f"{kind}.json")
        assert trained.word_marker == marker, kind
        table = trained.is_continuation
        assert not table[trained.special_id_array].any()
        if marker is None:
            assert not table.any()  # every token its own word
            continue
        words = "the history of the university"
        enc = trained.tokenizer.encode(words, add_special_tokens=False)
        starts = [not table[i] for i in enc.ids]
        assert sum(starts) == 5 and starts[0], (kind, enc.tokens)  # one start per word


def test_whole_words_need_a_tokenizer_that_marks_them(tmp_path):
    from conftest import SAMPLE_TEXT
    from mlm_pipeline.config import build_config
    from mlm_pipeline.errors import ConfigError
    from mlm_pipeline.pipeline import run_prepare

    path = tmp_path / "tokenizer.json"
    _trained("whitespace-bpe", path)
    for scheme in ("whole-word", "span"):
        config = build_config({"inputs": [str(SAMPLE_TEXT)], "output": str(tmp_path / scheme), "tokenizer": str(path),
                               "workers": 1, "progress": False, "masking_scheme": scheme})
        with pytest.raises(ConfigError, match="marks no word boundaries"):
            run_prepare(config, show_progress=False)
    config = build_config({"inputs": [str(SAMPLE_TEXT)], "output": str(tmp_path / "ngram"), "tokenizer": str(path),
                           "workers": 1, "progress": False, "masking_scheme": "ngram", "do_whole_word_mask": False})
    assert run_prepare(config, show_progress=False)["totals"]["masked_tokens"] > 0


@pytest.mark.parametrize("scheme", ["token", "whole-word", "ngram", "span"])
@pytest.mark.parametrize("prob", [0.01, 0.5])
def test_every_scheme_takes_any_rate(wikitext_docs, tok, scheme, prob):
    plain = _instances(wikitext_docs, tok, 128).slice(0, 400)
    masked, stats = mask_batch(plain, _spec(tok, scheme, prob, 128, wwm=scheme != "token"), rng(2))
    k = np.minimum(num_to_predict(plain.lengths, prob, 128), plain.lengths - 3)
    share = stats.masked / len(plain.input_ids)
    assert abs(share - k.sum() / len(plain.input_ids)) < 0.01, share
    if scheme != "span":  # (span may take its last span whole, on average to k)
        assert np.all(masked.masked_counts <= k)


def test_the_command_line_names_the_flag(tmp_path):
    import subprocess
    import sys

    from conftest import SAMPLE_TEXT, VOCAB

    got = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", str(SAMPLE_TEXT), "-o", str(tmp_path / "o"),
                          "-t", str(VOCAB), "--masking-scheme", "span", "--span-lower", "5", "--span-upper", "2"],
                         capture_output=True, text=True)
    assert got.returncode == 2 and "--span-lower (5) cannot exceed --span-upper (2)" in got.stderr


def test_a_scheme_defined_here_is_used_by_prepare(tmp_path):
    """A masking scheme is one module and one registry call: this one masks the first k candidates."""
    from mlm_pipeline.formats.parquet import read_parquet
    from mlm_pipeline.masking import MaskingScheme, register_masking_scheme, unregister_masking_scheme
    from mlm_pipeline.masking.base import Chosen

    def first_k(sel, draws):
        cand_pos = np.flatnonzero(sel.cand)
        rows = np.repeat(np.arange(sel.n), sel.lens)[cand_pos]
        rank = np.arange(len(cand_pos)) - np.searchsorted(rows, rows)  # rank among the row's candidates
        return Chosen(cand_pos[rank < sel.k[rows]])

    register_masking_scheme(MaskingScheme(name="first", choose=first_k, help="the first k candidates"))
    try:
        manifest = _prepare(tmp_path, "out", masking_scheme="first", format="parquet")
    finally:
        unregister_masking_scheme("first")
    assert manifest["masking_scheme"] == {"name": "first", "whole_words": False}
    batch = read_parquet(str(tmp_path / "out" / manifest["shards"][0]["path"]))
    from mlm_pipeline.tokenize import load_tokenizer

    from conftest import VOCAB

    special = set(load_tokenizer(str(VOCAB), True).special_id_array.tolist())
    for i in range(len(batch)):
        row = batch.row(i)
        ids = list(row["input_ids"])
        for p, original in zip(row["masked_lm_positions"], row["masked_lm_ids"]):
            ids[p] = original
        first = [j for j, t in enumerate(ids) if t not in special][:len(row["masked_lm_positions"])]
        assert list(row["masked_lm_positions"]) == first


@pytest.mark.parametrize("objective", ["packed", "tokens"])
@pytest.mark.parametrize("scheme", ["ngram", "span"])
def test_packed_and_token_windows_take_every_scheme(tmp_path, objective, scheme):
    """RoBERTa's packed rows and plain token windows masked by n-grams or spans in prepare: the
    masked share is the rate, the manifest records the scheme, and 1 and 2 workers write the same
    shards."""
    import pyarrow.parquet as pq

    from conftest import VOCAB, WIKITEXT
    from mlm_pipeline import prepare

    def run(name, workers):
        return prepare(inputs=[str(WIKITEXT)], output=str(tmp_path / name), tokenizer=str(VOCAB),
                       objective=objective, masking="static", masking_scheme=scheme, masked_lm_prob=0.15, max_seq_length=256,
                       max_predictions_per_seq=60, split_bytes="256KiB", format="parquet", workers=workers,
                       progress=False, show_progress=False)

    one, two = run("one", 1), run("two", 2)
    assert one["masking_scheme"]["name"] == scheme
    assert [s["sha256"] for s in one["shards"]] == [s["sha256"] for s in two["shards"]]
    table = pq.read_table([tmp_path / "one" / s["path"] for s in one["shards"]][0])
    lengths = np.array([sum(m) for m in table.column("input_mask").to_pylist()])
    masked = np.array([sum(w) for w in table.column("masked_lm_weights").to_pylist()])
    share = masked.sum() / (lengths - 2).sum()  # of the tokens a mask may fall on ([CLS]/[SEP] never)
    assert 0.13 < share < 0.17, share
