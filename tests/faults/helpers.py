"""What every fault case checks after its rerun."""

from __future__ import annotations

import json
import os
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
SAMPLE = REPO / "sample"
VOCAB = SAMPLE / "bert-base-uncased-vocab.txt"
SOURCES = [SAMPLE / "wikitext2-train-1MB.txt", SAMPLE / "wikiextractor-AA.txt",
           REPO / "tests" / "data" / "hongloumeng-300KB.txt"]
# tasks of 512 KB: about 10 tasks, so a kill lands with some tasks done and some not
SETTINGS = {"split_bytes": "512KB", "dupe_factor": 1, "max_instances_per_shard": 1500, "random_seed": 12345}


def prepare_args(corpus: Path, out: Path, *, fmt: str = "parquet", workers: int = 2, **extra) -> list[str]:
    settings = {**SETTINGS, **extra}
    args = [str(corpus), "-o", str(out), "-t", str(VOCAB), "--format", fmt, "--workers", str(workers), "--no-progress",
            "--split-size", settings.pop("split_bytes"), "--max-instances-per-shard",
            str(settings.pop("max_instances_per_shard"))]
    for key, value in settings.items():
        args += [f"--{key.replace('_', '-')}", str(value)]
    return args


def run_config(corpus: Path, out: Path, *, fmt: str = "parquet", workers: int = 1, **extra):
    from mlm_pipeline.config import build_config

    return build_config({"inputs": [str(corpus)], "output": str(out), "tokenizer": str(VOCAB), "format": fmt,
                         "workers": workers, "progress": False, **SETTINGS, **extra})


def shard_table(manifest: dict) -> list[tuple]:
    return [(s["path"], s["instances"], s["bytes"], s["sha256"]) for s in manifest["shards"]]


def documents_lost(manifest: dict, clean: dict) -> int:
    """Documents the clean run read (or counted as skipped) that this one did not."""
    def seen(m: dict) -> int:
        t = m["totals"]
        return t["documents_read"] + sum(t.get("documents_skipped", {}).values())

    return seen(clean) - seen(manifest)


def leftovers(out: Path) -> list[str]:
    """Temporary files and stale lock files left in an output."""
    found = []
    for root, _, files in os.walk(out):
        for name in files:
            if name.endswith((".partial", ".lock")) or ".tmp-" in name:
                found.append(os.path.relpath(os.path.join(root, name), out))
    return found


def assert_as_clean(out: Path, clean: dict) -> dict:
    """The output in ``out`` holds exactly the clean run's shards, every document, no leftovers;
    returns its manifest."""
    from mlm_pipeline.verify import verify_output

    manifest = json.loads((out / "manifest.json").read_text())
    assert shard_table(manifest) == shard_table(clean)
    assert documents_lost(manifest, clean) == 0
    assert manifest["totals"]["bytes_read"] == clean["totals"]["bytes_read"]
    assert verify_output(str(out)).ok
    left = leftovers(out)
    assert left == [], left
    # no shard the manifest does not list (what a glob over shards/ would read)
    on_disk = sorted(f"shards/{p.name}" for p in (out / "shards").iterdir())
    assert on_disk == sorted(s["path"] for s in manifest["shards"])
    return manifest
