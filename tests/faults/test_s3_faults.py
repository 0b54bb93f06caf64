"""S3 faults between the pipeline and a real S3 server (SeaweedFS): connection resets, 500 and 503
answers, slow answers and uploads cut midway, injected by a proxy on 127.0.0.1 (:mod:`.faulty_proxy`).
The storage client's retries carry the run through, to the clean run's bytes; an endpoint that
cannot be reached at all gives one line naming it."""

from __future__ import annotations

import json
import re
import subprocess
import sys
import time

import pytest

from conftest_servers import free_ports, s3_env, subprocess_env
from faults.faulty_proxy import FaultyProxy
from faults.helpers import documents_lost, prepare_args, shard_table

pytestmark = [pytest.mark.s3, pytest.mark.slow]

CYCLE = ["ok", "reset", "ok", "503", "ok", "slow", "ok", "500", "ok", "cut-upload", "ok", "ok"]


def test_a_run_through_s3_faults_completes_with_the_clean_bytes(seaweedfs, corpus, clean_run, tally):
    clean = clean_run("parquet")
    proxy = FaultyProxy(seaweedfs.endpoint, CYCLE, budget=20, slow_seconds=1.0)
    out = seaweedfs.new_prefix("faults")
    try:
        env = subprocess_env({**seaweedfs.env(), "AWS_ENDPOINT_URL": proxy.endpoint})
        run = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, out)],
                             capture_output=True, text=True, timeout=400, env=env)
    finally:
        proxy.close()
    assert run.returncode == 0, run.stderr[-3000:]
    assert {"reset", "503", "500", "slow", "cut-upload"} <= set(proxy.injected), proxy.injected

    bucket, prefix = out[len("s3://"):].split("/", 1)
    manifest = json.loads(seaweedfs.client().get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())
    assert shard_table(manifest) == shard_table(clean)
    assert documents_lost(manifest, clean) == 0
    keys = seaweedfs.keys(out)
    assert not [k for k in keys if ".tmp-" in k or k.endswith(".lock") or k.startswith("_tmp/")]
    with s3_env(seaweedfs):
        from mlm_pipeline.verify import verify_output

        result = verify_output(out)
    assert result.ok and result.checked == len(clean["shards"])
    tally.record(f"S3 faults ({', '.join(f'{n} {k}' for k, n in sorted(proxy.injected.items()))})",
                 injected=sum(proxy.injected.values()), recovered=sum(proxy.injected.values()))


def _one_worker_run_with_one_request_held(seaweedfs, inputs, out, only) -> tuple[subprocess.CompletedProcess, float]:
    """``prepare --workers 1 --stall-seconds 2`` through a proxy that holds the first request
    ``only`` picks for 30 s: (the finished run, its seconds). The run must succeed, the request held."""
    proxy = FaultyProxy(seaweedfs.endpoint, ["slow"], budget=1, slow_seconds=30, only=only)
    try:
        env = subprocess_env({**seaweedfs.env(), "AWS_ENDPOINT_URL": proxy.endpoint})
        started = time.monotonic()
        run = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare",
                              *prepare_args(inputs, out, workers=1), "--stall-seconds", "2"],
                             capture_output=True, text=True, timeout=400, env=env)
        took = time.monotonic() - started
    finally:
        proxy.close()
    assert run.returncode == 0, run.stderr[-3000:]
    assert proxy.injected == {"slow": 1}
    return run, took


def test_a_hung_upload_in_a_one_worker_run_is_ended_and_its_task_run_again(seaweedfs, corpus, clean_run, tally):
    """With one worker, tasks run in the ``prepare`` process itself: a shard upload that hangs
    (the proxy holds the first one for 30 s) is interrupted by the stall alarm after
    ``--stall-seconds``, the task runs again, and the run completes with the clean bytes."""
    clean = clean_run("parquet")
    out = seaweedfs.new_prefix("stall")
    run, took = _one_worker_run_with_one_request_held(
        seaweedfs, corpus, out, lambda head: head.startswith(b"PUT ") and b"/shards/" in head.split(b"\r\n", 1)[0])
    assert re.search(r"task \d+ showed no progress for 2 s \(--stall-seconds\); running it again \(2 of 3\)",
                     run.stderr), run.stderr[-3000:]
    assert took < 30  # the hung upload did not hold the run up
    bucket, prefix = out[len("s3://"):].split("/", 1)
    manifest = json.loads(seaweedfs.client().get_object(Bucket=bucket, Key=f"{prefix}/manifest.json")["Body"].read())
    assert shard_table(manifest) == shard_table(clean)
    assert documents_lost(manifest, clean) == 0
    tally.record("hung S3 upload, one worker (stall alarm)", injected=1, recovered=1)


def test_a_hung_read_of_a_compressed_input_is_a_stall_not_a_corrupt_file(seaweedfs, tmp_path):
    """The stall alarm goes off while the decompressor waits for the object's bytes (the proxy
    holds the task's read of a .gz for 30 s): the task runs again, it is not failed as a corrupt
    or truncated file, and the output is a local run's of the same file."""
    import gzip

    from faults.helpers import SOURCES
    from mlm_pipeline.pipeline import run_prepare

    from faults.helpers import run_config

    data = gzip.compress(SOURCES[0].read_bytes() * 3)
    local = tmp_path / "in" / "corpus.txt.gz"
    local.parent.mkdir()
    local.write_bytes(data)
    clean = run_prepare(run_config(local, tmp_path / "clean"), show_progress=False)
    key = seaweedfs.new_prefix("gz-in").split("/", 3)[3] + "/corpus.txt.gz"
    seaweedfs.client().put_object(Bucket=seaweedfs.bucket, Key=key, Body=data)

    def the_tasks_read(head: bytes) -> bool:  # not the planner's: it reads a head of 8 KiB
        found = re.search(rb"^GET \S*corpus\.txt\.gz .*\r\nrange: bytes=0-(\d+)", head, re.I | re.S)
        return found is not None and int(found.group(1)) > 100_000

    out = tmp_path / "out"
    run, took = _one_worker_run_with_one_request_held(seaweedfs, f"s3://{seaweedfs.bucket}/{key}", out, the_tasks_read)
    assert "task 00000 showed no progress for 2 s (--stall-seconds); running it again (2 of 3)" in run.stderr
    assert "corrupt" not in run.stderr and took < 30
    assert shard_table(json.loads((out / "manifest.json").read_text())) == shard_table(clean)


def test_an_unreachable_endpoint_is_one_line_naming_it(corpus, tmp_path, seaweedfs):
    (port,) = free_ports(1)  # nothing listens there
    endpoint = f"http://127.0.0.1:{port}"
    env = subprocess_env({**seaweedfs.env(), "AWS_ENDPOINT_URL": endpoint})
    run = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "prepare", *prepare_args(corpus, "s3://mlm-test/x"),
                          "--s3-endpoint-url", endpoint], capture_output=True, text=True, timeout=300, env=env)
    assert run.returncode == 1
    assert "Traceback" not in run.stderr, run.stderr[-2000:]
    errors = [line for line in run.stderr.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and len(run.stderr.splitlines()) < 5, run.stderr[-2000:]
    assert errors[0].startswith(f"error: storage error ({endpoint}): EndpointConnectionError")
