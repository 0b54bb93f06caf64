#!/usr/bin/env python
"""Speed against worker count: ``prepare --workers N`` beside N raw tokenizer processes, N = 1, 2, 4...

For each N of ``--workers`` (every N at most the cores this process may use), in rotated order
each round:

- ``prepare``: NSP, static masking, TFRecord, dupe factor 1, ``--workers N``, the process pinned
  to N cores (its pool workers inherit them), the input cut into the same ``--tasks`` tasks for
  every N, so only the worker count changes;
- ``raw xN``: N HF ``tokenizers`` processes at once, each pinned to its own core and each on
  1/N of the raw input: what N cores of this machine give the tokenizer everyone else uses.

It reports MB/s in total and per core, and the speed-up over N = 1 of each. The raw runs read
``--raw-size`` of the same text (the raw tokenizer's speed does not depend on the input's size,
and at about 5 MB/s a core it would take most of the time). Each measurement is a fresh process
(``prepare_bench.py``'s children); medians of ``--repeats`` rounds.

    python benchmarks/scaling.py --input path/to/wikitext2-train.txt --size 1GB --raw-size 64MB \\
        --workers 1,2,4,8,16 --tasks 64 --repeats 3 --out benchmarks/results/scaling-16-cores.json
"""

from __future__ import annotations

import argparse
import json
import math
import os
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO / "src"))

from prepare_bench import (  # noqa: E402
    PREPARE_VARIANTS, build_input, load_average, machine_info, run_children, run_raw_parts,
)


def prepare_spec(inp: Path, args, work: Path, workers: int, cores: list[int], split_bytes: int) -> dict:
    config = {**PREPARE_VARIANTS["tf-d1"], "workers": workers, "max_seq_length": args.max_seq_length,
              "split_bytes": split_bytes}
    return {"kind": "prepare", "input": str(inp), "vocab": args.vocab, "seq": args.max_seq_length,
            "pin": cores[:workers], "output": str(work / f"out-w{workers}"), "config": config}


def raw_spec(inp: Path, args) -> dict:
    return {"kind": "raw", "input": str(inp), "vocab": args.vocab, "seq": args.max_seq_length,
            "batch_lines": args.batch_lines}


def measure(kind: str, workers: int, inp: Path, args, work: Path, cores: list[int], split_bytes: int,
            pycache: Path) -> dict:
    """One measurement: seconds (the slowest process for raw xN), MB/s in total and per core."""
    size = inp.stat().st_size
    if kind == "prepare":
        (result,) = run_children([prepare_spec(inp, args, work, workers, cores, split_bytes)], args.timeout, pycache)
        seconds, extra = result["seconds"], {"tasks": result["tasks"],
                                              "worker_peak_rss_mb": result["worker_peak_rss_mb"]}
    else:
        result = run_raw_parts(raw_spec(inp, args), cores[:workers], args.timeout, pycache)
        seconds, extra = result["seconds"], {"tokens": result["tokens"]}
    mb_s = size / seconds / 1e6
    return {"seconds": round(seconds, 4), "mb_per_s": round(mb_s, 2), "mb_per_s_per_core": round(mb_s / workers, 2),
            **extra}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", type=Path, default=REPO / "sample" / "wikitext2-train-1MB.txt",
                   help="real text (Google format), repeated up to --size and --raw-size")
    p.add_argument("--vocab", default=str(REPO / "sample" / "bert-base-uncased-vocab.txt"))
    p.add_argument("--size", default="64MB", help="input of every prepare run")
    p.add_argument("--raw-size", help="input of the raw tokenizer runs (default: --size)")
    p.add_argument("--workers", default="1,2", help="worker counts, comma-separated (1 is always measured)")
    p.add_argument("--tasks", type=int, help="tasks the input is cut into (default: 4 per worker of the largest N)")
    p.add_argument("--repeats", type=int, default=1)
    p.add_argument("--max-seq-length", type=int, default=128)
    p.add_argument("--batch-lines", type=int, default=10_000, help="lines per raw encode_batch_fast call")
    p.add_argument("--workdir", type=Path, help="scratch directory (default: a new temp dir, removed)")
    p.add_argument("--out", type=Path, help="where to write the results as JSON")
    p.add_argument("--timeout", type=float, default=1800)
    p.add_argument("--deadline", type=float,
                   help="seconds: start no round that would end past this (by the longest round so far); "
                        "the rounds done are reported (for a machine lent for a limited time)")
    args = p.parse_args(argv)

    from mlm_pipeline.config import parse_size

    cores = sorted(os.sched_getaffinity(0))
    counts = sorted({1, *(int(w) for w in args.workers.split(","))})
    if counts[-1] > len(cores):
        raise SystemExit(f"--workers {counts[-1]} needs as many cores; this process may use {len(cores)}")
    tasks = args.tasks or 4 * counts[-1]
    work = args.workdir or Path(tempfile.mkdtemp(prefix="scaling-"))
    work.mkdir(parents=True, exist_ok=True)
    pycache = work / "pycache"
    started = time.strftime("%Y-%m-%dT%H:%M:%S")
    load_start = load_average()
    try:
        text = build_input(args.input, parse_size(args.size), work / "input.txt")
        raw_text = text if not args.raw_size else build_input(args.input, parse_size(args.raw_size), work / "raw.txt")
        split_bytes = max(1 << 20, math.ceil(text.stat().st_size / tasks))
        # unreported: fills the bytecode cache every measured process then uses
        warm = build_input(args.input, 256 << 10, work / "warm.txt")
        measure("prepare", 1, warm, args, work, cores, split_bytes, pycache)
        runs: dict[str, list[dict]] = {f"{kind}-{n}": [] for n in counts for kind in ("prepare", "raw")}
        plan = [(kind, n) for n in counts for kind in ("prepare", "raw")]
        began, longest, done = time.monotonic(), 0.0, 0
        for r in range(args.repeats):
            if args.deadline and r and time.monotonic() - began + longest > args.deadline:
                print(f"--deadline {args.deadline:g} s: stopping after {r} of {args.repeats} rounds", flush=True)
                break
            round_began = time.monotonic()
            for kind, n in plan[r % len(plan):] + plan[: r % len(plan)]:
                result = measure(kind, n, text if kind == "prepare" else raw_text, args, work, cores, split_bytes,
                                 pycache)
                runs[f"{kind}-{n}"].append(result)
                print(f"round {r + 1}: {kind:7} x{n:<3} {result['mb_per_s']:9.2f} MB/s "
                      f"({result['mb_per_s_per_core']:.2f} per core, {result['seconds']:.3f} s)", flush=True)
            longest, done = max(longest, time.monotonic() - round_began), r + 1
    finally:
        if not args.workdir:
            shutil.rmtree(work, ignore_errors=True)

    def med(kind: str, n: int, field: str) -> float:
        return statistics.median(r[field] for r in runs[f"{kind}-{n}"])

    rows = []
    for n in counts:
        row = {"workers": n}
        for kind in ("prepare", "raw"):
            row[f"{kind}_mb_per_s"] = round(med(kind, n, "mb_per_s"), 2)
            row[f"{kind}_mb_per_s_per_core"] = round(med(kind, n, "mb_per_s_per_core"), 2)
            row[f"{kind}_speedup"] = round(med(kind, n, "mb_per_s") / med(kind, 1, "mb_per_s"), 2)
        row["prepare_per_raw"] = round(row["prepare_mb_per_s"] / row["raw_mb_per_s"], 2)
        rows.append(row)
    print(f"\nmedians of {done} round(s); prepare on {args.size} in {tasks} tasks, "
          f"raw on {args.raw_size or args.size}")
    print(f"{'N':>4} {'prepare MB/s':>13} {'per core':>9} {'speed-up':>9} {'raw xN MB/s':>12} {'per core':>9} "
          f"{'speed-up':>9} {'prepare/raw':>12}")
    for row in rows:
        print(f"{row['workers']:>4} {row['prepare_mb_per_s']:>13.2f} {row['prepare_mb_per_s_per_core']:>9.2f} "
              f"{row['prepare_speedup']:>8.2f}x {row['raw_mb_per_s']:>12.2f} {row['raw_mb_per_s_per_core']:>9.2f} "
              f"{row['raw_speedup']:>8.2f}x {row['prepare_per_raw']:>11.2f}x")
    if args.out:
        args.out.write_text(json.dumps({
            "benchmark": "scaling", "started": started, "machine": machine_info(),
            "load_average_start": load_start, "load_average_end": load_average(),
            "settings": {"size": args.size, "raw_size": args.raw_size or args.size, "tasks": tasks,
                         "workers": counts, "repeats": done, "max_seq_length": args.max_seq_length},
            "rows": rows, "runs": runs}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
