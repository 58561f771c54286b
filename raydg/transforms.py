"""Training-time image augmentation of a client's uint8 batches, each image with its own draw.

``domainbed`` is DomainBed's training augmentation: random resized crop back to the image size
(scale 0.7-1, aspect ratio 3/4-4/3), horizontal flip, colour jitter 0.3 (brightness, contrast,
saturation, hue, in a random order per image) and random grayscale (p = 0.1). ``flip-jitter``
is gPerXAN's "random horizontal flipping and color jittering" (§4; the strength is not given,
DomainBed's 0.3 is used), ``crop-flip`` keeps the crop and the flip, ``flip`` only the flip,
``none`` (the default) leaves images as they are.

Each operation follows torchvision's definition (``RandomResizedCrop``'s draw and bilinear
resize, ``adjust_brightness/contrast/saturation/hue``, ``rgb_to_grayscale``; single-channel
images skip saturation, hue and grayscale, as there) but runs on the whole batch at once, with
per-image parameters: called image by image, torchvision's pipeline took 5.7-8.3x a ResNet-18
step on a GPU, batched 1.2x (benchmarks/README.md: gpu_share.py, augment.py). Pixels stay in
float from the crop to the end and are rounded to uint8 once. The parameters are drawn from
torch's global CPU generator, which the client seeds per (seed, client, round): a run is
reproducible, and draws the same parameters on a CPU and on a GPU.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, get_args

from raydg.config_types import TrainTransform

if TYPE_CHECKING:  # torch is imported where a transform runs: the CLI's help needs none of it
    from torch import Tensor

TRANSFORMS = get_args(TrainTransform)
CROP_SCALE, CROP_RATIO, CROP_TRIES = (0.7, 1.0), (3 / 4, 4 / 3), 10
JITTER, GRAYSCALE_P = 0.3, 0.1
CPU_CHUNK = 2 ** 20  # values (images x channels x pixels) augmented at once on a CPU
LUMA = (0.2989, 0.587, 0.114)  # torchvision's rgb_to_grayscale weights


@dataclass(frozen=True)
class Augment:
    """A batch transform of uint8 ``(n, C, H, W)`` tensors, resized back to ``size``."""

    size: int
    crop: bool
    jitter: bool
    grayscale: bool

    def __call__(self, x: Tensor) -> Tensor:
        """Draw every image's parameters, then :meth:`apply` them: the whole batch at once on a
        GPU, about :data:`CPU_CHUNK` values at a time on a CPU (whose allocator hands large
        temporaries back to the system, each then paged in anew: 1.4x slower at 64 x 224 px)."""
        import torch

        n = len(x)
        if n == 0:
            return x
        params = self.draw(n, *x.shape[2:])
        step = n if x.device.type == "cuda" else max(1, CPU_CHUNK // math.prod(x.shape[1:]))
        return torch.cat([self.apply(x[i:i + step], {k: v[i:i + step] for k, v in params.items()})
                          for i in range(0, n, step)])

    def draw(self, n: int, height: int, width: int) -> dict[str, Tensor]:
        """The random parameters of ``n`` images, one tensor of ``n`` rows per name."""
        import torch

        params = {"flip": torch.rand(n) < 0.5}
        if self.crop:
            params.update(zip(("top", "left", "h", "w"), crop_boxes(n, height, width),
                              strict=True))
        if self.jitter:
            params["factors"], params["order"] = jitter_params(n)
        if self.grayscale:
            params["grey"] = torch.rand(n) < GRAYSCALE_P
        return params

    def apply(self, x: Tensor, params: dict[str, Tensor]) -> Tensor:
        """The augmentation of uint8 ``x`` with drawn ``params``, computed in float."""
        import torch

        out, on = x.float().div_(255), lambda mask: mask.to(x.device).view(-1, 1, 1, 1)
        if self.crop:
            out = crop_flip(out, *(params[k] for k in ("top", "left", "h", "w", "flip")),
                            self.size)
        else:
            out = torch.where(on(params["flip"]), out.flip(-1), out)
        if self.jitter:
            out = color_jitter(out, params["factors"], params["order"])
        if self.grayscale and x.shape[1] == 3:
            out = torch.where(on(params["grey"]), luma(out).expand_as(out), out)
        return out.mul_(255).round_().clamp_(0, 255).to(torch.uint8)


def make_transform(name: str, size: int) -> Augment | None:
    """The augmentation ``name`` (one of :data:`TRANSFORMS`) to ``size``, or None for ``none``."""
    if name == "none":
        return None
    return Augment(size, crop=name in ("crop-flip", "domainbed"),
                   jitter=name in ("flip-jitter", "domainbed"), grayscale=name == "domainbed")


def augment_batch(x: Tensor, transform: Augment | None) -> Tensor:
    """``transform`` applied to a uint8 batch ``(n, C, H, W)`` (``x`` itself when None)."""
    return x if transform is None else transform(x)


def crop_boxes(n: int, height: int, width: int) -> tuple[Tensor, ...]:
    """``RandomResizedCrop``'s draw for ``n`` images: top, left, height, width (int64 ``(n,)``).

    Each image takes the first of :data:`CROP_TRIES` (area, log-ratio) draws whose box fits,
    else the whole image (torchvision's fallback for an aspect ratio within the range)."""
    import torch

    area = height * width * torch.empty(n, CROP_TRIES).uniform_(*CROP_SCALE)
    ratio = torch.empty(n, CROP_TRIES).uniform_(*map(math.log, CROP_RATIO)).exp_()
    w = (area * ratio).sqrt_().round_().long()
    h = (area / ratio).sqrt_().round_().long()
    fits = (w > 0) & (w <= width) & (h > 0) & (h <= height)
    first = fits.int().argmax(1, keepdim=True)
    found = fits.any(1)
    h = torch.where(found, h.gather(1, first)[:, 0], height)
    w = torch.where(found, w.gather(1, first)[:, 0], width)
    top = (torch.rand(n) * (height - h + 1)).long()
    left = (torch.rand(n) * (width - w + 1)).long()
    return top, left, h, w


def crop_flip(x: Tensor, top: Tensor, left: Tensor, h: Tensor, w: Tensor, flip: Tensor,
              size: int) -> Tensor:
    """Each image's box resized to ``size`` bilinearly (``align_corners=False``, the box's edge
    pixels repeated, as ``resized_crop`` samples a crop), mirrored where ``flip``: one
    ``grid_sample`` over the batch. Images arrive at ``size``, so boxes are only enlarged."""
    import torch
    import torch.nn.functional as F

    u = torch.arange(size, dtype=torch.float64) + 0.5

    def axis(start: Tensor, extent: Tensor, full: int) -> Tensor:
        pixel = start[:, None] + u * (extent[:, None] / size) - 0.5
        pixel = torch.minimum(pixel.clamp_min(start[:, None]), (start + extent - 1)[:, None])
        return ((2 * pixel + 1) / full - 1).float()  # grid_sample's coordinates

    xs = axis(left, w, x.shape[-1])
    xs = torch.where(flip[:, None], xs.flip(-1), xs).to(x.device)
    ys = axis(top, h, x.shape[-2]).to(x.device)  # (n, size) each: the grid is built there
    grid = torch.stack(torch.broadcast_tensors(xs[:, None, :], ys[:, :, None]), dim=-1)
    return F.grid_sample(x, grid, mode="bilinear", padding_mode="border", align_corners=False)


def jitter_params(n: int) -> tuple[Tensor, Tensor]:
    """``ColorJitter(0.3, 0.3, 0.3, 0.3)``'s draw for ``n`` images: factors ``(n, 4)``
    (brightness, contrast, saturation in [0.7, 1.3], hue in [-0.3, 0.3]) and each image's
    order of the four (a permutation per row)."""
    import torch

    factors = torch.empty(n, 4).uniform_(1 - JITTER, 1 + JITTER)
    factors[:, 3].uniform_(-JITTER, JITTER)
    return factors, torch.rand(n, 4).argsort(1)


def color_jitter(x: Tensor, factors: Tensor, order: Tensor) -> Tensor:
    """Brightness, contrast, saturation and hue adjustments of float images in [0, 1], each
    image with its own factors and order (torchvision's ``adjust_*`` definitions)."""

    factors, order = factors.to(x.device), order.to(x.device)
    ops = (brightness, contrast, saturation, hue) if x.shape[1] == 3 else (brightness, contrast)
    for position in range(4):
        for k, op in enumerate(ops):
            rows = (order[:, position] == k).nonzero()[:, 0]
            if len(rows):
                x[rows] = op(x[rows], factors[rows, k].view(-1, 1, 1, 1))
    return x


def luma(x: Tensor) -> Tensor:
    """``rgb_to_grayscale``: ``(n, 1, H, W)`` from RGB (a single channel is its own)."""
    if x.shape[1] == 1:
        return x
    r, g, b = x.unbind(1)
    return (LUMA[0] * r + LUMA[1] * g + LUMA[2] * b).unsqueeze(1)


def brightness(x: Tensor, f: Tensor) -> Tensor:
    return (x * f).clamp_(0, 1)


def blend(x: Tensor, other: Tensor, f: Tensor) -> Tensor:
    """torchvision's ``_blend``: ``f x + (1 - f) other``, clamped to [0, 1]."""
    return (f * x + (1 - f) * other).clamp_(0, 1)


def contrast(x: Tensor, f: Tensor) -> Tensor:
    return blend(x, luma(x).mean(dim=(1, 2, 3), keepdim=True), f)


def saturation(x: Tensor, f: Tensor) -> Tensor:
    return blend(x, luma(x), f)


def hue(x: Tensor, f: Tensor) -> Tensor:
    """Rotate the hue of RGB images by ``f`` turns (RGB -> HSV, ``h + f`` mod 1, -> RGB).

    In sixths of a turn, ``h`` is (G - B), 2 + (B - R) or 4 + (R - G) over the chroma
    ``max - min``, by the largest channel (ties to R, then G, as in torchvision); channel n
    (R 5, G 3, B 1) comes back as ``max - chroma clamp(min(k, 4 - k), 0, 1)``,
    ``k = (n + 6 h) mod 6`` (the same as ``v (1 - s ...)``, since ``v s`` is the chroma)."""
    import torch

    r, g, b = x.unbind(1)
    maxc = x.amax(1)
    chroma = maxc - x.amin(1)
    scale = 1 / chroma.clamp_min(1e-12)
    sixths = torch.where(r == maxc, (g - b) * scale,
                         torch.where(g == maxc, (b - r) * scale + 2, (r - g) * scale + 4))
    sixths = torch.where(chroma > 0, sixths, 0.0) + 6 * f[:, 0]
    k = (torch.tensor([5.0, 3.0, 1.0], device=x.device).view(1, 3, 1, 1)
         + sixths.unsqueeze(1)).remainder_(6)
    ramp = torch.minimum(k, 4 - k).clamp_(0, 1)
    return maxc.unsqueeze(1) - chroma.unsqueeze(1) * ramp
