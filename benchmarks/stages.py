#!/usr/bin/env python
"""Where one worker's time goes: each stage of the per-task function timed on the same blocks.

Reads a text file in the pipeline's blocks (``--block-size``, default 4 MB of text), then for
every block times, alternating and ``--repeats`` times, the raw tokenizer call alone and each
stage of ``prepare`` on it: read, tokenize (ids into numpy), build NSP pairs (in shuffled
order), mask, encode as TFRecord, encode as Parquet. Prints the median CPU seconds per stage and
each stage as a share of the raw tokenizer's time, which is the ratio ``prepare_bench.py``
measures end to end, stage by stage and far less exposed to other load (all stages run back to
back).

    python benchmarks/stages.py --input /path/to/wikitext2-train.txt --dupe-factor 5
"""

from __future__ import annotations

import argparse
import io
import os
import statistics
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "src"))
os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")

import numpy as np  # noqa: E402

from mlm_pipeline.instances.nsp import build_nsp_instances  # noqa: E402
from mlm_pipeline.masking import MaskingSpec, mask_batch  # noqa: E402
from mlm_pipeline.read import Piece, ReadOptions, iter_documents  # noqa: E402
from mlm_pipeline.stats import ReadStats  # noqa: E402
from mlm_pipeline.task import tokenize_documents  # noqa: E402
from mlm_pipeline.tokenize import load_tokenizer  # noqa: E402
from mlm_pipeline.formats.parquet import SCHEMA, WRITE_OPTIONS, batch_to_table  # noqa: E402
from mlm_pipeline.formats.tfrecord import encode_tfrecord  # noqa: E402

STAGES = ["raw tokenizer", "read", "tokenize", "build", "mask", "tfrecord", "parquet"]


def read_blocks(path: str, block_chars: int, max_blocks: int) -> list[list[list[str]]]:
    blocks, block, chars = [], [], 0
    for doc in iter_documents(Piece(path, "text"), ReadOptions(), ReadStats()):
        block.append(doc)
        chars += sum(len(s) for s in doc)
        if chars >= block_chars:
            blocks.append(block)
            block, chars = [], 0
            if len(blocks) == max_blocks:
                return blocks
    return blocks + ([block] if block else [])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", default=str(REPO / "sample" / "wikitext2-train-1MB.txt"))
    p.add_argument("--vocab", default=str(REPO / "sample" / "bert-base-uncased-vocab.txt"))
    p.add_argument("--dupe-factor", type=int, default=1)
    p.add_argument("--whole-word", action="store_true")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--max-predictions", type=int, default=20)
    p.add_argument("--block-size", type=int, default=4 << 20, help="characters of text per block")
    p.add_argument("--blocks", type=int, default=2, help="blocks to time (from the start of the input)")
    p.add_argument("--repeats", type=int, default=5)
    args = p.parse_args(argv)

    import pyarrow.parquet as pq

    tok = load_tokenizer(args.vocab)
    spec = MaskingSpec(0.15, args.max_predictions, tok.vocab_size, tok.special.mask, tok.special_id_array,
                       args.whole_word, tok.is_continuation)
    clock = time.process_time
    blocks = read_blocks(args.input, args.block_size, args.blocks)  # once unmeasured: imports, page cache
    chars = sum(len(s) for b in blocks for d in b for s in d)
    times: dict[str, list[float]] = {s: [] for s in STAGES}
    for _ in range(args.repeats):
        total = dict.fromkeys(STAGES, 0.0)
        t = clock()
        read_blocks(args.input, args.block_size, args.blocks)
        total["read"] = clock() - t
        for i, docs in enumerate(blocks):
            sentences = [s for d in docs for s in d]
            t = clock()
            for start in range(0, len(sentences), 1024):
                sum(len(e) for e in tok.tokenizer.encode_batch_fast(sentences[start : start + 1024],
                                                                     add_special_tokens=False))
            total["raw tokenizer"] += clock() - t
            t = clock()
            tokenized = tokenize_documents(docs, tok, ReadStats())
            total["tokenize"] += clock() - t
            rng = np.random.default_rng(i)
            t = clock()
            batch, _ = build_nsp_instances(tokenized, max_seq_length=args.max_seq_length, short_seq_prob=0.1,
                                           dupe_factor=args.dupe_factor, cls_id=tok.special.cls,
                                           sep_id=tok.special.sep, rng=rng, shuffle=True)
            total["build"] += clock() - t
            t = clock()
            batch, _ = mask_batch(batch, spec, rng)
            total["mask"] += clock() - t
            t = clock()
            encode_tfrecord(batch, max_seq_length=args.max_seq_length, max_predictions=args.max_predictions)
            total["tfrecord"] += clock() - t
            t = clock()
            writer = pq.ParquetWriter(io.BytesIO(), SCHEMA, **WRITE_OPTIONS)
            writer.write_table(batch_to_table(batch))
            writer.close()
            total["parquet"] += clock() - t
        for s in STAGES:
            times[s].append(total[s])
    med = {s: statistics.median(v) for s, v in times.items()}
    raw = med["raw tokenizer"]
    print(f"{len(blocks)} block(s), {chars / 1e6:.1f} M characters, dupe factor {args.dupe_factor}, "
          f"{'whole-word' if args.whole_word else 'token'} masking; median of {args.repeats} (CPU seconds)")
    for s in STAGES:
        print(f"  {s:<14} {med[s]:7.3f} s  {100 * med[s] / raw:6.1f}% of the raw tokenizer")
    for fmt in ("tfrecord", "parquet"):
        ours = sum(med[s] for s in ("read", "tokenize", "build", "mask", fmt))
        print(f"  raw tokenizer / all stages with {fmt}: {raw / ours:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
