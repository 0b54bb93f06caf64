"""Write the manifest of a run from what is in its output: ``_run.json``, ``_plan.json`` and markers.

Array and claim workers each run part of the tasks; none knows in advance which finishes last.
Each calls :func:`finalize_if_complete` when it is done with a task: the first to see every
task's marker (and its shards) writes ``manifest.json`` with a conditional create, so it is
written once even when several workers finish together. ``mlm-pipeline finalize OUTPUT`` does
the same by hand (and ``--force`` rewrites it), without the inputs or the tokenizer.
"""

from __future__ import annotations

import json
import logging
import os

from mlm_pipeline import cas, fs
from mlm_pipeline.config import PrepareConfig, build_config
from mlm_pipeline.plan import Plan, Task
from mlm_pipeline.read.base import Piece
from mlm_pipeline.task import TASKS_DIR, marker_url

log = logging.getLogger("mlm_pipeline")


class IncompleteRun(RuntimeError):
    """Some tasks have no marker yet; ``missing`` lists their ids."""

    def __init__(self, output: str, missing: list[str], total: int):
        shown = ", ".join(missing[:10]) + (" ..." if len(missing) > 10 else "")
        super().__init__(f"{output}: {len(missing)} of {total} tasks are not complete yet ({shown})")
        self.missing = missing


def done_task_ids(output: str) -> set[str]:
    """Ids of tasks with a marker (a fresh listing)."""
    return {os.path.basename(p)[: -len(".json")] for p in fs.listdir(fs.join(output, TASKS_DIR))
            if p.endswith(".json")}


def load_run(output: str) -> tuple[PrepareConfig, dict, Plan]:
    """The config, run record and plan stored in an output by ``prepare``."""
    from mlm_pipeline.pipeline import PLAN_FILE, RUN_FILE

    try:
        record = json.loads(fs.read_bytes(fs.join(output, RUN_FILE)))
        plan_doc = json.loads(fs.read_bytes(fs.join(output, PLAN_FILE)))
    except FileNotFoundError as exc:
        raise FileNotFoundError(f"{output} holds no run of mlm-pipeline prepare ({exc})") from None
    tasks = [Task(task_id=t["task_id"], index=i, pieces=tuple(Piece(**p) for p in t["pieces"]),
                  input_bytes=t["input_bytes"]) for i, t in enumerate(plan_doc["tasks"])]
    plan = Plan(tasks=tasks, files=plan_doc["files"], skipped_files=plan_doc["skipped_files"],
                split_bytes=plan_doc.get("split_bytes", 0))
    inputs = [f["path"] for f in plan.files] or [s["path"] for s in plan.skipped_files]
    config = build_config({**record["settings"], "inputs": inputs, "output": output})
    return config, record, plan


def collect_markers(config: PrepareConfig, plan: Plan) -> list[dict]:
    """Every task's marker; raises :class:`IncompleteRun` if any is missing or stale."""
    from mlm_pipeline.pipeline import _completed_markers

    done = _completed_markers(config, plan)
    missing = [t.task_id for t in plan.tasks if t.task_id not in done]
    if missing:
        raise IncompleteRun(config.output, missing, len(plan.tasks))
    return [done[t.task_id] for t in plan.tasks]


def write_manifest_once(config: PrepareConfig, record: dict, plan: Plan, markers: list[dict],
                        *, overwrite: bool = False) -> dict | None:
    """Write ``manifest.json`` unless one exists (``overwrite``: always); the manifest if written."""
    from mlm_pipeline.pipeline import MANIFEST, build_manifest, write_manifest

    if overwrite:
        return write_manifest(config, record, plan, markers)
    manifest = build_manifest(config, record, plan, markers)
    if cas.create_bytes(fs.join(config.output, MANIFEST), json.dumps(manifest, indent=1).encode()):
        return manifest
    return None


def finalize_if_complete(config: PrepareConfig, record: dict, plan: Plan) -> dict | None:
    """Write the manifest if every task is done and nobody wrote it yet; the manifest if written."""
    if len(done_task_ids(config.output) & {t.task_id for t in plan.tasks}) < len(plan.tasks):
        return None
    try:
        markers = collect_markers(config, plan)
    except IncompleteRun:
        return None
    manifest = write_manifest_once(config, record, plan, markers)
    if manifest is not None:
        log.info("all %d tasks complete: wrote %s", len(plan.tasks), fs.join(config.output, "manifest.json"))
    return manifest


def finalize(output: str, *, force: bool = False) -> tuple[dict, bool]:
    """``mlm-pipeline finalize``: (the manifest, whether this call wrote it).

    Raises :class:`IncompleteRun` when tasks are missing.
    """
    from mlm_pipeline.pipeline import MANIFEST

    config, record, plan = load_run(output)
    markers = collect_markers(config, plan)
    manifest = write_manifest_once(config, record, plan, markers, overwrite=force)
    if manifest is not None:
        return manifest, True
    return json.loads(fs.read_bytes(fs.join(output, MANIFEST))), False


__all__ = ["IncompleteRun", "collect_markers", "done_task_ids", "finalize", "finalize_if_complete", "load_run",
           "marker_url"]
