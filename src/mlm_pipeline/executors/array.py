"""Scheduler-free scale-out: many ``prepare`` processes share one output.

**Array mode** (``--task-rank I --task-count N``): worker I runs the tasks whose plan index is
``I mod N`` (round robin, so big and small files spread evenly), skipping completed ones. The
rank and count default to a Slurm job array's ``SLURM_ARRAY_TASK_ID - SLURM_ARRAY_TASK_MIN`` and
``SLURM_ARRAY_TASK_COUNT``, or the rank to a Kubernetes Indexed Job's ``JOB_COMPLETION_INDEX``
(give ``--task-count`` = the Job's ``completions``). Every worker plans the same tasks from the
same inputs (the plan fingerprint in ``_run.json`` checks it), so no coordination is needed.

**Claim mode** (``--claim``): any number of identical workers (an autoscaling group, a managed
instance group, ``parallel`` on a few machines) take tasks through leases in
``OUTPUT/_leases/`` (:mod:`mlm_pipeline.claim`), up to ``--workers`` at a time each, renewing
them while they run. A worker keeps polling while other workers' tasks are unfinished, so a dead
worker's task is taken over when its lease expires; it exits when every task is done. An idle
worker costs one LIST of ``_tasks/`` and one of ``_leases/`` every ``min(2 s, lease / 4)``: it
reads only leases the listing shows unwritten for about a lease period.

In both modes the manifest is written once, by the first worker to see every task complete (or
by ``mlm-pipeline finalize``). Each call returns a summary of what this worker did.
"""

from __future__ import annotations

import datetime
import logging
import multiprocessing as mp
import os
import random
import sys
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Mapping

from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.executors.local import TaskFailed, _drain, _init_worker, _run
from mlm_pipeline.plan import Task
from mlm_pipeline.progress import Progress

log = logging.getLogger("mlm_pipeline")


def array_from_env(task_rank: int | None, task_count: int | None,
                   environ: Mapping[str, str] = os.environ) -> tuple[int | None, int | None]:
    """(rank, count) from flags, completed from Slurm / Kubernetes variables; (None, None): off."""

    def _int(name: str) -> int | None:
        value = environ.get(name)
        if value is None or value == "":
            return None
        try:
            return int(value)
        except ValueError:
            raise ValueError(f"{name}={value!r} is not an integer") from None

    slurm_id, slurm_count = _int("SLURM_ARRAY_TASK_ID"), _int("SLURM_ARRAY_TASK_COUNT")
    if task_count is None and slurm_count is not None:
        task_count = slurm_count
    if task_count is None:
        if task_rank is not None:
            raise ValueError("--task-rank needs --task-count")
        return None, None
    if task_rank is None:
        if slurm_id is not None:
            task_rank = slurm_id - (_int("SLURM_ARRAY_TASK_MIN") or 0)
        elif _int("JOB_COMPLETION_INDEX") is not None:
            task_rank = _int("JOB_COMPLETION_INDEX")
        else:
            raise ValueError("--task-count needs --task-rank (or SLURM_ARRAY_TASK_ID / JOB_COMPLETION_INDEX)")
    return task_rank, task_count


def _progress(config: PrepareConfig, tasks: list[Task], show_progress: bool | None) -> Progress:
    return Progress(total_bytes=sum(t.input_bytes for t in tasks), total_tasks=len(tasks),
                    enabled=config.progress if show_progress is None else show_progress, stream=sys.stderr)


def run_distributed(config: PrepareConfig, *, show_progress: bool | None = None) -> dict:
    """Run this worker's part (array or claim mode); returns a summary of what it did."""
    from mlm_pipeline.pipeline import start_run

    start = start_run(config, clean=False)  # other workers may be writing into OUTPUT/_tmp
    if config.claim:
        return run_claim(config, start, show_progress=show_progress)
    return run_array(config, start, show_progress=show_progress)


def _summary(config: PrepareConfig, mode: str, worker: str, ran: list[str], total: int, manifest: dict | None) -> dict:
    from mlm_pipeline.finalize import done_task_ids

    done = len(done_task_ids(config.output))
    return {"mode": mode, "worker": worker, "ran": ran, "tasks_total": total, "tasks_done": min(done, total),
            "manifest": manifest, "output": config.output}


def run_array(config: PrepareConfig, start, *, show_progress: bool | None = None) -> dict:
    from mlm_pipeline.executors.local import run_local
    from mlm_pipeline.finalize import finalize_if_complete
    from mlm_pipeline.pipeline import default_workers

    rank, count = config.task_rank, config.task_count
    mine = [t for t in start.plan.tasks if t.index % count == rank]
    pending = [t for t in mine if t.task_id not in start.done]
    log.info("array mode: worker %d of %d owns %d of %d tasks, %d to run", rank, count, len(mine),
             len(start.plan.tasks), len(pending))
    workers = max(1, min(config.workers or default_workers(), len(pending) or 1))
    ran = []
    with _progress(config, pending, show_progress) as progress:
        for marker in run_local(pending, config, workers, on_progress=progress.update):
            ran.append(marker["task_id"])
            progress.task_done(marker)
    manifest = finalize_if_complete(config, start.record, start.plan)
    return _summary(config, "array", f"{rank}/{count}", ran, len(start.plan.tasks), manifest)


class _Pool:
    """A pool of ``workers`` task processes (or this process when ``workers == 1``)."""

    def __init__(self, workers: int):
        self.workers = workers
        self._pool = None
        self._queue = None
        if workers > 1:
            ctx = mp.get_context("spawn")
            self._queue = ctx.Queue()
            self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self._queue,))

    def submit(self, task: Task, config: PrepareConfig, on_progress) -> Future:
        if self._pool is not None:
            return self._pool.submit(_run, task, config)
        from concurrent.futures import Future as _Future

        from mlm_pipeline.task import run_task

        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        fut: Future = _Future()
        try:
            fut.set_result(run_task(task, config, progress=on_progress))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - reported through the future
            fut.set_exception(exc)
        return fut

    def drain(self, on_progress) -> None:
        if self._queue is not None:
            _drain(self._queue, on_progress)

    def close(self, cancel: bool) -> None:
        if self._pool is not None:
            self._pool.shutdown(wait=not cancel, cancel_futures=True)
            if cancel:
                for p in list(getattr(self._pool, "_processes", {}).values()):
                    p.terminate()


def _timestamp(value) -> float | None:
    if isinstance(value, (int, float)):
        return float(value)
    if isinstance(value, datetime.datetime):
        return value.timestamp()
    if isinstance(value, str):
        try:
            return datetime.datetime.fromisoformat(value.replace("Z", "+00:00")).timestamp()
        except ValueError:
            return None
    return None


def lease_ages(leases_dir: str) -> dict[str, float | None]:
    """Task id -> seconds since its lease object was last written (None if the store does not say)."""
    filesystem, path = fs.get_fs(leases_dir)
    filesystem.invalidate_cache(path)
    try:
        entries = filesystem.ls(path, detail=True)
    except FileNotFoundError:
        return {}
    now = time.time()
    ages: dict[str, float | None] = {}
    for entry in entries:
        name = os.path.basename(str(entry.get("name", "")).rstrip("/"))
        if not name.endswith(".json"):
            continue
        written = None
        for key in ("LastModified", "mtime", "updated"):
            written = _timestamp(entry.get(key))
            if written is not None:
                break
        ages[name[: -len(".json")]] = None if written is None else now - written
    return ages


def run_claim(config: PrepareConfig, start, *, show_progress: bool | None = None, owner: str | None = None) -> dict:
    from mlm_pipeline.claim import LEASES_DIR, Heartbeat, LeaseManager, new_owner_id
    from mlm_pipeline.finalize import done_task_ids, finalize_if_complete
    from mlm_pipeline.pipeline import default_workers
    from mlm_pipeline.task import marker_url

    owner = owner or new_owner_id()
    manager = LeaseManager(config.output, owner, config.lease_seconds)
    poll = min(2.0, config.lease_seconds / 4)  # idle workers list _tasks/ and _leases/ this often
    tasks = {t.task_id: t for t in start.plan.tasks}
    order = list(tasks)
    random.Random(owner).shuffle(order)  # workers start at different tasks: fewer lost races
    workers = config.workers or default_workers()
    pool = _Pool(workers)
    in_flight: dict[Future, Task] = {}
    ran: list[str] = []
    manifest = None
    log.info("claim mode: worker %s, %d tasks, lease %.0fs, up to %d at a time", owner, len(tasks),
             config.lease_seconds, workers)
    progress = _progress(config, start.pending, show_progress)
    heartbeat = Heartbeat(manager)
    failed = True
    try:
        with progress, heartbeat:
            while True:
                done = done_task_ids(config.output)
                if len(done & tasks.keys()) == len(tasks) and not in_flight:
                    break
                running = {t.task_id for t in in_flight.values()}
                if len(in_flight) < workers:
                    leased = lease_ages(fs.join(config.output, LEASES_DIR))
                    free = [i for i in order if i not in done and i not in running and i not in leased]
                    # a lease written less than ~ttl ago (listing time) cannot have expired: reading
                    # only the others keeps idle workers at one LIST per poll at the tail of a run
                    stale = config.lease_seconds * 0.9
                    held = [i for i in order if i not in done and i not in running and i in leased
                            and (leased[i] is None or leased[i] >= stale)]
                    for task_id in free + held:  # held ones are taken only if their lease expired
                        if len(in_flight) >= workers:
                            break
                        lease = manager.try_acquire(task_id)
                        if lease is None:
                            continue
                        if fs.exists(marker_url(config.output, task_id)):  # finished meanwhile
                            manager.release(lease)
                            continue
                        heartbeat.add(lease)
                        log.info("task %s: claimed by %s", task_id, owner)
                        in_flight[pool.submit(tasks[task_id], config, progress.update)] = tasks[task_id]
                if not in_flight:
                    time.sleep(poll)  # the rest is held by others: wait for them (or their expiry)
                    continue
                finished, _ = wait(list(in_flight), timeout=poll, return_when=FIRST_COMPLETED)
                pool.drain(progress.update)
                for fut in finished:
                    task = in_flight.pop(fut)
                    lease = heartbeat.remove(task.task_id)
                    exc = fut.exception()
                    if exc is not None:
                        if lease is not None:
                            manager.release(lease)  # let another worker retry (and report) it
                        raise TaskFailed(task, exc) from exc
                    marker = fut.result()
                    if lease is not None:
                        manager.release(lease)
                    ran.append(task.task_id)
                    progress.task_done(marker)
                    manifest = manifest or finalize_if_complete(config, start.record, start.plan)
            failed = False
    finally:
        pool.close(cancel=failed)
        for task_id in list(heartbeat.leases):  # stopped early: free our tasks for the others now
            lease = heartbeat.remove(task_id)
            try:
                manager.release(lease)
            except Exception:  # noqa: BLE001 - it expires anyway
                pass
    manifest = manifest or finalize_if_complete(config, start.record, start.plan)
    return _summary(config, "claim", owner, ran, len(tasks), manifest)
