#!/usr/bin/env bash
# mlm-pipeline worker of an AWS Auto Scaling group: the launch template's user data
# (deploy/aws-asg/create-group.sh puts it there; walkthrough in docs/cloud.md).
#
# 1. reads its settings from its instance tags through IMDSv2 (the launch template enables
#    InstanceMetadataTags; keys below);
# 2. installs mlm-pipeline into a venv: a wheel from the bucket (updating the code is uploading a
#    new wheel: no new image, no new launch template) or a pinned pip requirement;
# 3. runs `mlm-pipeline prepare --claim` against the bucket with the other instances of the group;
# 4. uploads its log to the bucket (MLM-LOGS/INSTANCE-ID.log, default OUTPUT/_logs/);
# 5. when prepare exited 0 - which it does only once every task of the run is complete, so
#    also at once on an instance that finds nothing left to claim - or 2 - a failure no rerun
#    can fix (settings, tokenizer, an input), which fails every instance the same way - leaves
#    its group with
#    `aws autoscaling terminate-instance-in-auto-scaling-group --should-decrement-desired-capacity`
#    (terminating it any other way would make the group launch a replacement).
# A prepare that fails otherwise or is killed leaves the instance in its group: the tasks it held
# are taken over by the other instances when their leases expire, and its log in the bucket says
# what happened. Whatever happens, an instance leaves its group (log uploaded first)
# mlm-max-hours after its script read its settings. Metadata reads, downloads, the install, the upload and
# leaving the group are retried with exponential backoff; a prepare that exits 1 (storage error,
# failed task) is rerun (it resumes).
#
# Instance tags (read through the instance metadata service):
#   mlm-output      s3://BUCKET/PATH: the run's output (required)
#   mlm-inputs      input files/prefixes, separated by spaces (required)
#   mlm-tokenizer   s3:// URL (or a path on the image) of a vocab.txt or tokenizer.json (required)
#   mlm-package     s3:// URL of an mlm-pipeline wheel, or a pip requirement (required)
#   mlm-args        more `prepare` options, separated by spaces (optional)
#   mlm-logs        where logs go (optional; default OUTPUT/_logs)
#   mlm-s3-endpoint-url   an S3-compatible endpoint instead of AWS S3 (optional)
#   mlm-max-hours   the instance's maximum lifetime in hours (optional; default 24; 0: none)
# (Tag values hold at most 256 characters.)
# Environment (tests, other images): AWS_EC2_METADATA_SERVICE_ENDPOINT (the metadata service's
# base URL), AWS_ENDPOINT_URL (an S3 endpoint), MLM_WORK_DIR, MLM_VENV, MLM_PYTHON,
# MLM_TOKENIZER_DIR, MLM_RETRIES, MLM_RETRY_DELAY, MLM_PREPARE_ATTEMPTS.
set -euo pipefail

IMDS=${AWS_EC2_METADATA_SERVICE_ENDPOINT:-http://169.254.169.254}
IMDS=${IMDS%/}
IMDS_TOKEN=
PACKAGE_EXTRA=s3

# metadata PATH [optional]: a value from the instance metadata service (IMDSv2: with the session
# token identify gets first)
metadata() {
  http_fetch "$IMDS/latest/meta-data/$1" "${2:-}" -H "X-aws-ec2-metadata-token: $IMDS_TOKEN"
}

# setting KEY [optional]: a tag of this instance
setting() {
  metadata "tags/instance/$1" "${2:-}"
}

# identify: SELF (names the log), and the instance id and region for leaving the group
identify() {
  IMDS_TOKEN=$(http_fetch "$IMDS/latest/api/token" "" -X PUT -H "X-aws-ec2-metadata-token-ttl-seconds: 21600")
  INSTANCE_ID=$(metadata instance-id)
  REGION=$(metadata placement/region)
  SELF=$INSTANCE_ID
  local group
  group=$(setting aws:autoscaling:groupName optional)
  say "instance $INSTANCE_ID in region $REGION, group ${group:-(tag not readable)}"
}

# bucket_cp SOURCE DESTINATION: copy to or from the bucket
bucket_cp() {
  retry aws s3 cp --only-show-errors "$1" "$2"
}

# leave_group: terminate this instance through its group, which lowers the desired capacity
leave_group() {
  retry aws autoscaling terminate-instance-in-auto-scaling-group --instance-id "$INSTANCE_ID" \
    --should-decrement-desired-capacity --region "$REGION"
}

# ---- common part: identical in deploy/gcp-mig/startup.sh and deploy/aws-asg/startup.sh ----

WORK_DIR=${MLM_WORK_DIR:-/var/lib/mlm-pipeline}
VENV=${MLM_VENV:-/opt/mlm-pipeline/venv}
# the tokenizer's local path is part of the run's settings: the same on every VM
TOKENIZER_DIR=${MLM_TOKENIZER_DIR:-/opt/mlm-pipeline/tokenizer}
RETRIES=${MLM_RETRIES:-5}
RETRY_DELAY=${MLM_RETRY_DELAY:-2}
PREPARE_ATTEMPTS=${MLM_PREPARE_ATTEMPTS:-3}
LOG=$WORK_DIR/worker.log
LOG_URL=
PREPARE_PID=
LEAVING=
WATCHDOG_PID=
export PIP_DISABLE_PIP_VERSION_CHECK=1 TOKENIZERS_PARALLELISM=false

# say MESSAGE...: a timestamped line on stderr (the serial console / cloud-init log) and in the log
say() {
  local line
  line="$(date -u +%Y-%m-%dT%H:%M:%SZ) mlm-worker: $*"
  echo "$line" >&2
  echo "$line" >>"$LOG"
}

# retry COMMAND...: run COMMAND (output to the log) up to RETRIES times, waiting RETRY_DELAY
# seconds after the first failure and twice as long after each next one (at most 60 s)
retry() {
  local attempt=1 delay=$RETRY_DELAY
  until "$@" >>"$LOG" 2>&1; do
    if [ "$attempt" -ge "$RETRIES" ]; then
      say "failed $attempt times, giving up: $*"
      return 1
    fi
    say "failed (attempt $attempt of $RETRIES), again in ${delay}s: $*"
    sleep "$delay"
    attempt=$((attempt + 1))
    delay=$((delay * 2 > 60 ? 60 : delay * 2))
  done
}

# http_fetch URL OPTIONAL CURL_ARGS...: print the body of URL. Not found (404) prints nothing
# and succeeds when OPTIONAL is non-empty, fails otherwise; other failures are retried.
http_fetch() {
  local url=$1 optional=$2 body code attempt=1 delay=$RETRY_DELAY
  shift 2
  body=$(mktemp)
  while true; do
    code=$(curl -sS --max-time 10 -o "$body" -w '%{http_code}' "$@" "$url" 2>>"$LOG") || code=000
    if [ "$code" = 200 ]; then
      cat "$body"
      rm -f "$body"
      return 0
    fi
    if [ "$code" = 404 ]; then
      rm -f "$body"
      [ -n "$optional" ] && return 0
      say "not found: $url"
      return 1
    fi
    if [ "$attempt" -ge "$RETRIES" ]; then
      rm -f "$body"
      say "giving up on $url: HTTP $code after $attempt attempts"
      return 1
    fi
    say "$url: HTTP $code (attempt $attempt of $RETRIES), again in ${delay}s"
    sleep "$delay"
    attempt=$((attempt + 1))
    delay=$((delay * 2 > 60 ? 60 : delay * 2))
  done
}

# find_python: a Python >= 3.10 that can create a venv (MLM_PYTHON first)
find_python() {
  local candidates=(python3.12 python3.11 python3.10 python3) p
  if [ -n "${MLM_PYTHON:-}" ]; then
    candidates=("$MLM_PYTHON" "${candidates[@]}")
  fi
  for p in "${candidates[@]}"; do
    if command -v "$p" >/dev/null 2>&1 &&
      "$p" -c 'import sys, ensurepip, venv; sys.exit(sys.version_info < (3, 10))' 2>/dev/null; then
      command -v "$p"
      return 0
    fi
  done
  return 1
}

# install_python: what the image lacks for a venv (Debian/Ubuntu: python3-venv; Amazon Linux 2023,
# whose python3 is 3.9: python3.11)
install_python() {
  if command -v apt-get >/dev/null 2>&1; then
    # first boot: unattended-upgrades may hold the dpkg lock for minutes
    retry apt-get -o DPkg::Lock::Timeout=600 update -q || return 1
    retry env DEBIAN_FRONTEND=noninteractive apt-get -o DPkg::Lock::Timeout=600 install -y -q python3-venv || return 1
  elif command -v dnf >/dev/null 2>&1; then
    retry dnf install -y -q python3.11 python3.11-pip || return 1
  else
    say "no Python >= 3.10 with venv, and neither apt-get nor dnf to install one"
    return 1
  fi
}

# ensure_venv: the venv mlm-pipeline goes into (kept if the image or an earlier boot made it)
ensure_venv() {
  local python
  if [ -x "$VENV/bin/python" ]; then
    return 0
  fi
  python=$(find_python) || python=
  if [ -z "$python" ] || ! "$python" -m venv "$VENV" >>"$LOG" 2>&1; then
    rm -rf "$VENV"
    install_python
    python=$(find_python) || { say "no Python >= 3.10 with venv after installing one"; return 1; }
    "$python" -m venv "$VENV" >>"$LOG" 2>&1
  fi
  say "created $VENV with $("$VENV/bin/python" --version 2>&1)"
}

# install_package: mlm-pipeline (with this cloud's storage extra) from PACKAGE, a wheel in the
# bucket or a pip requirement
install_package() {
  local spec=$PACKAGE
  ensure_venv
  case $PACKAGE in
    gs://* | s3://*)
      spec=$WORK_DIR/${PACKAGE##*/}  # pip needs the wheel's own file name
      bucket_cp "$PACKAGE" "$spec" ;;
  esac
  retry "$VENV/bin/python" -m pip install "$spec" "mlm-pipeline[$PACKAGE_EXTRA]"
  say "installed $("$VENV/bin/mlm-pipeline" --version) from $PACKAGE"
}

# fetch_tokenizer: TOKENIZER_PATH, the tokenizer on this VM (downloaded from the bucket, or a
# path on the image); concurrent downloads to one directory are safe (each renames its own copy)
fetch_tokenizer() {
  case $TOKENIZER in
    gs://* | s3://*)
      TOKENIZER_PATH=$TOKENIZER_DIR/${TOKENIZER##*/}
      mkdir -p "$TOKENIZER_DIR"
      bucket_cp "$TOKENIZER" "$TOKENIZER_PATH.$$.part"
      mv -f "$TOKENIZER_PATH.$$.part" "$TOKENIZER_PATH" ;;
    *) TOKENIZER_PATH=$TOKENIZER ;;
  esac
}

# run_prepare: run `prepare --claim` until it succeeds, fails for good or is killed; its exit
# status goes to PREPARE_STATUS. Exit 1 (storage error, failed task) is rerun: a rerun resumes.
run_prepare() {
  local attempt=1 delay=$RETRY_DELAY inputs=() extra=() endpoint=()
  read -r -a inputs <<<"$INPUTS"
  read -r -a extra <<<"$ARGS"
  if [ -n "$S3_ENDPOINT_URL" ]; then
    endpoint=(--s3-endpoint-url "$S3_ENDPOINT_URL")
  fi
  while true; do
    say "prepare --claim, attempt $attempt of $PREPARE_ATTEMPTS: ${inputs[*]} -> $OUTPUT ${extra[*]}"
    PREPARE_STATUS=0
    "$VENV/bin/mlm-pipeline" prepare "${inputs[@]}" -o "$OUTPUT" -t "$TOKENIZER_PATH" --claim --no-progress \
      "${endpoint[@]}" "${extra[@]}" >>"$LOG" 2>&1 &
    PREPARE_PID=$!
    echo "$PREPARE_PID" >"$WORK_DIR/prepare.pid"
    wait "$PREPARE_PID" || PREPARE_STATUS=$?
    PREPARE_PID=
    if [ "$PREPARE_STATUS" -eq 0 ]; then
      say "prepare exited 0: every task of the run is complete"
      return 0
    fi
    if [ "$PREPARE_STATUS" -gt 128 ]; then
      say "prepare was killed (signal $((PREPARE_STATUS - 128))): the tasks it held are taken over by the other VMs when their leases expire"
      return 0
    fi
    if [ "$PREPARE_STATUS" -ne 1 ] || [ "$attempt" -ge "$PREPARE_ATTEMPTS" ]; then
      say "prepare failed with status $PREPARE_STATUS (see the lines above)"
      return 0
    fi
    say "prepare failed with status 1 (attempt $attempt of $PREPARE_ATTEMPTS), again in ${delay}s"
    sleep "$delay"
    attempt=$((attempt + 1))
    delay=$((delay * 2 > 60 ? 60 : delay * 2))
  done
}

# upload_log: this VM's log to LOG_URL (a failed upload is reported, never fatal)
upload_log() {
  if [ -n "$LOG_URL" ]; then
    say "uploading this log to $LOG_URL"
    bucket_cp "$LOG" "$LOG_URL" || say "could not upload the log to $LOG_URL"
  fi
}

on_exit() {
  local status=$?
  trap - EXIT
  if [ "$status" -ne 0 ] && [ -z "$LEAVING" ]; then
    say "exiting with status $status; this VM stays in its group until its lifetime ends"
    upload_log
  fi
  exit "$status"
}

# lifetime_seconds HOURS: whole seconds of a number of hours (24, 0.5); fails on anything else
lifetime_seconds() {
  local whole=${1%%.*} fraction=
  [[ $1 =~ ^[0-9]+(\.[0-9]+)?$ ]] || return 1
  [[ $1 != *.* ]] || fraction=${1#*.}
  fraction=${fraction}000000
  echo $((10#$whole * 3600 + 10#${fraction:0:6} * 3600 / 1000000))
}

# watchdog SECONDS: SECONDS after this script started, end the VM whatever the script is doing
# (installing, retrying, stuck, or exited leaving the VM in its group): stop the script and
# prepare (TERM, then KILL after 30 s), upload the log, leave the group. Runs in the background.
watchdog() {
  local main=$$ sleeper pid
  trap - EXIT INT
  sleep "$(($1 > SECONDS ? $1 - SECONDS : 0))" &
  sleeper=$!
  trap 'kill "$sleeper" 2>/dev/null; exit 0' TERM
  wait "$sleeper"
  say "maximum lifetime reached (mlm-max-hours $MAX_HOURS): ending this VM"
  kill -KILL "$main" 2>/dev/null || true
  pid=$(cat "$WORK_DIR/prepare.pid" 2>/dev/null) || pid=
  if [ -n "$pid" ] && grep -q mlm-pipeline "/proc/$pid/cmdline" 2>/dev/null; then
    kill -TERM "$pid" 2>/dev/null || true
    kill -CONT "$pid" 2>/dev/null || true  # (a stopped process takes TERM only once continued)
    for _ in {1..30}; do
      kill -0 "$pid" 2>/dev/null || break
      sleep 1
    done
    kill -KILL "$pid" 2>/dev/null || true
  fi
  upload_log
  LEAVING=1
  leave_group || say "could not leave the group"
}

# on_signal NUMBER: the VM is shutting down (preemption, the group deleting it): stop prepare
# (its leases expire and are taken over), upload the log, do not leave the group
on_signal() {
  if [ -n "$LEAVING" ]; then
    say "shutting down: the group is deleting this VM"
    trap - EXIT
    exit 0
  fi
  say "stopped by signal $1"
  if [ -n "$PREPARE_PID" ]; then
    kill -TERM "$PREPARE_PID" 2>/dev/null || true
    wait "$PREPARE_PID" 2>/dev/null || true
  fi
  exit $((128 + $1))
}

main() {
  mkdir -p "$WORK_DIR"
  trap on_exit EXIT
  trap 'on_signal 15' TERM
  trap 'on_signal 2' INT
  say "starting"
  identify
  OUTPUT=$(setting mlm-output)
  INPUTS=$(setting mlm-inputs)
  TOKENIZER=$(setting mlm-tokenizer)
  PACKAGE=$(setting mlm-package)
  ARGS=$(setting mlm-args optional)
  S3_ENDPOINT_URL=$(setting mlm-s3-endpoint-url optional)
  MAX_HOURS=$(setting mlm-max-hours optional)
  if [ -n "$S3_ENDPOINT_URL" ]; then
    export AWS_ENDPOINT_URL=$S3_ENDPOINT_URL  # for the AWS CLI and s3fs too
  fi
  local logs
  logs=$(setting mlm-logs optional)
  logs=${logs:-${OUTPUT%/}/_logs}
  LOG_URL=${logs%/}/$SELF.log
  MAX_HOURS=${MAX_HOURS:-24}
  local lifetime
  if ! lifetime=$(lifetime_seconds "$MAX_HOURS"); then
    say "mlm-max-hours is not a number of hours: $MAX_HOURS; taking 24"
    MAX_HOURS=24 lifetime=$((24 * 3600))
  fi
  if [ "$lifetime" -gt 0 ]; then  # (started once LOG_URL is known: it uploads the log)
    watchdog "$lifetime" &
    WATCHDOG_PID=$!
    say "this VM ends itself ${MAX_HOURS} h after it started, whatever happens (mlm-max-hours)"
  fi
  install_package
  fetch_tokenizer
  run_prepare
  case $PREPARE_STATUS in
    0) ;;
    2) say "prepare exited 2: settings, the tokenizer or an input that every run refuses the same way (see the lines above); this VM leaves its group" ;;
    *) exit "$PREPARE_STATUS" ;;
  esac
  upload_log
  say "leaving the group"
  LEAVING=1
  if ! leave_group; then
    LEAVING=
    say "could not leave the group"
    exit 1
  fi
  say "left the group"
  if [ -n "$WATCHDOG_PID" ]; then
    kill "$WATCHDOG_PID" 2>/dev/null || true
  fi
  return "$PREPARE_STATUS"
}

main "$@"
