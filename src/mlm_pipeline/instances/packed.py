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
                        cross_documents: bool = True) -> tuple[list[int], list[int]]:
    """Greedy FULL-SENTENCES boundaries as (start, length) ranges of the stream.

    One loop step per sentence (never per token); a separator never starts an instance. Without
    ``cross_documents`` (DOC-SENTENCES) every separator ends the instance it would have joined.
    """
    starts: list[int] = []
    lens: list[int] = []
    pos = 0  # stream position of the current item
    cur_start = 0
    cur_len = 0
    for length, sep in zip(item_len.tolist(), is_sep.tolist()):
        if sep:
            if cur_len == 0 or cur_len + 1 > cap or not cross_documents:
                if cur_len:
                    starts.append(cur_start)
                    lens.append(cur_len)
                cur_len = 0
                pos += 1
                cur_start = pos
                continue
            cur_len += 1
            pos += 1
            continue
        if cur_len + length > cap:
            if cur_len:
                # a trailing separator is dropped when the instance is gathered
                starts.append(cur_start)
                lens.append(cur_len)
            cur_start, cur_len = pos, 0
            while length > cap:  # an over-long sentence: full-length pieces
                starts.append(pos)
                lens.append(cap)
                pos += cap
                length -= cap
            cur_start = pos
        cur_len += length
        pos += length
    if cur_len:
        starts.append(cur_start)
        lens.append(cur_len)
    return starts, lens


def stream_document_starts(sep_positions: np.ndarray, starts: np.ndarray, lens: np.ndarray
                           ) -> tuple[np.ndarray, np.ndarray]:
    """Where each row's documents start, for rows ``[CLS] stream[start:start + len] [SEP]``.

    A row's first document starts at 0 (its ``[CLS]``); each separator inside the row (not its
    last token: a trailing separator is dropped) ends a document, and the next starts right
    after it, at row position ``separator - start + 2``. Returns (starts int32, offsets int64).
    """
    lo = np.searchsorted(sep_positions, starts, side="left")
    hi = np.searchsorted(sep_positions, starts + lens - 1, side="left")  # separators before the last token
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
    starts, lens = np.asarray(starts, np.int64), np.asarray(lens, np.int64)
    if rng is not None:
        order = shuffled_copies(len(starts), copies, rng)
        starts, lens = starts[order], lens[order]
    batch = single_segment_batch(stream, starts, lens, cls_id=cls_id, sep_id=sep_id)
    sep_positions = lengths_to_offsets(item_len)[:-1][is_sep]
    batch.document_starts, batch.document_offsets = stream_document_starts(sep_positions, starts, lens)
    if sources:
        with_sources(batch, docs, starts, lens, separated=True)
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
