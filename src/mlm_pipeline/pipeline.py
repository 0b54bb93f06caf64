"""The driver of ``prepare``: plan -> check/resume -> execute -> manifest.

The driver never reads corpus data (planning uses file sizes; a peek of a few KB per file detects
the format and binary files). State lives in the output itself, so any machine can resume a run:

    OUTPUT/_run.json            settings + tokenizer and plan fingerprints (written first)
    OUTPUT/_plan.json           the tasks and input files (lets `finalize` work from the output alone)
    OUTPUT/shards/part-*.EXT    committed shards
    OUTPUT/_tasks/ID.json       per-task completion marker with shard list and stats (written last)
    OUTPUT/manifest.json        totals and every shard (written at the end)
"""

from __future__ import annotations

import json
import logging
import os
import sys
import time
from dataclasses import dataclass

from mlm_pipeline import __version__, cas, fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.plan import Plan, Task, plan_tasks
from mlm_pipeline.progress import Progress
from mlm_pipeline.stats import merge_counts
from mlm_pipeline.task import TASKS_DIR, marker_url
from mlm_pipeline.tokenize import load_tokenizer
from mlm_pipeline.write.shards import clean_tmp

log = logging.getLogger("mlm_pipeline")

RUN_FILE = "_run.json"
MANIFEST = "manifest.json"
PLAN_FILE = "_plan.json"

ALGORITHM = 2
"""Version of the default-mode instance building, shuffling and masking: the same settings and
seed give the same bytes only under the same version, so a run started under another is not
resumed (2: instances shuffled as they are built, before masking)."""


class OutputError(ValueError):
    """The output location cannot be used (unwritable, or holds a run with other settings)."""


def _run_record(config: PrepareConfig, tokenizer_fp: str, plan: Plan) -> dict:
    return {
        "version": __version__,
        "algorithm": ALGORITHM,
        "settings": config.output_settings(),
        "output_fingerprint": config.output_fingerprint(),
        "tokenizer_fingerprint": tokenizer_fp,
        "plan_fingerprint": plan.fingerprint(),
        "tasks": len(plan.tasks),
    }


def _check_or_start_run(config: PrepareConfig, record: dict) -> None:
    url = fs.join(config.output, RUN_FILE)
    try:
        existing = json.loads(fs.read_bytes(url)) if fs.exists(url) else None
    except (OSError, json.JSONDecodeError) as exc:
        raise OutputError(f"cannot read {url}: {exc}") from exc
    if existing is None:
        try:  # a conditional create: of workers starting together, one writes it, the others compare
            if cas.create_bytes(url, json.dumps(record, indent=1, sort_keys=True).encode()):
                return
            existing = json.loads(fs.read_bytes(url))
        except OSError as exc:
            raise OutputError(f"cannot write to output {config.output}: {exc.strerror or exc}") from exc
    problems = []
    old, new = existing.get("settings", {}), record["settings"]
    for key in sorted(set(old) | set(new)):
        if old.get(key) != new.get(key):
            problems.append(f"{key.replace('_', '-')}: {old.get(key)!r} in the existing run, {new.get(key)!r} now")
    if existing.get("algorithm", 1) != record["algorithm"]:
        problems.append(
            f"the existing run was made by a version that builds other instances (algorithm "
            f"{existing.get('algorithm', 1)}, now {record['algorithm']}): finish it with that version"
        )
    if existing.get("tokenizer_fingerprint") != record["tokenizer_fingerprint"]:
        problems.append("the tokenizer differs from the one the existing run used")
    if not problems and existing.get("plan_fingerprint") != record["plan_fingerprint"]:
        problems.append("the input files changed (different files or sizes) since the existing run started")
    if problems:
        raise OutputError(
            f"{config.output} already holds a run with other settings; use a new --output or remove it.\n  "
            + "\n  ".join(problems)
        )


def _completed_markers(config: PrepareConfig, plan: Plan) -> dict[str, dict]:
    """Markers of tasks already done (marker present and its shards present)."""
    names = {os.path.basename(p) for p in fs.listdir(fs.join(config.output, TASKS_DIR))}
    shard_names = {os.path.basename(p) for p in fs.listdir(fs.join(config.output, "shards"))}
    done = {}
    for task in plan.tasks:
        if f"{task.task_id}.json" not in names:
            continue
        try:
            marker = json.loads(fs.read_bytes(marker_url(config.output, task.task_id)))
        except (OSError, json.JSONDecodeError):
            continue  # unreadable marker: redo the task
        if marker.get("output_fingerprint") != config.output_fingerprint():
            continue
        if all(os.path.basename(s["path"]) in shard_names for s in marker["shards"]):
            done[task.task_id] = marker
    return done


def build_manifest(config: PrepareConfig, record: dict, plan: Plan, markers: list[dict]) -> dict:
    markers = sorted(markers, key=lambda m: m["task_id"])
    shards = [s for m in markers for s in m["shards"]]
    totals = merge_counts([m["stats"] for m in markers])
    totals["shards"] = len(shards)
    totals["bytes_written"] = sum(s["bytes"] for s in shards)
    totals["files_skipped"] = {}
    for s in plan.skipped_files:
        totals["files_skipped"][s["reason"]] = totals["files_skipped"].get(s["reason"], 0) + 1
    return {
        "version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "format": config.format,
        "objective": config.objective,
        "masking": config.masking,
        "reference_mode": config.reference,
        "config": config.output_settings(),
        "output_fingerprint": record["output_fingerprint"],
        "tokenizer_fingerprint": record["tokenizer_fingerprint"],
        "inputs": plan.files,
        "skipped_files": plan.skipped_files,
        "tasks": len(plan.tasks),
        "split_bytes": plan.split_bytes,
        "shards": shards,
        "totals": totals,
    }


def default_workers() -> int:
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


@dataclass
class RunStart:
    """What every executor needs before running tasks: the plan, the run record, what is done."""

    plan: Plan
    record: dict
    done: dict[str, dict]

    @property
    def pending(self) -> list[Task]:
        return [t for t in self.plan.tasks if t.task_id not in self.done]


def start_run(config: PrepareConfig, *, clean: bool = True) -> RunStart:
    """Plan, check or record the run in ``OUTPUT/_run.json``, and find completed tasks.

    ``clean=False`` keeps ``OUTPUT/_tmp`` (other workers may be writing there: array and claim
    modes on a shared directory).
    """
    if getattr(config, "s3_endpoint_url", None):
        os.environ["AWS_ENDPOINT_URL"] = config.s3_endpoint_url  # before any S3 client exists
    tok = load_tokenizer(config.tokenizer, config.do_lower_case)  # fail early on a bad tokenizer
    plan = plan_tasks(config)
    for s in plan.skipped_files:
        log.warning("skipping %s: %s", s["path"], s.get("detail", s["reason"]))
    record = _run_record(config, tok.fingerprint, plan)
    _check_or_start_run(config, record)
    _save_plan(config, plan)
    if clean:
        clean_tmp(config.output)
    done = _completed_markers(config, plan)
    if done:
        log.info("resuming: %d of %d tasks already complete", len(done), len(plan.tasks))
    return RunStart(plan=plan, record=record, done=done)


def _save_plan(config: PrepareConfig, plan: Plan) -> None:
    """``OUTPUT/_plan.json``: what ``mlm-pipeline finalize`` needs to write the manifest alone."""
    url = fs.join(config.output, PLAN_FILE)
    blob = json.dumps(
        {"plan_fingerprint": plan.fingerprint(), "files": plan.files, "skipped_files": plan.skipped_files,
         "split_bytes": plan.split_bytes, "tasks": [t.to_dict() for t in plan.tasks]},
        indent=1, sort_keys=True,
    ).encode()
    if not fs.exists(url):
        fs.atomic_write_bytes(url, blob)  # same plan, same bytes: a racing writer writes the same


def write_manifest(config: PrepareConfig, record: dict, plan: Plan, markers: list[dict]) -> dict:
    manifest = build_manifest(config, record, plan, markers)
    fs.atomic_write_bytes(fs.join(config.output, MANIFEST), json.dumps(manifest, indent=1).encode())
    return manifest


def run_prepare(config: PrepareConfig, *, show_progress: bool | None = None) -> dict:
    """Run (or resume) ``prepare``; returns the manifest.

    With ``task_count`` or ``claim`` set, this process runs only its share of the tasks
    (:mod:`mlm_pipeline.executors.array`) and returns that worker's summary instead.
    """
    if getattr(config, "task_count", None) is not None or getattr(config, "claim", False):
        from mlm_pipeline.executors.array import run_distributed

        return run_distributed(config, show_progress=show_progress)
    start = start_run(config)
    pending = start.pending
    workers = config.workers or default_workers()
    workers = max(1, min(workers, len(pending))) if pending else 1
    markers = list(start.done.values())
    progress = Progress(
        total_bytes=sum(t.input_bytes for t in pending),
        total_tasks=len(pending),
        enabled=config.progress if show_progress is None else show_progress,
        stream=sys.stderr,
    )
    with progress:
        if config.executor == "ray":
            from mlm_pipeline.executors.ray import run_ray

            results = run_ray(pending, config, on_progress=progress.update)
        else:
            from mlm_pipeline.executors.local import run_local

            results = run_local(pending, config, workers, on_progress=progress.update)
        for marker in results:
            markers.append(marker)
            progress.task_done(marker)
    manifest = write_manifest(config, start.record, start.plan, markers)
    clean_tmp(config.output)  # only this process wrote there (array/claim workers never get here)
    return manifest
