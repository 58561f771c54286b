#!/usr/bin/env bash
# CSAC Tables 1-3 (PACS, VLCS, Rotated MNIST): one job per table; Table 3's four rows (CSAC*,
# FedAvg*, FedDG*, DeepAll*) one job each, into the MLflow experiment rotmnist-csac.
# With --others, instead: the methods CSAC does not report, on Table 3's protocol (the real-data
# regime of docs/fidelity.md); those acting on BN layers run on mnist-cnn-bn, FedAvg too,
# into the experiment rotmnist-csac-bn (export it with --variant model=mnist-cnn-bn).
# Usage: jobs/csac-tables.sh [--others] [--address ADDR] [raydg run options]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
table3=(--config configs/csac-rotmnist.yaml --gpus-per-actor 0.25)
if [[ "${1:-}" == "--others" ]]; then
  shift
  for row in "--method fedprox" "--method fedsr" "--method ccst" \
             "--method fedavg --aggregation ga" "--method fedgma"; do
    # shellcheck disable=SC2086  # $row is several words
    job run "${table3[@]}" $row --experiment rotmnist-csac
  done
  for method in fedavg fedbn silobn fedfd fedfd-a gperxan; do
    job run "${table3[@]}" --method "$method" --model mnist-cnn-bn --experiment rotmnist-csac-bn
  done
else
  for config in configs/csac-{pacs,vlcs}.yaml; do
    job run --config "$config" --gpus-per-actor 0.25
  done
  for method in csac fedavg elcfs deepall; do
    job run "${table3[@]}" --method "$method" --experiment rotmnist-csac
  done
fi
submit_jobs "$@"
