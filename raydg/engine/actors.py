"""Placement of clients on Ray actors, and the pool the driver talks to.

One actor per client while the cluster's CPUs (and GPUs) allow; otherwise several clients per
actor, first assigned by size (longest-processing-time first). Each client's shard is put into
the object store once; its home actor holds a zero-copy view of it and the client's persistent
state. A round's trainings are dispatched dynamically (:meth:`ClientPool.train`): an actor that
runs out of its own clients takes a waiting client from the busiest actor, and the client moves
with its persistent state while its new actor maps the same shard, so nothing is re-loaded.
Results never depend on placement: every client's randomness is its own and aggregation runs
in client-id order.

Inside a Tune trial (:mod:`raydg.trials`) the n client actors take the last n bundles of the
trial's placement group, one each, so a federation holds exactly what its trial reserved and never
starves another; outside a trial (tests, benchmarks) actors are placed freely. A federation that
finishes inside a trial parks its actors in their bundles: Tune runs the next federation of the
same resources on the same trial actor and placement group (``reuse_actors``), and that
federation resets the warm actors (torch imported, threads started) instead of starting new ones;
outside a trial they are parked only while :func:`raydg.engine.parking.keep_warm` lasts.
"""

from __future__ import annotations

import math
import statistics
from collections import Counter, deque
from typing import Any

import ray
from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

from raydg.config import RunConfig
from raydg.engine import parking
from raydg.engine.client import ClientHost, RuntimeSpec
from raydg.methods import Upload
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


def in_bundle(i: int, n: int) -> dict[str, Any]:
    """Ray options that put client actor ``i`` of ``n`` into its bundle of the current trial's
    placement group, whose last ``n`` bundles are the client actors'; none outside a trial."""
    group = ray.util.get_current_placement_group()
    if group is None:
        return {}
    return {"scheduling_strategy": PlacementGroupSchedulingStrategy(
        group, placement_group_bundle_index=len(group.bundle_specs) - n + i)}


def describe_placement(rows: list[dict[str, Any]], cfg: RunConfig) -> str:
    """One line for the rows of :meth:`ClientPool.placement`: actors per node, clients per actor
    (min / median / max)."""
    actors = [r for r in rows if r["role"] == "client"]
    per_node = Counter(r["node"][:8] for r in actors)
    nodes = ", ".join(f"{n}: {c}" for n, c in sorted(per_node.items()))
    sizes = [r["clients"] for r in actors]
    driver = next((r["node"][:8] for r in rows if r["role"] == "driver"), "?")
    plural = "s" * (len(actors) > 1)
    return (f"placement: {sum(sizes)} clients on {len(actors)} actor{plural} "
            f"({cfg.cpus_per_actor:g} CPU, {cfg.gpus_per_actor:g} GPU each; "
            f"{actors[0]['device']}), actors per node {{{nodes}}}, clients per actor "
            f"{min(sizes)}/{statistics.median(sizes):g}/{max(sizes)} (min/median/max); "
            f"driver on node {driver}")


# trainings submitted per actor: one runs while the next waits in the actor (no dispatch gap);
# the rest stay with the driver, free to be stolen
IN_FLIGHT = 2
STATE = "state"  # concurrency group of adopt/release: they run while the actor trains

class ClientPool:
    """The client actors of one simulation, addressed by client id."""

    def __init__(self, rt: RuntimeSpec, clients: list[ClientData]) -> None:
        cfg = rt.config
        n_actors = cfg.actors or min(len(clients), actor_capacity(cfg))
        self.sizes = {c.client_id: c.num_train for c in clients}
        groups = balanced_groups(self.sizes, min(n_actors, len(clients)))
        self.home: dict[int, int] = {}
        self.moved = 0  # clients that changed actor in the last round
        self._validating: list[Any] = []  # the last validation, which reads the actors' clients
        self.cfg = cfg
        self.actors = parking.unpark(self._kind(len(groups)))
        try:
            ray.get([a.reset.remote(rt) for a in self.actors])
        except ray.exceptions.RayActorError:  # a parked actor was lost: start afresh
            self.shutdown()
            self.actors = []
        self.reused = bool(self.actors)
        if not self.actors:
            host = ray.remote(concurrency_groups={STATE: 1})(ClientHost)
            self.actors = [host.options(num_cpus=cfg.cpus_per_actor,
                                        num_gpus=cfg.gpus_per_actor, **in_bundle(i, len(groups))
                                        ).remote(rt, [])
                           for i in range(len(groups))]
        try:
            self.shards = {c.client_id: ray.put(c) for c in clients}
            ray.get([self._adopt(cid, a, None) for a, g in enumerate(groups) for cid in g])
        except BaseException:  # an actor that cannot start, Ctrl-C: leave nothing behind
            self.shutdown()
            raise

    def _adopt(self, cid: int, actor: int, state: Any) -> Any:
        self.home[cid] = actor
        return self.actors[actor].adopt.options(concurrency_group=STATE).remote(
            self.shards[cid], state)

    def _move(self, cid: int, actor: int) -> None:
        """Re-home a waiting client; its persistent state travels, its shard is mapped again."""
        ray.get(self._validating)  # adopt/release must not race the last validation
        self._validating = []
        old = self.actors[self.home[cid]]
        ray.get(self._adopt(cid, actor, old.release.options(concurrency_group=STATE).remote(cid)))
        self.moved += 1

    def placement(self) -> list[dict[str, Any]]:
        """One row per actor: where it runs (node, host, pid, device) and whom it hosts."""
        rows = []
        for i, where in enumerate(ray.get([a.where.remote() for a in self.actors])):
            g = sorted(c for c, a in self.home.items() if a == i)
            rows.append({"role": "client", "actor": i, **where, "reused": self.reused,
                         "clients": len(g),
                         "client_ids": ",".join(map(str, g)),
                         "train_samples": sum(self.sizes[c] for c in g)})
        return rows

    def train(self, cids: list[int], global_ref: Any, rnd: int) -> list[Upload]:
        """Train the given clients; results are gathered as they finish, returned in id order.

        Each actor has up to ``IN_FLIGHT`` clients submitted at a time, its own first, most
        samples per step first. An actor with room and none of its own left takes the cheapest
        waiting client of the actor with the longest queue (work stealing), so actors finish
        together whatever the clients' costs or the actors' speeds.
        """
        def cost(c: int) -> tuple[int, int]:
            return -min(self.cfg.batch_size, self.sizes[c]), c

        queues = [deque(sorted((c for c in cids if self.home[c] == a), key=cost))
                  for a in range(len(self.actors))]
        running: dict[Any, int] = {}  # future -> actor index
        self.moved = 0

        def submit(a: int) -> None:
            if queues[a]:
                cid = queues[a].popleft()
            else:
                donor = max(range(len(queues)), key=lambda b: (len(queues[b]), -b))
                if not queues[donor]:
                    return
                cid = queues[donor].pop()
                self._move(cid, a)
            running[self.actors[a].train.remote(cid, global_ref, rnd)] = a

        for _ in range(IN_FLIGHT):
            for a in range(len(self.actors)):
                submit(a)
        done: list[Upload] = []
        while running:
            ready, _ = ray.wait(list(running), num_returns=1)
            actor = running.pop(ready[0])
            done.append(ray.get(ready[0]))
            submit(actor)
        return sorted(done, key=lambda u: u.client_id)

    def validate(self, global_ref: Any, with_local: bool, clients: list[int]) -> list[Any]:
        """Futures of the per-client validation accuracies of ``clients``, one per actor that
        hosts any of them."""
        hosts: dict[int, list[int]] = {}
        for c in clients:
            hosts.setdefault(self.home[c], []).append(c)
        self._validating = [self.actors[a].validate.remote(global_ref, with_local, cids)
                            for a, cids in sorted(hosts.items())]
        return self._validating

    def phase(self, name: str, cids: list[int], payload_ref: Any, global_ref: Any,
              rnd: int) -> dict[int, tuple[Any, int]]:
        """``{client: (result, local steps)}`` of a client phase."""
        futures = {c: self.actors[self.home[c]].phase.remote(name, c, payload_ref, global_ref, rnd)
                   for c in cids}
        return dict(zip(futures, ray.get(list(futures.values())), strict=True))

    def snapshot(self) -> dict[int, Any]:
        """Every client's persistent state (``ClientState``), by client id; each actor answers
        after the tasks it already has (the last round's validation)."""
        return {cid: s for part in ray.get([a.snapshot.remote() for a in self.actors])
                for cid, s in part.items()}

    def restore(self, states: dict[int, Any]) -> None:
        """Continue every client from its checkpointed state, on its home actor."""
        ray.get([self.actors[self.home[cid]].set_state.remote(cid, state)
                 for cid, state in states.items()])

    def _kind(self, n: int) -> parking.Kind:
        return n, self.cfg.cpus_per_actor, self.cfg.gpus_per_actor

    def shutdown(self, park: bool = False) -> None:
        """End the actors; ``park``: leave them for the next federation where
        :func:`raydg.engine.parking.place` says (after the tasks they already have)."""
        if park and parking.place():
            ray.get([a.clear.remote() for a in self.actors])
            parking.park(self._kind(len(self.actors)), self.actors)
            return
        for a in self.actors:
            ray.kill(a)
