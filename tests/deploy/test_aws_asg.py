"""deploy/aws-asg: the real startup script on "instances" (bash processes) of an Auto Scaling group.

Each instance has its own instance metadata service (127.0.0.1, IMDSv2: a token first, then every
read with it) serving the instance tags that ``create-group.sh`` put in the launch template (run
with the stand-in ``aws``, which records the template), plus the tag the group adds. The bucket is
the SeaweedFS S3 server; its endpoint reaches the instances through the ``mlm-s3-endpoint-url``
tag only. The instances install the wheel of this checkout from the bucket, claim tasks together,
upload their logs and terminate themselves through the group.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys

import pytest

from conftest_servers import s3_env
from helpers_run import comparable, read_manifest

from .vm_harness import (AWS_DIR, PREPARE_ARGS, aws_launch_template, aws_metadata, freeze_holding_a_lease,
                         group_calls, leases_of, listing, put, read_text, run_create_group, start_vm, user_data,
                         wait_until)

pytestmark = pytest.mark.s3

REGION, GROUP = "eu-west-1", "mlm-workers"


def create_group(s3, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir, args: str):
    """Upload what the instances need, run create-group.sh (its check of the settings reads the
    bucket); returns (instance tags, output)."""
    prefix = s3.new_prefix("asg")
    with s3_env(s3):
        for f in sorted(corpus_dir.iterdir()):
            put(f, f"{prefix}/corpus/{f.name}")
        put(tokenizer_dir / "vocab.txt", f"{prefix}/deploy/vocab.txt")
        put(wheel, f"{prefix}/deploy/{wheel.name}")
    out = f"{prefix}/out"
    settings = {"BUCKET": s3.bucket, "PACKAGE": f"{prefix}/deploy/{wheel.name}", "INPUTS": f"{prefix}/corpus/",
                "OUTPUT": out, "TOKENIZER": f"{prefix}/deploy/vocab.txt", "ARGS": args,
                "S3_ENDPOINT_URL": s3.endpoint, "SUBNETS": "subnet-0aa,subnet-0bb", "GROUP": GROUP,
                "REGION": REGION, "SIZE": "2"}
    record = run_create_group(AWS_DIR / "create-group.sh", {**settings, **s3.env()}, tmp_path / "create.jsonl",
                              cloud_cli)
    data, tags, asg = aws_launch_template(record)
    assert user_data(data) == (AWS_DIR / "startup.sh").read_text()
    assert data["MetadataOptions"]["HttpTokens"] == "required"  # IMDSv2 only
    assert data["MetadataOptions"]["InstanceMetadataTags"] == "enabled"  # the settings below, through IMDS
    assert data["InstanceInitiatedShutdownBehavior"] == "terminate"
    assert {k: v for k, v in tags.items() if k.startswith("mlm-")} == {
        "mlm-output": out, "mlm-inputs": f"{prefix}/corpus/", "mlm-tokenizer": f"{prefix}/deploy/vocab.txt",
        "mlm-package": f"{prefix}/deploy/{wheel.name}", "mlm-args": args, "mlm-s3-endpoint-url": s3.endpoint,
        "mlm-max-hours": "24"}
    argv = asg["argv"]
    assert argv[argv.index("--min-size") + 1] == "0"  # so the last instance can leave too
    assert argv[argv.index("--desired-capacity") + 1] == argv[argv.index("--max-size") + 1] == "2"
    return user_data(data), tags, out


def boot(instance_id, script, tags, s3, tmp_path, cloud_cli, image, tokenizer_dir, venv=None):
    server = aws_metadata(instance_id, REGION, {**tags, "aws:autoscaling:groupName": GROUP})
    store = {k: v for k, v in s3.env().items() if k != "AWS_ENDPOINT_URL"}  # the tag gives it
    return start_vm(script, instance_id, tmp_path, metadata=server, bin_dir=cloud_cli, site=image,
                    tokenizer_dir=tokenizer_dir, store_env=store, venv=venv)


def terminate_call(instance_id: str) -> list[str]:
    return ["autoscaling", "terminate-instance-in-auto-scaling-group", "--instance-id", instance_id,
            "--should-decrement-desired-capacity", "--region", REGION]


def test_group_of_two_completes_and_each_instance_terminates_itself_once(seaweedfs, tmp_path, cloud_cli, image,
                                                                         image_venv, wheel, corpus_dir,
                                                                         tokenizer_dir, group_baseline):
    script, tags, out = create_group(seaweedfs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir,
                                     f"{PREPARE_ARGS} --lease-seconds 30")
    vms = [boot(i, script, tags, seaweedfs, tmp_path, cloud_cli, image, tokenizer_dir, image_venv)
           for i in ("i-0a1b2c3d4e5f60718", "i-0f9e8d7c6b5a40312")]
    try:
        for vm in vms:
            assert vm.wait(150) == 0, vm.output()
    finally:
        for vm in vms:
            vm.stop()
    for vm in vms:
        calls = vm.calls()
        assert [c["argv"] for c in group_calls(calls)] == [terminate_call(vm.name)]  # exactly one, itself
        assert all(c["status"] == 0 for c in calls)
        log_url = f"{out}/_logs/{vm.name}.log"
        upload_log = ["s3", "cp", str(vm.work / "state" / "worker.log"), log_url]
        upload = [i for i, c in enumerate(calls) if c["words"] == upload_log]
        leave = [i for i, c in enumerate(calls) if c["argv"] == terminate_call(vm.name)]
        assert len(upload) == 1 and upload[0] < leave[0]  # the log went up before the VM left its group
        # IMDSv2: one token, then every read with it (the server answers 401 without)
        requests = vm.server.requests
        assert requests[0][:2] == ("PUT", "/latest/api/token")
        assert all(status in (200, 404) for _, _, status in requests), requests
        with s3_env(seaweedfs):
            log = read_text(log_url)
        assert f"instance {vm.name} in region {REGION}, group {GROUP}" in log
        assert "prepare exited 0: every task of the run is complete" in log

    env = {**os.environ, **seaweedfs.env()}
    done = subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "finalize", out], env=env,
                          capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    with s3_env(seaweedfs):
        assert comparable(read_manifest(out)) == comparable(group_baseline)
    assert sorted(seaweedfs.keys(f"{out}/_logs")) == sorted(f"{vm.name}.log" for vm in vms)
    assert seaweedfs.keys(f"{out}/_leases") == []


def test_instance_killed_mid_task_never_terminates_and_its_task_is_taken_over(
        seaweedfs, tmp_path, cloud_cli, image, image_venv, wheel, corpus_dir, tokenizer_dir, group_baseline):
    """The whole instance dies (script and prepare, SIGKILL): no terminate call, no log; the
    other instance takes its task over once the lease expires."""
    script, tags, out = create_group(seaweedfs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir,
                                     f"{PREPARE_ARGS} --lease-seconds 4")
    doomed = boot("i-0dead0000000000d1", script, tags, seaweedfs, tmp_path, cloud_cli, image, tokenizer_dir,
                  image_venv)
    vms = [doomed]
    try:
        with s3_env(seaweedfs):
            _, held = wait_until(lambda: freeze_holding_a_lease(doomed, out), 120,
                                 "the first instance to hold a lease", vms=vms)
        rescuer = boot("i-0a11ve00000000a2", script, tags, seaweedfs, tmp_path, cloud_cli, image, tokenizer_dir,
                       image_venv)
        vms.append(rescuer)
        doomed.kill()
        assert rescuer.wait(150) == 0, rescuer.output()
    finally:
        for vm in vms:
            vm.stop()
    assert group_calls(doomed.calls()) == []
    assert [c["argv"] for c in group_calls(rescuer.calls())] == [terminate_call(rescuer.name)]
    assert seaweedfs.keys(f"{out}/_logs") == [f"{rescuer.name}.log"]
    with s3_env(seaweedfs):
        rescuer_log = read_text(f"{out}/_logs/{rescuer.name}.log")
        assert comparable(read_manifest(out)) == comparable(group_baseline)
    for task, owner in held:
        assert re.search(rf"task {task}: took over the expired lease of {re.escape(owner)}", rescuer_log), rescuer_log


def test_a_usage_error_is_not_retried_and_the_instance_terminates_itself_after_uploading_its_log(
        seaweedfs, tmp_path, cloud_cli, image, image_venv, wheel, corpus_dir, tokenizer_dir):
    """Exit 2 fails every instance the same way (here settings that differ from those
    create-group.sh checked: its tags edited since): the instance leaves its group, log first."""
    script, tags, out = create_group(seaweedfs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir,
                                     f"{PREPARE_ARGS} --lease-seconds 30")
    tags = {**tags, "mlm-args": "--max-seq-length 4"}
    vm = boot("i-0bad0000000000b1", script, tags, seaweedfs, tmp_path, cloud_cli, image, tokenizer_dir, image_venv)
    try:
        assert vm.wait(120) == 2, vm.output()
    finally:
        vm.stop()
    calls = vm.calls()
    assert [c["argv"] for c in group_calls(calls)] == [terminate_call(vm.name)]
    upload = [i for i, c in enumerate(calls) if c["words"][:2] == ["s3", "cp"] and c["words"][3].endswith(".log")]
    assert len(upload) == 1 and upload[0] < calls.index(group_calls(calls)[0])  # the log first
    with s3_env(seaweedfs):
        log = read_text(f"{out}/_logs/{vm.name}.log")
        assert listing(f"{out}/_tasks") == []
    assert log.count("prepare --claim, attempt") == 1  # status 2 is no transient failure
    assert "max-seq-length: Input should be greater than or equal to 8" in log
    assert "prepare exited 2" in log and "this VM leaves its group" in log and "stays in its group" not in log


def test_instance_shut_down_mid_task_stops_prepare_uploads_its_log_and_stays(
        seaweedfs, tmp_path, cloud_cli, image, image_venv, wheel, corpus_dir, tokenizer_dir):
    """A Spot interruption or a shutdown sends SIGTERM to the script: it stops prepare, uploads
    its log and exits without terminating itself through the group."""
    script, tags, out = create_group(seaweedfs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir,
                                     f"{PREPARE_ARGS} --lease-seconds 30")
    vm = boot("i-0s1g7e0000000000e", script, tags, seaweedfs, tmp_path, cloud_cli, image, tokenizer_dir, image_venv)
    try:
        with s3_env(seaweedfs):
            pid = wait_until(lambda: vm.prepare_pid() if leases_of(out, vm.prepare_pid() or -1) else None, 120,
                             "the instance to hold a lease", vms=[vm])
        vm.proc.send_signal(signal.SIGTERM)
        assert vm.wait(60) == 128 + signal.SIGTERM, vm.output()
    finally:
        vm.stop()
    with pytest.raises(ProcessLookupError):
        os.kill(pid, 0)  # prepare was stopped with the script
    assert group_calls(vm.calls()) == []
    with s3_env(seaweedfs):
        log = read_text(f"{out}/_logs/{vm.name}.log")
    assert "stopped by signal 15" in log and "this VM stays in its group" in log
