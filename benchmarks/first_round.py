"""Time to the first round, as a user meets it: from the command's start to round 1's line.

Two commands, each run ``--repeats`` times as a user types them (``python -m raydg``, a fresh
local Ray each time, a new SQLite store made once before):

* the README's embedded run, ``raydg run digits-style --method fedavg`` (4 federations, 2 at a
  time): seconds to the first ``round 1/`` line and to the end;
* one federation, ``raydg run digits-style --method fedavg --target sketch``: its wall time
  against its steady compute, rounds x the median of its rounds 2..R (each round's seconds as
  its progress line prints them); goal <= 1.3.

Beside them, as a reference, the floor under any Ray-based run: a script that starts the same
lean local Ray (:func:`raydg.cluster.lean`) and one actor that imports torch, timed to its answer
(no Tune, no data, no round).

``--baseline DIR`` runs the same commands with another checkout's raydg (``PYTHONPATH=DIR``,
e.g. a ``git worktree`` of an older commit) alternately with this one, and prints this / the
baseline: the figure to quote on a shared machine. Medians over the repeats.

Run:  python benchmarks/first_round.py [--repeats 3] [--baseline DIR]
"""

from __future__ import annotations

import argparse
import os
import re
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

README_RUN = ["run", "digits-style", "--method", "fedavg"]
ONE_FEDERATION = [*README_RUN, "--target", "sketch"]
ROUND = re.compile(r"\] round (\d+)/(\d+) .* ([0-9.]+)s$")
GOAL_FIRST, GOAL_WALL = 4.0, 1.3
FLOOR = """
import ray
from raydg.cluster import lean

@ray.remote(num_cpus=1)
class Worker:
    def __init__(self):
        import torch  # noqa: F401

    def ready(self):
        return True

with lean():
    ray.init(address="local", include_dashboard=False, logging_level="ERROR",
             log_to_driver=False)
ray.get(Worker.remote().ready.remote())
print("ready", flush=True)
ray.shutdown()
"""


def run(code: Path, args: list[str], tmp: str) -> dict[str, float]:
    """Seconds to the first round's line and to the end, and the end over the rounds' steady
    compute (meaningful for one federation)."""
    env = {**os.environ, "PYTHONPATH": str(code), "RAYDG_STORAGE": f"{tmp}/results"}
    start, first, rounds = time.perf_counter(), None, []
    proc = subprocess.Popen([sys.executable, "-m", "raydg", *args, "--tracking-uri",
                             f"sqlite:///{tmp}/mlflow.db"], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env, cwd=code)
    for line in proc.stdout:
        if (m := ROUND.search(line.rstrip())) is not None:
            first = first or time.perf_counter() - start
            rounds.append(float(m.group(3)))
    if proc.wait() != 0:
        sys.exit(f"{code}: raydg {' '.join(args)} failed ({proc.returncode})")
    wall = time.perf_counter() - start
    steady = statistics.median(rounds[1:]) if len(rounds) > 1 else float("nan")
    return {"first": first, "wall": wall, "wall_over_steady": wall / (len(rounds) * steady)}


def floor(code: Path) -> dict[str, float]:
    """Seconds from the start of a process to the answer of a Ray actor that imports torch."""
    env = {**os.environ, "PYTHONPATH": str(code)}
    start = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-c", FLOOR], stdout=subprocess.PIPE, text=True,
                            env=env, cwd=code)
    ready = None
    for line in proc.stdout:
        if line.strip() == "ready":
            ready = time.perf_counter() - start
    if proc.wait() != 0 or ready is None:
        sys.exit(f"{code}: the floor's script failed ({proc.returncode})")
    return {"first": ready}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--baseline", type=Path, help="another checkout, run alternately")
    args = p.parse_args()
    codes = {"this": Path(__file__).resolve().parent.parent}
    if args.baseline:
        codes["baseline"] = args.baseline.resolve()
    got: dict[tuple[str, str], list[dict[str, float]]] = {}
    with tempfile.TemporaryDirectory() as tmp:
        run(codes["this"], [*ONE_FEDERATION, "--rounds", "1"], tmp)  # the store, made once
        for _ in range(args.repeats):
            got.setdefault(("floor", ""), []).append(floor(codes["this"]))
            for name, code in codes.items():
                for label, command in (("README run", README_RUN), ("1 federation",
                                                                    ONE_FEDERATION)):
                    got.setdefault((name, label), []).append(run(code, command, tmp))
    med = {key: {k: statistics.median(r[k] for r in runs) for k in runs[0]}
           for key, runs in got.items()}
    print(f"floor: Ray's start and one actor that imports torch answers after "
          f"{med.pop(('floor', ''))['first']:.1f} s")
    for (name, label), m in med.items():
        ratio = (f", wall / steady compute {m['wall_over_steady']:.2f} (goal <= {GOAL_WALL})"
                 if label == "1 federation" else "")
        print(f"{name:8} {label:12}: round 1 after {m['first']:5.1f} s (goal <= {GOAL_FIRST}), "
              f"all after {m['wall']:5.1f} s{ratio}")
    if args.baseline:
        for label in ("README run", "1 federation"):
            this, base = med["this", label], med["baseline", label]
            print(f"this / baseline, {label}: round 1 {this['first'] / base['first']:.2f}, "
                  f"whole run {this['wall'] / base['wall']:.2f}")


if __name__ == "__main__":
    main()
