"""Autoscaling from zero, on this machine: a Ray head without CPUs or worker nodes, whose
autoscaler has cluster.yaml's worker node types on Ray's fake multi-node provider (its "nodes"
are raylets that the autoscaler starts on this machine). An experiment that joins the head says
what is missing, waits, runs on the worker node that the autoscaler adds, with the results of a
local Ray, and that node goes again after the idle timeout.

What the fake provider needs (Ray 2.60; ``ray.cluster_utils.AutoscalingCluster`` would take it
from ``fake_multi_node/example.yaml``, which the wheel does not ship):

- a complete config: the autoscaler reads the file as it is (``ray up`` fills in defaults, but
  for this provider they come from that missing file), so without ``file_mounts`` & co. the
  monitor ends with a ``KeyError`` and no node ever starts;
- ``provider.gcs_address``: without it the provider starts its nodes against port 6379;
- the head node type named ``ray.head.default``, the type the provider gives its head: under
  another name the autoscaler does not see the head and keeps launching (and terminating)
  nodes of the head's type;
- ``RAY_FAKE_CLUSTER=1`` for ``ray start`` (it also fixes the head's node id).

The worker nodes are processes of the autoscaler's monitor on the head; the head is ended with
SIGTERM (never ``ray stop``), and the test checks that no process of this cluster outlives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
import ray
import yaml
from ray._private.services import get_node_ip_address
from ray.autoscaler._private.util import validate_config

from raydg.config import RunConfig
from raydg.experiment import ExperimentResult, run_experiment
from raydg.resolve import resolve
from tests.conftest import assert_same_as_on_a_local_ray, free_ports, wait_for_head

pytestmark = pytest.mark.slow  # the quick loop (-m "not slow") leaves it out

ROOT = Path(__file__).resolve().parents[1]
HEAD_TYPE = "ray.head.default"  # the fake provider's FAKE_HEAD_NODE_TYPE
IDLE_MINUTES = 0.1  # a fraction is allowed: idle worker nodes go after 6 s
WORKER_CPUS = 1  # of every worker node type here (this machine has no GPU)
TIMEOUT = 60  # seconds for the scale-down, and for processes to end


def fake_cluster_config(raw: dict, gcs_address: str) -> dict:
    """cluster.yaml's worker node types (names, min and max workers) on the fake provider, with
    ``WORKER_CPUS`` each, and a head with no CPU: every client actor needs a worker node.
    Nothing of AWS (instance types, setup and start commands, file mounts) is kept."""
    most = raw.get("max_workers", 2)  # Ray's defaults where cluster.yaml leaves them out
    types = {HEAD_TYPE: {"resources": {"CPU": 0}, "node_config": {}, "max_workers": 0}}
    for name, node_type in raw["available_node_types"].items():
        if name != raw["head_node_type"]:
            types[name] = {"resources": {"CPU": WORKER_CPUS}, "node_config": {},
                           "min_workers": node_type.get("min_workers", 0),
                           "max_workers": node_type.get("max_workers", most)}
    return {
        "cluster_name": "raydg-fake", "max_workers": most,
        "upscaling_speed": 1.0, "idle_timeout_minutes": IDLE_MINUTES,
        "provider": {"type": "fake_multinode", "gcs_address": gcs_address,
                     "use_node_id_as_ip": True, "disable_node_updaters": True,
                     "disable_launch_config_check": True},
        "available_node_types": types, "head_node_type": HEAD_TYPE,
        "auth": {}, "docker": {}, "file_mounts": {}, "cluster_synced_files": [],
        "file_mounts_sync_continuously": False, "rsync_exclude": [], "rsync_filter": [],
        "initialization_commands": [], "setup_commands": [], "head_setup_commands": [],
        "worker_setup_commands": [], "head_start_ray_commands": [],
        "worker_start_ray_commands": [],
    }


def worker_nodes() -> set[str]:
    """The ids of the alive nodes other than the head, as the connected driver sees them."""
    return {n["NodeID"] for n in ray.nodes()
            if n["Alive"] and "node:__internal_head__" not in n["Resources"]}


def processes_of(temp_dir: str) -> list[psutil.Process]:
    """The processes of the Ray cluster in ``temp_dir`` (their command lines name it)."""
    found = []
    for p in psutil.process_iter(["cmdline"]):
        if any(temp_dir in arg for arg in p.info["cmdline"] or ()):
            found.append(p)
    return found


def worker_node_processes(temp_dir: str) -> list[psutil.Process]:
    """The processes of the fake worker nodes: the autoscaler's monitor starts them."""
    monitors = [p for p in processes_of(temp_dir)
                if any(a.endswith("autoscaler/_private/monitor.py") for a in p.info["cmdline"])]
    found = []
    for monitor in monitors:
        with contextlib.suppress(psutil.Error):
            found.extend(monitor.children(recursive=True))
    return found


def end(processes: list[psutil.Process]) -> None:
    """SIGTERM, then SIGKILL what is still there after ``TIMEOUT``."""
    for p in processes:
        with contextlib.suppress(psutil.Error):
            p.terminate()
    _, alive = psutil.wait_procs(processes, timeout=TIMEOUT)
    for p in alive:
        with contextlib.suppress(psutil.Error):
            p.kill()


@pytest.fixture
def token_auth(monkeypatch):
    """A client joins a ``ray start`` head only with token authentication. Ray has read
    RAY_AUTH_MODE into its cached config at import, so that is read again (as Ray does when it
    turns token authentication on for a local ``ray.init``)."""
    assert not ray.is_initialized()  # run_experiment would use that session instead
    monkeypatch.setenv("RAY_AUTH_MODE", "token")
    ray._raylet.Config.initialize("")
    yield
    monkeypatch.undo()
    ray._raylet.Config.initialize("")


def head_ports() -> dict[str, int]:
    """Free ports for everything the head listens on, the autoscaler's metrics among them."""
    names = ("port", "dashboard-port", "dashboard-agent-listen-port", "ray-client-server-port",
             "metrics-export-port", "autoscaler-metrics")
    return dict(zip(names, free_ports(len(names)), strict=True))


def start_head(temp_dir: str, ports: dict[str, int]) -> subprocess.Popen:
    """``ray start --head --block`` with no CPU on ``ports``, in ``temp_dir``, whose autoscaler
    runs the fake cluster of the autoscaling.yaml there."""
    ports = dict(ports)
    metrics = ports.pop("autoscaler-metrics")
    return subprocess.Popen(
        [str(Path(sys.executable).parent / "ray"), "start", "--head", "--block",
         "--num-cpus=0", f"--temp-dir={temp_dir}", "--include-dashboard=false",
         f"--autoscaling-config={temp_dir}/autoscaling.yaml",
         *(f"--{name}={port}" for name, port in ports.items())],
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        env={**os.environ, "RAY_FAKE_CLUSTER": "1", "AUTOSCALER_UPDATE_INTERVAL_S": "1",
             "AUTOSCALER_METRIC_PORT": str(metrics)})  # its default 44217 may be taken


@dataclasses.dataclass
class Observed:
    """What the test saw: the experiment's progress lines, the worker nodes before the run, at
    each of its rounds and after it, the number of worker node processes at each round and
    those left after the scale-down, and how long each step took."""

    lines: list[str] = dataclasses.field(default_factory=list)
    nodes: dict[str, list[set[str]]] = dataclasses.field(
        default_factory=lambda: {"before": [], "during": [], "after": []})
    processes: dict[str, list[int]] = dataclasses.field(
        default_factory=lambda: {"during": [], "left": []})
    times: dict[str, float] = dataclasses.field(default_factory=dict)

    @contextlib.contextmanager
    def timed(self, step: str) -> Iterator[None]:
        """Record the seconds the block takes as ``step``'s (unless it raises)."""
        start = time.perf_counter()
        yield
        self.times[step] = time.perf_counter() - start


def run_watched(head: subprocess.Popen, cfg: RunConfig, temp_dir: str, seen: Observed
                ) -> ExperimentResult:
    """Once the head is up, its worker nodes; then ``cfg`` run (it joins the head, then leaves
    it), with the worker nodes and their processes at each round."""
    with seen.timed("head start"):
        wait_for_head(head)
    ray.init(address=cfg.address, logging_level="ERROR", log_to_driver=False)
    seen.nodes["before"].append(worker_nodes())
    ray.shutdown()

    def watch(line: str) -> None:  # progress, while run_experiment is joined to the head
        seen.lines.append(line)
        if "] round " in line:
            seen.nodes["during"].append(worker_nodes())
            seen.processes["during"].append(len(worker_node_processes(temp_dir)))

    with seen.timed("run"):
        scaled = run_experiment(cfg, out=watch)
    return scaled


def wait_for_scale_down(address: str, temp_dir: str, seen: Observed) -> None:
    """The worker nodes after the idle timeout (gone, or those left after ``TIMEOUT``), and the
    pids of their processes still running ``TIMEOUT`` later."""
    ray.init(address=address, logging_level="ERROR", log_to_driver=False)
    with seen.timed("scale-down"):
        deadline = time.perf_counter() + TIMEOUT
        while worker_nodes() and time.perf_counter() < deadline:
            time.sleep(0.5)
    seen.nodes["after"].append(worker_nodes())
    ray.shutdown()
    # the autoscaler ends the worker nodes' raylets and agents, each in its own time
    with seen.timed("worker processes end"):
        _, alive = psutil.wait_procs(worker_node_processes(temp_dir), timeout=TIMEOUT)
    seen.processes["left"] = [p.pid for p in alive]


def end_cluster(head: subprocess.Popen, temp_dir: str, seen: Observed) -> list[psutil.Process]:
    """End the head with SIGTERM, then what that left of the cluster in ``temp_dir``, and
    remove it: the processes that were still there 10 s after the head ended."""
    ray.shutdown()
    with seen.timed("head end"):
        head.terminate()
        head.wait(timeout=TIMEOUT)
    _, stuck = psutil.wait_procs(processes_of(temp_dir), timeout=10)  # still ending
    end(stuck)  # what the head's end did not end
    shutil.rmtree(temp_dir, ignore_errors=True)
    return stuck


def test_an_experiment_waits_for_the_autoscaler_and_runs_on_the_nodes_it_adds(
        tmp_path, token_auth):
    raw = yaml.safe_load((ROOT / "cluster.yaml").read_text())
    workers = [t for n, t in raw["available_node_types"].items() if n != raw["head_node_type"]]
    assert workers and all(t.get("min_workers", 0) == 0 for t in workers)  # all from zero
    # its own temp dir, short (Unix socket paths): this cluster's processes are found by it
    temp_dir = tempfile.mkdtemp(prefix="raydg-as-", dir="/tmp")
    ports = head_ports()
    address = f"{get_node_ip_address()}:{ports['port']}"
    config = fake_cluster_config(raw, address)
    validate_config(config)
    (Path(temp_dir) / "autoscaling.yaml").write_text(yaml.safe_dump(config))
    cfg = RunConfig(dataset="digits-style", target="sketch", rounds=3, local_steps=2,
                    batch_size=16, seeds=[0], method="fedavg", clients=3, address=address,
                    tracking_uri=f"sqlite:///{tmp_path}/mlflow.db",
                    storage=str(tmp_path / "results"))
    resolve(cfg)  # a config that raydg refuses fails here, before Ray starts

    head = start_head(temp_dir, ports)
    seen = Observed()
    try:
        scaled = run_watched(head, cfg, temp_dir, seen)
        wait_for_scale_down(address, temp_dir, seen)
    finally:
        stuck = end_cluster(head, temp_dir, seen)
    nodes, processes = seen.nodes, seen.processes
    print(nodes, processes, seen.times)  # shown if the test fails
    assert any("waiting for the cluster to scale up: no node can host a client actor" in line
               for line in seen.lines), seen.lines
    assert nodes["before"] == [set()], nodes
    assert nodes["during"] and all(nodes["during"]), nodes
    assert nodes["after"] == [set()], nodes
    assert all(processes["during"]) and not processes["left"], processes
    assert not stuck, [p.pid for p in stuck]
    added = set.union(*nodes["during"])
    for run in scaled.runs:  # every client actor ran on a worker node that the autoscaler added
        assert {r["node"] for r in run.tables["placement"] if r["role"] == "client"} <= added

    start = time.perf_counter()
    assert_same_as_on_a_local_ray(cfg, scaled)
    print(f"local Ray: {time.perf_counter() - start:.1f} s")
