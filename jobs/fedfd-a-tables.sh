#!/usr/bin/env bash
# FedFD-A Table 5 (PACS, OfficeHome, VLCS) and the same table of its earlier version FedIG-A:
# one job per table. Usage: jobs/fedfd-a-tables.sh [--address ADDR] [raydg run options]
# One A10G per federation: 3 client actors and the driver's evaluation, 0.25 GPU each.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
for config in configs/fedfd-a-{pacs,officehome,vlcs}.yaml configs/fedig-a-{pacs,officehome,vlcs}.yaml; do
  job run --config "$config" --gpus-per-actor 0.25
done
submit_jobs "$@"
