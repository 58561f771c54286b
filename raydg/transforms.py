"""Training-time image augmentation, applied per image on the client to its uint8 batches.

``domainbed`` is DomainBed's training augmentation: random resized crop back to the image size
(scale 0.7-1), horizontal flip, colour jitter 0.3 (brightness, contrast, saturation, hue) and
random grayscale (p = 0.1). ``flip-jitter`` is gPerXAN's "random horizontal flipping and color
jittering" (§4; the strength is not given, DomainBed's 0.3 is used), ``crop-flip`` keeps the
crop and the flip, ``flip`` only the flip, ``none`` (the default) leaves images as they are.
Randomness comes from torch's global generator, which the client seeds per (seed, client,
round), so runs are reproducible.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING

if TYPE_CHECKING:  # torch is imported where a transform runs: the CLI's help needs none of it
    from torch import Tensor

TRANSFORMS = ("none", "flip", "flip-jitter", "crop-flip", "domainbed")


def make_transform(name: str, size: int) -> Callable[[Tensor], Tensor] | None:
    """A per-image transform of uint8 ``(C, H, W)`` tensors, or None for ``none``."""
    if name == "none":
        return None
    from torchvision.transforms import v2  # ~1 s to import: only when a transform is used

    steps: list = []
    if name in ("crop-flip", "domainbed"):
        steps.append(v2.RandomResizedCrop(size, scale=(0.7, 1.0), antialias=True))
    steps.append(v2.RandomHorizontalFlip())
    if name in ("flip-jitter", "domainbed"):
        steps.append(v2.ColorJitter(0.3, 0.3, 0.3, 0.3))
    if name == "domainbed":
        steps.append(v2.RandomGrayscale(0.1))
    return v2.Compose(steps)


def augment_batch(x: Tensor, transform: Callable[[Tensor], Tensor] | None) -> Tensor:
    """Apply ``transform`` to each image of a uint8 batch ``(n, C, H, W)``."""
    if transform is None:
        return x
    import torch

    return torch.stack([transform(img) for img in x])
