"""The lease protocol on a local directory with a controlled clock (the same code runs on S3/GCS
through mlm_pipeline.cas; tests/executors/test_array_claim.py runs it with real processes)."""

from __future__ import annotations

import json

import pytest

from mlm_pipeline.executors.leases import LeaseManager
from mlm_pipeline.run.layout import lease_url


class Clock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_acquire_renew_expire_take_over_release(tmp_path):
    out, clock = str(tmp_path), Clock()
    a, b, c = (LeaseManager(out, owner, ttl=10, clock=clock) for owner in "abc")
    la = a.try_acquire("00001")
    assert la is not None and la.body["owner"] == "a"
    assert b.try_acquire("00001") is None  # held and not expired
    clock.now += 8
    assert a.renew(la)  # renewed: expires 10 s from now
    clock.now += 8
    assert b.try_acquire("00001") is None  # would have expired without the renewal
    clock.now += 3
    lb = b.try_acquire("00001")  # expired: taken over, exactly once
    assert lb is not None and lb.body["taken_over_from"] == "a"
    assert c.try_acquire("00001") is None
    assert not a.renew(la) and la.lost  # the old owner learns it lost the lease
    assert json.loads(open(lease_url(out, "00001")).read())["owner"] == "b"
    b.release(lb)
    lc = c.try_acquire("00001")  # free again
    assert lc is not None and lc.body["owner"] == "c"


def test_an_unreadable_lease_counts_as_expired(tmp_path):
    out = str(tmp_path)
    path = tmp_path / "_leases" / "00002.json"
    path.parent.mkdir()
    path.write_text("not json")
    lease = LeaseManager(out, "x", ttl=10).try_acquire("00002")
    assert lease is not None and lease.body["taken_over_from"] is None


def test_lease_ages_from_the_listing(tmp_path):
    import os
    import time

    from mlm_pipeline.executors.leases import lease_ages

    assert lease_ages(str(tmp_path / "_leases")) == {}
    manager = LeaseManager(str(tmp_path), "a", ttl=10)
    assert manager.try_acquire("00003") is not None
    path = tmp_path / "_leases" / "00003.json"
    old = time.time() - 100
    os.utime(path, (old, old))
    (tmp_path / "_leases" / "00003.json.lock").write_text("")
    ages = lease_ages(str(tmp_path / "_leases"))
    assert list(ages) == ["00003"] and 99 < ages["00003"] < 120


class _Through:
    """An S3 server's settings with another endpoint (a proxy in front of it)."""

    def __init__(self, server, endpoint: str):
        self.server, self.endpoint = server, endpoint

    def env(self) -> dict:
        return {**self.server.env(), "AWS_ENDPOINT_URL": self.endpoint}


@pytest.mark.s3
def test_a_lease_write_whose_answer_was_lost_is_ours(seaweedfs):
    """The server applies a lease's conditional PUT, its answer is lost and the client retries:
    the retry fails its condition against that very write. The lease is ours (its body, with a
    fresh nonce, is read back), not taken by another worker: acquired, and renewed, not lost. A
    store's create stays strict: identical contents (a manifest) may well be another writer's."""
    from conftest_servers import s3_env
    from faults.faulty_proxy import FaultyProxy
    from mlm_pipeline.cas import create_bytes

    proxy = FaultyProxy(seaweedfs.endpoint, ["lose-answer"], budget=1)
    try:
        with s3_env(seaweedfs):
            out = seaweedfs.new_prefix("lease-lost")
        with s3_env(_Through(seaweedfs, proxy.endpoint)):
            manager = LeaseManager(out, "a", ttl=30)
            lease = manager.try_acquire("00001")
            assert proxy.injected["lose-answer"] == 1
            assert lease is not None and manager.read("00001")[1] == lease.version
            proxy.budget = 2
            assert manager.renew(lease) and not lease.lost
            assert proxy.injected["lose-answer"] == 2
            assert manager.read("00001") == (lease.body, lease.version)
            assert LeaseManager(out, "b", ttl=30).try_acquire("00001") is None  # held: another worker waits
            proxy.budget = 3
            assert not create_bytes(f"{out}/manifest.json", b"{}")  # (its write went through: strict)
            assert proxy.injected["lose-answer"] == 3
    finally:
        proxy.close()


def test_the_heartbeat_renews_only_leases_whose_task_shows_progress(tmp_path, caplog):
    """A task silent for the stall limit keeps its lease no longer: it expires and another worker
    takes the task over, while a progressing task's lease is renewed past its ttl."""
    import time

    from mlm_pipeline.executors.leases import Heartbeat

    out = str(tmp_path)
    owner = LeaseManager(out, "a", ttl=0.6)
    silent = {"00001": 0.0, "00002": 0.0}
    with Heartbeat(owner, silent.get, stall_seconds=5.0) as heartbeat:
        for task_id in silent:
            heartbeat.add(owner.try_acquire(task_id))
        silent["00002"] = 7.0  # this task hangs; the other goes on
        time.sleep(1.5)  # more than two ttls: only renewals keep a lease
        other = LeaseManager(out, "b", ttl=0.6)
        assert other.try_acquire("00001") is None  # renewed all along
        taken = other.try_acquire("00002")
        assert taken is not None and taken.body["taken_over_from"] == "a"
    stalls = [r.getMessage() for r in caplog.records if "no longer renewed" in r.getMessage()]
    assert stalls == ["task 00002: no progress for 7 s (--stall-seconds 5); its lease is no longer renewed, so "
                      "that another worker can take it over once it expires"]


def test_without_a_stall_limit_a_silent_task_keeps_its_lease(tmp_path):
    import time

    from mlm_pipeline.executors.leases import Heartbeat

    out = str(tmp_path)
    owner = LeaseManager(out, "a", ttl=0.6)
    with Heartbeat(owner, lambda task_id: 1e9, stall_seconds=0) as heartbeat:
        heartbeat.add(owner.try_acquire("00001"))
        time.sleep(1.5)
        assert LeaseManager(out, "b", ttl=0.6).try_acquire("00001") is None
