"""Decode shards back to text: ``[CLS] the [MASK] sat ... [SEP]`` plus the masked labels."""

from __future__ import annotations

import json
import os
from typing import Iterator

from mlm_pipeline import fs
from mlm_pipeline.instances.batch import InstanceBatch


class InspectError(ValueError):
    pass


def read_shard(url: str) -> InstanceBatch:
    if url.endswith(".parquet"):
        from mlm_pipeline.write.parquet import read_parquet

        return read_parquet(url)
    if url.endswith(".tfrecord"):
        from mlm_pipeline.write.tfrecord import read_tfrecord

        return read_tfrecord(url)
    raise InspectError(f"{url}: not a .tfrecord or .parquet shard")


def _resolve(path: str) -> tuple[list[str], dict | None]:
    """Shard URLs to show and the run record (if the path is, or is inside, an output dir)."""
    run_url = fs.join(path, "_run.json")
    if fs.exists(run_url):
        record = json.loads(fs.read_bytes(run_url))
        shards = sorted(p for p in fs.listdir(fs.join(path, "shards")) if p.endswith((".tfrecord", ".parquet")))
        if not shards:
            raise InspectError(f"{path} has no shards yet")
        return shards, record
    if not fs.exists(path):
        raise InspectError(f"no such file or directory: {path}")
    parent = os.path.dirname(os.path.dirname(path.rstrip("/")))
    record_url = fs.join(parent, "_run.json") if parent else "_run.json"
    record = json.loads(fs.read_bytes(record_url)) if fs.exists(record_url) else None
    return [path], record


def format_instance(batch: InstanceBatch, i: int, tok) -> str:
    row = batch.row(i)
    tokens = tok.convert_ids_to_tokens(row["input_ids"])
    n_a = row["segment_ids"].count(0)
    labels = " ".join(
        f"{p}:{t}" for p, t in zip(row["masked_lm_positions"], tok.convert_ids_to_tokens(row["masked_lm_ids"]))
    )
    head = f"#{i}  length {len(tokens)}  segment A {n_a}"
    if "next_sentence_label" in row:
        head += f"  next_sentence_label {row['next_sentence_label']} ({'random' if row['next_sentence_label'] else 'actual'} next)"
    return f"{head}\n  {' '.join(tokens)}\n  masked: {labels or '(none)'}"


def inspect_lines(path: str, *, n: int, tokenizer: str | None, do_lower_case: bool | None, as_json: bool) -> Iterator[str]:
    shards, record = _resolve(path)
    tok = None
    if not as_json:
        from mlm_pipeline.tokenize import load_tokenizer

        settings = (record or {}).get("settings", {})
        tok_path = tokenizer or settings.get("tokenizer")
        if not tok_path:
            raise InspectError("cannot tell which tokenizer made this shard: pass --tokenizer")
        lower = settings.get("do_lower_case", True) if do_lower_case is None else do_lower_case
        tok = load_tokenizer(tok_path, lower)
    shown = 0
    for url in shards:
        batch = read_shard(url)
        yield f"== {url}: {len(batch):,} instances"
        for i in range(min(len(batch), n - shown)):
            if as_json:
                yield json.dumps(batch.row(i))
            else:
                yield format_instance(batch, i, tok)
            shown += 1
        if shown >= n:
            return
