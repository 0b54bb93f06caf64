"""When a claim worker exits: once every task is complete, never while another worker holds a
live lease on an unfinished one. VM groups delete a VM when its worker exits 0 (docs/cloud.md
says so), so a worker that left on "claimed by a live worker" would leave the run to the others."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from conftest import REPO, SAMPLE_TEXT, VOCAB, WIKITEXT
from mlm_pipeline.executors.leases import LeaseManager
from mlm_pipeline.run import layout

LEASE = 4.0


def test_a_claim_worker_waits_for_the_task_a_live_worker_holds_then_exits_0(tmp_path):
    out = tmp_path / "out"
    cmd = [sys.executable, "-m", "mlm_pipeline.cli", "prepare", str(SAMPLE_TEXT), str(WIKITEXT), "-o", str(out),
           "-t", str(VOCAB), "--split-size", "256KiB", "--claim", "--lease-seconds", str(LEASE), "--workers", "1",
           "--no-progress"]
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "src"), os.environ.get("PYTHONPATH", "")])}
    subprocess.run(cmd, env=env, check=True, capture_output=True, timeout=300)  # the whole run, alone
    # another worker holds the last task, alive (renewing its lease); this one finds the rest done
    task = "00001"
    os.remove(layout.marker_url(str(out), task))
    os.remove(layout.manifest_url(str(out)))
    other = LeaseManager(str(out), "other-host-7-cafe", LEASE)
    lease = other.try_acquire(task)
    assert lease is not None
    stop = threading.Event()

    def keep_alive():
        while not stop.wait(LEASE / 4):
            assert other.renew(lease)

    alive = threading.Thread(target=keep_alive)
    alive.start()
    try:
        worker = subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        time.sleep(3 * LEASE)  # past any lease that was not renewed
        assert worker.poll() is None, worker.communicate()  # still waiting for the held task
    finally:
        stop.set()
        alive.join()
    other.release(lease)  # the other worker went away without finishing: this one takes the task
    stdout, stderr = worker.communicate(timeout=120)
    assert worker.returncode == 0, stderr
    assert f"ran 1 task(s) ({task})" in stdout and "this worker completed the run and wrote manifest.json" in stdout
    assert os.path.exists(layout.manifest_url(str(out)))
