"""DeepAll: centralized training on the pooled source domains, the upper reference that every
FedDG paper prints (e.g. FedFD-A Table 5, CCST Table 1) and DomainBed's ERM.

The partition's source-domain clients are pooled into one client (id 0) before any actor
starts: its training and validation splits are the concatenation of theirs, in client-id
order, so it sees exactly the federation's data and validates on exactly its validation
images (selection is still by source validation). It then trains as FedAvg with one client:
``rounds`` x ``local_steps`` SGD steps with the same model, optimiser and schedule. Each step
draws ``batch_multiplier`` x ``batch_size`` images, by default as many as the federation's
clients draw in one local step together (its clients per round), so both see the same number
of samples; ``batch_multiplier: 1`` keeps the clients' batch instead. The ``steps`` metric
counts ``batch_size`` minibatches, as for the federated methods.

Not federated: the pooling moves raw images, outside the ledger (which records only the
parameters exchanged with the one client).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
from torch import Tensor

from raydg.config import RunConfig, clients_per_round
from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, register
from raydg.partition import ClientData


@dataclass
class DeepAllOptions:
    batch_multiplier: int = 0  # minibatches per step; 0: the federation's clients per round


def pool(clients: list[ClientData]) -> ClientData:
    """One client holding every client's training and validation samples (client-id order)."""
    ordered = sorted(clients, key=lambda c: c.client_id)
    cat = {f: np.concatenate([getattr(c, f) for c in ordered])
           for f in ("train_x", "train_y", "val_x", "val_y")}
    domains = "+".join(dict.fromkeys(c.domain for c in ordered))
    return ClientData(client_id=0, domain=domains, **cat)


@register("centralized")
class DeepAll(Method):
    """ERM on the pooled source data, with the federation's model, steps and selection."""

    name = "deepall"
    Options = DeepAllOptions
    paper = "centralized bound (DomainBed's ERM); FedFD-A Table 5"

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.multiplier = max(1, self.options.batch_multiplier)

    @classmethod
    def check_options(cls, o: Any) -> None:
        super().check_options(o)
        if o.batch_multiplier < 0:
            raise RaydgError("deepall: batch_multiplier must be >= 0 (0: clients per round)")

    def arrange_clients(self, clients: list[ClientData], cfg: RunConfig) -> list[ClientData]:
        if self.options.batch_multiplier == 0:
            self.multiplier = clients_per_round(cfg, len(clients))
        return [pool(super().arrange_clients(clients, cfg))]

    def start_round(self, ctx: ClientContext) -> None:
        """Batches of ``batch_multiplier`` x ``batch_size`` from the pooled data."""
        ctx.config = dataclasses.replace(ctx.config,
                                         batch_size=self.multiplier * ctx.config.batch_size)
        super().start_round(ctx)

    def train_step(self, ctx: ClientContext, x: Tensor, y: Tensor) -> float | Tensor:
        ctx.steps += self.multiplier - 1  # in batch_size minibatches
        return super().train_step(ctx, x, y)
