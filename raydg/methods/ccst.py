"""CCST (Chen et al., WACV 2023): cross-client style transfer with a shared style bank.

Before training (Algorithm 1): every client computes its style and uploads it; the driver
concatenates the style bank (Eq. 9-10) and broadcasts it; every client augments its training
set once: for each image, K of the bank's source clients are drawn without replacement, the
client itself contributing the original image and any other client a copy of the image in that
client's style, so d images become d x K (kept in the client's persistent memory). Training is
then FedAvg (the paper's setting).

Style transfer here is AdaIN (Eq. 2-5) in pixel space (``encoder: pixel``): each channel of
the image is shifted and scaled to the style's channel mean and standard deviation. It needs no
weights, so the method runs offline; it transfers colour and contrast statistics only, not the
texture that the paper's VGG-19 encoder/decoder (relu4_1 features) transfers.

* ``style: overall`` (Eq. 8): per-channel mean and std over all of a client's training pixels,
  one (2, C) style per client. ``style: single`` (Eq. 6-7): J = ``single_styles`` randomly
  chosen images' styles per client (the paper leaves J open; 10 here), one drawn per transfer.
* ``k``: the augmentation level K, at most the number of source clients.
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch

from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, Server, register
from raydg.partition import ClientData


def pixel_style(images: np.ndarray) -> np.ndarray:
    """(2, C) float64: per-channel mean and std of uint8 images ``(n, C, H, W)`` in [0, 1]."""
    x = images.astype(np.float64) / 255.0
    return np.stack([x.mean(axis=(0, 2, 3)), x.std(axis=(0, 2, 3))])


def adain_pixel(image: np.ndarray, style: np.ndarray, eps: float = 1e-6) -> np.ndarray:
    """Eq. (2)-(5) in pixel space: give each channel of ``image`` the style's mean and std."""
    x = image.astype(np.float64) / 255.0
    mu = x.mean(axis=(1, 2), keepdims=True)
    sigma = x.std(axis=(1, 2), keepdims=True)
    out = (x - mu) / (sigma + eps) * style[1][:, None, None] + style[0][:, None, None]
    return np.round(np.clip(out, 0.0, 1.0) * 255.0).astype(np.uint8)


def augment(data: ClientData, own: int, bank: dict[int, np.ndarray], k: int,
            rng: np.random.Generator) -> ClientData:
    """Algorithm 1: every image becomes K samples styled by K distinct bank clients."""
    clients = sorted(bank)
    xs, ys = [], []
    for x, y in zip(data.train_x, data.train_y, strict=True):
        for c in rng.choice(clients, size=k, replace=False):
            styles = bank[int(c)]
            xs.append(x if c == own else adain_pixel(x, styles[rng.integers(len(styles))]))
            ys.append(y)
    return dataclasses.replace(data, train_x=np.stack(xs), train_y=np.asarray(ys))


@dataclass
class CCSTOptions:
    style: str = "overall"  # overall (Eq. 8) | single (Eq. 6-7)
    k: int = 3  # augmentation level K
    single_styles: int = 10  # J, single-image styles per client in single mode


@register()
class CCST(Method):
    """FedAvg on data augmented once by cross-client style transfer (CCST Algorithm 1)."""

    name = "ccst"
    Options = CCSTOptions
    paper = "Chen et al., WACV 2023, Eq. (2)-(10), Algorithm 1"

    @classmethod
    def check_options(cls, o: CCSTOptions) -> None:
        if o.style not in ("overall", "single") or o.k < 1 or o.single_styles < 1:
            raise RaydgError("ccst: style must be overall|single, k >= 1, single_styles >= 1")

    def setup(self, server: Server) -> None:
        """Collect the styles, broadcast the bank, let every client augment its data."""
        if self.options.k > len(server.client_ids):
            raise RaydgError(f"ccst: k={self.options.k} exceeds the "
                             f"{len(server.client_ids)} source clients")
        styles = server.call_clients("style", kind="request", result_kind="style_vectors")
        bank = {c: styles[c] for c in sorted(styles)}  # Eq. (9)-(10)
        server.call_clients("augment", bank, kind="style_bank")

    def client_phase(self, phase: str, ctx: ClientContext, payload: Any) -> Any:
        rng = np.random.default_rng(int(torch.randint(2**31, (1,), generator=ctx.generator)))
        if phase == "style":
            x = ctx.data.train_x
            if self.options.style == "overall":
                return pixel_style(x)[None]  # (1, 2, C)
            picks = rng.choice(len(x), size=min(self.options.single_styles, len(x)),
                               replace=False)
            return np.stack([pixel_style(x[i:i + 1]) for i in picks])  # (J, 2, C)
        if phase == "augment":
            ctx.memory["ccst_data"] = augment(ctx.data, ctx.client_id, payload,
                                              self.options.k, rng)
            return None
        return super().client_phase(phase, ctx, payload)

    def start_round(self, ctx: ClientContext) -> None:
        ctx.data = ctx.memory.get("ccst_data", ctx.data)
        super().start_round(ctx)
