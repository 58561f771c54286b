"""SiloBN (Andreux et al., 2020): BN running statistics stay local, BN affine is shared."""

from __future__ import annotations

from torch import nn

from raydg import state
from raydg.methods import Method, register


@register()
class SiloBN(Method):
    """Only ``running_mean``, ``running_var`` and ``num_batches_tracked`` stay on the client.

    With BN in training mode running statistics never enter the forward pass, so the trained
    weights equal FedAvg's for the same seed; the two differ where running statistics are used
    (evaluation with local statistics, methods that normalise with global statistics).
    """

    name = "silobn"
    paper = "Andreux et al., MICCAI DART 2020"
    needs_batchnorm = True

    def local_keys(self, model: nn.Module) -> set[str]:
        return {k for k in model.state_dict() if state.is_bn_statistic(k)}
