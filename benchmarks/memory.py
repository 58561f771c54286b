"""Memory of a local run, process by process: a whole Ray as raydg starts it, and the lean one.

The workload is issue 29's (the one compared with Flower): ``raydg run digits-style --target
sketch --clients 30 --dirichlet 0.1 --sample 10 --local-steps 20 --rounds 10 --seed 0
--actors 2`` as a user types it (``python -m raydg``), once with the Ray processes raydg leaves
out (``RAYDG_LEAN_RAY=0``: Ray's own set) and once without, in one script run. While each runs,
every process under the command is read every ``--every`` seconds: USS (its own pages) and PSS
(shared pages divided among the processes sharing them), so that torch's and Ray's shared
libraries count once (PSS also splits a page with processes outside the command: measure on a
machine where no other process maps the same files). Printed for each: the peak of the summed
USS and PSS (MB) and, at that peak, what each kind of process holds; the seconds to the end of
round 1 and to the end; the ratio lean / full. raydg's results must be identical (the printed
Avg). With ``--flower PYTHON``, the same workload in Flower 1.41's simulation
(``benchmarks/flower_workload.py``, run by that interpreter: a venv of its own, as that file
says) is measured the same way, third.

Run:  python benchmarks/memory.py [--every 0.2] [--flower PYTHON] [--json memory.json]
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
    ("raydg.reaper", "raydg reaper"), ("-m raydg", "raydg (main)"),
    ("flower_workload", "Flower (main)"), ("ray::ClientAppActor", "client actor"),
    ("gcs_server", "GCS"),
    ("raylet", "raylet"), ("dashboard/agent.py", "dashboard agent"),
    ("ray::DashboardAgent", "dashboard agent"), ("runtime_env/agent", "runtime-env agent"),
    ("ray::RuntimeEnvAgent", "runtime-env agent"), ("dashboard/dashboard.py", "dashboard head"),
    ("log_monitor.py", "log monitor"), ("autoscaler", "autoscaler monitor"),
    ("ray::ImplicitFunc", "trial (driver actor)"), ("ray::ClientHost", "client actor"),
    ("ray::IDLE", "idle worker"), ("default_worker.py", "idle worker")]


ROUND_1 = re.compile(r"(^|\] )round 1/")  # raydg's progress line, and flower_workload.py's


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


def measure(name: str, argv: list[str], env: dict[str, str], every: float) -> dict[str, Any]:
    """Run ``argv``, sampling its process tree every ``every`` seconds; the peak, the seconds to
    the end of round 1 and to the end, and its printed Avg lines."""
    start = time.perf_counter()
    proc = subprocess.Popen(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            env={**os.environ, **env})
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
            if first is None and ROUND_1.search(line):
                first = time.perf_counter() - start
        time.sleep(every)  # a sampler: memory has no event to wait on
    lines += proc.stdout.read().splitlines(keepends=True)
    if proc.returncode != 0:
        sys.exit("".join(lines[-30:]))
    avg = re.findall(r"Avg.*", "".join(lines))
    return {"name": name, "seconds": time.perf_counter() - start, "first_round": first,
            "result": avg[-2:], **peak}


def raydg(lean: bool, every: float) -> dict[str, Any]:
    storage = tempfile.mkdtemp(prefix="raydg-memory-")
    argv = [sys.executable, "-m", "raydg", *COMMAND, "--tracking-uri",
            f"sqlite:///{storage}/mlflow.db"]
    return measure("raydg, lean Ray" if lean else "raydg, Ray's own set", argv,
                   {"RAYDG_LEAN_RAY": "1" if lean else "0", "RAYDG_STORAGE": storage}, every)


def report(run: dict[str, Any]) -> None:
    print(f"{run['name']}: peak USS {run['uss']:.0f} MB, PSS {run['pss']:.0f} MB; round 1 "
          f"done after {run['first_round']:.1f} s, all after {run['seconds']:.1f} s")
    for kind_, (uss, pss, n) in sorted(run["by_kind"].items(), key=lambda kv: -kv[1][1]):
        print(f"  {kind_:22s} x{n}  USS {uss:7.0f}  PSS {pss:7.0f}")


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--every", type=float, default=0.2)
    p.add_argument("--flower", metavar="PYTHON",
                   help="also run benchmarks/flower_workload.py with this interpreter (a venv "
                        "with Flower 1.41, see that file)")
    p.add_argument("--json")
    args = p.parse_args()
    runs = [raydg(False, args.every), raydg(True, args.every)]
    if args.flower:
        script = os.path.join(os.path.dirname(os.path.abspath(__file__)), "flower_workload.py")
        runs.append(measure("Flower 1.41 simulation", [args.flower, script], {}, args.every))
    for run in runs:
        report(run)
    for base in runs[:1] + runs[2:]:
        ratio = {k: runs[1][k] / base[k] for k in ("uss", "pss", "first_round", "seconds")}
        print(f"lean raydg / {base['name']}: peak USS {ratio['uss']:.2f}, peak PSS "
              f"{ratio['pss']:.2f}, round 1 {ratio['first_round']:.2f}, whole run "
              f"{ratio['seconds']:.2f}")
    full, lean = runs[:2]
    same = full["result"] == lean["result"]
    print("raydg's results identical" if same else
          f"MISMATCH: {full['result']} vs {lean['result']}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(runs, f, indent=1)
    sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
