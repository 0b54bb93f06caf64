"""The executor contract: run these tasks, report progress, yield each task's marker.

An executor decides only *where* and *how many at a time* tasks run. The driver
(:func:`mlm_pipeline.pipeline.run_prepare`) hands it the tasks still to do, already filtered to
this worker's share in array mode (:mod:`.array`); the executor

* runs each task through :func:`run_one` in whatever process it uses,
* calls ``on_progress`` with small increments (``{"bytes", "documents", "tokens"}``), each
  naming its task under :data:`PROGRESS_TASK` (a task run again reports its increments again),
* yields each finished task's marker (which the task itself already wrote, last) as it completes,
* when a task raises, goes on with the other tasks (one bad input piece must not cost the rest
  of the run), then raises :class:`~mlm_pipeline.errors.TaskFailed` naming the first failed task
  (:class:`Failures`); a rerun of the same command redoes only the failed tasks. A task stopped
  on the way out (Ctrl-C) has no marker, so it does not count, though shards it filled may be
  committed: its rerun writes them again, byte for byte, and deletes any beyond its own.

Which tasks are done, resuming, and the manifest belong to :mod:`mlm_pipeline.run`; an executor
never writes them and never imports the driver. Adding an executor is one module with a class
following :class:`Executor`, plus its name in :func:`mlm_pipeline.pipeline.executor_for`.
"""

from __future__ import annotations

import logging
import os
from typing import Iterator, Protocol, Sequence

from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.environment import quiet_collector
from mlm_pipeline.errors import TaskFailed
from mlm_pipeline.plan import Task
from mlm_pipeline.task import ProgressFn, run_task
from mlm_pipeline.tokenize import unspellable_word_error

PROGRESS_TASK = "_task"  # the key of a progress increment that names its task (its id)


class Executor(Protocol):
    """Runs tasks somewhere; built from the run's config (``Executor(config)``)."""

    def run(self, tasks: Sequence[Task], on_progress: ProgressFn) -> Iterator[dict]:
        """Run ``tasks``; yield each one's marker as it completes (any order)."""
        ...


def run_one(task: Task, config: PrepareConfig, progress: ProgressFn | None = None) -> dict:
    """The body of one task in whichever process runs it; returns the task's marker.

    The process's environment is set by its executor's entry point before this is called
    (:func:`mlm_pipeline.environment.configure_process`); the garbage collector is tuned here, for
    the task only (:func:`mlm_pipeline.environment.quiet_collector`).
    """
    with quiet_collector():
        try:
            return run_task(task, config, progress=progress)
        except Exception as exc:
            if (named := unspellable_word_error(exc, config.tokenizer)) is not None:
                raise named from exc
            raise


log = logging.getLogger("mlm_pipeline")


class Failures:
    """The tasks that failed while an executor went on with the others."""

    def __init__(self, total: int):
        self.total = total
        self.failed: list[TaskFailed] = []

    def add(self, failure: TaskFailed) -> None:
        log.error("%s", failure)  # as it happens: the run goes on with the other tasks
        self.failed.append(failure)

    def raise_if_any(self) -> None:
        """Raise the first failure, saying how the rest of the run went and how to finish it; its
        ``outcome`` says the latter alone (each failure was logged as it happened, so the CLI
        does not print the first again)."""
        if not self.failed:
            return
        first = self.failed[0]
        n = len(self.failed)
        named = ", ".join(f.task.task_id for f in self.failed[:5]) + (" ..." if n > 5 else "")
        plural = "s" if n > 1 else ""
        first.outcome = (f"{n} of {self.total} tasks failed, the other {self.total - n} completed (task{plural} "
                         f"{named}: the error{plural} above); fix the cause and run the same command again: only the "
                         "failed tasks are redone")
        first.args = (f"{first}\n  {n} of {self.total} tasks failed, the other {self.total - n} completed; "
                      "fix the cause and run the same command again: only the failed tasks are redone",)
        raise first


def default_workers() -> int:
    """The CPUs this process may use (``--workers 0``)."""
    try:
        return max(1, len(os.sched_getaffinity(0)))
    except AttributeError:  # not on Linux
        return max(1, os.cpu_count() or 1)


def worker_count(requested: int | None) -> int:
    """The worker processes to start for ``--workers requested`` (0 or None: one per CPU this
    process may use). More than the usable CPUs only adds memory and contention, so a larger
    number is lowered to the CPU count, with a warning."""
    cpus = default_workers()
    if not requested:
        return cpus
    if requested > cpus:
        log.warning("--workers %d is more than the %d CPU(s) this process may use: starting %d", requested, cpus, cpus)
        return cpus
    return requested


__all__ = ["Executor", "Failures", "ProgressFn", "default_workers", "run_one", "worker_count"]
