"""Local executor: a process pool on this machine (the default; nothing to set up).

Workers are started with ``spawn`` so none inherits a parent's already-initialised Rust thread
pool (the fork-after-Rayon trap), and each sets ``TOKENIZERS_PARALLELISM=false``: one tokenizer
thread per worker process, so N workers use N cores without oversubscription. Workers stream
small progress increments to the parent through a queue.
"""

from __future__ import annotations

import multiprocessing as mp
import os
import queue as queue_mod
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from typing import Callable, Iterator

from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.plan import Task

_progress_queue = None


def _init_worker(q) -> None:
    global _progress_queue
    os.environ["TOKENIZERS_PARALLELISM"] = "false"
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    _progress_queue = q


def _report(delta: dict) -> None:
    if _progress_queue is not None:
        _progress_queue.put(delta)


def _run(task: Task, config: PrepareConfig) -> dict:
    from mlm_pipeline.task import run_task

    return run_task(task, config, progress=_report)


class TaskFailed(RuntimeError):
    def __init__(self, task: Task, cause: BaseException):
        super().__init__(f"task {task.task_id} ({task.describe()}) failed: {type(cause).__name__}: {cause}")
        self.task = task
        self.cause = cause


def run_local(
    tasks: list[Task],
    config: PrepareConfig,
    workers: int,
    on_progress: Callable[[dict], None],
) -> Iterator[dict]:
    """Run tasks on ``workers`` processes, yielding each task's marker as it completes.

    With one worker the tasks run in this process (simplest to debug and profile).
    """
    if workers <= 1:
        os.environ["TOKENIZERS_PARALLELISM"] = "false"
        from mlm_pipeline.task import run_task

        for task in tasks:
            try:
                yield run_task(task, config, progress=on_progress)
            except (KeyboardInterrupt, SystemExit):
                raise
            except Exception as exc:
                raise TaskFailed(task, exc) from exc
        return
    ctx = mp.get_context("spawn")
    q = ctx.Queue()
    pool = ProcessPoolExecutor(max_workers=workers, mp_context=ctx, initializer=_init_worker, initargs=(q,))
    pending: dict[Future, Task] = {}
    try:
        for task in tasks:
            pending[pool.submit(_run, task, config)] = task
        while pending:
            done, _ = wait(list(pending), timeout=0.5, return_when=FIRST_COMPLETED)
            _drain(q, on_progress)
            for fut in done:
                task = pending.pop(fut)
                exc = fut.exception()
                if exc is not None:
                    raise TaskFailed(task, exc) from exc
                yield fut.result()
        _drain(q, on_progress)
    finally:
        if pending:
            # error or Ctrl-C: stop now; unfinished tasks have committed nothing visible
            for fut in pending:
                fut.cancel()
            for proc in list((getattr(pool, "_processes", None) or {}).values()):
                proc.terminate()
        pool.shutdown(wait=True, cancel_futures=True)


def _drain(q, on_progress: Callable[[dict], None]) -> None:
    while True:
        try:
            on_progress(q.get_nowait())
        except queue_mod.Empty:
            return
