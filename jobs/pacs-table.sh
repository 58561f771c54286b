#!/usr/bin/env bash
# FedFD-A Table 5's PACS columns for every method raydg has, under one protocol: one sweep job.
# Usage: jobs/pacs-table.sh [--address ADDR] [raydg sweep options]
set -euo pipefail
exec "$(dirname "$0")/submit.sh" sweep configs/sweeps/pacs-table.yaml --gpus-per-actor 0.25 "$@"
