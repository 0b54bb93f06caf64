"""The masking stage of ``prepare``: candidates and budget, the configured scheme's choice, then
the replacement, for a whole batch at once (numpy, no Python loop per token).

Each chosen position becomes ``[MASK]`` with probability 0.8, else a uniformly random vocabulary
id with 0.5, else stays itself; a scheme that groups its positions (``span``) makes that choice
once per group, and draws a random id per position.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets
from mlm_pipeline.masking.base import (
    GeneratorDraws,
    MaskingSpec,
    MaskStats,
    Selection,
    not_special,
    num_to_predict,
)
from mlm_pipeline.masking.registry import get_masking_scheme


def mask_batch(batch: InstanceBatch, spec: MaskingSpec, rng: np.random.Generator) -> tuple[InstanceBatch, MaskStats]:
    """Return the batch with masked-LM fields filled and ``input_ids`` corrupted."""
    n = len(batch)
    if n == 0:
        return batch, MaskStats()
    ids = batch.input_ids
    offsets = batch.offsets
    lens = np.diff(offsets)
    cand = not_special(ids, spec.special_ids)
    target = num_to_predict(lens, spec.masked_lm_prob, spec.max_predictions)
    if lens.min() > 0:  # candidates per row: reduceat is 100x a bincount of searchsorted rows
        k = np.minimum(target, np.add.reduceat(cand, offsets[:-1], dtype=np.int64))
    else:
        k = np.minimum(target, np.bincount(np.repeat(np.arange(n), lens)[cand], minlength=n))
    scheme = get_masking_scheme(spec.scheme_name)
    chosen = scheme.choose(Selection(ids=ids, offsets=offsets, cand=cand, k=k, spec=spec), GeneratorDraws(rng))
    positions = chosen.positions
    # positions ascend: each row's are one run, found by n + 1 searches (not one per position)
    counts = np.diff(np.searchsorted(positions, offsets))
    m_rows = np.repeat(np.arange(n), counts)
    m_cols = positions - offsets[m_rows]
    original = ids[positions]
    if scheme.per_group and chosen.groups is not None:
        _, group = np.unique(chosen.groups, return_inverse=True)
        u = rng.random((2, int(group.max()) + 1 if len(group) else 0))[:, group]
    else:
        u = rng.random((2, len(original)))
    as_mask = u[0] < 0.8
    as_random = ~as_mask & (u[1] >= 0.5)
    random_ids = rng.integers(0, spec.vocab_size, size=len(original), dtype=np.int32)
    new = np.where(as_mask, np.int32(spec.mask_id), original)
    np.copyto(new, random_ids, where=as_random, casting="unsafe")  # ids < vocab_size fit int32
    corrupted = batch.input_ids.copy()
    corrupted[positions] = new
    # every per-row field the builder filled (document starts, languages, ...) is kept: masking
    # changes no row's length
    out = dataclasses.replace(
        batch,
        input_ids=corrupted,
        masked_lm_positions=m_cols.astype(np.int32),
        masked_lm_ids=original.astype(np.int32),
        masked_offsets=lengths_to_offsets(counts),
    )
    stats = MaskStats(
        masked=len(original),
        replaced_mask=int(as_mask.sum()),
        replaced_random=int(as_random.sum()),
        kept=int((~as_mask & ~as_random).sum()),
    )
    return out, stats

