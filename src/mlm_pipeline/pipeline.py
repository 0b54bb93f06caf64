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
from dataclasses import dataclass, replace

from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.environment import configure_process
from mlm_pipeline.executors.array import task_share
from mlm_pipeline.executors.base import Executor
from mlm_pipeline.languages import sample_plan
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


def plan_prepare(config: PrepareConfig) -> dict:
    """``prepare --dry-run``: what a run checks before its first task (the settings, the tokenizer,
    the inputs: a bad one fails here as it would on every worker) and the tasks it would run.
    Nothing is written and the output is not read; returns ``tasks``, ``input_bytes``,
    ``split_bytes``, ``files`` and ``skipped_files`` (as the manifest names them)."""
    configure_process(config.s3_endpoint_url)
    plan = start_run(config, dry_run=True).plan
    return {"tasks": len(plan.tasks), "input_bytes": plan.input_bytes, "split_bytes": plan.split_bytes,
            "files": plan.files, "skipped_files": plan.skipped_files}


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
    if config.language_alpha is not None:  # the languages' rates, from a counting pass (languages.py)
        start = replace(start, plan=sample_plan(config, start.plan, _pool_map(config)))
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
    end = _End(manifest, len(start.plan.tasks), True) if manifest is not None else \
        _finish(config, start, executor, ran)
    return _worker_summary(config, start, executor, ran, end)


def _pool_map(config: PrepareConfig):
    """``map_tasks`` for a pass over the tasks other than the run itself (the languages' token
    count): a process pool of ``--workers`` processes on this machine, results in task order."""
    def map_tasks(fn, tasks, cfg):
        import multiprocessing as mp
        from concurrent.futures import ProcessPoolExecutor

        from mlm_pipeline.executors.base import worker_count
        from mlm_pipeline.executors.local import start_method

        workers = min(worker_count(cfg.workers), len(tasks))
        if workers <= 1:
            return [fn(task, cfg) for task in tasks]
        with ProcessPoolExecutor(workers, mp_context=mp.get_context(start_method()), initializer=configure_process,
                                 initargs=(cfg.s3_endpoint_url,)) as pool:
            return list(pool.map(fn, tasks, [cfg] * len(tasks)))

    return map_tasks


REDO_ROUNDS = 3


@dataclass
class _End:
    """How a claim or array worker ends, as one look at the output saw it: the manifest if this
    worker wrote it, the tasks with a marker, and whether ``manifest.json`` exists."""

    manifest: dict | None
    tasks_done: int
    manifest_exists: bool


def _finish(config: PrepareConfig, start: RunStart, executor: Executor, ran: list[str]) -> _End:
    """The end of a claim or array worker whose tasks are done and that has not written the manifest.

    It looks at the output: a manifest ends it; a task without a marker is another worker's, still
    running, and that worker looks again after writing its marker; every marker there but no
    manifest, this worker writes it (a conditional create: of workers ending together one wins).
    Markers that were rejected (a shard deleted or damaged after its task, a damaged marker) are
    deleted and their tasks run again (an array worker: those of its share), then it looks again;
    else every worker would find all markers and exit 0 with the run incomplete, and VM groups
    that delete themselves on exit 0 would be gone.

    The worker reports what its last look saw, not a count taken later: another worker's last
    marker may land in between, its manifest a moment after, and the later count showed a complete
    run without a manifest, a broken run's exit 1."""
    total = len(start.plan.tasks)
    share = None if config.task_count is None else \
        {t.task_id for t in task_share(start.plan.tasks, config.task_rank, config.task_count)}
    url = layout.manifest_url(config.output)
    rounds = 0
    while True:
        manifest = finalize_if_complete(config, start.record, start.plan)
        if manifest is not None:
            return _End(manifest, total, True)
        names = done_task_ids(config.output)
        seen = sum(t.task_id in names for t in start.plan.tasks)
        if fs.exists(url):  # another worker wrote it (checked after the listing: it comes after every marker)
            return _End(None, seen, True)
        if seen < total:  # another worker's task, running: that worker looks again after marking it
            return _End(None, seen, False)
        if rounds == REDO_ROUNDS:  # every task marked and still no manifest (the CLI exits 1)
            return _End(None, seen, False)
        rounds += 1
        done = completed_tasks(config, start.plan)
        redo = [t for t in start.plan.tasks if t.task_id in done.rejected and (share is None or t.task_id in share)]
        if redo:  # (none: the last marker came meanwhile, and the next round writes the manifest)
            log.warning("%d task(s) had a marker that was rejected (%s): running them again", len(redo),
                        ", ".join(t.task_id for t in redo[:8]) + (" ..." if len(redo) > 8 else ""))
            forget_rejected(config.output, done, [t.task_id for t in redo])
            ran.extend(marker["task_id"] for marker in executor.run(redo, lambda delta: None))


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


def _worker_summary(config: PrepareConfig, start: RunStart, executor: Executor, ran: list[str], end: _End) -> dict:
    if config.claim:
        mode, worker = "claim", executor.owner
    else:
        mode, worker = "array", f"{config.task_rank}/{config.task_count}"
    return {"mode": mode, "worker": worker, "ran": ran, "tasks_total": len(start.plan.tasks),
            "tasks_done": end.tasks_done, "manifest": end.manifest, "manifest_exists": end.manifest_exists,
            "output": config.output}
