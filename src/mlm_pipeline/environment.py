"""The process environment mlm-pipeline relies on, set in one place.

Three variables matter, and each must be set before the library that reads it starts:

* ``AWS_ENDPOINT_URL``: an S3-compatible endpoint (``--s3-endpoint-url``). botocore reads it when a
  client is made, so every process that touches storage sets it first: the driver, the ``finalize``
  command, and each Ray task (a Ray worker is another process, on another machine, started with the
  cluster's environment, not the driver's). Pool workers are started from the driver and inherit it.
  The driver's other S3 settings from its environment (endpoint, region, and credentials when the
  worker has none of its own) travel to Ray tasks as a :class:`StorageEnvironment`, an argument of
  the task, never a log line: its ``repr`` names the variables, not their values.
* ``TOKENIZERS_PARALLELISM``: the Rust tokenizer's thread pool. A process that runs tasks uses one
  tokenizer thread (and one OpenMP thread), since executors run one task per core; so it is forced
  off in pool workers, Ray tasks and a driver that runs tasks itself. Elsewhere (``inspect``,
  training) it only defaults to off, keeping a user's own setting, which also silences the
  tokenizers' warning about a pool that a forked process would inherit.

* ``OPENBLAS_NUM_THREADS``: numpy's bundled OpenBLAS starts a thread per core when numpy is
  imported, and each spins for about 0.1 s before it sleeps. Nothing a task does multiplies
  matrices, and a spawned pool's workers all import numpy at once, each with a thread per core
  spinning beside the others' start-up (a spawned ``--workers 2`` run of 4 MB on a 2-vCPU VM:
  0.47-0.50 s with one thread, 0.52-0.59 s without). A spawned worker imports numpy before any
  code of ours runs in it, so the driver sets the variable to 1 (a user's own setting kept) before
  it spawns them (:func:`one_blas_thread`). Forked workers inherit numpy loaded and start no
  thread; the driver itself and training keep the default.

A process that runs tasks also tunes glibc's allocator (where there is one) with ``mallopt``:
large arrays come from the heap instead of fresh ``mmap`` calls, and freed heap memory is kept
for the next block instead of being returned at once. Every block allocates the same few hundred
MB of temporaries again; by default each of them is a new mapping whose pages fault in one by
one, which measured 2-3x slower than reusing memory (a numpy ``cumsum`` or fill of 30 MB, 2-vCPU
VM). Peak RSS is unchanged (the memory was held at the peak anyway); it is just not handed back
between blocks.

While a task runs, Python's cyclic garbage collector leaves alone the objects that were alive when
it started (:func:`quiet_collector`: ``gc.freeze``), and collects its youngest generation after
10,000 new container objects instead of 700. A task's hot path is numpy and Rust; the Python
objects it makes (a block's documents, a list each) are freed by reference counting, so the
collector finds little to collect (about 1,000 objects in 100 MB of text). A single-worker run
of 100 MB of text (2-vCPU VM, 1.5 s) made 149 collections taking 36 ms with the defaults, 22 ms
of it one full collection walking every object the imports made; with the change it made 12,
taking 2 ms, one of them before each of its 4 tasks. A pool worker also freezes what it inherits
when it starts, so no collection writes to (and so copies) pages it shares with its parent.

Every entry point calls :func:`configure_process` (the CLI commands, :func:`~mlm_pipeline.pipeline.run_prepare`,
the local pool's worker initializer, the Ray task body, ``load_tokenizer``, the training entry).
"""

from __future__ import annotations

import ctypes
import gc
import os
import sys
import threading
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Iterator

ENDPOINT_VARIABLE = "AWS_ENDPOINT_URL"
TOKENIZER_THREADS_VARIABLE = "TOKENIZERS_PARALLELISM"

# S3 settings botocore reads from the environment that are not secret, and the credentials
STORAGE_SETTINGS = ("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_DEFAULT_REGION", "AWS_REGION",
                    "AWS_EC2_METADATA_DISABLED")
STORAGE_SECRETS = ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN")


@dataclass(frozen=True, repr=False)
class StorageEnvironment:
    """The S3 settings of one process's environment, to set in another (a Ray worker).

    ``settings`` replace the worker's own; ``secrets`` (the access key, secret key and session
    token) are set only in a worker that has no access key of its own (a cloud node keeps its
    instance role). The ``repr`` names the variables, never their values.
    """

    settings: tuple[tuple[str, str], ...] = ()
    secrets: tuple[tuple[str, str], ...] = ()

    @classmethod
    def of_this_process(cls) -> "StorageEnvironment":
        env = os.environ
        return cls(tuple((k, env[k]) for k in STORAGE_SETTINGS if env.get(k)),
                   tuple((k, env[k]) for k in STORAGE_SECRETS if env.get(k)))

    def apply(self) -> None:
        os.environ.update(dict(self.settings))
        if self.secrets and not os.environ.get("AWS_ACCESS_KEY_ID"):
            os.environ.update(dict(self.secrets))

    def __repr__(self) -> str:
        names = [k for k, _ in self.settings] + [f"{k}=<not shown>" for k, _ in self.secrets]
        return f"StorageEnvironment({', '.join(names)})"


BLAS_THREADS_VARIABLE = "OPENBLAS_NUM_THREADS"


def one_blas_thread() -> None:
    """Default numpy's OpenBLAS to one thread in the processes this one starts from now on (and in
    this one, if numpy is not imported yet); a user's own setting is kept."""
    os.environ.setdefault(BLAS_THREADS_VARIABLE, "1")


def configure_process(s3_endpoint_url: str | None = None, *, runs_tasks: bool = False,
                      storage: StorageEnvironment | None = None) -> None:
    """Set this process's environment (see the module docstring); safe to call more than once.

    ``runs_tasks``: this process runs pipeline tasks (one tokenizer thread and one OpenMP thread,
    forced). ``s3_endpoint_url``: use this S3-compatible endpoint (nothing changes when None); it
    wins over ``storage``, the S3 settings of the driver's environment (a Ray task's).
    """
    if storage is not None:
        storage.apply()
    if s3_endpoint_url:
        os.environ[ENDPOINT_VARIABLE] = s3_endpoint_url
    if runs_tasks:
        os.environ[TOKENIZER_THREADS_VARIABLE] = "false"
        os.environ.setdefault("OMP_NUM_THREADS", "1")
        keep_freed_memory()
    else:
        os.environ.setdefault(TOKENIZER_THREADS_VARIABLE, "false")


_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's mallopt parameters
_KEPT_BYTES = 1 << 30  # allocations up to 1 GiB come from the heap; up to 1 GiB free is kept
_allocator_tuned = False


def keep_freed_memory() -> bool:
    """Have glibc's malloc reuse freed memory for large arrays (see the module docstring).
    Returns whether it was done (False off glibc: macOS, musl, Windows); once per process."""
    global _allocator_tuned
    if _allocator_tuned:
        return True
    if not sys.platform.startswith("linux"):
        return False
    try:
        # the symbols this process already has (glibc's among them): ``find_library`` would run
        # ``ldconfig`` in a subprocess, 2-3 ms at every worker's start
        mallopt = ctypes.CDLL(None).mallopt
    except (OSError, AttributeError):
        return False
    _allocator_tuned = bool(mallopt(_M_MMAP_THRESHOLD, _KEPT_BYTES)) and bool(mallopt(_M_TRIM_THRESHOLD, _KEPT_BYTES))
    return _allocator_tuned


TASK_GEN0_THRESHOLD = 10_000  # container objects allocated (net) before the youngest generation is collected

_collector_lock = threading.Lock()
_collector_users = 0  # tasks running in this process inside quiet_collector (threads: in-process runs)
_collector_saved: tuple[tuple[int, ...], bool] | None = None  # the threshold, and whether we froze
_inherited_frozen = False  # freeze_inherited_objects ran: objects are frozen for good in this process


@contextmanager
def quiet_collector() -> Iterator[None]:
    """Run a task with the collector tuned as the module docstring says; the first task in (of
    tasks running at once in threads) tunes it and the last one out puts back the threshold and
    unfreezes what was frozen for them. Objects frozen before (a pool worker's inheritance, a
    user's own ``gc.freeze``) stay frozen; a collector switched off (threshold 0) stays off."""
    global _collector_users, _collector_saved
    with _collector_lock:
        if _collector_users == 0:
            threshold = gc.get_threshold()
            # (``get_freeze_count`` walks every frozen object: in a pool worker, 54,000 of them,
            # 5 ms at each task's start with the caches cold after the last one)
            ours = not _inherited_frozen and gc.get_freeze_count() == 0
            if ours:
                gc.collect(1)  # garbage of the young generations is collected, not frozen with the rest
                gc.freeze()
            if threshold[0]:
                gc.set_threshold(max(threshold[0], TASK_GEN0_THRESHOLD), *threshold[1:])
            _collector_saved = (threshold, ours)
        _collector_users += 1
    try:
        yield
    finally:
        with _collector_lock:
            _collector_users -= 1
            if _collector_users == 0 and _collector_saved is not None:
                threshold, ours = _collector_saved
                gc.set_threshold(*threshold)
                if ours:
                    gc.unfreeze()
                _collector_saved = None


def freeze_inherited_objects() -> None:
    """In a pool worker, before any task: a forked worker's objects from its parent stay shared
    with it (copy-on-write) only while nothing writes to them, and the collector would, visiting
    each. Never undone: the worker is ours and lives for one run."""
    global _inherited_frozen
    gc.freeze()
    _inherited_frozen = True


__all__ = ["StorageEnvironment", "configure_process", "freeze_inherited_objects", "keep_freed_memory",
           "one_blas_thread", "quiet_collector"]
