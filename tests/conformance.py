"""What the conformance tests share (tests/test_conformance*.py): every registered method
against the contract of the engine, on Ray, as DomainBed tests every algorithm. Each training
method, and each augmentation and aggregation rule composed onto FedAvg, runs as a Tune trial on
1 and on 2 client actors (its searches split over files, so that parallel workers share them)."""

from __future__ import annotations

import dataclasses

import numpy as np

from raydg.config import RunConfig, Search
from raydg.experiment import ExperimentResult, run_experiment
from raydg.methods import METHODS
from raydg.results import FederationResult, timing_free

TRAINING = [n for n, c in METHODS if not (c.augmentation or c.aggregation)]
AUGMENT = [n for n, c in METHODS if c.augmentation]
AGGREGATION = [n for n, c in METHODS if c.aggregation]
# digits-rot's M15 is 15 degrees from its nearest sources: 4 rounds of 10 steps learn it
BASE = RunConfig(dataset="digits-rot", target="M15", rounds=4, local_steps=10, clients=5,
                 seeds=[0], val_every=2)
SEARCHES = {"methods": (BASE, {"method": TRAINING}),
            "augment": (dataclasses.replace(BASE, method="fedavg"), {"augment": AUGMENT}),
            "aggregation": (dataclasses.replace(BASE, method="fedavg"),
                            {"aggregation": AGGREGATION})}
COMPOSITIONS = {**{n: {"method": n} for n in TRAINING},
                **{f"fedavg+{n}": {"method": "fedavg", "augment": n} for n in AUGMENT},
                **{f"fedavg+{n}": {"method": "fedavg", "aggregation": n} for n in AGGREGATION}}
CHANCE = 10.0  # percent, ten digits


def run_searches(names: list[str]) -> dict[tuple[str, int], ExperimentResult]:
    """Each named search on 1 and on 2 actors, in the calling module's Ray session."""
    return {(name, actors): run_experiment(
                dataclasses.replace(SEARCHES[name][0], actors=actors, experiment="conformance"),
                Search(grid=SEARCHES[name][1]), out=lambda _: None, progress="none")
            for name in names for actors in (1, 2)}


def assert_same(a: FederationResult, b: FederationResult) -> None:
    """Bit-identical final weights, curves (timings aside) and selected accuracies."""
    assert a.global_state.keys() == b.global_state.keys(), a.method
    for k in a.global_state:
        np.testing.assert_array_equal(a.global_state[k], b.global_state[k],
                                      err_msg=f"{a.method}: {k}")
    assert timing_free(a.history) == timing_free(b.history), a.method
    assert a.selected == b.selected, a.method


def check_identical(runs: dict[tuple[str, int], ExperimentResult], search: str) -> None:
    """The search's federations on 1 and on 2 actors give bit-identical results."""
    one, two = runs[search, 1].runs, runs[search, 2].runs
    assert [r.method for r in one] == [r.method for r in two]
    for a, b in zip(one, two, strict=True):
        assert_same(a, b)


def check_learns(runs: dict[tuple[str, int], ExperimentResult], search: str) -> None:
    """Each method of the search ends at least twice chance on the held-out domain."""
    done = runs[search, 2].runs
    _, grid = SEARCHES[search]
    assert len(done) == len(next(iter(grid.values())))
    low = {r.method: round(100 * r.last[r.mode], 2) for r in done
           if 100 * r.last[r.mode] < 2 * CHANCE}
    assert not low, f"at most twice chance after {BASE.rounds} rounds: {low}"
