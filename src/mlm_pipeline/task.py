"""The per-task pure function: pieces of input in, committed shards and a completion marker out.

    read documents -> [block of ~block_bytes] -> tokenize (batched Rust calls) -> build
    instances in shuffled order -> mask (vectorised) -> append to shard -> ... -> commit shards
    -> marker

Output depends only on (the task's input bytes, the config, the task's seed). Memory is bounded
by the block size, not by the task or the corpus. The marker is written last: a task without a
marker is redone from scratch on resume, and its shards are rewritten identically.
"""

from __future__ import annotations

import time
from bisect import bisect_left
from dataclasses import replace
from itertools import accumulate
from collections import Counter
from typing import Callable, Iterator

import numpy as np
from numpy.random import default_rng  # numpy imports its random module on first use otherwise

from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.instances import BuildContext, ReferenceContext, TokenizedDocs, get_objective
from mlm_pipeline.instances.batch import InstanceBatch, gather_ranges
from mlm_pipeline.languages import SAMPLE_KEY, document_language, document_uses, in_use as languages_in_use
from mlm_pipeline.languages import detector as language_detector
from mlm_pipeline.masking import MaskingSpec, mask_batch
from mlm_pipeline.masking.registry import needs_words
from mlm_pipeline.plan import Task
from mlm_pipeline.read import ReadOptions, iter_document_runs, iter_documents
from mlm_pipeline.run.state import write_marker
from mlm_pipeline.stats import ReadStats, merge_counts
from mlm_pipeline.tokenize import TextTokenizer, load_tokenizer
from mlm_pipeline.tokenize.selfcheck import check_budget, first_texts
from mlm_pipeline.formats.sink import open_sink

ProgressFn = Callable[[dict], None]


def utf8_size(text: str) -> int:
    """A text's UTF-8 size, what ``block_bytes`` counts: an ASCII text's size is its length
    (``isascii`` is a flag check in CPython); another is encoded once (lone surrogates, which JSON
    escapes can produce, count their 3 bytes instead of failing)."""
    return len(text) if text.isascii() else len(text.encode("utf-8", "surrogatepass"))


def text_bytes(sentences: list[str]) -> int:
    """UTF-8 size of the sentences (:func:`utf8_size`)."""
    return utf8_size("".join(sentences))


def documents_bytes(documents: list[list[str]]) -> list[int]:
    """:func:`text_bytes` of each document, in bulk (the C loops of ``map``)."""
    texts = list(map("".join, documents))
    return list(map(len, texts)) if all(map(str.isascii, texts)) else list(map(utf8_size, texts))


def tokenize_documents(
    documents: list[list[str]], tok: TextTokenizer, stats: ReadStats, unknown: _UnknownWords | None = None
) -> TokenizedDocs:
    """One batched tokenizer call for a block; drops sentences and documents that yield no token.
    ``unknown``: where the words that became the unknown token are counted."""
    sentences = [s for doc in documents for s in doc]
    ids, lens = tok.encode_batch(sentences)
    if unknown is not None:
        unknown.collect(sentences, ids, lens, tok)
    doc_of_sentence = np.repeat(np.arange(len(documents)), [len(d) for d in documents])
    keep = lens > 0
    doc_sentences = np.bincount(doc_of_sentence[keep], minlength=len(documents))
    empty_docs = int(np.count_nonzero(doc_sentences == 0))
    if empty_docs:
        stats.skip("no_tokens", empty_docs)
        stats.documents_read -= empty_docs
    return TokenizedDocs(ids=ids, sentence_lengths=lens[keep], doc_sentences=doc_sentences[doc_sentences > 0],
                         read_index=np.flatnonzero(doc_sentences))


UNKNOWN_WORD_TEXTS = 50
"""Sentences holding an unknown token whose words a task looks up (the first ones): the top
unknown words come from this sample, found by encoding each sentence's words again (HF with
offsets for the ones that hold it), so a text full of unknown tokens costs a task a few ms more,
not a second tokenization of its text. (200 sentences cost an XLM-R-style Unigram run 0.04 s a
4 MB task, a fifth of its time after the tokenizer; on the bundled WikiText-2 and 红楼梦 samples,
50 find 9 of the 10 most frequent unknown words that 200 find.)"""
UNKNOWN_SHARE_SOUGHT = 0.005
"""Blocks whose tokens are at least this share unknown are searched for their unknown words (half
the share the report warns at): text a vocabulary fits costs one comparison of its ids."""
TOP_UNKNOWN_WORDS = 50
"""Words that became the unknown token that a task records (``unknown_words``), most frequent first."""


class _UnknownWords:
    """Which words became the unknown token: counted in a bounded sample of a task's sentences
    (``UNKNOWN_WORD_TEXTS``), only in sentences whose ids hold the unknown id, of blocks with a
    notable share of them (``UNKNOWN_SHARE_SOUGHT``)."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()
        self.left = UNKNOWN_WORD_TEXTS

    def collect(self, sentences: list[str], ids: np.ndarray, lens: np.ndarray, tok: TextTokenizer) -> None:
        if tok.unk_id is None or self.left <= 0:
            return
        at = np.flatnonzero(ids == tok.unk_id)
        if len(at) < UNKNOWN_SHARE_SOUGHT * len(ids) or not len(at):
            return
        which = np.unique(np.searchsorted(np.cumsum(lens), at, side="right"))[: self.left]
        self.left -= len(which)
        self.counts.update(tok.unknown_words([sentences[i] for i in which]))

    def to_dict(self) -> dict:
        top = sorted(self.counts.items(), key=lambda kv: (-kv[1], kv[0]))[:TOP_UNKNOWN_WORDS]
        return {"unknown_words": dict(top)} if top else {}


TOP_TOKENS = 500
"""Most frequent tokens a task records (``top_token_counts``): the run's totals sum them, so a
token's count there is exact when it is among every task's most frequent, a lower bound otherwise."""


def largest(counts: np.ndarray, k: int) -> np.ndarray:
    """Indices of the ``k`` largest counts, largest first and equal counts by index: the first
    ``k`` of a stable argsort of ``-counts`` (counts: not negative), from a partition of the
    counts that are not 0 (0.03 ms instead of 0.6 ms for 30,522 counts, once per task)."""
    n = len(counts)
    if n <= k:
        return np.argsort(-counts, kind="stable")
    used = np.flatnonzero(counts)
    if len(used) < n:  # the partition slows down 100x on ties: a 250k vocabulary's counts are mostly 0
        top = used[largest(counts[used], k)]
        return top if len(top) == k else np.concatenate([top, np.flatnonzero(counts == 0)[: k - len(top)]])
    kth = np.partition(counts, n - k)[n - k]  # the k-th largest count
    above = np.flatnonzero(counts > kth)
    chosen = np.concatenate([above, np.flatnonzero(counts == kth)[: k - len(above)]])
    return chosen[np.lexsort((chosen, -counts[chosen]))]


class _BlockStats:
    def __init__(self) -> None:
        self.pairs = Counter()
        self.mask = Counter()
        self.tokens = 0
        self.length_hist: Counter = Counter()
        self.masked_hist: Counter = Counter()
        self.token_counts: np.ndarray | None = None  # per token id, the input tokens (default mode)
        self.unk_tokens = 0
        self.unknown = _UnknownWords()
        self.languages: dict[str, Counter] = {}  # language -> its counts (runs with languages)

    def count_tokens(self, ids: np.ndarray, tok: TextTokenizer) -> None:
        """Count the input tokens of a block by id (one ``bincount``) and its unknown tokens."""
        counts = np.bincount(ids, minlength=tok.vocab_size)
        self.token_counts = counts if self.token_counts is None else self.token_counts + counts[: len(self.token_counts)]
        if tok.unk_id is not None:
            self.unk_tokens += int(counts[tok.unk_id])

    def token_dict(self, tok: TextTokenizer) -> dict:
        """``unk_tokens`` and ``top_token_counts`` (token text -> count), when tokens were counted."""
        if self.token_counts is None:
            return {}
        counts = self.token_counts
        top = largest(counts, TOP_TOKENS)
        top = top[counts[top] > 0]
        names = tok.convert_ids_to_tokens(top)
        return {"unk_tokens": self.unk_tokens,
                "top_token_counts": {name: int(counts[i]) for name, i in zip(names, top)},
                **self.unknown.to_dict()}

    def count_language(self, language: str, docs: TokenizedDocs, passes: list) -> None:
        """A block's input tokens and documents in ``language``, and those its passes use."""
        c = self.languages.setdefault(language, Counter())
        c["tokens"] += len(docs.ids)
        c["documents"] += len(docs.doc_sentences)
        c["sampled_tokens"] += sum(len(d.ids) for d, _ in passes)
        c["sampled_documents"] += sum(len(d.doc_sentences) for d, _ in passes)

    def count_instances(self, language: str, batch: InstanceBatch) -> None:
        c = self.languages.setdefault(language, Counter())
        c["instances"] += len(batch)
        c["instance_tokens"] += int(batch.offsets[-1])

    def add(self, batch: InstanceBatch, pair: dict, mask: dict, tokens: int) -> None:
        self.pairs.update(pair)
        self.mask.update(mask)
        self.tokens += tokens
        self.length_hist.update(dict(zip(*np.unique(batch.lengths, return_counts=True))))
        self.masked_hist.update(dict(zip(*np.unique(batch.masked_counts, return_counts=True))))

    def to_dict(self) -> dict:
        return {
            "tokens": int(self.tokens),
            **{k: int(v) for k, v in self.pairs.items()},
            **{k: int(v) for k, v in self.mask.items()},
            "instance_length_histogram": {str(int(k)): int(v) for k, v in sorted(self.length_hist.items())},
            "masked_per_instance_histogram": {str(int(k)): int(v) for k, v in sorted(self.masked_hist.items())},
            **({"languages": {code: {k: int(v) for k, v in sorted(c.items())}
                              for code, c in sorted(self.languages.items())}} if self.languages else {}),
        }


def _word_continuation(config: PrepareConfig, tok: TextTokenizer) -> np.ndarray:
    """How words are grouped for masking: the objective's rule if it has one, else the tokenizer's."""
    rule = get_objective(config.objective).word_continuation
    return tok.is_continuation if rule is None else rule(tok)


def masking_spec(config: PrepareConfig, tok: TextTokenizer) -> MaskingSpec:
    return MaskingSpec(
        masked_lm_prob=config.masked_lm_prob,
        max_predictions=config.max_predictions_per_seq,
        vocab_size=tok.vocab_size,
        mask_id=tok.special.mask,
        special_ids=tok.special_id_array,
        do_whole_word_mask=config.do_whole_word_mask,
        is_continuation=_word_continuation(config, tok) if needs_words(config) else None,
        scheme=config.masking_scheme,
        ngram=config.ngram,
        favor_shorter_ngram=config.favor_shorter_ngram,
        geometric_p=config.geometric_p,
        span_lower=config.span_lower,
        span_upper=config.span_upper,
    )


def _process_block(
    documents: list[list[str]],
    block_index: int,
    task: Task,
    config: PrepareConfig,
    tok: TextTokenizer,
    read_stats: ReadStats,
    block_stats: _BlockStats,
    sink: ShardSink,
    language: str | None = None,
) -> None:
    """Tokenize a block, build its instances with the configured objective, mask, write.

    ``language``: the block's language (every document of a block has the same one), recorded
    on each instance; with ``--language-alpha`` its documents are used as often as the
    language's rate says (:mod:`mlm_pipeline.languages`): one pass over the documents drawn for
    it after another, each pass with its own seed (the first one the block's)."""
    if block_index == 0:  # the fast backend must agree with HF on this task's own text too
        tok.check_block(first_texts(documents, check_budget(task.input_bytes)), f"task {task.task_id}")
    docs = tokenize_documents(documents, tok, read_stats, block_stats.unknown)
    block_stats.count_tokens(docs.ids, tok)
    if len(docs.doc_sentences) == 0:
        return
    rng = default_rng(task.seed_sequence(config.random_seed, block_index))
    rate = dict(task.language_rates).get(language) if language is not None else None
    passes = [(docs, rng)]
    if rate is not None:
        draw = default_rng(task.seed_sequence(config.random_seed, block_index, SAMPLE_KEY))
        token_bounds = docs.sentence_offsets[docs.doc_offsets]
        uses = document_uses(rate, np.diff(token_bounds), draw)
        passes = [(docs if (uses > k).all() else _select_documents(docs, uses > k),
                   rng if k == 0 else default_rng(task.seed_sequence(config.random_seed, block_index, k)))
                  for k in range(int(uses.max(initial=0)))]
    if language is not None:
        block_stats.count_language(language, docs, passes)
    if not passes:  # every document left out
        block_stats.tokens += len(docs.ids)
    for k, (pass_docs, pass_rng) in enumerate(passes):
        # instances come out of building already in their shuffled order (no second gather)
        batch, counts = get_objective(config.objective).build(pass_docs, BuildContext(config, tok, pass_rng))
        mask_stats = {}
        if config.masking == "static":
            built = batch
            batch, masked = mask_batch(batch, masking_spec(config, tok), pass_rng)
            batch.token_boundary = built.token_boundary  # (sop's; masking keeps every row's length)
            mask_stats = masked.to_dict()
        if language is not None:
            batch.languages = np.full(len(batch), language)
            block_stats.count_instances(language, batch)
        if batch.source_documents is not None:
            name_sources(batch, documents, pass_docs.read_index, config)
        block_stats.add(batch, counts, mask_stats, len(docs.ids) if k == 0 else 0)
        sink.write(batch)


def name_sources(batch: InstanceBatch, documents: list[list[str]], read_index: np.ndarray, config: PrepareConfig) -> None:
    """Fill ``batch.document_ids`` and ``document_metadata`` (as asked) from the records of the
    block's ``documents`` that its rows come from (``source_documents``: indices into the tokenized
    block, whose ``read_index`` maps them back to ``documents``). A document that is not a record
    (a text file read among JSONL ones) has the empty string for both."""
    which = read_index[batch.source_documents]
    for attribute, field, wanted in (("id", "document_ids", config.id_field),
                                     ("metadata", "document_metadata", config.metadata_field)):
        if wanted is not None:  # (one value per document read, then one gather: copies cost no Python)
            per_document = np.array([getattr(doc, attribute, None) or "" for doc in documents], dtype=object)
            setattr(batch, field, per_document[which])
    batch.source_documents = None  # (indices into this block only: not written)


def _select_documents(docs: TokenizedDocs, keep: np.ndarray) -> TokenizedDocs:
    """The documents of ``docs`` where ``keep`` is True, in their order."""
    doc_bounds = docs.doc_offsets  # sentence index bounds of each document
    token_bounds = docs.sentence_offsets
    starts = token_bounds[doc_bounds[:-1]]
    lengths = token_bounds[doc_bounds[1:]] - starts
    (ids,) = gather_ranges((docs.ids,), starts[keep], lengths[keep])
    (sentence_lengths,) = gather_ranges((docs.sentence_lengths,), doc_bounds[:-1][keep], docs.doc_sentences[keep])
    return TokenizedDocs(ids=ids, sentence_lengths=sentence_lengths, doc_sentences=docs.doc_sentences[keep],
                         read_index=None if docs.read_index is None else docs.read_index[keep])


def _blocks(task: Task, config: PrepareConfig, options: ReadOptions,
            read_stats: ReadStats) -> Iterator[tuple[str | None, list[list[str]], bool]]:
    """The task's documents in blocks of ``block_bytes``: ``(language, documents, full)``, the
    blocks numbered in the order they fill, those left unfilled at the end last (by language).
    A block per language (one, language None, without languages): an instance never mixes
    languages. Without languages the loop keeps its block in locals (a dict lookup per document
    cost a 100 MB run of short paragraphs 0.07 s)."""
    block_bytes = config.block_bytes
    if not languages_in_use(config):
        block, size = [], 0
        for piece in task.pieces:
            for run in iter_document_runs(piece, options, read_stats):
                # ends[k]: the bytes of run[:k]; a block is full after the first document that
                # takes it to block_bytes: a bisection per block, not a step per document
                ends = list(accumulate(documents_bytes(run), initial=0))
                i, n = 0, len(run)
                while i < n:
                    k = bisect_left(ends, block_bytes - size + ends[i], i + 1)
                    if k > n:
                        block.extend(run[i:])
                        size += ends[n] - ends[i]
                        break
                    block.extend(run[i:k])
                    yield None, block, True
                    block, size, i = [], 0, k
        if block:
            yield None, block, False
        return
    detect = language_detector(config)
    blocks: dict[str | None, tuple[list[list[str]], int]] = {}
    for piece in task.pieces:
        for doc in iter_documents(piece, options, read_stats):
            language = document_language(doc, piece, detect)
            block, size = blocks.pop(language, ([], 0))
            block.append(doc)
            size += text_bytes(doc)
            if size >= block_bytes:
                yield language, block, True
            else:
                blocks[language] = (block, size)
    for language, (block, _) in sorted(blocks.items(), key=lambda kv: kv[0] or ""):
        yield language, block, False


def _run_reference(task: Task, config: PrepareConfig, tok: TextTokenizer, read_stats: ReadStats,
                   block_stats: _BlockStats, sink: ShardSink, report: Callable[[], None]) -> dict | None:
    """Reference mode: the objective's reference reads the task's files whole, with its own
    parsing, algorithm, random stream and (if any) masking. Returns what encoded the text (a
    reference may tokenize by its own rules, with its own checked encoder). Progress is reported
    per batch the reference yields (a file, or a flush of ELECTRA's writer)."""
    reference = get_objective(config.objective).reference
    ctx = ReferenceContext(settings=config, tokenizer=tok, read_stats=read_stats)
    for batch, counts in reference.build([piece.url for piece in task.pieces], ctx):
        counts = dict(counts)
        tokens = counts.pop("tokens", 0)
        block_stats.add(batch, counts, {}, tokens)
        sink.write(batch)
        report()
    return ctx.tokenizer_backend or None


def _check_all_written(task: Task, block_stats: _BlockStats, shards: list[dict]) -> None:
    """Every instance the task built is in its committed files, or the task fails (no marker)."""
    built, written = block_stats.pairs.get("instances", 0), sum(s["instances"] for s in shards)
    if built != written:
        raise RuntimeError(f"task {task.task_id} built {built:,} instances but its files hold {written:,}: "
                           "a defect of mlm-pipeline's writer; the task is not marked done")


def run_task(task: Task, config: PrepareConfig, progress: ProgressFn | None = None) -> dict:
    """Process one task completely and return its marker, which it writes last (the task is done)."""
    started = time.time()
    clock = time.perf_counter()
    tok = load_tokenizer(config.tokenizer, config.do_lower_case, config.tokenizer_flavor,
                         backend=config.tokenizer_backend)
    tok.begin_task()  # a fallback of an earlier task in this process does not carry over
    options = replace(ReadOptions.from_config(config), unknown_text=tok.unknown_text() or "")
    read_stats = ReadStats()
    block_stats = _BlockStats()
    # ELECTRA's layout (three features) has no masked-LM slots at all
    sequence_only = get_objective(config.objective).writes_sequence_features_only(config.masking)
    sink = open_sink(config, task.task_id, task_index=task.index, task_count=task.count,
                     max_predictions=0 if sequence_only else config.max_predictions_per_seq,
                     vocab_size=tok.vocab_size)
    last = {"documents": 0, "bytes": 0, "tokens": 0}

    def report() -> None:
        """The increments since the last report (also the executor's sign that the task is alive)."""
        if progress is not None:
            now = {"documents": read_stats.documents_read, "bytes": read_stats.bytes_read,
                   "tokens": block_stats.tokens}
            progress({k: now[k] - last[k] for k in now})
            last.update(now)

    try:
        reference_backend = None  # what a reference mode's own tokenizing used
        if config.reference:
            reference_backend = _run_reference(task, config, tok, read_stats, block_stats, sink, report)
        else:
            for block_index, (language, block, full) in enumerate(_blocks(task, config, options, read_stats)):
                _process_block(block, block_index, task, config, tok, read_stats, block_stats, sink, language)
                if full:
                    report()
            report()
        shards = sink.close()
        _check_all_written(task, block_stats, shards)
    except BaseException:
        sink.abort()
        raise
    marker = {
        "task_id": task.task_id,
        "task": task.to_dict(),
        "output_fingerprint": config.output_fingerprint(),
        "shards": shards,
        "stats": merge_counts([read_stats.to_dict(), block_stats.to_dict(), block_stats.token_dict(tok)]),
        "started": round(started, 3),  # (seconds since the epoch; markers are not shards: no digest changes)
        "seconds": round(time.perf_counter() - clock, 3),
        "tokenizer_backend": reference_backend or tok.backend_info,
    }
    write_marker(config.output, marker)
    return marker
