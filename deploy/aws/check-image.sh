#!/usr/bin/env bash
# Name the AMI that cluster.yaml's image gives in its region today (id, name, date): compare the
# name with the AMI's release notes (driver, CUDA), or pin the id in cluster.yaml for good.
# Usage: deploy/aws/check-image.sh   (with AWS credentials that may read SSM and EC2 images)
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
read -r region image < <(python3 -c '
import sys, yaml
cfg = yaml.safe_load(open(sys.argv[1]))
print(cfg["provider"]["region"], cfg["available_node_types"][cfg["head_node_type"]]["node_config"]["ImageId"])
' "$here/../../cluster.yaml")
ami=$image
if [[ $image == resolve:ssm:* ]]; then
  ami=$(aws ssm get-parameter --region "$region" --name "${image#resolve:ssm:}" \
    --query Parameter.Value --output text)
fi
aws ec2 describe-images --region "$region" --image-ids "$ami" \
  --query 'Images[0].[ImageId, Name, CreationDate]' --output text
