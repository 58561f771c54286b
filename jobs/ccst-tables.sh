#!/usr/bin/env bash
# CCST Tables 1-3 (PACS, OfficeHome, Camelyon17): one job per table.
# Usage: jobs/ccst-tables.sh [--address ADDR] [raydg run options]
# The VGG style encoder (options.encoder: vgg) needs its weight files on the head node.
set -euo pipefail
source "$(dirname "$0")/lib.sh"
for config in configs/ccst-{pacs,officehome,camelyon17}.yaml; do
  job run --config "$config" --gpus-per-actor 0.25
done
submit_jobs "$@"
