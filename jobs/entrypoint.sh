#!/usr/bin/env bash
# A raydg job on the cluster (jobs/submit.sh): `python -m raydg ARGS`, then, for the commands
# that log runs (run, sweep, resume) and when RAYDG_MLFLOW_BACKUPS is set, a backup of the
# head's MLflow database there. Exits with raydg's
# status, or with 1 if raydg succeeded but the backup failed.
# On `ray job stop` (SIGTERM to every process of the job) raydg records the stop, then the
# backup runs: jobs/submit.sh gives the job 120 s before Ray's SIGKILL (RAY_JOB_STOP_WAIT_TIME_S
# in its runtime environment; Ray's own default, 3 s, would cut both short).
set -uo pipefail
args=("$@")
trap 'echo "entrypoint: SIGTERM: raydg is stopping" >&2' TERM  # bash goes on once raydg ends
python -m raydg "${args[@]}"
rc=$?
if [[ -n ${RAYDG_MLFLOW_BACKUPS:-} && ${args[0]} =~ ^(run|sweep|resume)$ ]]; then
  python -m raydg store backup "$RAYDG_MLFLOW_DB" "$RAYDG_MLFLOW_BACKUPS" || {
    echo "entrypoint: the MLflow database was NOT backed up (see above)" >&2
    [ "$rc" -ne 0 ] || rc=1
  }
fi
exit "$rc"
