"""Every registered method against the contract of the engine, on Ray, as DomainBed tests every
algorithm: each training method, and each augmentation and aggregation rule composed onto
FedAvg, runs as a Tune trial on 1 and on 2 client actors. Checked: the two give bit-identical
weights and curves; each learns (its reported mode at least twice chance on a held-out domain
close to its sources); a checkpoint written after round 2, read back and continued ends where
the whole run ends; the ledger has a message each way for every client of every round; an
unknown option is refused; its ``paper`` names a citation."""

from __future__ import annotations

import dataclasses
import re
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import numpy as np
import pytest
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raydg import checkpoint
from raydg.config import RunConfig, Search
from raydg.engine.ledger import DOWN, UP
from raydg.errors import RaydgError
from raydg.experiment import ExperimentResult, run_experiment
from raydg.methods import METHODS
from raydg.resolve import resolve
from raydg.results import FederationResult, timing_free

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]

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


def _assert_same(a: FederationResult, b: FederationResult) -> None:
    """Bit-identical final weights, curves (timings aside) and selected accuracies."""
    assert a.global_state.keys() == b.global_state.keys(), a.method
    for k in a.global_state:
        np.testing.assert_array_equal(a.global_state[k], b.global_state[k],
                                      err_msg=f"{a.method}: {k}")
    assert timing_free(a.history) == timing_free(b.history), a.method
    assert a.selected == b.selected, a.method


@pytest.mark.parametrize("search", list(SEARCHES))
def test_one_and_two_actors_give_bit_identical_results(runs, search):
    one, two = runs[search, 1].runs, runs[search, 2].runs
    assert [r.method for r in one] == [r.method for r in two]
    for a, b in zip(one, two, strict=True):
        _assert_same(a, b)


@pytest.mark.parametrize("search", list(SEARCHES))
def test_every_method_learns(runs, search):
    done = runs[search, 2].runs
    _, grid = SEARCHES[search]
    assert len(done) == len(next(iter(grid.values())))
    low = {r.method: round(100 * r.last[r.mode], 2) for r in done
           if 100 * r.last[r.mode] < 2 * CHANCE}
    assert not low, f"at most twice chance after {BASE.rounds} rounds: {low}"


@pytest.fixture(scope="module")
def round_trips() -> dict[str, dict[str, Any]]:
    """Every method's round trip, one after the other on one driver actor in a placement group
    (a driver bundle and a client actor's), as a Tune trial runs its federations."""
    class Driver:
        """A trial's driver: its federations park their client actors for the next one."""

        def round_trip(self, cfg: RunConfig) -> dict[str, Any]:
            """``cfg``'s federation run whole, writing a checkpoint after round 2; then a new
            federation restored from it and run to the end."""
            from raydg.datasets import load_dataset
            from raydg.engine.simulation import Simulation

            data = load_dataset(cfg.dataset, None, cfg.image_size)
            config = dataclasses.asdict(cfg)
            with tempfile.TemporaryDirectory() as folder:
                sim = Simulation(cfg, data, cfg.target, cfg.seed, log=lambda _: None)

                def write(row: dict[str, float]) -> None:
                    if row["round"] == 2:
                        checkpoint.write(Path(folder), sim.snapshot(), config)

                whole = sim.run(write)
                again = Simulation(cfg, data, cfg.target, cfg.seed, log=lambda _: None,
                                   restore=checkpoint.read(Path(folder), config)).run()
            return {"whole": whole, "again": again, "ledger": sim.ledger.rows,
                    "sampled": sim.config.sample or len(sim.client_ids)}

    group = ray.util.placement_group([{"CPU": 1}, {"CPU": 1}])
    ray.get(group.ready())
    driver = ray.remote(num_cpus=1)(Driver).options(  # nested: pickled by value
        scheduling_strategy=PlacementGroupSchedulingStrategy(
            group, placement_group_bundle_index=0, placement_group_capture_child_tasks=True)
    ).remote()
    try:
        return {label: ray.get(driver.round_trip.remote(resolve(dataclasses.replace(
                    BASE, rounds=3, local_steps=4, actors=1, **composition))))
                for label, composition in COMPOSITIONS.items()}
    finally:
        ray.kill(driver)  # and the client actors it parked
        ray.util.remove_placement_group(group)


COMPOSITIONS = {**{n: {"method": n} for n in TRAINING},
                **{f"fedavg+{n}": {"method": "fedavg", "augment": n} for n in AUGMENT},
                **{f"fedavg+{n}": {"method": "fedavg", "aggregation": n} for n in AGGREGATION}}


@pytest.mark.parametrize("label", list(COMPOSITIONS))
def test_a_checkpoint_continues_to_the_whole_runs_end(round_trips, label):
    _assert_same(round_trips[label]["whole"], round_trips[label]["again"])


@pytest.mark.parametrize("label", list(COMPOSITIONS))
def test_the_ledger_has_a_message_each_way_for_every_sampled_client(round_trips, label):
    rows, sampled = round_trips[label]["ledger"], round_trips[label]["sampled"]
    clients: dict[tuple[int, str], set[int]] = defaultdict(set)
    for row in rows:
        assert row["direction"] in (UP, DOWN) and row["kind"] and row["bytes"] >= 0, row
        clients[row["round"], row["direction"]].add(row["client"])
    rounds = {r for r, _ in clients} - {0}  # round 0: a method's one-off set-up exchange
    assert rounds == {1, 2, 3}, sorted(clients)
    for r in rounds:
        assert len(clients[r, DOWN]) == len(clients[r, UP]) >= sampled, (r, clients)


@pytest.mark.parametrize("name", [n for n, _ in METHODS])
def test_unknown_options_are_refused_and_the_paper_is_cited(name):
    cls = METHODS.get(name)
    with pytest.raises(RaydgError, match="no_such_option"):
        cls.parse_options({"no_such_option": 1})
    assert re.search(r"(19|20)\d\d|DomainBed|bound", cls.paper), cls.paper
    assert cls.__doc__ and cls.__doc__.strip(), f"{name} has no docstring"

