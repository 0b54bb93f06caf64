"""Static masked-LM masking of a whole batch at once (numpy, no Python loop per token).

Semantics of ``create_pretraining_data.py``: per instance
``num_to_predict = min(max_predictions, max(1, round(len(tokens) * masked_lm_prob)))`` (the length
counts ``[CLS]``/``[SEP]``, rounding is half-to-even like Python's ``round``), positions drawn
uniformly among non-special tokens; with whole-word masking, words (a token plus its continuation
pieces) are visited in random order and taken whole while they fit — a word that would overflow
the budget is skipped, so no word is ever partly masked. Each chosen position becomes ``[MASK]``
with probability 0.8, else a uniformly random vocabulary id with 0.5, else stays itself.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets


@dataclass(frozen=True)
class MaskingSpec:
    masked_lm_prob: float
    max_predictions: int
    vocab_size: int
    mask_id: int
    special_ids: np.ndarray  # ids never masked
    do_whole_word_mask: bool = False
    is_continuation: np.ndarray | None = None  # bool per vocab id, needed for whole-word


@dataclass
class MaskStats:
    masked: int = 0
    replaced_mask: int = 0
    replaced_random: int = 0
    kept: int = 0

    def to_dict(self) -> dict:
        return {
            "masked_tokens": self.masked,
            "masked_as_mask_token": self.replaced_mask,
            "masked_as_random_token": self.replaced_random,
            "masked_kept": self.kept,
        }


def num_to_predict(lengths: np.ndarray, masked_lm_prob: float, max_predictions: int) -> np.ndarray:
    target = np.rint(lengths * masked_lm_prob).astype(np.int64)  # rint: half to even, like round()
    return np.minimum(max_predictions, np.maximum(1, target))


def _to_2d(batch: InstanceBatch) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    lens = batch.lengths
    n = len(lens)
    width = int(lens.max()) if n else 0
    rows = np.repeat(np.arange(n), lens)
    cols = np.arange(len(batch.input_ids)) - np.repeat(batch.offsets[:-1], lens)
    tokens = np.full((n, width), -1, dtype=np.int64)
    tokens[rows, cols] = batch.input_ids
    return tokens, lens, rows, cols


def _choose_tokens(cand: np.ndarray, k: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Boolean [n, L]: ``k[i]`` positions drawn without replacement among ``cand[i]``."""
    keys = rng.random(cand.shape)
    keys[~cand] = 2.0
    order = np.argsort(keys, axis=1, kind="stable")
    rank = np.empty_like(order)
    np.put_along_axis(rank, order, np.arange(cand.shape[1])[None, :], axis=1)
    return (rank < k[:, None]) & cand


def _choose_whole_words(
    tokens: np.ndarray, cand: np.ndarray, k: np.ndarray, is_cont: np.ndarray, rng: np.random.Generator
) -> np.ndarray:
    """Boolean [n, L]: whole words visited in random order, each taken if it still fits."""
    n, width = cand.shape
    safe = np.where(tokens >= 0, tokens, 0)
    cont = is_cont[np.minimum(safe, len(is_cont) - 1)] & cand
    flat_cand = cand.ravel()
    cand_pos = np.flatnonzero(flat_cand)
    if len(cand_pos) == 0:
        return np.zeros_like(cand)
    cand_rows = cand_pos // width
    # a word starts at a candidate that is not a continuation, or at a row's first candidate
    first_of_row = np.ones(len(cand_pos), dtype=bool)
    first_of_row[1:] = cand_rows[1:] != cand_rows[:-1]
    starts = ~cont.ravel()[cand_pos] | first_of_row
    word_of_cand = np.cumsum(starts) - 1  # global word id per candidate
    n_words = int(word_of_cand[-1]) + 1
    word_len = np.bincount(word_of_cand, minlength=n_words)
    word_row = cand_rows[starts]
    # shuffle words within each row: sort by (row, random key)
    order = np.lexsort((rng.random(n_words), word_row))
    words_per_row = np.bincount(word_row, minlength=n)
    row_start = lengths_to_offsets(words_per_row)
    max_words = int(words_per_row.max())
    rank_in_row = np.arange(n_words) - np.repeat(row_start[:-1], words_per_row)
    wl = np.zeros((n, max_words), dtype=np.int64)
    wid = np.full((n, max_words), -1, dtype=np.int64)
    sorted_rows = word_row[order]
    wl[sorted_rows, rank_in_row] = word_len[order]
    wid[sorted_rows, rank_in_row] = order
    count = np.zeros(n, dtype=np.int64)
    accepted = np.zeros((n, max_words), dtype=bool)
    for j in range(max_words):  # loop over word rank, vectorised over all instances
        lj = wl[:, j]
        take = (lj > 0) & (count < k) & (count + lj <= k)
        accepted[:, j] = take
        count += np.where(take, lj, 0)
        if np.all(count >= k):
            break
    chosen_word = np.zeros(n_words, dtype=bool)
    chosen_word[wid[accepted]] = True
    chosen = np.zeros(n * width, dtype=bool)
    chosen[cand_pos[chosen_word[word_of_cand]]] = True
    return chosen.reshape(n, width)


def mask_batch(batch: InstanceBatch, spec: MaskingSpec, rng: np.random.Generator) -> tuple[InstanceBatch, MaskStats]:
    """Return the batch with masked-LM fields filled and ``input_ids`` corrupted."""
    n = len(batch)
    if n == 0:
        return batch, MaskStats()
    tokens, lens, rows, cols = _to_2d(batch)
    cand = (tokens >= 0) & ~np.isin(tokens, spec.special_ids)
    k = np.minimum(num_to_predict(lens, spec.masked_lm_prob, spec.max_predictions), cand.sum(axis=1))
    if spec.do_whole_word_mask:
        if spec.is_continuation is None:
            raise ValueError("whole-word masking needs the tokenizer's continuation table")
        chosen = _choose_whole_words(tokens, cand, k, spec.is_continuation, rng)
    else:
        chosen = _choose_tokens(cand, k, rng)
    m_rows, m_cols = np.nonzero(chosen)  # row-major: positions ascending within each row
    original = tokens[m_rows, m_cols]
    u = rng.random((2, len(original)))
    as_mask = u[0] < 0.8
    as_random = ~as_mask & (u[1] >= 0.5)
    random_ids = rng.integers(0, spec.vocab_size, size=len(original))
    new = np.where(as_mask, spec.mask_id, np.where(as_random, random_ids, original))
    corrupted = batch.input_ids.copy()
    flat_pos = batch.offsets[m_rows] + m_cols
    corrupted[flat_pos] = new.astype(np.int32)
    counts = np.bincount(m_rows, minlength=n)
    out = InstanceBatch(
        input_ids=corrupted,
        segment_ids=batch.segment_ids,
        offsets=batch.offsets,
        masked_lm_positions=m_cols.astype(np.int32),
        masked_lm_ids=original.astype(np.int32),
        masked_offsets=lengths_to_offsets(counts),
        next_sentence_labels=batch.next_sentence_labels,
    )
    stats = MaskStats(
        masked=len(original),
        replaced_mask=int(as_mask.sum()),
        replaced_random=int(as_random.sum()),
        kept=int((~as_mask & ~as_random).sum()),
    )
    return out, stats
