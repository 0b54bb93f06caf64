"""BERT sentence-pair instances with next-sentence labels (fast mode).

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
* a block with a single document has no other document to draw from: its pairs are all actual
  next (label 0), a one-sentence chunk is split at a random token boundary, and a chunk of a single
  token cannot form a pair and is counted as ``chunks_without_pair``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, ranges_to_indices


@dataclass
class TokenizedDocs:
    """A block of tokenized documents: flat ids, per-sentence lengths, per-document sentence counts."""

    ids: np.ndarray  # int32 [tokens]
    sentence_lengths: np.ndarray  # int64 [sentences], all > 0
    doc_sentences: np.ndarray  # int64 [documents], all > 0

    @property
    def sentence_offsets(self) -> np.ndarray:
        return lengths_to_offsets(self.sentence_lengths)

    @property
    def doc_offsets(self) -> np.ndarray:
        return lengths_to_offsets(self.doc_sentences)


class _Uniforms:
    """Buffered uniforms from a numpy Generator (scalar draws cost ~1 µs each otherwise)."""

    def __init__(self, rng: np.random.Generator, size: int = 8192):
        self.rng = rng
        self.size = size
        self.buf = rng.random(size)
        self.i = 0

    def next(self) -> float:
        if self.i == self.size:
            self.buf = self.rng.random(self.size)
            self.i = 0
        u = self.buf[self.i]
        self.i += 1
        return float(u)

    def randint(self, lo: int, hi: int) -> int:
        """Uniform integer in ``[lo, hi]`` inclusive, like ``random.randint``."""
        return lo + min(int(self.next() * (hi - lo + 1)), hi - lo)


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
) -> tuple[InstanceBatch, PairStats]:
    """Unmasked NSP instances for every document, ``dupe_factor`` passes, in build order."""
    max_tokens = max_seq_length - 3
    sent_off = docs.sentence_offsets
    doc_off = docs.doc_offsets
    n_docs = len(docs.doc_sentences)
    # cumulative token count at each sentence boundary, for range arithmetic
    u = _Uniforms(rng)
    a_start, a_len, b_start, b_len, labels = [], [], [], [], []
    stats = PairStats()
    for _ in range(dupe_factor):
        for d in range(n_docs):
            s0, s1 = int(doc_off[d]), int(doc_off[d + 1])
            target = max_tokens
            if u.next() < short_seq_prob:
                target = u.randint(2, max_tokens)
                stats.short_target_documents += 1
            i = s0
            while i < s1:
                # smallest chunk end j (exclusive) with tokens >= target, or the document end
                base = sent_off[i]
                j = int(np.searchsorted(sent_off, base + target, side="left"))
                j = min(max(j, i + 1), s1)
                n_chunk = j - i
                a_end = i + (u.randint(1, n_chunk - 1) if n_chunk >= 2 else 1)
                la = int(sent_off[a_end] - base)
                if n_docs > 1 and (n_chunk == 1 or u.next() < 0.5):
                    r = u.randint(0, n_docs - 2)
                    r += r >= d  # uniform over the other documents
                    r0, r1 = int(doc_off[r]), int(doc_off[r + 1])
                    rs = u.randint(r0, r1 - 1)
                    target_b = target - la
                    # take sentences rs.. until B reaches target_b (at least one sentence)
                    k = int(np.searchsorted(sent_off, sent_off[rs] + target_b, side="left"))
                    k = min(max(k, rs + 1), r1)
                    a_start.append(int(base))
                    a_len.append(la)
                    b_start.append(int(sent_off[rs]))
                    b_len.append(int(sent_off[k] - sent_off[rs]))
                    labels.append(1)
                    i = a_end  # unused sentences of the chunk go back to the document
                    continue
                if n_chunk == 1:  # single-document block: split the sentence itself
                    total = la
                    if total < 2:
                        stats.chunks_without_pair += 1
                        i = j
                        continue
                    cut = u.randint(1, total - 1)
                    a_start.append(int(base))
                    a_len.append(cut)
                    b_start.append(int(base) + cut)
                    b_len.append(total - cut)
                else:
                    a_start.append(int(base))
                    a_len.append(la)
                    b_start.append(int(sent_off[a_end]))
                    b_len.append(int(sent_off[j] - sent_off[a_end]))
                labels.append(0)
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
    labels_arr = np.asarray(labels, np.int8)
    stats.instances = n
    stats.random_next = int(labels_arr.sum())
    return (
        InstanceBatch(
            input_ids=ids,
            segment_ids=seg,
            offsets=offsets,
            masked_lm_positions=np.zeros(0, np.int32),
            masked_lm_ids=np.zeros(0, np.int32),
            masked_offsets=np.zeros(n + 1, np.int64),
            next_sentence_labels=labels_arr,
        ),
        stats,
    )
