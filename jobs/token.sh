#!/usr/bin/env bash
# The cluster's token: made once here, before the first `ray up`, then given to every node by
# cluster.yaml's file_mounts (~/.ray/auth_token on the head and each worker) and used by your
# job client. Prints the line that points Ray's job client at it:
#   eval "$(jobs/token.sh)"     # then ray up, jobs/submit.sh, ray job list, ... are authorised
# The token is ~/.ray/raydg-CLUSTER.token (mode 600; CLUSTER: cluster_name in the config). A
# token kept there is never replaced: every `ray up` gives the nodes the same one. To change
# it, delete the file, run this again and `ray up` (the head and the workers restart with it).
# Usage: jobs/token.sh [CLUSTER.yaml]   (default cluster.yaml)
set -euo pipefail
config=${1:-cluster.yaml}
name=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["cluster_name"])' \
  "$config")
token=$HOME/.ray/raydg-$name.token
if [ ! -s "$token" ]; then
  mkdir -p "$HOME/.ray"
  (umask 077 && python3 -c 'import secrets; print(secrets.token_hex(32), end="")' >"$token")
  echo "jobs/token.sh: made the cluster's token $token (cluster.yaml gives it to every node)" >&2
fi
echo "export RAY_AUTH_TOKEN_PATH=$token"
