"""``packed``: RoBERTa's FULL-SENTENCES and DOC-SENTENCES packing, and best-fit packing of documents; no NSP.

Three packings, each recording where every row's documents start (``InstanceBatch.document_starts``,
FlashAttention's ``cu_seqlens`` per row once the row's length is appended), so that a trainer can
keep attention inside each document:

- ``sentences`` (the default, FULL-SENTENCES): whole sentences are added while they fit in
  ``max_seq_length - 2``; a row may cross a document boundary, where a ``[SEP]`` separator is
  inserted (the next document starts after it); a sentence longer than a row on its own is cut
  into full-length pieces. Each row is ``[CLS] ... [SEP]``, segment ids all 0.
- ``sentences`` with ``--no-cross-document`` (DOC-SENTENCES): the same, but a row never holds
  two documents: a document's last row ends where the document ends (shorter rows).
- ``best-fit``: whole documents, each ``[CLS] document [SEP]`` (one longer than a row split into
  full-length pieces, the rest one piece), placed into rows by best-fit decreasing (the longest
  piece first, into the open row it leaves least room in), as ModernBERT's greedy best-fit
  packer does online, here offline over each block: deterministic (no random draws) and
  bounded by the block. Every piece is ``[CLS] ... [SEP]`` of its own, so a row is pieces back
  to back, each starting with ``[CLS]``.
"""

from __future__ import annotations

from bisect import bisect_left, insort

import numpy as np

from mlm_pipeline.instances.base import (BuildContext, Objective, TokenizedDocs, copies_need_masks,
                                         repeat_shuffled, shuffled_copies, with_sources)
from mlm_pipeline.instances.batch import InstanceBatch, gather_ranges, lengths_to_offsets, ranges_to_indices
from mlm_pipeline.instances.single_segment import single_segment_batch, token_stream

PACKINGS = ("sentences", "best-fit")


def pack_full_sentences(item_len: np.ndarray, is_sep: np.ndarray, cap: int, *,
                        cross_documents: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Greedy FULL-SENTENCES boundaries as (start, length) ranges of the stream (int64).

    An instance takes whole items (sentences, and separators of length 1) while they fit in
    ``cap``; a separator never starts one, nor joins one without ``cross_documents``
    (DOC-SENTENCES: it ends the instance); a trailing separator stays in the range (dropped when
    gathered). A sentence longer than ``cap`` is cut into full ``cap`` pieces, its remainder
    opening the next instance. An empty sentence changes nothing.

    Where the instance each sentence would open ends is one search of the items' end positions
    for all of them; which sentences do open one is a walk from each to the next (:func:`_walk`),
    mostly in numpy. It replaced a Python loop of one step per item: 0.030 -> 0.011 s for 391k
    items of English-like sentences (25 tokens on average) at cap 126, 0.043 -> 0.014 s for
    WikiText-2's lines ten times over (RoBERTa's BPE, 98 tokens on average).
    """
    item_len = np.asarray(item_len, np.int64)
    is_sep = np.asarray(is_sep, bool)
    ends = np.cumsum(item_len)
    can_open = ~is_sep & (item_len > 0)
    opens = np.flatnonzero(can_open)  # the items that can open an instance
    if len(opens) == 0:
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    start = ends[opens] - item_len[opens]  # of the instance each opens: past an over-long one's pieces
    long = np.flatnonzero(item_len[opens] > cap)
    start[long] += (item_len[opens[long]] - 1) // cap * cap
    stop = np.searchsorted(ends, start + cap, side="right")  # one past the last item that fits
    if not cross_documents:  # ... and not past the next separator
        sep_at = np.append(np.flatnonzero(is_sep), len(item_len))
        np.minimum(stop, sep_at[np.cumsum(is_sep)[opens]], out=stop)
    opens_before = np.zeros(len(item_len) + 1, np.int64)
    np.cumsum(can_open, out=opens_before[1:])
    nxt = opens_before[stop]  # (in ``opens``) the item opening the next instance, len(opens) past the end
    chain = _walk(nxt)
    starts, stops = start[chain], ends[stop[chain] - 1]
    pieces = (item_len[opens[chain]] - 1) // cap
    if not pieces.any():
        return starts, stops - starts
    per_item = pieces + 1  # an over-long sentence's pieces, then its remainder's instance
    k = np.arange(int(per_item.sum())) - np.repeat(lengths_to_offsets(per_item)[:-1], per_item)
    out_starts = np.repeat(starts - pieces * cap, per_item) + k * cap
    out_lens = np.full(len(out_starts), cap, np.int64)
    out_lens[np.cumsum(per_item) - 1] = stops - starts
    return out_starts, out_lens


_LOCKSTEP = 128
"""Gaps walked together as long as this many are left: a numpy step costs about what 100 Python steps do."""


def _walk(nxt: np.ndarray) -> np.ndarray:
    """The openers of the instances (indexes into ``nxt``): ``nxt`` followed from the first.

    ``nxt`` never decreases, so an opener that its predecessor's instance does not reach past
    (``nxt[j - 1] == j``) is on the chain whatever came before it: no jump from an earlier
    opener lands beyond it. Those (without ``cross_documents`` every document's first, and any
    sentence after one that fills most of a row) are taken at once; the gaps between them are
    walked a step at a time, all together in numpy while many are left, the rest in Python.
    """
    m = len(nxt)
    on = np.empty(m + 1, bool)
    on[0] = on[m] = True
    np.equal(nxt[:-1], np.arange(1, m), out=on[1:m])
    walkers = nxt[np.flatnonzero(on[:m] & ~on[nxt])]  # one a gap between two sure openers
    while len(walkers := walkers[~on[walkers]]) >= _LOCKSTEP:  # walk them all a step at a time
        on[walkers] = True
        walkers = nxt[walkers]
    between = []  # the few left, in Python
    step, sure = memoryview(nxt), memoryview(on)  # (indexing them gives Python values, no list of all)
    for j in walkers.tolist():
        while not sure[j]:
            between.append(j)
            j = step[j]
    on[between] = True
    return np.flatnonzero(on[:m])


def stream_document_starts(sep_positions: np.ndarray, starts: np.ndarray, lens: np.ndarray,
                           order: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray]:
    """Where each row's documents start, for rows ``[CLS] stream[start:start + len] [SEP]``
    (given ``order``, the rows are ranges ``order`` of those).

    A row's first document starts at 0 (its ``[CLS]``); each separator inside the row (not its
    last token: a trailing separator is dropped) ends a document, and the next starts right
    after it, at row position ``separator - start + 2``. Returns (starts int32, offsets int64).
    The separators are searched for the ranges in stream order, then taken in ``order``:
    searching ascending starts costs a quarter of shuffled ones (a 4 MiB block: 1.08 -> 0.25 ms).
    """
    lo = np.searchsorted(sep_positions, starts, side="left")
    hi = np.searchsorted(sep_positions, starts + lens - 1, side="left")  # separators before the last token
    if order is not None:
        starts, lo, hi = starts[order], lo[order], hi[order]
    inner = hi - lo
    counts = inner + 1
    offsets = lengths_to_offsets(counts)
    out = np.zeros(int(offsets[-1]), np.int32)
    row_of_inner = np.repeat(np.arange(len(starts)), inner)
    at = ranges_to_indices(offsets[:-1] + 1, inner)
    out[at] = sep_positions[ranges_to_indices(lo, inner)] - starts[row_of_inner] + 2
    return out, offsets


def build_packed_instances(docs: TokenizedDocs, *, max_seq_length: int, cls_id: int, sep_id: int,
                           cross_documents: bool = True, sources: bool = False, copies: int = 1,
                           rng: np.random.Generator | None = None) -> InstanceBatch:
    """One FULL-SENTENCES (or, without ``cross_documents``, DOC-SENTENCES) packing of the block,
    with each row's document starts (and with ``sources`` its documents): in stream order, or
    given ``rng``, ``copies`` of every row in one random order drawn from it
    (:func:`~.base.shuffled_copies`, the rows' ranges permuted before their tokens are gathered)."""
    if len(docs.doc_sentences) == 0:  # (nothing to shuffle: a permutation of none draws nothing)
        return InstanceBatch.empty(with_nsp=False)
    stream, item_len, is_sep = token_stream(docs, sep_id)
    starts, lens = pack_full_sentences(item_len, is_sep, max_seq_length - 2, cross_documents=cross_documents)
    order = shuffled_copies(len(starts), copies, rng) if rng is not None else None
    row_starts, row_lens = (starts, lens) if order is None else (starts[order], lens[order])
    batch = single_segment_batch(stream, row_starts, row_lens, cls_id=cls_id, sep_id=sep_id)
    sep_positions = lengths_to_offsets(item_len)[:-1][is_sep]
    batch.document_starts, batch.document_offsets = stream_document_starts(sep_positions, starts, lens, order)
    if sources:
        with_sources(batch, docs, row_starts, row_lens, separated=True)
    return batch


_SMALLEST_PIECE = 3  # [CLS] token [SEP]: a row with less room left takes no more pieces


def best_fit_rows(sizes: np.ndarray, capacity: int) -> list[list[int]]:
    """Best-fit decreasing: the pieces (by index) of each row, no row's sizes summing past ``capacity``.

    Pieces are taken longest first (equal sizes in index order), each into the open row it
    leaves the least room in, else into a new row; a piece of the full capacity is a row of its
    own. One loop step per piece, with the open rows' free room kept sorted (``bisect``).
    Deterministic: the result depends on the sizes alone.
    """
    rows: list[list[int]] = []
    free: list[tuple[int, int]] = []  # (room left, row), ascending
    for i in np.argsort(-np.asarray(sizes, np.int64), kind="stable").tolist():
        size = int(sizes[i])
        k = bisect_left(free, (size, -1))
        if k < len(free):
            room, row = free.pop(k)
            rows[row].append(i)
        else:
            row, room = len(rows), capacity
            rows.append([i])
        room -= size
        if room >= _SMALLEST_PIECE:
            insort(free, (room, row))
    return rows


def build_best_fit_instances(docs: TokenizedDocs, *, max_seq_length: int, cls_id: int, sep_id: int,
                             sources: bool = False) -> tuple[InstanceBatch, dict]:
    """Best-fit packing of the block's whole documents (see the module docstring), with each
    row's document starts, and counts: ``document_pieces`` (pieces placed) and
    ``documents_split`` (documents longer than a row, split into several pieces)."""
    if len(docs.doc_sentences) == 0:
        return InstanceBatch.empty(with_nsp=False), {}
    body = max_seq_length - 2
    doc_tokens = np.add.reduceat(docs.sentence_lengths, docs.doc_offsets[:-1])
    doc_start = lengths_to_offsets(doc_tokens)[:-1]
    n_pieces = -(-doc_tokens // body)
    doc_of_piece = np.repeat(np.arange(len(doc_tokens)), n_pieces)
    k = np.arange(int(n_pieces.sum())) - np.repeat(lengths_to_offsets(n_pieces)[:-1], n_pieces)  # piece number
    piece_start = doc_start[doc_of_piece] + k * body
    piece_len = np.minimum(body, doc_tokens[doc_of_piece] - k * body)
    rows = best_fit_rows(piece_len + 2, max_seq_length)
    order = np.fromiter((p for row in rows for p in row), np.int64, count=len(piece_len))
    per_row = np.fromiter((len(row) for row in rows), np.int64, count=len(rows))
    # every piece is three ranges of (ids, [CLS], [SEP]): [CLS] piece [SEP]
    source = np.concatenate([docs.ids, np.array([cls_id, sep_id], dtype=docs.ids.dtype)])
    starts = np.empty((len(order), 3), np.int64)
    lengths = np.ones((len(order), 3), np.int64)
    starts[:, 0], starts[:, 1], starts[:, 2] = len(docs.ids), piece_start[order], len(docs.ids) + 1
    lengths[:, 1] = piece_len[order]
    (ids,) = gather_ranges((source,), starts.ravel(), lengths.ravel())
    sizes = piece_len[order] + 2
    row_of_piece = np.repeat(np.arange(len(rows)), per_row)
    row_len = np.bincount(row_of_piece, weights=sizes, minlength=len(rows)).astype(np.int64)
    offsets = lengths_to_offsets(row_len)
    document_offsets = lengths_to_offsets(per_row)
    document_starts = (lengths_to_offsets(sizes)[:-1] - offsets[row_of_piece]).astype(np.int32)
    batch = InstanceBatch.unmasked(ids.astype(np.int32, copy=False), np.zeros(len(ids), np.int8), offsets)
    batch.document_starts, batch.document_offsets = document_starts, document_offsets
    if sources:
        with_sources(batch, docs, piece_start[order], piece_len[order], separated=False, rows=row_of_piece)
    return batch, {"document_pieces": len(order), "documents_split": int((n_pieces > 1).sum())}


def build(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    """The ``packed`` objective: one packing, ``dupe_factor`` copies of each instance, shuffled.

    Counts: ``instances``, and ``padding_tokens`` (what padding every row to ``max_seq_length``
    adds: the manifest's padding share is ``padding_tokens / (instances * max_seq_length)``).
    """
    settings = ctx.settings
    packing = getattr(settings, "packing", "sentences")
    counts: dict = {}
    if packing == "best-fit":
        once, counts = build_best_fit_instances(docs, max_seq_length=settings.max_seq_length,
                                                cls_id=ctx.special.cls, sep_id=ctx.special.sep,
                                                sources=ctx.tracks_sources)
        batch = repeat_shuffled(once, settings.dupe_factor, ctx.rng)
    else:  # copies shuffled as the rows are cut: one gather
        batch = build_packed_instances(docs, max_seq_length=settings.max_seq_length, cls_id=ctx.special.cls,
                                       sep_id=ctx.special.sep, cross_documents=getattr(settings, "cross_document", True),
                                       sources=ctx.tracks_sources, copies=settings.dupe_factor, rng=ctx.rng)
    padding = int(len(batch) * settings.max_seq_length - len(batch.input_ids))
    return batch, {"instances": len(batch), "padding_tokens": padding, **counts}


def check(settings) -> None:
    """``packed``'s settings: copies need masks; best-fit rows hold several documents by design."""
    copies_need_masks(settings)
    if getattr(settings, "packing", "sentences") == "best-fit" and not getattr(settings, "cross_document", True):
        raise ValueError("--packing best-fit puts several whole documents in a row (attention is kept apart by the "
                         "recorded document starts); --no-cross-document (one document a row) is for "
                         "--packing sentences")


OBJECTIVE = Objective(
    name="packed",
    build=build,
    help="RoBERTa FULL-SENTENCES: whole sentences packed up to the max length across documents, no NSP "
         "(--no-cross-document: DOC-SENTENCES; --packing best-fit: whole documents, least padding)",
    has_nsp_labels=False,
    check=check,
)
