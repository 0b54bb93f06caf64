"""ELECTRA's masking at load time (google-research/electra ``pretrain_helpers.mask``), in numpy.

ELECTRA's data holds no masks: the training input masks each padded batch afresh. Per row:

* candidates are the positions inside ``input_mask`` whose id is not ``[CLS]``, ``[SEP]``,
  ``[MASK]`` or ``[PAD]``;
* ``k = max(1, min(N, round(n * p)))`` predictions, where ``n`` is the row's ``input_mask``
  count (``[CLS]``/``[SEP]`` included), ``n * p`` is a float32 product rounded half to even as
  ``tf.round`` does, and ``N = int((p + 0.005) * max_seq_length)`` (``max_predictions_per_seq``);
* the ``k`` positions are drawn uniformly among the candidates WITH replacement (``tf.random
  .categorical``), so a position can be drawn twice: it then appears twice in
  ``masked_lm_positions`` (each with weight 1, as in ELECTRA's generator loss);
* each draw replaces its position by ``[MASK]`` with probability 0.85, else leaves it as it is;
  there are no random tokens. A position drawn more than once is ``[MASK]`` if any of its draws
  says so (ELECTRA's ``scatter_update`` applies duplicate updates once), and position 0 is never
  replaced (``scatter_update`` ignores index 0);
* unused prediction slots hold position 0, id 0 and weight 0.

A row without any candidate (say ``[CLS] [SEP]``) gets no prediction: ELECTRA would sample from
a 0/0 distribution there. Randomness comes in as uniforms (``choose_u``, ``replace_u``), so the
loader can feed its counter-based draws; :func:`electra_mask_random` draws them from a numpy
``Generator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MASK_PROB = 0.15
MASK_TOKEN_PROB = 0.85


def max_predictions_per_seq(max_seq_length: int, mask_prob: float = MASK_PROB) -> int:
    """ELECTRA's ``max_predictions_per_seq``: ``int((mask_prob + 0.005) * max_seq_length)``."""
    return int((mask_prob + 0.005) * max_seq_length)


def num_to_predict(input_mask: np.ndarray, mask_prob: float, max_predictions: int) -> np.ndarray:
    """Predictions per row: ``max(1, min(max_predictions, round(n * mask_prob)))`` in float32."""
    n = np.asarray(input_mask).sum(axis=1).astype(np.float32)
    k = np.rint(n * np.float32(mask_prob)).astype(np.int64)  # rint: half to even, like tf.round
    return np.maximum(1, np.minimum(max_predictions, k))


@dataclass
class ElectraMasked:
    """A masked batch in ELECTRA's layout: ``[B, L]`` ids, ``[B, N]`` predictions."""

    input_ids: np.ndarray  # [B, L], [MASK] where replaced
    masked_lm_positions: np.ndarray  # int64 [B, N], 0 in unused slots
    masked_lm_ids: np.ndarray  # [B, N] original ids, 0 in unused slots
    masked_lm_weights: np.ndarray  # float32 [B, N], 1 for used slots

    def labels(self, ignore_index: int = -100) -> np.ndarray:
        """``[B, L]`` targets for an HF masked-LM head: the original id at every drawn position
        (a position drawn twice counts once), ``ignore_index`` elsewhere."""
        out = np.full(self.input_ids.shape, ignore_index, dtype=np.int64)
        used = self.masked_lm_weights > 0
        rows = np.broadcast_to(np.arange(len(out))[:, None], used.shape)
        out[rows[used], self.masked_lm_positions[used]] = self.masked_lm_ids[used]
        return out


def electra_mask(
    input_ids: np.ndarray,
    input_mask: np.ndarray,
    *,
    mask_id: int,
    ignore_ids: np.ndarray | list[int],
    choose_u: np.ndarray,
    replace_u: np.ndarray,
    max_predictions: int,
    mask_prob: float = MASK_PROB,
) -> ElectraMasked:
    """Mask a padded batch as ELECTRA does, given uniforms in ``[0, 1)``.

    ``ignore_ids``: the ids never masked (ELECTRA: ``[SEP]``, ``[CLS]``, ``[MASK]``, ``[PAD]``).
    ``choose_u`` picks each slot's position (``floor(u * candidates)``-th candidate of the row);
    ``replace_u < 0.85`` makes the slot's position ``[MASK]``. Both are ``[B, max_predictions]``.
    """
    input_ids = np.asarray(input_ids)
    input_mask = np.asarray(input_mask)
    n_rows, width = input_ids.shape
    choose_u = np.asarray(choose_u, dtype=np.float64)
    replace_u = np.asarray(replace_u, dtype=np.float64)
    if choose_u.shape != (n_rows, max_predictions) or replace_u.shape != (n_rows, max_predictions):
        raise ValueError(f"uniforms must have shape {(n_rows, max_predictions)}, got {choose_u.shape} and {replace_u.shape}")
    cand = input_mask.astype(bool) & ~np.isin(input_ids, np.asarray(ignore_ids))
    n_cand = cand.sum(axis=1)
    k = np.where(n_cand > 0, num_to_predict(input_mask, mask_prob, max_predictions), 0)
    used = np.arange(max_predictions)[None, :] < k[:, None]
    cand_rows, cand_cols = np.nonzero(cand)  # row-major: each row's candidates, ascending
    row_start = np.cumsum(n_cand) - n_cand
    pick = np.minimum((choose_u * n_cand[:, None]).astype(np.int64), np.maximum(n_cand - 1, 0)[:, None])
    flat = np.where(used, row_start[:, None] + pick, 0)
    positions = np.where(used, cand_cols[flat] if len(cand_cols) else 0, 0).astype(np.int64)
    rows = np.broadcast_to(np.arange(n_rows)[:, None], positions.shape)
    ids = np.where(used, input_ids[rows, positions], 0)
    replace = used & (replace_u < MASK_TOKEN_PROB) & (positions != 0)
    masked = input_ids.copy()
    masked[rows[replace], positions[replace]] = mask_id
    return ElectraMasked(
        input_ids=masked,
        masked_lm_positions=positions,
        masked_lm_ids=ids.astype(input_ids.dtype),
        masked_lm_weights=used.astype(np.float32),
    )


def electra_mask_random(
    input_ids: np.ndarray,
    input_mask: np.ndarray,
    *,
    mask_id: int,
    ignore_ids: np.ndarray | list[int],
    rng: np.random.Generator,
    max_predictions: int | None = None,
    mask_prob: float = MASK_PROB,
) -> ElectraMasked:
    """:func:`electra_mask` with uniforms from ``rng``; ``max_predictions`` defaults to
    ELECTRA's ``max_predictions_per_seq`` for the batch's width."""
    input_ids = np.asarray(input_ids)
    n = max_predictions_per_seq(input_ids.shape[1], mask_prob) if max_predictions is None else max_predictions
    shape = (input_ids.shape[0], n)
    return electra_mask(
        input_ids,
        input_mask,
        mask_id=mask_id,
        ignore_ids=ignore_ids,
        choose_u=rng.random(shape),
        replace_u=rng.random(shape),
        max_predictions=n,
        mask_prob=mask_prob,
    )
