"""Leave-one-domain-out client construction: domains -> clients -> train/val shards.

By default each source domain is one client. With ``clients=N`` the source domains are split
evenly into N single-domain clients, label-iid or by a per-domain Dirichlet(alpha) label split
(FedIG-A appendix A.6: 30 clients, alpha 0.5 and 0.1). With ``client_size=S`` each client
instead draws S samples of its domain (:func:`draw_shards`): a cross-device population, which
may be larger than the data. The target domain is never given to any client.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np

from raydg import seeding
from raydg.checkpoint import register_dataclass
from raydg.datasets import MultiDomainDataset
from raydg.errors import RaydgError

if TYPE_CHECKING:
    from raydg.config import RunConfig

MIN_CLIENT_SAMPLES = 10
DIRICHLET_TRIES = 1000


@register_dataclass
@dataclass
class ClientData:
    """One client's shard: uint8 images and labels, split into train and validation."""

    client_id: int
    domain: str
    train_x: np.ndarray
    train_y: np.ndarray
    val_x: np.ndarray
    val_y: np.ndarray

    @property
    def num_train(self) -> int:
        return len(self.train_y)


def clients_per_domain(num_clients: int, num_domains: int) -> list[int]:
    """Spread ``num_clients`` over domains as evenly as possible (earlier domains get extras)."""
    if num_clients < num_domains:
        raise RaydgError(
            f"--clients {num_clients} is fewer than the {num_domains} source domains"
        )
    base, extra = divmod(num_clients, num_domains)
    return [base + (i < extra) for i in range(num_domains)]


def split_iid(y: np.ndarray, parts: int, rng: np.random.Generator) -> list[np.ndarray]:
    """Class-stratified split of indices into ``parts`` shards of (near) equal size."""
    shards: list[list[int]] = [[] for _ in range(parts)]
    offset = 0
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        for j, chunk in enumerate(np.array_split(idx, parts)):
            shards[(j + offset) % parts].extend(chunk)
        offset += len(idx) % parts
    return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]


def split_dirichlet(y: np.ndarray, parts: int, alpha: float, rng: np.random.Generator,
                    min_samples: int = MIN_CLIENT_SAMPLES) -> list[np.ndarray]:
    """Per class, shares ~ Dir(alpha * 1); redrawn until every shard has ``min_samples``."""
    if parts == 1:
        return [np.arange(len(y), dtype=np.int64)]
    if len(y) < parts * min_samples:
        raise RaydgError(
            f"a domain with {len(y)} samples cannot give {parts} clients "
            f"{min_samples} samples each; use fewer --clients"
        )
    for _ in range(DIRICHLET_TRIES):
        shards: list[list[int]] = [[] for _ in range(parts)]
        for c in np.unique(y):
            idx = rng.permutation(np.flatnonzero(y == c))
            cuts = (np.cumsum(rng.dirichlet(np.full(parts, alpha)))[:-1] * len(idx)).astype(int)
            for j, chunk in enumerate(np.split(idx, cuts)):
                shards[j].extend(chunk)
        if min(len(s) for s in shards) >= min_samples:
            return [np.sort(np.asarray(s, dtype=np.int64)) for s in shards]
    raise RaydgError(
        f"no Dirichlet(alpha={alpha}) split gave every client {min_samples} samples in "
        f"{DIRICHLET_TRIES} draws; raise --dirichlet or use fewer --clients"
    )


def draw_shards(y: np.ndarray, parts: int, size: int, alpha: float | None,
                rng: np.random.Generator) -> list[np.ndarray]:
    """``parts`` clients that each draw ``size`` distinct samples of one domain (labels ``y``),
    a client's label shares q ~ Dir(alpha * 1) (Hsu et al., 2019), or every sample equally
    likely without ``alpha``. Clients may hold the same samples: the population can be larger
    than the data, as cross-device simulations need."""
    if size > len(y):
        raise RaydgError(f"--client-size {size} is more than a source domain's {len(y)} samples")
    _, label, counts = np.unique(y, return_inverse=True, return_counts=True)
    shards = []
    for _ in range(parts):
        p = None
        if alpha is not None:
            weight = rng.dirichlet(np.full(len(counts), alpha))[label] / counts[label]
            p = weight / weight.sum()
        shards.append(np.sort(rng.choice(len(y), size=size, replace=False, p=p)))
    return shards


def train_val_split(n: int, val_fraction: float, rng: np.random.Generator):
    """Seeded split of ``range(n)``; at least one sample on each side when n >= 2."""
    perm = rng.permutation(n)
    n_val = min(max(1, round(val_fraction * n)), n - 1) if val_fraction > 0 else 0
    return np.sort(perm[n_val:]), np.sort(perm[:n_val])


@dataclass(frozen=True)
class Partition:
    """How one federation's clients are drawn: the source domains of held-out ``target``
    split among ``clients`` (None: one per domain), label-iid or by a Dirichlet(``dirichlet``)
    label split, or ``client_size`` samples drawn per client; each client keeps
    ``val_fraction`` of its shard for validation; ``seed`` draws it all. The planning step
    gives each federation one (:attr:`raydg.plan.Federation.partition`)."""

    target: str
    clients: int | None = None
    dirichlet: float | None = None
    val_fraction: float = 0.1
    seed: int = 0
    client_size: int | None = None

    @classmethod
    def of(cls, cfg: RunConfig, **changes: Any) -> Partition:
        """The partition of a config with one target and one seed, with ``changes``."""
        return dataclasses.replace(cls(cfg.target, cfg.clients, cfg.dirichlet, cfg.val_fraction,
                                       cfg.seed, cfg.client_size), **changes)


@dataclass(frozen=True)
class ClientPlan:
    """Which samples of which source domain a client holds (indices into that domain)."""

    client_id: int
    domain: str
    train: np.ndarray
    val: np.ndarray


def plan_clients(data: MultiDomainDataset, part: Partition) -> list[ClientPlan]:
    """Assign the source domains' samples to clients for one held-out domain (split among
    them, or drawn ``client_size`` per client).

    Cheap (indices only), so an experiment can check every partition before it starts.
    """
    data.domain(part.target)
    sources = [d for d in data.domains if d.name != part.target]
    counts = clients_per_domain(part.clients or len(sources), len(sources))
    plans: list[ClientPlan] = []
    for d_index, (domain, m) in enumerate(zip(sources, counts, strict=True)):
        rng = seeding.numpy_rng(part.seed, seeding.PARTITION, d_index)
        if part.client_size:
            shards = draw_shards(domain.y, m, part.client_size, part.dirichlet, rng)
        elif part.dirichlet is None:
            shards = split_iid(domain.y, m, rng)
        else:
            shards = split_dirichlet(domain.y, m, part.dirichlet, rng)
        for shard in shards:
            cid = len(plans)
            tr, va = train_val_split(len(shard), part.val_fraction,
                                     seeding.numpy_rng(part.seed, seeding.SPLIT, cid))
            plans.append(ClientPlan(cid, domain.name, shard[tr], shard[va]))
    return plans


def make_clients(data: MultiDomainDataset, part: Partition) -> list[ClientData]:
    """Build the source clients' shards of ``part`` (:func:`plan_clients`)."""
    out = []
    for p in plan_clients(data, part):
        d = data.domain(p.domain)
        out.append(ClientData(p.client_id, p.domain, d.x[p.train], d.y[p.train], d.x[p.val],
                              d.y[p.val]))
    return out
