"""The S3 settings a driver hands to its Ray workers (environment.StorageEnvironment)."""

from __future__ import annotations

import pickle

from mlm_pipeline.environment import StorageEnvironment


def test_storage_settings_travel_and_credentials_only_to_a_worker_without_its_own(monkeypatch):
    for key, value in {"AWS_ENDPOINT_URL": "http://minio:9000", "AWS_DEFAULT_REGION": "eu-west-3",
                       "AWS_ACCESS_KEY_ID": "driver-key", "AWS_SECRET_ACCESS_KEY": "driver-secret-value"}.items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_SESSION_TOKEN", raising=False)
    storage = pickle.loads(pickle.dumps(StorageEnvironment.of_this_process()))  # as Ray ships it
    assert "driver-secret-value" not in repr(storage) and "driver-key" not in f"{storage}"
    assert "AWS_ENDPOINT_URL" in repr(storage) and "AWS_SECRET_ACCESS_KEY=<not shown>" in repr(storage)
    # a worker with its own credentials (an instance role's keys) and another endpoint
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://elsewhere:1")
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "worker-key")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "worker-secret")
    storage.apply()
    import os

    assert os.environ["AWS_ENDPOINT_URL"] == "http://minio:9000" and os.environ["AWS_DEFAULT_REGION"] == "eu-west-3"
    assert (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]) == ("worker-key", "worker-secret")
    # a worker with none gets the driver's
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    storage.apply()
    assert (os.environ["AWS_ACCESS_KEY_ID"], os.environ["AWS_SECRET_ACCESS_KEY"]) == ("driver-key", "driver-secret-value")
