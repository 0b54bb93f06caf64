"""The per-task pure function: pieces of input in, committed shards and a completion marker out.

    read documents -> [block of ~block_bytes] -> tokenize (batched Rust calls) -> build
    instances in shuffled order -> mask (vectorised) -> append to shard -> ... -> commit shards
    -> marker

Output depends only on (the task's input bytes, the config, the task's seed). Memory is bounded
by the block size, not by the task or the corpus. The marker is written last: a task without a
marker is redone from scratch on resume, and its shards are rewritten identically.
"""

from __future__ import annotations

import json
import time
from collections import Counter
from typing import Callable

import numpy as np

from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.instances.batch import InstanceBatch
from mlm_pipeline.instances.bert_nsp import TokenizedDocs, build_nsp_instances
from mlm_pipeline.instances.packed import build_single_segment_instances
from mlm_pipeline.masking import MaskingSpec, mask_batch
from mlm_pipeline.plan import Task
from mlm_pipeline.read import ReadOptions, iter_documents
from mlm_pipeline.stats import ReadStats, merge_counts
from mlm_pipeline.tokenize import TextTokenizer, load_tokenizer
from mlm_pipeline.write.shards import ShardSink

TASKS_DIR = "_tasks"

ProgressFn = Callable[[dict], None]


def marker_url(output: str, task_id: str) -> str:
    return fs.join(output, TASKS_DIR, f"{task_id}.json")


def tokenize_documents(
    documents: list[list[str]], tok: TextTokenizer, stats: ReadStats
) -> TokenizedDocs:
    """One batched tokenizer call for a block; drops sentences and documents that yield no token."""
    sentences = [s for doc in documents for s in doc]
    ids, lens = tok.encode_batch(sentences)
    doc_of_sentence = np.repeat(np.arange(len(documents)), [len(d) for d in documents])
    keep = lens > 0
    doc_sentences = np.bincount(doc_of_sentence[keep], minlength=len(documents))
    empty_docs = int(np.count_nonzero(doc_sentences == 0))
    if empty_docs:
        stats.skip("no_tokens", empty_docs)
        stats.documents_read -= empty_docs
    return TokenizedDocs(ids=ids, sentence_lengths=lens[keep], doc_sentences=doc_sentences[doc_sentences > 0])


class _BlockStats:
    def __init__(self) -> None:
        self.pairs = Counter()
        self.mask = Counter()
        self.tokens = 0
        self.length_hist: Counter = Counter()
        self.masked_hist: Counter = Counter()

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
        }


def masking_spec(config: PrepareConfig, tok: TextTokenizer) -> MaskingSpec:
    return MaskingSpec(
        masked_lm_prob=config.masked_lm_prob,
        max_predictions=config.max_predictions_per_seq,
        vocab_size=tok.vocab_size,
        mask_id=tok.special.mask,
        special_ids=tok.special_id_array,
        do_whole_word_mask=config.do_whole_word_mask,
        is_continuation=tok.is_continuation,
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
) -> None:
    docs = tokenize_documents(documents, tok, read_stats)
    if len(docs.doc_sentences) == 0:
        return
    rng = np.random.default_rng(task.seed_sequence(config.random_seed, block_index))
    # instances come out of building already in their shuffled order (no second gather)
    if config.objective == "nsp":
        batch, pair_stats = build_nsp_instances(
            docs,
            max_seq_length=config.max_seq_length,
            short_seq_prob=config.short_seq_prob,
            dupe_factor=config.dupe_factor,
            cls_id=tok.special.cls,
            sep_id=tok.special.sep,
            rng=rng,
            shuffle=True,
        )
        pairs = pair_stats.to_dict()
    else:
        # one packing, dupe_factor copies of each instance (masked apart below), shuffled
        once = build_single_segment_instances(
            docs, objective=config.objective, max_seq_length=config.max_seq_length,
            cls_id=tok.special.cls, sep_id=tok.special.sep,
        )
        batch = once.take(rng.permutation(len(once) * config.dupe_factor) % len(once))
        pairs = {"instances": len(batch)}
    mask_stats = {}
    if config.masking == "static":
        batch, masked = mask_batch(batch, masking_spec(config, tok), rng)
        mask_stats = masked.to_dict()
    block_stats.add(batch, pairs, mask_stats, len(docs.ids))
    sink.write(batch)


def _run_reference(task: Task, config: PrepareConfig, tok: TextTokenizer, read_stats: ReadStats,
                   block_stats: _BlockStats, sink: ShardSink) -> None:
    """Reference mode: one whole file, the reference's parsing, algorithm and random stream."""
    from mlm_pipeline.instances.reference import reference_instances_for_file

    (piece,) = task.pieces
    batch = reference_instances_for_file(
        piece.url,
        tok,
        max_seq_length=config.max_seq_length,
        max_predictions_per_seq=config.max_predictions_per_seq,
        masked_lm_prob=config.masked_lm_prob,
        dupe_factor=config.dupe_factor,
        short_seq_prob=config.short_seq_prob,
        do_whole_word_mask=config.do_whole_word_mask,
        random_seed=config.random_seed,
        stats=read_stats,
    )
    pairs = {"instances": len(batch), "random_next": int(batch.next_sentence_labels.sum())}
    block_stats.add(batch, pairs, _mask_counts(batch, tok.special.mask), int(batch.lengths.sum() - 3 * len(batch)))
    sink.write(batch)


def _mask_counts(batch: InstanceBatch, mask_id: int) -> dict:
    """Masking stats recovered from a masked batch (for builders that mask on their own)."""
    rows = np.repeat(np.arange(len(batch)), batch.masked_counts)
    shown = batch.input_ids[batch.offsets[rows] + batch.masked_lm_positions]
    as_mask = shown == mask_id
    kept = ~as_mask & (shown == batch.masked_lm_ids)
    return {
        "masked_tokens": int(len(shown)),
        "masked_as_mask_token": int(as_mask.sum()),
        "masked_as_random_token": int((~as_mask & ~kept).sum()),
        "masked_kept": int(kept.sum()),
    }


def run_task(task: Task, config: PrepareConfig, progress: ProgressFn | None = None) -> dict:
    """Process one task completely and return its marker (also written to ``_tasks/ID.json``)."""
    started = time.time()
    tok = load_tokenizer(config.tokenizer, config.do_lower_case)
    options = ReadOptions(
        text_field=config.text_field,
        on_decode_error=config.on_decode_error,
        max_line_bytes=config.max_line_bytes,
    )
    read_stats = ReadStats()
    block_stats = _BlockStats()
    sink = ShardSink(
        config.output,
        task.task_id,
        fmt=config.format,
        max_instances_per_shard=config.max_instances_per_shard,
        max_seq_length=config.max_seq_length,
        max_predictions=config.max_predictions_per_seq,
    )
    try:
        if config.reference:
            _run_reference(task, config, tok, read_stats, block_stats, sink)
        else:
            block: list[list[str]] = []
            block_chars = 0
            block_index = 0
            last = {"documents": 0, "bytes": 0, "tokens": 0}

            def report() -> None:
                if progress is not None:
                    now = {"documents": read_stats.documents_read, "bytes": read_stats.bytes_read,
                           "tokens": block_stats.tokens}
                    progress({k: now[k] - last[k] for k in now})
                    last.update(now)

            for piece in task.pieces:
                for doc in iter_documents(piece, options, read_stats):
                    block.append(doc)
                    block_chars += sum(len(s) for s in doc)
                    if block_chars >= config.block_bytes:
                        _process_block(block, block_index, task, config, tok, read_stats, block_stats, sink)
                        block, block_chars = [], 0
                        block_index += 1
                        report()
            if block:
                _process_block(block, block_index, task, config, tok, read_stats, block_stats, sink)
            report()
        shards = sink.close()
    except BaseException:
        sink.abort()
        raise
    marker = {
        "task_id": task.task_id,
        "task": task.to_dict(),
        "output_fingerprint": config.output_fingerprint(),
        "shards": shards,
        "stats": merge_counts([read_stats.to_dict(), block_stats.to_dict()]),
        "seconds": round(time.time() - started, 3),
    }
    fs.atomic_write_bytes(marker_url(config.output, task.task_id), json.dumps(marker, indent=1).encode())
    return marker
