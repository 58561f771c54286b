#!/usr/bin/env bash
# Submit one raydg command to a running Ray cluster as a Ray job.
#
#   jobs/submit.sh RAYDG-ARGS... [--address ADDR] [--wait] [--entrypoint-resources JSON]
#                  [--entrypoint-num-gpus N]
#   e.g. jobs/submit.sh run --config configs/fedfd-a-pacs.yaml --gpus-per-actor 0.25
#
# This script's own options may stand anywhere among the arguments (the table scripts pass
# theirs on); every other argument reaches raydg exactly as given, spaces and all.
#   --address ADDR, --address=ADDR  the cluster's job API, its dashboard: default $RAY_ADDRESS,
#                   else http://127.0.0.1:8265, where `ray dashboard cluster.yaml` forwards it.
#                   (A job's raydg joins the cluster it runs on by itself.)
#   --wait          follow the job's output (on stderr) until it ends; exit 0 only if it
#                   succeeded
#   --entrypoint-resources JSON, --entrypoint-num-gpus N  where the job's own process runs and
#                   the GPUs it holds (jobs/smoke.sh); by default it runs on the head
# The job id is printed on stdout (ray's messages go to stderr) and added, with the time, the
# address and the command, to jobs/submitted.tsv ($RAYDG_JOBS_LOG).
#
# The job runs jobs/entrypoint.sh (`python -m raydg RAYDG-ARGS`, then a backup of the head's
# MLflow database) with this checkout as its working directory: Ray's runtime environment ships
# the code you have here to every node of the job. Its environment is the cluster's (on AWS,
# deploy/aws/node-env.sh: results in the bucket, data in ~/data, the head's MLflow server), but
# for those of these variables that are set here, which the job gets instead:
#   RAYDG_STORAGE, RAYDG_DATA_ROOT, MLFLOW_TRACKING_URI, RAYDG_MLFLOW_DB, RAYDG_MLFLOW_BACKUPS
# The job API needs the cluster's token: RAY_AUTH_TOKEN_PATH, RAY_AUTH_TOKEN or
# ~/.ray/auth_token (`eval "$(jobs/token.sh)"` points RAY_AUTH_TOKEN_PATH at it).
set -euo pipefail
cd "$(dirname "$0")/.."
address=${RAY_ADDRESS:-http://127.0.0.1:8265}
wait=false
placement=()
args=()
while [ $# -gt 0 ]; do
  case "$1" in
    --address) address=${2:?--address needs a value}; shift 2 ;;
    --address=*) address=${1#--address=}; shift ;;
    --wait) wait=true; shift ;;
    --entrypoint-resources | --entrypoint-num-gpus) placement+=("$1" "${2:?$1 needs a value}"); shift 2 ;;
    *) args+=("$1"); shift ;;
  esac
done
[ ${#args[@]} -gt 0 ] || {
  echo "usage: jobs/submit.sh RAYDG-ARGS... [--address ADDR] [--wait]" >&2; exit 2; }
# RAY_JOB_STOP_WAIT_TIME_S: after `ray job stop`'s SIGTERM, the seconds Ray's job supervisor
# (which reads the job's environment) waits before SIGKILL; Ray's default, 3 s, ends raydg
# before it has recorded its stop, and the backup never runs. RAYDG_JOB_STOP_WAIT_S overrides
# the 120 s given here.
runtime_env=$(python3 -c '
import json, os
names = ("RAYDG_STORAGE", "RAYDG_DATA_ROOT", "MLFLOW_TRACKING_URI", "RAYDG_MLFLOW_DB",
         "RAYDG_MLFLOW_BACKUPS")
env = {name: os.environ[name] for name in names if name in os.environ}
env["RAY_JOB_STOP_WAIT_TIME_S"] = os.environ.get("RAYDG_JOB_STOP_WAIT_S", "120")
print(json.dumps({
    "working_dir": ".",
    "excludes": [".git", ".venv", "mlruns", "mlflow.db", "raydg-results", "__pycache__"],
    "env_vars": env,
}))')
# the command as a shell would read it, for jobs/submitted.tsv (Ray quotes the entrypoint's
# words the same way, with shlex.join, before its shell reads them)
command=$(python3 -c 'import shlex, sys; print(shlex.join(sys.argv[1:]))' "${args[@]}")
id=raydg-$(date -u +%Y%m%d-%H%M%S)-$(od -An -N3 -tx1 /dev/urandom | tr -d ' \n')
export RAY_AUTH_MODE=token
if [ -n "${RAY_AUTH_TOKEN:-}" ]; then  # one captured from a terminal may end in "\r"
  RAY_AUTH_TOKEN=$(printf %s "$RAY_AUTH_TOKEN" | tr -d '\r\n\t ')
  export RAY_AUTH_TOKEN
fi
ray job submit --address "$address" --no-wait --submission-id "$id" "${placement[@]}" \
  --runtime-env-json "$runtime_env" -- bash jobs/entrypoint.sh "${args[@]}" >&2
printf '%s\t%s\t%s\t%s\n' "$id" "$(date -u +%FT%TZ)" "$address" "$command" \
  >>"${RAYDG_JOBS_LOG:-jobs/submitted.tsv}"
echo "$id"
if $wait; then
  ray job logs --address "$address" --follow "$id" >&2
  status=$(ray job status --address "$address" "$id" 2>&1)
  echo "$status" >&2
  [[ $status == *"Job '$id' succeeded"* ]]
fi
