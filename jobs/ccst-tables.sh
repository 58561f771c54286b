#!/usr/bin/env bash
# CCST Tables 1-3 (PACS, OfficeHome, Camelyon17): one job per table.
# Usage: jobs/ccst-tables.sh [--address ADDR] [raydg run options]
# The VGG style encoder (options.encoder: vgg) needs its weight files on the head node.
set -euo pipefail
for config in configs/ccst-{pacs,officehome,camelyon17}.yaml; do
  "$(dirname "$0")/submit.sh" run --config "$config" --gpus-per-actor 0.25 "$@"
done
