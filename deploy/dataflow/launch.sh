#!/usr/bin/env bash
# Build the recordforge image and Flex Template, and launch conversions on Dataflow.
#
# Usage (from anywhere; paths are resolved from this script):
#   deploy/dataflow/launch.sh image                  build and push the image (Cloud Build)
#   deploy/dataflow/launch.sh template               write the Flex Template spec to GCS
#   deploy/dataflow/launch.sh run SOURCES OUTPUT [NAME=VALUE ...]
#                                                    launch a job from the template
#   deploy/dataflow/launch.sh direct SOURCE... --output OUTPUT [convert options]
#                                                    run `recordforge convert` here, on Dataflow
#
# Settings (environment variables):
#   PROJECT     Google Cloud project                                     (required)
#   REGION      Dataflow region, e.g. europe-west1                       (required)
#   BUCKET      bucket for the template spec, staging and temp files     (required)
#   REPOSITORY  Artifact Registry Docker repository in REGION             (default: recordforge)
#   TAG         image tag                                                (default: the git commit)
#   DRY_RUN=1   print the commands instead of running them
#
# Example, a folder of class folders in a bucket, read in training by 8 hosts:
#   export PROJECT=my-project REGION=europe-west1 BUCKET=my-bucket
#   deploy/dataflow/launch.sh image
#   deploy/dataflow/launch.sh template
#   deploy/dataflow/launch.sh run gs://my-bucket/photos gs://my-bucket/datasets/photos \
#       num_hosts=8 splits=train=0.9,validation=0.1
# or, without a template, from a machine with recordforge installed (same Python minor version
# as the image, 3.11):
#   deploy/dataflow/launch.sh direct gs://my-bucket/photos --output gs://my-bucket/datasets/photos \
#       --num-hosts 8
set -euo pipefail

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
root="$(cd "$here/../.." && pwd)"

: "${PROJECT:?set PROJECT to your Google Cloud project}"
: "${REGION:?set REGION to a Dataflow region, e.g. europe-west1}"
: "${BUCKET:?set BUCKET to a bucket for templates, staging and temp files}"
REPOSITORY="${REPOSITORY:-recordforge}"
TAG="${TAG:-$(git -C "$root" rev-parse --short HEAD 2>/dev/null || echo latest)}"
IMAGE="${REGION}-docker.pkg.dev/${PROJECT}/${REPOSITORY}/recordforge:${TAG}"
TEMPLATE="gs://${BUCKET}/templates/recordforge-${TAG}.json"

run() {
    if [[ -n "${DRY_RUN:-}" ]]; then
        printf '%q ' "$@"
        printf '\n'
    else
        "$@"
    fi
}

command="${1:-}"
shift || true
case "$command" in
    image)
        # The upload is the repository root, trimmed by .dockerignore (and .gcloudignore, if
        # you add one); cloudbuild.yaml builds deploy/Dockerfile from it and pushes IMAGE.
        run gcloud builds submit "$root" \
            --project "$PROJECT" \
            --region "$REGION" \
            --config "$here/cloudbuild.yaml" \
            --substitutions "_IMAGE=${IMAGE}"
        ;;
    template)
        run gcloud dataflow flex-template build "$TEMPLATE" \
            --project "$PROJECT" \
            --image "$IMAGE" \
            --sdk-language PYTHON \
            --metadata-file "$here/metadata.json"
        ;;
    run)
        [[ $# -ge 2 ]] || { echo "usage: $0 run SOURCES OUTPUT [NAME=VALUE ...]" >&2; exit 2; }
        sources="$1" output="$2"
        shift 2
        # gcloud splits --parameters at commas; '^~^' makes '~' the separator instead, so values
        # such as sources=a,b or splits=train=0.9,validation=0.1 arrive whole.
        parameters="^~^sources=${sources}~output=${output}~sdk_container_image=${IMAGE}"
        for parameter in "$@"; do
            parameters+="~${parameter}"
        done
        run gcloud dataflow flex-template run "recordforge-$(date +%Y%m%d-%H%M%S)" \
            --project "$PROJECT" \
            --region "$REGION" \
            --template-file-gcs-location "$TEMPLATE" \
            --staging-location "gs://${BUCKET}/staging" \
            --temp-location "gs://${BUCKET}/temp" \
            --parameters "$parameters"
        ;;
    direct)
        [[ $# -ge 1 ]] || { echo "usage: $0 direct SOURCE... --output OUTPUT [options]" >&2; exit 2; }
        run recordforge convert "$@" \
            --runner=DataflowRunner \
            --project="$PROJECT" \
            --region="$REGION" \
            --temp_location="gs://${BUCKET}/temp" \
            --staging_location="gs://${BUCKET}/staging" \
            --sdk_container_image="$IMAGE"
        ;;
    *)
        sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
        exit 2
        ;;
esac
