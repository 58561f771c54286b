"""Every registered method against the contract of the engine, on Ray, as DomainBed tests every
algorithm: each training method, and each augmentation and aggregation rule composed onto
FedAvg, runs as a Tune trial on 1 and on 2 client actors. Checked: the two give bit-identical
weights and curves; each learns (its reported mode at least twice chance on a held-out domain
close to its sources); an unknown option is refused; its ``paper`` names a citation."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from raydg.config import RunConfig, Search
from raydg.errors import RaydgError
from raydg.experiment import ExperimentResult, run_experiment
from raydg.methods import METHODS
from raydg.results import timing_free

pytestmark = pytest.mark.usefixtures("ray_session")

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
CHANCE = 10.0  # percent, ten digits


@pytest.fixture(scope="module")
def runs() -> dict[tuple[str, int], ExperimentResult]:
    """Each search on 1 and on 2 actors, in the module's Ray session."""
    return {(name, actors): run_experiment(
                dataclasses.replace(cfg, actors=actors, experiment="conformance"),
                Search(grid=grid), out=lambda _: None, progress="none")
            for name, (cfg, grid) in SEARCHES.items() for actors in (1, 2)}


@pytest.mark.parametrize("search", list(SEARCHES))
def test_one_and_two_actors_give_bit_identical_results(runs, search):
    one, two = runs[search, 1].runs, runs[search, 2].runs
    assert [r.method for r in one] == [r.method for r in two]
    for a, b in zip(one, two, strict=True):
        assert a.global_state.keys() == b.global_state.keys(), a.method
        for k in a.global_state:
            np.testing.assert_array_equal(a.global_state[k], b.global_state[k],
                                          err_msg=f"{a.method}: {k}")
        assert timing_free(a.history) == timing_free(b.history), a.method
        assert a.selected == b.selected, a.method


@pytest.mark.parametrize("search", list(SEARCHES))
def test_every_method_learns(runs, search):
    done = runs[search, 2].runs
    assert len(done) == len(SEARCHES[search][1][next(iter(SEARCHES[search][1]))])
    low = {r.method: round(100 * r.last[r.mode], 2) for r in done
           if 100 * r.last[r.mode] < 2 * CHANCE}
    assert not low, f"at most twice chance after {BASE.rounds} rounds: {low}"


@pytest.mark.parametrize("name", [n for n, _ in METHODS])
def test_unknown_options_are_refused_and_the_paper_is_cited(name):
    cls = METHODS.get(name)
    with pytest.raises(RaydgError, match="no_such_option"):
        cls.parse_options({"no_such_option": 1})
    assert re.search(r"(19|20)\d\d|DomainBed|bound", cls.paper), cls.paper
    assert cls.__doc__ and cls.__doc__.strip(), f"{name} has no docstring"
