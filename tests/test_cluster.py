"""Multi-node: cluster.yaml passes Ray's validation, a two-node Ray cluster on this machine runs
federations on both nodes with single-node results, and a job submitted with jobs/submit.sh
to a local head finishes and logs to MLflow.

Each test starts and stops its own Ray processes (never ``ray stop``): the cluster with
``Cluster.shutdown()``, the ``ray start --block`` head with SIGTERM.
"""

from __future__ import annotations

import copy
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
import pytest
import ray
import yaml
from mlflow import MlflowClient
from ray.cluster_utils import Cluster

from raydg.config import RunConfig
from raydg.experiment import run_experiment
from tests.conftest import free_ports

ROOT = Path(__file__).resolve().parents[1]
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
    assert "mlflow server" in head_commands and "--backend-store-uri sqlite:" in head_commands
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
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
    try:
        local = run_experiment(dataclasses.replace(cfg, address=None), out=lambda _: None)
    finally:
        ray.shutdown()
    for other in (spread, lost):
        for a, b in zip(other.runs, local.runs, strict=True):
            for k in a.global_state:
                np.testing.assert_array_equal(a.global_state[k], b.global_state[k], err_msg=k)
            assert [r["val_acc"] for r in a.history] == [r["val_acc"] for r in b.history]
        assert other.summary == local.summary


def test_a_job_submitted_to_a_local_head_finishes_and_logs_to_mlflow(tmp_path):
    bin_dir = Path(sys.executable).parent
    # its own temp dir (short: Unix socket paths), so that no later ray.init() on this machine
    # finds this head's address in /tmp/ray/ray_current_cluster once it is gone
    temp_dir = tempfile.mkdtemp(prefix="raydg-head-", dir="/tmp")
    names = ("port", "dashboard-port", "dashboard-agent-listen-port", "ray-client-server-port")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    path = f"{bin_dir}{os.pathsep}{os.environ['PATH']}"  # jobs run `python` from the venv
    head = subprocess.Popen(
        [str(bin_dir / "ray"), "start", "--head", "--block", "--num-cpus", "2",
         f"--temp-dir={temp_dir}",
         "--include-dashboard=true", "--dashboard-host", "127.0.0.1",
         *(f"--{name}={port}" for name, port in ports.items())],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "PATH": path})
    started = []  # what the head printed until it was up, for a failure's message
    for line in head.stdout:  # blocks until the head says it is up
        started.append(line)
        if "Ray runtime started" in line:
            break
    assert head.poll() is None, "".join(started)[-3000:]
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "PATH": path,
           "RAY_ADDRESS": f"http://127.0.0.1:{ports['dashboard-port']}",
           "RAYDG_STORAGE": str(tmp_path / "results"), "MLFLOW_TRACKING_URI": uri}
    try:
        job = subprocess.run(
            [str(ROOT / "jobs" / "submit.sh"), "run", "digits-style", "--target", "sketch",
             "--rounds", "1", "--local-steps", "2", "--seed", "0", "--wait"],
            env=env, capture_output=True, text=True, timeout=300)
    finally:
        head.terminate()
        head.wait(timeout=60)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert job.returncode == 0, "".join(started)[-3000:] + job.stdout[-3000:] + job.stderr[-3000:]
    assert "succeeded" in job.stdout + job.stderr
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id])
    assert sorted(("mlflow.parentRunId" in r.data.tags, r.info.status) for r in runs) == [
        (False, "FINISHED"), (True, "FINISHED")]
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert [m.step for m in client.get_metric_history(child.info.run_id, "val_acc")] == [1]
