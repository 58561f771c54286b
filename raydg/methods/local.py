"""The local-only bound: every client trains alone, from the common initial model, and never
sees another's weights; the lower reference for what federation buys.

The unseen-domain model is the **ensemble** of the clients' models: the mean of their softmax
outputs (a parameter average of independently trained networks is no meaningful model). It is
also what each round's source validation scores, on every client's validation split, so the
round is selected as for the federated methods. The model is an :class:`Ensemble` with one
member per client, all starting from the same initial weights; client k trains only member k
(the others get no gradient), and the aggregation takes member k from client k's upload and
nothing else, so member k's weights are exactly those of client k trained alone.

The uploads exist only so that the driver can evaluate the ensemble: the ledger counts the
whole ensemble both ways, although no client ever trains on another's weights. Every actor's
working model holds all members: a bound for cross-silo federations, not thousands of clients.
"""

from __future__ import annotations

import copy
from typing import Any

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydg import state as st
from raydg.config import RunConfig
from raydg.methods import ClientContext, Method, Server, Upload, register
from raydg.models import ModelSpec
from raydg.partition import ClientData


class Ensemble(nn.Module):
    """``count`` copies of one initial model; the forward pass runs member ``active``."""

    def __init__(self, member: nn.Module, count: int) -> None:
        super().__init__()
        self.members = nn.ModuleList(copy.deepcopy(member) for _ in range(count))
        self.active = 0

    def forward(self, x: Tensor) -> Tensor:
        return self.members[self.active](x)


@register("local-only")
class Local(Method):
    """Local training only; the ensemble of the clients' models is evaluated."""

    name = "local"
    paper = "local-only bound (each client alone), evaluated as an ensemble"
    eval_modes = ("ensemble",)

    def __init__(self, options: Any = None) -> None:
        super().__init__(options)
        self.members: list[int] = []  # client ids, in member order

    def arrange_clients(self, clients: list[ClientData], cfg: RunConfig) -> list[ClientData]:
        clients = super().arrange_clients(clients, cfg)
        self.members = [c.client_id for c in clients]
        return clients

    def build_model(self, spec: ModelSpec) -> nn.Module:
        return Ensemble(super().build_model(spec), len(self.members))

    def start_round(self, ctx: ClientContext) -> None:
        """Train the client's own member only: the forward pass runs it, so the other members
        get no gradient and SGD leaves them as they are."""
        ctx.model.active = self.members.index(ctx.client_id)
        super().start_round(ctx)

    def aggregate(self, server: Server, uploads: list[Upload]) -> st.State:
        """Member k from client k's upload; every other tensor as it was."""
        merged = dict(server.global_state)
        for u in uploads:
            prefix = f"members.{self.members.index(u.client_id)}."
            merged.update({k: v for k, v in u.state.items() if k.startswith(prefix)})
        return merged

    @torch.no_grad()
    def predict(self, model: nn.Module, x: Tensor, mode: str) -> Tensor:
        """The log of the members' mean softmax (logits of the ensemble's prediction)."""
        return torch.stack([F.softmax(m(x), dim=1) for m in model.members]).mean(0).log()
