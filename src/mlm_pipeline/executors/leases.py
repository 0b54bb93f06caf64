"""Leases: identical workers sharing one output claim tasks without a scheduler (claim mode).

A worker that wants task T writes ``OUTPUT/_leases/T.json`` with a *conditional create*
(:mod:`mlm_pipeline.cas`: ``If-None-Match: *`` on S3, ``ifGenerationMatch=0`` on GCS, an atomic
link on a POSIX directory). The body holds the owner id, a fresh nonce and ``expires_at``; the
owner renews it every ``ttl / 3`` with a *compare-and-swap* on the version it last wrote
(``If-Match: ETAG`` / ``ifGenerationMatch=GEN`` / compare under ``flock``). After the task's
marker is written, the lease is deleted.

Acquiring T (:meth:`LeaseManager.try_acquire`):

1. conditional create; success -> ours;
2. otherwise read the lease (content and version together); if it has not expired -> not ours;
3. if it has expired -> compare-and-swap from the version read to a new body; success -> ours;
4. having got the lease, check T's marker once more: if it exists, release and skip.

Why no two live workers run the same task, and why nothing breaks when they do anyway:

* Two workers creating at once: the store lets exactly one create succeed.
* A write whose answer was lost: the storage client retries it, and the retry fails its condition
  against that very write. The lease is read back: the same body (a fresh nonce in each) is ours.
* Two workers taking over the same expired lease: both swap from the version they read; the
  first swap changes the version (every body has a new nonce, so even the ETag, an MD5 of the
  content, changes), so the second swap fails. Delete-then-create would not be safe: a slow
  taker could delete the lease the fast taker had just created.
* The owner renewing while another worker takes over: both swap from the same version; one wins.
  If the taker wins, the owner's renewal fails and it logs that it lost the lease; its task keeps
  running (stopping it buys nothing). This only happens when the owner could not renew for a
  whole ``ttl`` (paused, partitioned, or its task silent for ``--stall-seconds``: a lease is
  renewed only while its task shows progress, :class:`Heartbeat`) and is then harmless, see the
  last point.
* A task finishing while another worker acquires: the owner writes the marker *before* deleting
  the lease, and the acquirer checks the marker *after* acquiring (step 4); the stores are
  read-after-write consistent, so it sees the marker and skips. The release deletes without a
  condition: if the lease had been taken over meanwhile, deleting the taker's lease only lets a
  third worker acquire, and that worker too sees the marker and skips.
* Expiry is judged with the reading worker's clock against the writer's ``expires_at``: clocks
  must agree to well within ``ttl`` (NTP keeps cloud machines within milliseconds; the default
  ``ttl`` is two minutes).
* Correctness never rests on the leases: a task's output is a pure function of its inputs, a
  shard object appears only whole (one PUT or a completed multipart upload), and the marker is
  written last. Two workers running the same task write the same bytes to the same names. The
  leases only make that rare, so that each task is normally run once.

A dead worker's tasks are taken over when their leases expire, by any worker still polling. The
manifest is written once, by a conditional create, by the first worker to see every task done
(:func:`mlm_pipeline.run.manifest.finalize_if_complete`).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from dataclasses import dataclass, field
from typing import Callable

from mlm_pipeline import cas, fs
from mlm_pipeline.run.layout import lease_url, task_id_of

log = logging.getLogger("mlm_pipeline")


def new_owner_id() -> str:
    return f"{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"


@dataclass
class Lease:
    task_id: str
    url: str
    version: str
    body: dict
    lost: bool = False
    lost_reported: bool = False
    stall_reported: bool = False


@dataclass
class LeaseManager:
    """Acquire, renew and release the task leases of one owner in an output."""

    output: str
    owner: str
    ttl: float
    clock: Callable[[], float] = time.time
    store: cas.ConditionalStore = field(init=False)

    def __post_init__(self) -> None:
        self.store = cas.store_for(self.output)

    def _body(self, task_id: str, **extra) -> bytes:
        now = self.clock()
        body = {"task_id": task_id, "owner": self.owner, "nonce": uuid.uuid4().hex,
                "renewed_at": round(now, 3), "expires_at": round(now + self.ttl, 3), "ttl": self.ttl, **extra}
        return json.dumps(body, sort_keys=True).encode()

    def read(self, task_id: str) -> tuple[dict | None, str] | None:
        """(body or None if unreadable, version) of T's lease, or None without a lease."""
        current = self.store.read(lease_url(self.output, task_id))
        if current is None:
            return None
        try:
            body = json.loads(current.data)
        except ValueError:
            body = None
        return (body if isinstance(body, dict) else None), current.version

    def expired(self, body: dict | None) -> bool:
        if body is None:  # not a lease we understand: treat as expired (never a partial write)
            return True
        try:
            return float(body["expires_at"]) <= self.clock()
        except (KeyError, TypeError, ValueError):
            return True

    def try_acquire(self, task_id: str) -> Lease | None:
        url = lease_url(self.output, task_id)
        data = self._body(task_id)
        version = self.store.create(url, data)
        if version is not None:
            return Lease(task_id, url, version, json.loads(data))
        found = self.read(task_id)
        if found is None:  # released between our create and our read: one more create
            version = self.store.create(url, data)
            return Lease(task_id, url, version, json.loads(data)) if version is not None else None
        body, current = found
        if body == json.loads(data):  # our own create, whose answer was lost (its retry failed against it)
            return Lease(task_id, url, current, body)
        if not self.expired(body):
            return None
        previous = body.get("owner") if body else None
        data = self._body(task_id, taken_over_from=previous)
        version = self.store.replace(url, data, current) or cas.ours(self.store, url, data)
        if version is None:
            return None
        log.warning("task %s: took over the expired lease of %s", task_id, previous)
        return Lease(task_id, url, version, json.loads(data))

    def renew(self, lease: Lease) -> bool:
        if lease.lost:
            return False
        data = self._body(lease.task_id, **({"taken_over_from": lease.body["taken_over_from"]}
                                            if "taken_over_from" in lease.body else {}))
        version = self.store.replace(lease.url, data, lease.version) or cas.ours(self.store, lease.url, data)
        if version is None:
            lease.lost = True
            return False
        lease.version, lease.body = version, json.loads(data)
        return True

    def release(self, lease: Lease) -> None:
        """Delete the lease; call only after the task's marker is written (see the module doc)."""
        self.store.delete(lease.url)


class Heartbeat:
    """A thread renewing the held leases every ``ttl / 3`` seconds, each only while its task shows
    progress: ``silent_for(task_id)`` gives the seconds since the task last did, and a task silent
    for ``stall_seconds`` (0: no limit) keeps its lease no longer. The executor ends such a task
    itself (:class:`~mlm_pipeline.executors.local.TaskPool`); where it cannot (a read stuck in the
    kernel, a driver that stopped waiting on its pool), the lease expires and another worker takes
    the task over, so one hung worker never holds a task, and so the run, for ever."""

    def __init__(self, manager: LeaseManager, silent_for: Callable[[str], float] | None = None,
                 stall_seconds: float = 0.0):
        self.manager = manager
        self.silent_for = silent_for
        self.stall_seconds = stall_seconds
        self.leases: dict[str, Lease] = {}
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="lease-heartbeat", daemon=True)

    def __enter__(self) -> "Heartbeat":
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()

    def add(self, lease: Lease) -> None:
        with self._lock:
            self.leases[lease.task_id] = lease

    def remove(self, task_id: str) -> Lease | None:
        with self._lock:
            return self.leases.pop(task_id, None)

    def _run(self) -> None:
        interval = self.manager.ttl / 3
        while not self._stop.wait(interval):
            with self._lock:
                held = list(self.leases.values())
            for lease in held:
                if self._stalled(lease):
                    continue
                try:
                    renewed = self.manager.renew(lease)
                except Exception as exc:  # noqa: BLE001 - a network blip: retry at the next beat
                    log.warning("task %s: lease renewal failed (%s); retrying", lease.task_id, exc)
                    continue
                with self._lock:
                    still_held = lease.task_id in self.leases
                if not renewed and still_held and not lease.lost_reported:
                    lease.lost_reported = True
                    log.warning("task %s: lost its lease (not renewed in time; another worker took it "
                                "over); running it to the end anyway: both runs write the same bytes",
                                lease.task_id)

    def _stalled(self, lease: Lease) -> bool:
        if not self.stall_seconds or self.silent_for is None:
            return False
        silent = self.silent_for(lease.task_id)
        if silent < self.stall_seconds:
            lease.stall_reported = False
            return False
        if not lease.stall_reported:
            lease.stall_reported = True
            log.warning("task %s: no progress for %.0f s (--stall-seconds %g); its lease is no longer renewed, "
                        "so that another worker can take it over once it expires", lease.task_id, silent,
                        self.stall_seconds)
        return True


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
        task_id = task_id_of(str(entry.get("name", "")))
        if task_id is None:
            continue
        written = None
        for key in ("LastModified", "mtime", "updated"):
            written = _timestamp(entry.get(key))
            if written is not None:
                break
        ages[task_id] = None if written is None else now - written
    return ages
