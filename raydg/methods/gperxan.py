"""gPerXAN (Le et al., "Efficiently Assemble Normalization Layers and Regularization for Federated
Domain Generalization"): Personalized eXplicitly Assembled Normalization with a guiding
regularizer through the frozen global classifier.

* XAN (Eq. 2): ``h = w_in*(g_in*IN(h) + b_in) + w_bn*(g_bn*BN(h) + b_bn)`` with
  (w_in, w_bn) the softmax of two learnable scalar scores per layer, both initialised to 1.0
  (0.5 / 0.5), as in the authors' code.
* PerXAN (§3.1, Algorithm 1): the BN side of every XAN layer (its affine parameters, running
  statistics and score) stays on the client; the IN side, the IN score, the convolutions and the
  classifier are aggregated by FedAvg. The evaluated global model averages all parameters,
  BN sides included (§3.1).
* Guiding regulariser (Eq. 3-4): ``CE(f_i(x), y) + lambda*CE(h_g(g_i(x)), y)`` with h_g the
  classifier received at the start of the round, frozen; lambda = 0.5.
* Which BN layers become XAN: ``xan_blocks`` leading blocks (ResNet: the stem and layer1..k;
  the digits CNN: its first k BN layers); -1 means every BN (the authors' code).
* Variants (Table 4, Fig. 2): ``norm=bn`` keeps plain BN (aggregated, as FedAvg); ``norm=ibn``
  replaces the same layers by an IBN-Net-style fixed split, the first half of the channels
  instance-normalised and the rest batch-normalised, all aggregated; ``lambda_reg=0`` drops the
  regulariser. ``perxan`` and ``gfedavg`` are these variants under their own names.
* The per-layer (w_in, w_bn) of the aggregated model are recorded every round
  (table ``xan_weights`` and a line plot of w_in, artifacts of the run).
* ``eval_client=k`` evaluates the global model with client k's BN sides instead of the average
  (§3.1 averages; the option shows what a single client's statistics give).
"""

from __future__ import annotations

import copy
from dataclasses import dataclass
from typing import ClassVar

import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, Server, Upload, register
from raydg.models import ModelSpec, replace_bns
from raydg.state import State


def instance_norm(inorm: nn.InstanceNorm2d, x: Tensor) -> Tensor:
    """``inorm(x)``; on 1x1 maps (a small image's last stages) the value the definition gives,
    ``g*(x - x)/sqrt(eps) + b = b``, where torch refuses to train instance normalisation."""
    if x[0, 0].numel() > 1:
        return inorm(x)
    return inorm.bias.view(1, -1, 1, 1).expand_as(x)


class XAN(nn.Module):
    """Eq. (2): an explicit softmax-weighted sum of an IN and a BN branch."""

    def __init__(self, bn: nn.BatchNorm2d) -> None:
        """Replaces ``bn``, whose parameters and statistics become the BN side (§4: BN-related
        parameters start from the backbone's, e.g. ImageNet weights)."""
        super().__init__()
        self.inorm = nn.InstanceNorm2d(bn.num_features, eps=bn.eps, affine=True)
        self.bn = copy.deepcopy(bn)
        self.score_in = nn.Parameter(torch.ones(()))
        self.score_bn = nn.Parameter(torch.ones(()))

    def weights(self) -> Tensor:
        """(w_in, w_bn) = softmax(score_in, score_bn)."""
        return torch.softmax(torch.stack([self.score_in, self.score_bn]), dim=0)

    def forward(self, x: Tensor) -> Tensor:
        w = self.weights()
        return w[0] * instance_norm(self.inorm, x) + w[1] * self.bn(x)


class IBN(nn.Module):
    """IBN-Net style: the first half of the channels instance-normalised, the rest BN."""

    def __init__(self, bn: nn.BatchNorm2d) -> None:
        """Replaces ``bn``; each half keeps ``bn``'s affine parameters (and statistics) of its
        channels."""
        super().__init__()
        c = bn.num_features
        self.split = c // 2
        self.inorm = nn.InstanceNorm2d(self.split, eps=bn.eps, affine=True)
        self.bn = nn.BatchNorm2d(c - self.split, eps=bn.eps, momentum=bn.momentum)
        with torch.no_grad():
            self.inorm.weight.copy_(bn.weight[:self.split])
            self.inorm.bias.copy_(bn.bias[:self.split])
            for key in ("weight", "bias", "running_mean", "running_var"):
                getattr(self.bn, key).copy_(getattr(bn, key)[self.split:])

    def forward(self, x: Tensor) -> Tensor:
        return torch.cat([instance_norm(self.inorm, x[:, :self.split]),
                          self.bn(x[:, self.split:])], dim=1)


@dataclass
class GPerXANOptions:
    lambda_reg: float = 0.5  # weight of the guiding regulariser, Eq. (3); range [0, 1]
    norm: str = "xan"  # xan | bn | ibn (Table 4)
    xan_blocks: int = -1  # leading blocks whose BN layers are replaced (-1: all)
    eval_client: int = -1  # evaluate with this client's BN sides (-1: their average, §3.1)


@register()
class GPerXAN(Method):
    """PerXAN with the guiding regulariser (gPerXAN, Eq. 2-4, Algorithm 1)."""

    name = "gperxan"
    Options = GPerXANOptions
    paper = "Le et al., CVPR 2024 (gPerXAN), Eq. (2)-(4)"
    needs_batchnorm = True  # XAN replaces BN layers
    plots: ClassVar[dict[str, tuple[str, ...]]] = {"xan_weights": ("line", "round", "w_in",
                                                                   "layer")}

    @classmethod
    def check_options(cls, o: GPerXANOptions) -> None:
        if o.norm not in ("xan", "bn", "ibn") or o.lambda_reg < 0:
            raise RaydgError(f"{cls.name}: norm must be xan|bn|ibn and lambda_reg >= 0")

    def build_model(self, spec: ModelSpec) -> nn.Module:
        model = super().build_model(spec)
        layer = {"xan": XAN, "ibn": IBN}.get(self.options.norm)
        if layer is not None:
            replace_bns(model.features, layer, self.options.xan_blocks)
        return model

    def setup(self, server: Server) -> None:
        if self.options.eval_client >= len(server.client_ids):
            raise RaydgError(f"{self.name}: eval_client {self.options.eval_client} is not one "
                             f"of the {len(server.client_ids)} clients")

    def aggregate(self, server: Server, uploads: list[Upload]) -> State:
        """FedAvg of everything; with ``eval_client`` the evaluated model takes that client's
        BN sides (its latest upload) instead of the average. Clients never load BN sides."""
        merged = super().aggregate(server, uploads)
        chosen = [u for u in uploads if u.client_id == self.options.eval_client]
        source = chosen[0].state if chosen else server.global_state
        if self.options.eval_client >= 0:
            merged.update({k: source[k] for k in server.local_keys})
        return merged

    def local_keys(self, model: nn.Module) -> set[str]:
        """The BN side of every XAN layer: its affine, statistics and score (PerXAN)."""
        return {f"{name}.{key}" for name, m in model.named_modules() if isinstance(m, XAN)
                for key in [*(f"bn.{k}" for k in m.bn.state_dict()), "score_bn"]}

    def start_round(self, ctx: ClientContext) -> None:
        super().start_round(ctx)
        head = copy.deepcopy(ctx.model.classifier).requires_grad_(False)
        ctx.scratch["global_head"] = head

    def loss(self, ctx: ClientContext, x: Tensor, y: Tensor) -> Tensor:
        """Eq. (3)-(4): CE(f_i(x), y) + lambda * CE(h_g(g_i(x)), y), h_g frozen."""
        features = ctx.model.features(x)
        loss = F.cross_entropy(ctx.model.classifier(features), y)
        if self.options.lambda_reg > 0:
            guide = F.cross_entropy(ctx.scratch["global_head"](features), y)
            loss = loss + self.options.lambda_reg * guide
        return loss

    def on_round_end(self, server: Server) -> dict[str, float]:
        """Record each XAN layer's (w_in, w_bn) of the aggregated model."""
        state = server.global_state
        for key in sorted(k for k in state if k.endswith(".score_in")):
            layer = key[: -len(".score_in")]
            w = torch.softmax(torch.tensor([float(state[key]),
                                            float(state[f"{layer}.score_bn"])]), dim=0)
            server.record("xan_weights", {"layer": layer, "w_in": float(w[0]),
                                          "w_bn": float(w[1])})
        return {}


@dataclass
class PerXANOptions(GPerXANOptions):
    lambda_reg: float = 0.0


@register()
class PerXAN(GPerXAN):
    """PerXAN without the guiding regulariser (gPerXAN Table 4)."""

    name = "perxan"
    Options = PerXANOptions


@dataclass
class GFedAvgOptions(GPerXANOptions):
    norm: str = "bn"


@register()
class GFedAvg(GPerXAN):
    """FedAvg with plain BN and the guiding regulariser (gFedAvg, gPerXAN Table 4)."""

    name = "gfedavg"
    Options = GFedAvgOptions
