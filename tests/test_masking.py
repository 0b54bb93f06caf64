"""Masking on real text: exact counts, 80/10/10 within tolerance, whole words never split."""

from __future__ import annotations

import numpy as np
import pytest

from conftest import rng
from mlm_pipeline.instances.nsp import build_nsp_instances
from mlm_pipeline.masking import MaskingSpec, mask_batch, num_to_predict


def _instances(docs, tok, seq=128, seed=0):
    batch, _ = build_nsp_instances(
        docs, max_seq_length=seq, short_seq_prob=0.1, dupe_factor=1,
        cls_id=tok.special.cls, sep_id=tok.special.sep, rng=rng(seed),
    )
    return batch


def _spec(tok, wwm=False, max_pred=20, prob=0.15):
    return MaskingSpec(prob, max_pred, tok.vocab_size, tok.special.mask, tok.special_id_array, wwm, tok.is_continuation)


def test_num_to_predict_rounds_half_to_even_like_python():
    lengths = np.array([3, 10, 30, 50, 70, 128, 200])
    got = num_to_predict(lengths, 0.15, 20)
    want = [min(20, max(1, int(round(n * 0.15)))) for n in lengths]
    assert got.tolist() == want
    assert num_to_predict(np.array([10]), 0.25, 20).tolist() == [2]  # round(2.5) == 2


@pytest.mark.parametrize("wwm", [False, True])
def test_masking_on_real_text(wikitext_docs, tok, wwm):
    plain = _instances(wikitext_docs, tok)
    masked, stats = mask_batch(plain, _spec(tok, wwm), rng(1))
    k = num_to_predict(plain.lengths, 0.15, 20)
    counts = masked.masked_counts
    if wwm:
        assert np.all(counts <= k)
        assert np.mean(counts == k) > 0.95  # words that overflow the budget are skipped
    else:
        assert np.array_equal(counts, k)
    assert stats.masked == int(counts.sum())
    frac = stats.masked / len(plain.input_ids)
    assert 0.13 < frac < 0.16
    # 80 / 10 / 10 within 4 standard deviations
    n = stats.masked
    for share, p in ((stats.replaced_mask, 0.8), (stats.replaced_random, 0.1), (stats.kept, 0.1)):
        assert abs(share / n - p) < 4 * np.sqrt(p * (1 - p) / n)
    for i in range(len(masked)):
        row, orig = masked.row(i), plain.row(i)
        pos = row["masked_lm_positions"]
        assert pos == sorted(set(pos))
        assert [orig["input_ids"][p] for p in pos] == row["masked_lm_ids"]
        assert all(orig["input_ids"][p] not in (tok.special.cls, tok.special.sep) for p in pos)
        unmasked = set(range(len(orig["input_ids"]))) - set(pos)
        assert all(row["input_ids"][j] == orig["input_ids"][j] for j in unmasked)
        for p in pos:
            if row["input_ids"][p] == tok.special.mask:
                continue
        if wwm:
            cont = tok.is_continuation[np.array(orig["input_ids"])]
            chosen = np.zeros(len(cont), bool)
            chosen[pos] = True
            # a continuation piece is masked exactly when the piece before it is
            for j in range(1, len(cont)):
                if cont[j] and orig["input_ids"][j - 1] not in (tok.special.cls, tok.special.sep):
                    assert chosen[j] == chosen[j - 1], (i, j)


def test_whole_word_masking_masks_multi_piece_words(wikitext_docs, tok):
    plain = _instances(wikitext_docs, tok)
    masked, _ = mask_batch(plain, _spec(tok, True), rng(2))
    cont = tok.is_continuation[masked.masked_lm_ids]
    assert cont.sum() > 100  # continuation pieces do get masked (with their word)


def test_masking_is_deterministic_for_a_seed(wikitext_docs, tok):
    plain = _instances(wikitext_docs, tok)
    a, _ = mask_batch(plain, _spec(tok), rng(5))
    b, _ = mask_batch(plain, _spec(tok), rng(5))
    c, _ = mask_batch(plain, _spec(tok), rng(6))
    assert np.array_equal(a.input_ids, b.input_ids) and np.array_equal(a.masked_lm_positions, b.masked_lm_positions)
    assert not np.array_equal(a.masked_lm_positions, c.masked_lm_positions)


def _reference_choice(batch, spec, seed):
    """Chosen flat positions, instance by instance in plain Python: the documented draw order
    (token mode: one float32 key per (instance, column) of the padded layout; whole-word: one
    float32 key per word), visiting by ascending key with ties in position order."""
    g = rng(seed)
    n, lens = len(batch), batch.lengths
    ids = batch.input_ids
    special = set(spec.special_ids.tolist())
    k = num_to_predict(lens, spec.masked_lm_prob, spec.max_predictions)
    cands = [[j for j in range(lens[i]) if ids[batch.offsets[i] + j] not in special] for i in range(n)]
    chosen = []
    if not spec.do_whole_word_mask:
        keys = g.random((n, int(lens.max())), dtype=np.float32)
        for i in range(n):
            ki = min(int(k[i]), len(cands[i]))
            order = sorted(cands[i], key=lambda j: (keys[i, j], j))
            chosen += sorted(int(batch.offsets[i]) + j for j in order[:ki])
        return np.array(chosen)
    words = []  # (row, [columns])
    for i in range(n):
        for j in cands[i]:
            if words and words[-1][0] == i and spec.is_continuation[ids[batch.offsets[i] + j]]:
                words[-1][1].append(j)
            else:
                words.append((i, [j]))
    if not words:
        return np.zeros(0, np.int64)
    keys = g.random(len(words), dtype=np.float32)
    for i in range(n):
        ki = min(int(k[i]), len(cands[i]))
        mine = sorted((keys[w], w) for w in range(len(words)) if words[w][0] == i)
        taken = []
        for _, w in mine:
            if len(taken) + len(words[w][1]) <= ki:
                taken += words[w][1]
        chosen += sorted(int(batch.offsets[i]) + j for j in taken)
    return np.array(chosen)


@pytest.mark.parametrize("wwm", [False, True])
@pytest.mark.parametrize("chunk, slack", [(4096, 8), (7, 0), (1, 1)])
def test_vectorised_choice_equals_plain_python(wikitext_docs, tok, wwm, chunk, slack, monkeypatch):
    """Row chunks, partial sorts and the whole-word shortcut change nothing in what is chosen."""
    import mlm_pipeline.masking as masking

    monkeypatch.setattr(masking, "_ROWS_PER_CHUNK", chunk)
    monkeypatch.setattr(masking, "_WORD_SLACK", slack)
    plain = _instances(wikitext_docs, tok).slice(0, 60)
    for spec in (_spec(tok, wwm), _spec(tok, wwm, max_pred=76, prob=0.4)):
        for seed in (3, 4):
            masked, _ = mask_batch(plain, spec, rng(seed))
            rows = np.repeat(np.arange(len(masked)), masked.masked_counts)
            got = masked.offsets[rows] + masked.masked_lm_positions
            assert np.array_equal(got, _reference_choice(plain, spec, seed))


def test_smallest_breaks_ties_like_a_stable_sort():
    from mlm_pipeline.masking import _smallest

    g = rng(0)
    for _ in range(100):
        keys = g.integers(0, 4, size=(20, 30)).astype(float)  # many equal keys
        k = g.integers(0, 31, size=20)
        order = np.argsort(keys, axis=1, kind="stable")
        rank = np.empty_like(order)
        np.put_along_axis(rank, order, np.arange(30)[None, :], axis=1)
        assert np.array_equal(_smallest(keys, k), rank < k[:, None])


def test_not_special_equals_isin():
    from mlm_pipeline.masking import _not_special

    g = rng(1)
    ids = g.integers(0, 30522, 50_000).astype(np.int32)
    # BERT's specials; RoBERTa's and XLM-R's (<mask> the last id: the run between is compared);
    # one; none; repeated; specials at both ends with ids above them too
    for special in ([0, 100, 101, 102, 103], [0, 1, 2, 3, 30521], [30000, 5], [0], [], [7, 7, 29999],
                    [0, 3, 20000]):
        special = np.array(special, np.int32)
        ids[g.integers(0, len(ids), 500)] = special[0] if len(special) else 0
        assert np.array_equal(_not_special(ids, special), ~np.isin(ids, special)), special
