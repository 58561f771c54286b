#!/usr/bin/env bash
# The FedFD-A lambda study on PACS (FedIG-A appendix A.1, Figs. 5 and 6): one sweep job per
# weight; per held-out domain the selected lambda has the best source validation.
# Usage: jobs/fedfd-a-lambda.sh [--address ADDR] [raydg sweep options]
set -euo pipefail
source "$(dirname "$0")/lib.sh"
for sweep in configs/sweeps/fedfd-a-lambda{1,2}-pacs.yaml; do
  job sweep "$sweep" --gpus-per-actor 0.25
done
submit_jobs "$@"
