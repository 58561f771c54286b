#!/usr/bin/env bash
# Create, or bring up to date, the IAM roles and instance profiles that cluster.yaml names:
#   raydg-head    the head node: its autoscaler describes, launches and tags EC2 instances, stops
#                 and terminates only this cluster's (tag ray-cluster-name), passes the workers
#                 their role and resolves the image's public SSM parameter; it reads and writes the
#                 bucket (results, MLflow's artifacts and the backups of its database)
#   raydg-worker  worker nodes: read and write the bucket (trial results and checkpoints)
# The policies are deploy/aws/iam/*.json with BUCKET (from settings.env), ACCOUNT (your AWS
# account) and CLUSTER (cluster.yaml's cluster_name) filled in. Safe to run again: existing
# roles get the current policy. Needs AWS credentials that may manage IAM.
# Usage: deploy/aws/create-iam.sh
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
# shellcheck source=settings.env
source "$here/settings.env"
cluster=$(python3 -c 'import sys, yaml; print(yaml.safe_load(open(sys.argv[1]))["cluster_name"])' \
  "$here/../../cluster.yaml")
account=$(aws sts get-caller-identity --query Account --output text)
policy() {
  sed -e "s/BUCKET/$RAYDG_BUCKET/g" -e "s/ACCOUNT/$account/g" -e "s/CLUSTER/$cluster/g" \
    "$here/iam/$1.json"
}
for role in head worker; do
  name=raydg-$role
  aws iam get-role --role-name "$name" >/dev/null 2>&1 ||
    aws iam create-role --role-name "$name" \
      --assume-role-policy-document "file://$here/iam/trust-ec2.json" >/dev/null
  aws iam put-role-policy --role-name "$name" --policy-name raydg \
    --policy-document "$(policy "$role")"
  aws iam get-instance-profile --instance-profile-name "$name" >/dev/null 2>&1 ||
    aws iam create-instance-profile --instance-profile-name "$name" >/dev/null
  roles=$(aws iam get-instance-profile --instance-profile-name "$name" \
    --query 'InstanceProfile.Roles[].RoleName' --output text)
  [[ " $roles " == *" $name "* ]] ||
    aws iam add-role-to-instance-profile --instance-profile-name "$name" --role-name "$name"
  echo "instance profile $name: ready (policy deploy/aws/iam/$role.json)"
done
# the gpu-1 workers are Spot instances: EC2 needs its Spot service-linked role once per account
aws iam get-role --role-name AWSServiceRoleForEC2Spot >/dev/null 2>&1 ||
  aws iam create-service-linked-role --aws-service-name spot.amazonaws.com >/dev/null
echo "Spot service-linked role: ready"
