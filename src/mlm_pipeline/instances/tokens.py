"""``tokens``: the block's token stream cut into plain windows, for masking at load time.

Consecutive windows of ``max_seq_length - 2`` tokens regardless of sentence boundaries (the last
window of a block may be shorter; documents are joined with a ``[SEP]``). Each instance is
``[CLS] ... [SEP]``, segment ids all 0, no NSP; unmasked unless ``--masking static`` is asked for.
"""

from __future__ import annotations

import numpy as np

from mlm_pipeline.instances.base import (BuildContext, Objective, TokenizedDocs, copies_need_masks,
                                         shuffled_copies, with_sources)
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.instances.single_segment import single_segment_batch, token_stream


def build_token_windows(docs: TokenizedDocs, *, max_seq_length: int, cls_id: int, sep_id: int,
                        sources: bool = False, copies: int = 1, rng: np.random.Generator | None = None
                        ) -> InstanceBatch:
    """The block's stream in windows of ``max_seq_length - 2`` tokens (with ``sources``, each
    window's documents): in stream order, or given ``rng``, ``copies`` of every window in one
    random order drawn from it (:func:`~.base.shuffled_copies`, before the one gather)."""
    if len(docs.doc_sentences) == 0:  # (nothing to shuffle: a permutation of none draws nothing)
        return InstanceBatch.empty(with_nsp=False)
    stream, _, _ = token_stream(docs, sep_id)
    cap = max_seq_length - 2
    starts = np.arange(0, len(stream), cap, dtype=np.int64)
    lens = np.minimum(cap, len(stream) - starts)
    if rng is not None:
        order = shuffled_copies(len(starts), copies, rng)
        starts, lens = starts[order], lens[order]
    batch = single_segment_batch(stream, starts, lens, cls_id=cls_id, sep_id=sep_id)
    return with_sources(batch, docs, starts, lens, separated=True) if sources else batch


def build(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    """The ``tokens`` objective: one windowing, ``dupe_factor`` copies of each window, shuffled."""
    batch = build_token_windows(
        docs, max_seq_length=ctx.settings.max_seq_length, cls_id=ctx.special.cls, sep_id=ctx.special.sep,
        sources=ctx.tracks_sources, copies=ctx.settings.dupe_factor, rng=ctx.rng)
    return batch, {"instances": len(batch)}


OBJECTIVE = Objective(
    name="tokens",
    build=build,
    help="tokenize only: plain windows of the token stream, for masking at load time (default --masking none)",
    has_nsp_labels=False,
    check=copies_need_masks,
    default_masking="none",
)
