#!/usr/bin/env bash
# gPerXAN Tables 1-3 (PACS, OfficeHome, Camelyon17): one job per table.
# Usage: jobs/gperxan-tables.sh [--address ADDR] [raydg run options]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
for config in configs/gperxan-{pacs,officehome,camelyon17}.yaml; do
  job run --config "$config" --gpus-per-actor 0.25
done
submit_jobs "$@"
