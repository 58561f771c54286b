"""CCST (Chen et al., WACV 2023): cross-client style transfer with a shared style bank.

Before training (Algorithm 1): every client computes its style and uploads it; the driver
concatenates the style bank (Eq. 9-10) and broadcasts it; every client augments its training
set once: for each image, K of the bank's source clients are drawn without replacement, the
client itself contributing the original image and any other client a copy of the image in that
client's style, so d images become d x K (kept in the client's persistent memory). ``ccst`` then
trains FedAvg (the paper's setting); ``--augment ccst`` puts the same phases in front of any
other method (paper Fig. 4b), since every hook here defers to ``super()``.

Style transfer is AdaIN (Eq. 2-5) behind a pluggable encoder/decoder (``encoder``):

* ``vgg``: the AdaIN VGG-19 encoder up to relu4_1 (512 channels) and its decoder, as in the
  paper, with the weights from the user's files ``encoder_weights`` (``vgg_normalised.pth``) and
  ``decoder_weights`` (``decoder.pth``), loaded with ``weights_only``. Images are stylised at
  ``vgg_size`` pixels (the authors' code: 512) without mean/std normalisation, then resized
  back. It transfers texture as well as colour.
* ``pixel``: the identity encoder, i.e. AdaIN on the image's own channels: each channel is
  shifted and scaled to the style's channel mean and standard deviation. It needs no weights,
  so the method runs offline and in tests, but it transfers colour and contrast only.

``style: overall`` (Eq. 8): per-channel mean and std of the encoder features over all of a
client's training images, one (2, C) style per client. ``style: single`` (Eq. 6-7): J =
``single_styles`` randomly chosen images' styles per client (the paper leaves J open; 10 here),
one drawn per transfer. ``k``: the augmentation level K, at most the number of source clients.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
import torch.nn.functional as F
from torch import Tensor, nn

from raydg.errors import RaydgError
from raydg.methods import ClientContext, Method, Server, register
from raydg.models import MaxPool2d, file_state
from raydg.partition import ClientData

Stylize = Callable[[np.ndarray, list[np.ndarray]], list[np.ndarray]]


STYLE_BATCH = 16  # images through the encoder at once when computing a style


class Moments:
    """Per-channel mean and std over images and pixels, accumulated batch by batch (float64
    sums), so a style never needs all of a client's features at once (Eq. 8 at 512 px)."""

    def __init__(self) -> None:
        self.n, self.total, self.squares = 0, 0.0, 0.0

    def add(self, f: Tensor) -> None:
        f = f.double()
        self.n += f.numel() // f.shape[1]
        self.total = self.total + f.sum(dim=(0, 2, 3))
        self.squares = self.squares + (f * f).sum(dim=(0, 2, 3))

    def result(self) -> Tensor:
        mean = self.total / self.n
        return torch.stack([mean, (self.squares / self.n - mean * mean).clamp_min(0).sqrt()])


def adain(f: Tensor, style: Tensor, eps: float = 1e-5) -> Tensor:
    """Eq. (2): give each channel of every feature map ``(n, C, H, W)`` the style's
    ``(n, 2, C)`` mean and std."""
    mu = f.mean(dim=(2, 3), keepdim=True)
    sigma = f.std(dim=(2, 3), keepdim=True, unbiased=False)
    return (f - mu) / (sigma + eps) * style[:, 1, :, None, None] + style[:, 0, :, None, None]


class PixelCoder(nn.Module):
    """The identity encoder and decoder: AdaIN on the image channels themselves."""

    def encode(self, x: Tensor) -> Tensor:
        return x

    def decode(self, f: Tensor) -> Tensor:
        return f


def _convs(channels: int, spec: list[int | str]) -> list[nn.Module]:
    """VGG-style layers from ``channels`` inputs: an int is a 3x3 conv (reflection padded) with
    ReLU to that many channels, ``M`` a 2x2 max-pool (ceil mode), ``U`` a 2x nearest
    upsampling."""
    layers: list[nn.Module] = []
    for item in spec:
        if item == "M":
            layers.append(MaxPool2d(2, 2, ceil_mode=True))
        elif item == "U":
            layers.append(nn.Upsample(scale_factor=2, mode="nearest"))
        else:
            layers += [nn.ReflectionPad2d(1), nn.Conv2d(channels, int(item), 3), nn.ReLU()]
            channels = int(item)
    return layers


class VGGCoder(nn.Module):
    """Huang & Belongie's AdaIN encoder (normalised VGG-19 to relu4_1) and decoder; the module
    indices match their published PyTorch weight files."""

    def __init__(self) -> None:
        super().__init__()
        self.encoder = nn.Sequential(nn.Conv2d(3, 3, 1), *_convs(
            3, [64, 64, "M", 128, 128, "M", 256, 256, 256, 256, "M", 512]))
        decoder = _convs(512, [256, "U", 256, 256, 256, 128, "U", 128, 64, "U", 64, 3])
        self.decoder = nn.Sequential(*decoder[:-1])  # no ReLU after the last conv

    def encode(self, x: Tensor) -> Tensor:
        return self.encoder(x)

    def decode(self, f: Tensor) -> Tensor:
        return self.decoder(f)


def _load(module: nn.Module, path: str, option: str) -> None:
    """Load a user's weight file into ``module`` (extra keys, e.g. VGG layers past relu4_1,
    are ignored); one clear error when it is absent or does not fit."""
    if not path or not Path(path).is_file():
        raise RaydgError(
            f"ccst: encoder vgg needs options.{option} = an existing file (AdaIN's "
            f"{'vgg_normalised.pth' if option == 'encoder_weights' else 'decoder.pth'}); "
            f"got {path!r}. Use options.encoder=pixel to run without weights.")
    weights = file_state(path)
    own = module.state_dict()
    missing = sorted(set(own) - set(weights))
    bad = sorted(k for k in own if k in weights and weights[k].shape != own[k].shape)
    if missing or bad:
        raise RaydgError(f"ccst: {path} lacks {missing[:4]} or has other shapes for "
                         f"{bad[:4]}; is it the AdaIN {option.split('_')[0]}?")
    module.load_state_dict({k: weights[k] for k in own})


@functools.cache
def vgg_coder(encoder_weights: str, decoder_weights: str, device: str) -> VGGCoder:
    """The VGG coder, built once per actor and device."""
    coder = VGGCoder()
    _load(coder.encoder, encoder_weights, "encoder_weights")
    _load(coder.decoder, decoder_weights, "decoder_weights")
    return coder.to(device).eval().requires_grad_(False)


class StyleTransfer:
    """Styles and stylised images (Eq. 2-8) through one encoder/decoder."""

    def __init__(self, coder: nn.Module, device: torch.device, size: int | None) -> None:
        self.coder, self.device, self.size = coder, device, size

    def _features(self, images: np.ndarray) -> Tensor:
        x = torch.from_numpy(images.astype(np.float32) / 255.0).to(self.device)
        if self.size is not None and x.shape[-1] != self.size:
            x = F.interpolate(x, size=(self.size, self.size), mode="bilinear",
                              align_corners=False)
        return self.coder.encode(x)

    @torch.no_grad()
    def style(self, images: np.ndarray, batch: int = STYLE_BATCH) -> np.ndarray:
        """(2, C) float64: Eq. (8) over ``images`` (uint8, ``(n, C, H, W)``), or Eq. (6) for
        one image; encoded ``batch`` images at a time."""
        acc = Moments()
        for i in range(0, len(images), batch):
            acc.add(self._features(images[i:i + batch]))
        return acc.result().cpu().numpy()

    @torch.no_grad()
    def __call__(self, image: np.ndarray, styles: list[np.ndarray]) -> list[np.ndarray]:
        """Eq. (3): ``image`` (uint8 ``(C, H, W)``) in each of ``styles``, encoded once."""
        if not styles:
            return []
        f = self._features(image[None]).expand(len(styles), -1, -1, -1)
        target = torch.from_numpy(np.stack(styles)).to(self.device, torch.float32)
        out = self.coder.decode(adain(f, target))
        if out.shape[-2:] != image.shape[-2:]:
            out = F.interpolate(out, size=image.shape[-2:], mode="bilinear",
                                align_corners=False)
        return list((out.clamp(0, 1) * 255.0).round().to(torch.uint8).cpu().numpy())


def augment(data: ClientData, own: int, bank: dict[int, np.ndarray], k: int,
            rng: np.random.Generator, stylize: Stylize) -> ClientData:
    """Algorithm 1: every image becomes K samples styled by K distinct bank clients."""
    clients = sorted(bank)
    xs, ys = [], []
    for x, y in zip(data.train_x, data.train_y, strict=True):
        picks = [int(c) for c in rng.choice(clients, size=k, replace=False)]
        styles = [bank[c][rng.integers(len(bank[c]))] for c in picks if c != own]
        styled = iter(stylize(x, styles))
        xs += [x if c == own else next(styled) for c in picks]
        ys += [y] * k
    return dataclasses.replace(data, train_x=np.stack(xs), train_y=np.asarray(ys))


@dataclass
class CCSTOptions:
    style: str = "overall"  # overall (Eq. 8) | single (Eq. 6-7)
    k: int = 3  # augmentation level K
    single_styles: int = 10  # J, single-image styles per client in single mode
    encoder: str = "pixel"  # pixel | vgg (the paper's AdaIN)
    encoder_weights: str = ""  # vgg: AdaIN's vgg_normalised.pth
    decoder_weights: str = ""  # vgg: AdaIN's decoder.pth
    vgg_size: int = 512  # vgg: side of the images during stylisation


@register()
class CCST(Method):
    """FedAvg on data augmented once by cross-client style transfer (CCST Algorithm 1)."""

    name = "ccst"
    Options = CCSTOptions
    paper = "Chen et al., WACV 2023, Eq. (2)-(10), Algorithm 1"
    augmentation = True

    @classmethod
    def label(cls, options: Any) -> str:
        """``ccst`` with the paper's VGG coder, ``ccst-pixel`` with the pixel stand-in, so no
        table mistakes one for the other."""
        return cls.name if options.encoder == "vgg" else f"{cls.name}-pixel"

    @classmethod
    def check_options(cls, o: Any) -> None:
        super().check_options(o)
        if o.style not in ("overall", "single") or o.k < 1 or o.single_styles < 1:
            raise RaydgError("ccst: style must be overall|single, k >= 1, single_styles >= 1")
        if o.encoder not in ("pixel", "vgg") or o.vgg_size < 16:
            raise RaydgError("ccst: encoder must be pixel|vgg and vgg_size >= 16")
        if o.encoder == "vgg":  # fail before any actor starts
            vgg_coder(o.encoder_weights, o.decoder_weights, "cpu")

    def setup(self, server: Server) -> None:
        """Collect the styles, broadcast the bank, let every client augment its data."""
        super().setup(server)
        if self.options.k > len(server.client_ids):
            raise RaydgError(f"ccst: k={self.options.k} exceeds the "
                             f"{len(server.client_ids)} source clients")
        styles = server.call_clients("style", kind="request", result_kind="style_vectors")
        bank = {c: styles[c] for c in sorted(styles)}  # Eq. (9)-(10)
        server.call_clients("augment", bank, kind="style_bank")

    def _transfer(self, ctx: ClientContext) -> StyleTransfer:
        o = self.options
        if o.encoder == "pixel":
            return StyleTransfer(PixelCoder(), ctx.device, None)
        coder = vgg_coder(o.encoder_weights, o.decoder_weights, str(ctx.device))
        return StyleTransfer(coder, ctx.device, o.vgg_size)

    def client_phase(self, phase: str, ctx: ClientContext, payload: Any) -> Any:
        """``style`` and ``augment`` (Algorithm 1); the base method's own phases (e.g. CSAC's
        acquisition) see the augmented training set, as its local training does."""
        if phase not in ("style", "augment"):
            ctx.data = ctx.memory.get("ccst_data", ctx.data)
            return super().client_phase(phase, ctx, payload)
        rng = np.random.default_rng(int(torch.randint(2**31, (1,), generator=ctx.generator)))
        transfer = self._transfer(ctx)
        if phase == "style":
            x = ctx.data.train_x
            if self.options.style == "overall":
                return transfer.style(x)[None]  # (1, 2, C)
            picks = rng.choice(len(x), size=min(self.options.single_styles, len(x)),
                               replace=False)
            return np.stack([transfer.style(x[i:i + 1]) for i in picks])  # (J, 2, C)
        ctx.memory["ccst_data"] = augment(ctx.data, ctx.client_id, payload, self.options.k,
                                          rng, transfer)
        return None

    def start_round(self, ctx: ClientContext) -> None:
        ctx.data = ctx.memory.get("ccst_data", ctx.data)
        super().start_round(ctx)
