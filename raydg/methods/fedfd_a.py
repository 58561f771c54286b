"""FedFD-A (Yang et al., ECCV 2024; FedIG-A in its earlier version): FedFD
(:mod:`raydg.methods.fedfd`) plus the instance feature adapter (FedFD-A §3.3, Eq. 6-7).

Per BN layer, two FC layers map ``[mu_i - mu_G; sigma_i - sigma_G]`` to (delta, eps);
``alpha = clamp(z*delta + eps, 0, 1)``, z ~ N(0, 1), in training and ``clamp(eps)`` at
inference; the layer normalises with ``alpha*mu_i + (1-alpha)*mu_G``. Each local iteration
first updates the main network (adapter frozen), then the adapter with CE (main network
frozen), as FedIG-A's pseudo-code (Table 13). Adapters are aggregated by FedAvg.

Choices where the papers are silent, each an option: the adapter's hidden width is
``C // adapter_reduction`` (at least 4): with reduction 16 it adds 0.22M parameters to
ResNet-18, FedFD-A Table 4's 11.31M -> 11.53M; ReLU between the two layers; alpha is one scalar
per layer and sample (FedFD-A) or per channel (FedIG): ``adapter_alpha``; the start of eps
(``adapter_eps_init``) and the adapter's learning rate (``adapter_lr_scale``), below.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import ClassVar

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydg.errors import RaydgError
from raydg.methods import ClientContext, register
from raydg.methods.fedfd import FedFD, FedFDOptions, bn_mode, frozen, mix_layers, set_reference
from raydg.models import ModelSpec


@dataclass
class FedFDAOptions(FedFDOptions):
    adapter_alpha: str = "scalar"  # one alpha per layer and sample (FedFD-A) or per channel
    adapter_reduction: int = 16  # hidden width C // reduction (Table 4: +0.22M on ResNet-18)
    # v: the bias of the adapter's eps outputs starts at v, by default 0.5, the clamp's centre
    # (the fixed alpha of Table 3(c2)); None: PyTorch's initialisation, which starts many
    # layers with alpha = 0 for every input, the clamp's dead zone, where only the noise
    # z*delta of Eq. (7) passes a gradient. The paper gives no initialisation; 0.5 is the one
    # that training-domain validation selects (docs/fidelity-ablations.md, "FedFD-A's adapter")
    adapter_eps_init: float | None = 0.5
    # the adapter's learning rate over the main network's (FedFD-A §4.1 trains both with one
    # SGD, lr 0.01: 1 is the paper's; a control for an adapter that learns too slowly)
    adapter_lr_scale: float = 1.0
    eval_modes: list[str] = field(
        default_factory=lambda: ["adapter", "global", "instance", "fixed", "random"])


@register("fedig-a")
class FedFDA(FedFD):
    """FedFD plus the instance feature adapter, trained alternately (FedFD-A §3.3, Eq. 6-7)."""

    name = "fedfd-a"
    Options = FedFDAOptions
    paper = "Yang et al., ECCV 2024 (FedFD-A), Eq. (2)-(7); FedIG-A Eq. (3)-(9)"
    uses_adapter = True

    @classmethod
    def check_options(cls, o: FedFDAOptions) -> None:
        super().check_options(o)
        if o.adapter_alpha not in ("scalar", "channel") or o.adapter_reduction < 1:
            raise RaydgError(f"{cls.name}: adapter_alpha must be scalar|channel and "
                             "adapter_reduction >= 1")
        if o.adapter_eps_init is not None and not (
                isinstance(o.adapter_eps_init, int | float) and 0 <= o.adapter_eps_init <= 1):
            raise RaydgError(f"{cls.name}: adapter_eps_init must be in [0, 1] or null")
        if not (isinstance(o.adapter_lr_scale, int | float) and o.adapter_lr_scale > 0):
            raise RaydgError(f"{cls.name}: adapter_lr_scale must be > 0")

    def adapter_hidden(self, channels: int) -> int | None:
        return max(4, channels // self.options.adapter_reduction)

    def build_model(self, spec: ModelSpec) -> nn.Module:
        model = super().build_model(spec)
        if self.options.adapter_eps_init is not None:
            with torch.no_grad():
                for _, layer in mix_layers(model):
                    bias = layer.adapter[-1].bias  # (delta, eps) of Eq. (7)
                    bias[len(bias) // 2:] = self.options.adapter_eps_init
        return model

    plots: ClassVar[dict[str, tuple[str, ...]]] = {"target_alpha": ("box", "layer", "alpha")}

    def analyze(self, model: nn.Module, batches: Iterator[Tensor]) -> dict[str, list[dict]]:
        """FedFD-A Fig. 4 / FedIG-A Fig. 7-9: the adapter's alpha = T(eps) in every BN layer for
        every target image (averaged over channels when alpha is per channel)."""
        layers = mix_layers(model)
        for _, m in layers:
            m.record = []
        try:
            for x in batches:
                self.predict(model, x, "adapter")
            return {"alpha": [{"layer": name, "alpha": float(a)}
                              for name, m in layers for alphas, _ in m.record for a in alphas]}
        finally:
            for _, m in layers:
                m.record = None

    def summarize(self, tables: dict[str, list[dict]]) -> dict[str, float]:
        """Per BN layer, over the target images: the mean of alpha = T(eps)
        (``fedfd-a/target_alpha/<layer>``) and its share clamped to 0 (``target_alpha_zero``)."""
        out = {}
        for layer in dict.fromkeys(r["layer"] for r in tables.get("alpha", [])):
            alpha = np.array([r["alpha"] for r in tables["alpha"] if r["layer"] == layer])
            out[f"fedfd-a/target_alpha/{layer}"] = float(alpha.mean())
            out[f"fedfd-a/target_alpha_zero/{layer}"] = float((alpha == 0).mean())
        return out

    @staticmethod
    def split_params(model: nn.Module) -> tuple[list[nn.Parameter], list[nn.Parameter]]:
        """(main network, adapters)."""
        adapter_ids = {id(p) for _, m in mix_layers(model) for p in m.adapter.parameters()}
        params = list(model.parameters())
        return ([p for p in params if id(p) not in adapter_ids],
                [p for p in params if id(p) in adapter_ids])

    def start_round(self, ctx: ClientContext) -> None:
        main, adapters = self.split_params(ctx.model)
        ctx.optimizer = ctx.make_optimizer(main)
        ctx.scratch["adapter_optimizer"] = ctx.make_optimizer(adapters,
                                                              self.options.adapter_lr_scale)
        ctx.scratch["params"] = (main, adapters)
        set_reference(ctx.model, ctx.global_state)

    def train_step(self, ctx: ClientContext, x: Tensor, y: Tensor) -> float | Tensor:
        """One local iteration of FedIG-A Table 13: main network, then adapters (not while
        warming up: mu_G, sigma_G are not the clients' yet)."""
        loss = self.main_step(ctx, x, y)
        if not self.warming_up(ctx):
            self.adapter_step(ctx, x, y)
        return loss

    def main_step(self, ctx: ClientContext, x: Tensor, y: Tensor) -> float | Tensor:
        """The main network on Eq. (5), the adapters frozen."""
        with frozen(ctx.scratch["params"][1]):
            return super().train_step(ctx, x, y)

    def adapter_step(self, ctx: ClientContext, x: Tensor, y: Tensor) -> None:
        """The adapters on CE through the interpolated statistics (Eq. 6-7), the main network
        frozen."""
        opt = ctx.scratch["adapter_optimizer"]
        opt.zero_grad(set_to_none=True)
        layers = [m for _, m in mix_layers(ctx.model)]
        for m in layers:
            m.record = []
        try:
            with frozen(ctx.scratch["params"][0]), bn_mode(ctx.model, "adapter"):
                F.cross_entropy(ctx.model(x), y).backward()
            self.log_adapter(ctx, [m.record[0] for m in layers])
        finally:
            for m in layers:
                m.record = None
        opt.step()

    @staticmethod
    def log_adapter(ctx: ClientContext, record: list[tuple[Tensor, Tensor]]) -> None:
        """Per round, over the BN layers and the source batches of the adapter steps: alpha of
        Eq. (7) in training (``fedfd-a/alpha``) and the share clamped to 0
        (``alpha_zero``), the inference alpha T(eps) (``eps``, ``eps_zero``: what the
        target's alpha would be on these source images), and the gradient norm reaching the
        adapters (``adapter_grad``)."""
        alpha, eps = (torch.cat([r[i] for r in record]) for i in (0, 1))
        ctx.log("fedfd-a/alpha", alpha.mean())
        ctx.log("fedfd-a/alpha_zero", (alpha == 0).float().mean())
        ctx.log("fedfd-a/eps", eps.mean())
        ctx.log("fedfd-a/eps_zero", (eps == 0).float().mean())
        grads = [p.grad.norm() for p in ctx.scratch["params"][1] if p.grad is not None]
        ctx.log("fedfd-a/adapter_grad", torch.stack(grads).norm() if grads else 0.0)
