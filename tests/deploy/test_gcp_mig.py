"""deploy/gcp-mig: the real startup script on "VMs" (bash processes) of a managed instance group.

Each VM has its own metadata server (127.0.0.1, GCP flavour) serving the attributes that
``create-group.sh`` put in the instance template (run with the stand-in ``gcloud``, which records
the template), plus the ``created-by`` attribute a group sets. The bucket is fake-gcs-server
(``gs://``, through gcsfs, as on GCP). The VMs install the wheel of this checkout from the
bucket, claim tasks together, upload their logs and delete themselves through the group.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
from pathlib import Path

import pytest

from conftest_servers import s3_env
from helpers_run import comparable, read_manifest

from .vm_harness import (GCP_DIR, PREPARE_ARGS, SETTINGS, freeze_holding_a_lease, gcp_metadata,
                         gcp_template_metadata, group_calls, listing, put, read_text, run_create_group, start_vm,
                         wait_until)

pytestmark = pytest.mark.s3

ZONE, PROJECT, GROUP = "europe-west4-b", "mlm-project", "mlm-workers"
ACCOUNT = f"mlm-worker@{PROJECT}.iam.gserviceaccount.com"


def create_group(gcs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir, lease: int, max_hours: str = "24"):
    """Upload what the VMs need, run create-group.sh (its checks read the bucket through the
    emulator); returns (template attributes, group, output)."""
    prefix = gcs.new_prefix("mig")
    with s3_env(gcs):
        for f in sorted(corpus_dir.iterdir()):
            put(f, f"{prefix}/corpus/{f.name}")
        put(tokenizer_dir / "vocab.txt", f"{prefix}/deploy/vocab.txt")
        put(wheel, f"{prefix}/deploy/{wheel.name}")
    out = f"{prefix}/out"
    settings = {"BUCKET": gcs.bucket, "PACKAGE": f"{prefix}/deploy/{wheel.name}", "INPUTS": f"{prefix}/corpus/",
                "OUTPUT": out, "TOKENIZER": f"{prefix}/deploy/vocab.txt",
                "ARGS": f"{PREPARE_ARGS} --lease-seconds {lease}", "GROUP": GROUP, "ZONE": ZONE,
                "PROJECT": PROJECT, "SIZE": "2", "SERVICE_ACCOUNT": ACCOUNT, "MAX_HOURS": max_hours}
    record = run_create_group(GCP_DIR / "create-group.sh", {**settings, **gcs.env()}, tmp_path / "create.jsonl",
                              cloud_cli)
    attributes, group = gcp_template_metadata(record)
    assert group == {"name": GROUP, "zone": ZONE, "template": group["template"], "size": "2",
                     "base-instance-name": GROUP, "project": PROJECT}
    assert attributes["startup-script"] == (GCP_DIR / "startup.sh").read_text()
    assert {k: v for k, v in attributes.items() if k != "startup-script"} == {
        "mlm-output": out, "mlm-inputs": f"{prefix}/corpus/", "mlm-tokenizer": f"{prefix}/deploy/vocab.txt",
        "mlm-package": f"{prefix}/deploy/{wheel.name}", "mlm-args": settings["ARGS"], "mlm-max-hours": max_hours}
    return attributes, group, out


def boot(name, attributes, gcs, tmp_path, cloud_cli, image, tokenizer_dir, *, created_by=None, fail_first=0,
         extra_env=None, venv=None):
    """Start a VM of the group: its metadata server and its startup script."""
    created_by = created_by or f"projects/123456789/zones/{ZONE}/instanceGroupManagers/{GROUP}"
    server = gcp_metadata(name, ZONE, PROJECT, created_by,
                          {k: v for k, v in attributes.items() if k != "startup-script"}, fail_first)
    return start_vm(attributes["startup-script"], name, tmp_path, metadata=server, bin_dir=cloud_cli,
                    site=image, tokenizer_dir=tokenizer_dir, store_env=gcs.env(), extra_env=extra_env, venv=venv)


def delete_call(name: str, scope: str = f"--zone={ZONE}") -> list[str]:
    return ["compute", "instance-groups", "managed", "delete-instances", GROUP, f"--instances={name}", scope,
            f"--project={PROJECT}", "--quiet"]


def finalize(out: str, gcs) -> subprocess.CompletedProcess:
    """`mlm-pipeline finalize OUTPUT` as the user runs it afterwards."""
    env = {**os.environ, **gcs.env()}
    return subprocess.run([sys.executable, "-m", "mlm_pipeline.cli", "finalize", out], env=env,
                          capture_output=True, text=True, timeout=120)


def test_group_of_two_completes_and_each_vm_deletes_itself_once(fake_gcs, tmp_path, cloud_cli, image, image_venv,
                                                                 wheel, corpus_dir, tokenizer_dir, group_baseline):
    attributes, _, out = create_group(fake_gcs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir, lease=30)
    vms = [boot(n, attributes, fake_gcs, tmp_path, cloud_cli, image, tokenizer_dir, venv=image_venv)
           for n in ("mlm-workers-k2x9", "mlm-workers-p7qd")]
    try:
        for vm in vms:
            assert vm.wait(150) == 0, vm.output()
    finally:
        for vm in vms:
            vm.stop()
    for vm in vms:
        calls = vm.calls()
        assert [c["argv"] for c in group_calls(calls)] == [delete_call(vm.name)]  # exactly one, itself
        assert all(c["status"] == 0 for c in calls)
        log_url = f"{out}/_logs/{vm.name}.log"
        upload_log = ["storage", "cp", str(vm.work / "state" / "worker.log"), log_url]
        upload = [i for i, c in enumerate(calls) if c["words"] == upload_log]
        leave = [i for i, c in enumerate(calls) if c["argv"] == delete_call(vm.name)]
        assert len(upload) == 1 and upload[0] < leave[0]  # the log went up before the VM left its group
        # what ran is the wheel from the bucket, installed into the VM's venv
        assert list(vm.venv.glob("lib/python*/site-packages/mlm_pipeline/executors/claim.py"))
        with s3_env(fake_gcs):
            log = read_text(log_url)
        version = wheel.name.split("-")[1]
        assert f"installed mlm-pipeline {version} from {attributes['mlm-package']}" in log
        assert "prepare exited 0: every task of the run is complete" in log
        # the metadata server was asked with the header it requires, and nothing was refused
        assert vm.server.requests and all(status in (200, 404) for _, _, status in vm.server.requests)
    # every task was claimed (by whichever VM was up first: startup times vary)
    logs = [(vm.work / "state" / "worker.log").read_text() for vm in vms]
    claimed = {t for log in logs for t in re.findall(r"task (\d+): claimed by", log)}
    assert sorted(claimed) == [f"{i:05d}" for i in range(group_baseline["tasks"])]

    done = finalize(out, fake_gcs)
    assert done.returncode == 0, done.stderr
    assert "manifest.json already exists" in done.stdout
    with s3_env(fake_gcs):
        assert comparable(read_manifest(out)) == comparable(group_baseline)
        keys = listing(out)
    assert not [k for k in keys if k.startswith("_leases/")]
    assert sorted(k for k in keys if k.startswith("_logs/")) == sorted(f"_logs/{vm.name}.log" for vm in vms)


def test_vm_killed_mid_task_stays_and_its_task_is_taken_over(fake_gcs, tmp_path, cloud_cli, image, image_venv,
                                                             wheel, corpus_dir, tokenizer_dir, group_baseline):
    lease = 4
    attributes, _, out = create_group(fake_gcs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir, lease)
    doomed = boot("mlm-workers-d00m", attributes, fake_gcs, tmp_path, cloud_cli, image, tokenizer_dir, venv=image_venv)
    vms = [doomed]
    try:
        with s3_env(fake_gcs):
            pid, held = wait_until(lambda: freeze_holding_a_lease(doomed, out), 120,
                                   "the first VM to hold a lease", vms=vms)
        rescuer = boot("mlm-workers-r5cu", attributes, fake_gcs, tmp_path, cloud_cli, image, tokenizer_dir,
                       venv=image_venv)
        vms.append(rescuer)
        os.kill(pid, signal.SIGKILL)  # its prepare dies holding the lease (an OOM kill, say)
        assert doomed.wait(60) == 128 + signal.SIGKILL, doomed.output()
        assert rescuer.wait(150) == 0, rescuer.output()
    finally:
        for vm in vms:
            vm.stop()
    assert group_calls(doomed.calls()) == []  # killed mid-task: it stays in the group
    assert [c["argv"] for c in group_calls(rescuer.calls())] == [delete_call(rescuer.name)]
    with s3_env(fake_gcs):
        doomed_log = read_text(f"{out}/_logs/{doomed.name}.log")  # it still uploaded its log
        rescuer_log = read_text(f"{out}/_logs/{rescuer.name}.log")
        assert comparable(read_manifest(out)) == comparable(group_baseline)
    assert "prepare was killed (signal 9)" in doomed_log and "this VM stays in its group" in doomed_log
    for task, owner in held:
        assert re.search(rf"task {task}: took over the expired lease of {re.escape(owner)}", rescuer_log), rescuer_log


def test_late_vm_of_a_regional_group_finds_nothing_to_claim_and_leaves_despite_transient_errors(
        fake_gcs, tmp_path, cloud_cli, image, wheel, corpus_dir, tokenizer_dir, group_baseline):
    """A VM that boots after the run is done (the group grew late, or recreated a VM) leaves at
    once; 503s from the metadata server and a failing delete call are retried."""
    attributes, _, out = create_group(fake_gcs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir, lease=30)
    from helpers_run import make_config
    from mlm_pipeline.pipeline import run_prepare

    with s3_env(fake_gcs):  # the run, done before this VM boots
        run_prepare(make_config([attributes["mlm-inputs"]], out, tokenizer=str(tokenizer_dir / "vocab.txt"),
                                **SETTINGS), show_progress=False)
    regional = f"projects/123456789/regions/europe-west4/instanceGroupManagers/{GROUP}"
    vm = boot("mlm-workers-l4te", attributes, fake_gcs, tmp_path, cloud_cli, image, tokenizer_dir,
              created_by=regional, fail_first=2, extra_env={"STANDIN_FAIL_GROUP_CALLS": "1"})
    try:
        assert vm.wait(120) == 0, vm.output()
    finally:
        vm.stop()
    calls = group_calls(vm.calls())
    assert [c["argv"] for c in calls] == [delete_call(vm.name, "--region=europe-west4")] * 2
    assert [c["status"] for c in calls] == [1, 0]  # the first failed and was retried
    assert [s for _, _, s in vm.server.requests[:3]] == [503, 503, 200]
    log = (vm.work / "state" / "worker.log").read_text()
    assert "HTTP 503 (attempt 1 of 5)" in log
    assert "claimed by" not in log and "prepare exited 0: every task of the run is complete" in log
    with s3_env(fake_gcs):
        assert comparable(read_manifest(out)) == comparable(group_baseline)


def test_vm_whose_prepare_fails_for_good_uploads_its_log_and_deletes_itself(
        fake_gcs, tmp_path, cloud_cli, image, image_venv, wheel, corpus_dir, tokenizer_dir):
    """A tokenizer that is no tokenizer (here a text file, named in the template after
    create-group.sh checked it): prepare exits 2, which a rerun cannot fix and which fails every
    VM alike. The VM is not retried, uploads its log, then deletes itself through the group."""
    attributes, _, out = create_group(fake_gcs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir, lease=30)
    attributes = {**attributes, "mlm-tokenizer": attributes["mlm-inputs"] + "sample_text.txt"}
    vm = boot("mlm-workers-b4dt", attributes, fake_gcs, tmp_path, cloud_cli, image, tokenizer_dir, venv=image_venv)
    try:
        assert vm.wait(120) == 2, vm.output()
    finally:
        vm.stop()
    calls = vm.calls()
    assert [c["argv"] for c in group_calls(calls)] == [delete_call(vm.name)]
    log_url = f"{out}/_logs/{vm.name}.log"
    upload_log = ["storage", "cp", str(vm.work / "state" / "worker.log"), log_url]
    assert [c["words"] for c in calls[-2:]] == [upload_log, delete_call(vm.name)[:5]]  # the log first
    with s3_env(fake_gcs):
        log = read_text(log_url)
        assert listing(f"{out}/_tasks") == []
    assert log.count("prepare --claim, attempt") == 1
    assert "prepare exited 2" in log and "this VM leaves its group" in log and "stays in its group" not in log


def test_vm_ends_itself_when_its_lifetime_is_over_whatever_it_is_doing(
        fake_gcs, tmp_path, cloud_cli, image, image_venv, wheel, corpus_dir, tokenizer_dir):
    """mlm-max-hours (here 0.002 h: 7 s) after its start the VM leaves its group even if its
    script is stuck (stopped here, mid-install or mid-prepare): the script and prepare are ended,
    the log uploaded, the VM deleted through its group."""
    attributes, _, out = create_group(fake_gcs, tmp_path, cloud_cli, wheel, corpus_dir, tokenizer_dir, lease=30,
                                      max_hours="0.002")
    vm = boot("mlm-workers-0ld0", attributes, fake_gcs, tmp_path, cloud_cli, image, tokenizer_dir, venv=image_venv)
    log = vm.work / "state" / "worker.log"
    try:
        wait_until(lambda: log.exists() and "this VM ends itself 0.002 h after it started" in log.read_text(), 30,
                   "the watchdog to start", vms=[vm])
        vm.proc.send_signal(signal.SIGSTOP)  # the script hangs from here on
        assert vm.wait(60) == -signal.SIGKILL, vm.output()  # ended by its watchdog
        calls = wait_until(lambda: group_calls(vm.calls()), 60, "the VM to leave its group")
        prepare = vm.prepare_pid()
        if prepare is not None:  # gone (or a zombie no one reaps)
            stat = Path(f"/proc/{prepare}/stat")
            assert not stat.exists() or stat.read_text().rsplit(")", 1)[1].split()[0] == "Z"
    finally:
        vm.stop()
    assert [c["argv"] for c in calls] == [delete_call(vm.name)]
    with s3_env(fake_gcs):
        uploaded = read_text(f"{out}/_logs/{vm.name}.log")
        assert "manifest.json" not in listing(out)
    assert "maximum lifetime reached (mlm-max-hours 0.002): ending this VM" in uploaded
