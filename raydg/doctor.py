"""``raydg doctor``: what a node offers raydg, and one round of a federation on it.

It prints the facts that decide whether the pinned torch can use the node (Python, glibc,
torch and the CUDA it was built for, the GPUs torch sees, the NVIDIA driver, Ray), refuses a
node where torch sees fewer GPUs than expected, then runs one round of FedAvg on the embedded
digits on a fresh Ray of this node alone, its client actors on the GPUs when there are any.
``jobs/smoke.sh`` runs it on a node of each type of a cluster.
"""

from __future__ import annotations

import dataclasses
import platform
import shutil
import subprocess
import tempfile
import time
from collections.abc import Callable
from importlib.metadata import version
from pathlib import Path

from raydg.config import RunConfig
from raydg.errors import RaydgError
from raydg.version import installed_version

SMOKE = RunConfig(dataset="digits-style", method="fedavg", target="sketch", rounds=1,
                  local_steps=2, clients=3, seeds=[0], address="local")


def nvidia_driver() -> str:
    """The NVIDIA driver's version, from ``nvidia-smi`` (``none`` without one)."""
    if shutil.which("nvidia-smi") is None:
        return "none (no nvidia-smi)"
    done = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                          capture_output=True, text=True, timeout=60)
    return done.stdout.strip().splitlines()[0] if done.returncode == 0 and done.stdout.strip() \
        else f"unknown (nvidia-smi: {(done.stderr or done.stdout).strip()[:200]})"


def facts() -> dict[str, str]:
    """What this node offers: software versions and the GPUs torch sees."""
    import torch

    gpus = torch.cuda.device_count() if torch.cuda.is_available() else 0
    names = ", ".join(torch.cuda.get_device_name(i) for i in range(gpus)) or "none"
    return {"node": platform.node(), "python": platform.python_version(),
            "libc": " ".join(platform.libc_ver()), "raydg": installed_version(),
            "ray": version("ray"), "torch": torch.__version__,
            "torch built for CUDA": str(torch.version.cuda), "GPUs torch sees": f"{gpus} ({names})",
            "NVIDIA driver": nvidia_driver()}


def _progress(out: Callable[[str], None]) -> Callable[[str], None]:
    """The run's progress lines, indented, without its tables and its temporary MLflow store."""
    def say(line: str) -> None:
        if line.startswith(("raydg: ", "[")):
            out(f"  {line}")

    return say


def doctor(gpus: int, out: Callable[[str], None]) -> None:
    """Print :func:`facts`; refuse fewer than ``gpus`` GPUs; run one round (on the GPUs if
    ``gpus``) and print where the client actors ran and the target accuracy."""
    import torch

    from raydg.experiment import run_experiment

    found = facts()
    for key, value in found.items():
        out(f"{key}: {value}")
    seen = torch.cuda.device_count() if torch.cuda.is_available() else 0
    if seen < gpus:
        raise RaydgError(f"torch sees {seen} GPU(s) on {found['node']}, {gpus} expected (CUDA "
                         f"build {found['torch built for CUDA']}, NVIDIA driver "
                         f"{found['NVIDIA driver']})")
    with tempfile.TemporaryDirectory(prefix="raydg-doctor-") as tmp:
        cfg = dataclasses.replace(SMOKE, gpus_per_actor=0.25 if gpus else 0.0,
                                  tracking_uri=f"sqlite:///{tmp}/mlflow.db",
                                  storage=str(Path(tmp) / "results"))
        out(f"one round of FedAvg on {cfg.dataset}, on a fresh Ray of this node (a few "
            "seconds to a minute):")
        start = time.perf_counter()
        result = run_experiment(cfg, out=_progress(out))
    (run,) = result.runs
    devices = sorted({row["device"] for row in run.tables["placement"] if row["role"] == "client"})
    out(f"one round of FedAvg on {cfg.dataset} ({cfg.clients} clients on {', '.join(devices)}): "
        f"target accuracy {100 * run.last[run.mode]:.1f}%, {time.perf_counter() - start:.1f} s")
    out("doctor: OK")
