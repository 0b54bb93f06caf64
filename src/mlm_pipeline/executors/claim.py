"""Claim executor: any number of identical workers share one output and take tasks through leases.

Each worker (an autoscaling group, a managed instance group, ``parallel`` on a few machines) takes
tasks through leases (:mod:`.leases`), up to ``--workers`` at a time, runs them on a
:class:`~mlm_pipeline.executors.local.TaskPool` and renews the leases while they run. It keeps
polling while other workers' tasks are unfinished, so a dead worker's task is taken over when its
lease expires, and it returns when every task is done. An idle worker costs one LIST of the
markers and one of the leases every ``min(2 s, lease / 4)``: it reads only leases the listing shows
unwritten for about a lease period.

It yields the markers of the tasks *it* ran; the driver writes the manifest when it sees every
task done (:func:`mlm_pipeline.run.manifest.finalize_if_complete`).
"""

from __future__ import annotations

import logging
import random
import time
from concurrent.futures import Future
from typing import Iterator, Sequence

from mlm_pipeline import fs
from mlm_pipeline.config import PrepareConfig
from mlm_pipeline.executors.base import ProgressFn, worker_count
from mlm_pipeline.executors.leases import Heartbeat, Lease, LeaseManager, lease_ages, new_owner_id
from mlm_pipeline.executors.local import TaskPool, finished
from mlm_pipeline.plan import Task
from mlm_pipeline.run.layout import leases_url, marker_url
from mlm_pipeline.run.state import done_task_ids

log = logging.getLogger("mlm_pipeline")


class ClaimExecutor:
    """Runs the tasks nobody else holds, until every task is done (by this worker or others)."""

    def __init__(self, config: PrepareConfig, *, owner: str | None = None):
        self.config = config
        self.owner = owner or new_owner_id()

    def _claimable(self, order: list[str], done: set[str], running: set[str]) -> list[str]:
        """Free tasks first, then those whose lease may have expired (listing time ~ a lease ago)."""
        leased = lease_ages(leases_url(self.config.output))
        open_ = [i for i in order if i not in done and i not in running]
        free = [i for i in open_ if i not in leased]
        # a lease written less than ~ttl ago cannot have expired: reading only the others keeps
        # idle workers at one LIST per poll at the tail of a run
        stale = self.config.lease_seconds * 0.9
        held = [i for i in open_ if i in leased and (leased[i] is None or leased[i] >= stale)]
        return free + held

    def _acquire(self, manager: LeaseManager, task_id: str) -> Lease | None:
        lease = manager.try_acquire(task_id)
        if lease is not None and fs.exists(marker_url(self.config.output, task_id)):  # finished meanwhile
            manager.release(lease)
            return None
        return lease

    def run(self, tasks: Sequence[Task], on_progress: ProgressFn) -> Iterator[dict]:
        config = self.config
        manager = LeaseManager(config.output, self.owner, config.lease_seconds)
        poll = min(2.0, config.lease_seconds / 4)  # idle workers list markers and leases this often
        by_id = {t.task_id: t for t in tasks}
        order = list(by_id)
        random.Random(self.owner).shuffle(order)  # workers start at different tasks: fewer lost races
        workers = worker_count(config.workers)
        log.info("claim mode: worker %s, %d tasks, lease %.0fs, up to %d at a time", self.owner, len(by_id),
                 config.lease_seconds, workers)
        pool = TaskPool(config, workers)
        heartbeat = Heartbeat(manager, pool.silent_for, config.stall_seconds)
        in_flight: dict[Future, Task] = {}
        failed = True
        try:
            with heartbeat:
                while True:
                    done = done_task_ids(config.output)
                    if not in_flight and by_id.keys() <= done:
                        break
                    if len(in_flight) < workers:
                        running = {t.task_id for t in in_flight.values()}
                        for task_id in self._claimable(order, done, running):
                            if len(in_flight) >= workers:
                                break
                            lease = self._acquire(manager, task_id)
                            if lease is None:
                                continue
                            heartbeat.add(lease)
                            log.info("task %s: claimed by %s", task_id, self.owner)
                            in_flight[pool.submit(by_id[task_id], on_progress)] = by_id[task_id]
                    if not in_flight:
                        time.sleep(poll)  # the rest is held by others: wait for them (or their expiry)
                        continue
                    for fut in pool.wait(in_flight, on_progress, timeout=poll):
                        task = in_flight.pop(fut)
                        lease = heartbeat.remove(task.task_id)
                        if lease is not None:  # marker written (or the task failed: another may retry it)
                            manager.release(lease)
                        yield finished(task, fut)
            failed = False
        finally:
            pool.close(cancel=failed)
            for task_id in list(heartbeat.leases):  # stopped early: free our tasks for the others now
                lease = heartbeat.remove(task_id)
                try:
                    manager.release(lease)
                except Exception:  # noqa: BLE001 - it expires anyway
                    pass


__all__ = ["ClaimExecutor"]
