"""Placement of clients on Ray actors, and the pool the driver talks to.

One actor per client while the cluster's CPUs (and GPUs) allow; otherwise several clients per
actor, assigned by size (longest-processing-time first) so actors carry similar work.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from typing import Any

import ray

from raydg.client import ClientHost, Evaluator
from raydg.config import RunConfig
from raydg.methods import Upload
from raydg.models import ModelSpec
from raydg.partition import ClientData


def balanced_groups(sizes: dict[int, int], num_groups: int) -> list[list[int]]:
    """LPT assignment: largest client first, each to the currently lightest group (lowest index
    on ties); every group's client ids sorted."""
    groups: list[list[int]] = [[] for _ in range(num_groups)]
    loads = [0] * num_groups
    for cid in sorted(sizes, key=lambda c: (-sizes[c], c)):
        g = min(range(num_groups), key=lambda i: (loads[i], i))
        groups[g].append(cid)
        loads[g] += sizes[cid]
    return [sorted(g) for g in groups if g]


def actor_capacity(cfg: RunConfig) -> int:
    """How many client actors the cluster's resources hold at once."""
    res = ray.cluster_resources()
    cap = math.floor(res.get("CPU", 1) / cfg.cpus_per_actor + 1e-9)
    if cfg.gpus_per_actor > 0:
        cap = min(cap, math.floor(res.get("GPU", 0) / cfg.gpus_per_actor + 1e-9))
    return max(1, cap)


def start_evaluator(cfg: RunConfig, spec: ModelSpec, mean: tuple[float, ...],
                    std: tuple[float, ...], x: Any, y: Any) -> Any:
    """The target-domain evaluator actor (no CPU reserved: it runs between training phases)."""
    actor = ray.remote(Evaluator).options(num_cpus=0, num_gpus=cfg.gpus_per_actor)
    return actor.remote(cfg, spec, mean, std, x, y)


class ClientPool:
    """The client actors of one simulation, addressed by client id."""

    def __init__(self, cfg: RunConfig, spec: ModelSpec, mean: tuple[float, ...],
                 std: tuple[float, ...], clients: list[ClientData]) -> None:
        n_actors = cfg.actors or min(len(clients), actor_capacity(cfg))
        self.groups = balanced_groups({c.client_id: c.num_train for c in clients},
                                      min(n_actors, len(clients)))
        by_id = {c.client_id: c for c in clients}
        host = ray.remote(ClientHost).options(num_cpus=cfg.cpus_per_actor,
                                              num_gpus=cfg.gpus_per_actor)
        self.actors = [host.remote(cfg, spec, mean, std, [by_id[c] for c in g])
                       for g in self.groups]
        self.owner = {cid: a for a, g in zip(self.actors, self.groups, strict=True) for cid in g}
        self.sizes = {c.client_id: c.num_train for c in clients}
        self.cfg = cfg

    def describe(self) -> str:
        hosts = ray.get([a.where.remote() for a in self.actors])
        res = f"{self.cfg.cpus_per_actor:g} CPU, {self.cfg.gpus_per_actor:g} GPU each"
        lines = [f"placement: {len(self.sizes)} clients on {len(self.actors)} actors ({res})"]
        for i, (g, h) in enumerate(zip(self.groups, hosts, strict=True)):
            n = sum(self.sizes[c] for c in g)
            lines.append(f"  actor {i} on {h}: clients {g} ({n} training samples)")
        return "\n".join(lines)

    def train(self, cids: list[int], global_ref: Any, rnd: int,
              on_done: Callable[[Upload], None] | None = None) -> list[Upload]:
        """Train the given clients; results gathered as they finish, returned in id order."""
        pending = [self.owner[c].train.remote(c, global_ref, rnd) for c in cids]
        done: list[Upload] = []
        while pending:
            ready, pending = ray.wait(pending, num_returns=1)
            upload = ray.get(ready[0])
            done.append(upload)
            if on_done is not None:
                on_done(upload)
        return sorted(done, key=lambda u: u.client_id)

    def validate(self, global_ref: Any, with_local: bool) -> list[Any]:
        """Futures of every actor's per-client validation accuracies."""
        return [a.validate.remote(global_ref, with_local) for a in self.actors]

    def phase(self, name: str, cids: list[int], payload_ref: Any, global_ref: Any,
              rnd: int) -> dict[int, Any]:
        futures = {c: self.owner[c].phase.remote(name, c, payload_ref, global_ref, rnd)
                   for c in cids}
        return dict(zip(futures, ray.get(list(futures.values())), strict=True))

    def shutdown(self) -> None:
        for a in self.actors:
            ray.kill(a)
