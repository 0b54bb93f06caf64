"""``packed``: RoBERTa's FULL-SENTENCES packing, no NSP.

Whole sentences are added while they fit in ``max_seq_length - 2``; an instance may cross a
document boundary, where a ``[SEP]`` separator is inserted; a sentence longer than an instance on
its own is cut into full-length pieces. Each instance is ``[CLS] ... [SEP]``, segment ids all 0.
"""

from __future__ import annotations

import numpy as np

from mlm_pipeline.instances.base import BuildContext, Objective, TokenizedDocs, copies_need_masks, repeat_shuffled
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.instances.single_segment import single_segment_batch, token_stream


def pack_full_sentences(item_len: np.ndarray, is_sep: np.ndarray, cap: int) -> tuple[list[int], list[int]]:
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


def build_packed_instances(docs: TokenizedDocs, *, max_seq_length: int, cls_id: int, sep_id: int) -> InstanceBatch:
    """One FULL-SENTENCES packing of the block, in stream order."""
    if len(docs.doc_sentences) == 0:
        return InstanceBatch.empty(with_nsp=False)
    stream, item_len, is_sep = token_stream(docs, sep_id)
    starts, lens = pack_full_sentences(item_len, is_sep, max_seq_length - 2)
    return single_segment_batch(
        stream, np.asarray(starts, np.int64), np.asarray(lens, np.int64), cls_id=cls_id, sep_id=sep_id
    )


def build(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    """The ``packed`` objective: one packing, ``dupe_factor`` copies of each instance, shuffled."""
    once = build_packed_instances(
        docs, max_seq_length=ctx.settings.max_seq_length, cls_id=ctx.special.cls, sep_id=ctx.special.sep
    )
    batch = repeat_shuffled(once, ctx.settings.dupe_factor, ctx.rng)
    return batch, {"instances": len(batch)}


OBJECTIVE = Objective(
    name="packed",
    build=build,
    help="RoBERTa FULL-SENTENCES: whole sentences packed up to the max length across documents, no NSP",
    has_nsp_labels=False,
    check=copies_need_masks,
)
