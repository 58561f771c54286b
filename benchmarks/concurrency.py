"""Concurrent federations: a whole experiment one federation at a time against Tune's default.

The workload is the README's table with three seeds: digits-style, every held-out domain x seeds
0, 1, 2 (12 federations), FedAvg, the dataset's defaults. It runs twice in one script run, each
through :func:`raydg.experiment.run_experiment` with its own fresh local Ray session (Ray's
start-up counted in both):

* ``sequential``: ``max_concurrent=1`` and as many client actors per federation as the machine
  has CPUs: one federation at a time using the whole machine, the layout raydg used before
  federations became concurrent Tune trials.
* ``concurrent``: raydg's default: every federation submitted at once, the machine's CPUs shared
  among them (one actor each here), Tune running as many at once as fit.

Printed: wall seconds of each, the ratio sequential / concurrent, and whether every federation's
final global weights and per-round accuracies are bit-identical between the two (MISMATCH and
exit 1 if not). The machine may be shared: the ratio, from one run, is the figure to quote.

Run:  python benchmarks/concurrency.py [--seeds 0 1 2] [--method fedavg] [--json out.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import tempfile
import time

import numpy as np

from raydg.config import RunConfig
from raydg.experiment import ExperimentResult, run_experiment

ACCURACIES = ("val_acc", "target_acc")


def timed(cfg: RunConfig) -> tuple[float, ExperimentResult]:
    start = time.perf_counter()
    result = run_experiment(cfg, out=lambda _: None)
    return time.perf_counter() - start, result


def identical(a: ExperimentResult, b: ExperimentResult) -> list[str]:
    """Names of the federations whose final weights or per-round accuracies differ."""
    bad = []
    for x, y in zip(a.runs, b.runs, strict=True):
        same = x.global_state.keys() == y.global_state.keys() and all(
            np.array_equal(x.global_state[k], y.global_state[k]) for k in x.global_state)
        same &= all(r[m] == s[m] for r, s in zip(x.history, y.history, strict=True)
                    for m in ACCURACIES)
        if not same:
            bad.append(f"{x.target} seed={x.seed}")
    return bad


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--method", default="fedavg")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    cpus = os.cpu_count() or 1
    with tempfile.TemporaryDirectory() as tmp:
        base = RunConfig(dataset="digits-style", method=args.method, seeds=args.seeds,
                         tracking_uri=f"sqlite:///{tmp}/mlflow.db", storage=f"{tmp}/results")
        print(f"workload: {base.dataset}, {args.method}, all targets x seeds {args.seeds}; "
              f"{cpus} CPUs")
        seq_s, seq = timed(dataclasses.replace(base, max_concurrent=1, actors=cpus))
        print(f"sequential: {seq_s:7.1f} s  (one federation at a time, {cpus} actors each)")
        con_s, con = timed(base)
        actors = {sum(r["role"] == "client" for r in run.tables["placement"]) for run in con.runs}
        print(f"concurrent: {con_s:7.1f} s  (all submitted at once, {sorted(actors)} actors each)")
    print(f"speed-up sequential / concurrent: {seq_s / con_s:.2f}x "
          f"({len(con.runs)} federations)")
    bad = identical(seq, con)
    if bad:
        print(f"MISMATCH: {', '.join(bad)} differ between the two runs")
    else:
        print(f"results: bit-identical final weights and per-round accuracies for all "
              f"{len(con.runs)} federations")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"sequential_s": seq_s, "concurrent_s": con_s, "federations": len(con.runs),
                       "cpus": cpus, "identical": not bad}, f, indent=1)
    return 1 if bad else 0


if __name__ == "__main__":
    raise SystemExit(main())
