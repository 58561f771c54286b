"""Defaults that train: every method, run as a new user runs it (no flags), on embedded data.

For each dataset, every registered method (each once, under its name: one that composes,
such as ``ga``, runs on FedAvg), with the dataset's defaults and one seed: one raydg
experiment whose federations are Tune trials. A row *collapses* when its Avg at the selected
round (training-domain validation) is within ``--margin`` points of chance. The table prints
each row as raydg names it (bracketed: the options that are not its paper's, e.g. the
CAFL mean of FedFD on a small CNN), its Avg and its difference to FedAvg; a method that the
dataset's model cannot run (one acting on BN layers, on ``rotmnist``'s BN-free ``mnist-cnn``)
is listed with the error raydg gives instead.

Run:  python benchmarks/defaults.py [--datasets digits-style digits-rot] [--seed 0]
      [--rounds R] [--margin 5] [--tracking-uri URI]
Exit status 1 when a row collapses.
"""

from __future__ import annotations

import argparse
import dataclasses
import sys
import time
from typing import Any

import numpy as np

from raydg.config import RunConfig, Search
from raydg.datasets import load_dataset
from raydg.errors import RaydgError
from raydg.experiment import run_experiment
from raydg.methods import METHODS
from raydg.resolve import resolve
from raydg.results import long_rows


def grid(cfg: RunConfig) -> tuple[list[dict[str, Any]], dict[str, str]]:
    """The grid values (one per method) that resolve on ``cfg``, and the error of each that
    does not."""
    ok, refused = [], {}
    for value in ({"method": name} for name, _ in METHODS):
        try:
            resolve(dataclasses.replace(cfg, **value))
            ok.append(value)
        except RaydgError as err:
            refused[value["method"]] = str(err)
    return ok, refused


def table(rows: list[dict[str, Any]], chance: float, margin: float) -> tuple[list[str], int]:
    """Markdown: per row, Avg at the selected round (its first inference mode) and the
    difference to FedAvg; the number of rows that collapse."""
    mode = {}
    for r in rows:
        mode.setdefault(r["method"], r["mode"])
    avg = {m: float(np.mean([r["accuracy"] for r in rows if r["method"] == m
                             and r["mode"] == mode[m] and r["selection"] == "selected"]))
           for m in mode}
    lines = ["| method | Avg (selected) | vs fedavg | trains |", "|---|---|---|---|"]
    collapsed = 0
    for m, a in avg.items():
        ok = a > chance + margin
        collapsed += not ok
        lines.append(f"| {m} | {a:.2f} | {a - avg['fedavg']:+.2f} | "
                     f"{'yes' if ok else 'COLLAPSED'} |")
    return lines, collapsed


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--datasets", nargs="+", default=["digits-style", "digits-rot"])
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--rounds", type=int, default=None, help="default: the dataset's")
    p.add_argument("--margin", type=float, default=5.0, help="points above chance")
    p.add_argument("--tracking-uri", default=None)
    args = p.parse_args(argv)
    collapsed = 0
    for dataset in args.datasets:
        cfg = RunConfig(dataset=dataset, seeds=[args.seed], rounds=args.rounds,
                        tracking_uri=args.tracking_uri, experiment=f"defaults-{dataset}")
        values, refused = grid(cfg)
        start = time.perf_counter()
        result = run_experiment(cfg, Search(grid={"method": values}), out=lambda _: None,
                                progress="none")
        chance = 100 / len(load_dataset(dataset, None, None, log=lambda _: None).classes)
        lines, bad = table(long_rows(result.runs), chance, args.margin)
        print(f"\n## {dataset}: {len(result.runs)} federations in "
              f"{time.perf_counter() - start:.0f} s, seed {args.seed}, chance {chance:.1f} %\n")
        print("\n".join(lines + [f"| {m} | refused: {e} | | |" for m, e in refused.items()]))
        collapsed += bad
    return int(collapsed > 0)


if __name__ == "__main__":
    sys.exit(main())
