#!/usr/bin/env bash
# Create an instance template and a managed instance group of SIZE mlm-pipeline workers; each
# runs startup.sh (beside this file) and deletes itself from the group when the run is done.
#
#   BUCKET=my-bucket PACKAGE=gs://my-bucket/deploy/mlm_pipeline-0.1.0-py3-none-any.whl \
#     SIZE=8 deploy/gcp-mig/create-group.sh
#
# Settings (environment):
#   BUCKET       the bucket (required)
#   PACKAGE      gs:// URL of the mlm-pipeline wheel, or a pip requirement (required)
#   INPUTS       space-separated inputs           (default gs://BUCKET/corpus/)
#   OUTPUT       the run's output                 (default gs://BUCKET/out)
#   TOKENIZER    vocab.txt or tokenizer.json      (default gs://BUCKET/deploy/vocab.txt)
#   ARGS         more `prepare` options           (default none; e.g. "--max-seq-length 128")
#   LOGS         where the VMs' logs go           (default OUTPUT/_logs)
#   S3_ENDPOINT_URL  an S3-compatible store, for s3:// inputs or output (default none)
#   GROUP        the group's name                 (default mlm-workers)
#   TEMPLATE     the template's name              (default GROUP-YYYYmmdd-HHMMSS: templates are immutable)
#   SIZE         how many VMs                     (default 4)
#   ZONE         (default us-central1-a)      PROJECT (default: gcloud's configured project)
#   MACHINE_TYPE (default n2-standard-8)      DISK_GB (default 20)
#   IMAGE_FAMILY / IMAGE_PROJECT              (default debian-12 / debian-cloud)
#   SERVICE_ACCOUNT  the VMs' service account (default: the project's Compute Engine default);
#                it needs the bucket (roles/storage.objectAdmin) and to delete VMs of the group
#                (roles/compute.instanceAdmin.v1), see docs/cloud.md
#   SPOT=1       Spot VMs (a preempted VM is deleted and the group recreates it: it resumes)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

: "${BUCKET:?set BUCKET to the bucket name}"
: "${PACKAGE:?set PACKAGE to the gs:// URL of the wheel (or a pip requirement)}"
INPUTS=${INPUTS:-gs://$BUCKET/corpus/}
OUTPUT=${OUTPUT:-gs://$BUCKET/out}
TOKENIZER=${TOKENIZER:-gs://$BUCKET/deploy/vocab.txt}
ARGS=${ARGS:-}
LOGS=${LOGS:-}
S3_ENDPOINT_URL=${S3_ENDPOINT_URL:-}
GROUP=${GROUP:-mlm-workers}
TEMPLATE=${TEMPLATE:-$GROUP-$(date -u +%Y%m%d-%H%M%S)}
SIZE=${SIZE:-4}
ZONE=${ZONE:-us-central1-a}
PROJECT=${PROJECT:-}
MACHINE_TYPE=${MACHINE_TYPE:-n2-standard-8}
DISK_GB=${DISK_GB:-20}
IMAGE_FAMILY=${IMAGE_FAMILY:-debian-12}
IMAGE_PROJECT=${IMAGE_PROJECT:-debian-cloud}
SERVICE_ACCOUNT=${SERVICE_ACCOUNT:-}
SPOT=${SPOT:-0}

for value in "$OUTPUT" "$INPUTS" "$TOKENIZER" "$PACKAGE" "$ARGS" "$LOGS" "$S3_ENDPOINT_URL"; do
  if [[ $value == *"|"* ]]; then
    echo "a setting holds '|', which separates the metadata values: $value" >&2
    exit 2
  fi
done
# joined with "|" (gcloud's ^|^ delimiter syntax), so that values may hold commas
metadata="mlm-output=$OUTPUT|mlm-inputs=$INPUTS|mlm-tokenizer=$TOKENIZER|mlm-package=$PACKAGE"
[ -z "$ARGS" ] || metadata="$metadata|mlm-args=$ARGS"
[ -z "$LOGS" ] || metadata="$metadata|mlm-logs=$LOGS"
[ -z "$S3_ENDPOINT_URL" ] || metadata="$metadata|mlm-s3-endpoint-url=$S3_ENDPOINT_URL"

project=()
[ -z "$PROJECT" ] || project=(--project="$PROJECT")
template_flags=()
[ -z "$SERVICE_ACCOUNT" ] || template_flags+=(--service-account="$SERVICE_ACCOUNT")
[ "$SPOT" != 1 ] || template_flags+=(--provisioning-model=SPOT --instance-termination-action=DELETE)

gcloud compute instance-templates create "$TEMPLATE" "${project[@]}" \
  --machine-type="$MACHINE_TYPE" \
  --image-family="$IMAGE_FAMILY" --image-project="$IMAGE_PROJECT" \
  --boot-disk-size="${DISK_GB}GB" \
  --scopes=cloud-platform \
  "${template_flags[@]}" \
  --metadata-from-file=startup-script="$here/startup.sh" \
  --metadata="^|^$metadata"

gcloud compute instance-groups managed create "$GROUP" "${project[@]}" \
  --zone="$ZONE" --template="$TEMPLATE" --size="$SIZE" --base-instance-name="$GROUP"

echo "group $GROUP ($SIZE VMs, template $TEMPLATE) in $ZONE: watch with"
echo "  gcloud compute instance-groups managed list-instances $GROUP --zone=$ZONE"
