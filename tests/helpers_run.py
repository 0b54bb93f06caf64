"""Helpers shared by the executor and storage tests: configs, baselines and output comparison."""

from __future__ import annotations

import json
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SAMPLE = REPO / "sample"
VOCAB = str(SAMPLE / "bert-base-uncased-vocab.txt")
INPUTS = [str(SAMPLE / "wikitext2-train-1MB.txt"), str(SAMPLE / "sample_text.txt")]
# small tasks, so that runs have many of them and a kill lands mid-run
SETTINGS = {"split_bytes": "96KiB", "block_bytes": "32KiB", "max_instances_per_shard": 300}


def make_config(inputs, output, **overrides):
    from mlm_pipeline.config import build_config

    values = {"inputs": [str(i) for i in inputs], "output": str(output), "tokenizer": VOCAB, "workers": 1,
              "progress": False, **SETTINGS, **overrides}
    return build_config(values)


def shard_table(manifest: dict) -> list[tuple]:
    return [(s["path"], s["instances"], s["bytes"], s["sha256"]) for s in manifest["shards"]]


def comparable(manifest: dict) -> dict:
    """What must be equal between two runs of the same settings: every shard and the totals."""
    return {"shards": shard_table(manifest), "totals": manifest["totals"], "tasks": manifest["tasks"],
            "output_fingerprint": manifest["output_fingerprint"]}


def read_manifest(fs_url: str) -> dict:
    from mlm_pipeline import fs

    return json.loads(fs.read_bytes(fs.join(fs_url, "manifest.json")))
