"""gs:// through the same fsspec layer, on fake-gcs-server: conditional writes (generation
preconditions), a prepare run with output on GCS, and a claim-mode run whose leases live there."""

from __future__ import annotations

import json

import pytest

from conftest_servers import s3_env as store_env
from helpers_run import INPUTS, comparable, make_config, read_manifest

pytestmark = pytest.mark.s3  # an object-store server on 127.0.0.1, like the S3 tests


@pytest.fixture(scope="module")
def local_baseline(tmp_path_factory):
    from mlm_pipeline.pipeline import run_prepare

    return run_prepare(make_config(INPUTS, tmp_path_factory.mktemp("local")), show_progress=False)


def test_generation_preconditions(fake_gcs):
    from mlm_pipeline.cas import GCSStore, store_for

    from test_cas import _races, _semantics

    with store_env(fake_gcs):
        base = fake_gcs.new_prefix("cas")
        store = store_for(base)
        assert isinstance(store, GCSStore)
        _semantics(store, f"{base}/obj.json")
        _races(store, base, rounds=2)


def test_prepare_and_claim_with_output_on_gcs(fake_gcs, local_baseline):
    from mlm_pipeline.pipeline import run_prepare

    with store_env(fake_gcs):
        out = fake_gcs.new_prefix("out")
        manifest = run_prepare(make_config(INPUTS, out), show_progress=False)
        assert comparable(manifest) == comparable(local_baseline)

        claimed = fake_gcs.new_prefix("claim")
        summary = run_prepare(make_config(INPUTS, claimed, claim=True, lease_seconds=30), show_progress=False)
        assert sorted(summary["ran"]) == [f"{i:05d}" for i in range(local_baseline["tasks"])]
        assert summary["manifest"] is not None
        assert comparable(read_manifest(claimed)) == comparable(local_baseline)
        from mlm_pipeline import fs

        assert not [p for p in fs.listdir(f"{claimed}/_leases") if p.endswith(".json")]
        assert json.loads(fs.read_bytes(f"{claimed}/_run.json"))["tasks"] == local_baseline["tasks"]
