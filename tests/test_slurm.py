"""deploy/slurm/raydg.sbatch, run with bash as a one-node Slurm job on this machine: the Slurm
variables set by hand, ``srun`` and ``scontrol`` replaced by shims first on PATH. The script
starts a Ray head with ``srun ... ray start --block``, runs raydg against it, ends it and exits
with raydg's status.

The Ray it starts has its own ports and temp dir (never ``ray stop``, never /tmp/ray): any
other Ray on this machine is left alone.
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest
from mlflow import MlflowClient

from tests.conftest import free_ports

pytestmark = pytest.mark.slow  # the quick loop (-m "not slow") leaves it out

ROOT = Path(__file__).resolve().parents[1]
SCRIPT = ROOT / "deploy" / "slurm" / "raydg.sbatch"

SCONTROL = """#!/bin/bash
# scontrol show hostnames [LIST]: one host per line (comma-separated lists only)
[ "${1:-} ${2:-}" = "show hostnames" ] || { echo "scontrol shim: not $*" >&2; exit 2; }
tr ',' '\\n' <<<"${3:-$SLURM_JOB_NODELIST}"
"""

# srun's options come before the command (the first word that is not an option or an option's
# value); the shim checks them, logs the command and runs it here with srun's environment.
SRUN = """#!/bin/bash
hosts=" $(tr ',' ' ' <<<"$SLURM_JOB_NODELIST") "
while [ $# -gt 0 ]; do
  case $1 in
    --nodes=* | --ntasks=* | --cpus-per-task=* | --gpus-per-task=* | --nodelist=*) opt=$1 ;;
    -N | -n | -c | -w | --nodes | --ntasks | --cpus-per-task | --gpus-per-task | --nodelist)
      opt="$1=$2"; shift ;;
    -[Nncw]?*) opt="${1:0:2}=${1:2}" ;;
    --overlap | --exact) opt=$1 ;;
    --) shift; break ;;
    -*) echo "srun shim: unknown option $1" >&2; exit 2 ;;
    *) break ;;
  esac
  case $opt in
    -w=* | --nodelist=*) [[ $hosts == *" ${opt#*=} "* ]] \\
      || { echo "srun shim: ${opt#*=} is not in the job" >&2; exit 1; } ;;
  esac
  shift
done
[ $# -gt 0 ] || { echo "srun shim: no command" >&2; exit 2; }
printf '%s\\n' "$*" >>"$SRUN_SHIM_LOG"
exec "$@"
"""

UNSET = ("RAY_ADDRESS", "MLFLOW_TRACKING_URI", "RAY_AUTH_TOKEN_PATH", "RAYDG_HEAD_IP",
         "SLURM_GPUS_PER_TASK", "SLURM_GPUS_ON_NODE", "RAYDG_RAY_START_ARGS",
         "RAYDG_RAY_HEAD_ARGS", "RAYDG_CPUS_PER_NODE", "RAYDG_GPUS_PER_NODE")


def _processes_using(folder: str) -> list[str]:
    """Processes with ``folder`` in their command line or a file open under it: every process
    of a Ray session in that temp dir (its workers' output goes to files in its logs/)."""
    found = []
    for proc in Path("/proc").iterdir():
        if not proc.name.isdigit() or proc.name == str(os.getpid()):
            continue
        try:
            cmd = (proc / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
            files = [os.readlink(fd) for fd in (proc / "fd").iterdir()]
        except OSError:  # gone, or not ours to read
            continue
        if folder in cmd or any(f.startswith(folder) for f in files):
            found.append(f"{proc.name}: {cmd[:120]}")
    return found


def _job_env(tmp_path: Path, shared: Path, temp_dir: str) -> dict[str, str]:
    """A one-node job's environment on this machine: the shims (written to ``tmp_path``/bin)
    first on PATH, the Slurm variables, results in ``shared``, and a Ray with ``temp_dir``,
    ports and a token of its own."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("scontrol", SCONTROL), ("srun", SRUN)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    ports = free_ports(4)
    env = {k: v for k, v in os.environ.items() if k not in UNSET}
    env.update({
        "PATH": f"{bin_dir}{os.pathsep}{env['PATH']}",
        "SLURM_JOB_ID": "4242", "SLURM_JOB_NODELIST": socket.gethostname(),
        "SLURM_JOB_NUM_NODES": "1", "SLURM_CPUS_PER_TASK": "2", "SLURM_SUBMIT_DIR": str(ROOT),
        "SRUN_SHIM_LOG": str(tmp_path / "srun.log"),
        "RAYDG_VENV": sys.prefix,  # the environment running the tests
        "RAYDG_STORAGE": str(shared / "raydg-results"), "RAYDG_RAY_TEMP_DIR": temp_dir,
        "RAY_AUTH_TOKEN": secrets.token_hex(32),  # leaves ~/.ray/auth_token alone
        **dict(zip(("RAYDG_RAY_PORT", "RAYDG_RAY_CLIENT_PORT", "RAYDG_DASHBOARD_PORT",
                    "RAYDG_DASHBOARD_AGENT_PORT"), map(str, ports), strict=True)),
    })
    return env


def _run_job(tmp_path: Path, env: dict[str, str], temp_dir: str
             ) -> tuple[subprocess.CompletedProcess, float, list[str]]:
    """The script run by bash in ``tmp_path`` with ``env``: its result, its seconds, and the
    processes of its Ray (in ``temp_dir``) still running 5 s after it ended; then whatever is
    left of that Ray is killed and ``temp_dir`` removed."""
    started = time.monotonic()
    try:
        job = subprocess.run(
            ["bash", str(SCRIPT), "run", "digits-style", "--target", "sketch", "--rounds", "1",
             "--local-steps", "2", "--seed", "0", "--experiment", "slurm smoke"],
            cwd=tmp_path, env=env, capture_output=True, text=True, timeout=300)
        took = time.monotonic() - started
        left = _processes_using(temp_dir)
        for _ in range(10):  # a moment for any straggler, then name what is left
            if not left:
                break
            time.sleep(0.5)
            left = _processes_using(temp_dir)
    finally:
        for line in _processes_using(temp_dir):  # only what this test's Ray left: its temp dir
            subprocess.run(["kill", "-KILL", line.split(":")[0]], check=False)
        shutil.rmtree(temp_dir, ignore_errors=True)
    return job, took, left


def test_sbatch_script_runs_raydg_on_a_one_node_job_and_stops_its_ray(tmp_path):
    shared = tmp_path / "shared"  # what a cluster's nodes share (a home, a scratch folder)
    temp_dir = tempfile.mkdtemp(prefix="rs-", dir="/tmp")  # short: Ray's Unix sockets
    job, took, left = _run_job(tmp_path, _job_env(tmp_path, shared, temp_dir), temp_dir)
    output = job.stdout[-3000:] + job.stderr[-4000:]
    assert job.returncode == 0, output
    print(f"sbatch script: {took:.1f} s")
    assert not left, f"Ray processes left running: {left}"
    head, = (c for c in (tmp_path / "srun.log").read_text().splitlines() if "--head" in c)
    assert "--num-cpus=2 --num-gpus=0" in head and "--block" in head
    # beside the results, on the "shared" folder, a store of this job's own
    uri = f"sqlite:///{shared / 'mlflow-stores' / 'mlflow-4242.db'}"
    assert f"MLflow store {uri}" in job.stderr
    client = MlflowClient(uri)
    experiment = client.get_experiment_by_name("slurm smoke")  # the space survived
    assert experiment is not None, output
    runs = client.search_runs([experiment.experiment_id])
    assert sorted(("mlflow.parentRunId" in r.data.tags, r.info.status) for r in runs) == [
        (False, "FINISHED"), (True, "FINISHED")]
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    assert [m.step for m in client.get_metric_history(child.info.run_id, "val_acc")] == [1]
