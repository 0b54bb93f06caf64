#!/usr/bin/env python
"""Whole-process speed of ``mlm-pipeline prepare`` against a raw HF tokenizer script, from outside.

``prepare_bench.py`` times each stage inside its process, on text built from the file it was
tuned on. A user times the command from the shell, on their own text. So this runs both as whole
processes, start-up, imports, tokenizer load and writing included, on text it was never tuned
on, and reports what ``time`` would: wall and CPU seconds (user + system, of the process and its
children) of each, and their ratios, as medians of alternating rounds (raw, prepare, raw, ...),
each process pinned to one core.

    python benchmarks/whole_process.py --input held-out.txt --vocab vocab.txt --size 100MB --dupe-factor 5
    python benchmarks/whole_process.py --input hongloumeng.txt --vocab zh-vocab.txt --size 20MB
    python benchmarks/whole_process.py --input held-out.txt --vocab roberta/tokenizer.json --objective packed

The raw script is the baseline every figure of the project is given against: HF ``tokenizers``
(the same tokenizer: a WordPiece vocab.txt as ``BertWordPieceTokenizer``, a tokenizer.json as
it is), one thread, ``encode_batch_fast`` of its ``Tokenizer`` over the stripped non-blank lines
in batches of 10,000, only ``len(encoding)`` read back. (Before 2026-11-29 a WordPiece vocab.txt
got ``encode_batch``: the wrapper has no ``encode_batch_fast``, and the script took what it had.) ``--baselines`` adds the same script with ``encode_batch``
(``raw_encode_batch``: the call most scripts make, which also computes character offsets, so it
is slower), run in the same alternating rounds, its ratios reported beside the first. ``prepare`` gets ``--workers 1`` and otherwise its defaults
(NSP, static masking, TFRecord, sequence length 128), with ``--dupe-factor``/``--objective``/
``--format`` as given. Python compiles nothing during the rounds: one unreported warm-up round runs
first, as an install leaves its modules byte-compiled.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

RAW_SCRIPT = r"""
import sys
from tokenizers import Tokenizer
from tokenizers.implementations import BertWordPieceTokenizer
path, vocab, batch = sys.argv[1], sys.argv[2], int(sys.argv[3])
tok = Tokenizer.from_file(vocab) if vocab.endswith(".json") else BertWordPieceTokenizer(vocab, lowercase=True)
# the call named, on the Tokenizer itself (HF's BertWordPieceTokenizer wrapper has no encode_batch_fast)
encode = getattr(getattr(tok, "_tokenizer", tok), sys.argv[4])
lines, tokens = [], 0
with open(path, encoding="utf-8") as f:
    for line in f:
        line = line.strip()
        if line:
            lines.append(line)
            if len(lines) == batch:
                tokens += sum(len(e) for e in encode(lines, add_special_tokens=False))
                lines = []
if lines:
    tokens += sum(len(e) for e in encode(lines, add_special_tokens=False))
print(tokens)
"""


def parse_size(text: str) -> int:
    units = {"KB": 1 << 10, "MB": 1 << 20, "GB": 1 << 30}
    for unit, factor in units.items():
        if text.upper().endswith(unit):
            return int(float(text[: -len(unit)]) * factor)
    return int(text)


def build_input(source: Path, size: int, dest: Path) -> Path:
    """``source`` repeated (a blank line between copies, so documents stay documents) up to ``size`` bytes."""
    data = source.read_bytes().rstrip(b"\n") + b"\n\n"
    with open(dest, "wb") as f:
        written = 0
        while written < size:
            f.write(data)
            written += len(data)
    return dest


def timed(argv: list[str], core: int | None, env: dict) -> dict:
    """Wall and CPU seconds of one whole process (and its children), as ``time`` reports them."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    pin = (lambda: os.sched_setaffinity(0, {core})) if core is not None else None
    done = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.PIPE, env=env, preexec_fn=pin)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if done.returncode:
        raise RuntimeError(f"{argv[:4]} failed ({done.returncode}): {done.stderr.decode()[-2000:]}")
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return {"wall": wall, "cpu": cpu}


def commands(inp: Path, args, out: Path) -> dict[str, list[str]]:
    prepare = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", str(inp), "-o", str(out),
               "-t", str(args.vocab), "--workers", "1", "--no-progress", "--dupe-factor", str(args.dupe_factor),
               "--objective", args.objective, "--format", args.format, *args.extra]
    raws = {RAW_NAMES[method]: [sys.executable, "-c", RAW_SCRIPT, str(inp), str(args.vocab), "10000", method]
            for method in args.baselines}
    return {**raws, "prepare": prepare}


RAW_NAMES = {"encode_batch_fast": "raw", "encode_batch": "raw_encode_batch"}
"""Each HF call the raw script can time, and the name of its runs (``raw``: the first baseline)."""


def _say(text: str) -> None:
    print(text, flush=True)


def measure(inp: Path, args, work: Path, rounds: int, log=_say) -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    env.pop("PYTHONDONTWRITEBYTECODE", None)  # as an install leaves it: modules byte-compiled
    core = None if args.no_pin else min(os.sched_getaffinity(0))
    out = work / "out"
    argv = commands(inp, args, out)
    runs: dict[str, list[dict]] = {name: [] for name in argv}
    for r in range(rounds):
        order = list(argv) if r % 2 == 0 else list(argv)[::-1]
        for name in order:
            shutil.rmtree(out, ignore_errors=True)
            runs[name].append(timed(argv[name], core, env))
            log(f"  round {r + 1}/{rounds} {name:<16} wall {runs[name][-1]['wall']:7.2f} s  "
                f"cpu {runs[name][-1]['cpu']:7.2f} s")
    shutil.rmtree(out, ignore_errors=True)

    def ratios(raw: str) -> dict:
        return {k: statistics.median(a[k] / b[k] for a, b in zip(runs[raw], runs["prepare"])) for k in ("wall", "cpu")}

    result = {"runs": runs, "median_wall": {k: statistics.median(x["wall"] for x in v) for k, v in runs.items()},
              "median_cpu": {k: statistics.median(x["cpu"] for x in v) for k, v in runs.items()}}
    for raw in argv:
        if raw != "prepare":
            ratio = ratios(raw)
            suffix = "" if raw == "raw" else raw[len("raw"):]  # ratio_cpu: against the first baseline
            result[f"ratio_wall{suffix}"], result[f"ratio_cpu{suffix}"] = ratio["wall"], ratio["cpu"]
    return result


def run(source: Path, vocab: Path, size: int, *, rounds: int = 3, dupe_factor: int = 1, objective: str = "nsp",
        fmt: str = "tfrecord", extra: list[str] | None = None, pin: bool = True, workdir: Path | None = None,
        warm_up: bool = True, baselines: tuple[str, ...] = ("encode_batch_fast",), log=_say) -> dict:
    """The whole measurement (what ``main`` prints), for another script: ``source`` repeated to
    ``size`` bytes, an unreported warm-up round on 1 MB of it, then ``rounds`` alternating rounds.
    Returns the runs, the median ratios (raw / prepare: ``ratio_wall``, ``ratio_cpu``; with
    ``encode_batch`` among the ``baselines`` also ``ratio_wall_encode_batch``, ``ratio_cpu_encode_batch``)
    and the settings."""
    unknown = sorted(set(baselines) - set(RAW_NAMES))
    if unknown or not baselines or baselines[0] != "encode_batch_fast":
        raise ValueError(f"baselines: encode_batch_fast first, then optionally encode_batch (got {list(baselines)})")
    args = argparse.Namespace(vocab=vocab, dupe_factor=dupe_factor, objective=objective, format=fmt,
                              extra=list(extra or []), no_pin=not pin, baselines=list(baselines))
    work = Path(workdir or tempfile.mkdtemp(prefix="mlm-whole-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        inp = build_input(source, size, work / "input.txt")
        if warm_up:  # unreported: fills the bytecode caches
            measure(build_input(source, min(size, 1 << 20), work / "warm.txt"), args, work, 1, log=lambda *_: None)
        log(f"{source.name} repeated to {inp.stat().st_size:,} bytes, {vocab.name}, "
            f"{objective}, dupe factor {dupe_factor}, {fmt}, {rounds} rounds")
        result = measure(inp, args, work, rounds, log=log)
        result["settings"] = {"source": source.name, "vocab": vocab.name, "bytes": inp.stat().st_size,
                              "rounds": rounds, "dupe_factor": dupe_factor, "objective": objective, "format": fmt,
                              "extra": list(extra or []), "pinned_to_one_core": pin, "baselines": list(baselines)}
    finally:
        if workdir is None:
            shutil.rmtree(work, ignore_errors=True)
    return result


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--input", type=Path, required=True, help="held-out text, repeated up to --size")
    p.add_argument("--vocab", type=Path, required=True, help="a WordPiece vocab.txt or a tokenizer.json")
    p.add_argument("--size", type=parse_size, default=parse_size("100MB"))
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--dupe-factor", type=int, default=1)
    p.add_argument("--objective", default="nsp")
    p.add_argument("--format", default="tfrecord")
    p.add_argument("--extra", nargs=argparse.REMAINDER, default=[], help="more prepare flags (last)")
    p.add_argument("--baselines", default="encode_batch_fast,encode_batch",
                   help="the HF calls the raw script times, comma-separated: encode_batch_fast (the ratios' "
                        "baseline) and optionally encode_batch (ratios reported beside)")
    p.add_argument("--no-pin", action="store_true", help="do not pin each process to one core")
    p.add_argument("--workdir", type=Path, default=None)
    p.add_argument("--json", type=Path, default=None, help="also write the results here")
    args = p.parse_args(argv)
    result = run(args.input, args.vocab, args.size, rounds=args.rounds, dupe_factor=args.dupe_factor,
                 objective=args.objective, fmt=args.format, extra=args.extra, pin=not args.no_pin,
                 workdir=args.workdir, baselines=tuple(args.baselines.split(",")))
    print(f"whole process, raw HF tokenizer (encode_batch_fast) / prepare, median of {args.rounds}: "
          f"wall {result['ratio_wall']:.2f}x, CPU {result['ratio_cpu']:.2f}x")
    if "ratio_cpu_encode_batch" in result:
        print(f"whole process, raw HF tokenizer (encode_batch) / prepare, median of {args.rounds}: "
              f"wall {result['ratio_wall_encode_batch']:.2f}x, CPU {result['ratio_cpu_encode_batch']:.2f}x")
    if args.json:
        args.json.write_text(json.dumps(result, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
