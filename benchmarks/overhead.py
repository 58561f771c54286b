"""Engine overhead: raydg against a bare single-process loop doing the same local steps.

One digits workload (digits-style, held-out ``sketch``, 30 Dirichlet-0.1 clients, 10 sampled per
round, 20 local steps, 10 rounds) is run four ways in one script run:

* ``bare``: no Ray. All clients in one in-process :class:`raydg.engine.client.ClientHost`; the same
  seeded model init, client sampling, local training, n_k-weighted aggregation in client-id order
  and per-round evaluation (clients' validation splits and the target domain) as
  :meth:`raydg.engine.simulation.Simulation.run`. Run before Ray starts.
* ``bare, 2 at once``: two bare loops in two processes at the same time. Their steady round
  against one loop alone gives the machine's own ceiling for two workers (memory bandwidth,
  shared caches, a VM's neighbours): ceiling = 2 x bare / (bare, 2 at once).
* ``raydg x1`` and ``raydg x2``: :class:`raydg.engine.simulation.Simulation` with 1 and 2
  client actors (1 CPU each), in one local Ray session with 2 CPUs. The target-domain evaluation
  runs in a thread of the driver (this process), so with one actor it may overlap on the spare
  core.

Printed: start-up seconds (building clients, hosts or actors and the evaluator, plus round 1's
excess over the steady state) and steady-state seconds per round (median of rounds 2..R), then
overhead = raydg x1 / bare - 1 (target < 5 %) and speed-up = raydg x1 / raydg x2 (target >= 1.9x
on a 2-core machine) beside the ceiling, each marked PASS or MISS; these are measurements and do
not change the exit status. Then where raydg's steady rounds go (medians of the per-round
``time/*`` metrics, see :meth:`raydg.engine.simulation.Simulation._phase_times`): training wall
time, the clients' own training seconds per actor, their difference (actors idle: stragglers,
dispatch, the previous round's validation queued first), aggregation, source validation,
target evaluation and the driver's wait for them. Last, the cores each raydg run keeps busy:
the machine's busy CPU seconds per round (rounds 3..R, between the reports of rounds 1 and
R - 1; every process: actors, driver, Ray's daemons) over the round's seconds. The speed-up is
(x2's cores / x1's cores) x (x1's CPU work / x2's): with one actor the driver's target
evaluation already runs on the second core, so 2 / (x1's cores) bounds the speed-up even with
both cores always busy and no work added. Every run's final global model must be
bit-identical: if not, MISMATCH and exit 1.

Run:  python benchmarks/overhead.py [--rounds 10] [--repeats 3] [--json overhead.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import multiprocessing
import statistics
import sys
import time
from dataclasses import dataclass, field
from typing import Any

import numpy as np
import psutil
import ray
import torch

from raydg import seeding
from raydg import state as st
from raydg.api import simulation
from raydg.config import RunConfig, clients_per_round
from raydg.datasets import MultiDomainDataset, load_dataset
from raydg.engine.client import ClientHost, Evaluator, RuntimeSpec
from raydg.methods import METHODS
from raydg.models import ModelSpec
from raydg.partition import Partition, make_clients
from raydg.resolve import resolve

OVERHEAD_TARGET = 0.05
SPEEDUP_TARGET = 1.9
PHASES = ("time/train", "time/busy", "time/idle", "time/aggregate", "time/validate",
          "time/evaluate", "time/wait")
METRICS = ("train_loss", "val_acc", "target_acc")


@dataclass
class Run:
    """One pass of the workload: seconds before round 1, seconds per round, what it ended with."""

    setup: float
    rounds: list[float]
    state: st.State
    metrics: list[dict[str, float]]
    phases: list[dict[str, float]] = field(default_factory=list)  # raydg's time/* per round
    cpu: float = math.nan  # the machine's busy CPU seconds per round, rounds 3..R (raydg)


@dataclass
class Measure:
    name: str
    runs: list[Run] = field(default_factory=list)

    @property
    def steady(self) -> float:
        """Median seconds per round over rounds 2..R of every repeat."""
        return statistics.median(s for r in self.runs for s in r.rounds[1:])

    @property
    def startup(self) -> float:
        """Median over repeats of set-up time plus round 1's excess over the steady state."""
        return statistics.median(r.setup + max(0.0, r.rounds[0] - self.steady) for r in self.runs)

    def phase(self, name: str) -> float:
        """Median seconds of a ``time/*`` phase over rounds 2..R of every repeat."""
        return statistics.median(p[name] for r in self.runs for p in r.phases[1:])

    @property
    def first(self) -> float:
        return statistics.median(r.rounds[0] for r in self.runs)

    @property
    def cpu(self) -> float:
        return statistics.median(r.cpu for r in self.runs)

    @property
    def cores(self) -> float:
        """Median over repeats of the cores kept busy in rounds 3..R."""
        return statistics.median(r.cpu / statistics.mean(r.rounds[2:]) for r in self.runs)


def busy_cpu_seconds() -> float:
    """CPU seconds this machine has spent busy since boot, all processes (steal excluded)."""
    t = psutil.cpu_times()
    return t.user + t.nice + t.system + getattr(t, "irq", 0.0) + getattr(t, "softirq", 0.0)


def run_bare(cfg: RunConfig, data: MultiDomainDataset) -> Run:
    """Simulation.run's work in this process, without Ray."""
    t0 = time.perf_counter()
    clients = make_clients(data, Partition.of(cfg))
    spec = ModelSpec(cfg.model, data.channels, len(data.classes), cfg.image_size)
    method_cls = METHODS.get(cfg.method)
    method = method_cls(method_cls.parse_options(cfg.options))
    torch.manual_seed(seeding.derive_seed(cfg.seed, seeding.MODEL_INIT))
    global_state = st.to_numpy(method.build_model(spec))
    host = ClientHost(RuntimeSpec(method, cfg, spec, data.mean, data.std), clients)
    test = data.domain(cfg.target)
    evaluator = Evaluator(RuntimeSpec(method, cfg, spec, data.mean, data.std), test.x, test.y)
    setup = time.perf_counter() - t0

    n = len(clients)
    k = clients_per_round(cfg, n)
    sampler = seeding.numpy_rng(cfg.seed, seeding.SAMPLING)
    rounds: list[float] = []
    metrics: list[dict[str, float]] = []
    for rnd in range(1, cfg.rounds + 1):
        start = time.perf_counter()
        cids = sorted(int(c) for c in sampler.choice(n, size=k, replace=False))
        uploads = [host.train(c, global_state, rnd) for c in cids]
        global_state = st.weighted_average([u.state for u in uploads],
                                           [float(u.num_samples) for u in uploads])
        val, _ = host.validate(global_state, cfg.eval_local)
        target, _ = evaluator.evaluate(global_state)
        rounds.append(time.perf_counter() - start)
        metrics.append({
            "train_loss": float(np.mean([u.metrics["train_loss"] for u in uploads])),
            "val_acc": float(np.mean([v["val_acc"] for v in val.values()])),
            "target_acc": target[method.eval_modes[0]],
        })
    return Run(setup, rounds, global_state, metrics)


def run_bare_pair(cfg: RunConfig, data: MultiDomainDataset) -> list[Run]:
    """Two bare loops at once, in two processes: what this machine's cores give two workers
    that share nothing (the ceiling of any 1-to-2 worker speed-up here)."""
    with multiprocessing.get_context("spawn").Pool(2) as pool:
        return pool.starmap(run_bare, [(cfg, data)] * 2)


def wait_for_cpus(total: float, timeout: float = 10.0) -> None:
    """Let the previous simulation's killed actors hand their CPUs back before the next starts."""
    deadline = time.monotonic() + timeout
    while ray.available_resources().get("CPU", 0) < total and time.monotonic() < deadline:
        time.sleep(0.05)


def run_raydg(cfg: RunConfig, data: MultiDomainDataset, actors: int) -> Run:
    """One Simulation with ``actors`` client actors; set-up runs until round 1 starts."""
    wait_for_cpus(ray.cluster_resources().get("CPU", 0))
    cfg = dataclasses.replace(cfg, actors=actors)
    t0 = time.perf_counter()
    sim = simulation(cfg, data,
                     log=lambda s: print("    " + s.replace("\n", "\n    ")))
    built = time.perf_counter() - t0
    stamps: list[tuple[float, float]] = []  # (time, busy CPU s) as each round is reported
    t1 = time.perf_counter()
    result = sim.run(lambda row: stamps.append((time.perf_counter(), busy_cpu_seconds())))
    rounds = [row["round_seconds"] for row in result.history]
    before_round_1 = stamps[0][0] - t1 - rounds[0]  # placement report (waits for the actors)
    # round r is reported as round r + 1 ends (the last, after the loop): rounds 3..R
    cpu = (stamps[-2][1] - stamps[0][1]) / (len(stamps) - 2) if len(stamps) > 2 else math.nan
    metrics = [{m: float(row[m]) for m in METRICS} for row in result.history]
    phases = [{**{k: v for k, v in row.items() if k.startswith("time/")},
               "time/idle": row["time/train"] - row["time/busy"]} for row in result.history]
    return Run(built + before_round_1, rounds, result.global_state, metrics, phases, cpu)


def identical(a: st.State, b: st.State) -> bool:
    return a.keys() == b.keys() and all(
        a[k].dtype == b[k].dtype and np.array_equal(a[k], b[k]) for k in a)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dataset", default="digits-style")
    p.add_argument("--target", default="sketch")
    p.add_argument("--clients", type=int, default=30)
    p.add_argument("--dirichlet", type=float, default=0.1)
    p.add_argument("--sample", type=int, default=10)
    p.add_argument("--local-steps", type=int, default=20)
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--repeats", type=int, default=1, help="passes of each variant (pooled)")
    p.add_argument("--json", metavar="PATH", help="also write the numbers as JSON")
    args = p.parse_args(argv)
    if args.rounds < 2 or args.repeats < 1:
        p.error("need --rounds >= 2 (round 1 is start-up) and --repeats >= 1")

    cfg = resolve(RunConfig(
        dataset=args.dataset, method="fedavg", target=args.target, seeds=[args.seed],
        clients=args.clients, dirichlet=args.dirichlet, sample=args.sample,
        local_steps=args.local_steps, rounds=args.rounds, cpus_per_actor=1,
    ))
    data = load_dataset(cfg.dataset, cfg.data_root, cfg.image_size)
    print(f"workload: {cfg.dataset}, target {cfg.target}, seed {cfg.seed}: {cfg.clients} clients "
          f"(Dirichlet {cfg.dirichlet}), {cfg.sample}/round, {cfg.local_steps} local steps x "
          f"batch {cfg.batch_size}, {cfg.rounds} rounds, {args.repeats} repeat(s)")

    bare, pair = Measure("bare"), Measure("bare, 2 at once")
    x1, x2 = Measure("raydg x1"), Measure("raydg x2")
    for i in range(args.repeats):
        print(f"bare loop, pass {i + 1}")
        bare.runs.append(run_bare(cfg, data))
        print(f"two bare loops at once, pass {i + 1}")
        pair.runs += run_bare_pair(cfg, data)
    t0 = time.perf_counter()
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    ray_init = time.perf_counter() - t0
    try:
        for i in range(args.repeats):
            for m, actors in ((x1, 1), (x2, 2)):
                print(f"{m.name}, pass {i + 1}")
                m.runs.append(run_raydg(cfg, data, actors))
    finally:
        ray.shutdown()

    measures = (bare, pair, x1, x2)
    print(f"\nray.init: {ray_init:.2f} s (once, not counted below)")
    print(f"{'':15} {'start-up s':>10} {'steady s/round':>15} {'round 1 s':>10}   "
          "rounds 2..R, pass 1 (s)")
    for m in measures:
        tail = " ".join(f"{s:.3f}" for s in m.runs[0].rounds[1:])
        print(f"{m.name:15} {m.startup:10.3f} {m.steady:15.3f} {m.first:10.3f}   {tail}")
    overhead = x1.steady / bare.steady - 1
    speedup = x1.steady / x2.steady
    ceiling = 2 * bare.steady / pair.steady
    ok_overhead, ok_speedup = overhead < OVERHEAD_TARGET, speedup >= SPEEDUP_TARGET
    print(f"overhead  raydg x1 / bare - 1 : {100 * overhead:+6.1f} %   "
          f"(target < {100 * OVERHEAD_TARGET:.0f} %)   {'PASS' if ok_overhead else 'MISS'}")
    print(f"speed-up  raydg x1 / raydg x2 : {speedup:6.2f} x   "
          f"(target >= {SPEEDUP_TARGET}x)  {'PASS' if ok_speedup else 'MISS'}")
    print(f"ceiling   2 x bare / (bare, 2 at once) : {ceiling:6.2f} x   (two workers that share "
          f"nothing); raydg x2 reaches {100 * speedup / ceiling:.0f} % of it")

    print("\nraydg's steady rounds, median s: " + "  ".join(p[5:] for p in PHASES)
          + "  (idle = train - busy)")
    for m in (x1, x2):
        print(f"{m.name:10} " + "  ".join(f"{m.phase(p):{len(p) - 5}.3f}" for p in PHASES))

    bound = 2 / x1.cores
    print(f"\nbusy cores, whole machine (rounds 3..R): raydg x1 {x1.cores:.2f}, raydg x2 "
          f"{x2.cores:.2f}; CPU s per round: {x1.cpu:.3f}, {x2.cpu:.3f}")
    print(f"speed-up = (x2 cores / x1 cores) x (x1 CPU / x2 CPU) = {x2.cores / x1.cores:.2f} x "
          f"{x1.cpu / x2.cpu:.2f}; both cores busy, no work added: 2 / x1 cores = {bound:.2f} x")

    reference = bare.runs[0]
    others = [(m.name, r) for m in measures for r in m.runs if r is not reference]
    bad_state = [name for name, r in others if not identical(reference.state, r.state)]
    diffs = [(name, max(abs(a[m] - b[m]) for a, b in zip(reference.metrics, r.metrics, strict=True)
                        for m in METRICS)) for name, r in others]
    bad_metrics = [name for name, d in diffs if d > 0]
    if bad_state:
        print(f"MISMATCH: final global weights of {sorted(set(bad_state))} differ from bare")
    else:
        print(f"final global weights: bit-identical across all {len(others) + 1} runs "
              f"({len(reference.state)} tensors); digest with the metrics "
              f"{st.digest(reference.state, reference.metrics)}")
    if bad_metrics:
        worst = max(d for _, d in diffs)
        print(f"WARNING: per-round metrics ({', '.join(METRICS)}) of {sorted(set(bad_metrics))} "
              f"differ from bare, by at most {worst:.3g}")

    if args.json:
        out: dict[str, Any] = {
            "config": dataclasses.asdict(cfg), "repeats": args.repeats, "ray_init_s": ray_init,
            "runs": {m.name: {"startup_s": m.startup, "steady_s_per_round": m.steady,
                              "round_seconds": [r.rounds for r in m.runs],
                              "phases": [r.phases for r in m.runs],
                              "setup_s": [r.setup for r in m.runs]} for m in measures},
            "overhead": overhead, "overhead_pass": ok_overhead,
            "speedup": speedup, "speedup_pass": ok_speedup, "ceiling": ceiling,
            "cpu_s_per_round": {m.name: m.cpu for m in (x1, x2)},
            "cores": {m.name: m.cores for m in (x1, x2)}, "bound_2_over_x1_cores": bound,
            "bit_identical": not bad_state, "metrics_identical": not bad_metrics,
        }
        with open(args.json, "w") as f:
            json.dump(out, f, indent=2)
    return 1 if bad_state else 0


if __name__ == "__main__":
    sys.exit(main())
