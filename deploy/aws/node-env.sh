# Sourced by cluster.yaml's start commands before `ray start`: the environment that every Ray
# process of a node, hence every job and trial, inherits, so that jobs/submit.sh need not send
# it (what you export before jobs/submit.sh overrides it for that job).
#   RAYDG_STORAGE        trials' results and checkpoints: s3://BUCKET/raydg-results
#   RAYDG_DATA_ROOT      the datasets: ~/data on the head
#   MLFLOW_TRACKING_URI  the head's MLflow server (deploy/aws/mlflow-server.sh)
#   RAYDG_MLFLOW_DB, RAYDG_MLFLOW_BACKUPS  its SQLite database and where jobs back it up after
#                        each run (none with an external database, RAYDG_MLFLOW_DB_URI)
#   RAY_AUTH_MODE        token: Ray's token authentication on every node from its first start,
#                        with the token that cluster.yaml mounts at ~/.ray/auth_token (made once
#                        by jobs/token.sh on your machine): a node, a driver or a job request
#                        without it is refused
# shellcheck source=settings.env
source "$(dirname "${BASH_SOURCE[0]}")/settings.env"
export RAY_AUTH_MODE=token
export RAYDG_STORAGE=s3://$RAYDG_BUCKET/raydg-results
export RAYDG_DATA_ROOT=$HOME/data
export MLFLOW_TRACKING_URI=http://127.0.0.1:5000
export RAYDG_MLFLOW_DB=$HOME/mlflow/mlflow.db
export RAYDG_MLFLOW_BACKUPS=s3://$RAYDG_BUCKET/mlflow-backups
[ -z "$RAYDG_MLFLOW_DB_URI" ] || RAYDG_MLFLOW_BACKUPS=""
