#!/usr/bin/env bash
# Check a cluster before the paper tables: one job per node type of the cluster, placed on a
# node of that type by its raydg-node-TYPE resource (the autoscaler starts one if none runs),
# holding that type's GPUs, running `raydg doctor --gpus N`: it prints the node's Python,
# glibc, torch and CUDA build, the GPUs torch sees and the NVIDIA driver, fails if torch sees
# fewer than N GPUs, and runs one round of FedAvg with its client actors on them.
# Usage: jobs/smoke.sh [--cluster FILE] [--address ADDR] [--wait]
#   FILE: a cluster launcher config (default cluster.yaml) or a KubeRay manifest with a
#   RayCluster (deploy/k8s/raycluster.yaml); with --wait, one node type after another.
set -euo pipefail
cd "$(dirname "$0")/.."
source jobs/lib.sh
config=cluster.yaml
if [ "${1:-}" = --cluster ]; then config=${2:?--cluster needs a file}; shift 2; fi
types=$(python3 - "$config" <<'PY'
import json, sys, yaml

def marker(name, resources):
    found = [k for k in resources if k.startswith("raydg-node-")]
    if not found:
        sys.exit(f"jobs/smoke.sh: node type {name} has no raydg-node-TYPE resource")
    return found[0]

docs = [d for d in yaml.safe_load_all(open(sys.argv[1])) if d]
clusters = [d["spec"] for d in docs if d.get("kind") == "RayCluster"]
if clusters:  # KubeRay: the head group and the worker groups; GPUs from the pods' limits
    spec = clusters[0]
    for name, group in [("head", spec["headGroupSpec"]),
                        *((g["groupName"], g) for g in spec.get("workerGroupSpecs", []))]:
        limits = group["template"]["spec"]["containers"][0].get("resources", {}).get("limits", {})
        custom = json.loads(json.loads(group.get("rayStartParams", {}).get("resources", '"{}"')))
        print(marker(name, custom), int(limits.get("nvidia.com/gpu", 0)))
else:  # Ray's cluster launcher
    for name, t in docs[0]["available_node_types"].items():
        print(marker(name, t.get("resources", {})), int(t.get("resources", {}).get("GPU", 0)))
PY
)
while read -r resource gpus; do
  job doctor --gpus "$gpus" --entrypoint-num-gpus "$gpus" --entrypoint-resources "{\"$resource\": 1}"
done <<<"$types"
submit_jobs "$@"
