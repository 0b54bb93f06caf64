"""How well the loader mixes an epoch, what it reads, what it holds, and what it pads.

For one epoch of a prepared output (or a weighted mix of several), every (rank, worker) of the
given geometry iterates its share in a forked process, as a DataLoader worker would
(:meth:`MLMDataset.iter_worker`), and the script prints:

- distinct source tasks per batch (each worker batches its own samples, as the DataLoader
  does), against the expectation for a batch drawn from a global permutation of the epoch;
- mean |position difference| of consecutive samples (position: the sample's index in the
  outputs' shards, manifest order), against a global permutation's ``(N + 1) / 3``;
- read amplification: bytes the workers read (``rchar`` of ``/proc/self/io``) over the shards'
  bytes, for the whole epoch;
  The shards are checked with ``--verify`` (default ``size``: one ``stat`` each); ``sha256``, the
  loader's default, reads every shard a worker opens once more, per worker and epoch.
- peak RSS of each worker (``VmHWM``; a forked worker shares its parent's pages, counted here);
- padding waste (padding tokens over tokens in batches, each batch padded to its longest
  rounded up to a multiple of 8);
- with several ranks: the mean spread (max - min) of the padded widths of the ranks' k-th
  batches (worker 0 of each), which DDP steps together, and with length bins how often those
  batches come from the same bin.

    python benchmarks/loader_bench.py OUT [OUT ...] [--weights 0.3,0.7] --batch-size 256 \\
        --workers 2 --world-size 1 --shuffle-buffer 10240 [--interleave 128] [--length-bins 8]

A task is a shard name's ``part-TTTTT`` (with several outputs: output and task). Linux only
(``/proc``).
"""

from __future__ import annotations

import argparse
import json
import math
import multiprocessing as mp
import os
import platform
import re
import sys
import time

import numpy as np


def _proc_io() -> int:
    with open("/proc/self/io") as f:
        return int(next(line for line in f if line.startswith("rchar:")).split()[1])


def _hwm_kib() -> int:
    with open("/proc/self/status") as f:
        return int(next(line for line in f if line.startswith("VmHWM:")).split()[1])


def _worker(ds, rank: int, world: int, worker: int, workers: int, conn) -> None:
    ds._rank, ds._world_size = rank, world
    before = _proc_io()
    index, length = [], []
    for s in ds.iter_worker(worker, workers):
        index.append(s["index"])
        length.append(len(s["input_ids"]))
    conn.send({"read": _proc_io() - before, "hwm_kib": _hwm_kib(),
               "index": np.array(index, np.int64), "length": np.array(length, np.int64)})
    conn.close()


def expected_distinct(task_sizes: np.ndarray, total: int, batch: int) -> float:
    """E[distinct tasks] in ``batch`` samples drawn without replacement from ``total``."""
    def log_comb(n, k):
        return math.lgamma(n + 1) - math.lgamma(k + 1) - math.lgamma(n - k + 1)
    miss = [math.exp(log_comb(total - t, batch) - log_comb(total, batch)) if total - t >= batch else 0.0
            for t in task_sizes.tolist()]
    return float(len(task_sizes) - sum(miss))


def padding_waste(lengths: list[np.ndarray], batch: int) -> float:
    pad = tokens = 0
    for seq in lengths:
        for a in range(0, len(seq), batch):
            b = seq[a:a + batch]
            width = -(-int(b.max()) // 8) * 8
            tokens += width * len(b)
            pad += width * len(b) - int(b.sum())
    return pad / max(tokens, 1)


def run(args) -> dict:
    from mlm_pipeline.torch import MLMDataset

    weights = [float(w) for w in args.weights.split(",")] if args.weights else None
    bins = None
    if args.length_bins:
        bins = int(args.length_bins) if "," not in args.length_bins else [int(b) for b in args.length_bins.split(",")]
    ds = MLMDataset(args.outputs if len(args.outputs) > 1 else args.outputs[0], weights=weights, seed=args.seed,
                    shuffle_buffer=args.shuffle_buffer, interleave=args.interleave, rank=0, world_size=1,
                    length_bins=bins, bin_batch_size=args.batch_size if bins else None, verify=args.verify)
    ds.set_epoch(args.epoch)
    task_of_shard, data_bytes = [], 0
    for o, prepared in enumerate(ds.sources):
        for shard in prepared.shards:
            m = re.search(r"part-(\d+)", shard.url)
            task_of_shard.append(f"{o}:{m.group(1) if m else shard.url}")
            data_bytes += os.path.getsize(shard.url)
    _, task_id = np.unique(np.array(task_of_shard), return_inverse=True)
    shard_starts = np.cumsum([0] + [int(c) for p in ds.sources for c in p.shard_counts])

    ctx = mp.get_context("fork")
    results = {}
    jobs = [(r, w) for r in range(args.world_size) for w in range(args.workers)]
    t0 = time.perf_counter()
    for start in range(0, len(jobs), args.parallel):
        running = []
        for r, w in jobs[start:start + args.parallel]:
            here, there = ctx.Pipe(duplex=False)
            p = ctx.Process(target=_worker, args=(ds, r, args.world_size, w, args.workers, there))
            p.start()
            running.append(((r, w), p, here))
        for key, p, conn in running:
            results[key] = conn.recv()
            p.join()
    seconds = time.perf_counter() - t0

    B = args.batch_size
    distinct, pos_diff, seqs = [], [], []
    all_index = []
    for key in jobs:
        idx = results[key]["index"]
        all_index.append(idx)
        seqs.append(results[key]["length"])
        tasks = task_id[np.searchsorted(shard_starts, idx, side="right") - 1]
        distinct += [len(np.unique(tasks[a:a + B])) for a in range(0, len(tasks) - B + 1, B)]
        pos_diff.append(np.abs(np.diff(idx)))
    everything = np.concatenate(all_index)
    total = len(everything)
    epoch_tasks = task_id[np.searchsorted(shard_starts, everything, side="right") - 1]
    expect = expected_distinct(np.bincount(epoch_tasks), total, B)
    diffs = np.concatenate(pos_diff)
    index_span = int(shard_starts[-1])
    report = {
        "outputs": args.outputs, "weights": weights, "tasks": int(len(np.unique(epoch_tasks))),
        "samples": total, "batch_size": B, "world_size": args.world_size, "workers": args.workers,
        "shuffle_buffer": args.shuffle_buffer, "interleave": args.interleave, "length_bins": ds.bins,
        "verify": args.verify,
        "distinct_tasks_per_batch": float(np.mean(distinct)) if distinct else float("nan"),
        "distinct_tasks_global_expectation": expect,
        "distinct_ratio": (float(np.mean(distinct)) / expect) if distinct else float("nan"),
        "mean_abs_position_diff": float(diffs.mean()) if len(diffs) else float("nan"),
        "global_expectation_position_diff": (index_span + 1) / 3,
        "read_amplification": sum(r["read"] for r in results.values()) / data_bytes,
        "peak_rss_mib_per_worker": [round(results[k]["hwm_kib"] / 1024, 1) for k in jobs],
        "padding_waste": padding_waste(seqs, B),
        "seconds": round(seconds, 2),
        "samples_per_second": round(total / seconds) if seconds else None,  # reading only, no collation
    }
    if args.world_size > 1:  # the k-th batches of the ranks' worker 0 (DDP steps them together)
        widths, bins_of = [], []
        for r in range(args.world_size):
            seq = results[(r, 0)]["length"]
            longest = np.array([int(seq[a:a + B].max()) for a in range(0, len(seq), B)])
            widths.append(-(-longest // 8) * 8)
            bins_of.append(np.searchsorted(ds.bins, longest) if ds.bins else None)
        n = min(len(w) for w in widths)
        spread = np.max([w[:n] for w in widths], axis=0) - np.min([w[:n] for w in widths], axis=0)
        report["padded_width_spread_across_ranks"] = float(spread.mean())
        if ds.bins:
            report["same_bin_across_ranks"] = float(np.mean([len({int(b[k]) for b in bins_of}) == 1 for k in range(n)]))
    return report


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("outputs", nargs="+")
    ap.add_argument("--weights", default=None, help="comma list, one per output")
    ap.add_argument("--batch-size", type=int, default=256)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--world-size", type=int, default=1)
    ap.add_argument("--shuffle-buffer", type=int, default=10240)
    ap.add_argument("--interleave", type=int, default=128)
    ap.add_argument("--length-bins", default=None, help="a count, or comma list of upper bounds")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--epoch", type=int, default=0)
    ap.add_argument("--verify", default="size", choices=["sha256", "size", "none"],
                    help="the loader's shard check (sha256 reads each shard once more per worker)")
    ap.add_argument("--parallel", type=int, default=2, help="worker processes run at once")
    ap.add_argument("--json", default=None, help="also write the report here")
    args = ap.parse_args(argv)
    report = run(args)
    report["machine"] = f"{platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    for k, v in report.items():
        print(f"{k:36s} {v if not isinstance(v, float) else round(v, 4)}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(report, f, indent=1, default=str)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
