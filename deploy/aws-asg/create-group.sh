#!/usr/bin/env bash
# Create a launch template (launch-template.json beside this file, with startup.sh as user data
# and the run's settings as instance tags) and an Auto Scaling group of SIZE mlm-pipeline workers;
# each terminates itself through the group when the run is done.
#
#   BUCKET=my-bucket PACKAGE=s3://my-bucket/deploy/mlm_pipeline-0.1.0-py3-none-any.whl \
#     SUBNETS=subnet-aaa,subnet-bbb SIZE=8 deploy/aws-asg/create-group.sh
#
# Settings (environment):
#   BUCKET       the bucket (required)
#   PACKAGE      s3:// URL of the mlm-pipeline wheel, or a pip requirement (required)
#   SUBNETS      comma-separated subnet ids the instances go in (required; they need a route to
#                S3 and to the Auto Scaling API: a public subnet, or a NAT / VPC endpoints)
#   INPUTS       space-separated inputs           (default s3://BUCKET/corpus/)
#   OUTPUT       the run's output                 (default s3://BUCKET/out)
#   TOKENIZER    vocab.txt or tokenizer.json      (default s3://BUCKET/deploy/vocab.txt)
#   ARGS         more `prepare` options           (default none; e.g. "--max-seq-length 128")
#   LOGS         where the instances' logs go     (default OUTPUT/_logs)
#   S3_ENDPOINT_URL  an S3-compatible store instead of AWS S3 (default none)
#   GROUP        the group's (and the launch template's) name (default mlm-workers)
#   SIZE         how many instances               (default 4)
#   REGION       (default: the AWS CLI's configured region)
#   INSTANCE_TYPE (default c7i.2xlarge)   INSTANCE_PROFILE (default mlm-pipeline-worker; it needs
#                the bucket and autoscaling:TerminateInstanceInAutoScalingGroup, see docs/cloud.md)
#   SPOT=1       Spot instances (an interrupted one is replaced by the group: the new one resumes)
# Tag values hold at most 256 characters (give a directory prefix as INPUTS rather than many files).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

: "${BUCKET:?set BUCKET to the bucket name}"
: "${PACKAGE:?set PACKAGE to the s3:// URL of the wheel (or a pip requirement)}"
: "${SUBNETS:?set SUBNETS to comma-separated subnet ids}"
export BUCKET PACKAGE
export INPUTS=${INPUTS:-s3://$BUCKET/corpus/}
export OUTPUT=${OUTPUT:-s3://$BUCKET/out}
export TOKENIZER=${TOKENIZER:-s3://$BUCKET/deploy/vocab.txt}
export ARGS=${ARGS:-} LOGS=${LOGS:-} S3_ENDPOINT_URL=${S3_ENDPOINT_URL:-}
export INSTANCE_TYPE=${INSTANCE_TYPE:-c7i.2xlarge}
export INSTANCE_PROFILE=${INSTANCE_PROFILE:-mlm-pipeline-worker}
export SPOT=${SPOT:-0}
GROUP=${GROUP:-mlm-workers}
SIZE=${SIZE:-4}
REGION=${REGION:-$(aws configure get region || true)}
: "${REGION:?set REGION, or the region of the AWS CLI configuration}"

data=$(mktemp)
trap 'rm -f "$data"' EXIT
# launch-template.json + the instance type, profile, settings as tags, startup.sh as user data
python3 - "$here/launch-template.json" "$here/startup.sh" "$data" <<'PY'
import base64, json, os, sys

template, startup, out = sys.argv[1:]
data = json.load(open(template))
data["InstanceType"] = os.environ["INSTANCE_TYPE"]
data["IamInstanceProfile"] = {"Name": os.environ["INSTANCE_PROFILE"]}
tags = {"mlm-output": "OUTPUT", "mlm-inputs": "INPUTS", "mlm-tokenizer": "TOKENIZER", "mlm-package": "PACKAGE",
        "mlm-args": "ARGS", "mlm-logs": "LOGS", "mlm-s3-endpoint-url": "S3_ENDPOINT_URL"}
(spec,) = [s for s in data["TagSpecifications"] if s["ResourceType"] == "instance"]
for key, var in tags.items():
    value = os.environ[var]
    if not value:
        continue
    if len(value) > 256:
        sys.exit(f"{var} cannot be a tag value: {len(value)} characters, at most 256")
    spec["Tags"].append({"Key": key, "Value": value})
if os.environ["SPOT"] == "1":
    data["InstanceMarketOptions"] = {"MarketType": "spot"}
data["UserData"] = base64.b64encode(open(startup, "rb").read()).decode()
json.dump(data, open(out, "w"), indent=1)
PY

aws ec2 create-launch-template --region "$REGION" --launch-template-name "$GROUP" \
  --launch-template-data "file://$data"
aws autoscaling create-auto-scaling-group --region "$REGION" --auto-scaling-group-name "$GROUP" \
  --launch-template "LaunchTemplateName=$GROUP,Version=\$Latest" \
  --min-size 0 --max-size "$SIZE" --desired-capacity "$SIZE" \
  --vpc-zone-identifier "$SUBNETS"
# no rebalancing across zones: it would terminate busy instances (their tasks would be redone)
aws autoscaling suspend-processes --region "$REGION" --auto-scaling-group-name "$GROUP" \
  --scaling-processes AZRebalance

echo "group $GROUP ($SIZE instances) in $REGION: watch with"
echo "  aws autoscaling describe-auto-scaling-groups --region $REGION --auto-scaling-group-names $GROUP"
