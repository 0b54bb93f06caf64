"""Single-segment instances without NSP: RoBERTa FULL-SENTENCES packing and plain token windows.

Both work on the block's token stream with a separator token between documents, so every
instance is one contiguous range of that stream, gathered for all instances in one numpy step.

* ``packed`` (RoBERTa's FULL-SENTENCES): whole sentences are added while they fit in
  ``max_seq_length - 2``; an instance may cross a document boundary, where a ``[SEP]`` separator
  is inserted; a sentence longer than an instance on its own is cut into full-length pieces.
* ``tokens``: the stream cut into consecutive windows of ``max_seq_length - 2`` tokens regardless of
  sentence boundaries (the last window of a block may be shorter), for masking at load time.

Each instance is ``[CLS] ... [SEP]`` with segment ids all 0.
"""

from __future__ import annotations

import numpy as np

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, ranges_to_indices
from mlm_pipeline.instances.bert_nsp import TokenizedDocs


def _stream_with_separators(docs: TokenizedDocs, sep_id: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Token stream with ``sep_id`` between documents, plus item (sentence/separator) lengths.

    Returns (stream, item_lengths, item_is_separator).
    """
    doc_tokens = np.add.reduceat(docs.sentence_lengths, docs.doc_offsets[:-1]) if len(docs.doc_sentences) else np.zeros(0, np.int64)
    doc_token_off = lengths_to_offsets(doc_tokens)
    # insert one separator before every document but the first
    stream = np.insert(docs.ids, doc_token_off[1:-1], sep_id)
    n_items = len(docs.sentence_lengths) + len(docs.doc_sentences) - 1
    item_len = np.ones(n_items, np.int64)
    is_sep = np.zeros(n_items, bool)
    # item positions: sentence s of doc d sits at s + d (d separators before it)
    doc_of_sentence = np.repeat(np.arange(len(docs.doc_sentences)), docs.doc_sentences)
    sentence_item = np.arange(len(docs.sentence_lengths)) + doc_of_sentence
    item_len[sentence_item] = docs.sentence_lengths
    sep_items = docs.doc_offsets[1:-1] + np.arange(len(docs.doc_sentences) - 1)
    is_sep[sep_items] = True
    return stream, item_len, is_sep


def _pack_full_sentences(item_len: np.ndarray, is_sep: np.ndarray, cap: int) -> tuple[list[int], list[int]]:
    """Greedy FULL-SENTENCES boundaries as (start, length) ranges of the stream.

    One loop step per sentence (never per token); a separator never starts an instance.
    """
    starts: list[int] = []
    lens: list[int] = []
    pos = 0  # stream position of the current item
    cur_start = 0
    cur_len = 0
    for length, sep in zip(item_len.tolist(), is_sep.tolist()):
        if sep:
            if cur_len == 0 or cur_len + 1 > cap:
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
                # drop a trailing separator: it separates nothing inside this instance
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


def _trim_separators(stream: np.ndarray, starts: np.ndarray, lens: np.ndarray, sep_id: int):
    """Remove a separator that ends up last in an instance (nothing follows it there)."""
    last = stream[starts + lens - 1]
    lens = lens - ((last == sep_id) & (lens > 1))
    return starts, lens


def build_single_segment_instances(
    docs: TokenizedDocs,
    *,
    objective: str,
    max_seq_length: int,
    cls_id: int,
    sep_id: int,
) -> InstanceBatch:
    if len(docs.doc_sentences) == 0:
        return InstanceBatch.empty(with_nsp=False)
    cap = max_seq_length - 2
    stream, item_len, is_sep = _stream_with_separators(docs, sep_id)
    if objective == "packed":
        s, l = _pack_full_sentences(item_len, is_sep, cap)
        starts, lens = np.asarray(s, np.int64), np.asarray(l, np.int64)
    elif objective == "tokens":
        starts = np.arange(0, len(stream), cap, dtype=np.int64)
        lens = np.minimum(cap, len(stream) - starts)
    else:
        raise ValueError(f"unknown single-segment objective {objective!r}")
    starts, lens = _trim_separators(stream, starts, lens, sep_id)
    total = lens + 2
    offsets = lengths_to_offsets(total)
    ids = np.empty(int(offsets[-1]), np.int32)
    ids[offsets[:-1]] = cls_id
    ids[offsets[1:] - 1] = sep_id
    ids[ranges_to_indices(offsets[:-1] + 1, lens)] = stream[ranges_to_indices(starts, lens)]
    n = len(total)
    return InstanceBatch(
        input_ids=ids,
        segment_ids=np.zeros(len(ids), np.int8),
        offsets=offsets,
        masked_lm_positions=np.zeros(0, np.int32),
        masked_lm_ids=np.zeros(0, np.int32),
        masked_offsets=np.zeros(n + 1, np.int64),
        next_sentence_labels=None,
    )
