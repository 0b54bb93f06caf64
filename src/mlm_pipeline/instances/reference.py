"""Reference mode of ``nsp``: the instances google-research/bert's ``create_pretraining_data.py`` writes.

What it guarantees
------------------
For ONE input file, the same flags (``max_seq_length``, ``max_predictions_per_seq``,
``masked_lm_prob``, ``dupe_factor``, ``short_seq_prob``, ``do_whole_word_mask``, ``do_lower_case``),
the same WordPiece vocab and the same ``random_seed``, :func:`reference_instances_for_file` returns
the instances the reference script (commit ``eedf5716``) writes to ONE output file: same count,
same order, and every feature of every instance equal once padded (``InstanceBatch.padded``).
The golden cases in ``tests/data/golden`` check this instance by instance.

Reading it beside the script
----------------------------
The functions below carry the script's names and run its steps in its order, drawing from one
``random.Random(random_seed)`` exactly the numbers it draws, in the same sequence::

    create_pretraining_data.py            here
    main                                  reference_instances_for_file (one file)
    create_training_instances: reading    reference_text: split_reference_lines,
      and tokenizer.tokenize per line       read_reference_documents, tokenize_reference_documents
    create_training_instances: the rest   create_training_instances
    create_instances_from_document        create_instances_from_document
      its "random next" branch              random_next_segment
    truncate_seq_pair                     truncate_seq_pair
    create_masked_lm_predictions          create_masked_lm_predictions (+ masked_token,
      its cand_indexes loop                 candidate_words)
    TrainingInstance (a list of them)     TrainingInstances (one column per field)
    write_instance_to_example_files       TrainingInstances.to_batch (ids; padding is the writer's)

Only what draws no random number is done differently: ``all_documents`` is one flat token array
with per-document sentence boundaries, so a segment is a ``[start, end)`` range (truncation moves
an end, it never copies); shuffles permute index lists (``Random.shuffle``'s draws depend only on
the length); the ragged output arrays are assembled in one vectorised pass at the end.

Reading follows TensorFlow's ``GFile.readline`` and the reference's tokenizer, not Python's
(``reference_text.py`` says where they differ).

What it costs
-------------
Like the reference it holds the whole file's tokenized documents in memory (a random-next segment
can come from anywhere in the file) and runs on one core: the random-call sequence is inherently
sequential. Tokenizing uses the pipeline's fastest exact backend, built for Google's splitting
rules and checked against HF like the pipeline's own (``reference_text._reference_tokenizer``).
Measured on the first 3 MB of WikiText-2 (2-vCPU VM shared with other jobs, CPU seconds,
tokenizer already loaded), dupe 1: read + tokenize 0.21 s (1.10 s when HF tokenized), build
0.25 s; dupe 5: build 1.31 s (~45 us per instance). Whole ``prepare`` runs
(``benchmarks/prepare_bench.py``, variant ``ref-d1``): 2.2x the raw HF tokenizer on 20 MB;
peak RSS 256 MB at 10 MB and 405 MB at 30 MB, ~7.5 MB per MB of input.

Building scales with ``dupe_factor`` (~30 us per instance); memory with the input file. Reference
mode is for reproducing and checking, not for big corpora: the sharded ``nsp`` builder is the
production path.
"""

from __future__ import annotations

import random
from bisect import bisect_left
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from mlm_pipeline.errors import ConfigError
from mlm_pipeline.instances.base import ReferenceContext, ReferenceMode
from mlm_pipeline.instances.batch import InstanceBatch, lengths_to_offsets, sentence_pairs
from mlm_pipeline.instances.reference_text import (
    google_tokenizer_warning,
    read_reference_documents,
    reference_continuation_table,
    split_reference_lines,
    tokenize_reference_documents,
    vocab_strings,
)

from mlm_pipeline.stats import ReadStats
from mlm_pipeline.tokenize import TextTokenizer

# --------------------------------------------------------------------------------------------
# The script's flags and vocab
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class ReferenceSettings:
    """The script's flags that shape instances, with its defaults; ``ConfigError`` when invalid."""

    max_seq_length: int = 128
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    dupe_factor: int = 10
    short_seq_prob: float = 0.1
    do_whole_word_mask: bool = False
    random_seed: int = 12345

    def __post_init__(self) -> None:
        if self.max_seq_length < 5:
            raise ConfigError(
                "max_seq_length must be >= 5 ([CLS] A [SEP] B [SEP] with a target of at least 2), "
                f"got {self.max_seq_length}"
            )
        if self.dupe_factor < 0:
            raise ConfigError(f"dupe_factor must be >= 0, got {self.dupe_factor}")
        if not 0.0 <= self.short_seq_prob <= 1.0:
            raise ConfigError(f"short_seq_prob must be in [0, 1], got {self.short_seq_prob}")
        if not 0.0 <= self.masked_lm_prob <= 1.0:
            raise ConfigError(f"masked_lm_prob must be in [0, 1], got {self.masked_lm_prob}")
        if self.max_predictions_per_seq < 0:
            raise ConfigError(f"max_predictions_per_seq must be >= 0, got {self.max_predictions_per_seq}")


@dataclass(frozen=True)
class ReferenceVocab:
    """What the script takes from ``vocab.txt``: its size (a random replacement is
    ``randint(0, size - 1)``), the ids of ``[CLS]``/``[SEP]``/``[MASK]``, and which ids start
    with ``##`` (whole-word grouping)."""

    size: int
    cls_id: int
    sep_id: int
    mask_id: int
    is_continuation: np.ndarray  # bool per id

    def __post_init__(self) -> None:
        if self.size < 1:
            raise ConfigError(f"the vocab must have at least one entry, got {self.size}")

    @classmethod
    def from_tokenizer(cls, tokenizer: TextTokenizer) -> "ReferenceVocab":
        strings = vocab_strings(tokenizer)
        return cls(
            size=len(strings),
            cls_id=tokenizer.special.cls,
            sep_id=tokenizer.special.sep,
            mask_id=tokenizer.special.mask,
            is_continuation=reference_continuation_table(strings),
        )


# --------------------------------------------------------------------------------------------
# The script's data: all_documents and the TrainingInstance list
# --------------------------------------------------------------------------------------------


@dataclass
class AllDocuments:
    """The script's ``all_documents`` (documents of sentences of tokens) as one flat token array
    and, per document, the offsets of its sentence boundaries in it (first sentence start ...
    last sentence end)."""

    tokens: np.ndarray  # int32
    bounds: list[list[int]]

    @classmethod
    def from_documents(cls, documents: Sequence[Sequence[np.ndarray]]) -> "AllDocuments":
        """From what :func:`tokenize_reference_documents` returns (empty parts are an error:
        the script drops them before building)."""
        bounds: list[list[int]] = []
        pos = 0
        for d, doc in enumerate(documents):
            if not len(doc):
                raise ValueError(f"document {d} is empty (the reference drops empty documents first)")
            b = [pos]
            for s, sentence in enumerate(doc):
                if not len(sentence):
                    raise ValueError(f"sentence {s} of document {d} is empty (the reference drops those)")
                pos += len(sentence)
                b.append(pos)
            bounds.append(b)
        tokens = (
            np.concatenate([np.asarray(s, dtype=np.int32) for doc in documents for s in doc])
            if documents
            else np.zeros(0, np.int32)
        )
        return cls(tokens=tokens, bounds=bounds)

    def __len__(self) -> int:
        return len(self.bounds)


KEEP = -1  # a masked token's replacement that keeps the original token


class TrainingInstances:
    """The script's list of ``TrainingInstance``, one column per field.

    Segments A and B are ``[start, end)`` ranges of ``AllDocuments.tokens``; each masked token is
    (instance, position in ``[CLS] A [SEP] B [SEP]``, replacement id or ``KEEP``).
    """

    def __init__(self) -> None:
        self.a_starts: list[int] = []
        self.a_ends: list[int] = []
        self.b_starts: list[int] = []
        self.b_ends: list[int] = []
        self.is_random_next: list[int] = []
        self.masked_instance: list[int] = []
        self.masked_position: list[int] = []
        self.masked_replacement: list[int] = []

    def __len__(self) -> int:
        return len(self.is_random_next)

    def add(self, a: tuple[int, int], b: tuple[int, int], is_random_next: bool) -> int:
        """Append one instance; returns its index."""
        self.a_starts.append(a[0])
        self.a_ends.append(a[1])
        self.b_starts.append(b[0])
        self.b_ends.append(b[1])
        self.is_random_next.append(int(is_random_next))
        return len(self.is_random_next) - 1

    def add_masked_lm(self, instance: int, position: int, replacement: int) -> None:
        self.masked_instance.append(instance)
        self.masked_position.append(position)
        self.masked_replacement.append(replacement)

    def mask_counts(self, mask_id: int) -> dict[str, int]:
        """Masking counts under the default masker's names (a random id that happens to be
        ``[MASK]`` counts as ``[MASK]``: what the instance shows)."""
        replacement = np.array(self.masked_replacement, np.int64)
        as_mask = int(np.count_nonzero(replacement == mask_id))
        kept = int(np.count_nonzero(replacement == KEEP))
        return {
            "masked_tokens": len(replacement),
            "masked_as_mask_token": as_mask,
            "masked_as_random_token": len(replacement) - as_mask - kept,
            "masked_kept": kept,
        }

    def to_batch(self, tokens: np.ndarray, *, cls_id: int, sep_id: int) -> InstanceBatch:
        """``[CLS] A [SEP] B [SEP]`` rows with the masking applied, in instance order, all
        vectorised (``write_instance_to_example_files`` minus the padding, which writers do)."""
        a_s = np.array(self.a_starts, np.int64)
        b_s = np.array(self.b_starts, np.int64)
        la = np.array(self.a_ends, np.int64) - a_s
        lb = np.array(self.b_ends, np.int64) - b_s
        input_ids, segment_ids, offsets = sentence_pairs(tokens, a_s, la, b_s, lb, cls_id=cls_id, sep_id=sep_id)
        starts = offsets[:-1]

        m_inst = np.array(self.masked_instance, np.int64)
        m_pos = np.array(self.masked_position, np.int64)
        m_repl = np.array(self.masked_replacement, np.int64)
        order = np.lexsort((m_pos, m_inst))  # the script sorts each instance's masks by position
        m_inst, m_pos, m_repl = m_inst[order], m_pos[order], m_repl[order]
        where = starts[m_inst] + m_pos
        masked_ids = input_ids[where]
        input_ids[where] = np.where(m_repl == KEEP, masked_ids, m_repl)
        return InstanceBatch(
            input_ids=input_ids,
            segment_ids=segment_ids,
            offsets=offsets,
            masked_lm_positions=m_pos.astype(np.int32),
            masked_lm_ids=masked_ids.astype(np.int32),
            masked_offsets=lengths_to_offsets(np.bincount(m_inst, minlength=len(self))),
            next_sentence_labels=np.array(self.is_random_next, np.int8),
        )


# --------------------------------------------------------------------------------------------
# create_training_instances, part 2, and the functions it calls
# --------------------------------------------------------------------------------------------


def create_training_instances(
    documents: Sequence[Sequence[np.ndarray]], vocab: ReferenceVocab, settings: ReferenceSettings
) -> InstanceBatch:
    """The script's ``create_training_instances`` from tokenized documents on.

    ``documents`` must be what the script keeps: non-empty documents of non-empty sentences, in
    file order (:func:`tokenize_reference_documents` gives that).
    """
    batch, _ = _create_training_instances(AllDocuments.from_documents(documents), vocab, settings)
    return batch


def _create_training_instances(
    all_documents: AllDocuments, vocab: ReferenceVocab, settings: ReferenceSettings
) -> tuple[InstanceBatch, TrainingInstances]:
    rng = random.Random(settings.random_seed)
    order = list(range(len(all_documents)))
    rng.shuffle(order)  # rng.shuffle(all_documents)
    all_documents = AllDocuments(all_documents.tokens, [all_documents.bounds[i] for i in order])
    continuation = (
        np.asarray(vocab.is_continuation, dtype=bool)[all_documents.tokens] if settings.do_whole_word_mask else None
    )
    instances = TrainingInstances()
    for _ in range(settings.dupe_factor):
        for document_index in range(len(all_documents)):
            create_instances_from_document(
                all_documents, document_index, settings, vocab, continuation, rng, instances
            )
    final_order = list(range(len(instances)))
    rng.shuffle(final_order)  # rng.shuffle(instances)
    batch = instances.to_batch(all_documents.tokens, cls_id=vocab.cls_id, sep_id=vocab.sep_id)
    return batch.take(np.array(final_order, np.int64)), instances


def create_instances_from_document(
    all_documents: AllDocuments,
    document_index: int,
    settings: ReferenceSettings,
    vocab: ReferenceVocab,
    continuation: np.ndarray | None,
    rng: random.Random,
    instances: TrainingInstances,
) -> None:
    """The script's ``create_instances_from_document``: appends this document's instances.

    The current chunk is the sentences ``chunk_first..i``; its token count is a difference of
    sentence boundaries. ``continuation`` (whole-word masking only) is the ``##`` flag of every
    token of ``all_documents``.
    """
    bounds = all_documents.bounds[document_index]
    n_sentences = len(bounds) - 1
    max_num_tokens = settings.max_seq_length - 3  # [CLS], [SEP], [SEP]
    target_seq_length = max_num_tokens
    if rng.random() < settings.short_seq_prob:
        target_seq_length = rng.randint(2, max_num_tokens)

    chunk_first = 0
    i = 0
    while i < n_sentences:
        if i == n_sentences - 1 or bounds[i + 1] - bounds[chunk_first] >= target_seq_length:
            chunk_sentences = i - chunk_first + 1
            a_end = rng.randint(1, chunk_sentences - 1) if chunk_sentences >= 2 else 1
            a = (bounds[chunk_first], bounds[chunk_first + a_end])
            if chunk_sentences == 1 or rng.random() < 0.5:
                is_random_next = True
                target_b_length = target_seq_length - (a[1] - a[0])
                b = random_next_segment(all_documents, document_index, target_b_length, rng)
                i -= chunk_sentences - a_end  # the unused sentences go back to the document
            else:
                is_random_next = False
                b = (a[1], bounds[i + 1])
            a, b = truncate_seq_pair(a, b, max_num_tokens, rng)
            instance = instances.add(a, b, is_random_next)
            for position, replacement in create_masked_lm_predictions(a, b, continuation, settings, vocab, rng):
                instances.add_masked_lm(instance, position, replacement)
            chunk_first = i + 1
        i += 1


def random_next_segment(
    all_documents: AllDocuments, document_index: int, target_b_length: int, rng: random.Random
) -> tuple[int, int]:
    """Segment B of a random next: up to ten draws for another document, a random start
    sentence, then whole sentences until B reaches ``target_b_length`` (at least one)."""
    for _ in range(10):
        random_document_index = rng.randint(0, len(all_documents) - 1)
        if random_document_index != document_index:
            break
    bounds = all_documents.bounds[random_document_index]
    n_sentences = len(bounds) - 1
    random_start = rng.randint(0, n_sentences - 1)
    start = bounds[random_start]
    return start, bounds[bisect_left(bounds, start + target_b_length, random_start + 1, n_sentences)]


def truncate_seq_pair(
    a: tuple[int, int], b: tuple[int, int], max_num_tokens: int, rng: random.Random
) -> tuple[tuple[int, int], tuple[int, int]]:
    """The script's ``truncate_seq_pair``: while too long, remove one token from the front or
    the back (a coin each time) of the longer segment, B when they are equally long."""
    a_start, a_end = a
    b_start, b_end = b
    len_a, len_b = a_end - a_start, b_end - b_start
    coin = rng.random
    while len_a + len_b > max_num_tokens:
        if len_a > len_b:
            if coin() < 0.5:
                a_start += 1
            else:
                a_end -= 1
            len_a -= 1
        else:
            if coin() < 0.5:
                b_start += 1
            else:
                b_end -= 1
            len_b -= 1
    return (a_start, a_end), (b_start, b_end)


def candidate_words(a: tuple[int, int], b: tuple[int, int], continuation: np.ndarray | None) -> Sequence[int]:
    """The script's ``cand_indexes`` as word boundaries over the candidates (A's tokens, then
    B's): word ``w`` is candidates ``starts[w]:starts[w + 1]``.

    Without whole-word masking every candidate is its own word. With it, a ``##`` piece joins
    the word before it, also across the middle ``[SEP]`` (the script only skips the special
    tokens when grouping); a first candidate that is a ``##`` piece starts a word.
    """
    n_candidates = (a[1] - a[0]) + (b[1] - b[0])
    if continuation is None:
        return range(n_candidates + 1)
    is_piece = np.concatenate((continuation[a[0] : a[1]], continuation[b[0] : b[1]]))
    is_piece[0] = False
    starts = np.flatnonzero(~is_piece).tolist()
    starts.append(n_candidates)
    return starts


def create_masked_lm_predictions(
    a: tuple[int, int],
    b: tuple[int, int],
    continuation: np.ndarray | None,
    settings: ReferenceSettings,
    vocab: ReferenceVocab,
    rng: random.Random,
) -> list[tuple[int, int]]:
    """The script's ``create_masked_lm_predictions`` for ``[CLS] A [SEP] B [SEP]``: the masked
    (position, replacement) pairs, in the order the script draws them.

    Words are visited in a shuffled order; one is skipped if it would overflow
    ``num_to_predict``, so a word is masked whole or not at all.
    """
    len_a = a[1] - a[0]
    num_tokens = len_a + (b[1] - b[0]) + 3
    num_to_predict = min(
        settings.max_predictions_per_seq, max(1, int(round(num_tokens * settings.masked_lm_prob)))
    )
    starts = candidate_words(a, b, continuation)
    cand_indexes = list(range(len(starts) - 1))
    rng.shuffle(cand_indexes)
    masked: list[tuple[int, int]] = []
    for word in cand_indexes:
        if len(masked) >= num_to_predict:
            break
        first, end = starts[word], starts[word + 1]
        if len(masked) + end - first > num_to_predict:
            continue
        for candidate in range(first, end):
            # candidate c sits after [CLS] in A, after the middle [SEP] too in B
            position = candidate + 1 if candidate < len_a else candidate + 2
            masked.append((position, masked_token(vocab, rng)))
    return masked


def masked_token(vocab: ReferenceVocab, rng: random.Random) -> int:
    """80% ``[MASK]``, 10% the original token (``KEEP``), 10% a random vocab id."""
    if rng.random() < 0.8:
        return vocab.mask_id
    if rng.random() < 0.5:
        return KEEP
    return rng.randint(0, vocab.size - 1)


# --------------------------------------------------------------------------------------------
# main: one input file to one output file; the reference mode of the ``nsp`` objective
# --------------------------------------------------------------------------------------------


def _read_all_documents(path: str, tokenizer: TextTokenizer, stats: ReadStats | None,
                        backend: dict | None = None) -> AllDocuments:
    import fsspec  # (here: a local run of any other mode does not load it)

    with fsspec.open(path, "rb", compression="infer") as f:
        raw = f.read()
    lines = split_reference_lines(raw.decode("utf-8", errors="ignore"))
    documents = tokenize_reference_documents(read_reference_documents(lines), tokenizer, where=path,
                                             backend=backend)
    if stats is not None:
        stats.bytes_read += len(raw)
        stats.documents_read += len(documents)
        stats.sentences += sum(len(d) for d in documents)
    return AllDocuments.from_documents(documents)


def reference_instances_for_file(
    path: str, tokenizer: TextTokenizer, *, stats: ReadStats | None = None, **flags
) -> InstanceBatch:
    """The script's ``main`` for one input file (local path or fsspec URL; ``.gz`` etc.
    decompressed) and one output file.

    ``flags`` are :class:`ReferenceSettings` fields (the script's flag defaults otherwise).
    ``stats``, if given, receives the counts of bytes, documents and sentences read. The
    tokenizer must be the WordPiece vocab the reference used, with the same ``do_lower_case``;
    its vocab entries must be unique (then an id is its line in vocab.txt, as in the reference).
    """
    settings = ReferenceSettings(**flags)
    all_documents = _read_all_documents(path, tokenizer, stats)
    batch, _ = _create_training_instances(all_documents, ReferenceVocab.from_tokenizer(tokenizer), settings)
    return batch


def build_reference(urls: Sequence[str], ctx: ReferenceContext) -> Iterator[tuple[InstanceBatch, dict]]:
    """The ``nsp`` reference mode: each input file on its own, as the script run per file."""
    config = ctx.settings
    settings = ReferenceSettings(
        max_seq_length=config.max_seq_length,
        max_predictions_per_seq=config.max_predictions_per_seq,
        masked_lm_prob=config.masked_lm_prob,
        dupe_factor=config.dupe_factor,
        short_seq_prob=config.short_seq_prob,
        do_whole_word_mask=config.do_whole_word_mask,
        random_seed=config.random_seed,
    )
    vocab = ReferenceVocab.from_tokenizer(ctx.tokenizer)
    for url in urls:
        all_documents = _read_all_documents(url, ctx.tokenizer, ctx.read_stats, ctx.tokenizer_backend)
        batch, instances = _create_training_instances(all_documents, vocab, settings)
        counts = {
            "instances": len(batch),
            "random_next": sum(instances.is_random_next),
            "tokens": len(all_documents.tokens),
            **instances.mask_counts(vocab.mask_id),
        }
        yield batch, counts


BERT_REFERENCE = ReferenceMode(
    build=build_reference,
    unit="file",
    masking="static",
    help="google-research/bert create_pretraining_data.py, run on each input file alone",
    tokenizer_warning=google_tokenizer_warning,
)
