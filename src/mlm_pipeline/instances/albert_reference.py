"""Reference mode of ``sop``: the examples google-research/albert's ``create_pretraining_data.py`` writes.

What it guarantees
------------------
For the same input files (read in the order given, as one corpus), flags, vocab or SentencePiece
model and ``random_seed``, :func:`albert_reference_batches` yields the examples ALBERT's script
(commit ``b772393d``) writes to one output file, run with numpy's global generator seeded as
``np.random.seed(random_seed)`` right before its ``main()`` (upstream draws the n-gram length from
that generator and never seeds it, so without the seed no two upstream runs agree): same count,
same order, all eight features equal once padded. The goldens in ``tests/data/golden/albert``
check this example by example.

Reading it beside the script
----------------------------
The functions carry the script's names and make its draws in its order, from
``random.Random(random_seed)`` and a ``numpy.random.RandomState(random_seed)`` (the legacy
generator that ``np.random.seed`` seeds; one ``random_sample()`` per n-gram draw)::

    create_pretraining_data.py             here
    create_training_instances: reading     read_albert_corpus (one pass, files in order)
      tokenizer.tokenize per line            AlbertSentencePiece / reference_text (WordPiece)
    create_training_instances: the rest    create_training_instances
    create_instances_from_document         create_instances_from_document
    truncate_seq_pair                      reference.truncate_seq_pair (BERT's, unchanged)
    create_masked_lm_predictions           create_masked_lm_predictions
    write_instance_to_example_files        TrainingInstances.batch (rows of the final order)

What differs is only what draws nothing: the corpus is one flat token array with sentence and
document offsets (``all_documents`` as ranges), an instance is two ``[start, end)`` ranges plus
its masked (position, replacement) pairs, kept in flat integer arrays (ALBERT keeps every
instance of every dupe pass as Python objects: google-research/albert#204), and the output is
gathered in slices of the final order, so memory is the tokens plus a few integers per instance.
A token's ``token_boundary`` depends on its text only, so it is read from the token's kind
(:mod:`mlm_pipeline.tokenize.albert_rules`), not recomputed per instance.

What it costs
-------------
Memory: about 6 bytes per token of the corpus (its id, its kind twice) and 16 per sentence, then
41 bytes per example and 16 per masked token; the output is gathered 8,192 examples at a time.
Time: the draws are sequential, one core. Measured on the 1 MB WikiText-2 sample (CPU seconds on
a 2-vCPU VM shared with other jobs, dupe factor 5): reading and tokenizing 0.18 s; building 51 us
per example at ``max_seq_length`` 128 and 93 us at 512, most of it the script's two shuffles of
the masking candidates per example (:func:`shuffled_range`, :func:`shuffle_draws`: CPython's
shuffle inlined, 69 and 136 us with ``Random.shuffle``) and the truncation's coins. The whole
reference at dupe factor 1, TFRecord encoding included, took 0.13 CPU s where HF's
``encode_batch_fast`` of the same lines took 0.29 (best of three).
"""

from __future__ import annotations

import random
from array import array
from bisect import bisect_left, bisect_right
from dataclasses import dataclass
from typing import Iterator, Sequence

import numpy as np

from mlm_pipeline import fs
from mlm_pipeline.errors import ConfigError, InputError
from mlm_pipeline.instances.base import ReferenceContext, ReferenceMode
from mlm_pipeline.instances.batch import InstanceBatch, gather_ranges, lengths_to_offsets, sentence_pairs
from mlm_pipeline.instances.reference import truncate_seq_pair
from mlm_pipeline.instances.reference_text import (
    google_tokenizer_warning,
    tokenize_reference_sentences,
    vocab_strings,
)
from mlm_pipeline.stats import ReadStats
from mlm_pipeline.tokenize import TextTokenizer
from mlm_pipeline.tokenize.albert_rules import SPECIAL, AlbertSentencePiece, kind_table

KEEP = -1  # a masked token's replacement that keeps the original token
_LINES_PER_CALL = 16384  # lines tokenized per batched call
_READ_BYTES = 1 << 22  # bytes read from a file at a time
_ROWS_PER_BATCH = 8192  # output rows gathered at a time


@dataclass(frozen=True)
class AlbertSettings:
    """The script's flags that shape examples, with its defaults; ``ConfigError`` when invalid."""

    max_seq_length: int = 512
    max_predictions_per_seq: int = 20
    masked_lm_prob: float = 0.15
    dupe_factor: int = 40
    short_seq_prob: float = 0.1
    do_whole_word_mask: bool = True
    ngram: int = 3
    favor_shorter_ngram: bool = True
    random_next_sentence: bool = False
    random_seed: int = 12345

    def __post_init__(self) -> None:
        if self.max_seq_length < 5:
            raise ConfigError(f"max_seq_length must be >= 5 (a target of at least 2 tokens), got {self.max_seq_length}")
        if self.ngram < 1:
            raise ConfigError(f"ngram must be >= 1, got {self.ngram}")
        if not 0 <= self.random_seed < 1 << 32:
            raise ConfigError(f"ALBERT's reference seeds numpy with np.random.seed(random_seed), which takes "
                              f"0 to 2**32 - 1; got {self.random_seed}")
        if self.dupe_factor < 0 or self.max_predictions_per_seq < 0:
            raise ConfigError("dupe_factor and max_predictions_per_seq must be >= 0")
        if not 0.0 <= self.short_seq_prob <= 1.0 or not 0.0 < self.masked_lm_prob <= 1.0:
            raise ConfigError("short_seq_prob must be in [0, 1] and masked_lm_prob in (0, 1]")

    def ngram_cdf(self) -> list[float]:
        """``np.random.choice``'s cumulative distribution over ``1..ngram``, exactly as numpy
        computes it from the script's ``pvals`` (P(n) ∝ 1/n, reversed unless favouring short)."""
        pvals = 1.0 / np.arange(1, self.ngram + 1)
        pvals /= pvals.sum(keepdims=True)
        if not self.favor_shorter_ngram:
            pvals = pvals[::-1]
        p = pvals / pvals.sum(keepdims=True)
        cdf = p.cumsum()
        cdf /= cdf[-1]
        return cdf.tolist()


# --------------------------------------------------------------------------------------------
# all_documents: read every input file in order, as one corpus
# --------------------------------------------------------------------------------------------


@dataclass
class Corpus:
    """The script's ``all_documents`` (before its shuffle), flat: token ids and kinds, sentence
    boundaries (token offsets), and each document's first sentence (sentence offsets)."""

    tokens: np.ndarray  # int32
    kinds: np.ndarray  # uint8: albert_rules.CONTINUATION / START / SPECIAL
    sentence_offsets: np.ndarray  # int64 [sentences + 1]
    doc_offsets: np.ndarray  # int64 [documents + 1]

    def __len__(self) -> int:
        return len(self.doc_offsets) - 1


class _WordPiece:
    """ALBERT's WordPiece path: ``line.strip()``, then Google's ``FullTokenizer`` (the BERT
    reference's, ``reference_text``); a token's kind from its ``##`` prefix."""

    def __init__(self, tokenizer: TextTokenizer, backend: dict | None):
        strings = vocab_strings(tokenizer)
        self.tokenizer = tokenizer
        self.backend = backend
        self.vocab_size = len(strings)
        self.kinds = kind_table(strings, wordpiece=True)
        self.cls_id, self.sep_id, self.mask_id = tokenizer.special.cls, tokenizer.special.sep, tokenizer.special.mask

    @staticmethod
    def prepare(line: str) -> str:
        return line.strip()

    def encode(self, lines: list[str], where: str) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        flat, offsets = tokenize_reference_sentences(lines, self.tokenizer, where=where, backend=self.backend)
        return flat, self.kinds[flat], np.diff(offsets)


def gfile_lines(url: str, stats: ReadStats | None = None) -> Iterator[str]:
    """A file's lines as TensorFlow's ``GFile.readline`` gives them to ALBERT, without their
    ``\\n``: lines end at ``\\n`` only, every ``\\r`` is dropped, a last line without ``\\n``
    counts, and invalid UTF-8 stops the run (``InputError``, as upstream aborts). Read in blocks."""
    rest = b""
    number = 0
    with fs.open_url(url, "rb") as f:
        while True:
            block = f.read(_READ_BYTES)
            if stats is not None:
                stats.bytes_read += len(block)
            data = rest + block.replace(b"\r", b"")
            if block:
                cut = data.rfind(b"\n") + 1
                data, rest = data[:cut], data[cut:]
            try:
                text = data.decode("utf-8")
            except UnicodeDecodeError as exc:
                line = number + data.count(b"\n", 0, exc.start) + 1
                raise InputError(f"{url}: line {line} is not valid UTF-8 ({exc.reason}); ALBERT's script aborts "
                                 "on it too") from exc
            lines = text.split("\n")
            if lines[-1] == "":
                lines.pop()
            number += len(lines)
            yield from lines
            if not block:
                return


def read_albert_corpus(urls: Sequence[str], tokenizer, stats: ReadStats | None = None) -> Corpus:
    """The script's reading loop over all files in order: a prepared line that is ``""`` starts a
    new document (a file boundary does not); a line that gives tokens is a sentence of the last
    document; documents without sentences are dropped. Lines are tokenized in batched calls."""
    tokens: list[np.ndarray] = []
    kinds: list[np.ndarray] = []
    sentence_lengths: list[np.ndarray] = []
    doc_sentences: list[int] = []
    current = 0  # sentences of the last document so far

    def flush(prepared: list[str], where: str) -> None:
        nonlocal current
        ids, k, lengths = tokenizer.encode(prepared, where)
        tokens.append(ids)
        kinds.append(k)
        sentence_lengths.append(lengths[lengths > 0])
        for nonempty, n in zip(map(bool, prepared), lengths.tolist()):
            if not nonempty:  # "" (after preparation: " " is not ""): a new document
                if current:
                    doc_sentences.append(current)
                current = 0
            if n:
                current += 1

    for url in urls:
        prepared: list[str] = []
        for line in gfile_lines(url, stats):
            prepared.append(tokenizer.prepare(line))
            if len(prepared) == _LINES_PER_CALL:
                flush(prepared, url)
                prepared = []
        if prepared:
            flush(prepared, url)
    if current:
        doc_sentences.append(current)
    lengths = np.concatenate(sentence_lengths) if sentence_lengths else np.zeros(0, np.int64)
    corpus = Corpus(
        tokens=np.concatenate(tokens).astype(np.int32, copy=False) if tokens else np.zeros(0, np.int32),
        kinds=np.concatenate(kinds) if kinds else np.zeros(0, np.uint8),
        sentence_offsets=lengths_to_offsets(lengths),
        doc_offsets=lengths_to_offsets(np.array(doc_sentences, np.int64)),
    )
    if stats is not None:
        stats.documents_read += len(corpus)
        stats.sentences += len(lengths)
    return corpus


# --------------------------------------------------------------------------------------------
# The script's instances, flat
# --------------------------------------------------------------------------------------------


class TrainingInstances:
    """The script's list of ``TrainingInstance``: per instance segment A and B as token ranges and
    the label; per masked token (in instance order, then the order drawn) its position and
    replacement (an id, or ``KEEP``). Flat integer arrays, no object per instance."""

    def __init__(self) -> None:
        self.ranges = array("q")  # a start, a end, b start, b end per instance
        self.labels = array("b")
        self.mask_counts = array("l")
        self.mask_positions = array("l")
        self.mask_replacements = array("q")

    def __len__(self) -> int:
        return len(self.labels)

    def counts(self, mask_id: int) -> dict[str, int]:
        replacement = np.frombuffer(self.mask_replacements, np.int64)
        as_mask = int(np.count_nonzero(replacement == mask_id))
        kept = int(np.count_nonzero(replacement == KEEP))
        return {
            "instances": len(self),
            "random_next": int(sum(self.labels)),
            "masked_tokens": len(replacement),
            "masked_as_mask_token": as_mask,
            "masked_as_random_token": len(replacement) - as_mask - kept,
            "masked_kept": kept,
        }

    def batches(self, corpus: Corpus, order: Sequence[int], *, cls_id: int, sep_id: int,
                rows: int = _ROWS_PER_BATCH) -> Iterator[InstanceBatch]:
        """The instances in ``order`` as batches of ``rows`` rows: ``[CLS] A [SEP] B [SEP]`` with
        the masks applied and sorted by position, ``token_boundary`` from the tokens' kinds."""
        ranges = np.frombuffer(self.ranges, np.int64).reshape(-1, 4)
        labels = np.frombuffer(self.labels, np.int8)
        counts = np.frombuffer(self.mask_counts, np.dtype("l")).astype(np.int64)
        mask_starts = lengths_to_offsets(counts)[:-1]
        positions = np.frombuffer(self.mask_positions, np.dtype("l")).astype(np.int64)
        replacements = np.frombuffer(self.mask_replacements, np.int64)
        boundary_source = (corpus.kinds != 0).astype(np.int32)
        order = np.asarray(order, np.int64)
        for lo in range(0, len(order), rows):
            take = order[lo : lo + rows]
            r = ranges[take]
            la, lb = r[:, 1] - r[:, 0], r[:, 3] - r[:, 2]
            ids, segments, offsets = sentence_pairs(corpus.tokens, r[:, 0], la, r[:, 2], lb, cls_id=cls_id,
                                                    sep_id=sep_id)
            boundary, _, _ = sentence_pairs(boundary_source, r[:, 0], la, r[:, 2], lb, cls_id=1, sep_id=1)
            m_counts = counts[take]
            m_pos, m_repl = gather_ranges((positions, replacements), mask_starts[take], m_counts)
            m_row = np.repeat(np.arange(len(take)), m_counts)
            by_position = np.lexsort((m_pos, m_row))  # the script sorts each instance's masks by position
            m_pos, m_repl, m_row = m_pos[by_position], m_repl[by_position], m_row[by_position]
            where = offsets[:-1][m_row] + m_pos
            original = ids[where]
            ids[where] = np.where(m_repl == KEEP, original, m_repl)
            yield InstanceBatch(
                input_ids=ids,
                segment_ids=segments,
                offsets=offsets,
                masked_lm_positions=m_pos.astype(np.int32),
                masked_lm_ids=original.astype(np.int32),
                masked_offsets=lengths_to_offsets(m_counts),
                next_sentence_labels=labels[take].copy(),
                token_boundary=boundary.astype(np.int8),
            )


class _NumpyChoice:
    """``np.random.choice(ngrams, p=...)`` on the legacy global generator the golden seeds with
    ``np.random.seed(seed)``: one ``random_sample()`` per call, ``n`` = 1 + the number of ``cdf``
    entries ``<= u``. Samples are drawn in blocks (a block gives the numbers single calls would)."""

    _BLOCK = 4096

    def __init__(self, seed: int, cdf: list[float]):
        self._state = np.random.RandomState(seed)
        self._cdf = cdf
        self._buffer: list[float] = []
        self._next = 0
        self.calls = 0

    def __call__(self) -> int:
        if self._next == len(self._buffer):
            self._buffer = self._state.random_sample(self._BLOCK).tolist()
            self._next = 0
        u = self._buffer[self._next]
        self._next += 1
        self.calls += 1
        return bisect_right(self._cdf, u) + 1


def shuffled_range(rng: random.Random, n: int) -> list[int]:
    """``x = list(range(n)); rng.shuffle(x)``: the same draws and result (CPython's Fisher-Yates:
    ``_randbelow(i + 1)`` for ``i`` from ``n - 1`` down to 1, each ``getrandbits(k)`` until below
    ``i + 1``), inlined: twice as fast as ``Random.shuffle``, which the script calls twice per
    example."""
    x = list(range(n))
    getrandbits = rng.getrandbits
    for i in range(n - 1, 0, -1):
        bound = i + 1
        k = bound.bit_length()
        j = getrandbits(k)
        while j >= bound:
            j = getrandbits(k)
        x[i], x[j] = x[j], x[i]
    return x


def shuffle_draws(rng: random.Random, n: int) -> None:
    """The draws of ``rng.shuffle`` on ``n`` items, without the items (the script's second
    shuffle of the candidates, whose result it never reads)."""
    getrandbits = rng.getrandbits
    for i in range(n - 1, 0, -1):
        bound = i + 1
        k = bound.bit_length()
        while getrandbits(k) >= bound:
            pass


class _Builder:
    """``create_training_instances`` after reading: the script's loops with its draws."""

    def __init__(self, corpus: Corpus, settings: AlbertSettings, *, vocab_size: int, mask_id: int):
        self.settings = settings
        self.vocab_size = vocab_size
        self.mask_id = mask_id
        self.rng = random.Random(settings.random_seed)
        self.choice = _NumpyChoice(settings.random_seed, settings.ngram_cdf())
        self.so = array("q", corpus.sentence_offsets.tobytes())  # token offset of each sentence
        self.kinds = corpus.kinds.tobytes()
        self.has_special = SPECIAL in corpus.kinds
        self.instances = TrainingInstances()
        self.truncated_tokens = 0
        doc_offsets = corpus.doc_offsets.tolist()
        order = list(range(len(corpus)))
        self.rng.shuffle(order)  # rng.shuffle(all_documents)
        self.doc_first = array("q", (doc_offsets[d] for d in order))
        self.doc_end = array("q", (doc_offsets[d + 1] for d in order))

    def create_training_instances(self) -> list[int]:
        """Every instance of every dupe pass; returns the final order (``rng.shuffle(instances)``)."""
        for _ in range(self.settings.dupe_factor):
            for document_index in range(len(self.doc_first)):
                self.create_instances_from_document(document_index)
        order = list(range(len(self.instances)))
        self.rng.shuffle(order)
        return order

    def create_instances_from_document(self, document_index: int) -> None:
        s, rng, so = self.settings, self.rng, self.so
        first, end = self.doc_first[document_index], self.doc_end[document_index]
        max_num_tokens = s.max_seq_length - 3
        target = max_num_tokens
        if rng.random() < s.short_seq_prob:
            target = rng.randint(2, max_num_tokens)
        chunk_first = i = first
        while i < end:
            if i == end - 1 or so[i + 1] - so[chunk_first] >= target:
                n_chunk = i - chunk_first + 1
                a_end = rng.randint(1, n_chunk - 1) if n_chunk >= 2 else 1
                a = (so[chunk_first], so[chunk_first + a_end])
                own_b = False  # B from another document: its truncation loses none of this one's tokens
                if n_chunk == 1 or (s.random_next_sentence and rng.random() < 0.5):
                    is_random_next = True
                    b = self.random_segment(document_index, target - (a[1] - a[0]))
                    i -= n_chunk - a_end  # the unused sentences are read again
                elif not s.random_next_sentence and rng.random() < 0.5:
                    is_random_next = own_b = True  # sentence order swapped
                    a, b = (a[1], so[i + 1]), a
                else:
                    is_random_next, own_b = False, True
                    b = (a[1], so[i + 1])
                la0, lb0 = a[1] - a[0], b[1] - b[0]
                a, b = truncate_seq_pair(a, b, max_num_tokens, rng)
                self.truncated_tokens += la0 - (a[1] - a[0]) + (lb0 - (b[1] - b[0]) if own_b else 0)
                self.instances.ranges.extend((a[0], a[1], b[0], b[1]))
                self.instances.labels.append(is_random_next)
                self.create_masked_lm_predictions(a, b)
                chunk_first = i + 1
            i += 1

    def random_segment(self, document_index: int, target_b_length: int) -> tuple[int, int]:
        """B from another document (up to ten draws; after ten equal ones, this document): from
        a random sentence on, whole sentences until B reaches ``target_b_length`` (at least one)."""
        rng, n_docs = self.rng, len(self.doc_first)
        for _ in range(10):
            random_document_index = rng.randint(0, n_docs - 1)
            if random_document_index != document_index:
                break
        first, end = self.doc_first[random_document_index], self.doc_end[random_document_index]
        start = first + rng.randint(0, end - first - 1)
        b_start = self.so[start]
        return b_start, self.so[bisect_left(self.so, b_start + target_b_length, start + 1, end)]

    def create_masked_lm_predictions(self, a: tuple[int, int], b: tuple[int, int]) -> None:
        """The script's masking of ``[CLS] A [SEP] B [SEP]``: whole-word groups (a continuation
        joins the last group, across the middle ``[SEP]`` too), n-gram candidates (a group and
        the next ones, up to ``ngram``) in shuffled order, each with a numpy draw of its length,
        shortened while it overflows, skipped if too long or touching a masked group; then the
        second, unused shuffle."""
        s, rng = self.settings, self.rng
        len_a = a[1] - a[0]
        n_tokens = len_a + (b[1] - b[0]) + 3
        num_to_predict = min(s.max_predictions_per_seq, max(1, int(round(n_tokens * s.masked_lm_prob))))
        kinds = self.kinds[a[0] : a[1]] + self.kinds[b[0] : b[1]]
        # candidates: the non-special tokens (candidate c at position c + 1 in A, c + 2 in B);
        # groups: runs of candidates from a start piece on (or each candidate alone)
        keep = None
        if self.has_special and SPECIAL in kinds:
            keep = [c + 1 + (c >= len_a) for c in range(len(kinds)) if kinds[c] != SPECIAL]
            kinds = bytes(k for k in kinds if k != SPECIAL)
        n_cand = len(kinds)
        if s.do_whole_word_mask:
            starts = np.flatnonzero(np.frombuffer(kinds, np.uint8)).tolist() if n_cand else []
            if n_cand and (not starts or starts[0] != 0):
                starts.insert(0, 0)  # a first continuation still opens a group
        else:
            starts = list(range(n_cand))
        n_groups = len(starts)
        starts.append(n_cand)
        order = shuffled_range(rng, n_groups)  # rng.shuffle(ngram_indexes)
        ngram, choice, random_ = s.ngram, self.choice, rng.random
        covered = bytearray(n_groups)
        masked = 0
        out_pos, out_repl = self.instances.mask_positions, self.instances.mask_replacements
        for k in order:
            if masked >= num_to_predict:
                break
            n = choice()
            first = starts[k]
            length = starts[min(k + n, n_groups)] - first
            while masked + length > num_to_predict and n > 1:
                n -= 1
                length = starts[min(k + n, n_groups)] - first
            if masked + length > num_to_predict:
                continue
            last = min(k + n, n_groups)
            if 1 in covered[k:last]:
                continue
            covered[k:last] = b"\x01" * (last - k)
            for c in range(first, first + length):
                if random_() < 0.8:
                    replacement = self.mask_id
                elif random_() < 0.5:
                    replacement = KEEP
                else:
                    replacement = rng.randint(0, self.vocab_size - 1)
                out_pos.append(c + 1 + (c >= len_a) if keep is None else keep[c])
                out_repl.append(replacement)
            masked += length
        shuffle_draws(rng, n_groups)  # upstream's second shuffle: its result is unused, its draws are not
        self.instances.mask_counts.append(masked)


def albert_reference_batches(
    urls: Sequence[str], tokenizer, settings: AlbertSettings, *, stats: ReadStats | None = None,
) -> Iterator[tuple[InstanceBatch, dict]]:
    """ALBERT's script over ``urls`` (read in this order as one corpus): its examples in output
    order, in batches, each with its counts. ``tokenizer``: an
    :class:`~mlm_pipeline.tokenize.albert_rules.AlbertSentencePiece` or a WordPiece
    :class:`~mlm_pipeline.tokenize.TextTokenizer` (Google's ``FullTokenizer`` rules)."""
    if isinstance(tokenizer, TextTokenizer):
        tokenizer = _WordPiece(tokenizer, None)
    corpus = read_albert_corpus(urls, tokenizer, stats)
    builder = _Builder(corpus, settings, vocab_size=tokenizer.vocab_size, mask_id=tokenizer.mask_id)
    order = builder.create_training_instances()
    instances = builder.instances
    totals = instances.counts(tokenizer.mask_id)
    reported_tokens = False
    for batch in instances.batches(corpus, order, cls_id=tokenizer.cls_id, sep_id=tokenizer.sep_id):
        counts = {"instances": len(batch), "random_next": int(batch.next_sentence_labels.sum()),
                  "masked_tokens": len(batch.masked_lm_ids)}
        if not reported_tokens:  # the totals that are not per row, once
            counts.update({k: v for k, v in totals.items() if k.startswith("masked_") and k != "masked_tokens"})
            counts.update(tokens=len(corpus.tokens), numpy_ngram_draws=builder.choice.calls,
                          truncated_tokens=builder.truncated_tokens)
            reported_tokens = True
        yield batch, counts


def spm_model_of(settings, tokenizer: TextTokenizer | None = None) -> str | None:
    """The SentencePiece model a run names (``--spm_model_file``, a ``.model`` tokenizer, or the
    model file of a loaded SentencePiece tokenizer, such as a model directory's)."""
    path = getattr(settings, "spm_model_file", None)
    if path:
        return path
    model = getattr(tokenizer, "sentencepiece", None)
    if model is not None:
        return model.path
    name = str(settings.tokenizer)
    return name if name.endswith(".model") else None


def albert_settings(config) -> AlbertSettings:
    """The script's flags from a run's settings (``ngram`` etc. with ALBERT's defaults if absent)."""
    return AlbertSettings(
        max_seq_length=config.max_seq_length,
        max_predictions_per_seq=config.max_predictions_per_seq,
        masked_lm_prob=config.masked_lm_prob,
        dupe_factor=config.dupe_factor,
        short_seq_prob=config.short_seq_prob,
        do_whole_word_mask=config.do_whole_word_mask,
        ngram=getattr(config, "ngram", 3),
        favor_shorter_ngram=getattr(config, "favor_shorter_ngram", True),
        random_next_sentence=getattr(config, "random_next_sentence", False),
        random_seed=config.random_seed,
    )


def build_reference(urls: Sequence[str], ctx: ReferenceContext) -> Iterator[tuple[InstanceBatch, dict]]:
    """The ``sop`` reference mode: every input file, in the order given, as one run of the script."""
    config = ctx.settings
    model = spm_model_of(config, ctx.tokenizer)
    if model is not None:
        tokenizer = AlbertSentencePiece(model, lower=config.do_lower_case)
        import sentencepiece

        ctx.tokenizer_backend.update({"backend": "sentencepiece", "version": sentencepiece.__version__})
    else:
        tokenizer = _WordPiece(ctx.tokenizer, ctx.tokenizer_backend)
    yield from albert_reference_batches(urls, tokenizer, albert_settings(config), stats=ctx.read_stats)


def albert_tokenizer_warning(tokenizer: TextTokenizer) -> str | None:
    """As the BERT reference's for a WordPiece vocab; a SentencePiece model is read by ALBERT's
    own rules (``albert_rules``), whatever the loaded tokenizer."""
    if str(tokenizer.path).endswith(".model") or getattr(tokenizer, "sentencepiece", None) is not None:
        return None
    return google_tokenizer_warning(tokenizer)


ALBERT_REFERENCE = ReferenceMode(
    build=build_reference,
    unit="corpus",
    masking="static",
    masking_schemes=("ngram",),
    help="google-research/albert create_pretraining_data.py, all inputs in one run (numpy seeded with "
    "np.random.seed(--random-seed))",
    tokenizer_warning=albert_tokenizer_warning,
)
