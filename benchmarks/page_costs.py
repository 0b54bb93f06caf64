#!/usr/bin/env python
"""What this machine charges a new process for memory, and two processes for running at once.

A pool worker is a forked process: it faults in fresh pages for its first task's arrays, copies
the pages it shares with the driver as it writes them (copy-on-write), and gives all its pages back
when it exits. How much each costs depends on the kernel and, on a virtual machine, on the
hypervisor; on a small VM these fixed costs decide how close two workers come to twice one. This
script measures them in isolation (Linux only: ``fork``, ``sched_setaffinity``):

- **fresh fault**: writing one byte to each page of a new anonymous mapping, µs a page (the same
  loop over the pages once they are present is subtracted);
- **copy-on-write fault**: the same in a forked child, on a mapping its parent had filled;
- **exit**: a child that touched ``--mb`` MB exits; the time from its exit to the parent's
  ``waitpid``, µs a page, against a child that touched 1 MB;
- **two at once**: a CPU-bound loop on each core alone, then on two cores at the same time: the
  slowdown each process sees from the other (shared caches, the host's scheduling).

    python benchmarks/page_costs.py --mb 64 --repeats 3 --out page-costs.json
"""

from __future__ import annotations

import argparse
import json
import mmap
import os
import statistics
import sys
import time

PAGE = mmap.PAGESIZE


def _touch(buf: mmap.mmap) -> float:
    """Seconds to write one byte in every page of ``buf``."""
    started = time.perf_counter()
    for offset in range(0, len(buf), PAGE):
        buf[offset] = 1
    return time.perf_counter() - started


def fresh_fault_us(size: int) -> float:
    buf = mmap.mmap(-1, size)
    first, again = _touch(buf), _touch(buf)
    buf.close()
    return (first - again) / (size // PAGE) * 1e6


def _in_child(body) -> float:
    """Run ``body()`` (returning a float) in a forked child; its result."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        try:
            os.write(write_end, repr(body()).encode())
        finally:
            os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        text = f.read()
    os.waitpid(pid, 0)
    return float(text)


def cow_fault_us(size: int) -> float:
    buf = mmap.mmap(-1, size)
    _touch(buf)  # present in the parent: the child's writes copy them

    def child() -> float:
        first, again = _touch(buf), _touch(buf)
        return (first - again) / (size // PAGE) * 1e6

    result = _in_child(child)
    buf.close()
    return result


def exit_seconds(size: int) -> float:
    """Seconds from a child's exit (having touched ``size`` bytes) to the parent reaping it."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:
        buf = mmap.mmap(-1, size)  # (kept: the exit, not a close, gives its pages back)
        _touch(buf)
        os.write(write_end, b"x")
        os._exit(0)
    os.close(write_end)
    os.read(read_end, 1)
    started = time.perf_counter()
    os.waitpid(pid, 0)
    elapsed = time.perf_counter() - started
    os.close(read_end)
    return elapsed


def _spin(loops: int) -> float:
    started = time.perf_counter()
    total = 0
    for i in range(loops):
        total += i
    return time.perf_counter() - started


def spin_seconds(cpus: list[int], loops: int) -> list[float]:
    """The loop's seconds in one process per CPU of ``cpus``, all started together."""
    read_end, write_end = os.pipe()
    pids = []
    for cpu in cpus:
        pid = os.fork()
        if pid == 0:
            try:
                os.sched_setaffinity(0, {cpu})
                os.write(write_end, f"{_spin(loops)!r}\n".encode())
            finally:
                os._exit(0)
        pids.append(pid)
    os.close(write_end)
    with os.fdopen(read_end) as f:
        times = [float(line) for line in f.read().split()]
    for pid in pids:
        os.waitpid(pid, 0)
    return times


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--mb", type=int, default=64, help="memory each measurement touches, MB")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--loops", type=int, default=10_000_000, help="iterations of the CPU-bound loop")
    p.add_argument("--out", help="where to write the results as JSON")
    args = p.parse_args(argv)
    if not sys.platform.startswith("linux"):
        raise SystemExit("page_costs.py measures Linux processes (fork, sched_setaffinity)")
    sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
    from prepare_bench import load_average, machine_info

    size = args.mb << 20
    pages = size // PAGE
    cpus = sorted(os.sched_getaffinity(0))[:2]
    runs: dict[str, list[float]] = {"fresh fault us/page": [], "copy-on-write fault us/page": [],
                                    "exit us/page": [], "exit of a 1 MB process, ms": []}
    alone: list[float] = []
    together: list[float] = []
    load_start = load_average()
    for _ in range(args.repeats):
        runs["fresh fault us/page"].append(fresh_fault_us(size))
        runs["copy-on-write fault us/page"].append(cow_fault_us(size))
        small = exit_seconds(1 << 20)
        runs["exit of a 1 MB process, ms"].append(small * 1e3)
        runs["exit us/page"].append((exit_seconds(size) - small) / (pages - (1 << 20) // PAGE) * 1e6)
        if len(cpus) == 2:
            alone += [spin_seconds([cpu], args.loops)[0] for cpu in cpus]
            together += spin_seconds(cpus, args.loops)
    medians = {name: round(statistics.median(values), 3) for name, values in runs.items()}
    if together:
        medians["two at once / alone, CPU-bound loop"] = round(statistics.median(together) / statistics.median(alone), 3)
    result = {"benchmark": "page_costs", "machine": machine_info(), "load_average_start": load_start,
              "load_average_end": load_average(), "mb": args.mb, "repeats": args.repeats,
              "runs": {name: [round(v, 3) for v in values] for name, values in runs.items()},
              "loop_seconds_alone": [round(v, 4) for v in alone],
              "loop_seconds_together": [round(v, 4) for v in together], "medians": medians}
    for name, value in medians.items():
        print(f"{name:<40} {value}")
    if args.out:
        with open(args.out, "w") as f:
            json.dump(result, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
