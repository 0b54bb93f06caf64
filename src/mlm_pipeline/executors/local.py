"""Local executor: a process pool on this machine (the default; nothing to set up).

Workers are forked from this process where that is safe, and spawned otherwise
(:func:`start_method`): a forked worker starts in milliseconds with everything already imported,
where a spawned one pays a fresh interpreter and its imports first (0.25-0.3 s, measured on a
2-vCPU VM), which on a run of a few seconds is most of what two workers lose against one. Each
worker runs one tokenizer thread (:func:`~mlm_pipeline.environment.configure_process`), so N
workers use N cores without oversubscription. Workers stream small progress increments to the
parent through a queue. With one worker, tasks run in this process, one at a time (simplest to
debug and profile).

A task that shows no progress for ``--stall-seconds`` (it reports each block it processes) is
deemed hung, on a read that never returns or a stopped process: in a pool its worker is killed and
the task is run again like one whose worker died; in this process a ``SIGALRM`` raises
:class:`TaskStalled` inside it (on the main thread; elsewhere there is no alarm), and it is run again.

:class:`TaskPool` is the pool itself; the claim executor runs its tasks on one too.
"""

from __future__ import annotations

import logging
import multiprocessing as mp
import os
import queue as queue_mod
import signal
import sys
import threading
import time
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from concurrent.futures.process import BrokenProcessPool
from typing import Callable, Iterable, Iterator, Sequence

from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.environment import configure_process, freeze_inherited_objects, one_blas_thread
from mlm_pipeline.errors import TaskFailed
from mlm_pipeline.executors.base import PROGRESS_TASK, Failures, ProgressFn, run_one, worker_count
from mlm_pipeline.plan import Task

log = logging.getLogger("mlm_pipeline")

_progress_queue = None  # in a pool worker: where its progress increments go

MAX_WORKER_DEATHS = 3
"""How often a task may lose its worker (killed by a signal, out of memory, crashed, ended as hung)
before the run gives up on it; each time it is run again in a new worker."""


class TaskStalled(RuntimeError):
    """A task running in this process showed no progress for ``--stall-seconds``, each time it ran."""


class _Stalled(BaseException):
    """Raised by the stall alarm inside a task: a ``BaseException``, so that no ``except Exception``
    of the reading code (a decompressor's or Parquet's "corrupt input" wrappers) takes it for an
    error of the input; :func:`run_with_stall_alarm` catches it."""


class _StallAlarm:
    """``SIGALRM`` after ``seconds`` without :meth:`rearm`, raising :class:`_Stalled` in the task
    this process runs. Only on the main thread (where Python runs signal handlers), only where the
    platform has ``setitimer``, and only when nobody else handles ``SIGALRM``; otherwise inert. The
    signal interrupts a blocking system call too (a socket read), and fsspec's waits for its I/O
    thread wake up every second, so a hung read ends within about a second of the limit."""

    def __init__(self, seconds: float, task_id: str):
        self.seconds = seconds
        self.task_id = task_id
        self.active = bool(seconds) and hasattr(signal, "setitimer") \
            and threading.current_thread() is threading.main_thread() \
            and signal.getsignal(signal.SIGALRM) in (signal.SIG_DFL, None)
        self._previous = None

    def _fire(self, signum, frame) -> None:
        if self.active:
            # the previous handler back before raising: the exception may leave ``with`` from any
            # point, ``__exit__`` included, and a handler left behind would keep every later
            # alarm of this process off (a Ray worker runs many tasks)
            self._restore()
            raise _Stalled(f"task {self.task_id} showed no progress for {self.seconds:g} s (--stall-seconds)")

    def __enter__(self) -> "_StallAlarm":
        if self.active:
            self._previous = signal.signal(signal.SIGALRM, self._fire)
            try:
                self.rearm()
            except BaseException:
                self._restore()
                raise
        return self

    def rearm(self) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, self.seconds)

    def __exit__(self, *exc) -> None:
        if self.active:
            signal.setitimer(signal.ITIMER_REAL, 0)
            self._restore()

    def _restore(self) -> None:
        """Inert again (a signal already on its way raises nothing now), the previous handler back
        (``SIG_DFL`` where it was not set from Python: ``getsignal`` gives None)."""
        self.active = False
        signal.signal(signal.SIGALRM, self._previous if self._previous is not None else signal.SIG_DFL)


def run_with_stall_alarm(task: Task, config: PrepareConfig, on_progress: ProgressFn | None = None, *,
                         alive: Callable[[], None] = lambda: None) -> dict:
    """``task`` in this process, run again (up to :data:`MAX_WORKER_DEATHS` times in all) when its
    stall alarm (``config.stall_seconds``) ends it; :class:`TaskStalled` after the last try.
    ``alive`` is called as each try starts and at each progress report."""
    tid = task.task_id
    for attempt in range(1, MAX_WORKER_DEATHS + 1):
        alive()
        marker = None
        try:  # (around ``with``: the alarm may also go off as the task returns, in ``__exit__``)
            with _StallAlarm(config.stall_seconds, tid) as alarm:

                def progress(delta: dict) -> None:
                    alarm.rearm()
                    alive()
                    if on_progress is not None:
                        on_progress(delta)

                marker = run_one(task, config, progress=progress)
            return marker
        except _Stalled as exc:
            if marker is not None:  # it went off after the task was done
                return marker
            if attempt == MAX_WORKER_DEATHS:
                raise TaskStalled(f"{exc}; it stalled {attempt} times, giving up") from None
            log.warning("%s; running it again (%d of %d)", exc, attempt + 1, MAX_WORKER_DEATHS)
    raise AssertionError("unreachable")


def _watch_parent(parent_pid: int) -> None:
    """End this worker when the process that started it dies (kill -9 of ``prepare``), so that no
    worker outlives its run: on Linux the kernel sends SIGKILL at once (``PR_SET_PDEATHSIG``);
    elsewhere, and as a backstop, a thread checks the parent every half second."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, signal.SIGKILL, 0, 0, 0)  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        pass
    if os.getppid() != parent_pid:  # the parent died before the line above took effect
        os._exit(1)

    def watch() -> None:
        while os.getppid() == parent_pid:
            time.sleep(0.5)
        os._exit(1)

    threading.Thread(target=watch, name="parent-watch", daemon=True).start()


def start_method() -> str:
    """``fork`` on Linux while this process runs no thread but its main one; else ``spawn``.

    Forking copies the process as it is, locks included: a lock another thread holds at that
    moment (the S3 client's event loop that fsspec starts, the claim executor's lease heartbeat,
    an application's own threads) stays locked in the child for good. With no other Python thread
    nothing can hold one. The native pools that may exist (OpenBLAS, Arrow, the Rust tokenizers')
    reset themselves in a forked child by design, and workers never use a tokenizer's own thread
    pool. macOS and Windows always spawn: fork is unsafe with macOS's system frameworks and absent
    on Windows.
    """
    if sys.platform.startswith("linux") and threading.active_count() == 1:
        return "fork"
    return "spawn"


def _init_worker(progress_queue, s3_endpoint_url: str | None, parent_pid: int) -> None:
    global _progress_queue
    _watch_parent(parent_pid)
    # a forked worker inherits the parent's handlers: SIGTERM must end it (the pool's terminate),
    # not raise the parent's "stop the run" exception inside a task
    signal.signal(signal.SIGTERM, signal.SIG_DFL)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # Ctrl-C: the parent stops the pool
    freeze_inherited_objects()
    configure_process(s3_endpoint_url, runs_tasks=True)
    _progress_queue = progress_queue


def _report(delta: dict) -> None:
    if _progress_queue is not None:
        _progress_queue.put(delta)


_STARTED = "_started"  # a worker's message: it runs this task (id, pid), so a death names its task


def _run_in_worker(task: Task, config: PrepareConfig) -> dict:
    _report({_STARTED: task.task_id, "pid": os.getpid()})
    return run_one(task, config, progress=lambda delta: _report({**delta, PROGRESS_TASK: task.task_id}))


def describe_exit(exitcode: int | None) -> str:
    """How a process ended, for a message: ``killed by SIGKILL (...)``, ``exited with status 3``."""
    if exitcode is None:
        return "ended"
    if exitcode < 0:
        try:
            name = signal.Signals(-exitcode).name
        except ValueError:
            name = f"signal {-exitcode}"
        hint = " (the kernel's out-of-memory killer sends this signal)" if -exitcode == signal.SIGKILL else ""
        return f"killed by {name}{hint}"
    return f"exited with status {exitcode}"


class WorkerDied(RuntimeError):
    """A task's worker process died under it ``MAX_WORKER_DEATHS`` times."""


class TaskPool:
    """``workers`` processes running tasks (forked or spawned: :func:`start_method`), or this
    process when ``workers`` is 1.

    A worker that dies (a signal, the out-of-memory killer, a crash) breaks the process pool; the
    pool is then started again and the tasks it was running are submitted again, so one lost worker
    costs one task's work, not the run. The task the dead worker ran is charged one death; after
    :data:`MAX_WORKER_DEATHS` it fails with :class:`WorkerDied`, saying which worker died and how.

    The pool also keeps, per running task, when it last showed progress (:meth:`silent_for`); a
    task silent for ``config.stall_seconds`` has its worker killed (:meth:`_end_stalled`), which
    then counts as one death.
    """

    def __init__(self, config: PrepareConfig, workers: int):
        self.config = config
        self.workers = workers
        self._pool = None
        self._queue = None
        self._ctx = None
        self._jobs: dict[Future, list] = {}  # ours -> [task, the pool's future, deaths]
        self._running: dict[int, str] = {}  # worker pid -> the task id it last started
        self._fruitless = 0  # pool restarts in a row that charged no task
        self.stall_seconds = float(config.stall_seconds or 0)
        self._last_life: dict[str, float] = {}  # running task id -> monotonic time of its last progress
        self._ended: dict[int, float] = {}  # worker pid -> the seconds of silence it was killed after
        self._last_message = time.monotonic()  # from any worker (or since tasks were waiting)
        self._abandoned = False  # a task given up on may still run in the pool
        if workers > 1:
            self._start_pool()
        else:
            configure_process(config.s3_endpoint_url, runs_tasks=True)

    def _start_pool(self) -> None:
        # chosen again at each (re)start: threads may have come or gone since
        self._ctx = mp.get_context(start_method())
        if self._ctx.get_start_method() != "fork":
            one_blas_thread()  # a spawned worker imports numpy before any code of ours runs in it
        # a fresh queue with each pool: a worker killed while sending holds the old queue's lock
        self._queue = self._ctx.Queue()
        self._pool = ProcessPoolExecutor(max_workers=self.workers, mp_context=self._ctx, initializer=_init_worker,
                                         initargs=(self._queue, self.config.s3_endpoint_url, os.getpid()))
        if self._ctx.get_start_method() == "fork":
            # A forked worker inherits unwritten output buffers, which it flushes again when it exits.
            for stream in (sys.stdout, sys.stderr):
                if stream is not None:
                    stream.flush()
            # The pool forks its workers on its first submit. That must be now, while this process has
            # no other thread: a caller may start one before submitting (the claim executor's lease heartbeat).
            self._pool.submit(os.getpid)

    @property
    def in_process(self) -> bool:
        return self._pool is None

    @property
    def start_method(self) -> str | None:
        """How the current pool's workers start (``fork``, ``spawn``); None in this process."""
        return None if self._ctx is None else self._ctx.get_start_method()

    def silent_for(self, task_id: str) -> float:
        """Seconds since ``task_id`` last showed progress (0 while it waits for a worker or once it
        is done). In a pool this is what the last :meth:`wait` or :meth:`drain` passed on: a caller
        that stops waiting sees its tasks fall silent. Safe to call from another thread."""
        last = self._last_life.get(task_id)
        return 0.0 if last is None else max(0.0, time.monotonic() - last)

    def submit(self, task: Task, on_progress: ProgressFn) -> Future:
        """Start ``task``; in this process it runs to the end before this returns."""
        fut: Future = Future()
        if self._pool is not None:
            if not self._jobs:  # an idle pool's silence is not a stall
                self._last_message = time.monotonic()
            self._jobs[fut] = [task, self._submit_to_pool(task), 0]
            return fut
        try:
            fut.set_result(self._run_here(task, on_progress))
        except (KeyboardInterrupt, SystemExit):
            raise
        except Exception as exc:  # noqa: BLE001 - reported through the future
            fut.set_exception(exc)
        return fut

    def _run_here(self, task: Task, on_progress: ProgressFn) -> dict:
        """``task`` in this process, under the stall alarm (:func:`run_with_stall_alarm`)."""
        tid = task.task_id
        try:
            return run_with_stall_alarm(task, self.config, on_progress,
                                        alive=lambda: self._last_life.__setitem__(tid, time.monotonic()))
        finally:
            self._last_life.pop(tid, None)

    def _submit_to_pool(self, task: Task) -> Future:
        """The pool's future of ``task``. A pool a worker broke since the last ``wait`` refuses
        new work: the task then gets a future failed as the pool's own futures fail, and the next
        ``wait`` starts a new pool for it like for them."""
        try:
            return self._pool.submit(_run_in_worker, task, self.config)
        except BrokenProcessPool as exc:
            broken = exc
        except OSError as exc:
            # A spawned pool starts a worker inside submit, pickling the pool's pipes for it. If a
            # worker dies just then, the pool's manager thread marks the pool broken and closes
            # those pipes under submit ("handle is closed"): a broken pool as above, not an error.
            if not getattr(self._pool, "_broken", False):
                raise
            broken = BrokenProcessPool(f"the process pool broke while it started a worker ({exc})")
            broken.__cause__ = exc
        refused: Future = Future()
        refused.set_exception(broken)
        return refused

    def wait(self, futures: Iterable[Future], on_progress: ProgressFn, timeout: float = 0.5) -> set[Future]:
        """The futures done within ``timeout`` (at least one if any is done); passes progress on."""
        futures = list(futures)
        if self._pool is not None:
            inner = {self._jobs[f][1]: f for f in futures if f in self._jobs}
            done_inner, _ = wait(list(inner), timeout=timeout, return_when=FIRST_COMPLETED)
            self.drain(on_progress)
            if any(isinstance(f.exception(), BrokenProcessPool) for f in done_inner):
                self._restart(on_progress)
            else:
                for f in done_inner:
                    self._settle(inner[f], f)
                self._end_stalled()
        done, _ = wait(futures, timeout=0)
        self.drain(on_progress)
        return done

    def _end_stalled(self) -> None:
        """Kill the worker of each task silent for ``stall_seconds``: the pool breaks, and
        :meth:`_restart` runs the task again, charging it one death. A worker that hangs before
        its first message names its task never shows up here; if no worker at all has said
        anything for that long while tasks wait, every worker of the pool is killed."""
        if not self.stall_seconds or not self._jobs:
            return
        pending = {task.task_id for task, inner, _ in self._jobs.values() if not inner.done()}
        now = time.monotonic()
        killed = False
        for tid, last in list(self._last_life.items()):
            if tid not in pending:  # done (or a late message of a task already done)
                self._last_life.pop(tid, None)
                continue
            silent = now - last
            if silent < self.stall_seconds:
                continue
            pid = next((p for p, t in self._running.items() if t == tid), None)
            if pid is not None and pid not in self._ended:
                log.warning("task %s showed no progress for %.0f s (--stall-seconds %g): ending its worker process %d",
                            tid, silent, self.stall_seconds, pid)
                self._kill(pid, silent)
                killed = True
        quiet = now - self._last_message
        if quiet >= self.stall_seconds and pending and not killed:  # (after a kill the pool restarts anyway)
            alive = [pid for pid, proc in (getattr(self._pool, "_processes", None) or {}).items()
                     if pid not in self._ended and proc.exitcode is None]
            if alive:
                log.warning("no worker showed progress for %.0f s (--stall-seconds %g) while %d task(s) wait: "
                            "ending worker process(es) %s", quiet, self.stall_seconds, len(pending),
                            ", ".join(map(str, sorted(alive))))
            for pid in alive:
                self._kill(pid, quiet)

    def _kill(self, pid: int, silent: float) -> None:
        self._ended[pid] = silent
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass

    def _settle(self, fut: Future, inner: Future) -> None:
        task = self._jobs.pop(fut)[0]
        self._last_life.pop(task.task_id, None)
        exc = inner.exception()
        if exc is None:
            self._fruitless = 0
            fut.set_result(inner.result())
        else:
            fut.set_exception(exc)

    def _restart(self, on_progress: ProgressFn) -> None:
        """A worker died and broke the pool: charge its task, start a new pool, resubmit the rest."""
        old = self._pool
        processes = dict(getattr(old, "_processes", None) or {})
        forced: set[int] = set()
        for pid, proc in processes.items():
            proc.join(2)
            if proc.exitcode is None:  # (the pool ends the others itself; make sure)
                proc.terminate()
                proc.join(1)
            if proc.exitcode is None:  # a stopped process (SIGSTOP) keeps SIGTERM pending
                forced.add(pid)
                proc.kill()
                proc.join(5)
        self.drain(on_progress)
        exits = {pid: proc.exitcode for pid, proc in processes.items()}
        # the pool ends the other workers with SIGTERM once one dies; a worker that ended any other
        # way is the one that died (if it too got SIGTERM, every worker that had a task is charged)
        culprits = {pid for pid, code in exits.items()
                    if code not in (-signal.SIGTERM, None) and pid not in forced} or set(exits)
        culprits |= set(self._ended) & set(exits)  # killed as hung (its exit code may not be read yet)
        ended = dict(self._ended)
        self._ended = {p: s for p, s in self._ended.items() if p not in exits}

        def how_ended(pid: int) -> str:
            if pid in ended:
                return f"was ended after {ended[pid]:.0f} s without progress (--stall-seconds)"
            return describe_exit(exits[pid])

        _shut_down(old)
        self._start_pool()
        charged: set[int] = set()
        for fut, job in list(self._jobs.items()):
            task, inner, deaths = job
            if inner.done() and not isinstance(inner.exception(), BrokenProcessPool):
                self._settle(fut, inner)
                continue
            pid = next((p for p, t in self._running.items() if t == task.task_id and p in culprits), None)
            if pid is not None:
                charged.add(pid)
                deaths += 1
                how = f"worker process {pid} {how_ended(pid)} while running task {task.task_id}"
                if deaths >= MAX_WORKER_DEATHS:
                    self._jobs.pop(fut)
                    fut.set_exception(WorkerDied(f"{how}; it lost its worker {deaths} times, giving up"))
                    continue
                log.warning("%s; running it again in a new worker (%d of %d)", how, deaths + 1, MAX_WORKER_DEATHS)
            self._jobs[fut] = [task, self._submit_to_pool(task), deaths]
        for pid in sorted(culprits - charged):
            when = "before it said which task it ran" if pid in ended else "between tasks"
            log.warning("worker process %d %s %s; its pool was started again", pid, how_ended(pid), when)
        self._running = {p: t for p, t in self._running.items() if p not in exits}
        self._last_life.clear()  # the old pool's tasks start again, each with a new sign of life
        self._last_message = time.monotonic()
        # workers that die before they run anything (at start-up) charge no task: bound those too
        self._fruitless = 0 if charged else self._fruitless + 1
        if self._fruitless >= MAX_WORKER_DEATHS:
            pid = min(culprits)
            reason = WorkerDied(f"worker processes keep dying before they finish a task (the last: process {pid} "
                                f"{how_ended(pid)}); the pool was started {self._fruitless} times, giving up")
            for fut, (_, inner, _) in list(self._jobs.items()):
                self._jobs.pop(fut)
                if not inner.cancel():
                    self._abandoned = True  # running in the new pool: ended at close, not waited for
                fut.set_exception(reason)

    def drain(self, on_progress: ProgressFn) -> None:
        while self._queue is not None:
            try:
                delta = self._queue.get_nowait()
            except queue_mod.Empty:
                return
            self._last_message = time.monotonic()
            if _STARTED in delta:
                self._running[delta["pid"]] = delta[_STARTED]
                self._last_life[delta[_STARTED]] = time.monotonic()
            else:
                task_id = delta.get(PROGRESS_TASK)  # (also a sign of life for the stall watch)
                if task_id is not None:
                    self._last_life[task_id] = time.monotonic()
                on_progress(delta)

    def close(self, *, cancel: bool) -> None:
        """Shut the pool down; ``cancel`` (an error or Ctrl-C): stop running tasks now."""
        if self._pool is None:
            return
        processes = dict(getattr(self._pool, "_processes", None) or {})
        if cancel:  # an unfinished task writes no marker: it is redone (see executors.base)
            for proc in processes.values():
                proc.terminate()
        elif self._abandoned:  # its result would be dropped; it may hang (stopped) as its tries did
            for proc in processes.values():
                proc.kill()
        _shut_down(self._pool)
        if not cancel and not self._abandoned:  # a worker that died after its last task (nothing to redo, but say so)
            for pid, proc in sorted(processes.items()):
                if proc.exitcode:
                    log.warning("worker process %d %s after its last task", pid, describe_exit(proc.exitcode))


SHUTDOWN_SECONDS = 60


def _shut_down(pool: ProcessPoolExecutor) -> None:
    """``pool.shutdown``, bounded: a pool whose worker died can leave its manager thread joining
    a call-queue feeder that never ends (a write into a pipe that no live process reads), and
    an unbounded shutdown would then hang the run for good. Its workers are ended by then; after
    ``SHUTDOWN_SECONDS`` the pool's threads are abandoned (and not joined at exit) with a warning."""
    done = threading.Event()

    def shut() -> None:
        pool.shutdown(wait=True, cancel_futures=True)
        done.set()

    thread = threading.Thread(target=shut, name="pool-shutdown", daemon=True)
    thread.start()
    if done.wait(SHUTDOWN_SECONDS):
        thread.join()  # gone before a new pool is started, which may then fork (start_method)
        return
    log.warning("the process pool did not shut down within %d s after a worker died; its threads are left behind",
                SHUTDOWN_SECONDS)
    for proc in (getattr(pool, "_processes", None) or {}).values():
        proc.kill()
    manager = getattr(pool, "_executor_manager_thread", None)
    import concurrent.futures.process as cfp  # its exit hook would join the stuck thread

    getattr(cfp, "_threads_wakeups", {}).pop(manager, None)


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
        workers = max(1, min(worker_count(self.config.workers), len(tasks)))
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
