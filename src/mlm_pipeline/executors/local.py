"""Local executor: a process pool on this machine (the default; nothing to set up).

Workers are started with ``spawn`` so none inherits a parent's already-initialised Rust thread
pool (the fork-after-Rayon trap), and each runs one tokenizer thread
(:func:`~mlm_pipeline.environment.configure_process`), so N workers use N cores without
oversubscription. Workers stream small progress increments to the parent through a queue. With
one worker, tasks run in this process, one at a time (simplest to debug and profile).

:class:`TaskPool` is the pool itself; the claim executor runs its tasks on one too.
"""

from __future__ import annotations

import multiprocessing as mp
import queue as queue_mod
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Iterable, Iterator, Sequence

from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.environment import configure_process
from mlm_pipeline.errors import TaskFailed
from mlm_pipeline.executors.base import Failures, ProgressFn, default_workers, run_one
from mlm_pipeline.plan import Task

_progress_queue = None  # in a pool worker: where its progress increments go


def _init_worker(progress_queue, s3_endpoint_url: str | None) -> None:
    global _progress_queue
    configure_process(s3_endpoint_url, runs_tasks=True)
    _progress_queue = progress_queue


def _report(delta: dict) -> None:
    if _progress_queue is not None:
        _progress_queue.put(delta)


def _run_in_worker(task: Task, config: PrepareConfig) -> dict:
    return run_one(task, config, progress=_report)


class TaskPool:
    """``workers`` spawned processes running tasks, or this process when ``workers`` is 1."""

    def __init__(self, config: PrepareConfig, workers: int):
        self.config = config
        self.workers = workers
        self._pool = None
        self._queue = None
        if workers > 1:
            ctx = mp.get_context("spawn")
            self._queue = ctx.Queue()
            self._pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker,
                                             initargs=(self._queue, config.s3_endpoint_url))
        else:
            configure_process(config.s3_endpoint_url, runs_tasks=True)

    @property
    def in_process(self) -> bool:
        return self._pool is None

    def submit(self, task: Task, on_progress: ProgressFn) -> Future:
        """Start ``task``; in this process it runs to the end before this returns."""
        if self._pool is not None:
            return self._pool.submit(_run_in_worker, task, self.config)
        fut: Future = Future()
        try:
            fut.set_result(run_one(task, self.config, progress=on_progress))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - reported through the future
            fut.set_exception(exc)
        return fut

    def wait(self, futures: Iterable[Future], on_progress: ProgressFn, timeout: float = 0.5) -> set[Future]:
        """The futures done within ``timeout`` (at least one if any is done); passes progress on."""
        done, _ = wait(list(futures), timeout=timeout, return_when=FIRST_COMPLETED)
        self.drain(on_progress)
        return done

    def drain(self, on_progress: ProgressFn) -> None:
        while self._queue is not None:
            try:
                on_progress(self._queue.get_nowait())
            except queue_mod.Empty:
                return

    def close(self, *, cancel: bool) -> None:
        """Shut the pool down; ``cancel`` (an error or Ctrl-C): stop running tasks now."""
        if self._pool is None:
            return
        if cancel:  # unfinished tasks have committed nothing visible
            for proc in list((getattr(self._pool, "_processes", None) or {}).values()):
                proc.terminate()
        self._pool.shutdown(wait=True, cancel_futures=True)


def finished(task: Task, fut: Future) -> dict:
    """A finished future's marker, or :class:`TaskFailed` naming the task."""
    exc = fut.exception()
    if exc is not None:
        raise TaskFailed(task, exc) from exc
    return fut.result()


class LocalExecutor:
    """Runs tasks on a :class:`TaskPool` of ``config.workers`` processes (0: every CPU)."""

    def __init__(self, config: PrepareConfig):
        self.config = config

    def run(self, tasks: Sequence[Task], on_progress: ProgressFn) -> Iterator[dict]:
        if not tasks:
            return
        workers = max(1, min(self.config.workers or default_workers(), len(tasks)))
        pool = TaskPool(self.config, workers)
        queued = list(reversed(tasks))
        # a process pool takes every task at once (it queues them); this process, one at a time
        slots = 1 if pool.in_process else len(tasks)
        in_flight: dict[Future, Task] = {}
        failures = Failures(len(tasks))
        interrupted = True
        try:
            while queued or in_flight:
                while queued and len(in_flight) < slots:
                    task = queued.pop()
                    in_flight[pool.submit(task, on_progress)] = task
                for fut in pool.wait(in_flight, on_progress):
                    try:
                        marker = finished(in_flight.pop(fut), fut)
                    except TaskFailed as failure:
                        failures.add(failure)
                        continue
                    yield marker
            pool.drain(on_progress)  # increments sent just before the last result
            interrupted = False
        finally:
            pool.close(cancel=interrupted)
        failures.raise_if_any()
