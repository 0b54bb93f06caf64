"""The in-memory form of training instances: ragged (CSR) numpy arrays.

Every builder (BERT NSP, reference, packed, tokens-only) produces an ``InstanceBatch``, the masker
fills its masked-LM fields, and every writer consumes it. Rows are stored back to back in flat
arrays with an ``offsets`` array (like an Arrow ``ListArray``), so a batch of thousands of
instances is a handful of numpy arrays and no Python object per instance or per token.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass

import numpy as np


def ranges_to_indices(starts: np.ndarray, lengths: np.ndarray) -> np.ndarray:
    """Concatenate ``arange(s, s + n)`` for every (s, n) pair, vectorised, as ``intp``.

    One cumulative sum over steps of 1, where each range's first step jumps from the end of the
    range before it. ``intp`` is what numpy's gathers and scatters index with: an int32 index was
    cheaper to build but converted by every gather (a dupe-5 block's token index and gather:
    10.5 -> 7.7 ms).
    """
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if not (keep := lengths > 0).all():
        starts, lengths = starts[keep], lengths[keep]
    total = int(lengths.sum())
    if total == 0:
        return np.zeros(0, dtype=np.intp)
    steps = np.ones(total, dtype=np.intp)
    steps[0] = starts[0]
    steps[np.cumsum(lengths[:-1])] = starts[1:] - (starts[:-1] + lengths[:-1]) + 1
    return np.cumsum(steps, out=steps)


_GATHER_RANGES = 1 << 13
"""Ranges :func:`gather_ranges` gathers at a time: an index of about a MB, which stays in cache
(a dupe-5 block's token gather: 7.8 ms as one index, 5.3 ms in steps of 8,192 ranges)."""


def gather_ranges(sources: tuple[np.ndarray, ...], starts: np.ndarray, lengths: np.ndarray) -> list[np.ndarray]:
    """For each source, ``source[s:s + n]`` of every (s, n) pair, concatenated.

    The gather of :func:`ranges_to_indices`, ``_GATHER_RANGES`` ranges at a time into the
    output: the index (8 bytes a value) stays small, where a block's index was tens of MB of
    fresh memory and a whole file's (reference mode shuffles all its instances) hundreds. The
    ranges are checked against the sources once, so the gathers skip numpy's per-value check.
    """
    starts = np.asarray(starts, dtype=np.int64)
    lengths = np.asarray(lengths, dtype=np.int64)
    if len(starts) and (int(starts.min()) < 0 or int(lengths.min()) < 0
                        or int((starts + lengths).max()) > min(len(source) for source in sources)):
        raise IndexError("a range reaches outside its source")
    ends = np.cumsum(lengths)
    outs = [np.empty(int(ends[-1]) if len(ends) else 0, source.dtype) for source in sources]
    for lo in range(0, len(starts), _GATHER_RANGES):
        hi = min(lo + _GATHER_RANGES, len(starts))
        index = ranges_to_indices(starts[lo:hi], lengths[lo:hi])
        first = int(ends[lo - 1]) if lo else 0
        for source, out in zip(sources, outs):
            np.take(source, index, out=out[first : int(ends[hi - 1])], mode="clip")  # (checked above)
    return outs


def sentence_pairs(tokens: np.ndarray, a_starts: np.ndarray, a_lengths: np.ndarray, b_starts: np.ndarray,
                   b_lengths: np.ndarray, *, cls_id: int, sep_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``[CLS] A [SEP] B [SEP]`` rows from ranges of ``tokens``: (input ids int32, segment ids int8
    (0 through the first ``[SEP]``, 1 after), offsets). Five ranges per row over the tokens
    followed by ``[CLS]`` and ``[SEP]``, one :func:`gather_ranges`."""
    n = len(a_starts)
    source = np.concatenate([tokens, np.array([cls_id, sep_id], dtype=tokens.dtype)])
    cls_at, sep_at = len(tokens), len(tokens) + 1
    starts = np.empty((n, 5), np.int64)
    lengths = np.ones((n, 5), np.int64)
    starts[:, 0], starts[:, 1], starts[:, 2], starts[:, 3], starts[:, 4] = cls_at, a_starts, sep_at, b_starts, sep_at
    lengths[:, 1], lengths[:, 3] = a_lengths, b_lengths
    ids = gather_ranges((source,), starts.ravel(), lengths.ravel())[0].astype(np.int32, copy=False)
    segments = np.repeat(np.tile(np.array([0, 0, 0, 1, 1], np.int8), n), lengths.ravel())
    return ids, segments, lengths_to_offsets(np.asarray(a_lengths) + np.asarray(b_lengths) + 3)


def range_documents(doc_starts: np.ndarray, doc_ends: np.ndarray, starts: np.ndarray, lengths: np.ndarray,
                    rows: np.ndarray, n_rows: int) -> tuple[np.ndarray, np.ndarray]:
    """The documents each row's token ranges come from: (documents int64, offsets int64 [n_rows + 1]).

    Document ``d`` holds positions ``[doc_starts[d], doc_ends[d])`` of the ranges' source (both
    ascending; positions between documents, such as a stream's separators, belong to none).
    Range ``k`` is ``[starts[k], starts[k] + lengths[k])`` of row ``rows[k]`` (rows ascending, a
    row's ranges in the order its tokens come); each overlapping document is listed once per
    run of ranges, in that order. Two binary searches per range, no per-token work.
    """
    starts = np.asarray(starts, np.int64)
    ends = starts + np.asarray(lengths, np.int64)
    first = np.searchsorted(doc_ends, starts, side="right")  # the first document ending after the start
    last = np.searchsorted(doc_starts, ends, side="left") - 1  # the last one starting before the end
    counts = np.where(ends > starts, np.maximum(last - first + 1, 0), 0)
    documents = ranges_to_indices(first, counts).astype(np.int64)
    row_of = np.repeat(np.asarray(rows, np.int64), counts)
    if len(documents) > 1:
        keep = np.ones(len(documents), bool)
        keep[1:] = (documents[1:] != documents[:-1]) | (row_of[1:] != row_of[:-1])
        documents, row_of = documents[keep], row_of[keep]
    return documents, lengths_to_offsets(np.bincount(row_of, minlength=n_rows))


def _smallest_uint(*arrays: np.ndarray) -> type:
    """The smallest of uint8/uint16/uint32 holding every value of the arrays, else int64."""
    lo = min((int(a.min()) for a in arrays if a.size), default=0)
    hi = max((int(a.max()) for a in arrays if a.size), default=0)
    if lo < 0:
        return np.int64
    for dtype in (np.uint8, np.uint16, np.uint32):
        if hi <= np.iinfo(dtype).max:
            return dtype
    return np.int64


def lengths_to_offsets(lengths: np.ndarray) -> np.ndarray:
    offsets = np.zeros(len(lengths) + 1, dtype=np.int64)
    np.cumsum(lengths, out=offsets[1:])
    return offsets


def _take_ragged(values: np.ndarray, offsets: np.ndarray, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The ragged rows ``order`` of ``values`` cut by ``offsets``, and their offsets (a row's
    document starts, its source records)."""
    counts = np.diff(offsets)[order]
    (taken,) = gather_ranges((values,), offsets[:-1][order], counts)
    return taken, lengths_to_offsets(counts)


def _concat_sources(batches: list["InstanceBatch"]) -> dict:
    """The source fields of ``batches`` one after another (those the first batch has)."""
    names = [name for name in InstanceBatch._SOURCE_FIELDS if any(getattr(b, name) is not None for b in batches)]
    if not names:
        return {}
    # a batch without them (an empty shard's) has no source for its rows
    out = {"source_offsets": lengths_to_offsets(np.concatenate(
        [np.diff(b.source_offsets) if b.source_offsets is not None else np.zeros(len(b), np.int64) for b in batches]))}
    for name in names:
        out[name] = np.concatenate([getattr(b, name) if getattr(b, name) is not None else np.zeros(0, object)
                                    for b in batches])
    return out


@dataclass
class InstanceBatch:
    """A batch of instances in ragged layout.

    ``input_ids[offsets[i]:offsets[i+1]]`` are the (unpadded) tokens of instance ``i`` with their
    ``segment_ids``. ``masked_lm_positions[masked_offsets[i]:masked_offsets[i+1]]`` are its masked
    positions (ascending) and ``masked_lm_ids`` the original token at each. ``input_ids`` already
    holds the corrupted tokens (``[MASK]``, random or kept). ``next_sentence_labels`` is 1 when
    segment B is a random next segment (Google's convention), 0 when it is the actual next; it is
    ``None`` for objectives without NSP. An unmasked batch has empty masked arrays and
    ``masked_offsets`` of zeros. ``token_boundary`` (ALBERT's feature, ``sop`` only, else
    ``None``) is 1 per token that starts a word, ``[CLS]`` and ``[SEP]``, 0 per continuation.

    Two optional fields for today's recipes, ``None`` where an objective has none:

    - ``document_starts[document_offsets[i]:document_offsets[i+1]]``: the positions in row ``i``
      where each of its documents begins, ascending, the first 0. With the row's length appended
      they are FlashAttention's ``cu_seqlens`` for that row: a packed row's tokens attend within
      their own document only.
    - ``languages``: each row's language code (``"en"``, ``"zh"``), a numpy string array.

    And, only in runs that ask for them (``--id-field``, ``--metadata-field``), the input
    records each row's tokens come from, in the order their tokens appear in the row:
    ``source_offsets`` cuts the flat arrays ``source_documents`` (while building: the block's
    document indices), ``document_ids`` and ``document_metadata`` (strings, numpy object
    arrays, filled from the block's records by the task) into rows, like ``document_offsets``.
    """

    input_ids: np.ndarray  # int32 [total_tokens]
    segment_ids: np.ndarray  # int8 [total_tokens]
    offsets: np.ndarray  # int64 [n + 1]
    masked_lm_positions: np.ndarray  # int32 [total_masked]
    masked_lm_ids: np.ndarray  # int32 [total_masked]
    masked_offsets: np.ndarray  # int64 [n + 1]
    next_sentence_labels: np.ndarray | None  # int8 [n] or None
    token_boundary: np.ndarray | None = None  # int8 [total_tokens] or None
    document_starts: np.ndarray | None = None  # int32 [total_documents] or None
    document_offsets: np.ndarray | None = None  # int64 [n + 1] or None (with document_starts)
    languages: np.ndarray | None = None  # str [n] or None
    source_offsets: np.ndarray | None = None  # int64 [n + 1] or None (with the three below)
    source_documents: np.ndarray | None = None  # int64 [total_sources] or None (block document indices)
    document_ids: np.ndarray | None = None  # object (str) [total_sources] or None
    document_metadata: np.ndarray | None = None  # object (str, JSON) [total_sources] or None

    _SOURCE_FIELDS = ("source_documents", "document_ids", "document_metadata")

    def _sources(self, pick) -> dict:
        """The source fields (``source_offsets`` and those set) of the rows ``pick(values, offsets)``
        selects, as keyword arguments for a new batch."""
        if self.source_offsets is None:
            return {}
        out = {}
        for name in self._SOURCE_FIELDS:
            values = getattr(self, name)
            if values is not None:
                out[name], out["source_offsets"] = pick(values, self.source_offsets)
        return out

    def __len__(self) -> int:
        return len(self.offsets) - 1

    @property
    def lengths(self) -> np.ndarray:
        return np.diff(self.offsets)

    @property
    def masked_counts(self) -> np.ndarray:
        return np.diff(self.masked_offsets)

    @classmethod
    def unmasked(cls, input_ids: np.ndarray, segment_ids: np.ndarray, offsets: np.ndarray,
                 next_sentence_labels: np.ndarray | None = None) -> "InstanceBatch":
        """Instances as built, before masking (empty masked arrays)."""
        return cls(
            input_ids=input_ids,
            segment_ids=segment_ids,
            offsets=offsets,
            masked_lm_positions=np.zeros(0, np.int32),
            masked_lm_ids=np.zeros(0, np.int32),
            masked_offsets=np.zeros(len(offsets), np.int64),
            next_sentence_labels=next_sentence_labels,
        )

    @classmethod
    def empty(cls, *, with_nsp: bool = True) -> "InstanceBatch":
        return cls(
            input_ids=np.zeros(0, np.int32),
            segment_ids=np.zeros(0, np.int8),
            offsets=np.zeros(1, np.int64),
            masked_lm_positions=np.zeros(0, np.int32),
            masked_lm_ids=np.zeros(0, np.int32),
            masked_offsets=np.zeros(1, np.int64),
            next_sentence_labels=np.zeros(0, np.int8) if with_nsp else None,
        )

    def row(self, i: int) -> dict:
        """One instance as plain Python lists (for inspection and tests, not the hot path)."""
        s, e = self.offsets[i], self.offsets[i + 1]
        ms, me = self.masked_offsets[i], self.masked_offsets[i + 1]
        out = {
            "input_ids": self.input_ids[s:e].tolist(),
            "segment_ids": self.segment_ids[s:e].tolist(),
            "masked_lm_positions": self.masked_lm_positions[ms:me].tolist(),
            "masked_lm_ids": self.masked_lm_ids[ms:me].tolist(),
        }
        if self.next_sentence_labels is not None:
            out["next_sentence_label"] = int(self.next_sentence_labels[i])
        if self.token_boundary is not None:
            out["token_boundary"] = self.token_boundary[s:e].tolist()
        if self.document_starts is not None:
            ds, de = self.document_offsets[i], self.document_offsets[i + 1]
            out["document_starts"] = self.document_starts[ds:de].tolist()
        if self.languages is not None:
            out["language"] = str(self.languages[i])
        if self.source_offsets is not None:
            ss, se = self.source_offsets[i], self.source_offsets[i + 1]
            for name in self._SOURCE_FIELDS:
                if getattr(self, name) is not None:
                    out[name] = getattr(self, name)[ss:se].tolist()
        return out

    def _documents_of(self, order: np.ndarray) -> tuple[np.ndarray | None, np.ndarray | None]:
        """``document_starts`` and ``document_offsets`` of the rows ``order``, in that order."""
        if self.document_starts is None:
            return None, None
        return _take_ragged(self.document_starts, self.document_offsets, order)

    def take(self, order: np.ndarray) -> "InstanceBatch":
        """Rows in the given order (used to shuffle instances within a task)."""
        order = np.asarray(order, dtype=np.int64)
        lens = self.lengths[order]
        mlens = self.masked_counts[order]
        sources = (self.input_ids, self.segment_ids) + (() if self.token_boundary is None else (self.token_boundary,))
        input_ids, segment_ids, *boundary = gather_ranges(sources, self.offsets[:-1][order], lens)
        documents = self._documents_of(order)
        positions, masked_ids = gather_ranges((self.masked_lm_positions, self.masked_lm_ids),
                                              self.masked_offsets[:-1][order], mlens)
        return InstanceBatch(
            input_ids=input_ids,
            segment_ids=segment_ids,
            offsets=lengths_to_offsets(lens),
            masked_lm_positions=positions,
            masked_lm_ids=masked_ids,
            masked_offsets=lengths_to_offsets(mlens),
            next_sentence_labels=None
            if self.next_sentence_labels is None
            else self.next_sentence_labels[order],
            token_boundary=boundary[0] if boundary else None,
            document_starts=documents[0],
            document_offsets=documents[1],
            languages=None if self.languages is None else self.languages[order],
            **self._sources(lambda values, offsets: _take_ragged(values, offsets, order)),
        )

    def slice(self, start: int, stop: int) -> "InstanceBatch":
        """Rows ``start:stop`` (used to cut a task's output into shards)."""
        s, e = int(self.offsets[start]), int(self.offsets[stop])
        ms, me = int(self.masked_offsets[start]), int(self.masked_offsets[stop])
        return InstanceBatch(
            input_ids=self.input_ids[s:e],
            segment_ids=self.segment_ids[s:e],
            offsets=self.offsets[start : stop + 1] - s,
            masked_lm_positions=self.masked_lm_positions[ms:me],
            masked_lm_ids=self.masked_lm_ids[ms:me],
            masked_offsets=self.masked_offsets[start : stop + 1] - ms,
            next_sentence_labels=None
            if self.next_sentence_labels is None
            else self.next_sentence_labels[start:stop],
            token_boundary=None if self.token_boundary is None else self.token_boundary[s:e],
            document_starts=None if self.document_starts is None
            else self.document_starts[int(self.document_offsets[start]):int(self.document_offsets[stop])],
            document_offsets=None if self.document_offsets is None
            else self.document_offsets[start : stop + 1] - self.document_offsets[start],
            languages=None if self.languages is None else self.languages[start:stop],
            **self._sources(lambda values, offsets: (values[int(offsets[start]):int(offsets[stop])],
                                                     offsets[start : stop + 1] - offsets[start])),
        )

    @staticmethod
    def concat(batches: list["InstanceBatch"]) -> "InstanceBatch":
        if not batches:
            return InstanceBatch.empty()
        if len(batches) == 1:
            return batches[0]
        if any(b.document_starts is None for b in batches) and any(b.document_starts is not None for b in batches):
            # rows that recorded no document starts (an output written before they were) are one document each
            batches = [b if b.document_starts is not None else dataclasses.replace(
                b, document_starts=np.zeros(len(b), np.int32), document_offsets=np.arange(len(b) + 1, dtype=np.int64))
                for b in batches]
        lens = np.concatenate([b.lengths for b in batches])
        mlens = np.concatenate([b.masked_counts for b in batches])
        nsp = (
            None
            if batches[0].next_sentence_labels is None
            else np.concatenate([b.next_sentence_labels for b in batches])
        )
        return InstanceBatch(
            input_ids=np.concatenate([b.input_ids for b in batches]),
            segment_ids=np.concatenate([b.segment_ids for b in batches]),
            offsets=lengths_to_offsets(lens),
            masked_lm_positions=np.concatenate([b.masked_lm_positions for b in batches]),
            masked_lm_ids=np.concatenate([b.masked_lm_ids for b in batches]),
            masked_offsets=lengths_to_offsets(mlens),
            next_sentence_labels=nsp,
            token_boundary=None if batches[0].token_boundary is None
            else np.concatenate([b.token_boundary for b in batches]),
            document_starts=None if batches[0].document_starts is None
            else np.concatenate([b.document_starts for b in batches]),
            document_offsets=None if batches[0].document_offsets is None
            else lengths_to_offsets(np.concatenate([np.diff(b.document_offsets) for b in batches])),
            languages=None if batches[0].languages is None else np.concatenate([b.languages for b in batches]),
            **_concat_sources(batches),
        )

    def cu_seqlens(self, i: int) -> np.ndarray:
        """Row ``i``'s document boundaries with its length appended (FlashAttention's
        ``cu_seqlens`` for that row alone); one document, ``[0, length]``, without documents."""
        length = int(self.offsets[i + 1] - self.offsets[i])
        if self.document_starts is None:
            return np.array([0, length], np.int32)
        ds, de = int(self.document_offsets[i]), int(self.document_offsets[i + 1])
        return np.append(self.document_starts[ds:de], length).astype(np.int32)

    def padded(self, max_seq_length: int, max_predictions: int, *, compact: bool = False,
               with_ids: bool = True) -> dict[str, np.ndarray]:
        """The batch as fixed-size 2-D arrays in the layout of BERT's ``run_pretraining.py``.

        Integer features are int64 (``masked_lm_weights`` float32). With ``compact=True`` they
        hold the same values in the smallest dtype that fits (uint8 masks, segments and, up to
        256 positions, positions; uint16 ids for vocabularies up to 65536), which is what an
        encoder narrowing values would compute anyway — four to eight times less memory to fill.
        ``with_ids=False`` leaves out ``input_ids`` and ``masked_lm_ids`` (the TFRecord encoder
        takes them unpadded).
        """
        n = len(self)
        lens = self.lengths
        if n and int(lens.max()) > max_seq_length:
            raise ValueError(f"instance of length {int(lens.max())} exceeds max_seq_length {max_seq_length}")
        mcounts = self.masked_counts
        if n and int(mcounts.max()) > max_predictions:
            raise ValueError(
                f"instance with {int(mcounts.max())} masked positions exceeds max_predictions {max_predictions}"
            )
        if compact:
            ids_dtype = _smallest_uint(self.input_ids, self.masked_lm_ids) if with_ids else np.int64
            small_dtype = _smallest_uint(self.segment_ids)
            pos_dtype = np.uint8 if max_seq_length <= 256 else np.uint16
            nsp_dtype = np.int64 if self.next_sentence_labels is None else _smallest_uint(self.next_sentence_labels)
            mask_dtype = np.uint8
        else:
            ids_dtype = small_dtype = pos_dtype = nsp_dtype = mask_dtype = np.int64
        # Boolean-mask assignment fills the rows in order (row-major), exactly where the ragged
        # rows go: cheaper than scattering with (row, column) index arrays.
        inside = np.arange(max_seq_length)[None, :] < lens[:, None]
        out = {}
        if with_ids:
            out["input_ids"] = np.zeros((n, max_seq_length), ids_dtype)
            out["input_ids"][inside] = self.input_ids
        segment_ids = np.zeros((n, max_seq_length), small_dtype)
        segment_ids[inside] = self.segment_ids
        input_mask = inside.astype(mask_dtype)
        masked = np.arange(max_predictions)[None, :] < mcounts[:, None]
        positions = np.zeros((n, max_predictions), pos_dtype)
        positions[masked] = self.masked_lm_positions
        if with_ids:
            out["masked_lm_ids"] = np.zeros((n, max_predictions), ids_dtype)
            out["masked_lm_ids"][masked] = self.masked_lm_ids
        weights = masked.astype(np.float32)
        nsp = (
            np.zeros((n, 1), nsp_dtype)
            if self.next_sentence_labels is None
            else self.next_sentence_labels.astype(nsp_dtype).reshape(n, 1)
        )
        if self.token_boundary is not None:
            out["token_boundary"] = np.zeros((n, max_seq_length), small_dtype)
            out["token_boundary"][inside] = self.token_boundary
        return {
            **out,
            "input_mask": input_mask,
            "segment_ids": segment_ids,
            "masked_lm_positions": positions,
            "masked_lm_weights": weights,
            "next_sentence_labels": nsp,
        }

    @classmethod
    def from_padded(cls, features: dict[str, np.ndarray]) -> "InstanceBatch":
        """Inverse of :meth:`padded` (readers of TFRecord shards use it); without masked-LM
        features (ELECTRA's layout) the batch has no masked positions."""
        input_mask = np.asarray(features["input_mask"])
        lens = input_mask.sum(axis=1).astype(np.int64)
        keep = np.asarray(input_mask, bool)
        if "masked_lm_weights" not in features:
            features = {**features, "masked_lm_weights": np.zeros((len(lens), 0), np.float32),
                        "masked_lm_positions": np.zeros((len(lens), 0), np.int64),
                        "masked_lm_ids": np.zeros((len(lens), 0), np.int64)}
        weights = np.asarray(features["masked_lm_weights"]) > 0
        mlens = weights.sum(axis=1).astype(np.int64)
        nsp = features.get("next_sentence_labels")
        boundary = features.get("token_boundary")
        return cls(
            input_ids=np.asarray(features["input_ids"])[keep].astype(np.int32),
            segment_ids=np.asarray(features["segment_ids"])[keep].astype(np.int8),
            offsets=lengths_to_offsets(lens),
            masked_lm_positions=np.asarray(features["masked_lm_positions"])[weights].astype(np.int32),
            masked_lm_ids=np.asarray(features["masked_lm_ids"])[weights].astype(np.int32),
            masked_offsets=lengths_to_offsets(mlens),
            next_sentence_labels=None
            if nsp is None
            else np.asarray(nsp).reshape(-1).astype(np.int8),
            token_boundary=None if boundary is None else np.asarray(boundary)[keep].astype(np.int8),
        )
