#!/usr/bin/env python
"""Scale on paper: plan and finalize a simulated corpus of 100,000 files and 10 TB, with no data.

The corpus lives on ``sim://``, an fsspec filesystem defined here: a directory tree of ``.txt``
files whose sizes are drawn from a log-normal distribution (seeded) and scaled to ``--total-bytes``
exactly, and whose reads return generated text (documents of sentences, blank lines between), so
the planner's head sniffing sees real-looking text. It behaves like an object store: a listing
counts one request per 1,000 entries, ``info`` is a HEAD, each range read a GET, and files are
read through fsspec's buffered file with s3fs's default block size (``--block-size``), so the
bytes counted are those an S3 client would fetch. ``--latency-ms`` adds that delay to every
request, ``--connections`` of them at a time (s3fs: botocore's pool of 10): the planner's requests
are then what costs time, not its CPU.

The run's output is a local directory (``--work-dir``, a temporary one by default, deleted at the
end unless ``--keep``). Each phase runs in a fresh subprocess, so that its peak RSS (``VmHWM``) is
its own:

  plan      ``run.state.start_run``: what ``prepare`` does before its first task (tokenizer load,
            input listing and sniffing, the plan, ``_run.json``, ``_plan.json``, the resume scan)
  markers   setup, not a target: a completion marker for every task of the plan, written by
            ``run.state.write_marker`` (the format is the real one) with synthetic shards and
            stats scaled from a real run (about 2.1 instances per KB of text, 811 bytes per
            TFRecord instance, ``--max-instances-per-shard`` per shard), and a sparse file of that size per shard
  finalize  ``run.manifest.finalize(output)``: what ``mlm-pipeline finalize`` does; also the cost
            of one "is every task done?" check of array and claim workers (one marker listing)
  load      the loader's side: ``json.loads`` of ``manifest.json`` (time and the memory of the
            parsed object), ``torch.load_prepared`` and the pickled size of what it returns
            (what every spawned DataLoader worker receives)

After the timed part, plan and finalize check their result: every simulated byte is planned into
exactly one task (the pieces of each file tile it), and the manifest lists every task's shards in
task order.

    python benchmarks/scale_sim.py                                  # 100,000 files, 10 TB
    python benchmarks/scale_sim.py --files 2000 --total-bytes 200GB --out results.json
    python benchmarks/scale_sim.py --latency-ms 20 --phases plan     # planning against a slow store
    python benchmarks/scale_sim.py --profile plan                    # cProfile of one phase

Sizes are binary (1 TB = 2**40 bytes), as everywhere in mlm-pipeline. (Over 600 lines: the
simulated store, the four phases and their checks are one script that runs on its own.)
"""

from __future__ import annotations

import argparse
import cProfile
import hashlib
import io
import json
import math
import os
import platform
import pstats
import re
import shutil
import subprocess
import sys
import tempfile
import threading
import time
import tracemalloc
from collections import Counter
from pathlib import Path

import fsspec
import numpy as np
from fsspec.spec import AbstractBufferedFile, AbstractFileSystem

REPO = Path(__file__).resolve().parents[1]
DEFAULT_VOCAB = REPO / "sample" / "bert-base-uncased-vocab.txt"
RESULT_TAG = "SCALE_RESULT "
PHASES = ("plan", "markers", "finalize", "load")
FILES_PER_DIR = 1000
LIST_PAGE = 1000  # entries per LIST request on S3 and GCS
S3FS_BLOCK_SIZE = 50 << 20  # s3fs's default_block_size (fsspec reads ahead this much per GET)

# From a real run (bert-base-uncased, max_seq_length 128, NSP, dupe factor 1, TFRecord):
# 98,304 bytes of WikiText-2 gave 159 documents, 224 lines, 22,023 tokens, 209 instances in 169,480 bytes.
PER_BYTE = {"documents_read": 159 / 98304, "sentences": 224 / 98304, "tokens": 22023 / 98304,
            "instances": 209 / 98304}
SHARD_BYTES_PER_INSTANCE = 169480 / 209

_UNITS = {"": 1, "b": 1, "k": 1 << 10, "kb": 1 << 10, "kib": 1 << 10, "m": 1 << 20, "mb": 1 << 20,
          "mib": 1 << 20, "g": 1 << 30, "gb": 1 << 30, "gib": 1 << 30, "t": 1 << 40, "tb": 1 << 40,
          "tib": 1 << 40}


def parse_size(value: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?(?:e\d+)?)\s*([a-zA-Z]*)\s*", value)
    if not m or m.group(2).lower() not in _UNITS:
        raise argparse.ArgumentTypeError(f"not a size: {value!r} (use e.g. 200GB, 10TB)")
    return int(float(m.group(1)) * _UNITS[m.group(2).lower()])


def human(n: float) -> str:
    for unit in ("B", "KB", "MB", "GB", "TB"):
        if abs(n) < 1024 or unit == "TB":
            return f"{n:.0f} {unit}" if unit == "B" else f"{n:.1f} {unit}"
        n /= 1024
    return f"{n:.1f} TB"


# --------------------------------------------------------------------------- the simulated store


class SimCorpus:
    """``files`` text files of log-normal sizes summing to ``total_bytes`` exactly (seeded), under
    ``corpus/dNNN/part-NNNNNN.txt`` (1,000 files a directory)."""

    def __init__(self, files: int, total_bytes: int, *, seed: int = 0, sigma: float = 1.0) -> None:
        if files < 1 or total_bytes < files:
            raise ValueError("need at least one file and one byte per file")
        rng = np.random.default_rng(seed)
        raw = rng.lognormal(mean=0.0, sigma=sigma, size=files)
        sizes = np.maximum(1, np.floor(raw / raw.sum() * total_bytes)).astype(np.int64)
        sizes[np.argmax(sizes)] += total_bytes - int(sizes.sum())  # exact total
        self.sizes = sizes
        self.total_bytes = int(total_bytes)
        self.dirs = [f"corpus/d{d:03d}" for d in range(math.ceil(files / FILES_PER_DIR))]

    @staticmethod
    def path(i: int) -> str:
        return f"corpus/d{i // FILES_PER_DIR:03d}/part-{i:06d}.txt"

    def index(self, path: str) -> int | None:
        m = re.fullmatch(r"corpus/d\d{3,}/part-(\d{6,})\.txt", path)
        if m is None:
            return None
        i = int(m.group(1))
        return i if i < len(self.sizes) and path == self.path(i) else None

    def files_in(self, directory: str) -> range:
        d = int(directory.rsplit("d", 1)[1])
        return range(d * FILES_PER_DIR, min(len(self.sizes), (d + 1) * FILES_PER_DIR))


def _text_pattern() -> bytes:
    """1 MiB of generated documents: lines of words, a blank line between documents."""
    rng = np.random.default_rng(1)
    words = [w.encode() for w in (
        "the of and to in a is that for it as was with be by on not he i this are or his from at which "
        "but have an they you were her she there been one all we their has would when if so no will "
        "more can who out about up them some could into than time other only new these two may first "
        "language model corpus training token sentence document pretraining masked river city history"
    ).split()]
    out = bytearray()
    while len(out) < 1 << 20:
        for _ in range(int(rng.integers(1, 8))):
            n = int(rng.integers(4, 40))
            out += b" ".join(words[int(k)] for k in rng.integers(0, len(words), n)).capitalize() + b".\n"
        out += b"\n"
    return bytes(out[: 1 << 20])


PATTERN = _text_pattern()


def content(start: int, end: int) -> bytes:
    """Bytes ``[start, end)`` of any simulated file (the pattern repeated)."""
    n, out, pos = len(PATTERN), [], start
    while pos < end:
        k = pos % n
        take = min(end - pos, n - k)
        out.append(PATTERN[k:k + take])
        pos += take
    return b"".join(out)


class SimFileSystem(AbstractFileSystem):
    """A read-only object store holding a ``SimCorpus`` (set with :func:`install`), counting requests."""

    protocol = "sim"
    root_marker = ""
    corpus: SimCorpus | None = None
    latency = 0.0
    block_size = S3FS_BLOCK_SIZE
    requests: Counter = Counter()
    bytes_read = 0
    _lock = threading.Lock()
    _connections = threading.BoundedSemaphore(10)

    @classmethod
    def _request(cls, kind: str, n: int = 1, nbytes: int = 0) -> None:
        with cls._lock:
            cls.requests[kind] += n
            cls.bytes_read += nbytes
        if cls.latency:
            with cls._connections:  # requests in flight at once, as a client's connection pool allows
                time.sleep(cls.latency * n)

    def _file_info(self, i: int) -> dict:
        # as an S3 listing gives it: with the object's ETag
        return {"name": self.corpus.path(i), "size": int(self.corpus.sizes[i]), "type": "file",
                "ETag": f'"{i:032x}"'}

    def ls(self, path, detail=True, **kwargs):
        path = self._strip_protocol(path).rstrip("/")
        corpus = self.corpus
        if path in ("", "corpus"):
            entries = [{"name": d, "size": 0, "type": "directory"} for d in corpus.dirs]
            if path == "":
                entries = [{"name": "corpus", "size": 0, "type": "directory"}]
        elif path in corpus.dirs:
            entries = [self._file_info(i) for i in corpus.files_in(path)]
        elif corpus.index(path) is not None:
            entries = [self._file_info(corpus.index(path))]
        else:
            self._request("list")
            raise FileNotFoundError(path)
        self._request("list", max(1, math.ceil(len(entries) / LIST_PAGE)))
        return entries if detail else [e["name"] for e in entries]

    def info(self, path, **kwargs):
        path = self._strip_protocol(path).rstrip("/")
        self._request("info")
        i = self.corpus.index(path)
        if i is not None:
            return self._file_info(i)
        if path in ("", "corpus") or path in self.corpus.dirs:
            return {"name": path, "size": 0, "type": "directory"}
        raise FileNotFoundError(path)

    def _open(self, path, mode="rb", block_size=None, autocommit=True, cache_options=None, **kwargs):
        if mode != "rb":
            raise PermissionError("sim:// is read-only")
        return SimFile(self, path, mode, block_size or self.block_size, cache_options=cache_options, **kwargs)


class SimFile(AbstractBufferedFile):
    def _fetch_range(self, start, end):
        end = min(end, self.size)
        if start >= end:
            return b""
        SimFileSystem._request("get", 1, end - start)
        return content(start, end)


def install(corpus: SimCorpus, *, latency_ms: float = 0.0, block_size: int = S3FS_BLOCK_SIZE,
            connections: int = 10) -> None:
    """Make ``sim://`` serve ``corpus`` in this process, with fresh counters."""
    SimFileSystem.corpus = corpus
    SimFileSystem.latency = latency_ms / 1000
    SimFileSystem._connections = threading.BoundedSemaphore(connections)
    SimFileSystem.block_size = block_size
    SimFileSystem.requests = Counter()
    SimFileSystem.bytes_read = 0
    fsspec.register_implementation("sim", SimFileSystem, clobber=True)
    SimFileSystem.clear_instance_cache()


# --------------------------------------------------------------------------- measuring


def rss_bytes(field: str = "VmHWM") -> int:
    """This process's peak (``VmHWM``) or current (``VmRSS``) resident set; ``ru_maxrss`` where
    there is no /proc."""
    try:
        with open("/proc/self/status") as f:
            return next(int(line.split()[1]) * 1024 for line in f if line.startswith(field + ":"))
    except (OSError, StopIteration):
        import resource

        return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024


class Measure:
    """Wall time, and with ``traced`` the tracemalloc peak, of the code in a ``with`` block;
    with ``profile`` a cProfile of it printed to stderr."""

    def __init__(self, *, traced: bool = False, profile: bool = False) -> None:
        self.traced, self.profile = traced, profile
        self.seconds = 0.0
        self.traced_peak = None

    def __enter__(self) -> Measure:
        if self.traced:
            tracemalloc.start()
        self._prof = cProfile.Profile() if self.profile else None
        self._t0 = time.perf_counter()
        if self._prof:
            self._prof.enable()
        return self

    def __exit__(self, *exc) -> None:
        if self._prof:
            self._prof.disable()
        self.seconds = time.perf_counter() - self._t0
        if self.traced:
            self.traced_peak = tracemalloc.get_traced_memory()[1]
            tracemalloc.stop()
        if self._prof:
            out = io.StringIO()
            pstats.Stats(self._prof, stream=out).sort_stats("cumulative").print_stats(40)
            print(out.getvalue(), file=sys.stderr)


def config_for(args, output: str):
    from mlm_pipeline.config import build_config

    return build_config({
        "inputs": ["sim://corpus"], "output": output, "tokenizer": str(args.tokenizer), "workers": 1,
        "progress": False, "max_instances_per_shard": args.max_instances_per_shard,
    })


def corpus_of(args) -> SimCorpus:
    return SimCorpus(args.files, args.total_bytes, seed=args.seed, sigma=args.sigma)


# --------------------------------------------------------------------------- the phases (children)


def phase_plan(args, output: str) -> dict:
    from mlm_pipeline.run import layout
    from mlm_pipeline.run.state import start_run

    corpus = corpus_of(args)
    install(corpus, latency_ms=args.latency_ms, block_size=args.block_size, connections=args.connections)
    config = config_for(args, output)
    with Measure(traced=args.tracemalloc, profile=args.profile == "plan") as m:
        start = start_run(config)
    plan = start.plan
    check = check_plan(plan, corpus)
    return {
        "seconds": m.seconds, "traced_peak_bytes": m.traced_peak, "tasks": len(plan.tasks),
        "pieces": sum(len(t.pieces) for t in plan.tasks), "split_bytes": plan.split_bytes,
        "plan_fingerprint": start.record["plan_fingerprint"],
        "plan_file_bytes": os.path.getsize(layout.plan_url(output)),
        "requests": dict(SimFileSystem.requests), "bytes_read": SimFileSystem.bytes_read, "check": check,
    }


def check_plan(plan, corpus: SimCorpus) -> dict:
    """Every simulated byte in exactly one task: the pieces of each file tile ``[0, size)``, and
    each task's ``input_bytes`` is the sum of its pieces."""
    ranges: dict[int, list[tuple[int, int]]] = {}
    for task in plan.tasks:
        task_bytes = 0
        for piece in task.pieces:
            i = corpus.index(piece.url.split("://", 1)[1])
            if i is None:
                raise SystemExit(f"plan holds a piece of an unknown file: {piece.url}")
            end = int(corpus.sizes[i]) if piece.end is None else piece.end
            ranges.setdefault(i, []).append((piece.start, end))
            task_bytes += end - piece.start
        if task.input_bytes != task_bytes:
            raise SystemExit(f"task {task.task_id}: input_bytes {task.input_bytes}, its pieces {task_bytes}")
    if len(ranges) != len(corpus.sizes):
        raise SystemExit(f"{len(corpus.sizes) - len(ranges)} simulated files are in no task")
    for i, rs in ranges.items():
        rs.sort()
        if rs[0][0] != 0 or rs[-1][1] != corpus.sizes[i] or any(a[1] != b[0] for a, b in zip(rs, rs[1:])):
            raise SystemExit(f"{corpus.path(i)}: pieces do not tile the file ({rs[:4]}...)")
    planned = sum(t.input_bytes for t in plan.tasks)
    if planned != corpus.total_bytes:
        raise SystemExit(f"{planned} bytes planned, {corpus.total_bytes} simulated")
    return {"bytes_planned": planned, "files_planned": len(ranges), "ok": True}


def synthetic_marker(task, fingerprint: str, args, rng: np.random.Generator) -> dict:
    """A marker like ``task.run_task`` writes, with counts scaled from a real run."""
    from mlm_pipeline.run import layout

    nbytes = task.input_bytes
    counts = {k: int(round(nbytes * v)) for k, v in PER_BYTE.items()}
    instances = max(1, counts["instances"])
    shards, left, k = [], instances, 0
    while left > 0:
        n = min(left, args.max_instances_per_shard)
        name = layout.shard_name(task.task_id, k, "tfrecord")
        shards.append({"path": layout.shard_path(name), "instances": n, "bytes": int(n * SHARD_BYTES_PER_INSTANCE),
                       "sha256": hashlib.sha256(name.encode()).hexdigest()})
        left -= n
        k += 1
    lengths = rng.multinomial(instances, np.full(121, 1 / 121))  # lengths 8..128
    masked = rng.multinomial(instances, np.full(20, 1 / 20))  # 1..20 predictions
    masked_tokens = int(instances * 15)
    stats = {
        "documents_read": counts["documents_read"], "sentences": counts["sentences"], "bytes_read": nbytes,
        "documents_skipped": {"empty": int(rng.integers(0, 3))}, "documents_with_replaced_bytes": 0,
        "tokens": counts["tokens"], "instances": instances, "random_next": instances // 2,
        "short_target_documents": instances // 17, "truncated_pairs": instances * 7 // 10,
        "chunks_without_pair": 0, "masked_tokens": masked_tokens, "masked_as_mask_token": masked_tokens * 8 // 10,
        "masked_as_random_token": masked_tokens // 10, "masked_kept": masked_tokens - masked_tokens * 9 // 10,
        "instance_length_histogram": {str(8 + i): int(c) for i, c in enumerate(lengths) if c},
        "masked_per_instance_histogram": {str(1 + i): int(c) for i, c in enumerate(masked) if c},
    }
    return {"task_id": task.task_id, "task": task.to_dict(), "output_fingerprint": fingerprint, "shards": shards,
            "stats": stats, "seconds": round(float(rng.uniform(30, 90)), 3),
            "tokenizer_backend": {"backend": "nanotoken", "version": "0.1.0", "requested": "auto"}}


def phase_markers(args, output: str) -> dict:
    from mlm_pipeline.run import layout
    from mlm_pipeline.run.state import load_run, write_marker

    install(corpus_of(args), latency_ms=0, block_size=args.block_size)
    config, _record, plan = load_run(output)
    fingerprint = config.output_fingerprint()
    rng = np.random.default_rng(args.seed)
    shards_dir = Path(layout.shards_url(output))
    shards_dir.mkdir(parents=True, exist_ok=True)
    n_shards = marker_bytes = 0
    with Measure() as m:
        for task in plan.tasks:
            marker = synthetic_marker(task, fingerprint, args, rng)
            for s in marker["shards"]:
                # a sparse file of the recorded size (no data blocks): what "done" checks is the
                # shard's name and its size against the marker
                with open(Path(output) / s["path"], "wb") as f:
                    f.truncate(s["bytes"])
            write_marker(output, marker)
            n_shards += len(marker["shards"])
        for p in Path(layout.tasks_url(output)).iterdir():
            marker_bytes += p.stat().st_size
    return {"seconds": m.seconds, "markers": len(plan.tasks), "shards": n_shards, "marker_bytes": marker_bytes}


def phase_finalize(args, output: str) -> dict:
    from mlm_pipeline.run import layout
    from mlm_pipeline.run.manifest import finalize, finalize_if_complete
    from mlm_pipeline.run.state import done_task_ids, load_run

    install(corpus_of(args), latency_ms=0, block_size=args.block_size)
    with Measure(traced=args.tracemalloc, profile=args.profile == "finalize") as m:
        manifest, wrote = finalize(output)
    peak = rss_bytes()  # (before the checks below load the run again)
    config, record, plan = load_run(output)
    check = check_manifest(manifest, plan, output)
    # what a worker of a shared run pays after each task while the run is not complete
    t0 = time.perf_counter()
    listed = len(done_task_ids(output))
    listing_seconds = time.perf_counter() - t0
    last = Path(layout.marker_url(output, plan.tasks[-1].task_id))
    last.rename(last.with_suffix(".away"))
    try:
        t0 = time.perf_counter()
        first = finalize_if_complete(config, record, plan)
        first_seconds = time.perf_counter() - t0
        t0 = time.perf_counter()
        again = finalize_if_complete(config, record, plan)
        again_seconds = time.perf_counter() - t0
    finally:
        last.with_suffix(".away").rename(last)
    if first is not None or again is not None:
        raise SystemExit("finalize_if_complete wrote a manifest with a marker missing")
    return {"seconds": m.seconds, "traced_peak_bytes": m.traced_peak, "peak_rss_bytes": peak, "wrote": wrote,
            "manifest_bytes": os.path.getsize(layout.manifest_url(output)), "shards": len(manifest["shards"]),
            "tasks": manifest["tasks"], "done_listing_seconds": listing_seconds, "markers_listed": listed,
            "incomplete_check_first_seconds": first_seconds, "incomplete_check_seconds": again_seconds,
            "check": check}


def check_manifest(manifest: dict, plan, output: str) -> dict:
    """The manifest lists every task's shards, in task order, and nothing else."""
    from mlm_pipeline.run import layout

    expected = []
    for task in plan.tasks:
        marker = json.loads(Path(layout.marker_url(output, task.task_id)).read_bytes())
        expected.extend(s["path"] for s in marker["shards"])
    got = [s["path"] for s in manifest["shards"]]
    if got != expected:
        first = next((i for i, (a, b) in enumerate(zip(got, expected)) if a != b), min(len(got), len(expected)))
        raise SystemExit(f"manifest shards differ from the markers' at position {first} "
                         f"({len(got)} listed, {len(expected)} expected)")
    if manifest["totals"]["instances"] != sum(s["instances"] for s in manifest["shards"]):
        raise SystemExit("manifest totals do not add up")
    return {"shards_listed": len(got), "ok": True}


def phase_load(args, output: str) -> dict:
    import gc
    import pickle

    from mlm_pipeline.run import layout

    data = Path(layout.manifest_url(output)).read_bytes()
    gc.collect()
    rss0 = rss_bytes("VmRSS")
    t0 = time.perf_counter()
    manifest = json.loads(data)
    loads_seconds = time.perf_counter() - t0
    rss_growth = rss_bytes("VmRSS") - rss0
    n_shards = len(manifest["shards"])
    del manifest
    gc.collect()
    tracemalloc.start()
    parsed = json.loads(data)  # (tracemalloc slows allocation-heavy code several times: not timed)
    parsed_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del parsed
    result = {"manifest_bytes": len(data), "shards": n_shards, "json_loads_seconds": loads_seconds,
              "parsed_object_bytes": parsed_bytes, "rss_growth_bytes": rss_growth}
    gc.collect()
    try:
        from mlm_pipeline.torch import load_prepared
    except ImportError as exc:  # torch not installed
        result["load_prepared"] = f"skipped: {exc}"
        return result
    t0 = time.perf_counter()
    prepared = load_prepared(output)
    result["load_prepared_seconds"] = time.perf_counter() - t0
    blob = pickle.dumps(prepared)
    del prepared
    gc.collect()
    t0 = time.perf_counter()
    pickle.loads(blob)
    result["unpickle_seconds"] = time.perf_counter() - t0
    gc.collect()
    tracemalloc.start()
    held = pickle.loads(blob)
    result["unpickled_object_bytes"] = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    del held
    result["pickled_bytes"] = len(blob)
    return result


PHASE_FUNCS = {"plan": phase_plan, "markers": phase_markers, "finalize": phase_finalize, "load": phase_load}


def run_child(args, phase: str, output: str) -> dict:
    """Run one phase in a fresh interpreter; its result and peak RSS."""
    cmd = [sys.executable, str(Path(__file__).resolve()), "--child", phase, "--child-output", output,
           "--files", str(args.files), "--total-bytes", str(args.total_bytes), "--seed", str(args.seed),
           "--sigma", str(args.sigma), "--latency-ms", str(args.latency_ms), "--block-size", str(args.block_size),
           "--connections", str(args.connections),
           "--max-instances-per-shard", str(args.max_instances_per_shard), "--tokenizer", str(args.tokenizer)]
    if args.tracemalloc:
        cmd.append("--tracemalloc")
    if args.profile:
        cmd += ["--profile", args.profile]
    proc = subprocess.run(cmd, stdout=subprocess.PIPE, text=True)
    if proc.returncode != 0:
        raise SystemExit(f"phase {phase} failed (exit {proc.returncode}):\n{proc.stdout}")
    for line in proc.stdout.splitlines():
        if line.startswith(RESULT_TAG):
            return json.loads(line[len(RESULT_TAG):])
    raise SystemExit(f"phase {phase} printed no result:\n{proc.stdout}")


def child_main(args) -> None:
    import logging

    logging.basicConfig(level=logging.WARNING)
    result = PHASE_FUNCS[args.child](args, args.child_output)
    result.setdefault("peak_rss_bytes", rss_bytes())
    print(RESULT_TAG + json.dumps(result), flush=True)


# --------------------------------------------------------------------------- the report


def report(args, results: dict, corpus: SimCorpus) -> str:
    lines = [f"simulated corpus: {args.files:,} files, {human(corpus.total_bytes)} "
             f"(median {human(float(np.median(corpus.sizes)))}, largest {human(float(corpus.sizes.max()))}), "
             f"request latency {args.latency_ms:g} ms ({args.connections} at a time), "
             f"read block {human(args.block_size)}"]
    head = f"{'phase':<10}{'wall s':>9}{'peak RSS MB':>13}{'traced MB':>11}  what"
    lines += [head, "-" * len(head)]

    def row(phase: str, seconds: float, traced: int | None, what: str) -> None:
        mb = "" if traced is None else f"{traced / (1 << 20):.0f}"
        rss = results[phase]["peak_rss_bytes"] / (1 << 20)
        lines.append(f"{phase:<10}{seconds:>9.2f}{rss:>13.0f}{mb:>11}  {what}")

    if "plan" in results:
        r, req = results["plan"], results["plan"]["requests"]
        row("plan", r["seconds"], r["traced_peak_bytes"],
            f"{r['tasks']:,} tasks, {r['pieces']:,} pieces of {human(r['split_bytes'])}; read "
            f"{human(r['bytes_read'])} in {req.get('get', 0):,} GETs, {req.get('info', 0):,} HEADs, "
            f"{req.get('list', 0):,} LIST pages; _plan.json {human(r['plan_file_bytes'])}")
    if "markers" in results:
        r = results["markers"]
        row("markers", r["seconds"], None,
            f"(setup) {r['markers']:,} markers ({human(r['marker_bytes'])}), {r['shards']:,} shards")
    if "finalize" in results:
        r = results["finalize"]
        row("finalize", r["seconds"], r["traced_peak_bytes"],
            f"manifest.json {human(r['manifest_bytes'])}, {r['shards']:,} shards of {r['tasks']:,} tasks; "
            f"'all done?' while not: {r['incomplete_check_first_seconds']:.2f} s (a listing of the markers), "
            f"then {r['incomplete_check_seconds'] * 1000:.2f} ms")
    if "load" in results:
        r = results["load"]
        what = (f"json.loads {r['json_loads_seconds']:.2f} s, parsed {human(r['parsed_object_bytes'])} "
                f"(RSS +{human(r['rss_growth_bytes'])})")
        if "load_prepared_seconds" in r:
            what += (f"; load_prepared {r['load_prepared_seconds']:.2f} s; each DataLoader worker unpickles "
                     f"{human(r['pickled_bytes'])} in {r['unpickle_seconds']:.2f} s and holds "
                     f"{human(r['unpickled_object_bytes'])}")
        row("load", r["json_loads_seconds"], r["parsed_object_bytes"], what)
    lines += [f"check {phase}: {results[phase]['check']}" for phase in ("plan", "finalize") if phase in results]
    return "\n".join(lines)


def main(argv=None) -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--files", type=int, default=100_000, help="number of simulated input files")
    p.add_argument("--total-bytes", type=parse_size, default=parse_size("10TB"), help="their total size (10TB)")
    p.add_argument("--sigma", type=float, default=1.0, help="spread of the log-normal file sizes")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--latency-ms", type=float, default=0.0, help="delay added to every storage request")
    p.add_argument("--connections", type=int, default=10,
                   help="requests in flight at once with --latency-ms (s3fs: botocore's 10 connections)")
    p.add_argument("--block-size", type=parse_size, default=S3FS_BLOCK_SIZE,
                   help="read-ahead of a file opened with fsspec's defaults (s3fs: 50MB)")
    p.add_argument("--max-instances-per-shard", type=int, default=100_000)
    p.add_argument("--tokenizer", default=str(DEFAULT_VOCAB), help="vocabulary for the run record")
    p.add_argument("--phases", default=",".join(PHASES), help="comma-separated, from: " + ", ".join(PHASES))
    p.add_argument("--tracemalloc", action="store_true",
                   help="also trace Python allocations in plan and finalize (slows them several times)")
    p.add_argument("--profile", choices=("plan", "finalize"), help="print a cProfile of this phase to stderr")
    p.add_argument("--work-dir", help="where the run's output directory goes (default: a temporary directory)")
    p.add_argument("--keep", action="store_true", help="keep the output directory")
    p.add_argument("--out", help="write the results as JSON to this file")
    p.add_argument("--child", choices=PHASES, help=argparse.SUPPRESS)
    p.add_argument("--child-output", help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(args)
        return
    phases = [x.strip() for x in args.phases.split(",") if x.strip()]
    unknown = set(phases) - set(PHASES)
    if unknown:
        p.error(f"unknown phases: {', '.join(sorted(unknown))}")
    corpus = corpus_of(args)
    work = tempfile.mkdtemp(prefix="scale-sim-", dir=args.work_dir)
    output = os.path.join(work, "out")
    results: dict = {}
    try:
        for phase in PHASES:
            if phase in phases:
                results[phase] = run_child(args, phase, output)
                print(f"{phase}: done in {results[phase].get('seconds', 0):.1f} s", file=sys.stderr, flush=True)
    finally:
        if not args.keep:
            shutil.rmtree(work, ignore_errors=True)
    print(report(args, results, corpus))
    if args.keep:
        print(f"output kept in {output}")
    if args.out:
        doc = {"settings": {k: v for k, v in vars(args).items() if k not in ("child", "child_output", "work_dir",
                                                                            "out", "tokenizer")},
               "machine": {"cpus": os.cpu_count(), "python": platform.python_version(), "system": platform.system()},
               "results": results}
        Path(args.out).write_text(json.dumps(doc, indent=1) + "\n")


if __name__ == "__main__":
    main()
