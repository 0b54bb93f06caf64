#!/usr/bin/env python
"""Where a multi-worker run's time goes: the driver's phases and every task's span, per run.

``prepare_bench.py`` gives the ratio of ``--workers N`` to one worker; this script says what keeps
it under N. Each run is one ``run_prepare`` call in a fresh process (imported as
``prepare_bench.py`` does, so imports are not timed), ``--workers 1`` pinned to one core and
``--workers N`` to N cores, alternating, ``--repeats`` times. A run is cut into:

- **before the first task**: the driver loads the tokenizer (and its fast backend, with the
  self-check), plans, writes ``_run.json`` and the plan, and starts the pool;
- **tasks**: from the first task's start to the last one's end; each task's own seconds come from
  its completion marker, and the first task a process runs (cold memory, cold tokenizer cache) is
  reported apart from the others;
- **after the last task**: the pool's shutdown (waiting for its worker processes to exit) and the
  manifest.

Each run also reports the CPU seconds (user, system) and minor page faults of the driver and, apart,
of its pool workers (``getrusage`` of the waited-for children): what N processes cost in all
against one.

    python benchmarks/workers_timeline.py --input path/to/wikitext2-train.txt --size 100MB --tasks 4
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
RESULT_TAG = "TIMELINE "


def _child(spec: dict) -> dict:
    """One run, timed from inside: the driver's phases by wrapping them, the tasks from their markers."""
    os.sched_setaffinity(0, set(range(spec["workers"])))
    sys.path.insert(0, str(HERE))
    from prepare_bench import _preimport

    _preimport()
    import mlm_pipeline.pipeline as pipeline
    import mlm_pipeline.run.state as state
    from mlm_pipeline.config import PrepareConfig
    from mlm_pipeline.executors.local import TaskPool

    marks: dict[str, list[float]] = {}

    def timed(owner, name: str, label: str) -> None:
        original = getattr(owner, name)

        def wrapper(*args, **kwargs):
            start = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                marks.setdefault(label, []).append(time.time() - start)

        setattr(owner, name, wrapper)

    timed(state, "load_tokenizer", "tokenizer load")
    timed(pipeline, "start_run", "start_run")
    timed(TaskPool, "_start_pool", "pool start")
    timed(TaskPool, "close", "pool shutdown")
    timed(pipeline, "write_manifest", "manifest")
    config = PrepareConfig(inputs=[spec["input"]], output=spec["output"], tokenizer=spec["vocab"],
                           workers=spec["workers"], split_bytes=spec["split_bytes"], progress=False)
    own = resource.getrusage(resource.RUSAGE_SELF)
    started = time.time()
    manifest = pipeline.run_prepare(config)
    total = time.time() - started
    own_after, children = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = {"driver user": own_after.ru_utime - own.ru_utime, "driver system": own_after.ru_stime - own.ru_stime,
           "driver faults": own_after.ru_minflt - own.ru_minflt}
    if spec["workers"] > 1:
        cpu.update({"workers user": children.ru_utime, "workers system": children.ru_stime,
                    "workers faults": children.ru_minflt})
    spans = []
    for marker_path in sorted((Path(spec["output"]) / "_tasks").glob("*.json")):
        marker = json.loads(marker_path.read_text())
        spans.append((marker["started"] - started, marker["seconds"]))
    spans.sort()
    first_start = spans[0][0]
    last_end = max(s + d for s, d in spans)
    # each process's first task: the first `workers` tasks to start (a pool starts one per worker)
    firsts = [d for _, d in spans[: spec["workers"]]]
    later = [d for _, d in spans[spec["workers"]:]]
    return {
        "workers": spec["workers"],
        "tasks": manifest["tasks"],
        "total": round(total, 4),
        "before_first_task": round(first_start, 4),
        "tasks_window": round(last_end - first_start, 4),
        "after_last_task": round(total - last_end, 4),
        "task_seconds": round(sum(d for _, d in spans), 4),
        "first_task_mean": round(statistics.fmean(firsts), 4),
        "later_task_mean": round(statistics.fmean(later), 4) if later else None,
        "spans": [[round(s, 3), round(s + d, 3)] for s, d in spans],
        **{label: round(sum(values), 4) for label, values in marks.items()},
        **{label: round(value, 4) for label, value in cpu.items()},
    }


def _run_child(spec: dict, workdir: Path) -> dict:
    from prepare_bench import run_child

    shutil.rmtree(spec["output"], ignore_errors=True)
    try:
        return run_child(spec, spec["timeout"], workdir / "pycache", script=Path(__file__), tag=RESULT_TAG)
    finally:
        shutil.rmtree(spec["output"], ignore_errors=True)


SUMMARY_FIELDS = ["total", "tokenizer load", "start_run", "pool start", "before_first_task", "tasks_window",
                  "first_task_mean", "later_task_mean", "pool shutdown", "manifest", "after_last_task", "task_seconds",
                  "driver user", "driver system", "driver faults", "workers user", "workers system", "workers faults"]


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--child", help=argparse.SUPPRESS)
    p.add_argument("--input", default=str(REPO / "sample" / "wikitext2-train-1MB.txt"),
                   help="real text, repeated up to --size")
    p.add_argument("--vocab", default=str(REPO / "sample" / "bert-base-uncased-vocab.txt"))
    p.add_argument("--size", default="20MB")
    p.add_argument("--tasks", type=int, default=4, help="tasks the input is split into")
    p.add_argument("--workers", type=int, default=2, help="the multi-worker run (against --workers 1)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--workdir", help="scratch directory (default: a new temp dir, removed)")
    p.add_argument("--out", help="where to write the results as JSON")
    p.add_argument("--timeout", type=float, default=600)
    args = p.parse_args(argv)
    if args.child:
        print(RESULT_TAG + json.dumps(_child(json.loads(args.child))), flush=True)
        return 0
    sys.path.insert(0, str(REPO / "src"))
    sys.path.insert(0, str(HERE))
    from mlm_pipeline.config import parse_size
    from prepare_bench import build_input, load_average, machine_info

    if args.workers > len(os.sched_getaffinity(0)):
        raise SystemExit(f"--workers {args.workers} needs as many cores; this process may use {len(os.sched_getaffinity(0))}")
    workdir = Path(args.workdir or tempfile.mkdtemp(prefix="workers-timeline-"))
    workdir.mkdir(parents=True, exist_ok=True)
    size = parse_size(args.size)
    text = build_input(Path(args.input), size, workdir / "input.txt")
    text_bytes = text.stat().st_size
    split = -(-text_bytes // args.tasks)
    runs: dict[int, list[dict]] = {1: [], args.workers: []}
    load_at_start = load_average()
    try:
        # unreported: fills the bytecode cache the measured runs use
        _run_child({"input": args.input, "output": str(workdir / "out"), "vocab": args.vocab, "workers": 1,
                    "split_bytes": split, "timeout": args.timeout}, workdir)
        for round_ in range(args.repeats):
            order = [1, args.workers] if round_ % 2 == 0 else [args.workers, 1]
            for workers in order:
                spec = {"input": str(text), "output": str(workdir / "out"), "vocab": args.vocab,
                        "workers": workers, "split_bytes": split, "timeout": args.timeout}
                run = _run_child(spec, workdir)
                runs[workers].append(run)
                print(f"round {round_ + 1}, --workers {workers}: {run['total']:.3f} s, tasks "
                      + " ".join(f"{a:.2f}-{b:.2f}" for a, b in run["spans"]), flush=True)
    finally:
        if not args.workdir:
            shutil.rmtree(workdir, ignore_errors=True)
    summary = {w: {f: statistics.median(r[f] for r in rs) for f in SUMMARY_FIELDS if rs and rs[0].get(f) is not None}
               for w, rs in runs.items()}
    ratios = [a["total"] / b["total"] for a, b in zip(runs[1], runs[args.workers])]
    print(f"\nmedians of {args.repeats} rounds, seconds ({text_bytes / 1e6:.0f} MB, {args.tasks} tasks)")
    print(f"{'':22}" + "".join(f"{'--workers ' + str(w):>14}" for w in summary))
    for field in SUMMARY_FIELDS:
        digits = 0 if field.endswith("faults") else 3
        cells = [f"{s[field]:>14.{digits}f}" if field in s else f"{'':>14}" for s in summary.values()]
        if any(cell.strip() for cell in cells):
            print(f"{field:22}" + "".join(cells))
    print(f"--workers {args.workers} / --workers 1: {statistics.median(ratios):.2f}x "
          f"(rounds {', '.join(f'{r:.2f}' for r in ratios)})")
    if args.out:
        Path(args.out).write_text(json.dumps({
            "benchmark": "workers_timeline", "machine": machine_info(), "load_average_start": load_at_start,
            "load_average_end": load_average(), "size_bytes": text_bytes, "tasks": args.tasks,
            "workers": args.workers, "repeats": args.repeats, "runs": {str(w): rs for w, rs in runs.items()},
            "medians": {str(w): s for w, s in summary.items()},
            "ratio_rounds": [round(r, 3) for r in ratios]}, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
