"""``nsp``: BERT sentence-pair instances with next-sentence labels (default mode).

Follows ``create_instances_from_document`` of google-research/bert: per document a target length
(``max_seq_length - 3``, or with ``short_seq_prob`` a uniform length in ``[2, max]``); sentences are
gathered into a chunk until it reaches the target; segment A is the first ``a_end`` sentences
(uniform in ``[1, len(chunk) - 1]``); with probability 0.5 (always for a one-sentence chunk) segment
B is a random segment of another document of the same block (label 1) and the unused sentences go
back to the document, else B is the rest of the chunk (label 0); the pair is then truncated from a
random end of the longer segment until it fits.

What differs from the reference is *how*, and the random stream: sentences of a document are
contiguous in one flat token array, so every segment is a (start, length) range; the passes over
the documents (``dupe_factor`` x documents) are independent, so they advance together, one chunk
per round, vectorised over all active passes (the last few in Python, from the same draws);
truncation is computed in closed form with binomial draws for front/back removal; the tokens are
gathered in one vectorised step at the end.

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
from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

from mlm_pipeline.instances.base import BuildContext, Objective, TokenizedDocs, uniform_stream, with_sources
from mlm_pipeline.instances.batch import InstanceBatch, sentence_pairs
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
    truncated_tokens: int = 0
    chunks_without_pair: int = 0
    swapped: int | None = None  # sop: pairs in swapped order (label 1 with B the actual next)

    def to_dict(self) -> dict:
        extra = {} if self.swapped is None else {"sentence_order_swapped": self.swapped}
        return {
            **extra,
            "instances": self.instances,
            "random_next": self.random_next,
            "short_target_documents": self.short_target_documents,
            "truncated_pairs": self.truncated,
            "truncated_tokens": self.truncated_tokens,
            "chunks_without_pair": self.chunks_without_pair,
        }


def _python_rounds(sent_off: list[int], doc_off: list[int], n_docs: int, state: list[list[int]],
                   uniform: Callable[[], float], out: list[list[int]], sentence_order: bool = False) -> None:
    """The rounds of :func:`_rounds` for few active passes: the same step, the same four draws per
    pass and round in the same order, in plain Python (a numpy call costs about a microsecond,
    several times this step's work on one pass). ``state`` holds lists (stream, doc, sentence,
    document end, target) of the active passes; ``out`` gets the rows (stream, a start, a length,
    b start, b length, label), round after round. ``sentence_order`` (``sop``): the coin that picks a
    random next swaps A and B instead (label 2); only a one-sentence chunk takes a random next."""
    stream, doc, sent, end, target = state
    add_stream, add_a_start, add_a_len, add_b_start, add_b_len, add_label = (col.append for col in out)
    while stream:
        alive = []
        for x in range(len(stream)):
            u_a, u_next, u_doc, u_sent = uniform(), uniform(), uniform(), uniform()
            i, s1, t = sent[x], end[x], target[x]
            base = sent_off[i]
            j = bisect_left(sent_off, base + t, i + 1, s1)
            n_chunk = j - i
            a_end = i + 1 + min(int(u_a * (n_chunk - 1)), n_chunk - 2) if n_chunk >= 2 else i + 1
            la = sent_off[a_end] - base
            add_stream(stream[x])
            add_a_start(base)
            add_a_len(la)
            if n_chunk == 1 or (u_next < 0.5 and not sentence_order):
                d = doc[x]
                if n_docs > 1:
                    r = min(int(u_doc * (n_docs - 1)), n_docs - 2)
                    r += r >= d
                else:
                    r = d
                r0, r1 = doc_off[r], doc_off[r + 1]
                rs = r0 + min(int(u_sent * (r1 - r0)), r1 - r0 - 1)
                b0 = sent_off[rs]
                add_b_start(b0)
                add_b_len(sent_off[bisect_left(sent_off, b0 + t - la, rs + 1, r1)] - b0)
                add_label(1)
                i = a_end
            else:
                add_b_start(sent_off[a_end])
                add_b_len(sent_off[j] - sent_off[a_end])
                add_label(2 if sentence_order and u_next < 0.5 else 0)
                i = j
            if i < s1:
                sent[x] = i
                alive.append(x)
        if len(alive) < len(stream):
            stream, doc, sent, end, target = ([col[x] for x in alive] for col in (stream, doc, sent, end, target))


_VECTOR_PASSES = 32
"""Rounds run vectorised while at least this many document passes are active, then in Python:
below it the numpy calls' fixed cost outweighs the per-pass work (a block that is one long
document, such as a novel without blank lines, runs in Python from the start)."""


def _numpy_round(sent_off: np.ndarray, doc_off: np.ndarray, n_docs: int, state: list[np.ndarray],
                 u: np.ndarray, sentence_order: bool = False) -> tuple[tuple[np.ndarray, ...], np.ndarray]:
    """One round for all active passes at once: each makes its next instance. Returns the rows
    (stream, a start, a length, b start, b length, label) and each pass's next sentence."""
    stream, doc, i, end, target = state
    base = sent_off[i]
    # smallest chunk end j (exclusive) with tokens >= target, or the document end: bisect_left in
    # [i + 1, end) is the global search clipped to that range (offsets strictly increase)
    j = np.clip(np.searchsorted(sent_off, base + target), i + 1, end)
    n_chunk = j - i
    a_end = np.where(n_chunk >= 2, i + 1 + np.minimum((u[:, 0] * (n_chunk - 1)).astype(np.int64), n_chunk - 2),
                     i + 1)
    la = sent_off[a_end] - base
    coin = u[:, 1] < 0.5
    random_next = (n_chunk == 1) | (coin & (not sentence_order))
    label = random_next.astype(np.int64) + 2 * (coin & ~random_next) if sentence_order else random_next
    if n_docs > 1:
        r = np.minimum((u[:, 2] * (n_docs - 1)).astype(np.int64), n_docs - 2)
        r += r >= doc  # uniform over the other documents
    else:  # as the reference, whose 10 draws of another document all give this one
        r = doc
    r0, r1 = doc_off[r], doc_off[r + 1]
    rs = r0 + np.minimum((u[:, 3] * (r1 - r0)).astype(np.int64), r1 - r0 - 1)
    # a random B: sentences rs.. until it reaches target - la (at least one sentence)
    k = np.clip(np.searchsorted(sent_off, sent_off[rs] + target - la), rs + 1, r1)
    b_start = np.where(random_next, sent_off[rs], sent_off[a_end])
    b_len = np.where(random_next, sent_off[k], sent_off[j]) - b_start
    # a random next gives the chunk's unused sentences back to the document
    return (stream, base, la, b_start, b_len, label), np.where(random_next, a_end, j)


def _rounds(sent_off: np.ndarray, doc_off: np.ndarray, target: np.ndarray, rng: np.random.Generator,
            sentence_order: bool = False) -> tuple[np.ndarray, ...]:
    """All instances of all document passes (stream ``p * n_docs + d`` is pass ``p`` over
    document ``d``), in (stream, chunk) order: (a start, a length, b start, b length, label).

    Passes are independent, so a round advances every active pass by one chunk: four uniforms
    per active pass and round, in stream order, whether or not the step uses them. The draws do
    not depend on how a round is computed, so the numpy and the Python rounds give the same
    instances, and the switch from one to the other (``_VECTOR_PASSES``) never changes output.
    """
    n_docs = len(doc_off) - 1
    stream = np.arange(len(target))
    doc = stream % n_docs
    state = [stream, doc, doc_off[doc], doc_off[doc + 1], target]
    parts: list[tuple[np.ndarray, ...]] = []
    while len(state[0]) >= _VECTOR_PASSES:
        row, nxt = _numpy_round(sent_off, doc_off, n_docs, state, rng.random((len(state[0]), 4)), sentence_order)
        parts.append(row)
        alive = nxt < state[3]
        state[2] = nxt
        state = [col[alive] for col in state]
    if len(state[0]):
        out: list[list[int]] = [[], [], [], [], [], []]
        _python_rounds(sent_off.tolist(), doc_off.tolist(), n_docs, [col.tolist() for col in state],
                       uniform_stream(rng), out, sentence_order)
        parts.append(tuple(np.asarray(col, np.int64) for col in out))
    columns = [np.concatenate([part[c] for part in parts]) for c in range(6)]
    order = np.argsort(columns[0], kind="stable")  # round after round -> pass after pass
    return tuple(col[order] for col in columns[1:])


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
    sentence_order: bool = False,
    sources: bool = False,
) -> tuple[InstanceBatch, PairStats]:
    """Unmasked NSP instances for every document, ``dupe_factor`` passes.

    In build order (pass, document, chunk), or with ``shuffle`` in a random order drawn from
    ``rng``: the instances' ranges are permuted before the tokens are gathered, so shuffling costs
    no second gather. ``sentence_order``: ALBERT's pairs (``sop``): the next-sentence coin swaps A
    and B (label 1) instead of taking B from another document, which only a one-sentence chunk
    does (label 1); the swap comes before truncation, as in ALBERT's script. ``sources``: each
    row's documents (A's, then B's if another), as ``source_documents``.
    """
    max_tokens = max_seq_length - 3
    stats = PairStats()
    n_streams = dupe_factor * len(docs.doc_sentences)
    if n_streams == 0:
        return InstanceBatch.empty(), stats
    # each pass's target length: max_tokens, or with short_seq_prob uniform in [2, max_tokens]
    first = rng.random((n_streams, 2))
    short = first[:, 0] < short_seq_prob
    target = np.where(short, 2 + np.minimum((first[:, 1] * (max_tokens - 1)).astype(np.int64), max_tokens - 2),
                      max_tokens)
    stats.short_target_documents = int(np.count_nonzero(short))
    # the rounds draw from a generator of their own: the Python rounds draw ahead in blocks
    rounds_rng = np.random.default_rng(int(rng.integers(0, 1 << 63)))
    a_start_arr, la0, b_start_arr, lb0, labels_arr = _rounds(docs.sentence_offsets, docs.doc_offsets, target,
                                                             rounds_rng, sentence_order)
    n = len(labels_arr)
    own_b = labels_arr != 1  # B from this document (a random B's tokens are its own document's: not lost here)
    if sentence_order:
        swapped = labels_arr == 2
        stats.swapped = int(np.count_nonzero(swapped))
        a_start_arr, b_start_arr = np.where(swapped, b_start_arr, a_start_arr), np.where(swapped, a_start_arr, b_start_arr)
        la0, lb0 = np.where(swapped, lb0, la0), np.where(swapped, la0, lb0)
        labels_arr = labels_arr > 0
    labels_arr = labels_arr.astype(np.int8)
    la, lb = truncated_lengths(la0, lb0, max_tokens)
    stats.truncated = int(np.count_nonzero((la != la0) | (lb != lb0)))
    stats.truncated_tokens = int((la0 - la).sum() + ((lb0 - lb) * own_b).sum())
    # each removed token comes off the front or the back with probability 1/2
    front_a = rng.binomial(la0 - la, 0.5)
    front_b = rng.binomial(lb0 - lb, 0.5)
    a_start_arr += front_a
    b_start_arr += front_b
    if shuffle:
        order = rng.permutation(n)
        a_start_arr, b_start_arr, la, lb, labels_arr = (
            a_start_arr[order], b_start_arr[order], la[order], lb[order], labels_arr[order]
        )
    ids, seg, offsets = sentence_pairs(docs.ids, a_start_arr, la, b_start_arr, lb, cls_id=cls_id, sep_id=sep_id)
    stats.instances = n
    stats.random_next = int(labels_arr.sum())
    batch = InstanceBatch.unmasked(ids, seg, offsets, labels_arr)
    if sources:  # two ranges a row, A then B
        with_sources(batch, docs, np.column_stack([a_start_arr, b_start_arr]).ravel(),
                     np.column_stack([la, lb]).ravel(), separated=False, rows=np.repeat(np.arange(n), 2))
    return batch, stats


def build_pairs(docs: TokenizedDocs, ctx: BuildContext, *,
                sentence_order: bool = False) -> tuple[InstanceBatch, PairStats]:
    """``dupe_factor`` passes of the run's pairs over the block, instances shuffled: BERT's
    (``nsp``), or with ``sentence_order`` ALBERT's (``sop``)."""
    settings = ctx.settings
    return build_nsp_instances(
        docs,
        max_seq_length=settings.max_seq_length,
        short_seq_prob=settings.short_seq_prob,
        dupe_factor=settings.dupe_factor,
        cls_id=ctx.special.cls,
        sep_id=ctx.special.sep,
        rng=ctx.rng,
        shuffle=True,
        sentence_order=sentence_order,
        sources=ctx.tracks_sources,
    )


def build(docs: TokenizedDocs, ctx: BuildContext) -> tuple[InstanceBatch, dict]:
    """The ``nsp`` objective: :func:`build_pairs`, BERT's."""
    batch, stats = build_pairs(docs, ctx)
    return batch, stats.to_dict()


OBJECTIVE = Objective(
    name="nsp",
    build=build,
    help="BERT sentence pairs [CLS] A [SEP] B [SEP] with next-sentence labels (50% random next)",
    has_nsp_labels=True,
    reference=BERT_REFERENCE,
    cuts_long_sentences=True,
)
