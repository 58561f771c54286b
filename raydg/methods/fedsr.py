"""FedSR (Nguyen, Torr, Lim, "FedSR: A Simple and Effective Domain Generalization Method for
Federated Learning", NeurIPS 2022): a probabilistic representation kept simple by two
regularisers, trained with plain FedAvg.

The paper's text was not reachable from this environment, so its equation numbers are not
cited here; the objective below is the one of the authors' published code (raydg's reference
notes), which the paper's L2R and CMI regularisers describe.

* Representation: the backbone's features go through a linear layer to 2·z_dim numbers, the
  mean mu and (after softplus) the scale sigma of z ~ N(mu, diag(sigma²)); during training z is
  sampled with the reparameterisation trick z = mu + sigma·eps, eps ~ N(0, I) (torch's global
  generator, which the client seeds per (seed, client, round)); a linear classifier on z.
* Loss: CE(classifier(z), y) + l2r · L2R + cmi · CMI with
  L2R = mean over the batch of ||z||₂ (unsquared, the official code; ``l2r_squared`` gives
  ||z||₂², FedDG_Benchmark's re-implementation) and
  CMI = mean over the batch of KL(N(C·mu, |C|·sigma) || N(r_mu[y], softplus(r_sigma[y]))),
  summed over the z_dim coordinates, in closed form. r_mu (init 0), r_sigma (init 1, before
  softplus) are per-class reference parameters and C (init 1) a scalar; all are trained with
  the model. The scale of C·z is |C|·sigma; the official code writes C·sigma, the same while
  C > 0 (it starts at 1).
* Aggregation: FedAvg of the backbone, the Gaussian head and the classifier; each client keeps
  its own r_mu, r_sigma, C as local keys, as the official code does (the paper, as far as
  raydg's notes go, does not say; ``local_reference=False`` averages them too).
* Inference (``eval_modes``): ``sampled``, the paper's prediction, averages the softmax over
  ``samples`` draws of z (20); ``mean`` classifies z = mu. ``sampled`` draws its noise from its
  own CPU generator seeded with :data:`PREDICT_SEED` at every call, never from torch's global
  one: a batch's prediction depends only on the model and the batch, whatever process, device
  or order evaluates it, and evaluation never shifts the training streams. (Every batch gets
  the same noise pattern by position; each image still sees ``samples`` independent draws.)
  ``predict`` returns log of the averaged probabilities, so a cross-entropy on it is the
  negative log-likelihood of the averaged prediction.
* Model selection: the official code reports the round with the lowest source-validation
  loss; raydg selects every method by the mean source-validation accuracy (of ``sampled``).
* Regulariser values (before their weights) are logged per round as ``fedsr/l2r`` and
  ``fedsr/cmi``.
* z_dim: the paper uses 512 with ResNet-18 (PACS) and 2048 with ResNet-50 (OfficeHome,
  DomainNet), the backbones' feature widths; ``z_dim=0`` (the default) takes the backbone's
  feature width, so it gives those and 64 for the embedded digits CNN.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, register
from raydg.models import ModelSpec

PREDICT_SEED = 0  # seed of the inference noise, reset at every ``predict`` call


class GaussianNet(nn.Module):
    """Backbone -> (mu, sigma) of a diagonal Gaussian z -> linear classifier on z, plus the
    CMI reference parameters r_mu, r_sigma (per class) and the scalar c (FedSR's C)."""

    def __init__(self, features: nn.Module, feature_dim: int, z_dim: int,
                 num_classes: int) -> None:
        super().__init__()
        self.features = features
        self.encoder = nn.Linear(feature_dim, 2 * z_dim)
        self.classifier = nn.Linear(z_dim, num_classes)
        self.r_mu = nn.Parameter(torch.zeros(num_classes, z_dim))
        self.r_sigma = nn.Parameter(torch.ones(num_classes, z_dim))
        self.c = nn.Parameter(torch.ones(()))

    def gaussian(self, x: Tensor) -> tuple[Tensor, Tensor]:
        """mu and sigma = softplus(.) of z given the images ``x``."""
        mu, raw = self.encoder(self.features(x)).chunk(2, dim=1)
        return mu, F.softplus(raw)

    def forward(self, x: Tensor) -> Tensor:
        """Logits of one sampled z in training, of z = mu in eval mode."""
        mu, sigma = self.gaussian(x)
        return self.classifier(mu + sigma * torch.randn_like(sigma) if self.training else mu)


def l2r_term(z: Tensor, squared: bool = False) -> Tensor:
    """L2R: the batch mean of ||z||₂ (or of ||z||₂² with ``squared``)."""
    norms = z.norm(dim=1)
    return (norms ** 2 if squared else norms).mean()


def gaussian_kl(mu_q: Tensor, sigma_q: Tensor, mu_p: Tensor, sigma_p: Tensor) -> Tensor:
    """KL(N(mu_q, sigma_q²) || N(mu_p, sigma_p²)) of diagonal Gaussians, summed over the last
    dimension: sum log(sigma_p / sigma_q) + (sigma_q² + (mu_q - mu_p)²) / (2 sigma_p²) - 1/2."""
    return (torch.log(sigma_p / sigma_q)
            + (sigma_q ** 2 + (mu_q - mu_p) ** 2) / (2 * sigma_p ** 2) - 0.5).sum(-1)


def cmi_term(model: GaussianNet, mu: Tensor, sigma: Tensor, y: Tensor) -> Tensor:
    """CMI: the batch mean of KL(N(C·mu, |C|·sigma) || N(r_mu[y], softplus(r_sigma[y])))."""
    c = model.c
    return gaussian_kl(c * mu, c.abs() * sigma, model.r_mu[y],
                       F.softplus(model.r_sigma[y])).mean()


@dataclass
class FedSROptions:
    z_dim: int = 0  # 0: the backbone's feature width (ResNet-18 512, ResNet-50 2048, cnn 64)
    l2r: float = 0.01  # weight of L2R (the README's PACS command)
    cmi: float = 0.001  # weight of CMI (the PACS command; the code's argparse default 5e-4)
    samples: int = 20  # draws of z averaged by the ``sampled`` prediction
    l2r_squared: bool = False  # ||z||² (FedDG_Benchmark) instead of ||z|| (official code)
    local_reference: bool = True  # keep r_mu, r_sigma, C on each client (official code)


@register()
class FedSR(Method):
    """FedAvg on a Gaussian representation with the L2R and CMI regularisers."""

    name = "fedsr"
    Options = FedSROptions
    paper = "Nguyen, Torr, Lim, NeurIPS 2022 (L2R and CMI regularisers; official code)"
    collapse_hint = ("For fedsr: lower options.l2r (it shrinks z towards 0, where the classes "
                     "cannot be told apart) or options.cmi (it pulls every class's z towards "
                     "the reference Gaussians, identical at the start).")
    eval_modes: ClassVar[tuple[str, ...]] = ("sampled", "mean")

    @classmethod
    def check_options(cls, o: FedSROptions) -> None:
        super().check_options(o)
        if not (o.l2r >= 0 and o.cmi >= 0) or o.samples < 1 or o.z_dim < 0:
            raise RaydgError(f"{cls.name}: needs l2r >= 0, cmi >= 0, samples >= 1 and "
                             f"z_dim >= 0, got l2r={o.l2r}, cmi={o.cmi}, "
                             f"samples={o.samples}, z_dim={o.z_dim}")

    def build_model(self, spec: ModelSpec) -> nn.Module:
        """The backbone of ``spec`` (with its initial weights) under a Gaussian head."""
        base = super().build_model(spec)
        width = base.classifier.in_features
        return GaussianNet(base.features, width, self.options.z_dim or width,
                           spec.num_classes)

    def local_keys(self, model: nn.Module) -> set[str]:
        """The reference parameters with ``local_reference`` (the official code), else none."""
        reference = {"r_mu", "r_sigma", "c"} if self.options.local_reference else set()
        return super().local_keys(model) | reference

    def loss(self, ctx: ClientContext, x: Tensor, y: Tensor) -> Tensor:
        """CE on a sampled z + l2r · L2R + cmi · CMI; logs L2R and CMI."""
        model, o = ctx.model, self.options
        mu, sigma = model.gaussian(x)
        z = mu + sigma * torch.randn_like(sigma)
        l2r, cmi = l2r_term(z, o.l2r_squared), cmi_term(model, mu, sigma, y)
        ctx.log("fedsr/l2r", l2r.detach(), term=True)
        ctx.log("fedsr/cmi", cmi.detach(), term=True)
        return F.cross_entropy(model.classifier(z), y) + o.l2r * l2r + o.cmi * cmi

    def predict(self, model: nn.Module, x: Tensor, mode: str) -> Tensor:
        """``mean``: logits of z = mu. ``sampled``: log of the softmax averaged over
        ``samples`` draws of z, the noise from a CPU generator seeded with PREDICT_SEED."""
        mu, sigma = model.gaussian(x)
        if mode == "mean":
            return model.classifier(mu)
        generator = torch.Generator().manual_seed(PREDICT_SEED)
        eps = torch.randn((self.options.samples, *mu.shape), generator=generator)
        logits = model.classifier(mu + sigma * eps.to(device=mu.device, dtype=mu.dtype))
        return torch.logsumexp(F.log_softmax(logits, dim=-1), dim=0) - math.log(len(eps))
