"""An external FedDG method for raydg: FedAvg whose clients also penalise the squared L2 norm of
their representation, the L2R regulariser of FedSR (Nguyen et al., NeurIPS 2022, Eq. 5), alone.

Installed (``pip install -e examples/l2r``) it is found through its entry point; as a file it
is loaded with ``raydg run ... --plugin examples/l2r/raydg_example_l2r.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch.nn.functional as F
from torch import Tensor

from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, register

__version__ = "0.1.0"


@dataclass
class L2ROptions:
    weight: float = 0.01  # alpha^{L2R} of FedSR's code


@register()
class L2R(Method):
    """Local loss CE(classifier(z), y) + weight * mean ||z||², with z the model's features."""

    name = "l2r"
    Options = L2ROptions
    paper = "FedSR's L2R term (Nguyen et al., NeurIPS 2022, Eq. 5), an example plugin"

    @classmethod
    def check_options(cls, options: L2ROptions) -> None:
        if options.weight < 0:
            raise RaydgError(f"l2r: weight must be >= 0, got {options.weight}")

    def loss(self, ctx: ClientContext, x: Tensor, y: Tensor) -> Tensor:
        z = ctx.model.features(x)
        l2 = z.pow(2).sum(dim=1).mean()
        ctx.log("l2r/norm", l2.detach())
        return F.cross_entropy(ctx.model.classifier(z), y) + self.options.weight * l2
