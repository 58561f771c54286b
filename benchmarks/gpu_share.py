"""GPU sharing: rounds per second and memory per actor with 1, 2 and 4 client actors per GPU.

The workload is a ResNet-18 federation: ``digits-style`` at 224 px (RGB, four PACS-like
appearance domains, held-out ``sketch``), ResNet-18 from a seeded initialisation, 12 clients
(four per source domain), all sampled every round, 10 local steps of batch 64 each with
DomainBed's augmentation (on the actor's device, as in the PACS configs), FedAvg,
``--rounds`` rounds. For each K of ``--per-gpu`` (in the order given; repeat a K to see whether
the GPU gives the same result twice) the same federation runs with K client actors at ``1/K``
GPU each, in one local Ray session holding the machine's CPUs and GPUs; the driver (this
process) evaluates the target on the same GPU, as a trial's share does under ``raydg run``.

Printed per run:
* the steady round time (median of rounds 2..R; round 1 holds cuDNN's start-up), rounds per
  second and its ratio to the first run's, client steps per second;
* each actor's GPU memory as ``nvidia-smi`` reports it per process (its CUDA context
  included: what packing actors onto a GPU costs) and its unique host memory (USS), at the
  last round; the driver's GPU memory; the GPU's memory in use;
* whether the final global model is bit-identical to the first run's (``raydg.state.digest``;
  if not for every run, it prints ``MISMATCH`` and exits 1);
* then where a steady round goes, medians of raydg's ``time/*`` metrics
  (docs/concepts/execution.md, "Where a round's time goes"; ``idle`` is ``train - busy``).

``--gpus 0`` runs the same script on CPU (a dry run: no GPU memory column);
``--nondeterministic`` with torch's default GPU kernels (docs/concepts/protocol.md,
*Determinism*), whose runs need not be bit-identical.

Run:  python benchmarks/gpu_share.py [--per-gpu 1 2 4] [--rounds 5] [--json gpu_share.json]
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import shutil
import statistics
import subprocess
from typing import Any

import psutil
import ray

from raydg import state as st
from raydg.api import simulation
from raydg.config import RunConfig
from raydg.datasets import MultiDomainDataset, load_dataset
from raydg.resolve import resolve

PHASES = ("train", "busy", "idle", "aggregate", "validate", "evaluate", "wait")


def gpu_memory_mb() -> tuple[dict[int, float], float]:
    """Per-process GPU memory (MB, by pid) and the memory in use on the GPUs, from nvidia-smi;
    empty and NaN where there is none."""
    if shutil.which("nvidia-smi") is None:
        return {}, float("nan")

    def query(*args: str) -> list[list[str]]:
        out = subprocess.run(["nvidia-smi", *args, "--format=csv,noheader,nounits"],
                             capture_output=True, text=True, check=True).stdout
        return [[f.strip() for f in line.split(",")] for line in out.splitlines() if line]

    procs = {int(pid): float(mb) for pid, mb in query("--query-compute-apps=pid,used_memory")}
    used = sum(float(mb) for (mb,) in query("--query-gpu=memory.used"))
    return procs, used


def run(cfg: RunConfig, data: MultiDomainDataset, per_gpu: int, gpus: float) -> dict[str, Any]:
    """One federation with ``per_gpu`` actors at ``gpus / per_gpu`` GPU each (CPU if 0)."""
    cfg = dataclasses.replace(cfg, actors=per_gpu, gpus_per_actor=gpus / per_gpu)
    sim = simulation(cfg, data, log=lambda s: print("    " + s))
    memory: dict[str, Any] = {}

    def on_round(row: dict[str, float]) -> None:
        print(f"    round {row['round']:.0f}: {row['round_seconds']:.2f} s", flush=True)
        if row["round"] < cfg.rounds:
            return
        pids = [r["pid"] for r in sim.tables["placement"] if r["role"] == "client"]
        procs, used = gpu_memory_mb()
        memory.update(actor_gpu_mb=[procs.get(p, float("nan")) for p in pids],
                      actor_uss_mb=[psutil.Process(p).memory_full_info().uss / 1e6
                                    for p in pids],
                      driver_gpu_mb=procs.get(os.getpid(), float("nan")), gpu_used_mb=used)

    result = sim.run(on_round)
    steady = statistics.median(r["round_seconds"] for r in result.history[1:])
    phases = {name: statistics.median(r[f"time/{name}"] for r in result.history[1:])
              for name in PHASES if name != "idle"}
    phases["idle"] = phases["train"] - phases["busy"]
    steps = cfg.local_steps * len(sim.client_ids)
    return {"per_gpu": per_gpu, "gpus_per_actor": cfg.gpus_per_actor, "steady_s": steady,
            "rounds_per_s": 1 / steady, "steps_per_s": steps / steady,
            "rounds_s": [r["round_seconds"] for r in result.history], "phases": phases,
            "digest": st.digest(result.global_state), **memory}


def report(rows: list[dict[str, Any]]) -> bool:
    """Print the table of the runs, each against the first; whether all were identical."""
    def mb(values: list[float]) -> str:
        return " ".join(f"{v:.0f}" for v in values)

    print(f"{'K/GPU':>5} {'s/round':>8} {'rounds/s':>9} {'x first':>8} {'steps/s':>8} "
          f"{'GPU MB per actor':>18} {'USS MB per actor':>18} {'driver GPU MB':>14} "
          f"{'GPU used MB':>12} {'= first':>8}")
    same = [r["digest"] == rows[0]["digest"] for r in rows]
    for r, s in zip(rows, same, strict=True):
        print(f"{r['per_gpu']:5d} {r['steady_s']:8.3f} {r['rounds_per_s']:9.3f} "
              f"{r['rounds_per_s'] / rows[0]['rounds_per_s']:8.2f} {r['steps_per_s']:8.1f} "
              f"{mb(r['actor_gpu_mb']):>18} {mb(r['actor_uss_mb']):>18} "
              f"{r['driver_gpu_mb']:14.0f} {r['gpu_used_mb']:12.0f} {'yes' if s else 'no':>8}")
    print(f"\nmedian s of a steady round: {'K/GPU':>5} " + " ".join(f"{p:>9}" for p in PHASES))
    for r in rows:
        print(f"{'':28}{r['per_gpu']:5d} "
              + " ".join(f"{r['phases'][p]:9.3f}" for p in PHASES))
    if not all(same):
        print("MISMATCH: the global models differ between runs")
    return all(same)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--per-gpu", type=int, nargs="+", default=[1, 2, 4])
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--gpus", type=float, default=1.0, help="GPUs the actors share (0: CPU)")
    p.add_argument("--model", default="resnet18")
    p.add_argument("--image-size", type=int, default=224)
    p.add_argument("--transform", default="domainbed", help="train_transform of the clients")
    p.add_argument("--nondeterministic", action="store_true",
                   help="torch's default GPU kernels (deterministic: false), to time the switch")
    p.add_argument("--json", help="also write the figures to this file")
    args = p.parse_args(argv)
    if args.rounds < 2:
        p.error("need --rounds >= 2 (round 1 is start-up)")
    cfg = resolve(RunConfig(dataset="digits-style", method="fedavg", target="sketch",
                            clients=12, local_steps=10, batch_size=64, rounds=args.rounds,
                            model=args.model, pretrained=False, image_size=args.image_size,
                            sample=12, cpus_per_actor=1, train_transform=args.transform,
                            deterministic=not args.nondeterministic))
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    print(f"workload: {cfg.model} at {cfg.image_size} px, {cfg.clients} clients x "
          f"{cfg.local_steps} steps x batch {cfg.batch_size} ({cfg.train_transform} "
          f"augmentation), {cfg.rounds} rounds; "
          f"{args.gpus:g} GPU(s) shared by K actors, K in {args.per_gpu}"
          f"{'; torch default kernels' if args.nondeterministic else ''}", flush=True)
    ray.init(address="local", include_dashboard=False, logging_level="ERROR")
    rows = []
    try:
        for k in args.per_gpu:
            print(f"K = {k}", flush=True)
            rows.append(run(cfg, data, k, args.gpus))
    finally:
        ray.shutdown()
    same = report(rows)
    if args.json:
        with open(args.json, "w") as f:
            json.dump(rows, f, indent=1)
    return 0 if same else 1


if __name__ == "__main__":
    raise SystemExit(main())
