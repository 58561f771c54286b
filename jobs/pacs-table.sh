#!/usr/bin/env bash
# FedFD-A Table 5's PACS columns for every method raydg has, under one protocol: one sweep job.
# Usage: jobs/pacs-table.sh [--address ADDR] [raydg sweep options]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
job sweep configs/sweeps/pacs-table.yaml --gpus-per-actor 0.25
submit_jobs "$@"
