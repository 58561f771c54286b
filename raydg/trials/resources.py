"""What a federation's trial reserves: its placement group's bundles and its number of client
actors, sized to the cluster."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import ray
from ray import tune

from raydg.config import RunConfig
from raydg.errors import RaydgError
from raydg.plan import Federation, Plan
from raydg.trials.trial import FEDERATION


def trial_resources(config: dict[str, Any]) -> tune.PlacementGroupFactory:
    """Bundles of a federation's placement group: the driver's (a GPU share for its target
    evaluation, else empty), then one per client actor; strategy PACK or SPREAD."""
    cfg = RunConfig(**config[FEDERATION]["config"])
    actor = {"CPU": cfg.cpus_per_actor, "GPU": cfg.gpus_per_actor}
    return tune.PlacementGroupFactory([{"GPU": cfg.gpus_per_actor}, *[actor] * cfg.actors],
                                      strategy=cfg.placement.upper())


def _node_sizes() -> list[tuple[float, float]]:
    return [(n["Resources"].get("CPU", 0.0), n["Resources"].get("GPU", 0.0))
            for n in ray.nodes() if n["Alive"]]


def fit_actors(plan: Plan, sources: int, started_here: bool, out: Callable[[str], None]
               ) -> list[Federation]:
    """The federations with their number of client actors set (a federation without
    ``clients`` has one per source domain, ``sources``).

    ``--actors`` if given, else an equal share of the cluster's CPUs (and GPUs, less the
    driver's share for target evaluation) among the federations that run at once, at least
    one, at most one per client. Where no node can host one client actor, or the cluster
    cannot hold one whole federation, a Ray that raydg started is refused; an existing cluster
    may yet scale up, so it only says what is missing."""
    cfg = plan.config
    total = ray.cluster_resources()
    cpus, gpus = total.get("CPU", 0.0), total.get("GPU", 0.0)
    at_once = min(len(plan.federations), cfg.max_concurrent or len(plan.federations))
    share = math.floor(cpus / at_once / cfg.cpus_per_actor + 1e-9)
    if cfg.gpus_per_actor:
        share = min(share, math.floor(gpus / at_once / cfg.gpus_per_actor + 1e-9) - 1)
    feds = []
    for fed in plan.federations:
        n = min(fed.config.clients or sources, fed.config.actors or max(1, share))
        feds.append(dataclasses.replace(fed, config=dataclasses.replace(fed.config, actors=n)))
    largest = max(feds, key=lambda f: f.config.actors).config
    sizes = _node_sizes()
    problem = None
    if not any(c >= cfg.cpus_per_actor and g >= cfg.gpus_per_actor for c, g in sizes):
        problem = (f"no node can host a client actor of {cfg.cpus_per_actor:g} CPU and "
                   f"{cfg.gpus_per_actor:g} GPU")
    elif (largest.actors * cfg.cpus_per_actor > cpus + 1e-9
          or (largest.actors + 1) * cfg.gpus_per_actor > gpus + 1e-9):
        problem = (f"a federation of {largest.actors} actors needs "
                   f"{largest.actors * cfg.cpus_per_actor:g} CPU and "
                   f"{(largest.actors + 1) * cfg.gpus_per_actor:g} GPU")
    if problem:
        have = "; ".join(f"{c:g} CPU, {g:g} GPU" for c, g in sizes)
        message = f"{problem}; the cluster's nodes have {have}"
        if started_here:
            raise RaydgError(f"{message} (see --cpus-per-actor, --gpus-per-actor, --actors)")
        out(f"raydg: waiting for the cluster to scale up: {message}")
    return feds
