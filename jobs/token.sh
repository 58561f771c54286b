#!/usr/bin/env bash
# Fetch the cluster's job token (the head's ~/.ray/auth_token) into ~/.ray/raydg-CLUSTER.token
# and print the line that points Ray's job client at it:
#   eval "$(jobs/token.sh)"     # then jobs/submit.sh, ray job list, ... are authorised
# The file is copied, not read through a terminal, so no "\r" ends up in the token.
# Usage: jobs/token.sh [CLUSTER.yaml]   (default cluster.yaml)
set -euo pipefail
config=${1:-cluster.yaml}
name=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["cluster_name"])' \
  "$config")
token=$HOME/.ray/raydg-$name.token
mkdir -p "$HOME/.ray"
ray rsync-down "$config" "~/.ray/auth_token" "$token" >&2
chmod 600 "$token"
echo "export RAY_AUTH_TOKEN_PATH=$token"
