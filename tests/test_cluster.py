"""Multi-node: cluster.yaml passes Ray's validation, a two-node Ray cluster on this machine runs
federations on both nodes with single-node results, and jobs submitted with jobs/submit.sh and
jobs/smoke.sh to a local head finish, log to MLflow and back its store up.

Each test starts and stops its own Ray processes (never ``ray stop``): the cluster with
``Cluster.shutdown()``, the ``ray start --block`` head with SIGTERM.
"""

from __future__ import annotations

import copy
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import pytest
import ray
import yaml
from mlflow import MlflowClient
from ray.cluster_utils import Cluster

from raydg.config import RunConfig
from raydg.experiment import run_experiment
from raydg.tracking.backup import restore
from tests.conftest import assert_same_as_on_a_local_ray, free_ports, wait_for_head

ROOT = Path(__file__).resolve().parents[1]
BIN = Path(sys.executable).parent  # the venv's: ray, and the python that jobs run
TINY = {"dataset": "digits-style", "target": "sketch", "rounds": 5, "local_steps": 4,
        "batch_size": 16, "val_every": 2, "seeds": [0, 1], "checkpoint_every": 1}


def test_cluster_yaml_passes_rays_validation():
    from jsonschema import ValidationError
    from ray.autoscaler._private.util import prepare_config, validate_config

    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    prepared = prepare_config(copy.deepcopy(raw))
    validate_config(prepared)
    gpu = {name: t for name, t in prepared["available_node_types"].items()
           if t["node_config"]["InstanceType"].startswith("g")}
    assert gpu and all(t["min_workers"] == 0 for t in gpu.values())  # GPUs scale from zero
    assert prepared["head_node_type"] == "head"
    head_commands = " ".join(prepared["head_start_ray_commands"])
    assert "deploy/aws/mlflow-server.sh start" in head_commands  # restores, then health-checks
    image = "resolve:ssm:/aws/service/deeplearning/ami/x86_64/base-oss-nvidia-driver-gpu-"
    profiles = {name: t["node_config"]["IamInstanceProfile"]["Name"]
                for name, t in prepared["available_node_types"].items()}
    assert profiles == {name: "raydg-head" if name == "head" else "raydg-worker"
                        for name in profiles}  # the profiles deploy/aws/create-iam.sh makes
    assert all(t["node_config"]["ImageId"].startswith(image)
               for t in prepared["available_node_types"].values())
    assert any("constraints.txt" in c for c in prepared["setup_commands"])
    raw["available_node_types"]["gpu-1"]["min_wrkers"] = 0  # Ray's schema refuses unknown keys
    with pytest.raises(ValidationError, match="min_wrkers"):
        validate_config(prepare_config(raw))


def _nodes(run, role):
    return {r["node"] for r in run.tables["placement"] if r["role"] == role}


def test_two_node_cluster_places_federations_on_both_nodes_with_single_node_results(tmp_path):
    """Two 1-CPU nodes: one federation on each, as on one node; then the worker node is
    removed mid-run and its federation finishes on the head from its checkpoint, the same."""
    cluster = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    removed: list[str] = []

    def remove_worker(line: str) -> None:
        if "] round 2/" in line and not removed:
            (worker,) = cluster.worker_nodes
            removed.append(worker.node_id)
            cluster.remove_node(worker)

    try:
        cluster.add_node(num_cpus=1)
        cluster.wait_for_nodes()
        cfg = RunConfig(**TINY, method="fedbn", clients=4, address=cluster.address,
                        tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
        spread = run_experiment(cfg, out=lambda _: None)  # joins the cluster, then leaves it
        lost = run_experiment(cfg, out=remove_worker)
    finally:
        ray.shutdown()
        cluster.shutdown()
    drivers = set.union(*(_nodes(r, "driver") for r in spread.runs))
    clients = set.union(*(_nodes(r, "client") for r in spread.runs))
    assert len(drivers) == 2 and drivers == clients  # one federation on each 1-CPU node
    assert removed and all(_nodes(r, "client") != set(removed) for r in lost.runs)
    client = MlflowClient(cfg.tracking_uri)
    children = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id],
                                  f"tags.mlflow.parentRunId = '{lost.run_id}'")
    assert sorted(c.data.tags.get("raydg.restarts", "0") for c in children) == ["0", "1"]
    assert_same_as_on_a_local_ray(cfg, spread, lost)


def _start_head(temp_dir: str, path: str) -> tuple[subprocess.Popen, int]:
    """``ray start --head --block`` in ``temp_dir`` on free ports, with 2 CPUs, the head node
    type's raydg-node-head resource and the dashboard (the jobs API), and ``path`` as PATH; once
    it is up: its process and the dashboard's port."""
    names = ("port", "dashboard-port", "dashboard-agent-listen-port", "ray-client-server-port")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    head = subprocess.Popen(
        [str(BIN / "ray"), "start", "--head", "--block", "--num-cpus", "2",
         "--resources", '{"raydg-node-head": 1}', f"--temp-dir={temp_dir}",
         "--include-dashboard=true", "--dashboard-host", "127.0.0.1",
         *(f"--{name}={port}" for name, port in ports.items())],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PATH": path})
    wait_for_head(head)
    return head, ports["dashboard-port"]


def _check_the_runs_and_their_backup(db: Path, bucket: Path, restored: Path) -> None:
    """The run job's experiment in the store ``db``: its parent and child runs FINISHED, the
    child's one round logged; the backup in ``bucket``, restored to ``restored``, holds both."""
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("cluster smoke").experiment_id])
    assert sorted(("mlflow.parentRunId" in r.data.tags, r.info.status) for r in runs) == [
        (False, "FINISHED"), (True, "FINISHED")]
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert [m.step for m in client.get_metric_history(child.info.run_id, "val_acc")] == [1]
    restore(str(bucket), restored)
    again = MlflowClient(f"sqlite:///{restored}")
    assert len(again.search_runs([again.get_experiment_by_name("cluster smoke").experiment_id
                                  ])) == 2


def test_jobs_submitted_to_a_local_head_log_to_mlflow_back_it_up_and_pass_the_smoke_check(
        tmp_path):
    """A run job (an experiment name with a space, ``--address=``) finishes, logs to MLflow and
    backs the store up (a folder stands in for the bucket); the smoke job for the head's node
    type lands on it (its raydg-node-head resource) and passes ``raydg doctor``."""
    # its own temp dir (short: Unix socket paths), so that no later ray.init() on this machine
    # finds this head's address in /tmp/ray/ray_current_cluster once it is gone
    temp_dir = tempfile.mkdtemp(prefix="raydg-head-", dir="/tmp")
    path = f"{BIN}{os.pathsep}{os.environ['PATH']}"  # jobs run `python` from the venv
    head, dashboard = _start_head(temp_dir, path)
    db, bucket = tmp_path / "mlflow.db", tmp_path / "bucket" / "mlflow-backups"
    address = f"--address=http://127.0.0.1:{dashboard}"
    env = {**os.environ, "PATH": path, "RAYDG_STORAGE": str(tmp_path / "results"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{db}", "RAYDG_MLFLOW_DB": str(db),
           "RAYDG_MLFLOW_BACKUPS": str(bucket), "RAYDG_JOBS_LOG": str(tmp_path / "jobs.tsv")}
    env.pop("RAY_ADDRESS", None)
    smoke = tmp_path / "cluster.yaml"
    smoke.write_text(yaml.safe_dump({"available_node_types": {"head": {"resources": {
        "CPU": 2, "raydg-node-head": 1}}}}))
    try:
        job = subprocess.run(
            [str(ROOT / "jobs" / "submit.sh"), "run", "digits-style", "--target", "sketch",
             "--rounds", "1", "--local-steps", "2", "--seed", "0", address,
             "--experiment", "cluster smoke", "--wait"],
            env=env, capture_output=True, text=True, timeout=300)
        checked = subprocess.run([str(ROOT / "jobs" / "smoke.sh"), "--cluster", str(smoke),
                                  address, "--wait"],
                                 env=env, capture_output=True, text=True, timeout=300)
    finally:
        head.terminate()
        head.wait(timeout=60)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "succeeded" in job.stderr
    _check_the_runs_and_their_backup(db, bucket, tmp_path / "restored.db")
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert "doctor: OK" in checked.stderr and "GPUs torch sees: 0" in checked.stderr
    ids = [line.split("\t")[0] for line in (tmp_path / "jobs.tsv").read_text().splitlines()]
    assert len(ids) == 2 and ids[0] in job.stdout and ids[1] in checked.stdout
