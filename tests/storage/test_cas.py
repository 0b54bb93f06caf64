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

