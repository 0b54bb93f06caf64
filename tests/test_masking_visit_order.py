"""The vectorised n-gram and whole-word schemes against their rules written plainly, row by row,
on real text (WikiText-2), with draws coarse enough that keys tie often: the visit order is
"ascending key, equal keys by column" (a stable argsort), which the packed (key, column) sort
must give exactly."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import rng
from mlm_pipeline.instances.nsp import build_nsp_instances
from mlm_pipeline.masking import MaskingSpec
from mlm_pipeline.masking.base import Selection, not_special, num_to_predict, visit_order
from mlm_pipeline.masking.ngram import choose_ngrams, ngram_cdf
from mlm_pipeline.masking.whole_word import choose_whole_words


class CoarseDraws:
    """Uniforms on a grid of 8 values (ties in nearly every row), from a seeded generator in
    call order."""

    def __init__(self, seed: int):
        self.rng = np.random.default_rng(seed)

    def grid(self, rows, width, purpose):
        return (self.rng.integers(0, 8, (len(rows), width)) / 8).astype(np.float32)

    def at(self, rows, cols, purpose):
        return (self.rng.integers(0, 8, len(rows)) / 8).astype(np.float32)


def test_visit_order_is_a_stable_argsort():
    keys = (rng(3).integers(0, 5, (300, 77)) / 4).astype(np.float32)  # 0..1, and 2.0 padding
    keys[:, 60:] = 2.0
    packed, bits = visit_order(keys)
    assert np.array_equal(packed & ((1 << bits) - 1), np.argsort(keys, axis=1, kind="stable"))


@pytest.fixture(scope="module")
def selection(wikitext_docs, tok):
    batch, _ = build_nsp_instances(wikitext_docs, max_seq_length=128, short_seq_prob=0.1, dupe_factor=1,
                                   cls_id=tok.special.cls, sep_id=tok.special.sep, rng=rng(0))
    batch = batch.slice(0, 400)

    def make(**params):
        spec = MaskingSpec(params.pop("prob", 0.15), 20, tok.vocab_size, tok.special.mask, tok.special_id_array,
                           True, tok.is_continuation, **params)
        cand = not_special(batch.input_ids, spec.special_ids)
        counts = np.add.reduceat(cand, batch.offsets[:-1], dtype=np.int64)
        k = np.minimum(num_to_predict(np.diff(batch.offsets), spec.masked_lm_prob, spec.max_predictions), counts)
        return Selection(ids=batch.input_ids, offsets=batch.offsets, cand=cand, k=k, spec=spec)

    return make


def _row_words(sel, i):
    """Row ``i``'s words as lists of flat positions (a continuation after a special token joins
    the word before it; a row's first candidate starts one)."""
    words = []
    for p in range(sel.offsets[i], sel.offsets[i + 1]):
        if not sel.cand[p]:
            continue
        if words and sel.spec.is_continuation[sel.ids[p]]:
            words[-1].append(p)
        else:
            words.append([p])
    return words


def _plain_ngrams(sel, draws, top, favor):
    cdf = ngram_cdf(top, favor)
    words = [_row_words(sel, i) for i in range(sel.n)]
    width = max(len(w) for w in words)
    rows = np.arange(sel.n)
    keys, u = draws.grid(rows, width, 16), draws.grid(rows, width, 17)
    out = []
    for i, ws in enumerate(words):
        order = sorted(range(len(ws)), key=lambda c: (keys[i, c], c))
        covered, count = set(), 0
        for j, w in enumerate(order):
            if count >= sel.k[i]:
                break
            n = min(top, 1 + int(np.searchsorted(cdf, np.float64(u[i, j]), side="right")))
            while True:
                gram = range(w, min(w + n, len(ws)))
                took = sum(len(ws[x]) for x in gram)
                if took <= sel.k[i] - count or n == 1:
                    break
                n -= 1
            if took > sel.k[i] - count or covered.intersection(gram):
                continue
            covered.update(gram)
            count += took
        out += sorted(p for x in covered for p in ws[x])
    return np.array(out)


def _plain_whole_words(sel, draws):
    words = [_row_words(sel, i) for i in range(sel.n)]
    keys = draws.at(np.zeros(sum(map(len, words))), None, 16)
    out, at = [], 0
    for i, ws in enumerate(words):
        order = sorted(range(len(ws)), key=lambda c: (keys[at + c], c))
        at += len(ws)
        count, taken = 0, []
        for w in order:
            if count + len(ws[w]) <= sel.k[i]:
                taken += ws[w]
                count += len(ws[w])
        out += sorted(taken)
    return np.array(out)


@pytest.mark.parametrize("top,favor,prob", [(3, True, 0.15), (2, False, 0.3), (5, True, 0.5)])
def test_ngram_masks_as_its_rules_say_with_tied_keys(selection, top, favor, prob):
    sel = selection(scheme="ngram", ngram=top, favor_shorter_ngram=favor, prob=prob)
    chosen = choose_ngrams(sel, CoarseDraws(7)).positions
    assert len(chosen) > 0.9 * sel.k.sum()
    assert np.array_equal(chosen, _plain_ngrams(sel, CoarseDraws(7), top, favor))


@pytest.mark.parametrize("prob", [0.15, 0.5])
def test_whole_words_are_taken_as_their_rules_say_with_tied_keys(selection, prob):
    sel = selection(scheme="whole-word", prob=prob)
    chosen = choose_whole_words(sel, CoarseDraws(9)).positions
    assert len(chosen) > 0.9 * sel.k.sum()
    assert np.array_equal(chosen, _plain_whole_words(sel, CoarseDraws(9)))
