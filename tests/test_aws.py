"""deploy/aws: the IAM policies cover every EC2 call of this Ray's AWS node provider,
create-iam.sh makes and updates the profiles (against a recording ``aws``), and the head's MLflow
server script keeps the run database across a lost head (a folder stands in for the bucket)."""

from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import ray
import yaml

from tests.test_jobs import ROOT, calls, run, stand_ins

pytestmark = pytest.mark.slow  # the quick loop (-m "not slow") leaves it out


def _policy(name: str) -> dict:
    return json.loads((ROOT / "deploy/aws/iam" / f"{name}.json").read_text())


def _actions(policy: dict) -> set[str]:
    return {a for s in policy["Statement"] if s["Effect"] == "Allow"
            for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}


def test_the_head_policy_covers_every_ec2_call_of_rays_aws_node_provider():
    """The head's autoscaler runs Ray's AWS node provider: each EC2 call in its source (boto3
    resource and client methods) needs its action in the head's policy."""
    source = (Path(ray.__file__).parent / "autoscaler/_private/aws/node_provider.py").read_text()
    calls = set(re.findall(r"\.(describe_\w+|create_\w+|start_instances|stop_instances|"
                           r"terminate_instances|terminate|stop)\(", source))
    calls |= {"describe_instances"} if "instances.filter(" in source else set()
    special = {"create_instances": "RunInstances", "terminate": "TerminateInstances",
               "stop": "StopInstances"}
    needed = {"ec2:" + special.get(c, "".join(w.title() for w in c.split("_"))) for c in calls}
    assert {"ec2:RunInstances", "ec2:DescribeInstances", "ec2:TerminateInstances"} <= needed
    head = _actions(_policy("head"))
    assert needed <= head, needed - head
    assert "iam:PassRole" in head  # workers get their instance profile from the head
    assert "ec2:RunInstances" not in _actions(_policy("worker"))


def test_the_head_changes_only_this_clusters_instances_and_tags_only_what_it_launches():
    """Least privilege: every head statement that tags, stops or terminates instances holds a
    condition, either the cluster's own tag (ray-cluster-name) or, for tags, the launch
    itself (ec2:CreateAction RunInstances): the head cannot tag another instance of the
    account into its cluster and then terminate it. The unconditional CreateTags of before
    2026-11-29 fails this."""
    allowed = {("ec2:ResourceTag/ray-cluster-name", "CLUSTER"),
               ("ec2:CreateAction", "RunInstances")}
    head = _policy("head")
    old = {"Statement": [{**s, "Action": [*s["Action"], "ec2:CreateTags"]}
                         if s.get("Sid") == "AutoscalerReadsAndLaunches" else s
                         for s in head["Statement"]]}
    for policy, loose in ((head, []), (old, ["AutoscalerReadsAndLaunches"])):
        assert [s.get("Sid") for s in policy["Statement"] if s["Effect"] == "Allow"
                and _actions({"Statement": [s]}) & {
                    "ec2:CreateTags", "ec2:TerminateInstances", "ec2:StopInstances",
                    "ec2:StartInstances"}
                and not set(s.get("Condition", {}).get("StringEquals", {}).items()) & allowed
                ] == loose
    tagging = [s["Condition"]["StringEquals"] for s in head["Statement"]
               if "ec2:CreateTags" in _actions({"Statement": [s]})]
    assert sorted(str(c) for c in tagging) == sorted(str(dict([a])) for a in allowed)


def test_create_iam_makes_both_profiles_then_only_updates_them(tmp_path):
    env = stand_ins(tmp_path, "aws")
    env["ANSWER_sts_get_caller_identity"] = "111122223333"
    env["FAIL_AT"] = "2"  # the first get-role: the role does not exist yet
    first = run([str(ROOT / "deploy/aws/create-iam.sh")], env)
    assert first.returncode == 0, first.stderr
    made = [c["argv"][1:] for c in calls(tmp_path)]
    created = [c for c in made if c[1] == "create-role"]
    assert [c[c.index("--role-name") + 1] for c in created] == ["raydg-head"]
    policies = {c[c.index("--role-name") + 1]: json.loads(c[c.index("--policy-document") + 1])
                for c in made if c[1] == "put-role-policy"}
    assert set(policies) == {"raydg-head", "raydg-worker"}
    text = json.dumps(policies)
    assert "arn:aws:s3:::my-raydg-bucket/*" in text and "BUCKET" not in text
    assert "arn:aws:iam::111122223333:role/raydg-worker" in text and "ACCOUNT" not in text
    stop = next(s for s in policies["raydg-head"]["Statement"]
                if "ec2:TerminateInstances" in s["Action"])
    assert stop["Condition"]["StringEquals"] == {"ec2:ResourceTag/ray-cluster-name": "raydg"}
    (tmp_path / "calls.jsonl").unlink()  # again, with both roles and profiles in place
    env.pop("FAIL_AT")
    env["ANSWER_iam_get_instance_profile"] = "raydg-head raydg-worker"
    second = run([str(ROOT / "deploy/aws/create-iam.sh")], env)
    assert second.returncode == 0, second.stderr
    verbs = {c["argv"][2] for c in calls(tmp_path)}
    assert verbs == {"get-caller-identity", "get-role", "put-role-policy", "get-instance-profile"}


def test_the_mlflow_server_keeps_its_runs_across_a_lost_head(tmp_path):
    """start (nothing to restore) → runs logged over HTTP → backup (as a job does after each
    run) → stop → the head's disk is gone (`ray down`) → start on a new head restores the
    newest backup: the runs are there. A folder stands in for the bucket."""
    from mlflow import MlflowClient

    from tests.conftest import free_ports

    (port,) = free_ports(1)
    head = tmp_path / "head" / "mlflow"
    env = {**stand_ins(tmp_path), "RAYDG_MLFLOW_DIR": str(head), "RAYDG_MLFLOW_PORT": str(port),
           "RAYDG_BIN": str(Path(sys.executable).parent), "RAYDG_MLFLOW_DB_URI": "",
           "RAYDG_MLFLOW_WORKERS": "1",
           "RAYDG_MLFLOW_BACKUPS": str(tmp_path / "bucket" / "mlflow-backups"),
           "RAYDG_MLFLOW_ARTIFACTS": str(tmp_path / "bucket" / "mlflow-artifacts")}
    server = str(ROOT / "deploy/aws/mlflow-server.sh")
    uri = f"http://127.0.0.1:{port}"
    try:
        started = run([server, "start"], env, timeout=180)
        assert started.returncode == 0, started.stdout + started.stderr
        assert "starts empty" in started.stdout
        client = MlflowClient(uri)
        run_id = client.create_run(client.create_experiment("survives")).info.run_id
        client.log_metric(run_id, "val_acc", 0.75, step=3)
        backed = run([server, "backup"], env)
        assert backed.returncode == 0, backed.stderr
        pid = int((head / "server.pid").read_text())
        assert run([server, "stop"], env).returncode == 0
        assert not Path(f"/proc/{pid}").exists() and not (head / "server.pid").exists()
        shutil.rmtree(head.parent)  # the head's disk, with the database, is gone
        again = run([server, "start"], env, timeout=180)
        assert again.returncode == 0, again.stdout + again.stderr
        assert "restored" in again.stdout
        history = MlflowClient(uri).get_metric_history(run_id, "val_acc")
        assert [(m.step, m.value) for m in history] == [(3, 0.75)]
        assert MlflowClient(uri).get_experiment_by_name("survives") is not None
    finally:
        run([server, "stop"], env)


@pytest.mark.parametrize("external", ["", "postgresql://u:p@db:5432/mlflow"])
def test_every_node_gets_the_bucket_named_once_in_settings(tmp_path, external):
    """cluster.yaml sources deploy/aws/node-env.sh before `ray start`; what it exports comes
    from the one bucket of settings.env, and an external database turns backups off."""
    settings = (ROOT / "deploy/aws/settings.env").read_text()
    (bucket,) = re.findall(r"^RAYDG_BUCKET=(\S+)", settings, re.MULTILINE)
    aws = tmp_path / "aws"
    shutil.copytree(ROOT / "deploy/aws", aws)
    (aws / "settings.env").write_text(settings.replace("RAYDG_MLFLOW_DB_URI=\n",
                                                       f"RAYDG_MLFLOW_DB_URI={external}\n"))
    shown = run(["bash", "-c", f"source {aws}/node-env.sh && env"],
                {"PATH": "/usr/bin:/bin", "HOME": "/home/ubuntu"})
    env = dict(line.split("=", 1) for line in shown.stdout.splitlines() if "=" in line)
    assert env["RAYDG_STORAGE"] == f"s3://{bucket}/raydg-results"
    assert env["RAYDG_MLFLOW_BACKUPS"] == ("" if external else f"s3://{bucket}/mlflow-backups")
    assert (env["RAYDG_DATA_ROOT"], env["RAYDG_MLFLOW_DB"]) == (
        "/home/ubuntu/data", "/home/ubuntu/mlflow/mlflow.db")
    cluster = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    starts = " ".join(cluster["head_start_ray_commands"])
    assert "source ~/raydg/deploy/aws/node-env.sh" in starts.split("ray start --head")[0]
    assert "mlflow-server.sh start" in starts and "pkill" not in starts
    tracked = subprocess.run(["git", "ls-files", "--cached", "--others", "--exclude-standard"],
                             cwd=ROOT, capture_output=True, text=True, check=True).stdout.split()
    naming = [f for f in tracked if not f.startswith(("tests/", "deploy/k8s/"))
              and bucket in (ROOT / f).read_text(errors="ignore")]
    assert naming == ["deploy/aws/settings.env"]  # Kubernetes names it in its own ConfigMap
