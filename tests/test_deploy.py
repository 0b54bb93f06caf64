"""deploy/: the Ray cluster launcher configs pass Ray's own validation (offline), the KubeRay
RayJob has what a run needs, and all of them keep the cost guards (idle timeout, teardown)."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[1]
LAUNCHER = {"aws": REPO / "deploy" / "aws" / "cluster.yaml", "gcp": REPO / "deploy" / "gcp" / "cluster.yaml"}


@pytest.mark.ray
@pytest.mark.parametrize("cloud", sorted(LAUNCHER))
def test_launcher_config_passes_ray_validation(cloud):
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(LAUNCHER[cloud].read_text())
    assert raw["provider"]["type"] == cloud
    prepared = prepare_config(copy.deepcopy(raw))  # fills Ray's defaults for the provider, offline
    validate_config(prepared)  # ray-schema.json + Ray's own consistency checks
    assert 0 < prepared["idle_timeout_minutes"] <= 10  # idle workers terminate
    assert prepared["provider"].get("cache_stopped_nodes") is False  # terminated, not stopped
    head = prepared["available_node_types"][prepared["head_node_type"]]
    workers = [v for k, v in prepared["available_node_types"].items() if k != prepared["head_node_type"]]
    assert head["resources"] == {"CPU": 0}  # tasks run on workers only
    assert workers and all(w["min_workers"] == 0 and w["max_workers"] >= 1 for w in workers)
    setup = "\n".join(prepared["setup_commands"])
    assert "mlm-pipeline[" in setup and "MLM_OUTPUT=" in setup
    scheme = {"aws": "s3://", "gcp": "gs://"}[cloud]
    assert f"MLM_OUTPUT={scheme}" in setup
    for cmd in prepared["head_start_ray_commands"] + prepared["worker_start_ray_commands"]:
        if " start " in cmd:
            assert "RAY_AUTH_MODE=" in cmd and "--object-store-memory=" in cmd


@pytest.mark.ray
def test_launcher_validation_rejects_a_broken_config():
    import jsonschema
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load(LAUNCHER["aws"].read_text())
    raw["idle_timeout_minutes"] = "soon"
    with pytest.raises(jsonschema.ValidationError):
        validate_config(prepare_config(raw))


def test_kuberay_rayjob_manifest():
    job = yaml.safe_load((REPO / "deploy" / "kuberay" / "rayjob.yaml").read_text())
    assert job["apiVersion"] == "ray.io/v1" and job["kind"] == "RayJob"
    spec = job["spec"]
    assert spec["entrypoint"].split()[:2] == ["mlm-pipeline", "prepare"]
    assert "--executor ray" in spec["entrypoint"] and "--output s3://" in spec["entrypoint"]
    assert spec["shutdownAfterJobFinishes"] is True and spec["ttlSecondsAfterFinished"] > 0
    assert spec["activeDeadlineSeconds"] > 0
    cluster = spec["rayClusterSpec"]
    assert cluster["enableInTreeAutoscaling"] is True and cluster["autoscalerOptions"]["idleTimeoutSeconds"] > 0
    assert cluster["headGroupSpec"]["rayStartParams"]["num-cpus"] == "0"
    groups = [cluster["headGroupSpec"]] + cluster["workerGroupSpecs"]
    for group in groups:
        assert "object-store-memory" in group["rayStartParams"]
        (container,) = group["template"]["spec"]["containers"]
        env = {e["name"]: e["value"] for e in container["env"]}
        assert env["RAY_AUTH_MODE"] and env["TOKENIZERS_PARALLELISM"] == "false"
        assert container["resources"]["limits"]["memory"]
    for w in cluster["workerGroupSpecs"]:
        assert w["minReplicas"] == 0 <= w["replicas"] <= w["maxReplicas"]
