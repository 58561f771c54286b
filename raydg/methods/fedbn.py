"""FedBN (Li et al., ICLR 2021): every BatchNorm tensor stays on its client."""

from __future__ import annotations

from torch import nn

from raydg.methods import Method, register
from raydg.models import bn_keys


@register()
class FedBN(Method):
    """BN affine parameters and running statistics local; everything else FedAvg.

    The evaluated global model uses the n_k-weighted average of the clients' BN tensors
    (the common choice for unseen-domain evaluation, see the reference notes).
    """

    name = "fedbn"
    paper = "Li et al., ICLR 2021"
    needs_batchnorm = True

    def local_keys(self, model: nn.Module) -> set[str]:
        return bn_keys(model)
