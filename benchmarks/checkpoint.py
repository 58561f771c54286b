"""Checkpoint cost: the time and bytes of a federation checkpoint beside a round's time.

The workload is the cross-device digits one of FedIG-A appendix A.6: digits-style, held-out
``sketch``, 30 Dirichlet-0.1 clients, 10 sampled per round, the digits defaults (20 local
steps), on 2 client actors in one local Ray session, for each method of ``--methods``
(default fedbn and fedfd-a, its CAFL averaged over features: the digits setting that trains).
Each method runs twice in one script run:

* without checkpoints: the steady round time (median of rounds 2..R);
* with a checkpoint after every round, as ``--checkpoint-every 1`` writes it: the snapshot (the
  global model, every client's persistent state gathered from the actors, history, ledger,
  sampler) written by :func:`raydg.checkpoint.write` and copied once more, as Tune copies a
  reported checkpoint into the experiment's storage. Its seconds (median) and bytes.

Printed per method: round seconds, checkpoint seconds and bytes, their ratio, and the share of
the run that raydg's default cadence (a checkpoint whenever the time since the last is 50 times
its cost) spends on checkpoints. Both runs must end with bit-identical weights (else MISMATCH,
exit 1): writing checkpoints never changes a result.

Run:  python benchmarks/checkpoint.py [--rounds 10] [--methods fedbn fedfd-a]
"""

from __future__ import annotations

import argparse
import dataclasses
import shutil
import statistics
import tempfile
import time
from pathlib import Path

import numpy as np
import ray

from raydg import checkpoint
from raydg.api import simulation
from raydg.config import RunConfig
from raydg.datasets import load_dataset
from raydg.resolve import resolve
from raydg.trials.trial import Cadence

# FedFD-A's paper setting (CAFL summed over features) diverges from scratch on digits: NaN
# weights would make the equality check below say nothing
OPTIONS = {"fedfd-a": {"cafl_reduction": "mean"}}


def run(cfg: RunConfig, data, with_checkpoints: bool) -> tuple[list[float], list[float],
                                                                 list[int], dict]:
    """Round seconds, checkpoint seconds, checkpoint bytes, final weights."""
    sim = simulation(cfg, data, log=lambda _: None)
    seconds: list[float] = []
    sizes: list[int] = []

    def on_round(_row: dict[str, float]) -> None:
        if not (with_checkpoints and sim.resumable):
            return
        start = time.perf_counter()
        with tempfile.TemporaryDirectory() as tmp:
            checkpoint.write(Path(tmp) / "c", sim.snapshot(), dataclasses.asdict(cfg))
            shutil.copytree(Path(tmp) / "c", Path(tmp) / "storage")  # Tune's copy
            sizes.append(sum(f.stat().st_size for f in (Path(tmp) / "c").iterdir()))
        seconds.append(time.perf_counter() - start)

    result = sim.run(on_round)
    return [r["round_seconds"] for r in result.history], seconds, sizes, result.global_state


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rounds", type=int, default=10)
    p.add_argument("--methods", nargs="+", default=["fedbn", "fedfd-a"])
    args = p.parse_args(argv)
    data = load_dataset("digits-style", None, None)
    ray.init(address="local", num_cpus=2, include_dashboard=False, logging_level="ERROR")
    mismatch = False
    print(f"{'method':8} {'round s':>8} {'ckpt s':>8} {'ckpt MB':>8} {'ckpt/round':>10} "
          f"{'default cadence share':>22}")
    try:
        for method in args.methods:
            cfg = resolve(RunConfig(dataset="digits-style", method=method, target="sketch",
                                    clients=30, dirichlet=0.1, sample=10, actors=2,
                                    rounds=args.rounds, options=OPTIONS.get(method, {})))
            plain, _, _, plain_state = run(cfg, data, with_checkpoints=False)
            _, ckpt_s, ckpt_bytes, ckpt_state = run(cfg, data, with_checkpoints=True)
            round_s = statistics.median(plain[1:])
            cost = statistics.median(ckpt_s)
            share = cost / (cost + cost / Cadence.BUDGET)
            megabytes = statistics.median(ckpt_bytes) / 1e6
            print(f"{method:8} {round_s:8.3f} {cost:8.3f} {megabytes:8.2f} "
                  f"{cost / round_s:10.3f} {100 * share:21.1f}%")
            if any(not np.array_equal(plain_state[k], ckpt_state[k]) for k in plain_state):
                print(f"MISMATCH: {method}'s final weights differ with checkpoints")
                mismatch = True
    finally:
        ray.shutdown()
    return 1 if mismatch else 0


if __name__ == "__main__":
    raise SystemExit(main())
