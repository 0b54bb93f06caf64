"""Conditional writes (create-if-absent, compare-and-swap) on a local directory and on real S3
servers (SeaweedFS and moto), including races between threads."""

from __future__ import annotations

import uuid
from concurrent.futures import ThreadPoolExecutor

import pytest

from conftest_servers import s3_env


def _semantics(store, url: str) -> None:
    assert store.read(url) is None
    v1 = store.create(url, b"one")
    assert v1 is not None
    assert store.create(url, b"two") is None  # exists: refused, content unchanged
    assert store.read(url) == (b"one", v1)
    v2 = store.replace(url, b"three", v1)
    assert v2 is not None and v2 != v1
    assert store.replace(url, b"four", v1) is None  # stale version: refused
    assert store.read(url).data == b"three"
    store.delete(url)
    assert store.read(url) is None
    assert store.replace(url, b"five", v2) is None  # gone: refused, not re-created
    assert store.read(url) is None
    store.delete(url)  # deleting nothing is fine


def _races(store, base: str, rounds: int = 4, threads: int = 8) -> None:
    for _ in range(rounds):
        url = f"{base}/race-{uuid.uuid4().hex}"
        with ThreadPoolExecutor(threads) as pool:
            created = list(pool.map(lambda i, u=url: store.create(u, uuid.uuid4().bytes), range(threads)))
        assert sum(v is not None for v in created) == 1
        version = store.read(url).version
        with ThreadPoolExecutor(threads) as pool:
            swapped = list(pool.map(lambda i, u=url, v=version: store.replace(u, uuid.uuid4().bytes, v), range(threads)))
        assert sum(v is not None for v in swapped) == 1


def test_local_directory(tmp_path):
    from mlm_pipeline.cas import LocalStore, store_for

    store = store_for(str(tmp_path / "x"))
    assert isinstance(store, LocalStore)
    _semantics(store, str(tmp_path / "d" / "obj.json"))
    _races(store, str(tmp_path / "r"))
    assert not [p for p in (tmp_path / "d").iterdir() if ".tmp-" in p.name]  # no temporary left


@pytest.mark.s3
@pytest.mark.parametrize("server", ["seaweedfs", "moto_s3"])
def test_s3_servers(server, request):
    from mlm_pipeline.cas import S3Store, create_bytes, store_for

    s3 = request.getfixturevalue(server)
    with s3_env(s3):
        base = s3.new_prefix("cas")
        store = store_for(base)
        assert isinstance(store, S3Store)
        _semantics(store, f"{base}/obj.json")
        _races(store, base)
        assert create_bytes(f"{base}/once", b"a") and not create_bytes(f"{base}/once", b"b")


class _Through:
    """An S3 server's settings with another endpoint (a proxy in front of it)."""

    def __init__(self, server, endpoint: str):
        self.server, self.endpoint = server, endpoint

    def env(self) -> dict:
        return {**self.server.env(), "AWS_ENDPOINT_URL": self.endpoint}


@pytest.mark.s3
def test_a_conditional_write_whose_answer_was_lost_is_ours(seaweedfs):
    """The server applies a conditional PUT, its answer is lost and the client retries: the retry
    fails its condition against our own write. That is our write, not another writer's: it is
    told apart by its content (a lease's holds its owner), so a lease renewed so is kept, not lost."""
    from faults.faulty_proxy import FaultyProxy
    from mlm_pipeline.cas import store_for

    proxy = FaultyProxy(seaweedfs.endpoint, ["lose-answer"], budget=1)
    try:
        with s3_env(seaweedfs):
            base = seaweedfs.new_prefix("cas-lost")
        with s3_env(_Through(seaweedfs, proxy.endpoint)):
            store = store_for(base)
            version = store.create(f"{base}/lease", b"owner a, until 10")
            assert proxy.injected["lose-answer"] == 1
            assert version is not None and store.read(f"{base}/lease") == (b"owner a, until 10", version)
            proxy.budget = 2
            renewed = store.replace(f"{base}/lease", b"owner a, until 20", version)
            assert proxy.injected["lose-answer"] == 2
            assert renewed is not None and store.read(f"{base}/lease") == (b"owner a, until 20", renewed)
            assert store.create(f"{base}/lease", b"owner b, until 30") is None  # another writer's: refused
            assert store.replace(f"{base}/lease", b"owner b, until 30", version) is None
    finally:
        proxy.close()
