#!/usr/bin/env python
"""Throughput and memory of ``mlm-pipeline prepare`` against the raw tokenizer, in one run.

Absolute MB/s on a shared machine are noise; ratios measured in the same run are not. So every
repeat ("round") runs every variant once, in a rotated order, each in a fresh subprocess, and the
figures reported are medians over rounds of each variant's MB/s and of its ratio to the raw
tokenizer *of the same round*. The same ratio is also given in CPU seconds (user + system, of the
process and its pool workers). On a busy shared VM both swing by tens of percent from run to run
(contention slows the CPU work itself: shared caches, SMT siblings, steal), so use several
rounds and read the medians. A "best-of" ratio is given too — the fastest run of the baseline
over the fastest of the variant: other load only ever slows a run down, so the best of several
runs is the closest to the undisturbed cost, as ``timeit`` reasons.

    python benchmarks/prepare_bench.py                       # 10 MB built from the bundled sample
    python benchmarks/prepare_bench.py --input path/to/wikitext2-train.txt --zh-input path/to/hongloumeng.txt \\
        --zh-vocab path/to/zh-vocab.txt --sizes 100MB --repeats 3 --out results.json
    python benchmarks/prepare_bench.py --bpe-vocab path/to/roberta-base/tokenizer.json --bpe-size 100MB  # RoBERTa

Long sequences (flat memory at 8,192 tokens, 30% masking; peak RSS per worker must stay flat from
10 MB to 1 GB and within 500 MB):

    python benchmarks/prepare_bench.py --sizes 10MB,1GB --max-seq-length 8192 --masked-lm-prob 0.3 \
        --variants raw,tf-d1,pq-d1,tf-d1-w2 --repeats 1 --out long-8192.json

Variants (``--variants``, comma-separated):

  raw        the limit: the same tokenizer (``load_tokenizer(vocab).tokenizer``), one thread,
             ``encode_batch_fast`` over the stripped non-blank lines in batches, file reading
             included; only ``len(encoding)`` is read back (no id extraction)
  tf-d1      ``run_prepare``: NSP + static masking + TFRecord, dupe factor 1, one worker
  pq-d1      the same, Parquet output
  tf-d5      TFRecord, dupe factor 5 (tokenize once, build and mask 5 times)
  pq-d5      Parquet, dupe factor 5
  mds-d1     the same as pq-d1, MDS output (``--format mds``); compared with pq-d1
  tf-d1-wwm  TFRecord, dupe factor 1, whole-word masking
  fast       the same lines through the fast backend on its own (the one ``auto`` picks: ``nanotoken``
             for WordPiece, ``fastokens`` for byte-level BPE, ``splintr`` for a Unigram tokenizer.json;
             one thread): the pipeline's own tokenizer, so the ratio to it is what the other stages cost
  packed     ``--objective packed`` (RoBERTa full sentences), TFRecord
  packed-doc ``--objective packed --no-cross-document`` (RoBERTa's DOC-SENTENCES), TFRecord
  packed-bf  ``--objective packed --packing best-fit`` (whole documents, least padding), TFRecord
  tokens     ``--objective tokens`` (fixed windows, masking at load time), TFRecord
  ref-d1     ``--reference`` (create_pretraining_data.py's exact instances), TFRecord, dupe factor 1
  sop-d1     ``--objective sop`` (ALBERT's sentence-order pairs, token_boundary, whole words), TFRecord,
             dupe factor 1
  sop-ref-d1 ``--objective sop --reference`` (ALBERT's script's exact examples), TFRecord, dupe factor 1
  tf-d1-w2   TFRecord, dupe factor 1, ``--workers 2`` (a pool of two); compared with tf-d1
  tf-d1-x2   two tf-d1 runs at once (``--workers 1`` each, no pool), each on one half of the input
             (cut at a line end), with the same task size: what two processes of this pipeline get
             on this machine at this moment, each paying its own tokenizer load and first touch of
             memory; tf-d1-w2 / tf-d1 against tf-d1-x2 / tf-d1 is what the pool itself costs
  pq-tokens  ``--objective tokens``, Parquet: tokens only, unmasked (the baseline of the megatron variants)
  megatron   ``--format megatron --objective sentences`` (Megatron's .bin/.idx, a sequence per
             sentence); compared with pq-tokens, the other output of tokens that nothing masks
  megatron-docs  ``--format megatron --objective documents`` (a sequence per document)
  raw-x2     two raw processes at once, each on half the input: the speed-up two processes get
             on this machine at this moment (the ceiling for tf-d1-w2 / tf-d1 under the same load)
  hf         (if ``datasets``/``transformers``/``torch`` are installed) HF ``datasets`` text ->
             batched tokenize -> group into 128-token blocks -> ``DataCollatorForLanguageModeling``

Every prepare variant uses the same ``--tasks`` split of the input (default 4 tasks, each at least
one 4 MB block and at most 64 MB), so the one-worker and two-worker runs do the same work. Each
size after the first of ``--sizes`` gets raw, tf-d1, tf-d1-w2, tf-d1-x2 and raw-x2 runs, those of
them in ``--variants`` (tf-d1-x2 is not a default one), ``--big-repeats`` rounds: peak RSS must not
grow with the input (compared with one tf-d1 run at the first size as a single task of several
blocks, since its small tasks hold one block), and the two-worker speed-up is measured on more
work, where the planning done before the first task weighs less. ``--plan-size`` times
``plan_tasks`` on a sparse file of that size in a subprocess and reports the bytes that process
read (the planner must not read the data).

``--held-out PATH`` (and ``--held-out-zh PATH --held-out-zh-vocab VOCAB``) adds what a user
timing the command from the shell sees, on text the code was not tuned on: ``whole_process.py``'s
measurement (``mlm-pipeline prepare`` and a raw HF tokenizer script as whole processes, start-up
and imports included, byte-compiled, pinned to one core, alternating rounds) at the dupe factors of
``tf-d1``/``tf-d5``, printed and recorded (``held_out_whole_process``) beside the in-process ratios.

Peak RSS: every measured process reports its ``VmHWM`` (peak resident set since it started; not
``ru_maxrss``, which also counts what the parent held when it forked), and a sampling process
records the ``VmHWM`` of every descendant (pool workers), so each worker's peak is listed.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import platform
import re
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
DEFAULT_SOURCE = REPO / "sample" / "wikitext2-train-1MB.txt"
DEFAULT_VOCAB = REPO / "sample" / "bert-base-uncased-vocab.txt"
RESULT_TAG = "BENCH_RESULT "
BLOCK_BYTES = 4 << 20  # prepare's default --block-size
MAX_SPLIT_BYTES = 64 << 20  # the largest task --split-size auto makes

PREPARE_VARIANTS = {
    "tf-d1": {"format": "tfrecord", "dupe_factor": 1},
    "pq-d1": {"format": "parquet", "dupe_factor": 1},
    "mds-d1": {"format": "mds", "dupe_factor": 1},
    "tf-d5": {"format": "tfrecord", "dupe_factor": 5},
    "pq-d5": {"format": "parquet", "dupe_factor": 5},
    "hfds-d1": {"format": "hf", "dupe_factor": 1},  # HF datasets (--format hf); "hf" is the HF tokenizer's baseline
    "tf-d1-wwm": {"format": "tfrecord", "dupe_factor": 1, "do_whole_word_mask": True},
    "pq-d1-wwm": {"format": "parquet", "dupe_factor": 1, "do_whole_word_mask": True},
    "packed": {"format": "tfrecord", "dupe_factor": 1, "objective": "packed"},
    "packed-doc": {"format": "tfrecord", "dupe_factor": 1, "objective": "packed", "cross_document": False},
    "packed-bf": {"format": "tfrecord", "dupe_factor": 1, "objective": "packed", "packing": "best-fit"},
    "tokens": {"format": "tfrecord", "objective": "tokens"},
    "ref-d1": {"format": "tfrecord", "dupe_factor": 1, "reference": True},
    "sop-d1": {"format": "tfrecord", "dupe_factor": 1, "objective": "sop"},
    "sop-ref-d1": {"format": "tfrecord", "dupe_factor": 1, "objective": "sop", "reference": True},
    "tf-d1-w2": {"format": "tfrecord", "dupe_factor": 1, "workers": 2},
    "pq-tokens": {"format": "parquet", "objective": "tokens"},
    "megatron": {"format": "megatron", "objective": "sentences"},
    "megatron-docs": {"format": "megatron", "objective": "documents"},
}
ALL_VARIANTS = ["raw", "fast", *PREPARE_VARIANTS, "tf-d1-x2", "raw-x2", "hf"]
DEFAULT_VARIANTS = ("raw,fast,tf-d1,pq-d1,mds-d1,tf-d5,pq-d5,hfds-d1,tf-d1-wwm,packed,packed-doc,packed-bf,tokens,"
                    "ref-d1,sop-d1,sop-ref-d1,tf-d1-w2,raw-x2,hf")
UNPINNED = ("tf-d1-w2", "tf-d1-x2", "raw-x2")  # two processes: every other measurement runs pinned to one core
SECOND_LANGUAGE_VARIANTS = ("raw", "fast", "tf-d1", "packed")  # what --zh-input runs (those in --variants)
BPE_VARIANTS = ("raw", "fast", "packed", "tokens")  # what --bpe-vocab runs

# (variant, baseline) pairs whose ratio is reported besides "vs raw"
COMPARISONS = [
    ("pq-d1", "tf-d1", "Parquet / TFRecord speed (dupe 1)"),
    ("pq-d5", "tf-d5", "Parquet / TFRecord speed (dupe 5)"),
    ("mds-d1", "pq-d1", "MDS / Parquet speed (dupe 1): at least 0.91 keeps MDS within 10% of Parquet's cost"),
    ("hfds-d1", "pq-d1", "HF datasets (--format hf) / Parquet speed (dupe 1)"),
    ("tf-d1-wwm", "tf-d1", "whole-word / token masking speed"),
    ("tf-d1-w2", "tf-d1", "--workers 2 / --workers 1 speed"),
    ("megatron", "pq-tokens", "Megatron .bin/.idx (sentences) / Parquet (tokens, unmasked) speed"),
    ("megatron-docs", "pq-tokens", "Megatron .bin/.idx (documents) / Parquet (tokens, unmasked) speed"),
    ("tf-d1-x2", "tf-d1", "2 one-worker runs on the halves at once / 1 on all: what 2 processes get, with no pool"),
    ("raw-x2", "raw", "2 raw tokenizer processes / 1: what the machine allows right now"),
]

_UNITS = {"": 1, "B": 1, "KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}


def parse_size(text: str) -> int:
    m = re.fullmatch(r"\s*(\d+(?:\.\d+)?)\s*([KMG]?B?)\s*", text.upper())
    if not m:
        raise argparse.ArgumentTypeError(f"not a size: {text!r} (use e.g. 200KB, 10MB, 1GB)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])


def fmt_size(n: int) -> str:
    for unit in ("GB", "MB", "KB"):
        if n >= _UNITS[unit]:
            return f"{n / _UNITS[unit]:.4g}{unit}"
    return f"{n}B"


# --------------------------------------------------------------------------------------------
# Children: one measurement each, printed as one JSON line


def _vmhwm_mb(pid: int | str = "self") -> float | None:
    """A process's peak RSS since its exec (``VmHWM``), or None where /proc does not say."""
    try:
        with open(f"/proc/{pid}/status") as f:
            for line in f:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return None


def sample_peaks(watched_pid: int, interval: float) -> None:
    """The sampling process of :class:`_PeakSampler`: every ``interval`` seconds, the peak RSS of
    each descendant of ``watched_pid`` (itself excepted); prints them as JSON once its stdin is
    closed, after one last sample."""
    import select

    import psutil

    watched, me = psutil.Process(watched_pid), os.getpid()
    peaks: dict[int, float] = {}
    print("ready", flush=True)
    while True:
        stop = select.select([sys.stdin], [], [], interval)[0]
        try:
            children = watched.children(recursive=True)
        except Exception:  # the watched process is gone
            children = []
        for child in children:
            if child.pid == me:
                continue
            peak = _vmhwm_mb(child.pid)
            if peak is None:
                try:
                    peak = child.memory_info().rss / 2**20
                except Exception:  # the process is gone
                    continue
            peaks[child.pid] = max(peak, peaks.get(child.pid, 0.0))
        if stop:
            break
    print(json.dumps(peaks), flush=True)


class _PeakSampler:
    """Peak RSS (VmHWM, else sampled RSS) of this process's descendants, by pid.

    The sampling runs in a process of its own (:func:`sample_peaks`), not a thread: the local
    pool forks its workers only from a process that runs no other thread, and a sampling thread
    would make the measured run spawn them instead.
    """

    def __init__(self, interval: float = 0.2):
        self.interval = interval
        self.peaks: dict[int, float] = {}
        self._proc: subprocess.Popen | None = None

    def __enter__(self) -> "_PeakSampler":
        try:
            import psutil  # noqa: F401 - the sampler needs it
        except ImportError:
            return self
        self._proc = subprocess.Popen([sys.executable, str(Path(__file__).resolve()), "--sample-peaks",
                                       str(os.getpid()), str(self.interval)],
                                      stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._proc.stdout.readline()  # started: its own start-up is not part of the measurement
        return self

    def __exit__(self, *exc) -> None:
        if self._proc is None:
            return
        out, _ = self._proc.communicate(timeout=60)  # closing its stdin stops it after one last sample
        self.peaks = {int(pid): peak for pid, peak in json.loads(out or "{}").items()}


def _self_peak_rss_mb() -> float:
    """Peak RSS of this process since its exec: ``VmHWM`` (``ru_maxrss`` also counts the RSS the
    parent had when it forked us, so it is only the fallback)."""
    peak = _vmhwm_mb()
    if peak is not None:
        return peak
    import resource

    kb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return kb / 1024 if sys.platform != "darwin" else kb / 2**20


def _cpu_seconds() -> float:
    """CPU time (user + system) of this process and of its waited-for children (pool workers)."""
    import resource

    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _preimport() -> None:
    """Import what ``run_prepare`` imports lazily, so a measurement times work, not imports
    (a CLI run pays them once per process; the benchmark reports process wall time too)."""
    import importlib

    for module in ("executors.local", "task", "formats.parquet", "formats.tfrecord"):
        importlib.import_module(f"mlm_pipeline.{module}")


def _child_raw(spec: dict) -> dict:
    """The raw tokenizer over the stripped non-blank lines (of part ``i`` of ``n`` of the file's
    bytes, cut at line starts, when ``part`` is given)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    from mlm_pipeline.tokenize import load_tokenizer

    batch_lines = spec["batch_lines"]
    index, count = spec.get("part") or (0, 1)
    size = os.path.getsize(spec["input"])
    start, end = size * index // count, size * (index + 1) // count
    cpu = _cpu_seconds()
    started = time.perf_counter()
    tok = load_tokenizer(spec["vocab"]).tokenizer
    encode = tok.encode_batch_fast
    tokens = lines = 0
    batch: list[str] = []
    with open(spec["input"], "rb") as f:
        if start:
            f.seek(start - 1)
            f.readline()  # the line through the first newline at or after start - 1 is part i-1's
        pos = f.tell()
        for raw in f:
            if pos >= end:
                break
            pos += len(raw)
            line = raw.decode("utf-8").strip()
            if line:
                batch.append(line)
                if len(batch) == batch_lines:
                    tokens += sum(len(e) for e in encode(batch, add_special_tokens=False))
                    lines += len(batch)
                    batch = []
    if batch:
        tokens += sum(len(e) for e in encode(batch, add_special_tokens=False))
        lines += len(batch)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "cpu_seconds": _cpu_seconds() - cpu, "tokens": tokens, "lines": lines}


def _child_prepare(spec: dict) -> dict:
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.pipeline import run_prepare

    _preimport()
    out = spec["output"]
    shutil.rmtree(out, ignore_errors=True)
    config = PrepareConfig(
        inputs=[spec["input"]], output=out, tokenizer=spec["vocab"], progress=False, **spec["config"]
    )
    with _PeakSampler() as sampler:
        cpu = _cpu_seconds()
        start = time.perf_counter()
        manifest = run_prepare(config)
        seconds = time.perf_counter() - start
        cpu = _cpu_seconds() - cpu
    totals = manifest["totals"]
    result = {
        "seconds": seconds,
        "cpu_seconds": cpu,
        "tokens": totals.get("tokens", 0),
        "instances": totals.get("instances", 0),
        "tasks": manifest.get("tasks"),
        "bytes_written": totals.get("bytes_written", 0),
        "worker_peak_rss_mb": sorted(round(v, 1) for v in sampler.peaks.values()),
    }
    shutil.rmtree(out, ignore_errors=True)
    return result


def _child_fast(spec: dict) -> dict:
    """The fast backend alone, the one the pipeline chose for the tokenizer (``nanotoken`` for
    WordPiece, ``fastokens`` for byte-level BPE, ``splintr`` for a Unigram ``tokenizer.json``:
    ``load_tokenizer(...).encoder``, one thread, its load and self-check timed), over the same
    stripped non-blank lines as ``raw``."""
    from mlm_pipeline.tokenize import load_tokenizer

    batch_lines = spec["batch_lines"]
    cpu = _cpu_seconds()
    started = time.perf_counter()
    encoder = load_tokenizer(spec["vocab"]).encoder
    if encoder.name == "hf":
        raise SystemExit(f"no fast backend encodes {spec['vocab']}")
    tokens = lines = 0
    batch: list[str] = []

    def encode(texts: list[str]) -> int:
        ids, _ = encoder.encode_batch(texts)
        return len(ids)

    with open(spec["input"], "rb") as f:
        for raw in f:
            line = raw.decode("utf-8").strip()
            if line:
                batch.append(line)
                if len(batch) == batch_lines:
                    tokens += encode(batch)
                    lines += len(batch)
                    batch = []
    if batch:
        tokens += encode(batch)
        lines += len(batch)
    seconds = time.perf_counter() - started
    return {"seconds": seconds, "cpu_seconds": _cpu_seconds() - cpu, "tokens": tokens, "lines": lines}


def _child_startup(spec: dict) -> dict:
    """The command line's ``prepare`` from this process's start: seconds until the first task
    begins (in this process with ``--workers 1``; ``started`` is the parent's clock just before
    it launched us) and until the command returns. Nothing is imported beforehand."""
    import mlm_pipeline.executors.base as base

    first: list[float] = []
    run_task = base.run_task

    def timed(*a, **k):
        first.append(time.time())
        return run_task(*a, **k)

    base.run_task = timed
    from mlm_pipeline.cli import main as cli_main

    sys.argv = ["mlm-pipeline", "prepare", spec["input"], "--output", spec["output"], "--tokenizer",
                spec["vocab"], "--workers", str(spec["workers"]), "--no-progress"]
    try:
        cli_main()
    except SystemExit as exc:
        if exc.code not in (0, None):
            raise
    done = time.time()
    shutil.rmtree(spec["output"], ignore_errors=True)
    return {"seconds": done - spec["started"],
            "to_first_task_seconds": first[0] - spec["started"] if first else None}


def _child_hf(spec: dict) -> dict:
    """HF datasets -> tokenize -> group into blocks -> DataCollatorForLanguageModeling (masking)."""
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ["HF_DATASETS_CACHE"] = spec["output"]
    os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
    import datasets
    import torch
    from transformers import BertTokenizerFast, DataCollatorForLanguageModeling

    torch.set_num_threads(1)
    datasets.disable_progress_bars()
    block = spec["seq"]
    cpu = _cpu_seconds()
    start = time.perf_counter()
    tokenizer = BertTokenizerFast(vocab_file=spec["vocab"], do_lower_case=True)
    raw = datasets.load_dataset("text", data_files=spec["input"], split="train", cache_dir=spec["output"])
    raw = raw.filter(lambda b: [bool(t.strip()) for t in b["text"]], batched=True)

    def tokenize(batch):
        return tokenizer(batch["text"], return_special_tokens_mask=True)

    tokenized = raw.map(tokenize, batched=True, remove_columns=["text"])

    def group(batch):
        joined = {k: [x for seq in batch[k] for x in seq] for k in batch}
        total = len(joined["input_ids"]) // block * block
        return {k: [v[i : i + block] for i in range(0, total, block)] for k, v in joined.items()}

    grouped = tokenized.map(group, batched=True)
    collator = DataCollatorForLanguageModeling(tokenizer, mlm_probability=0.15, return_tensors="pt")
    masked = 0
    n = len(grouped)
    for i in range(0, n, 256):
        rows = grouped[i : i + 256]
        examples = [{k: rows[k][j] for k in rows} for j in range(len(rows["input_ids"]))]
        out = collator(examples)
        masked += int((out["labels"] != -100).sum())
    seconds = time.perf_counter() - start
    cpu = _cpu_seconds() - cpu
    tokens = sum(len(x) for x in tokenized["input_ids"])
    shutil.rmtree(spec["output"], ignore_errors=True)
    return {"seconds": seconds, "cpu_seconds": cpu, "tokens": tokens, "instances": n, "masked": masked}


def _child_plan(spec: dict) -> dict:
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.plan import plan_tasks

    config = PrepareConfig(inputs=[spec["input"]], output=spec["output"], tokenizer=spec["vocab"])

    def rchar() -> int | None:
        try:
            with open("/proc/self/io") as f:
                return next(int(line.split()[1]) for line in f if line.startswith("rchar:"))
        except (OSError, StopIteration):
            return None

    before = rchar()
    start = time.perf_counter()
    plan = plan_tasks(config)
    seconds = time.perf_counter() - start
    after = rchar()
    return {
        "seconds": seconds,
        "tasks": len(plan.tasks),
        "bytes_read": None if before is None else after - before,
    }


CHILDREN = {"raw": _child_raw, "fast": _child_fast, "prepare": _child_prepare, "hf": _child_hf,
            "plan": _child_plan, "startup": _child_startup}


def child_main(spec_json: str) -> None:
    spec = json.loads(spec_json)
    pin = spec.get("pin")
    if pin is not None:  # one core, as the targets are stated, or a list of them (pool workers inherit it)
        os.sched_setaffinity(0, set(pin) if isinstance(pin, list) else {pin})
    result = CHILDREN[spec["kind"]](spec)
    result["self_peak_rss_mb"] = round(_self_peak_rss_mb(), 1)
    print(RESULT_TAG + json.dumps(result), flush=True)


# --------------------------------------------------------------------------------------------
# Parent


def build_input(source: Path, size: int, dest: Path) -> Path:
    """``size`` bytes of real text: ``source`` repeated (a blank line between copies), cut at a
    line end. Documents stay whole except the last."""
    data = source.read_bytes()
    if not data.strip():
        raise SystemExit(f"{source} holds no text")
    if not data.endswith(b"\n"):
        data += b"\n"
    data += b"\n"
    with open(dest, "wb") as f:
        written = 0
        while written < size:
            piece = data[: size - written]
            if len(piece) < len(data):
                cut = piece.rfind(b"\n")
                piece = piece[: cut + 1] if cut >= 0 else piece
                if not piece:
                    break
            f.write(piece)
            written += len(piece)
            if len(piece) < len(data):
                break
    return dest


def child_env(pycache: Path | None) -> dict:
    """The environment of a measured process: this checkout's sources first, one tokenizer
    thread, and (with ``pycache``) bytecode cached there as in any normal installation (some
    environments disable it, and then every process, pool workers included, recompiles numpy,
    pyarrow, pydantic... on import)."""
    env = dict(os.environ)
    if pycache is not None:
        env.pop("PYTHONDONTWRITEBYTECODE", None)
        env["PYTHONPYCACHEPREFIX"] = str(pycache)
    src = str(REPO / "src")
    env["PYTHONPATH"] = src + (os.pathsep + env["PYTHONPATH"] if env.get("PYTHONPATH") else "")
    env["TOKENIZERS_PARALLELISM"] = "false"
    return env


def run_children(specs: list[dict], timeout: float | None, pycache: Path | None = None, *,
                 script: Path | None = None, tag: str = RESULT_TAG) -> list[dict]:
    """Run one measurement per spec, all at the same time, each in its own process: ``script
    --child SPEC`` (this script by default), whose last stdout line starting with ``tag`` holds
    its result as JSON."""
    env = child_env(pycache)
    started = time.perf_counter()
    procs = [
        subprocess.Popen(
            [sys.executable, str((script or Path(__file__)).resolve()), "--child", json.dumps(spec)],
            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env,
        )
        for spec in specs
    ]
    outputs = [proc.communicate(timeout=timeout) for proc in procs]
    wall = time.perf_counter() - started
    results = []
    for spec, proc, (out, err) in zip(specs, procs, outputs):
        lines = [line for line in out.splitlines() if line.startswith(tag)]
        if proc.returncode != 0 or not lines:
            tail = "\n".join((err or out).strip().splitlines()[-15:])
            raise RuntimeError(f"{spec.get('kind', 'a')} measurement failed (exit {proc.returncode}):\n{tail}")
        result = json.loads(lines[-1][len(tag) :])
        result["process_wall_seconds"] = round(wall, 3)
        results.append(result)
    return results


def run_child(spec: dict, timeout: float | None, pycache: Path | None = None, **how) -> dict:
    return run_children([spec], timeout, pycache, **how)[0]


def combine_parts(parts: list[dict], summed: tuple[str, ...]) -> dict:
    """Processes run at once as one measurement. Elapsed: the slowest (each one's too); CPU seconds
    and the counts named in ``summed``: summed; RSS: each process's, and the largest."""
    return {
        "seconds": max(p["seconds"] for p in parts),
        "seconds_each": [round(p["seconds"], 4) for p in parts],
        "cpu_seconds": sum(p["cpu_seconds"] for p in parts),
        **{key: sum(p[key] for p in parts) for key in summed},
        "self_peak_rss_mb": max(p["self_peak_rss_mb"] for p in parts),
        "worker_peak_rss_mb": sorted(p["self_peak_rss_mb"] for p in parts),
        "process_wall_seconds": parts[0]["process_wall_seconds"],
    }


def run_raw_parts(spec: dict, pins: list[int | None], timeout: float | None, pycache: Path | None) -> dict:
    """``len(pins)`` raw processes at once, process ``i`` on part ``i`` of the input and pinned to
    ``pins[i]`` (None: not pinned)."""
    parts = run_children([{**spec, "kind": "raw", "part": [i, len(pins)], "pin": pin} for i, pin in enumerate(pins)],
                         timeout, pycache)
    return combine_parts(parts, ("tokens", "lines"))


def half_paths(inp: Path) -> list[Path]:
    """Where ``tf-d1-x2``'s two halves of ``inp`` are kept: beside it."""
    return [inp.with_name(f"{inp.stem}.half{i}{inp.suffix}") for i in range(2)]


def input_halves(inp: Path) -> list[Path]:
    """``inp`` cut in two at the line end nearest after its middle (or before it, when the middle
    is in the last line), written on first use; :func:`remove_input` removes them with ``inp``."""
    halves = half_paths(inp)
    if not all(h.exists() for h in halves):
        data = inp.read_bytes()
        middle = len(data) // 2
        cut = data.find(b"\n", middle, len(data) - 1) + 1 or data.rfind(b"\n", 0, middle) + 1
        if not 0 < cut < len(data):
            raise SystemExit(f"tf-d1-x2: {inp.name} has no line end to cut it in two at")
        halves[0].write_bytes(data[:cut])
        halves[1].write_bytes(data[cut:])
    return halves


def remove_input(inp: Path) -> None:
    """``inp`` and the halves ``tf-d1-x2`` cut from it."""
    for path in (inp, *half_paths(inp)):
        path.unlink(missing_ok=True)


def run_prepare_halves(spec: dict, timeout: float | None, pycache: Path | None) -> dict:
    """Two one-worker ``prepare`` runs at once, one on each half of the input."""
    halves = input_halves(Path(spec["input"]))
    parts = run_children([{**spec, "kind": "prepare", "input": str(half), "output": f"{spec['output']}-{i}"}
                          for i, half in enumerate(halves)], timeout, pycache)
    return combine_parts(parts, ("tokens", "instances", "tasks"))


def run_variant(spec: dict, timeout: float | None, pycache: Path | None) -> dict:
    """One measurement; ``raw-x2`` is two raw processes on the two halves of the input at once,
    ``tf-d1-x2`` two one-worker ``prepare`` runs."""
    if spec["kind"] == "raw-x2":
        return run_raw_parts(spec, [spec.get("pin"), spec.get("pin")], timeout, pycache)
    if spec["kind"] == "prepare-x2":
        return run_prepare_halves(spec, timeout, pycache)
    return run_child(spec, timeout, pycache)


def machine_info() -> dict:
    model = None
    try:
        with open("/proc/cpuinfo") as f:
            model = next((line.split(":", 1)[1].strip() for line in f if line.startswith("model name")), None)
    except OSError:
        pass
    info = {
        "cpus": os.cpu_count(),
        "cpu_model": model or platform.processor(),
        "python": platform.python_version(),
        "platform": platform.platform(),
    }
    try:
        info["usable_cpus"] = len(os.sched_getaffinity(0))
    except AttributeError:
        pass
    from importlib import metadata

    for dist in ("tokenizers", "numpy", "pyarrow", "datasets", "transformers", "torch"):
        try:
            info[dist] = metadata.version(dist)
        except metadata.PackageNotFoundError:
            pass
    return info


def nanotoken_cache_entries() -> int | None:
    """The fast backend's cache size the measured processes get (``NANOTOKEN_CACHE_ENTRIES``, else
    the pipeline's cap); None if nanotoken is not installed."""
    try:
        from mlm_pipeline.tokenize.backends.nanotoken import cap_cache
        import nanotoken

        cap_cache()
        return nanotoken.get_cache_entries()
    except ImportError:
        return None


def load_average() -> list[float] | None:
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def hf_available() -> bool:
    import importlib.util

    return all(importlib.util.find_spec(m) is not None for m in ("datasets", "transformers", "torch"))


def pin_cpu(args) -> int | None:
    """The core single-process measurements are pinned to (the first usable one), or None."""
    if args.no_pin or not hasattr(os, "sched_getaffinity"):
        return None
    return min(os.sched_getaffinity(0))


def spec_for(variant: str, inp: Path, size: int, args, work: Path, *, whole_split: bool = False,
             vocab: Path | None = None) -> dict:
    base = {"input": str(inp), "vocab": str(vocab or args.vocab), "seq": args.max_seq_length,
            "pin": None if variant in UNPINNED else pin_cpu(args)}
    if variant in ("raw", "raw-x2", "fast"):
        return {**base, "kind": variant, "batch_lines": args.batch_lines}
    if variant == "hf":
        return {**base, "kind": "hf", "output": str(work / "hf-cache")}
    two_runs = variant == "tf-d1-x2"
    config = {"workers": 1, "max_seq_length": args.max_seq_length, **PREPARE_VARIANTS["tf-d1" if two_runs else variant]}
    if args.masked_lm_prob is not None:  # the full rate: predictions up to length x rate
        config["masked_lm_prob"] = args.masked_lm_prob
        config["max_predictions_per_seq"] = max(20, round(args.max_seq_length * args.masked_lm_prob))
    if whole_split:  # one task of up to 64 MB: several whole blocks
        config["split_bytes"] = MAX_SPLIT_BYTES
    else:
        # --tasks equal tasks, each at least one whole block and at most 64 MB
        config["split_bytes"] = max(BLOCK_BYTES, min(MAX_SPLIT_BYTES, math.ceil(size / args.tasks)))
    return {**base, "kind": "prepare-x2" if two_runs else "prepare", "output": str(work / f"out-{variant}"),
            "config": config}


def median(xs: list[float]) -> float | None:
    xs = [x for x in xs if x is not None]
    return statistics.median(xs) if xs else None


def best_ratio(base: list[dict], runs: list[dict]) -> float | None:
    """Fastest ``base`` run's seconds over the fastest of ``runs``."""
    if not base or not runs:
        return None
    return min(x["seconds"] for x in base) / min(x["seconds"] for x in runs)


def summarize(rounds: list[dict[str, dict]], size: int) -> dict:
    """Per variant: median MB/s, tokens/s, RSS, and median per-round ratio to raw."""
    variants = sorted({v for r in rounds for v in r}, key=ALL_VARIANTS.index)
    out: dict[str, dict] = {}
    for v in variants:
        res = [r[v] for r in rounds if v in r]
        mbps = [size / 1e6 / x["seconds"] for x in res]
        entry = {
            "runs": len(res),
            "mb_per_s": median(mbps),
            "mb_per_s_all": [round(x, 3) for x in mbps],
            "tokens_per_s": median([x["tokens"] / x["seconds"] for x in res]),
            "seconds": median([x["seconds"] for x in res]),
            "cpu_seconds": median([x.get("cpu_seconds") for x in res]),
            "peak_rss_mb": max(x.get("self_peak_rss_mb", 0) for x in res),
        }
        workers = [p for x in res for p in x.get("worker_peak_rss_mb", [])]
        if workers:  # pool workers (and multiprocessing's small helper processes)
            entry["pool_worker_peak_rss_mb"] = max(workers)
            entry["per_worker_peak_rss_mb"] = res[-1].get("worker_peak_rss_mb", [])
        if "raw" in variants and v != "raw":
            ratios = [r["raw"]["seconds"] / r[v]["seconds"] for r in rounds if v in r and "raw" in r]
            entry["ratio_vs_raw"] = median(ratios)
            entry["ratio_vs_raw_all"] = [round(x, 3) for x in ratios]
            # the same ratio in CPU seconds: far less sensitive to other load on a shared machine
            cpu = [r["raw"]["cpu_seconds"] / r[v]["cpu_seconds"] for r in rounds if v in r and "raw" in r]
            entry["cpu_ratio_vs_raw"] = median(cpu)
            entry["cpu_ratio_vs_raw_all"] = [round(x, 3) for x in cpu]
            # fastest raw run over fastest run of the variant: other load only ever slows a run
            # down, so the best of several is the closest to the undisturbed cost
            entry["best_ratio_vs_raw"] = best_ratio([r["raw"] for r in rounds if "raw" in r], res)
        if "fast" in variants and v not in ("raw", "fast"):
            ratios = [r["fast"]["seconds"] / r[v]["seconds"] for r in rounds if v in r and "fast" in r]
            entry["ratio_vs_fast"] = median(ratios)
            entry["ratio_vs_fast_all"] = [round(x, 3) for x in ratios]
        out[v] = entry
    comparisons = {}
    for v, b, label in COMPARISONS:
        pairs = [(r[b], r[v]) for r in rounds if v in r and b in r]
        if pairs:
            ratios = [base["seconds"] / x["seconds"] for base, x in pairs]
            cpu = [base["cpu_seconds"] / x["cpu_seconds"] for base, x in pairs]
            comparisons[f"{v}/{b}"] = {"label": label, "ratio": median(ratios), "all": [round(x, 3) for x in ratios],
                                       "best_ratio": best_ratio([base for base, _ in pairs], [x for _, x in pairs])}
            two_processes = v.endswith("-w2") or v.endswith("-x2")
            if not two_processes:
                comparisons[f"{v}/{b}"]["cpu_ratio"] = median(cpu)
            else:
                # CPU work of the two-worker run relative to one worker: the speed-up two idle
                # cores would give is 2 x this; the wall-clock ratio also depends on other load.
                work = [base["cpu_seconds"] / x["cpu_seconds"] for base, x in pairs]
                comparisons[f"{v}/{b}"]["cpu_work_ratio"] = median(work)
                comparisons[f"{v}/{b}"]["cores_used"] = median([x["cpu_seconds"] / x["seconds"] for _, x in pairs])
    scaling = [
        (r["tf-d1"]["seconds"] / r["tf-d1-w2"]["seconds"]) / (r["raw"]["seconds"] / r["raw-x2"]["seconds"])
        for r in rounds
        if all(v in r for v in ("tf-d1", "tf-d1-w2", "raw", "raw-x2"))
    ]
    if scaling:
        # the workers' speed-up as a share of what two plain tokenizer processes got in the same round
        comparisons["tf-d1-w2/tf-d1"]["share_of_machine_ceiling"] = median(scaling)
    without_pool = [r["tf-d1-x2"]["seconds"] / r["tf-d1-w2"]["seconds"] for r in rounds
                    if "tf-d1-x2" in r and "tf-d1-w2" in r]
    if without_pool:
        # the same, against two one-worker runs of the pipeline on the halves: what the pool costs
        comparisons["tf-d1-w2/tf-d1"]["share_of_two_runs"] = median(without_pool)
    return {"variants": out, "comparisons": comparisons}


def print_summary(title: str, summary: dict) -> None:
    print(f"\n== {title}")
    print(f"{'variant':<11} {'MB/s':>7} {'tokens/s':>10} {'ratio vs raw':>13} {'CPU ratio':>10} {'best-of':>8} "
          f"{'vs fast':>8} {'peak RSS MB':>12}  per-round ratios (wall)")
    for v, e in summary["variants"].items():
        ratio = e.get("ratio_vs_raw")
        rss = e["peak_rss_mb"]
        if e.get("pool_worker_peak_rss_mb"):
            rss_text = f"{e['pool_worker_peak_rss_mb']:.0f}/worker"
        else:
            rss_text = f"{rss:.0f}"
        cpu = e.get("cpu_ratio_vs_raw")
        best = e.get("best_ratio_vs_raw")
        fast = e.get("ratio_vs_fast")
        print(
            f"{v:<11} {e['mb_per_s']:7.2f} {e['tokens_per_s']:10.0f} "
            f"{(f'{ratio:.2f}x' if ratio is not None else '-'):>13} "
            f"{(f'{cpu:.2f}x' if cpu is not None else '-'):>10} {(f'{best:.2f}x' if best else '-'):>8} "
            f"{(f'{fast:.2f}x' if fast else '-'):>8} {rss_text:>12}  "
            f"{', '.join(f'{x:.2f}' for x in e.get('ratio_vs_raw_all', []))}"
        )
    for key, c in summary["comparisons"].items():
        cpu = f", CPU-time ratio {c['cpu_ratio']:.2f}x" if "cpu_ratio" in c else ""
        print(f"ratio {key:<20} {c['ratio']:.2f}x  ({c['label']}; rounds: {', '.join(f'{x:.2f}' for x in c['all'])}{cpu}"
              f", best-of {c['best_ratio']:.2f}x)")
        if "cpu_work_ratio" in c:
            print(f"      CPU seconds of 1 process / of 2: {c['cpu_work_ratio']:.2f}; cores busy during the "
                  f"2-process run: {c['cores_used']:.2f} (other load on the machine takes the rest)")
        if "share_of_machine_ceiling" in c:
            print(f"      as a share of the raw-x2/raw speed-up of the same round: {c['share_of_machine_ceiling']:.2f}")
        if "share_of_two_runs" in c:
            print(f"      as a share of the tf-d1-x2/tf-d1 speed-up of the same round: {c['share_of_two_runs']:.2f}")


HELD_OUT_VARIANTS = {"tf-d1": 1, "tf-d5": 5}  # the in-process variants a whole-process figure stands beside


def held_out_figures(result: dict, args, sizes: list[int], variants: list[str], work: Path) -> None:
    """``whole_process.py``'s measurement (prepare and the raw HF script as whole processes from
    the shell, pinned, byte-compiled) on the held-out texts, at the dupe factors of the TFRecord
    variants run here, printed beside the in-process figures (the first size's, training text)."""
    import whole_process  # beside this script

    wanted = [v for v in HELD_OUT_VARIANTS if v in variants] or ["tf-d1"]
    size = args.held_out_size or sizes[0]
    first = next(iter(result["sizes"].values()), {}).get("variants", {})
    corpora = [("english", args.held_out, args.vocab, wanted)]
    if args.held_out_zh is not None:
        corpora.append(("chinese", args.held_out_zh, args.held_out_zh_vocab or args.zh_vocab or args.vocab, ["tf-d1"]))
    figures = {}
    for name, source, vocab, these in corpora:
        for v in these:
            print(f"\nwhole process, held-out text ({name}), {v}:", flush=True)
            res = whole_process.run(source, vocab, size, rounds=args.held_out_rounds or args.repeats,
                                    dupe_factor=HELD_OUT_VARIANTS[v], pin=not args.no_pin, workdir=work / "whole",
                                    warm_up=not args.no_warmup, log=lambda text: print("  " + text, flush=True))
            inside = first.get(v, {}) if name == "english" else result.get("second_corpus", {}).get("variants", {}).get(v, {})
            res["in_process"] = {k: inside.get(k) for k in ("ratio_vs_raw", "cpu_ratio_vs_raw")}
            figures[f"{name} {v}"] = res
    result["held_out_whole_process"] = figures
    print("\n== whole process on held-out text (raw HF script / mlm-pipeline prepare, both from the shell), "
          "beside the in-process figures")
    print(f"{'corpus, variant':<18} {'bytes':>12} {'CPU ratio':>10} {'wall ratio':>11}   {'in-process CPU':>15} "
          f"{'in-process wall':>16}")
    for key, res in figures.items():
        inside = res["in_process"]
        fmt = lambda x: f"{x:.2f}x" if x else "-"  # noqa: E731
        print(f"{key:<18} {res['settings']['bytes']:>12,} {res['ratio_cpu']:>9.2f}x {res['ratio_wall']:>10.2f}x   "
              f"{fmt(inside['cpu_ratio_vs_raw']):>15} {fmt(inside['ratio_vs_raw']):>16}")


def run_rounds(label: str, these: list[str], inp: Path, args, work: Path, pycache: Path, vocab: Path | None) -> dict:
    """``args.repeats`` rounds of the variants ``these`` on ``inp`` with tokenizer ``vocab``, in a
    rotated order: the bytes, every round and the summary (a second corpus or tokenizer's case)."""
    size = inp.stat().st_size
    rounds = []
    for r in range(args.repeats):
        rnd = {}
        for v in these[r % len(these):] + these[: r % len(these)]:
            rnd[v] = res = run_variant(spec_for(v, inp, size, args, work, vocab=vocab), args.timeout, pycache)
            print(f"  [{label} round {r + 1}/{args.repeats}] {v:<10} {size / 1e6 / res['seconds']:6.2f} MB/s "
                  f"{res['seconds']:7.2f} s  peak RSS {res['self_peak_rss_mb']:.0f} MB", flush=True)
        rounds.append(rnd)
    return {"bytes": size, "rounds": rounds, **summarize(rounds, size)}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--input", type=Path, default=DEFAULT_SOURCE,
                   help="real text (Google format) to repeat up to each size (default: the bundled 1 MB "
                        "WikiText-2 sample)")
    p.add_argument("--vocab", type=Path, default=DEFAULT_VOCAB, help="tokenizer (default: bundled bert-base-uncased vocab)")
    p.add_argument("--sizes", default="10MB",
                   help="input sizes, comma-separated: the first runs every variant, the others raw, tf-d1, tf-d1-w2 "
                        "(peak RSS must not grow with the input), e.g. 10MB,200MB or 10MB,1GB")
    p.add_argument("--variants", default=DEFAULT_VARIANTS, help=f"comma-separated subset of {','.join(ALL_VARIANTS)}")
    p.add_argument("--repeats", type=int, default=3, help="rounds over all variants at the first size (median reported)")
    p.add_argument("--big-repeats", type=int, default=1, help="rounds at each further size")
    p.add_argument("--tasks", type=int, default=4, help="tasks the input is split into for every prepare variant")
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--masked-lm-prob", type=float, default=None,
                   help="masking rate of the prepare variants (default: prepare's), with predictions up to length x rate")
    p.add_argument("--batch-lines", type=int, default=10_000, help="lines per encode_batch_fast call of the raw baseline")
    p.add_argument("--plan-size", type=parse_size, default=parse_size("1GB"),
                   help="size of the sparse file plan_tasks is timed on (0 to skip)")
    p.add_argument("--out", "--json", dest="out", type=Path, default=None,
                   help="where to write the results as JSON (default: printed only)")
    p.add_argument("--no-pin", action="store_true",
                   help="do not pin single-process measurements to one core (default: pinned, as os.sched_setaffinity)")
    p.add_argument("--zh-input", type=Path, default=None,
                   help="a second, non-ASCII corpus (e.g. a Chinese novel): raw, fast and tf-d1 on it, --repeats rounds")
    p.add_argument("--zh-vocab", type=Path, default=None, help="the tokenizer for --zh-input (default: --vocab)")
    p.add_argument("--zh-size", type=parse_size, default=parse_size("10MB"), help="size --zh-input is repeated to")
    p.add_argument("--bpe-vocab", type=Path, default=None,
                   help="a byte-level BPE tokenizer (RoBERTa's tokenizer.json): raw, fast, packed and tokens with it "
                        "on --input repeated to --bpe-size, --repeats rounds")
    p.add_argument("--bpe-size", type=parse_size, default=parse_size("10MB"), help="size of the --bpe-vocab case's input")
    p.add_argument("--held-out", type=Path, default=None,
                   help="held-out text (not the one tuned on): prepare and the raw HF script timed as whole processes "
                        "from the shell on it (benchmarks/whole_process.py), at the dupe factors of tf-d1/tf-d5, "
                        "reported beside the in-process figures")
    p.add_argument("--held-out-size", type=parse_size, default=None, help="size --held-out is repeated to (default: "
                   "the first of --sizes)")
    p.add_argument("--held-out-rounds", type=int, default=None, help="whole-process rounds (default: --repeats)")
    p.add_argument("--held-out-zh", type=Path, default=None,
                   help="a second held-out text (e.g. Chinese) for the whole-process figure at dupe factor 1")
    p.add_argument("--held-out-zh-vocab", type=Path, default=None,
                   help="the tokenizer for --held-out-zh (default: --zh-vocab, else --vocab)")
    p.add_argument("--startup-repeats", type=int, default=3,
                   help="runs of the command line on a tiny input, --workers 1 and 2 (0 to skip)")
    p.add_argument("--workdir", type=Path, default=None, help="scratch directory (default: a new temp dir, removed)")
    p.add_argument("--timeout", type=float, default=None, help="seconds before a measurement is abandoned")
    p.add_argument("--no-warmup", action="store_true",
                   help="skip the unreported warm-up round on a small input (it fills the bytecode cache "
                        "the measurements use, see below, so no measurement pays for compiling imports)")
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--sample-peaks", nargs=2, metavar=("PID", "INTERVAL"), help=argparse.SUPPRESS)
    args = p.parse_args(argv)
    if args.child:
        child_main(args.child)
        return 0
    if args.sample_peaks:
        sample_peaks(int(args.sample_peaks[0]), float(args.sample_peaks[1]))
        return 0

    sizes = [parse_size(s) for s in args.sizes.split(",") if s.strip()]
    variants = [v.strip() for v in args.variants.split(",") if v.strip()]
    unknown = [v for v in variants if v not in ALL_VARIANTS]
    if unknown or not sizes or args.repeats < 1:
        p.error(f"unknown variants {unknown}" if unknown else "need at least one size and one repeat")
    if args.held_out_zh is not None and args.held_out is None:
        p.error("--held-out-zh needs --held-out")
    notes = []
    if "hf" in variants and not hf_available():
        variants.remove("hf")
        notes.append("hf skipped: datasets/transformers/torch not installed")
    variants.sort(key=ALL_VARIANTS.index)

    work = Path(args.workdir or tempfile.mkdtemp(prefix="mlm-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    result: dict = {
        "benchmark": "prepare_bench",
        "started": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
        "machine": machine_info(),
        "load_average_start": load_average(),
        "settings": {"source": args.input.name, "vocab": args.vocab.name, "pinned_to_one_core": pin_cpu(args) is not None,
                     "nanotoken_cache_entries": nanotoken_cache_entries(), "sizes": sizes, "variants": variants,
                     "repeats": args.repeats, "big_repeats": args.big_repeats, "tasks": args.tasks,
                     "max_seq_length": args.max_seq_length, "masked_lm_prob": args.masked_lm_prob,
                     "raw_batch_lines": args.batch_lines},
        "notes": notes,
        "sizes": {},
    }
    print(f"machine: {result['machine']['cpu_model']}, {result['machine'].get('usable_cpus')} usable cpus, "
          f"load {result['load_average_start']}")
    for n in notes:
        print("note:", n)
    pycache = work / "pycache"
    try:
        if not args.no_warmup:
            inp = build_input(args.input, 256 << 10, work / "input-warmup.txt")
            for v in variants:
                run_variant(spec_for(v, inp, inp.stat().st_size, args, work), args.timeout, pycache)
            remove_input(inp)
        for si, size in enumerate(sizes):
            label = fmt_size(size)
            inp = build_input(args.input, size, work / f"input-{size}.txt")
            size = inp.stat().st_size
            these = variants if si == 0 else [v for v in ("raw", "fast", "tf-d1", "tf-d1-w2", "tf-d1-x2", "raw-x2")
                                              if v in variants]
            repeats = args.repeats if si == 0 else args.big_repeats
            rounds: list[dict[str, dict]] = []
            for r in range(repeats):
                order = these[r % len(these):] + these[: r % len(these)]
                rnd: dict[str, dict] = {}
                for v in order:
                    res = run_variant(spec_for(v, inp, size, args, work), args.timeout, pycache)
                    rnd[v] = res
                    print(f"  [{label} round {r + 1}/{repeats}] {v:<10} {size / 1e6 / res['seconds']:6.2f} MB/s "
                          f"{res['seconds']:7.2f} s  peak RSS {res['self_peak_rss_mb']:.0f} MB"
                          + (f" (workers {res['worker_peak_rss_mb']})" if res.get("worker_peak_rss_mb") else ""),
                          flush=True)
                rounds.append(rnd)
            summary = summarize(rounds, size)
            result["sizes"][label] = {"bytes": size, "rounds": rounds, **summary}
            if si == 0 and len(sizes) > 1 and "tf-d1" in variants:
                res = run_variant(spec_for("tf-d1", inp, size, args, work, whole_split=True), args.timeout, pycache)
                result["sizes"][label]["one_task_run"] = res
                print(f"  [{label}] tf-d1 as one {fmt_size(size)} task (--split-size 64MB): peak RSS "
                      f"{res['self_peak_rss_mb']:.0f} MB")
            print_summary(f"{label} input ({size:,} bytes), {repeats} round(s), medians", summary)
            remove_input(inp)
        if len(sizes) > 1 and "tf-d1" in variants:
            # Peak RSS against input size, like for like: tasks of several 4 MB blocks (the first
            # size's tf-d1 tasks are single blocks, so it gets a run as one task of up to 64 MB;
            # later sizes' tasks are min(64 MB, size / --tasks)).
            first = next(iter(result["sizes"]))
            rss = {k: v["variants"]["tf-d1"]["peak_rss_mb"] for k, v in result["sizes"].items()}
            rss[first] = result["sizes"][first]["one_task_run"]["self_peak_rss_mb"]
            lo, hi = min(rss.values()), max(rss.values())
            result["rss_flatness"] = {"tf-d1_peak_rss_mb": rss, "max_over_min": hi / lo if lo else None}
            print("\npeak RSS of one worker (tf-d1, tasks of several blocks) by input size: "
                  + ", ".join(f"{k}: {v:.0f} MB" for k, v in rss.items()) + f"  (max/min {hi / lo:.2f})")
        if args.zh_input is not None:
            inp = build_input(args.zh_input, args.zh_size, work / "input-zh.txt")
            result["second_corpus"] = {"source": args.zh_input.name, **run_rounds(
                "second corpus", [v for v in SECOND_LANGUAGE_VARIANTS if v in variants], inp, args, work, pycache,
                args.zh_vocab)}
            print_summary(f"second corpus {args.zh_input.name} ({inp.stat().st_size:,} bytes), {args.repeats} round(s), "
                          "medians", result["second_corpus"])
            remove_input(inp)
        if args.bpe_vocab is not None:
            inp = build_input(args.input, args.bpe_size, work / "input-bpe.txt")
            result["bpe"] = {"vocab": args.bpe_vocab.name, **run_rounds(
                "BPE", [v for v in BPE_VARIANTS if v in variants], inp, args, work, pycache, args.bpe_vocab)}
            print_summary(f"byte-level BPE {args.bpe_vocab.name} ({inp.stat().st_size:,} bytes), {args.repeats} "
                          "round(s), medians", result["bpe"])
            remove_input(inp)
        if args.startup_repeats:
            tiny = build_input(args.input, 4 << 10, work / "input-tiny.txt")
            startup: dict[str, list[dict]] = {"1": [], "2": []}
            for _ in range(args.startup_repeats):
                for workers in ("1", "2"):
                    spec = {"kind": "startup", "input": str(tiny), "vocab": str(args.vocab), "workers": int(workers),
                            "output": str(work / "out-startup"), "pin": pin_cpu(args) if workers == "1" else None,
                            "started": time.time()}
                    startup[workers].append(run_child(spec, args.timeout, pycache))
            result["startup"] = {
                "to_first_task_seconds_workers_1": median([x["to_first_task_seconds"] for x in startup["1"]]),
                "whole_command_seconds_workers_1": median([x["process_wall_seconds"] for x in startup["1"]]),
                "whole_command_seconds_workers_2": median([x["process_wall_seconds"] for x in startup["2"]]),
                "runs": startup,
            }
            st = result["startup"]
            print(f"\nstart-up of prepare (CLI, 4 KB input, median of {args.startup_repeats}): "
                  f"{st['to_first_task_seconds_workers_1']:.2f} s to the first task (--workers 1); whole command "
                  f"{st['whole_command_seconds_workers_1']:.2f} s (--workers 1), "
                  f"{st['whole_command_seconds_workers_2']:.2f} s (--workers 2)")
        if args.held_out is not None:
            held_out_figures(result, args, sizes, variants, work)
        if args.plan_size:
            sparse = work / "plan-input.txt"
            with open(sparse, "wb") as f:
                f.write(args.input.read_bytes()[: 1 << 20])
                f.truncate(args.plan_size)  # the rest is a hole: never written, must never be read
            res = run_child({"kind": "plan", "input": str(sparse), "vocab": str(args.vocab),
                             "output": str(work / "plan-out")}, args.timeout, pycache)
            sparse.unlink()
            result["planning"] = {"input_bytes": args.plan_size, **res}
            print(f"\nplanning {fmt_size(args.plan_size)}: {res['seconds'] * 1000:.1f} ms, {res['tasks']} tasks, "
                  f"{res['bytes_read']} bytes read by the planning process")
    finally:
        if args.workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    result["load_average_end"] = load_average()
    result["finished"] = time.strftime("%Y-%m-%dT%H:%M:%S%z")
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(result, indent=1))
        print(f"\nresults written to {args.out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
