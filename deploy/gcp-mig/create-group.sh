#!/usr/bin/env bash
# Create an instance template and a managed instance group of SIZE mlm-pipeline workers; each
# runs startup.sh (beside this file) and deletes itself from the group when the run is done, when
# prepare fails for good (exit 2) or when its lifetime (MAX_HOURS) ends.
#
#   BUCKET=my-bucket PACKAGE=gs://my-bucket/deploy/mlm_pipeline-0.1.0-py3-none-any.whl \
#     SERVICE_ACCOUNT=mlm-worker@PROJECT.iam.gserviceaccount.com SIZE=8 deploy/gcp-mig/create-group.sh
#
# Before creating anything it checks, and refuses to go on when a check fails:
# - the service account's roles (in the project's and the output bucket's IAM policies; ROLE_CHECK=0
#   skips this when the account gets them otherwise: through a group, a folder or the organization);
# - the settings, with `mlm-pipeline prepare --dry-run` on this machine (mlm-pipeline installed
#   here, e.g. from the same wheel with the gcs extra; the tokenizer is fetched from the bucket):
#   settings, a tokenizer or inputs that would fail every VM fail here.
# The group and the template remain, empty, after the run: it prints the command that removes them.
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
#   SERVICE_ACCOUNT  the VMs' service account (required); it needs the output bucket
#                (roles/storage.objectAdmin) and to delete VMs of the group
#                (roles/compute.instanceAdmin.v1), see docs/cloud.md
#   MAX_HOURS    each VM's maximum lifetime in hours, after which it leaves the group whatever
#                happens (default 24; 0: none)
#   ROLE_CHECK=0 skip the check of the service account's roles
#   SPOT=1       Spot VMs (a preempted VM is deleted and the group recreates it: it resumes)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)

: "${BUCKET:?set BUCKET to the bucket name}"
: "${PACKAGE:?set PACKAGE to the gs:// URL of the wheel (or a pip requirement)}"
: "${SERVICE_ACCOUNT:?set SERVICE_ACCOUNT to the service account of the VMs (it needs the bucket and to delete VMs of the group, see docs/cloud.md)}"
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
SPOT=${SPOT:-0}
MAX_HOURS=${MAX_HOURS:-24}
ROLE_CHECK=${ROLE_CHECK:-1}

if ! [[ $MAX_HOURS =~ ^[0-9]+(\.[0-9]+)?$ ]]; then
  echo "MAX_HOURS is not a number of hours: $MAX_HOURS" >&2
  exit 2
fi

for value in "$OUTPUT" "$INPUTS" "$TOKENIZER" "$PACKAGE" "$ARGS" "$LOGS" "$S3_ENDPOINT_URL"; do
  if [[ $value == *"|"* ]]; then
    echo "a setting holds '|', which separates the metadata values: $value" >&2
    exit 2
  fi
done
# joined with "|" (gcloud's ^|^ delimiter syntax), so that values may hold commas
metadata="mlm-output=$OUTPUT|mlm-inputs=$INPUTS|mlm-tokenizer=$TOKENIZER|mlm-package=$PACKAGE|mlm-max-hours=$MAX_HOURS"
[ -z "$ARGS" ] || metadata="$metadata|mlm-args=$ARGS"
[ -z "$LOGS" ] || metadata="$metadata|mlm-logs=$LOGS"
[ -z "$S3_ENDPOINT_URL" ] || metadata="$metadata|mlm-s3-endpoint-url=$S3_ENDPOINT_URL"

work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT

# check_roles: the service account holds, in the project's policy or the output bucket's, a role
# that lets it delete VMs of the group and one that lets it read and write the bucket
# (predefined roles by name, custom roles by their permissions)
check_roles() {
  local project=$PROJECT bucket=${OUTPUT#gs://} custom role i=0
  bucket=${bucket%%/*}
  [ -n "$project" ] || project=$(gcloud config get-value project 2>/dev/null) || return 1
  gcloud projects get-iam-policy "$project" --format=json >"$work/project.json" || return 1
  if [[ $OUTPUT == gs://* ]]; then
    gcloud storage buckets get-iam-policy "gs://$bucket" --format=json >"$work/bucket.json" || return 1
  else
    echo '{}' >"$work/bucket.json"
  fi
  custom=$(roles custom) || return 1
  for role in $custom; do
    i=$((i + 1))
    gcloud iam roles describe "$role" --format=json >"$work/role-$i.json" || return 1
  done
  roles check "$OUTPUT" "$project"
}

# roles custom|check: the custom roles of the service account / whether its roles suffice
roles() {
  python3 - "$1" "$SERVICE_ACCOUNT" "$work" "${@:2}" <<'PY'
import glob, json, os, sys

what, account, work = sys.argv[1:4]
member = f"serviceAccount:{account}"


def held(name):
    with open(os.path.join(work, name)) as f:
        policy = json.load(f)
    return {b["role"] for b in policy.get("bindings", []) if member in b.get("members", [])}


project, bucket = held("project.json"), held("bucket.json")
custom = sorted(r for r in project | bucket if not r.startswith("roles/"))
if what == "custom":
    print("\n".join(custom))
    sys.exit(0)
output, project_id = sys.argv[4:6]
permissions = {}
for path in glob.glob(os.path.join(work, "role-*.json")):
    with open(path) as f:
        role = json.load(f)
    permissions[role["name"]] = set(role.get("includedPermissions", []))


def grants(roles, predefined, needed):
    return any(r in predefined or needed <= permissions.get(r, set()) for r in roles)


group = {"roles/owner", "roles/editor", "roles/compute.admin", "roles/compute.instanceAdmin",
         "roles/compute.instanceAdmin.v1"}
objects = {"roles/owner", "roles/editor", "roles/storage.admin", "roles/storage.objectAdmin"}
missing = []
if not grants(project, group, {"compute.instanceGroupManagers.update", "compute.instances.delete"}):
    missing.append(f"roles/compute.instanceAdmin.v1 on the project (to delete itself from the group): "
                   f"gcloud projects add-iam-policy-binding {project_id} --member={member} "
                   f"--role=roles/compute.instanceAdmin.v1")
if output.startswith("gs://") and not grants(project | bucket, objects, {
        "storage.objects.create", "storage.objects.delete", "storage.objects.get", "storage.objects.list"}):
    bucket_url = "gs://" + output[len("gs://"):].split("/", 1)[0]
    missing.append(f"roles/storage.objectAdmin on {bucket_url} (to read and write the run): "
                   f"gcloud storage buckets add-iam-policy-binding {bucket_url} --member={member} "
                   f"--role=roles/storage.objectAdmin")
for m in missing:
    print(f"the service account {account} lacks {m}", file=sys.stderr)
sys.exit(1 if missing else 0)
PY
}

# check_settings: `mlm-pipeline prepare --dry-run` here, with the VMs' settings and tokenizer
check_settings() {
  local tokenizer=$TOKENIZER inputs=() extra=() endpoint=()
  if ! command -v mlm-pipeline >/dev/null; then
    echo "mlm-pipeline is not installed here: it checks the settings before the VMs start" \
      "(pip install \"WHEEL[gcs]\", the wheel the VMs install)" >&2
    return 1
  fi
  case $TOKENIZER in
    gs://* | s3://*)
      tokenizer=$work/${TOKENIZER##*/}
      gcloud storage cp "$TOKENIZER" "$tokenizer" >&2 || return 1 ;;
  esac
  read -r -a inputs <<<"$INPUTS"
  read -r -a extra <<<"$ARGS"
  [ -z "$S3_ENDPOINT_URL" ] || endpoint=(--s3-endpoint-url "$S3_ENDPOINT_URL")
  mlm-pipeline prepare "${inputs[@]}" -o "$OUTPUT" -t "$tokenizer" --claim --no-progress "${endpoint[@]}" \
    "${extra[@]}" --dry-run
}

if [ "$ROLE_CHECK" != 0 ] && ! check_roles; then
  echo "refusing to start VMs whose service account cannot do their work (grant the roles above," \
    "or ROLE_CHECK=0 if it gets them otherwise)" >&2
  exit 2
fi
if ! check_settings; then
  echo "refusing to start VMs: prepare --dry-run failed with these settings (see above); every VM would fail so" >&2
  exit 2
fi

project=()
[ -z "$PROJECT" ] || project=(--project="$PROJECT")
template_flags=(--service-account="$SERVICE_ACCOUNT")
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

in_project=${PROJECT:+ --project=$PROJECT}
echo "group $GROUP ($SIZE VMs, template $TEMPLATE) in $ZONE: watch with"
echo "  gcloud compute instance-groups managed list-instances $GROUP --zone=$ZONE$in_project"
echo "each VM leaves the group when the run is done (or fails for good, or after $MAX_HOURS h);"
echo "the empty group and its template remain: remove them afterwards with"
echo "  gcloud compute instance-groups managed delete $GROUP --zone=$ZONE$in_project --quiet &&" \
  "gcloud compute instance-templates delete $TEMPLATE$in_project --quiet"
