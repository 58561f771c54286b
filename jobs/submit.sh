#!/usr/bin/env bash
# Submit one raydg command to a running Ray cluster as a Ray job and print its id.
#
#   jobs/submit.sh RAYDG-ARGS... [--address ADDR] [--wait]
#   e.g. jobs/submit.sh run --config configs/fedfd-a-pacs.yaml --gpus-per-actor 0.25
#
# --address ADDR (anywhere among the arguments; the other job scripts pass it on) is the
# cluster's job API, its dashboard: default $RAY_ADDRESS, else http://127.0.0.1:8265, where
# `ray dashboard cluster.yaml` forwards the head's dashboard. --wait follows the job's output
# until it ends (and exits with its status); by default the job id is printed and it runs on.
#
# The job runs `python -m raydg RAYDG-ARGS` on the head node, with this checkout as its working
# directory: Ray's runtime environment ships the code you have here to every node of the job.
# (Ray joins the arguments with spaces: quote none of them.) Its environment:
#   RAYDG_STORAGE        where trials write results and checkpoints; on a cluster of several
#                        nodes it must be shared storage, e.g. s3://my-raydg-bucket/raydg-results
#                        (required)
#   MLFLOW_TRACKING_URI  default http://127.0.0.1:5000, the head's MLflow server (cluster.yaml)
#   RAYDG_DATA_ROOT      default /home/ubuntu/data, the datasets on the head node
# The job API needs the cluster's token (token authentication): from $RAY_AUTH_TOKEN or
# ~/.ray/auth_token; fetch it once with
#   export RAY_AUTH_TOKEN=$(ray exec cluster.yaml "ray get-auth-token" 2>/dev/null | tail -n 1)
set -euo pipefail
cd "$(dirname "$0")/.."
address=${RAY_ADDRESS:-http://127.0.0.1:8265}
follow=--no-wait
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --address) address=$2; shift 2 ;;
    --wait) follow=""; shift ;;
    *) args+=("$1"); shift ;;
  esac
done
[ ${#args[@]} -gt 0 ] || { echo "usage: jobs/submit.sh RAYDG-ARGS... [--address ADDR] [--wait]" >&2; exit 2; }
: "${RAYDG_STORAGE:?set RAYDG_STORAGE to storage every node can write, e.g. s3://my-raydg-bucket/raydg-results}"
runtime_env=$(python3 -c '
import json, os
print(json.dumps({
    "working_dir": ".",
    "excludes": [".git", ".venv", "mlruns", "mlflow.db", "raydg-results", "__pycache__"],
    "env_vars": {
        "RAYDG_STORAGE": os.environ["RAYDG_STORAGE"],
        "MLFLOW_TRACKING_URI": os.environ.get("MLFLOW_TRACKING_URI", "http://127.0.0.1:5000"),
        "RAYDG_DATA_ROOT": os.environ.get("RAYDG_DATA_ROOT", "/home/ubuntu/data"),
    },
}))')
export RAY_AUTH_MODE=token
# shellcheck disable=SC2086  # $follow is one flag or none
exec ray job submit --address "$address" $follow --runtime-env-json "$runtime_env" \
  -- python -m raydg "${args[@]}"
