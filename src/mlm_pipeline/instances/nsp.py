"""``nsp``: BERT sentence-pair instances with next-sentence labels (default mode).

Follows ``create_instances_from_document`` of google-research/bert: per document a target length
(``max_seq_length - 3``, or with ``short_seq_prob`` a uniform length in ``[2, max]``); sentences are
gathered into a chunk until it reaches the target; segment A is the first ``a_end`` sentences
(uniform in ``[1, len(chunk) - 1]``); with probability 0.5 (always for a one-sentence chunk) segment
B is a random segment of another document of the same block (label 1) and the unused sentences go
back to the document, else B is the rest of the chunk (label 0); the pair is then truncated from a
random end of the longer segment until it fits.

What differs from the reference is only *how*: sentences of a document are contiguous in one flat
token array, so every segment is a (start, length) range; the loop runs once per instance (not per
token) and truncation is computed in closed form with binomial draws for front/back removal; the
token matrix is gathered in one vectorised step at the end.

Defined edge cases:
* a document with one sentence gives one-sentence chunks, whose B is always a random next;
* a block with a single document (a novel without blank lines, say) draws its random-next
  segments from that same document, as the reference does (its ten draws of "another" document
  can only give this one), so its random-next share is the reference's too (about 87% on
  paragraph-per-line text, where most chunks are one sentence); blocks of two or more documents
  never draw from the same document.
"""

from __future__ import annotations

from bisect import bisect_left
from dataclasses import dataclass

import numpy as np

from mlm_pipeline.instances.base import BuildContext, Objective, TokenizedDocs, uniform_stream
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, ranges_to_indices
from mlm_pipeline.instances.reference import BERT_REFERENCE


def truncated_lengths(la: np.ndarray, lb: np.ndarray, max_tokens: int) -> tuple[np.ndarray, np.ndarray]:
    """Lengths after the reference's ``truncate_seq_pair``: remove from the longer (B on ties)."""
    la = la.copy()
    lb = lb.copy()
    excess = np.maximum(la + lb - max_tokens, 0)
    diff = la - lb
    from_a = np.where(diff > 0, np.minimum(excess, diff), 0)
    from_b = np.where(diff < 0, np.minimum(excess, -diff), 0)
    rest = excess - from_a - from_b
    from_b += (rest + 1) // 2
    from_a += rest // 2
    return la - from_a, lb - from_b


@dataclass
class PairStats:
    instances: int = 0
    random_next: int = 0
    short_target_documents: int = 0
    truncated: int = 0
    chunks_without_pair: int = 0

    def to_dict(self) -> dict:
        return {
            "instances": self.instances,
            "random_next": self.random_next,
            "short_target_documents": self.short_target_documents,
            "truncated_pairs": self.truncated,
            "chunks_without_pair": self.chunks_without_pair,
        }


def build_nsp_instances(
    docs: TokenizedDocs,
    *,
    max_seq_length: int,
    short_seq_prob: float,
    dupe_factor: int,
    cls_id: int,
    sep_id: int,
    rng: np.random.Generator,
    shuffle: bool = False,
) -> tuple[InstanceBatch, PairStats]:
    """Unmasked NSP instances for every document, ``dupe_factor`` passes.

    In build order, or with ``shuffle`` in a random order drawn from ``rng``: the instances'
    ranges are permuted before the tokens are gathered, so shuffling costs no second gather.
    """
    max_tokens = max_seq_length - 3
    # Plain Python lists and bisect in the per-instance loop: numpy scalars and searchsorted
    # calls cost about a microsecond each, several times the work they do here.
    sent_off = docs.sentence_offsets.tolist()  # token offset of each sentence boundary
    doc_off = docs.doc_offsets.tolist()  # sentence offset of each document boundary
    n_docs = len(doc_off) - 1
    uniform = uniform_stream(rng)

    def randint(lo: int, hi: int) -> int:
        """Uniform integer in ``[lo, hi]`` inclusive, like ``random.randint``."""
        x = int(uniform() * (hi - lo + 1))
        return lo + (x if x <= hi - lo else hi - lo)

    a_start: list[int] = []
    a_len: list[int] = []
    b_start: list[int] = []
    b_len: list[int] = []
    labels: list[int] = []
    add_a_start, add_a_len, add_b_start, add_b_len, add_label = (
        a_start.append, a_len.append, b_start.append, b_len.append, labels.append
    )
    stats = PairStats()
    for _ in range(dupe_factor):
        for d in range(n_docs):
            s0, s1 = doc_off[d], doc_off[d + 1]
            target = max_tokens
            if uniform() < short_seq_prob:
                target = randint(2, max_tokens)
                stats.short_target_documents += 1
            i = s0
            while i < s1:
                # smallest chunk end j (exclusive) with tokens >= target, or the document end
                base = sent_off[i]
                j = bisect_left(sent_off, base + target, i + 1, s1)  # sent_off[i] < base + target
                n_chunk = j - i
                if n_chunk >= 2:  # a_end = i + randint(1, n_chunk - 1)
                    x = int(uniform() * (n_chunk - 1))
                    a_end = i + 1 + (x if x < n_chunk - 1 else n_chunk - 2)
                else:
                    a_end = i + 1
                la = sent_off[a_end] - base
                if n_chunk == 1 or uniform() < 0.5:
                    if n_docs > 1:
                        r = randint(0, n_docs - 2)
                        r += r >= d  # uniform over the other documents
                    else:  # as the reference, whose 10 draws of another document all give this one
                        r = d
                    r0, r1 = doc_off[r], doc_off[r + 1]
                    rs = randint(r0, r1 - 1)
                    # take sentences rs.. until B reaches target - la (at least one sentence)
                    b0 = sent_off[rs]
                    k = bisect_left(sent_off, b0 + target - la, rs + 1, r1)
                    add_a_start(base)
                    add_a_len(la)
                    add_b_start(b0)
                    add_b_len(sent_off[k] - b0)
                    add_label(1)
                    i = a_end  # unused sentences of the chunk go back to the document
                    continue
                add_a_start(base)
                add_a_len(la)
                add_b_start(sent_off[a_end])
                add_b_len(sent_off[j] - sent_off[a_end])
                add_label(0)
                i = j
    n = len(labels)
    if n == 0:
        return InstanceBatch.empty(), stats
    a_start_arr = np.asarray(a_start, np.int64)
    b_start_arr = np.asarray(b_start, np.int64)
    la0 = np.asarray(a_len, np.int64)
    lb0 = np.asarray(b_len, np.int64)
    la, lb = truncated_lengths(la0, lb0, max_tokens)
    stats.truncated = int(np.count_nonzero((la != la0) | (lb != lb0)))
    # each removed token comes off the front or the back with probability 1/2
    front_a = rng.binomial(la0 - la, 0.5)
    front_b = rng.binomial(lb0 - lb, 0.5)
    a_start_arr += front_a
    b_start_arr += front_b
    labels_arr = np.asarray(labels, np.int8)
    if shuffle:
        order = rng.permutation(n)
        a_start_arr, b_start_arr, la, lb, labels_arr = (
            a_start_arr[order], b_start_arr[order], la[order], lb[order], labels_arr[order]
        )
    # gather [CLS] A [SEP] B [SEP] for all instances at once
    total_len = la + lb + 3
    offsets = lengths_to_offsets(total_len)
    ids = np.empty(int(offsets[-1]), dtype=np.int32)
    seg = np.zeros(int(offsets[-1]), dtype=np.int8)
    a_dst = offsets[:-1] + 1
    b_dst = a_dst + la + 1
    ids[offsets[:-1]] = cls_id
    ids[a_dst + la] = sep_id
    ids[offsets[1:] - 1] = sep_id
    ids[ranges_to_indices(a_dst, la)] = docs.ids[ranges_to_indices(a_start_arr, la)]
    b_dst_idx = ranges_to_indices(b_dst, lb)
    ids[b_dst_idx] = docs.ids[ranges_to_indices(b_start_arr, lb)]
    seg[b_dst_idx] = 1
    seg[offsets[1:] - 1] = 1
    stats.instances = n
    stats.random_next = int(labels_arr.sum())
    return InstanceBatch.unmasked(ids, seg, offsets, labels_arr), stats


def build(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    """The ``nsp`` objective: ``dupe_factor`` passes over the block, instances shuffled."""
    settings = ctx.settings
    batch, stats = build_nsp_instances(
        docs,
        max_seq_length=settings.max_seq_length,
        short_seq_prob=settings.short_seq_prob,
        dupe_factor=settings.dupe_factor,
        cls_id=ctx.special.cls,
        sep_id=ctx.special.sep,
        rng=ctx.rng,
        shuffle=True,
    )
    return batch, stats.to_dict()


OBJECTIVE = Objective(
    name="nsp",
    build=build,
    help="BERT sentence pairs [CLS] A [SEP] B [SEP] with next-sentence labels (50% random next)",
    has_nsp_labels=True,
    reference=BERT_REFERENCE,
)
