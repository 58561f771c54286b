#!/usr/bin/env bash
# The head's MLflow tracking server, its run database and that database's backups.
#   deploy/aws/mlflow-server.sh start    stop a server this script started, restore the newest
#                                        backup if the database is missing (a new head), start
#                                        the server and wait until it answers /health
#   deploy/aws/mlflow-server.sh stop     stop it (by the process id it recorded, never pkill -f)
#   deploy/aws/mlflow-server.sh backup   snapshot the database to the bucket (jobs do this after
#                                        every run; do it by hand before `ray down`)
# With RAYDG_MLFLOW_DB_URI set (settings.env), runs go to that database and nothing is backed up.
# Overridable (tests do): RAYDG_MLFLOW_DIR (~/mlflow), RAYDG_MLFLOW_PORT (5000), RAYDG_BIN
# (~/venv/bin), RAYDG_MLFLOW_BACKUPS and RAYDG_MLFLOW_ARTIFACTS (under the bucket),
# RAYDG_MLFLOW_WORKERS (4 web workers).
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=settings.env
source "$here/settings.env"
dir=${RAYDG_MLFLOW_DIR:-$HOME/mlflow}
port=${RAYDG_MLFLOW_PORT:-5000}
bin=${RAYDG_BIN:-$HOME/venv/bin}
backups=${RAYDG_MLFLOW_BACKUPS:-s3://$RAYDG_BUCKET/mlflow-backups}
artifacts=${RAYDG_MLFLOW_ARTIFACTS:-s3://$RAYDG_BUCKET/mlflow-artifacts}
db=$dir/mlflow.db
pidfile=$dir/server.pid

stop() {
  [ -f "$pidfile" ] || return 0
  local pid
  pid=$(cat "$pidfile")
  if kill -0 "$pid" 2>/dev/null; then
    kill -TERM -- "-$pid"  # the server's process group: mlflow and its web workers
    timeout 30 tail --pid="$pid" -f /dev/null || kill -KILL -- "-$pid"
  fi
  rm -f "$pidfile"
}

start() {
  stop
  mkdir -p "$dir"
  local store=${RAYDG_MLFLOW_DB_URI:-}
  if [ -z "$store" ]; then
    [ -e "$db" ] || "$bin/raydg" store restore "$backups" "$db"
    store=sqlite:///$db
  fi
  setsid "$bin/mlflow" server --host 127.0.0.1 --port "$port" --backend-store-uri "$store" \
    --artifacts-destination "$artifacts" --workers "${RAYDG_MLFLOW_WORKERS:-4}" \
    >"$dir/server.log" 2>&1 </dev/null &
  echo $! >"$pidfile"
  if ! curl -sf --retry 90 --retry-connrefused --retry-delay 1 -o /dev/null \
      "http://127.0.0.1:$port/health"; then
    echo "MLflow server did not answer on port $port within 90 s; its log ($dir/server.log):" >&2
    tail -n 20 "$dir/server.log" >&2
    exit 1
  fi
  echo "MLflow server: http://127.0.0.1:$port, pid $(cat "$pidfile")"
}

backup() {
  if [ -n "${RAYDG_MLFLOW_DB_URI:-}" ]; then
    echo "MLflow's runs are in $RAYDG_MLFLOW_DB_URI: nothing to back up"
  else
    "$bin/raydg" store backup "$db" "$backups"
  fi
}

case "${1:-}" in
  start | stop | backup) "$1" ;;
  *) echo "usage: $0 start|stop|backup" >&2; exit 2 ;;
esac
