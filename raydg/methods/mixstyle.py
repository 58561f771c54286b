"""MixStyle (Zhou et al., ICLR 2021) as a federated baseline: FedAvg whose clients augment
their features with MixStyle, mixing only the styles of their own batch (FedFD-A Table 3b,
FedIG Table 5).

MixStyle re-styles a feature map with statistics mixed between batch samples:
``gamma_mix * (x - mu) / sigma + beta_mix`` with ``gamma_mix = lam*sigma + (1-lam)*sigma[perm]``
and ``beta_mix = lam*mu + (1-lam)*mu[perm]``, lam ~ Beta(alpha, alpha), statistics detached,
applied with probability p in training only. As in Zhou et al., it follows the first three
stages of a torchvision backbone but never its last (ResNet's layer1-3; AlexNet's first two
of its three; :data:`raydg.models.TORCHVISION`); in the digits CNN it follows each max-pool.
A 1x1 feature map has no spatial statistics (Zhou et al.'s unbiased variance is NaN there): it
passes unchanged.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
from torch import Tensor, nn

from raydg.errors import RaydgError
from raydg.methods import Method, register
from raydg.models import ModelSpec


class MixStyle(nn.Module):
    def __init__(self, p: float, alpha: float, eps: float = 1e-6) -> None:
        super().__init__()
        self.p, self.alpha, self.eps = p, alpha, eps

    def forward(self, x: Tensor) -> Tensor:
        if not self.training or torch.rand(()) >= self.p or x[0, 0].numel() < 2:
            return x
        n = len(x)
        mu = x.mean(dim=(2, 3), keepdim=True).detach()
        sigma = (x.var(dim=(2, 3), keepdim=True) + self.eps).sqrt().detach()
        lam = torch.distributions.Beta(self.alpha, self.alpha).sample((n, 1, 1, 1)).to(x.device)
        perm = torch.randperm(n, device=x.device)
        mu_mix = lam * mu + (1 - lam) * mu[perm]
        sigma_mix = lam * sigma + (1 - lam) * sigma[perm]
        return (x - mu) / sigma * sigma_mix + mu_mix


def insert_mixstyle(features: nn.Module, make) -> None:
    """Put a MixStyle module after the first three stages but the last of a torchvision
    backbone (ResNet's layer1-3, :data:`raydg.models.TORCHVISION`), or after each max-pool of
    a Sequential."""
    if hasattr(features, "stages"):
        for path in features.stages[:-1][:3]:
            parent, _, name = path.rpartition(".")
            owner = features.get_submodule(parent) if parent else features
            setattr(owner, name, nn.Sequential(getattr(owner, name), make()))
        return
    if not isinstance(features, nn.Sequential):
        raise RaydgError("mixstyle: unsupported backbone; expected a torchvision backbone "
                         "or a Sequential")
    for idx in reversed([i for i, m in enumerate(features) if isinstance(m, nn.MaxPool2d)]):
        features.insert(idx + 1, make())


@dataclass
class MixStyleOptions:
    p: float = 0.5
    alpha: float = 0.1


@register()
class MixStyleMethod(Method):
    """FedAvg with MixStyle feature augmentation inside each client."""

    name = "mixstyle"
    Options = MixStyleOptions
    paper = "Zhou et al., ICLR 2021 (baseline of FedFD-A Table 3b)"

    @classmethod
    def check_options(cls, options: MixStyleOptions) -> None:
        if not (0 <= options.p <= 1 and options.alpha > 0):
            raise RaydgError("mixstyle: needs 0 <= p <= 1 and alpha > 0")

    def build_model(self, spec: ModelSpec) -> nn.Module:
        model = super().build_model(spec)
        insert_mixstyle(model.features, lambda: MixStyle(self.options.p, self.options.alpha))
        return model
