"""The manifest of a run: built from the run record, the plan and every task's marker.

A single ``prepare`` process writes it when its tasks are done. Array and claim workers each run
part of the tasks and none knows in advance which finishes last, so each calls
:func:`finalize_if_complete` after a task: the first to see every task's marker (and its shards)
writes ``manifest.json`` with a conditional create, once even when several finish together.
``mlm-pipeline finalize OUTPUT`` (:func:`finalize`) does the same by hand from the output alone,
without the inputs or the tokenizer (``--force`` rewrites it).
"""

from __future__ import annotations

import io
import json
import logging
import shlex
import time
from typing import Iterable

from mlm_pipeline import __version__, cas, fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.languages import language_record
from mlm_pipeline.errors import IncompleteRun, InspectError
from mlm_pipeline.formats import run_files
from mlm_pipeline.formats.sink import tidy_tmp
from mlm_pipeline.masking import scheme_record
from mlm_pipeline.plan import Plan
from mlm_pipeline.run import layout
from mlm_pipeline.run.state import CompletedTasks, completed_tasks, done_task_ids, load_run

log = logging.getLogger("mlm_pipeline")

TOP_TOKENS_KEPT = 1000
"""The manifest keeps the run's 1000 most frequent tokens (of the tasks' summed top tokens), most
frequent first: a multilingual vocabulary would otherwise put a quarter of a million in it."""


def build_manifest(config: PrepareConfig, record: dict, plan: Plan, done: CompletedTasks | Iterable[dict]) -> dict:
    """The manifest: settings and fingerprints, inputs, every shard in task order, summed stats.

    ``done``: the completed tasks, or their markers."""
    if not isinstance(done, CompletedTasks):
        done = CompletedTasks.of(plan, done)
    shards = done.shards()
    totals = done.stats()
    if "top_token_counts" in totals:
        ranked = sorted(totals["top_token_counts"].items(), key=lambda kv: (-kv[1], kv[0]))
        totals["top_token_counts"] = dict(ranked[:TOP_TOKENS_KEPT])
    if "unknown_words" in totals:  # (each task's 50 most frequent, summed: the run's 100 first)
        ranked = sorted(totals["unknown_words"].items(), key=lambda kv: (-kv[1], kv[0]))
        totals["unknown_words"] = dict(ranked[:100])
    totals["shards"] = len(shards)
    totals["bytes_written"] = sum(f["bytes"] for s in shards for f in layout.shard_files(s))
    totals["files_skipped"] = {}
    for s in plan.skipped_files:
        totals["files_skipped"][s["reason"]] = totals["files_skipped"].get(s["reason"], 0) + 1
    return {
        "version": __version__,
        "created": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
        "format": config.format,
        "objective": config.objective,
        "masking": config.masking,
        "masking_scheme": scheme_record(config) if config.masking == "static" else None,
        "reference_mode": config.reference,
        "config": config.output_settings(),
        "output_fingerprint": record["output_fingerprint"],
        "tokenizer_fingerprint": record["tokenizer_fingerprint"],
        "inputs": plan.files,
        "skipped_files": plan.skipped_files,
        "tasks": len(plan.tasks),
        "split_bytes": plan.split_bytes,
        "tokenizer_backend": done.backends(),
        "shards": shards,
        "totals": totals,
        **({"languages": language_record(config.language_alpha, totals["languages"])} if "languages" in totals else {}),
        "task_timings": done.timings(),
    }


def _encode(manifest: dict) -> bytes:
    """``manifest.json``: a top-level key a line, and a line per item of a list (an input, a shard).

    The same JSON as ``json.dumps(manifest, indent=1)`` reads back, but written item by item
    with the C encoder: ``indent`` goes through Python's encoder (15 s for the 350,000 shards of
    a 10 TB run), and one big string is one more copy of the file in memory.
    """
    out = io.BytesIO()
    last = len(manifest) - 1
    out.write(b"{")
    for n, (key, value) in enumerate(manifest.items()):
        out.write(f"\n {json.dumps(key)}: ".encode())
        if isinstance(value, list) and value:
            out.write(b"[")
            for k, item in enumerate(value):
                out.write(f"{',' if k else ''}\n  {json.dumps(item)}".encode())
            out.write(b"\n ]")
        else:
            out.write(json.dumps(value, indent=1).replace("\n", "\n ").encode())
        if n < last:
            out.write(b",")
    out.write(b"\n}")
    return out.getvalue()


def write_manifest(config: PrepareConfig, record: dict, plan: Plan, done: CompletedTasks | Iterable[dict], *,
                   keep_same: bool = True) -> dict:
    """Build and write ``manifest.json``, replacing any that says otherwise; returns it. One that
    says the same but for its creation time is kept (``keep_same``), so that a run with nothing
    left to do leaves a complete output byte for byte as it was. ``done`` as in
    :func:`build_manifest`."""
    manifest = build_manifest(config, record, plan, done)
    url = layout.manifest_url(config.output)
    try:
        existing = parse_manifest(fs.read_bytes(url), config.output) if keep_same and fs.exists(url) else None
    except (OSError, InspectError):  # unreadable or damaged: written anew
        existing = None
    if existing is not None and {**existing, "created": None} == {**manifest, "created": None}:
        write_run_files(config.output, existing)
        return existing
    write_run_files(config.output, manifest)
    fs.atomic_write_bytes(url, _encode(manifest))
    return manifest


def write_run_files(output: str, manifest: dict) -> None:
    """Write the run's files beside its shards (:func:`mlm_pipeline.formats.run_files`), each
    atomically, unless it already holds those bytes; called before ``manifest.json`` is written.
    Every finisher writes the same bytes, so two that finish together leave the same files."""
    files = {fs.join(output, relative): data for relative, data in run_files(manifest).items()}
    # read as markers are (never through a link; None where there is none yet), all at once
    for (url, data), existing in zip(files.items(), fs.read_many(list(files))):
        if existing != data:  # a finished run's, as they are: nothing written (a read-only output)
            fs.atomic_write_bytes(url, data)


def write_manifest_once(config: PrepareConfig, record: dict, plan: Plan, done: CompletedTasks | Iterable[dict],
                        *, overwrite: bool = False) -> dict | None:
    """Write ``manifest.json`` unless one exists (``overwrite``: always); the manifest if written."""
    if overwrite:
        return write_manifest(config, record, plan, done, keep_same=False)
    manifest = build_manifest(config, record, plan, done)
    write_run_files(config.output, manifest)
    if cas.create_bytes(layout.manifest_url(config.output), _encode(manifest)):
        return manifest
    return None


def read_manifest(output: str, *, need: tuple[str, ...] = ("shards",)) -> dict:
    """The manifest of a finished run (``FileNotFoundError`` while it is not written;
    :class:`~mlm_pipeline.errors.InspectError` naming the file when it is not a manifest)."""
    layout.refuse_links(output)
    return parse_manifest(fs.read_bytes(layout.manifest_url(output)), output, need=need)


_KINDS = {"shards": list, "totals": dict}


def parse_manifest(data: bytes, output: str, *, need: tuple[str, ...] = ("shards",)) -> dict:
    """``data`` read from ``output``'s ``manifest.json`` as a manifest; :class:`InspectError` naming
    the file, and how to write it again, when it cannot be parsed or is not an object holding the
    entries ``need`` names (the list of shards; the totals, for a report)."""
    url = layout.manifest_url(output)
    again = f"`mlm-pipeline finalize {shlex.quote(output)} --force` writes it again from the task markers"
    try:
        manifest = json.loads(data)
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise InspectError(f"cannot parse {url} ({exc}); {again}") from None
    missing = [key for key in need if not isinstance(manifest, dict) or not isinstance(manifest.get(key), _KINDS[key])]
    if missing:
        raise InspectError(f"{url} is not a manifest of mlm-pipeline (no {' or '.join(missing)}); {again}")
    return manifest


def collect_completed(config: PrepareConfig, plan: Plan) -> CompletedTasks:
    """Every task, completed; raises :class:`IncompleteRun` if any marker is missing or stale."""
    done = completed_tasks(config, plan)
    if len(done) < len(plan.tasks):
        missing = [t.task_id for t in plan.tasks if t.task_id not in done]
        raise IncompleteRun(config.output, missing, len(plan.tasks))
    return done


_LAST_MISSING: dict[str, int] = {}
"""Output -> plan index of the last task that had no marker at this process's last listing. A
task of the current plan (the index is checked) gets a marker once done, so "still missing"
never holds for a complete run, whatever run set the entry."""


def finalize_if_complete(config: PrepareConfig, record: dict, plan: Plan) -> dict | None:
    """Write the manifest if every task is done and nobody wrote it yet; the manifest if written.

    Workers ask after every task, and listing the markers of a 10 TB run (200,000) is 200
    requests, half a second even on a local disk. So while the last task (in plan order) that
    the previous listing found missing still has no marker, one request says "not yet". Array
    workers run their tasks in plan order, so that task is among the last to finish; in any
    order a process lists the markers about log2(tasks) times in a run.
    """
    probe = _LAST_MISSING.get(config.output)
    if probe is not None and probe < len(plan.tasks):
        if not fs.exists(layout.marker_url(config.output, plan.tasks[probe].task_id)):
            return None
    names = done_task_ids(config.output)
    missing = [t.index for t in plan.tasks if t.task_id not in names]
    if missing:
        _LAST_MISSING[config.output] = missing[-1]
        return None  # one LIST says "not yet": no marker is read
    _LAST_MISSING.pop(config.output, None)
    try:
        done = collect_completed(config, plan)
    except IncompleteRun:
        return None
    manifest = write_manifest_once(config, record, plan, done)
    if manifest is not None:
        log.info("all %d tasks complete: wrote %s", len(plan.tasks), layout.manifest_url(config.output))
        # files and uploads of killed workers; a straggler's live ones are younger than its stall alarm
        tidy_tmp(config.output, older_than=dead_after(config))
    return manifest


def dead_after(config: PrepareConfig) -> float:
    """Seconds after which a temporary file or an upload nobody wrote to is a killed worker's: a
    live one shows progress within its stall time, or its lease lapses (a day if neither is set)."""
    return max(config.stall_seconds or 0, config.lease_seconds or 0) or 86400.0


def finalize(output: str, *, force: bool = False) -> tuple[dict, bool]:
    """``mlm-pipeline finalize``: (the manifest, whether this call wrote it).

    Raises :class:`IncompleteRun` when tasks are missing.
    """
    config, record, plan = load_run(output)
    done = collect_completed(config, plan)
    manifest = write_manifest_once(config, record, plan, done, overwrite=force)
    if manifest is not None:
        tidy_tmp(output, older_than=dead_after(config))
        return manifest, True
    return read_manifest(output), False


__all__ = ["build_manifest", "collect_completed", "finalize", "finalize_if_complete", "read_manifest",
           "write_manifest", "write_manifest_once", "write_run_files"]
