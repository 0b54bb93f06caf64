#!/usr/bin/env python
"""What the loader's shard check costs: one epoch of an output read with ``verify="none"``,
``"size"`` and ``"sha256"`` (the default), the samples batched by the collator as training reads
them, in alternating order over several rounds; medians and bests reported. On a shared machine
the medians swing by tens of percent from run to run; the best of several runs (other load only
slows a run down) and the time the SHA-256 itself takes over the shards' bytes are the steadier
figures.

    python benchmarks/loader_verify.py OUT [--rounds 9] [--batch-size 32]

OUT is any prepared output (``mlm-pipeline prepare ... -o OUT``). In-process loading
(``num_workers=0``): every shard is opened, and so checked, once per epoch per process.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import time


def epoch_seconds(out: str, verify: str, batch_size: int) -> tuple[float, int]:
    from mlm_pipeline.torch import manifest as loader_manifest
    from mlm_pipeline.torch.dataset import MLMDataset
    from mlm_pipeline.torch.loader import MLMDataLoader

    loader_manifest._VERIFIED.clear()  # a fresh process: nothing verified yet
    dataset = MLMDataset(out, verify=verify, seed=0)
    loader = MLMDataLoader(dataset, batch_size=batch_size, collate_fn=dataset.collator(seed=0))
    started = time.perf_counter()
    n = sum(int(batch["input_ids"].shape[0]) for batch in loader)
    return time.perf_counter() - started, n


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output")
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--batch-size", type=int, default=32)
    args = parser.parse_args()
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")
    import torch

    torch.set_num_threads(1)
    modes = ["none", "size", "sha256"]
    times: dict[str, list[float]] = {m: [] for m in modes}
    epoch_seconds(args.output, "none", args.batch_size)  # warm the page cache and imports
    for r in range(args.rounds):
        for mode in modes[r % 3:] + modes[:r % 3]:
            seconds, n = epoch_seconds(args.output, mode, args.batch_size)
            times[mode].append(seconds)
    manifest = json.load(open(os.path.join(args.output, "manifest.json")))
    shard_bytes = sum(s["bytes"] for s in manifest["shards"])
    from mlm_pipeline.verify import file_sha256

    hashing = []
    for _ in range(args.rounds):
        started = time.perf_counter()
        for s in manifest["shards"]:
            file_sha256(os.path.join(args.output, s["path"]))
        hashing.append(time.perf_counter() - started)
    base = statistics.median(times["none"])
    result = {"instances": n, "shards": len(manifest["shards"]), "shard_bytes": shard_bytes, "rounds": args.rounds,
              **{f"median_s_{m}": round(statistics.median(t), 4) for m, t in times.items()},
              **{f"overhead_{m}": round(statistics.median(t) / base - 1, 4) for m, t in times.items() if m != "none"},
              **{f"best_s_{m}": round(min(t), 4) for m, t in times.items()},
              "sha256_of_all_shards_best_s": round(min(hashing), 4),
              "sha256_share_of_best_epoch": round(min(hashing) / min(times["none"]), 4)}
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
