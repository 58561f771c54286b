"""Every method's checkpoints and ledger against the contract of the engine
(:mod:`tests.conformance`): a checkpoint written after round 2, read back and continued ends
where the whole run ends; the ledger has a message each way for every client of every round."""

from __future__ import annotations

import dataclasses
import tempfile
from collections import defaultdict
from pathlib import Path
from typing import Any

import pytest
import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raydg import checkpoint
from raydg.config import RunConfig
from raydg.engine.ledger import DOWN, UP
from raydg.resolve import resolve
from tests.conformance import BASE, COMPOSITIONS, assert_same

pytestmark = [pytest.mark.usefixtures("ray_session"), pytest.mark.slow]


@pytest.fixture(scope="module")
def round_trips() -> dict[str, dict[str, Any]]:
    """Every method's round trip, one after the other on one driver actor in a placement group
    (a driver bundle and a client actor's), as a Tune trial runs its federations."""
    class Driver:
        """A trial's driver: its federations park their client actors for the next one."""

        def round_trip(self, cfg: RunConfig) -> dict[str, Any]:
            """``cfg``'s federation run whole, writing a checkpoint after round 2; then a new
            federation restored from it and run to the end."""
            from raydg.api import simulation
            from raydg.datasets import load_dataset

            data = load_dataset(cfg.dataset, None, cfg.image_size)
            config = dataclasses.asdict(cfg)
            with tempfile.TemporaryDirectory() as folder:
                sim = simulation(cfg, data, log=lambda _: None)

                def write(row: dict[str, float]) -> None:
                    if row["round"] == 2:
                        checkpoint.write(Path(folder), sim.snapshot(), config)

                whole = sim.run(write)
                again = simulation(cfg, data, log=lambda _: None,
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


@pytest.mark.parametrize("label", list(COMPOSITIONS))
def test_a_checkpoint_continues_to_the_whole_runs_end(round_trips, label):
    assert_same(round_trips[label]["whole"], round_trips[label]["again"])


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
