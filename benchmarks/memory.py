"""Memory of a local run, process by process: a whole Ray as raydg starts it, and the lean one.

The workload is issue 29's (the one compared with Flower): ``raydg run digits-style --target
sketch --clients 30 --dirichlet 0.1 --sample 10 --local-steps 20 --rounds 10 --seed 0
--actors 2`` as a user types it (``python -m raydg``), once with the Ray processes raydg leaves
out (``RAYDG_LEAN_RAY=0``: Ray's own set) and once without, in one script run. While each runs,
every process under the command is read every ``--every`` seconds: USS (its own pages) and PSS
(shared pages divided among the processes sharing them), so that torch's and Ray's shared
libraries count once. Printed for each: the peak of the summed USS and PSS (MB) and, at that
peak, what each kind of process holds; the seconds to the end of round 1 and to the end; the
ratio lean / full. Results must be identical (the printed Avg).

Run:  python benchmarks/memory.py [--every 0.2] [--json memory.json]
"""

from __future__ import annotations

import argparse
import json
import os
import re
import subprocess
import sys
import tempfile
import time
from typing import Any

import psutil

COMMAND = ["run", "digits-style", "--target", "sketch", "--clients", "30", "--dirichlet", "0.1",
           "--sample", "10", "--local-steps", "20", "--rounds", "10", "--seed", "0",
           "--actors", "2"]
KINDS = [  # a command line's mark -> the kind of process (an agent renames itself once started)
    ("raydg.reaper", "raydg reaper"), ("-m raydg", "raydg"), ("gcs_server", "GCS"),
    ("raylet", "raylet"), ("dashboard/agent.py", "dashboard agent"),
    ("ray::DashboardAgent", "dashboard agent"), ("runtime_env/agent", "runtime-env agent"),
    ("ray::RuntimeEnvAgent", "runtime-env agent"), ("dashboard/dashboard.py", "dashboard head"),
    ("log_monitor.py", "log monitor"), ("autoscaler", "autoscaler monitor"),
    ("ray::ImplicitFunc", "trial (driver actor)"), ("ray::ClientHost", "client actor"),
    ("ray::IDLE", "idle worker"), ("default_worker.py", "idle worker")]


def kind(line: str) -> str:
    return next((name for mark, name in KINDS if mark in line), "other")


def sample(root: psutil.Process) -> dict[str, list[float]]:
    """USS and PSS (MB) of ``root`` and every process under it, summed by kind."""
    held: dict[str, list[float]] = {}
    for proc in [root, *root.children(recursive=True)]:
        try:
            mem, line = proc.memory_full_info(), " ".join(proc.cmdline())
        except psutil.Error:
            continue
        slot = held.setdefault(kind(line), [0.0, 0.0, 0])
        slot[0] += mem.uss / 2**20
        slot[1] += mem.pss / 2**20
        slot[2] += 1
    return held


def measure(lean: bool, every: float) -> dict[str, Any]:
    env = {**os.environ, "RAYDG_LEAN_RAY": "1" if lean else "0",
           "RAYDG_STORAGE": tempfile.mkdtemp(prefix="raydg-memory-")}
    store = f"sqlite:///{env['RAYDG_STORAGE']}/mlflow.db"
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "raydg", *COMMAND, "--tracking-uri", store],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env=env)
    root, lines, first = psutil.Process(proc.pid), [], None
    peak: dict[str, Any] = {"uss": 0.0}
    os.set_blocking(proc.stdout.fileno(), False)
    while proc.poll() is None:
        held = sample(root)
        uss, pss = sum(v[0] for v in held.values()), sum(v[1] for v in held.values())
        if uss > peak["uss"]:
            peak = {"uss": uss, "pss": pss, "by_kind": held}
        for line in iter(proc.stdout.readline, ""):
            lines.append(line)
            if first is None and "] round 1/" in line:
                first = time.perf_counter() - start
        time.sleep(every)  # a sampler: memory has no event to wait on
    lines += proc.stdout.read().splitlines(keepends=True)
    if proc.returncode != 0:
        sys.exit("".join(lines[-30:]))
    avg = re.findall(r"Avg.*", "".join(lines))
    return {"lean": lean, "seconds": time.perf_counter() - start, "first_round": first,
            "result": avg[-2:], **peak}


def report(run: dict[str, Any]) -> None:
    name = "lean Ray" if run["lean"] else "Ray's own set"
    print(f"{name}: peak USS {run['uss']:.0f} MB, PSS {run['pss']:.0f} MB; round 1 done after "
          f"{run['first_round']:.1f} s, all after {run['seconds']:.1f} s")
    for kind_, (uss, pss, n) in sorted(run["by_kind"].items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind_:22s} x{n}  USS {uss:7.0f}  PSS {pss:7.0f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=0.2)
    p.add_argument("--json")
    args = p.parse_args()
    runs = [measure(False, args.every), measure(True, args.every)]
    for run in runs:
        report(run)
    full, lean = runs
    ratio = {k: lean[k] / full[k] for k in ("uss", "pss", "first_round", "seconds")}
    print(f"lean / full: peak USS {ratio['uss']:.2f}, peak PSS {ratio['pss']:.2f}, round 1 "
          f"{ratio['first_round']:.2f}, whole run {ratio['seconds']:.2f}")
    same = full["result"] == lean["result"]
    print("results identical" if same else f"MISMATCH: {full['result']} vs {lean['result']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
