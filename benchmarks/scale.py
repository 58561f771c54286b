"""Cross-device scale: round time and memory of one federation as its population grows.

The workload is cross-device digits: digits-style, held-out ``sketch``, N clients that each
draw 20 samples of their domain with Dirichlet-0.1 label shares (``client_size``), 10 clients
sampled per round, the sampled clients validating (``validate_clients: sampled``), 20 local
steps, FedAvg, 2 client actors in one local Ray session, for each N of ``--clients`` (default
100, 1 000 and 10 000) in one script run.

Printed per N:
* set-up seconds (partition, actors, the shards into the object store, until round 1);
* the steady round time (median of rounds 2..R) and its ratio to the smallest N's: flat in N
  when nothing in a round grows with the population;
* memory at the last round: the driver's and the client actors' unique memory (USS: pages of
  their own, so the object store's shared pages they map are not counted twice) and the object
  store's bytes in use;
* memory per idle client: the growth of their sum from the previous N, divided by the clients
  added.

Run:  python benchmarks/scale.py [--clients 100 1000 10000] [--rounds 5] [--json scale.json]
"""

from __future__ import annotations

import argparse
import json
import statistics
import time
from typing import Any

import psutil
import ray

from raydg.api import simulation
from raydg.config import RunConfig
from raydg.datasets import load_dataset
from raydg.resolve import resolve


def run(n: int, rounds: int, data) -> dict[str, Any]:
    """One federation of ``n`` clients; its timings and the memory at its last round."""
    cfg = resolve(RunConfig(dataset="digits-style", method="fedavg", target="sketch",
                            clients=n, client_size=20, dirichlet=0.1, sample=10,
                            validate_clients="sampled", rounds=rounds, actors=2))
    memory: dict[str, float] = {}
    start = time.perf_counter()
    sim = simulation(cfg, data, log=lambda _: None)

    def on_round(row: dict[str, float]) -> None:
        if row["round"] < rounds:
            return
        pids = [r["pid"] for r in sim.tables["placement"] if r["role"] == "client"]
        total = ray.cluster_resources()["object_store_memory"]
        memory.update(
            driver_mb=psutil.Process().memory_full_info().uss / 1e6,
            actors_mb=sum(psutil.Process(p).memory_full_info().uss for p in pids) / 1e6,
            object_store_mb=(total - ray.available_resources()["object_store_memory"]) / 1e6)

    result = sim.run(on_round)
    first_round = result.history[0]["round_seconds"]
    setup = time.perf_counter() - start - sum(r["round_seconds"] for r in result.history)
    return {"clients": n, "setup_s": setup, "first_round_s": first_round,
            "steady_s": statistics.median(r["round_seconds"] for r in result.history[1:]),
            **memory}


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--clients", type=int, nargs="+", default=[100, 1000, 10_000])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    data = load_dataset("digits-style", None, None)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    rows: list[dict[str, Any]] = []
    try:
        for n in sorted(args.clients):
            rows.append(run(n, args.rounds, data))
    finally:
        ray.shutdown()
    print(f"{'clients':>8} {'set-up s':>9} {'round s':>8} {'x smallest':>10} {'driver MB':>10} "
          f"{'actors MB':>10} {'store MB':>9} {'KB/idle client':>15}")
    for i, r in enumerate(rows):
        r["memory_mb"] = r["driver_mb"] + r["actors_mb"] + r["object_store_mb"]
        per_client = "" if i == 0 else "{:15.1f}".format(
            1e3 * (r["memory_mb"] - rows[i - 1]["memory_mb"])
            / (r["clients"] - rows[i - 1]["clients"]))
        print(f"{r['clients']:8d} {r['setup_s']:9.1f} {r['steady_s']:8.3f} "
              f"{r['steady_s'] / rows[0]['steady_s']:10.2f} {r['driver_mb']:10.0f} "
              f"{r['actors_mb']:10.0f} {r['object_store_mb']:9.0f} {per_client}")
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
