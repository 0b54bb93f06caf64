"""A Ray worker node killed mid-run (all its processes, SIGKILL) on a real 2-node cluster: the
lost tasks are retried on the other node and the run completes to the clean bytes."""

from __future__ import annotations

import sys

import pytest

from conftest_servers import RAY_NODE, run_killing_a_worker_node
from faults.helpers import assert_as_clean, prepare_args

pytestmark = [pytest.mark.ray, pytest.mark.slow]


def test_a_killed_ray_worker_node_costs_only_a_retry(ray_cluster, corpus, clean_run, tmp_path, tally):
    clean = clean_run("parquet")
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, out),
           "--executor", "ray", "--ray-address", ray_cluster.address]
    try:
        returncode, stderr, done_before_kill = run_killing_a_worker_node(ray_cluster, cmd, out, first_task_seconds=180,
                                                                         run_seconds=300)
    finally:
        ray_cluster.add_node(num_cpus=1, **RAY_NODE)  # put a node back for later tests
    assert returncode == 0, stderr[-3000:]
    assert done_before_kill < clean["tasks"]
    assert_as_clean(out, clean)
    tally.record("Ray worker node killed")
