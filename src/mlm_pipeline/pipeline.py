"""The driver of ``prepare``: start or resume the run -> pick the tasks -> execute -> manifest.

The driver never reads corpus data (planning uses file sizes; a peek of a few KB per file detects
the format and binary files). What a run's directory holds and when a task counts as done is
:mod:`mlm_pipeline.run`'s business; where tasks run is an executor's (:mod:`mlm_pipeline.executors`).

A single process runs every pending task and writes the manifest. Workers sharing an output (array
mode: ``task_count``; claim mode: ``claim``) each run their part, and whichever sees every task
done first writes the manifest; each returns a summary of what it did.
"""

from __future__ import annotations

import logging
import os
import sys

from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.environment import configure_process
from mlm_pipeline.executors.array import task_share
from mlm_pipeline.executors.base import Executor
from mlm_pipeline.progress import Progress
from mlm_pipeline.run import layout
from mlm_pipeline.run.lock import RunLock
from mlm_pipeline.run.manifest import finalize_if_complete, write_manifest
from mlm_pipeline.run.state import CompletedTasks, RunStart, completed_tasks, done_task_ids, forget_rejected, start_run
from mlm_pipeline.formats.sink import clean_tmp

log = logging.getLogger("mlm_pipeline")


def executor_for(config: PrepareConfig) -> Executor:
    """The executor the config names (claim mode has its own); each is imported only when used."""
    if config.claim:
        from mlm_pipeline.executors.claim import ClaimExecutor

        return ClaimExecutor(config)
    if config.executor == "ray":
        from mlm_pipeline.executors.ray import RayExecutor

        return RayExecutor(config)
    from mlm_pipeline.executors.local import LocalExecutor

    return LocalExecutor(config)


def prepare(config: PrepareConfig | dict | None = None, /, *, show_progress: bool = False, **settings) -> dict:
    """``mlm-pipeline prepare`` from Python; returns the manifest (as ``manifest.json`` holds it).

    Give a :class:`PrepareConfig`, or its settings as keywords (the flags' names with ``_``:
    ``inputs``, ``output``, ``tokenizer``, ``max_seq_length``, ...), or a dict of them; keywords
    then override the config's values. Errors are the CLI's: :class:`~mlm_pipeline.errors.ConfigError`
    and the other :class:`~mlm_pipeline.errors.PipelineError` types, ``TaskFailed`` for a task.
    The progress line is off unless ``show_progress``.
    """
    from mlm_pipeline.config import build_config

    if isinstance(config, PrepareConfig):
        values = config.model_dump()
    elif config is None or isinstance(config, dict):
        values = dict(config or {})
    else:
        raise TypeError(f"prepare() takes a PrepareConfig or a dict, not {type(config).__name__}")
    values.update(settings)
    if isinstance(values.get("inputs"), (str, os.PathLike)):
        values["inputs"] = [values["inputs"]]
    if "inputs" in values:  # paths as str (pathlib.Path welcome)
        values["inputs"] = [os.fspath(i) for i in values["inputs"]]
    for key in ("output", "tokenizer"):
        if isinstance(values.get(key), os.PathLike):
            values[key] = os.fspath(values[key])
    return run_prepare(build_config(values), show_progress=show_progress)


def run_prepare(config: PrepareConfig, *, show_progress: bool | None = None) -> dict:
    """Run (or resume) ``prepare``; returns the manifest.

    With ``task_count`` or ``claim`` set, this process runs only its share of the tasks and returns
    that worker's summary instead: ``mode``, ``worker``, ``ran`` (task ids), ``tasks_total``,
    ``tasks_done``, ``output``, and ``manifest`` (if this worker wrote it, else None).
    """
    configure_process(config.s3_endpoint_url)  # before any S3 client exists
    shared = bool(config.claim or config.task_count is not None)
    # one plain run at a time on a local output; workers that share it on purpose (leases or the
    # task split keep them apart) hold the lock shared, which keeps a plain run out meanwhile
    with RunLock(config.output, shared=shared):
        return _run(config, shared, show_progress)


def _run(config: PrepareConfig, shared: bool, show_progress: bool | None) -> dict:
    start = start_run(config, clean=not shared)  # shared: other workers may be writing into _tmp/
    tasks = start.pending
    if config.task_count is not None:
        tasks = task_share(tasks, config.task_rank, config.task_count)
        log.info("array mode: worker %d of %d owns %d of %d tasks, %d to run", config.task_rank,
                 config.task_count, len(task_share(start.plan.tasks, config.task_rank, config.task_count)),
                 len(start.plan.tasks), len(tasks))
    # stale markers of the tasks this worker may run (an array worker: its share) are deleted
    forget_rejected(config.output, start.done, None if config.task_count is None else [t.task_id for t in tasks])
    done = start.done  # what the manifest needs of each completed task (not whole markers)
    # a resumed run in which a task fell back to HF goes on with HF (see _one_backend)
    executor = executor_for(config if shared or not done.fell_back else _with_reference(config, done.reference))
    ran: list[str] = []
    manifest = None
    progress = Progress(
        total_bytes=sum(t.input_bytes for t in tasks),
        total_tasks=len(tasks),
        enabled=config.progress if show_progress is None else show_progress,
        stream=sys.stderr,
    )
    with progress:
        for marker in executor.run(tasks, progress.update):
            done.add(marker)
            ran.append(marker["task_id"])
            progress.task_done(marker)
            if shared and manifest is None:
                manifest = finalize_if_complete(config, start.record, start.plan)
    if not shared:
        if ran:  # (an output complete before this run is left as it is)
            done = _one_backend(config, start, done)
        manifest = write_manifest(config, start.record, start.plan, done)
        clean_tmp(config.output)  # only this process wrote there
        return manifest
    manifest = manifest or finalize_if_complete(config, start.record, start.plan) or \
        _redo_rejected(config, start, executor, ran)
    return _worker_summary(config, start, executor, ran, manifest)


REDO_ROUNDS = 3


def _redo_rejected(config: PrepareConfig, start: RunStart, executor: Executor, ran: list[str]) -> dict | None:
    """A claim or array worker whose run has a marker for every task but no manifest, because some
    markers were rejected (a shard deleted or damaged after its task, a damaged marker): deletes
    them and runs those tasks again (an array worker: those of its share), then finalizes; the
    manifest if written. Otherwise every worker would find all markers, stop and exit 0 with the run
    incomplete, and VM groups that delete themselves on exit 0 would be gone (a later run's start
    redid them). None at once while tasks have no marker (other workers are running them)."""
    share = None if config.task_count is None else \
        {t.task_id for t in task_share(start.plan.tasks, config.task_rank, config.task_count)}
    for _ in range(REDO_ROUNDS):
        if fs.exists(layout.manifest_url(config.output)):
            return None
        names = done_task_ids(config.output)
        if any(t.task_id not in names for t in start.plan.tasks):
            return None
        done = completed_tasks(config, start.plan)
        redo = [t for t in start.plan.tasks if t.task_id in done.rejected and (share is None or t.task_id in share)]
        if not redo:  # every marker good now (another worker's last one came meanwhile): one of us writes it
            return finalize_if_complete(config, start.record, start.plan)
        log.warning("%d task(s) had a marker that was rejected (%s): running them again", len(redo),
                    ", ".join(t.task_id for t in redo[:8]) + (" ..." if len(redo) > 8 else ""))
        forget_rejected(config.output, done, [t.task_id for t in redo])
        ran.extend(marker["task_id"] for marker in executor.run(redo, lambda delta: None))
        manifest = finalize_if_complete(config, start.record, start.plan)
        if manifest is not None:
            return manifest
    return None


def _with_reference(config: PrepareConfig, reference: str) -> PrepareConfig:
    return config.model_copy(update={"tokenizer_backend": reference})


def _one_backend(config: PrepareConfig, start: RunStart, done: CompletedTasks) -> CompletedTasks:
    """One backend encodes a whole run: if a task's own text showed the fast backend differing
    from HF (its check fell back, for that task only), the tasks the fast backend encoded are run
    again with HF. Its difference may lie in their text too, past what their own checks read; and
    which tasks ran before the one that found it depends on the workers, never the bytes.
    Returns the completed tasks as they are then.

    Array and claim workers each see only their tasks: there each task's own check decides for it.
    It costs the tasks run again: a fallback means the fast backend is wrong on this corpus, which
    the self-check at load did not show (rare), and the run is then exact at about twice its time.
    """
    redo = done.encoded_fast() if done.fell_back else []
    if not redo:
        return done
    reference = done.reference
    log.warning("tokenizer backend: task %s showed a difference from %s on its own text; the %d task(s) the fast "
                "backend encoded are run again with %s, so that one backend encodes the whole run",
                done.fell_back, "HF" if reference == "hf" else reference, len(redo), reference)
    for task_id in redo:  # (a run stopped now redoes them on resume: its tasks go on with HF)
        fs.remove(layout.marker_url(config.output, task_id))
    wanted = set(redo)
    tasks = [t for t in start.plan.tasks if t.task_id in wanted]
    done = completed_tasks(config, start.plan)
    for marker in executor_for(_with_reference(config, reference)).run(tasks, lambda delta: None):
        done.add(marker)
    return done


def _worker_summary(config: PrepareConfig, start: RunStart, executor: Executor, ran: list[str],
                    manifest: dict | None) -> dict:
    if config.claim:
        mode, worker = "claim", executor.owner
    else:
        mode, worker = "array", f"{config.task_rank}/{config.task_count}"
    total = len(start.plan.tasks)
    return {"mode": mode, "worker": worker, "ran": ran, "tasks_total": total,
            "tasks_done": min(len(done_task_ids(config.output)), total), "manifest": manifest,
            "manifest_exists": manifest is not None or fs.exists(layout.manifest_url(config.output)),
            "output": config.output}
