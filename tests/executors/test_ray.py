"""The Ray executor on a real multi-node Ray cluster (head + 2 worker nodes on 127.0.0.1).

Output must equal the local executor's byte for byte, also when a worker node is killed mid-run.
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import pytest

from conftest_servers import run_killing_a_worker_node
from helpers_run import INPUTS, SETTINGS, VOCAB, comparable, make_config, shard_table

pytestmark = pytest.mark.ray


def _files_equal(a: Path, b: Path, manifest: dict) -> None:
    for s in manifest["shards"]:
        assert (a / s["path"]).read_bytes() == (b / s["path"]).read_bytes(), s["path"]


def test_ray_output_equals_local_byte_for_byte(ray_cluster, local_baseline, tmp_path):
    from mlm_pipeline.pipeline import run_prepare

    assert local_baseline["tasks"] >= 8
    progress = []
    config = make_config(INPUTS, tmp_path, executor="ray", ray_address=ray_cluster.address)

    import mlm_pipeline.progress as progress_mod

    real_update = progress_mod.Progress.update

    def spy(self, delta):
        progress.append(delta)
        real_update(self, delta)

    progress_mod.Progress.update = spy
    try:
        manifest = run_prepare(config, show_progress=False)
    finally:
        progress_mod.Progress.update = real_update
    assert comparable(manifest) == comparable(local_baseline)
    _files_equal(local_baseline["_dir"], tmp_path, manifest)
    # one progress report per finished task, adding up to the input read
    assert len(progress) == manifest["tasks"]
    assert sum(p["bytes"] for p in progress) == manifest["totals"]["bytes_read"]
    # the run connected to the cluster and disconnected again; the cluster is still there
    import ray

    assert not ray.is_initialized()
    assert len([n for n in ray_cluster.list_all_nodes()]) == 3


def test_rerun_on_ray_resumes_nothing_to_do(ray_cluster, tmp_path, local_baseline):
    from mlm_pipeline.pipeline import run_prepare

    config = make_config(INPUTS, tmp_path, executor="ray", ray_address=ray_cluster.address)
    first = run_prepare(make_config(INPUTS, tmp_path), show_progress=False)  # local run first
    stamp = {p.name: p.stat().st_mtime_ns for p in (tmp_path / "shards").iterdir()}
    second = run_prepare(config, show_progress=False)
    assert shard_table(second) == shard_table(first) == shard_table(local_baseline)
    assert {p.name: p.stat().st_mtime_ns for p in (tmp_path / "shards").iterdir()} == stamp


def test_array_shares_run_on_ray_add_up_to_the_local_run(ray_cluster, local_baseline, tmp_path):
    """Array mode is a task filter any executor applies: two ranks on Ray give the local run's shards."""
    from mlm_pipeline.pipeline import run_prepare

    summaries = [run_prepare(make_config(INPUTS, tmp_path, executor="ray", ray_address=ray_cluster.address,
                                         task_rank=rank, task_count=2), show_progress=False) for rank in (0, 1)]
    tasks = [f"{i:05d}" for i in range(local_baseline["tasks"])]
    assert sorted(summaries[0]["ran"]) == tasks[0::2] and sorted(summaries[1]["ran"]) == tasks[1::2]
    assert summaries[0]["manifest"] is None  # rank 1 finished last and wrote it
    assert comparable(summaries[1]["manifest"]) == comparable(local_baseline)
    _files_equal(local_baseline["_dir"], tmp_path, summaries[1]["manifest"])


def test_failed_task_reports_its_input_range(ray_cluster, tmp_path):
    from mlm_pipeline.errors import InputError, TaskFailed
    from mlm_pipeline.pipeline import run_prepare

    bad = tmp_path / "bad.txt"
    bad.write_bytes(b"A good sentence here.\nAnother one.\n\nBroken \xff\xfe bytes in this line.\n")
    config = make_config([bad], tmp_path / "out", executor="ray", ray_address=ray_cluster.address,
                         on_decode_error="fail")
    with pytest.raises(TaskFailed) as info:
        run_prepare(config, show_progress=False)
    assert isinstance(info.value.cause, InputError)
    assert f"{bad} [bytes 0:end]" in str(info.value)
    assert not list((tmp_path / "out").glob("_tasks/*.json"))
    assert not list((tmp_path / "out").glob("shards/*"))


def test_ray_workers_write_to_s3_with_the_endpoint_given_in_the_config(ray_cluster, seaweedfs, local_baseline,
                                                                      monkeypatch):
    """Output on S3 from the worker nodes; only the config carries the endpoint to them."""
    from mlm_pipeline.pipeline import run_prepare

    for key, value in seaweedfs.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL")  # restored (absent) after the test
    out = seaweedfs.new_prefix("ray")
    config = make_config(INPUTS, out, executor="ray", ray_address=ray_cluster.address,
                         s3_endpoint_url=seaweedfs.endpoint)
    manifest = run_prepare(config, show_progress=False)
    assert comparable(manifest) == comparable(local_baseline)
    assert sorted(k for k in seaweedfs.keys(out) if k.startswith("shards/")) == sorted(
        s["path"] for s in manifest["shards"])


def test_ray_workers_get_the_endpoint_from_the_drivers_environment(ray_cluster, seaweedfs, local_baseline,
                                                                  monkeypatch, caplog):
    """AWS_ENDPOINT_URL set for the driver alone (the cluster's nodes started without it): the
    workers write to the same S3 endpoint, and no credential value is logged."""
    import logging

    from conftest_servers import SECRET_KEY
    from mlm_pipeline.pipeline import run_prepare

    assert "AWS_ENDPOINT_URL" not in ray_cluster.env
    for key, value in seaweedfs.env().items():
        monkeypatch.setenv(key, value)
    out = seaweedfs.new_prefix("ray-env")
    config = make_config(INPUTS, out, executor="ray", ray_address=ray_cluster.address)
    with caplog.at_level(logging.INFO, logger="mlm_pipeline"):
        manifest = run_prepare(config, show_progress=False)
    assert comparable(manifest) == comparable(local_baseline)
    assert sorted(k for k in seaweedfs.keys(out) if k.startswith("shards/")) == sorted(
        s["path"] for s in manifest["shards"])
    logged = "\n".join(r.getMessage() for r in caplog.records)
    assert "AWS_ENDPOINT_URL" in logged and SECRET_KEY not in logged


def test_without_an_address_a_private_local_instance_is_started(ray_cluster, tmp_path):
    """Never another cluster of this machine: plain ray.init() would join the test cluster."""
    import ray

    from mlm_pipeline.executors.ray import connect
    from mlm_pipeline.pipeline import run_prepare

    assert (Path(os.environ["RAY_TMPDIR"]) / "ray" / "ray_current_cluster").read_text().strip() == ray_cluster.address
    assert connect(None, num_cpus=1)
    try:
        assert ray.get_runtime_context().gcs_address != ray_cluster.address
        assert ray.cluster_resources()["CPU"] == 1
        manifest = run_prepare(make_config(INPUTS[1:], tmp_path, executor="ray"), show_progress=False)
        assert ray.is_initialized()  # the caller's connection is left alone
    finally:
        ray.shutdown()
    assert manifest["totals"]["instances"] > 0


def test_killing_a_worker_node_mid_run_still_gives_identical_output(ray_cluster, local_baseline, tmp_path):
    """The CLI as a driver; one worker node is killed (all its processes, SIGKILL) mid-run."""
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", *INPUTS, "-o", str(out), "-t", VOCAB,
           "--executor", "ray", "--ray-address", ray_cluster.address, "--no-progress",
           "--split-size", SETTINGS["split_bytes"], "--block-size", SETTINGS["block_bytes"],
           "--max-instances-per-shard", str(SETTINGS["max_instances_per_shard"])]
    returncode, stderr, done_before_kill = run_killing_a_worker_node(ray_cluster, cmd, out, first_task_seconds=120,
                                                                     run_seconds=180)
    assert returncode == 0, stderr
    assert done_before_kill < local_baseline["tasks"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert comparable(manifest) == comparable(local_baseline)
    _files_equal(local_baseline["_dir"], out, manifest)
    # only complete shards are visible: exactly the manifest's, each with its recorded digest
    assert sorted(os.listdir(out / "shards")) == sorted(Path(s["path"]).name for s in manifest["shards"])
    # put a node back for any later test of this module
    from conftest_servers import RAY_NODE

    ray_cluster.add_node(num_cpus=1, **RAY_NODE)


def _private_mounts() -> bool:
    """Whether this process may give a child a mount namespace of its own (root, and not forbidden
    by a container)."""
    import shutil
    import subprocess

    return bool(shutil.which("unshare")) and subprocess.run(
        ["unshare", "--mount", "--propagation", "private", "true"], capture_output=True).returncode == 0


@pytest.mark.skipif(not _private_mounts(), reason="needs unshare --mount (root, outside a restricted container)")
def test_a_local_output_the_nodes_do_not_see_is_refused(ray_cluster, tmp_path):
    """A node without the shared filesystem: the driver runs in a mount namespace of its own where
    the output's parent is a tmpfs, so the cluster's nodes see another (empty) directory at that
    path. The run stops before any task, and nothing reaches the directory the nodes see."""
    import shlex
    import subprocess

    from conftest_servers import subprocess_env

    private = tmp_path / "private"
    private.mkdir()
    out = private / "out"
    cmd = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", *INPUTS, "-o", str(out), "-t", VOCAB,
           "--executor", "ray", "--ray-address", ray_cluster.address, "--no-progress"]
    script = f"mount -t tmpfs tmpfs {shlex.quote(str(private))} && exec {shlex.join(cmd)}"
    res = subprocess.run(["unshare", "--mount", "--propagation", "private", "sh", "-c", script],
                         env=subprocess_env(ray_cluster.env), capture_output=True, text=True, timeout=300)
    assert res.returncode == 2, res.stderr
    assert f"--output {out} is a directory of this machine that" in res.stderr
    assert "nodes with CPUs do not see (at 127.0.0.1)" in res.stderr
    assert "Give an object-store URL" in res.stderr
    assert list(private.iterdir()) == []


def test_a_hung_upload_on_ray_is_ended_and_its_task_run_again(ray_cluster, seaweedfs, local_baseline, monkeypatch):
    """A Ray task runs under the stall alarm: the proxy holds the first shard upload for 30 s, the
    task is interrupted after --stall-seconds 2 and runs again in its worker, and the run ends
    well before the held request would have, with the local run's shards."""
    import time

    from faults.faulty_proxy import FaultyProxy
    from mlm_pipeline.pipeline import run_prepare

    for key, value in seaweedfs.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.delenv("AWS_ENDPOINT_URL")
    proxy = FaultyProxy(seaweedfs.endpoint, ["slow"], budget=1, slow_seconds=30,
                        only=lambda head: head.startswith(b"PUT ") and b"/shards/" in head.split(b"\r\n", 1)[0])
    try:
        out = seaweedfs.new_prefix("ray-stall")
        config = make_config(INPUTS, out, executor="ray", ray_address=ray_cluster.address,
                             s3_endpoint_url=proxy.endpoint, stall_seconds=2)
        started = time.monotonic()
        manifest = run_prepare(config, show_progress=False)
        took = time.monotonic() - started
    finally:
        proxy.close()
    assert proxy.injected == {"slow": 1}
    assert took < 30, took  # the held upload did not hold the run
    assert comparable(manifest) == comparable(local_baseline)


def test_a_node_gone_since_it_was_listed_is_left_out_of_the_node_check(ray_cluster, tmp_path, monkeypatch):
    """ray.nodes() can list as alive a node that is gone by the time its probe is scheduled (a full
    suite once failed so: TaskUnschedulableError, a traceback and exit 1): that node runs no task,
    so the check goes on with the others. The listing gets a node id no cluster has."""
    import ray

    from mlm_pipeline.executors.ray import check_output_seen_by_every_node, connect

    listed = ray.nodes
    gone = {"NodeID": "ab" * 28, "Alive": True, "Resources": {"CPU": 1.0}, "NodeManagerAddress": "127.0.0.9"}
    monkeypatch.setattr(ray, "nodes", lambda: [*listed(), gone])
    assert connect(ray_cluster.address)
    try:
        check_output_seen_by_every_node(str(tmp_path / "out"))  # raised TaskUnschedulableError
    finally:
        ray.shutdown()
    assert list((tmp_path / "out" / "_tmp").iterdir()) == []


@pytest.mark.parametrize("objective,scheme", [("sop", "ngram"), ("nsp", "span")])
def test_every_masking_scheme_gives_the_local_bytes_on_ray(ray_cluster, tmp_path, objective, scheme):
    """ALBERT's pairs with their n-gram masks, and SpanBERT's spans: the same shards on the Ray
    cluster as in one local process, task for task."""
    from mlm_pipeline.pipeline import run_prepare

    settings = {"objective": objective, "masking_scheme": scheme, "split_bytes": "256KiB"}
    local = run_prepare(make_config(INPUTS, tmp_path / "local", **settings), show_progress=False)
    on_ray = run_prepare(make_config(INPUTS, tmp_path / "ray", executor="ray", ray_address=ray_cluster.address,
                                     **settings), show_progress=False)
    assert local["tasks"] >= 4 and local["masking_scheme"]["name"] == scheme
    assert shard_table(on_ray) == shard_table(local)
    _files_equal(tmp_path / "local", tmp_path / "ray", local)


def test_languages_sampled_by_alpha_give_the_local_bytes_on_ray(ray_cluster, tmp_path):
    """--language-alpha: the counting pass and the repeats and subsampling it leads to make the
    same shards on the Ray cluster as in one local process."""
    from mlm_pipeline.pipeline import run_prepare

    settings = {"language": [f"en={INPUTS[0]}", f"und={INPUTS[1]}"], "language_alpha": 0.3, "objective": "packed",
                "split_bytes": "256KiB"}
    local = run_prepare(make_config([], tmp_path / "local", **settings), show_progress=False)
    on_ray = run_prepare(make_config([], tmp_path / "ray", executor="ray", ray_address=ray_cluster.address,
                                     **settings), show_progress=False)
    assert local["tasks"] >= 4 and local["languages"]["rates"]["und"] > 1 > local["languages"]["rates"]["en"]
    assert shard_table(on_ray) == shard_table(local)
    _files_equal(tmp_path / "local", tmp_path / "ray", local)
