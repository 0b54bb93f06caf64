"""How well the loader mixes an epoch, what it reads, what it holds, and what it pads.

For one epoch of a prepared output (or a weighted mix of several), every (rank, worker) of the
given geometry iterates its share in a forked process, as a DataLoader worker would
(:meth:`MLMDataset.iter_worker`), and the script prints:

- distinct source tasks per batch (each worker batches its own samples, as the DataLoader
  does), against the expectation for a batch drawn from a global permutation of the epoch;
- mean |position difference| of consecutive samples (position: the sample's index in the
  outputs' shards, manifest order), against a global permutation's ``(N + 1) / 3``;
- read amplification: bytes read (``rchar`` of ``/proc/self/io``) over the shards' bytes, for
  the whole epoch: what the workers read, plus, once per rank, what planning the epoch reads
  before the workers start (the shards' layouts: Parquet footers, and with length bins the rows'
  lengths), measured in this process and counted ``world_size`` times;
  The shards are checked with ``--verify`` (default ``size``: one ``stat`` each); ``sha256``, the
  loader's default, reads every shard a worker opens once more, per worker and epoch.
- peak RSS of each worker (``VmHWM``; a forked worker shares its parent's pages, counted here);
- padding waste (padding tokens over tokens in batches, each batch padded to its longest
  rounded up to a multiple of 8);
- with several ranks: the mean spread (max - min) of the padded widths of the ranks' k-th
  batches in DataLoader order (the workers' batches round robin), which DDP steps together, and
  with length bins how often those batches are of the same bin (each sample's ``bin``) and how
  many batches hold only samples of their bin (the others hold samples moved up from the bin
  below). The script checks that no sample is longer than its batch's bin allows.

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
    index, length, bins = [], [], []
    for s in ds.iter_worker(worker, workers):
        index.append(s["index"])
        length.append(len(s["input_ids"]))
        bins.append(s["bin"])
    conn.send({"read": _proc_io() - before, "hwm_kib": _hwm_kib(), "index": np.array(index, np.int64),
               "length": np.array(length, np.int64), "bin": np.array(bins, np.int64)})
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


def dataloader_order(per_worker: list[np.ndarray], batch: int) -> list[np.ndarray]:
    """The batches of a rank as a DataLoader hands them out: each worker's in turn, exhausted ones skipped."""
    cut = [[seq[a:a + batch] for a in range(0, len(seq), batch)] for seq in per_worker]
    return [c[k] for k in range(max(map(len, cut), default=0)) for c in cut if k < len(c)]


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
    before = _proc_io()
    ds.plan()  # what each rank's training process reads before its workers start (the layouts)
    plan_read = _proc_io() - before
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
        "read_amplification": (sum(r["read"] for r in results.values()) + args.world_size * plan_read) / data_bytes,
        "plan_read_per_rank": plan_read / data_bytes,
        "peak_rss_mib_per_worker": [round(results[k]["hwm_kib"] / 1024, 1) for k in jobs],
        "padding_waste": padding_waste(seqs, B),
        "seconds": round(seconds, 2),
        "samples_per_second": round(total / seconds) if seconds else None,  # reading only, no collation
    }
    steps = {r: (dataloader_order([results[(r, w)]["length"] for w in range(args.workers)], B),
                 dataloader_order([results[(r, w)]["bin"] for w in range(args.workers)], B))
             for r in range(args.world_size)}
    if ds.bins:
        bounds = np.array(list(ds.bins) + [np.iinfo(np.int64).max])
        labels = [b for r in steps for b in steps[r][1]]
        assert all(len(set(b.tolist())) == 1 for b in labels), "a batch of samples of several bins"
        assert all((x <= bounds[b[0]]).all() for r in steps for x, b in zip(*steps[r])), "a sample above its bin"
        lower = np.concatenate([[0], bounds[:-1]])
        own = [(x > lower[b[0]]).all() for r in steps for x, b in zip(*steps[r])]
        report["batches_of_one_bin"] = float(np.mean(own))
    if args.world_size > 1:  # the ranks' k-th batches, which DDP steps together
        n = min(len(steps[r][0]) for r in steps)
        widths = np.array([[-(-int(x.max()) // 8) * 8 for x in steps[r][0][:n]] for r in steps])
        report["padded_width_spread_across_ranks"] = float((widths.max(0) - widths.min(0)).mean())
        if ds.bins:
            bins_of = np.array([[int(b[0]) for b in steps[r][1][:n]] for r in steps])
            report["same_bin_across_ranks"] = float(np.mean((bins_of == bins_of[0]).all(0)))
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
