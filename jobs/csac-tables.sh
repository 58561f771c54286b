#!/usr/bin/env bash
# CSAC Tables 1-3 (PACS, VLCS, Rotated MNIST): one job per table; Table 3's four rows (CSAC*,
# FedAvg*, FedDG*, DeepAll*) one job each, into the MLflow experiment rotmnist-csac.
# Usage: jobs/csac-tables.sh [--address ADDR] [raydg run options]
set -euo pipefail
here=$(dirname "$0")
for config in configs/csac-{pacs,vlcs}.yaml; do
  "$here/submit.sh" run --config "$config" --gpus-per-actor 0.25 "$@"
done
for method in csac fedavg elcfs deepall; do
  "$here/submit.sh" run --config configs/csac-rotmnist.yaml --method "$method" \
    --experiment rotmnist-csac --gpus-per-actor 0.25 "$@"
done
