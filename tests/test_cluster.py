"""Multi-node: cluster.yaml passes Ray's validation, a two-node Ray cluster on this machine runs
federations on both nodes with single-node results, and jobs submitted with jobs/submit.sh and
jobs/smoke.sh to a local head finish, log to MLflow and back its store up.

Each test starts and stops its own Ray processes (never ``ray stop``): the cluster with
``Cluster.shutdown()``, a ``ray start --block`` node with SIGTERM to it alone
(:func:`tests.conftest.stop_ray_start`).
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
from tests.conftest import (
    assert_same_as_on_a_local_ray,
    free_ports,
    stop_ray_start,
    wait_for_head,
)

pytestmark = pytest.mark.slow  # the quick loop (-m "not slow") leaves it out

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
    assert restore(str(bucket), restored)[1] == []
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
        stop_ray_start(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert job.returncode == 0, job.stdout[-3000:] + job.stderr[-3000:]
    assert "succeeded" in job.stderr
    _check_the_runs_and_their_backup(db, bucket, tmp_path / "restored.db")
    assert checked.returncode == 0, checked.stdout[-3000:] + checked.stderr[-3000:]
    assert "doctor: OK" in checked.stderr and "GPUs torch sees: 0" in checked.stderr
    # the round is not a silence: its progress lines come before doctor's verdict
    assert -1 < checked.stderr.find("  [sketch seed=0] round 1/1 loss") < checked.stderr.find(
        "doctor: OK")
    ids = [line.split("\t")[0] for line in (tmp_path / "jobs.tsv").read_text().splitlines()]
    assert len(ids) == 2 and ids[0] in job.stdout and ids[1] in checked.stdout


def _as_here(command: str, ports: dict[str, int], temp_dir: str, head: bool) -> str:
    """A ``ray start`` line of cluster.yaml as this machine runs it: its ports free ones (two
    nodes share one machine here), the launcher-made autoscaling config dropped, the head's
    address (which the launcher exports as RAY_HEAD_IP) and the file limit this machine allows,
    and ``--block`` with a temp dir of the test's own, so that the test can end it."""
    port = ports["port"]
    command = (command.replace("--port=6379", f"--port={port}")
               .replace("$RAY_HEAD_IP:6379", f"127.0.0.1:{port}")
               .replace("--autoscaling-config=~/ray_bootstrap_config.yaml", "")
               .replace("ulimit -n 65536", "ulimit -n $(ulimit -Hn)")
               .replace("--object-manager-port=8076", f"--object-manager-port="
                                                       f"{ports['object' + '-head' * head]}"))
    own = ([f"--dashboard-port={ports['dashboard']}", f"--ray-client-server-port="
            f"{ports['client']}"] if head else [f"--node-manager-port={ports['manager']}"])
    agent = ports["agent" + "-head" * head]
    return " ".join([command, "--block", "--num-cpus=1", f"--temp-dir={temp_dir}",
                     f"--dashboard-agent-listen-port={agent}", *own])


def _start_lines(key: str) -> list[str]:
    """cluster.yaml's start commands of ``key`` that start Ray: never its ``ray stop`` (which
    would end every Ray of this machine), nor the head's MLflow server (its own test:
    test_aws.py)."""
    lines = yaml.safe_load((ROOT / "cluster.yaml").read_text())[key]
    return [line for line in lines if "ray start" in line]


def test_a_cluster_started_by_cluster_yaml_takes_only_what_carries_its_token(tmp_path):
    """Head and worker started with cluster.yaml's own start commands, in an empty home that
    holds only what `ray up` puts on a node (the repository, the venv, the token that
    file_mounts copies): the worker joins, a job with the token runs, and a job request or a
    driver without it is refused."""
    import requests

    home, bare = tmp_path / "home", tmp_path / "bare"
    (home / ".ray").mkdir(parents=True)
    bare.mkdir()
    (home / "raydg").symlink_to(ROOT)
    (home / "venv").mkdir()
    (home / "venv" / "bin").symlink_to(BIN)
    (home / ".ray" / "auth_token").write_text("raydg-test-token-" + "0" * 32)
    names = ("port", "dashboard", "client", "agent-head", "object-head", "agent", "object",
             "manager")
    ports = dict(zip(names, free_ports(len(names)), strict=True))
    temp_dir = tempfile.mkdtemp(prefix="raydg-tok-", dir="/tmp")
    env = {k: v for k, v in os.environ.items() if not k.startswith(("RAY_", "RAYDG_"))}
    node_env = {**env, "HOME": str(home), "RAY_HEAD_IP": "127.0.0.1"}
    address, jobs = f"127.0.0.1:{ports['port']}", f"http://127.0.0.1:{ports['dashboard']}"
    count = (f"import ray; ray.init(address='{address}', logging_level='ERROR'); "
             "print(sum(n['Alive'] for n in ray.nodes()))")
    nodes, driver = [], None
    try:
        for key, head in (("head_start_ray_commands", True), ("worker_start_ray_commands",
                                                               False)):
            (line,) = _start_lines(key)
            nodes.append(subprocess.Popen(
                ["bash", "-c", _as_here(line, ports, temp_dir, head)], env=node_env,
                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                start_new_session=True))
            wait_for_head(nodes[-1])
            if head:  # the driver without the token, as soon as it can try: Ray retries for
                # some 20 s before it gives up
                driver = subprocess.Popen([sys.executable, "-c", count],
                                          env={**env, "HOME": str(bare)}, text=True,
                                          stdout=subprocess.PIPE, stderr=subprocess.PIPE)
        with_token = {**env, "HOME": str(home), "RAY_AUTH_MODE": "token"}
        joined = subprocess.run([sys.executable, "-c", count], env=with_token,
                                capture_output=True, text=True, timeout=120)
        job = subprocess.run([str(BIN / "ray"), "job", "submit", "--address", jobs, "--",
                              "echo", "the-job-ran"], env=with_token, capture_output=True,
                             text=True, timeout=180)
        anonymous = requests.get(f"{jobs}/api/jobs/", timeout=30)
        driver_out, driver_err = driver.communicate(timeout=180)
    finally:
        if driver is not None and driver.poll() is None:
            driver.kill()
        for node in reversed(nodes):
            stop_ray_start(node)
        shutil.rmtree(temp_dir, ignore_errors=True)
    ran = [line for line in job.stdout.splitlines() if "the-job-ran" in line]
    print(f"worker joined: {joined.stdout.strip()} nodes alive; job with the token: {ran}; "
          f"request without it: HTTP {anonymous.status_code}; driver without it: exit "
          f"{driver.returncode}, {(driver_err.strip().splitlines() or [''])[-1][:160]}")
    assert joined.returncode == 0 and joined.stdout.strip() == "2", joined.stderr[-2000:]
    assert job.returncode == 0 and "the-job-ran" in job.stdout, job.stdout + job.stderr
    assert anonymous.status_code == 401
    assert driver.returncode != 0 and driver_out.strip() == ""


def test_ray_job_stop_leaves_killed_runs_with_their_rounds_and_a_backup(tmp_path):
    """``ray job stop`` on a running jobs/submit.sh job: Ray's SIGTERM reaches raydg, which
    ends its runs KILLED with the rounds so far, and the job then backs up the store (the
    grace jobs/submit.sh gives it: Ray's default 3 s would SIGKILL both)."""
    temp_dir = tempfile.mkdtemp(prefix="raydg-stop-", dir="/tmp")
    path = f"{BIN}{os.pathsep}{os.environ['PATH']}"
    head, dashboard = _start_head(temp_dir, path)
    db, bucket = tmp_path / "mlflow.db", tmp_path / "bucket"
    address = f"http://127.0.0.1:{dashboard}"
    env = {**os.environ, "PATH": path, "RAYDG_STORAGE": str(tmp_path / "results"),
           "MLFLOW_TRACKING_URI": f"sqlite:///{db}", "RAYDG_MLFLOW_DB": str(db),
           "RAYDG_MLFLOW_BACKUPS": str(bucket), "RAYDG_JOBS_LOG": str(tmp_path / "jobs.tsv"),
           "RAY_AUTH_MODE": "token"}
    env.pop("RAY_ADDRESS", None)
    try:
        job_id = subprocess.run(
            [str(ROOT / "jobs" / "submit.sh"), "run", "digits-style", "--target", "sketch",
             "--rounds", "500", "--local-steps", "2", "--experiment", "stopped", "--address",
             address], env=env, capture_output=True, text=True, timeout=120,
            check=True).stdout.strip()
        logs = subprocess.Popen([str(BIN / "ray"), "job", "logs", "--address", address,
                                 "--follow", job_id], env=env, stdout=subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)
        seen = [line for line in _until(logs.stdout, "] round 3/500")]
        stop = subprocess.run([str(BIN / "ray"), "job", "stop", "--address", address, job_id],
                              env=env, capture_output=True, text=True, timeout=300)
        status = subprocess.run([str(BIN / "ray"), "job", "status", "--address", address,
                                 job_id], env=env, capture_output=True, text=True, timeout=60)
        logs.wait(timeout=60)
        tail = logs.stdout.read()
    finally:
        stop_ray_start(head)
        shutil.rmtree(temp_dir, ignore_errors=True)
    assert any("round 3/500" in line for line in seen), "".join(seen)[-2000:]
    assert stop.returncode == 0 and "was stopped" in status.stdout, stop.stderr
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("stopped").experiment_id])
    assert sorted(r.info.status for r in runs) == ["KILLED", "KILLED"], tail[-3000:]
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    rounds = [m.step for m in client.get_metric_history(child.info.run_id, "val_acc")]
    assert rounds[:3] == [1, 2, 3] and rounds[-1] < 500
    restored = tmp_path / "restored.db"
    found, skipped = restore(str(bucket), restored)
    assert found, "the job made no backup: it was killed before the backup ran"
    again = MlflowClient(f"sqlite:///{restored}")
    kept = again.search_runs([again.get_experiment_by_name("stopped").experiment_id])
    print(f"ray job stop: {[r.info.status for r in runs]}, rounds logged {rounds[-1]}, "
          f"backup {Path(found).name} restored with {len(kept)} runs")
    assert not skipped and sorted(r.info.status for r in kept) == ["KILLED", "KILLED"]
    assert len(again.get_metric_history(child.info.run_id, "val_acc")) == len(rounds)


def _until(lines, marker: str):
    """The lines of a stream up to the first that holds ``marker`` (all, if none does)."""
    for line in lines:
        yield line
        if marker in line:
            return
