"""Ray executor: the planned tasks as Ray tasks on a cluster (or on a private local Ray instance).

Each Ray task calls the same pure function as the local executor (:func:`mlm_pipeline.task.run_task`)
with the same ``Task`` and config, so the shards are byte-identical to ``--executor local``. What
Ray adds is where tasks run and what happens when a machine goes away:

* **Where**: ``--ray-address ADDR`` (``auto`` on a cluster node, ``ray://host:10001`` through Ray
  Client); without it the ``RAY_ADDRESS`` environment variable (set by ``ray job submit`` for the
  job's entrypoint); without either a private local instance (``address="local"``, never another
  user's cluster on the same machine) with ``--workers`` CPUs.
* **One CPU per task**: a task runs one tokenizer thread (``TOKENIZERS_PARALLELISM=false``), so a
  node with N CPUs runs N tasks. The tokenizer is loaded in each worker process from its path,
  never pickled (``load_tokenizer`` caches it per process).
* **Node or worker loss**: a task whose worker process or node dies is resubmitted by Ray
  (``max_retries``); a killed task never committed anything visible (shards are committed
  atomically, the marker last), so the retry writes the same bytes from scratch.
  An exception raised by the task itself is deterministic and not retried: the run stops with
  ``TaskFailed`` naming the task's input range, and the other tasks are cancelled.
* **Storage settings**: the driver's S3 settings from its environment (``AWS_ENDPOINT_URL``, the
  region, and its credentials for workers that have none) are set in each task's process, so a
  run that works locally with ``AWS_ENDPOINT_URL`` works on the cluster (values never logged).
* **Output**: a local ``--output`` path must be the same directory on every node (a shared
  filesystem mounted at that path); otherwise each node would keep its own tasks' shards and the
  manifest would list shards its directory lacks. Before any task runs, each alive node with CPUs
  reads back a file the driver wrote there (:func:`check_output_seen_by_every_node`); a node that
  cannot stops the run. An object-store URL needs no check.
* **Progress**: the driver waits on the task references and reports each finished task's bytes,
  documents and tokens.
* **Hung tasks**: a task runs under the stall alarm, as a one-worker local run's does (a Ray task
  runs on its worker's main thread): silent for ``--stall-seconds``, it is interrupted and runs
  again in the same worker, up to 3 tries, then fails the run like any task error.
"""

from __future__ import annotations

import logging
import os
import time
import uuid
from typing import Iterator, Sequence

from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.environment import StorageEnvironment, configure_process
from mlm_pipeline.errors import OutputError, TaskFailed
from mlm_pipeline.executors.base import PROGRESS_TASK, Failures, ProgressFn, default_workers
from mlm_pipeline.executors.local import run_with_stall_alarm
from mlm_pipeline.plan import Task

log = logging.getLogger("mlm_pipeline")

MAX_RETRIES = 3  # resubmissions of a task after its worker or node died
LOCAL_OBJECT_STORE_BYTES = 256 << 20  # markers are tiny: the private instance needs little


def _ray_task(task: Task, config: PrepareConfig, storage: StorageEnvironment | None = None) -> dict:
    """Body of one Ray task (runs in a Ray worker process, maybe on another machine), with the
    driver's S3 settings (``storage``) in its environment."""
    configure_process(config.s3_endpoint_url, runs_tasks=True, storage=storage)
    return run_with_stall_alarm(task, config)


def connect(address: str | None, *, num_cpus: int | None = None) -> bool:
    """Connect this process to Ray; whether it started (and so must shut down) the connection."""
    import ray

    if ray.is_initialized():
        return False
    quiet = {"logging_level": logging.WARNING, "log_to_driver": True}
    if address is None and not os.environ.get("RAY_ADDRESS"):
        log.info("ray: starting a private local instance with %s CPUs", num_cpus or "all")
        ray.init(
            address="local",
            num_cpus=num_cpus,
            object_store_memory=LOCAL_OBJECT_STORE_BYTES,
            include_dashboard=False,
            **quiet,
        )
    else:
        ray.init(address=address, **quiet)  # None: RAY_ADDRESS
        log.info("ray: connected to %s (%s CPUs)", address or os.environ.get("RAY_ADDRESS"),
                 ray.cluster_resources().get("CPU", 0))
    return True


PROBE_SECONDS = 120  # for every node to answer the output check (a worker process starts on each)


def _read_probe(path: str) -> tuple[str, str | None]:
    """On one node: its address, and the content of ``path`` there (None if it cannot be read)."""
    import ray

    try:
        with open(path, encoding="utf-8") as f:
            content = f.read()
    except OSError:
        content = None
    return ray.util.get_node_ip_address(), content


def check_output_seen_by_every_node(output: str) -> None:
    """Raise :class:`OutputError` unless every alive node with CPUs sees the local directory
    ``output`` as this process does: a file with a random token, written into its ``_tmp/``, is
    read back by a zero-CPU task pinned to each node. Nodes that join later (an autoscaler's) are
    not checked."""
    import ray
    from ray.exceptions import GetTimeoutError, NodeDiedError, TaskUnschedulableError, WorkerCrashedError
    from ray.util.scheduling_strategies import NodeAffinitySchedulingStrategy

    from mlm_pipeline.run import layout

    token = uuid.uuid4().hex
    probe = os.path.join(layout.tmp_dir(fs.get_fs(output)[1]), f"node-check-{token}")
    fs.atomic_write_bytes(probe, token.encode())
    try:
        nodes = [n for n in ray.nodes() if n.get("Alive") and n.get("Resources", {}).get("CPU", 0) > 0]
        read = ray.remote(_read_probe)
        refs = [read.options(num_cpus=0, scheduling_strategy=NodeAffinitySchedulingStrategy(n["NodeID"], soft=False))
                .remote(probe) for n in nodes]
        deadline = time.monotonic() + PROBE_SECONDS
        answers = []
        for ref in refs:  # one at a time: a node gone since ray.nodes() listed it runs no task anyway
            try:
                answers.append(ray.get(ref, timeout=max(0.0, deadline - time.monotonic())))
            except GetTimeoutError:
                raise OutputError(f"could not check within {PROBE_SECONDS} s that every node of the cluster sees "
                                  f"the output directory {output}; give an object-store URL (s3://..., gs://...) "
                                  "as --output, or try again") from None
            except (TaskUnschedulableError, NodeDiedError, WorkerCrashedError) as exc:
                log.info("node check: a node left the cluster while it was checked (%s)", type(exc).__name__)
    finally:
        try:
            os.remove(probe)
        except OSError:
            pass
    blind = [address for address, content in answers if content != token]
    if blind:
        shown = sorted(set(blind))
        raise OutputError(
            f"--output {output} is a directory of this machine that {len(blind)} of the cluster's {len(answers)} "
            f"nodes with CPUs do not see (at {', '.join(shown[:5])}{' ...' if len(shown) > 5 else ''}): each would "
            "keep its tasks' shards on its own disk. Give an object-store URL (s3://..., gs://...), or a "
            "filesystem mounted at the same path on every node")


def _progress_of(marker: dict) -> dict:
    """A whole task's progress increment, from its marker (Ray tasks report when they finish)."""
    stats = marker.get("stats", {})
    return {"bytes": stats.get("bytes_read", 0), "documents": stats.get("documents_read", 0),
            "tokens": stats.get("tokens", 0), PROGRESS_TASK: marker["task_id"]}


def _cause(exc: BaseException) -> BaseException:
    """The task's own exception inside a ``RayTaskError`` (else the Ray error itself)."""
    cause = getattr(exc, "cause", None)
    return cause if isinstance(cause, BaseException) else exc


class RayExecutor:
    """Runs tasks as Ray tasks (``config.ray_address``; ``config.workers`` CPUs for a private instance)."""

    def __init__(self, config: PrepareConfig, *, max_retries: int = MAX_RETRIES):
        self.config = config
        self.max_retries = max_retries

    def run(self, tasks: Sequence[Task], on_progress: ProgressFn) -> Iterator[dict]:
        """Yield each task's marker as it completes (any order)."""
        if not tasks:
            return
        import ray
        from ray.exceptions import RayError, RayTaskError

        started = connect(self.config.ray_address, num_cpus=self.config.workers or default_workers())
        remote = ray.remote(_ray_task)
        options = {"num_cpus": 1, "max_retries": self.max_retries, "retry_exceptions": False}
        pending: dict = {}
        try:
            if fs.is_local(self.config.output):
                check_output_seen_by_every_node(self.config.output)
            config_ref = ray.put(self.config)
            storage = StorageEnvironment.of_this_process()
            if storage.settings or storage.secrets:
                log.info("ray: the workers get this process's %r", storage)
            storage_ref = ray.put(storage)  # a task argument: never in Ray's logs or job info
            for task in tasks:
                ref = remote.options(name=f"mlm-pipeline-task-{task.task_id}", **options).remote(
                    task, config_ref, storage_ref)
                pending[ref] = task
            failures = Failures(len(tasks))
            while pending:
                ready, _ = ray.wait(list(pending), num_returns=1, timeout=1.0)
                for ref in ready:
                    task = pending.pop(ref)
                    try:
                        marker = ray.get(ref)
                    except RayTaskError as exc:
                        failures.add(TaskFailed(task, _cause(exc)))
                        continue
                    except RayError as exc:  # worker/node lost more often than max_retries, ...
                        failures.add(TaskFailed(task, exc))
                        continue
                    on_progress(_progress_of(marker))
                    yield marker
            failures.raise_if_any()
        finally:
            for ref in pending:
                try:
                    ray.cancel(ref, force=True)
                except Exception:  # noqa: BLE001 - best effort on the way out
                    pass
            if started:
                ray.shutdown()
