"""Scale: the simulation of a big corpus (``benchmarks/scale_sim.py``) at 2,000 files, and the
parts of planning and finalizing that only a big run reaches (task ids past 99999)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys

from conftest import REPO, VOCAB

SIM = REPO / "benchmarks" / "scale_sim.py"
FILES = 2000
TOTAL = 200 << 30  # 200 GB: files of about 100 MB, so some are cut in pieces and some share a task


def load_sim():
    spec = importlib.util.spec_from_file_location("scale_sim", SIM)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_the_simulation_plans_every_byte_once_and_finalizes_every_shard(tmp_path):
    from mlm_pipeline.run import layout
    from mlm_pipeline.run.state import load_run

    result_file = tmp_path / "result.json"
    proc = subprocess.run(
        [sys.executable, str(SIM), "--files", str(FILES), "--total-bytes", "200GB", "--work-dir", str(tmp_path),
         "--keep", "--out", str(result_file)],
        capture_output=True, text=True, timeout=600, env={**os.environ, "PYTHONPATH": str(REPO / "src")},
    )
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "peak RSS MB" in proc.stdout
    results = json.loads(result_file.read_text())["results"]
    (output,) = tmp_path.glob("scale-sim-*/out")

    # planning: every simulated byte in exactly one task, without reading the data
    sim = load_sim()
    corpus = sim.SimCorpus(FILES, TOTAL)
    assert int(corpus.sizes.sum()) == TOTAL
    config, record, plan = load_run(str(output))
    assert record["plan_fingerprint"] == results["plan"]["plan_fingerprint"] == plan.fingerprint()
    covered: dict[int, list[tuple[int, int]]] = {}
    for task in plan.tasks:
        for piece in task.pieces:
            i = corpus.index(piece.url.removeprefix("sim://"))
            end = int(corpus.sizes[i]) if piece.end is None else piece.end
            covered.setdefault(i, []).append((piece.start, end))
    assert sorted(covered) == list(range(FILES))
    for i, ranges in covered.items():
        ranges.sort()
        assert ranges[0][0] == 0 and ranges[-1][1] == corpus.sizes[i]
        assert all(a[1] == b[0] for a, b in zip(ranges, ranges[1:])), corpus.path(i)
    assert sum(t.input_bytes for t in plan.tasks) == TOTAL
    assert len(plan.tasks) > FILES  # big files are cut in pieces...
    assert any(len(t.pieces) > 1 for t in plan.tasks)  # ...and small ones share a task
    reads = results["plan"]["requests"]
    assert reads["get"] == FILES and results["plan"]["bytes_read"] <= FILES * 8192  # one 8 KiB head a file
    assert reads.get("info", 0) <= 1  # sizes come from the listing

    # finalize: the manifest lists every task's shards, in task order, and their totals
    manifest = json.loads((output / layout.MANIFEST_FILE).read_text())
    expected = []
    for task in plan.tasks:
        expected += json.loads((output / layout.TASKS_DIR / f"{task.task_id}.json").read_text())["shards"]
    assert manifest["shards"] == expected
    assert manifest["tasks"] == len(plan.tasks) == results["finalize"]["tasks"]
    assert manifest["totals"]["instances"] == sum(s["instances"] for s in expected)
    assert manifest["totals"]["bytes_read"] == TOTAL
    assert results["finalize"]["check"]["ok"] and results["plan"]["check"]["ok"]
    assert results["load"]["shards"] == len(expected)


def test_shards_are_listed_in_plan_order_past_task_99999(tmp_path):
    """Task ids are zero-padded to five digits: ``100000`` sorts before ``10001`` as a string."""
    from mlm_pipeline.config import build_config
    from mlm_pipeline.plan import Plan, Task
    from mlm_pipeline.read import Piece
    from mlm_pipeline.run.manifest import build_manifest

    n = 100_002
    tasks = [Task(task_id=f"{i:05d}", index=i, pieces=(Piece("a.txt", "text", i, i + 1),), input_bytes=1)
             for i in range(n)]
    plan = Plan(tasks=tasks, files=[{"path": "a.txt", "bytes": n, "format": "text", "pieces": n}])
    markers = [{"task_id": t.task_id, "shards": [{"path": f"shards/part-{t.task_id}-00000.tfrecord", "instances": 1,
                                                 "bytes": 10, "sha256": ""}],
                "stats": {"instances": 1, "instance_length_histogram": {str(3 + t.index % 3): 1}},
                "tokenizer_backend": {"backend": "hf"}} for t in reversed(tasks)]  # finished in any order
    config = build_config({"inputs": ["a.txt"], "output": str(tmp_path), "tokenizer": str(VOCAB)})
    record = {"output_fingerprint": "", "tokenizer_fingerprint": ""}
    manifest = build_manifest(config, record, plan, markers)
    assert [s["path"] for s in manifest["shards"]] == [f"shards/part-{i:05d}-00000.tfrecord" for i in range(n)]
    assert manifest["totals"]["instances"] == n
    assert list(manifest["totals"]["instance_length_histogram"]) == ["3", "4", "5"]  # not in finishing order
    assert manifest["tokenizer_backend"] == [{"backend": "hf", "tasks": n}]


def test_the_all_done_probe_never_holds_back_a_complete_run(tmp_path):
    """Shared workers probe one marker before listing them all; a probe left from another run
    (an index past this plan, or a task already done) must not keep the manifest unwritten."""
    from helpers_run import INPUTS, make_config

    from mlm_pipeline.pipeline import run_prepare
    from mlm_pipeline.run import layout, manifest
    from mlm_pipeline.run.state import load_run

    out = tmp_path / "out"
    first = run_prepare(make_config(INPUTS, out), show_progress=False)
    config, record, plan = load_run(str(out))
    last = out / layout.TASKS_DIR / f"{plan.tasks[-1].task_id}.json"
    kept = last.read_bytes()
    last.unlink()
    (out / layout.MANIFEST_FILE).unlink()
    assert manifest.finalize_if_complete(config, record, plan) is None  # lists, remembers the last task
    assert manifest._LAST_MISSING[config.output] == len(plan.tasks) - 1
    assert manifest.finalize_if_complete(config, record, plan) is None  # one probe: still missing
    last.write_bytes(kept)
    for stale in (len(plan.tasks) + 5, 0):
        manifest._LAST_MISSING[config.output] = stale
        (out / layout.MANIFEST_FILE).unlink(missing_ok=True)
        written = manifest.finalize_if_complete(config, record, plan)
        assert written is not None and written["shards"] == first["shards"]
