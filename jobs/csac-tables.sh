#!/usr/bin/env bash
# CSAC Tables 1-3 (PACS, VLCS, Rotated MNIST): one job per table.
# Usage: jobs/csac-tables.sh [--address ADDR] [raydg run options]
set -euo pipefail
for config in configs/csac-{pacs,vlcs,rotmnist}.yaml; do
  "$(dirname "$0")/submit.sh" run --config "$config" --gpus-per-actor 0.25 "$@"
done
