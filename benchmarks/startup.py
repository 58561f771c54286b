"""Start-up paid once: an experiment's wall time against its federations' steady compute.

The workload is the README's table with three seeds: digits-style, every held-out domain x seeds
0, 1, 2 (12 federations), FedAvg, the dataset's defaults, raydg's default concurrency (the
machine's CPUs shared among the federations that run at once). It runs three ways in one
script run (``--variants`` picks some), each through :func:`raydg.experiment.run_experiment`:

* ``fresh``: ``reuse_actors=False``, its own local Ray: every federation starts its own driver
  and client actors (torch imported, model built, first round in a cold process), as before
  actor reuse;
* ``reused``: the default, its own local Ray: Tune runs the next federation on the finished
  one's trial actor, which resets its parked client actors in place;
* ``running``: the default in a Ray session that is already up (as a job on a cluster finds
  it); the seconds Ray took to start are printed apart.

Printed for each: wall seconds; the ideal, sum over federations of (rounds x steady round time,
the median of rounds 2..R) divided by the federations that run at once (the CPUs over each
federation's actors); wall / ideal (goal <= 1.15); the excess, wall - ideal, the time not spent
in steady rounds (if start-up is paid once it does not grow with the federations or the rounds:
compare ``--seeds 0 1 2`` with ``--seeds 0 1 2 3 4 5``, or ``--rounds 40``); and round 1's time
over the steady round time, the median over the federations, for those that started on fresh
actors and on reused ones (goal <= 1.5). Every run must give the first run's bit-identical
weights and accuracies (else MISMATCH, exit 1). The machine may be shared: the ratios, from one
run, are the figures to quote.

``--config FILE`` runs a paper table instead (its dataset, model and protocol; ``--method`` and
``--seeds`` over it, every target), e.g. a slice of CSAC's Rotated MNIST table:
``--config configs/csac-rotmnist.yaml --seeds 0 --rounds 5 --variants reused running``
(goal for a whole table: wall / ideal <= 1.10).

Run:  python benchmarks/startup.py [--seeds 0 1 2] [--rounds R] [--variants fresh reused running]
                                   [--method fedavg] [--config FILE] [--json startup.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import statistics
import tempfile
import time
from typing import Any

import numpy as np
import ray

from raydg import config as config_mod
from raydg.config import RunConfig
from raydg.config_files import load_yaml
from raydg.experiment import ExperimentResult, run_experiment
from raydg.results import FederationResult, timing_free
from raydg.tracking.store import check_store

WALL_GOAL, FIRST_ROUND_GOAL = 1.15, 1.5
# name: (reuse actors, Ray started before the experiment)
VARIANTS = {"fresh": (False, False), "reused": (True, False), "running": (True, True)}


def steady(run: FederationResult) -> float:
    return statistics.median(r["round_seconds"] for r in run.history[1:])


def figures(wall: float, result: ExperimentResult) -> dict[str, Any]:
    """Wall, ideal, their ratio and round 1 / steady for fresh and reused client actors."""
    actors = max(sum(row["role"] == "client" for row in r.tables["placement"])
                 for r in result.runs)
    at_once = min(len(result.runs), max(1, (os.cpu_count() or 1) // actors))
    ideal = sum(len(r.history) * steady(r) for r in result.runs) / at_once
    first: dict[str, list[float]] = {"fresh": [], "reused": []}
    for r in result.runs:
        kind = "reused" if r.tables["placement"][-1].get("reused") else "fresh"
        first[kind].append(r.history[0]["round_seconds"] / steady(r))
    return {"wall_s": wall, "ideal_s": ideal, "wall_over_ideal": wall / ideal,
            "excess_s": wall - ideal, "federations": len(result.runs),
            "at_once": at_once, **{f"first_round_over_steady_{k}": statistics.median(v)
                                   for k, v in first.items() if v},
            **{f"federations_{k}": len(v) for k, v in first.items()}}


def digest(result: ExperimentResult) -> str:
    """One digest of every federation's final weights and timing-free metrics (imported
    here: this script's process must not hold torch while it measures)."""
    from raydg import state as st

    return st.digest({f"{i}/{k}": v for i, r in enumerate(result.runs)
                      for k, v in r.global_state.items()},
                     [row for r in result.runs for row in timing_free(r.history)])


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--rounds", type=int, help="rounds per federation (default: the dataset's)")
    p.add_argument("--variants", nargs="+", choices=list(VARIANTS), default=list(VARIANTS))
    p.add_argument("--method", default="fedavg")
    p.add_argument("--config", help="a paper's config (YAML) instead of the README's table")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    variants = list(dict.fromkeys(args.variants))  # each once, in the order given
    out: dict[str, dict[str, Any]] = {}
    results: dict[str, ExperimentResult] = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = config_mod.apply(
            RunConfig(dataset="digits-style"),
            config_mod.split_search(load_yaml(args.config))[0] if args.config else {})
        base = dataclasses.replace(base, method=args.method, seeds=args.seeds, target="all",
                                   rounds=args.rounds or base.rounds,
                                   tracking_uri=f"sqlite:///{tmp}/mlflow.db",
                                   storage=f"{tmp}/results")
        check_store(base.tracking_uri)  # a new store's schema, made once, is no run's start-up
        for name in variants:
            reuse, ray_up = VARIANTS[name]
            if ray_up:
                start = time.perf_counter()
                ray.init(address="local", include_dashboard=False, logging_level="ERROR")
                print(f"Ray started in {time.perf_counter() - start:.1f} s")
            start = time.perf_counter()
            try:
                results[name] = run_experiment(dataclasses.replace(base, reuse_actors=reuse),
                                               out=lambda _: None)
                wall = time.perf_counter() - start
            finally:
                ray.shutdown()  # the session started above (the others stop their own)
            out[name] = figures(wall, results[name])
            f = out[name]
            print(f"{name:8} wall {f['wall_s']:6.1f} s  ideal {f['ideal_s']:6.1f} s  "
                  f"wall/ideal {f['wall_over_ideal']:.2f} (goal <= {WALL_GOAL})  "
                  f"excess {f['excess_s']:5.1f} s ({f['federations']} federations)  "
                  f"round 1/steady: " + ", ".join(
                      f"{k} actors {f[f'first_round_over_steady_{k}']:.2f} "
                      f"({f[f'federations_{k}']} federations)"
                      for k in ("fresh", "reused") if f"first_round_over_steady_{k}" in f)
                  + f" (goal <= {FIRST_ROUND_GOAL})")
    if {"fresh", "reused"} <= out.keys():
        print(f"wall fresh / reused: {out['fresh']['wall_s'] / out['reused']['wall_s']:.2f}x")
    first, *others = variants
    bad = [f"{name}: {a.target} seed={a.seed}" for name in others
           for a, b in zip(results[first].runs, results[name].runs, strict=True)
           if timing_free(a.history) != timing_free(b.history) or not all(
               np.array_equal(a.global_state[k], b.global_state[k]) for k in a.global_state)]
    if bad:
        print(f"MISMATCH: {', '.join(bad)}")
    elif others:
        print(f"results: bit-identical for all {len(results[first].runs)} federations, "
              f"{len(variants)} runs; digest {digest(results[first])}")
    else:
        print(f"results: one run, nothing to compare; digest {digest(results[first])}")
    if args.json:
        with open(args.json, "w") as fh:
            json.dump(out, fh, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
