#!/usr/bin/env bash
# Create a launch template (launch-template.json beside this file, with startup.sh as user data
# and the run's settings as instance tags) and an Auto Scaling group of SIZE mlm-pipeline workers;
# each terminates itself through the group when the run is done, when prepare fails for good
# (exit 2) or when its lifetime (MAX_HOURS) ends.
#
#   BUCKET=my-bucket PACKAGE=s3://my-bucket/deploy/mlm_pipeline-0.1.0-py3-none-any.whl \
#     SUBNETS=subnet-aaa,subnet-bbb SIZE=8 deploy/aws-asg/create-group.sh
#
# Before creating anything it checks, and refuses to go on when a check fails:
# - the instance profile's role, with IAM's policy simulator: the output bucket (unless
#   S3_ENDPOINT_URL names another store) and terminating instances of the group (ROLE_CHECK=0
#   skips this);
# - the settings, with `mlm-pipeline prepare --dry-run` on this machine (mlm-pipeline installed
#   here, e.g. from the same wheel with the s3 extra; the tokenizer is fetched from the bucket):
#   settings, a tokenizer or inputs that would fail every instance fail here.
# The group and the launch template remain, empty, after the run: it prints the command that
# removes them.
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
#   MAX_HOURS    each instance's maximum lifetime in hours, after which it leaves the group
#                whatever happens (default 24; 0: none)
#   ROLE_CHECK=0 skip the check of the instance profile's role
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
export MAX_HOURS=${MAX_HOURS:-24}
ROLE_CHECK=${ROLE_CHECK:-1}
GROUP=${GROUP:-mlm-workers}
SIZE=${SIZE:-4}
REGION=${REGION:-$(aws configure get region || true)}
: "${REGION:?set REGION, or the region of the AWS CLI configuration}"
if ! [[ $MAX_HOURS =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
  echo "MAX_HOURS is not a number of hours: $MAX_HOURS" >&2
  exit 2
fi

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
data=$work/launch-template.json

# denied ROLE_ARN RESOURCE ACTION...: the actions IAM's policy simulator denies the role on RESOURCE
denied() {
  # shellcheck disable=SC2016  # (backquotes: a JMESPath literal)
  aws iam simulate-principal-policy --policy-source-arn "$1" --resource-arns "$2" --action-names "${@:3}" \
    --query 'EvaluationResults[?EvalDecision!=`allowed`].EvalActionName' --output text
}

# check_roles: the instance profile's role may terminate instances of the group and, on AWS S3,
# read and write the output bucket
check_roles() {
  local role account bucket=${OUTPUT#s3://} no=() more=() found
  bucket=${bucket%%/*}
  role=$(aws iam get-instance-profile --instance-profile-name "$INSTANCE_PROFILE" \
    --query 'InstanceProfile.Roles[0].Arn' --output text) || return 1
  if [[ $role != arn:* ]]; then
    echo "the instance profile $INSTANCE_PROFILE has no role" >&2
    return 1
  fi
  account=$(cut -d: -f5 <<<"$role")
  found=$(denied "$role" "arn:aws:autoscaling:$REGION:$account:autoScalingGroup:*:autoScalingGroupName/$GROUP" \
    autoscaling:TerminateInstanceInAutoScalingGroup) || return 1
  read -r -a no <<<"$found"
  if [ -z "$S3_ENDPOINT_URL" ] && [[ $OUTPUT == s3://* ]]; then
    found=$(denied "$role" "arn:aws:s3:::$bucket/*" s3:GetObject s3:PutObject s3:DeleteObject) || return 1
    read -r -a more <<<"$found"
    no+=("${more[@]}")
    found=$(denied "$role" "arn:aws:s3:::$bucket" s3:ListBucket) || return 1
    read -r -a more <<<"$found"
    no+=("${more[@]}")
  fi
  if [ "${#no[@]}" -gt 0 ]; then
    echo "the role $role of the instance profile $INSTANCE_PROFILE may not: ${no[*]} (see docs/cloud.md)" >&2
    return 1
  fi
}

# check_settings: `mlm-pipeline prepare --dry-run` here, with the instances' settings and tokenizer
check_settings() {
  local tokenizer=$TOKENIZER inputs=() extra=() endpoint=()
  if ! command -v mlm-pipeline >/dev/null; then
    echo "mlm-pipeline is not installed here: it checks the settings before the instances start" \
      "(pip install \"WHEEL[s3]\", the wheel the instances install)" >&2
    return 1
  fi
  if [ -n "$S3_ENDPOINT_URL" ]; then
    endpoint=(--s3-endpoint-url "$S3_ENDPOINT_URL")
  fi
  case $TOKENIZER in
    s3://*)
      tokenizer=$work/${TOKENIZER##*/}
      AWS_ENDPOINT_URL=${S3_ENDPOINT_URL:-${AWS_ENDPOINT_URL:-}} \
        aws s3 cp --only-show-errors "$TOKENIZER" "$tokenizer" >&2 || return 1 ;;
  esac
  read -r -a inputs <<<"$INPUTS"
  read -r -a extra <<<"$ARGS"
  mlm-pipeline prepare "${inputs[@]}" -o "$OUTPUT" -t "$tokenizer" --claim --no-progress "${endpoint[@]}" \
    "${extra[@]}" --dry-run
}
# launch-template.json + the instance type, profile, settings as tags, startup.sh as user data
python3 - "$here/launch-template.json" "$here/startup.sh" "$data" <<'PY'
import base64, json, os, sys

template, startup, out = sys.argv[1:]
data = json.load(open(template))
data["InstanceType"] = os.environ["INSTANCE_TYPE"]
data["IamInstanceProfile"] = {"Name": os.environ["INSTANCE_PROFILE"]}
tags = {"mlm-output": "OUTPUT", "mlm-inputs": "INPUTS", "mlm-tokenizer": "TOKENIZER", "mlm-package": "PACKAGE",
        "mlm-args": "ARGS", "mlm-logs": "LOGS", "mlm-s3-endpoint-url": "S3_ENDPOINT_URL", "mlm-max-hours": "MAX_HOURS"}
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

if [ "$ROLE_CHECK" != 0 ] && ! check_roles; then
  echo "refusing to start instances whose role cannot do their work (grant it the rights above," \
    "or ROLE_CHECK=0 if it gets them otherwise)" >&2
  exit 2
fi
if ! check_settings; then
  echo "refusing to start instances: prepare --dry-run failed with these settings (see above);" \
    "every instance would fail so" >&2
  exit 2
fi

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
echo "each instance leaves the group when the run is done (or fails for good, or after $MAX_HOURS h);"
echo "the empty group and its launch template remain: remove them afterwards with"
echo "  aws autoscaling delete-auto-scaling-group --region $REGION --auto-scaling-group-name $GROUP &&" \
  "aws ec2 delete-launch-template --region $REGION --launch-template-name $GROUP"
