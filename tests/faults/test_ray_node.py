"""A Ray worker node killed mid-run (all its processes, SIGKILL) on a real 2-node cluster: the
lost tasks are retried on the other node and the run completes to the clean bytes."""

from __future__ import annotations

import subprocess
import sys
import time

import pytest

from conftest_servers import RAY_NODE, subprocess_env
from faults.helpers import assert_as_clean, prepare_args

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_killed_ray_worker_node_costs_only_a_retry(ray_cluster, corpus, clean_run, tmp_path, tally):
    clean = clean_run("parquet")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, out),
           "--executor", "ray", "--ray-address", ray_cluster.address]
    proc = subprocess.Popen(cmd, env=subprocess_env(ray_cluster.env), stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.time() + 180
        while not (out / "_tasks").exists() or not any((out / "_tasks").glob("*.json")):
            assert proc.poll() is None, proc.communicate()
            assert time.time() < deadline, "no task finished in time"
            time.sleep(0.02)
        done_before_kill = len(list((out / "_tasks").glob("*.json")))
        victim = sorted(ray_cluster.worker_nodes, key=lambda n: n.unique_id)[0]
        ray_cluster.remove_node(victim, allow_graceful=False)
        _, stderr = proc.communicate(timeout=300)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        ray_cluster.add_node(num_cpus=1, **RAY_NODE)  # put a node back for later tests
    assert proc.returncode == 0, stderr[-3000:]
    assert done_before_kill < clean["tasks"]
    assert_as_clean(out, clean)
    tally.record("Ray worker node killed")
