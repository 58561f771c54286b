"""FedProx (Li et al., MLSys 2020): FedAvg plus a proximal term towards the global model."""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor

from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, register


@dataclass
class FedProxOptions:
    mu: float = 0.01  # CCST's code; FedDG-GA's code and FedFD-A Table 3a use 0.1


@register()
class FedProx(Method):
    """Local loss CE + (mu/2)·||w - w_global||² over the trainable parameters (squared L2)."""

    name = "fedprox"
    Options = FedProxOptions
    paper = "Li et al., MLSys 2020"

    @classmethod
    def check_options(cls, options: FedProxOptions) -> None:
        if options.mu < 0:
            raise RaydgError(f"fedprox: mu must be >= 0, got {options.mu}")

    def start_round(self, ctx: ClientContext) -> None:
        super().start_round(ctx)
        ctx.scratch["anchor"] = [
            (p, p.detach().clone()) for p in ctx.model.parameters() if p.requires_grad
        ]

    def loss(self, ctx: ClientContext, x: Tensor, y: Tensor) -> Tensor:
        prox = sum(torch.sum((p - w0) ** 2) for p, w0 in ctx.scratch["anchor"])
        ctx.log("fedprox/prox", prox.detach(), term=True)
        return super().loss(ctx, x, y) + 0.5 * self.options.mu * prox
