"""Digits in appearance styles drawn from a seeded generator: data that no method was tuned on.

A *family* is five domains, one per kind of appearance, each with its parameters drawn from
the family's seed: ``low-contrast`` (grey ink on grey paper, a pixel std of 1.5-5 %),
``flat`` (a small glyph on a perfectly uniform coloured ground: most of every feature map is
constant), ``high-frequency`` (a grating of 2-3 px period under the ink), ``inverted`` (dark
ink on light paper) and ``coloured`` (ink that differs from its paper in one colour channel
only: the others are constant over the whole image). These are the extremes that instance
statistics, style statistics and small feature maps meet first. The 1,797 digits of
:mod:`raydg.datasets.digits` are split class-balanced into five disjoint fifths, as
digits-style splits them into quarters; images render at the requested size (16 px by default,
``--image-size 32`` draws the same styles at 32 px, with the texture's period in pixels).

``digits-gen`` is family 0; :func:`family` builds (and :func:`register_family` registers as
``digits-gen-<seed>``) any other, for the stress test and ``benchmarks/stress.py``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from raydg.datasets import DATASETS, DatasetSpec, Domain, LoadRequest, MultiDomainDataset
from raydg.datasets.digits import DIGITS_DEFAULTS, _digits, _stratified_groups, _to_uint8

KINDS = ("low-contrast", "flat", "high-frequency", "inverted", "coloured")
_SPLIT_SEED = 20261129  # which digits fall in which domain: fixed, whatever the family
Range = tuple[float, float]


@dataclass(frozen=True)
class Style:
    """One domain's appearance, as ranges that each image draws its own values from:
    ``image = ground * (1 - d) + ink * d``, the glyph ``d`` shrunk to ``scale`` of the side,
    the ground ``paper`` plus a grating of amplitude ``texture`` and period ``period`` px."""

    kind: str
    contrast: Range = (1.0, 1.0)  # |ink - paper|, per channel that differs
    scale: Range = (1.0, 1.0)
    texture: Range = (0.0, 0.0)
    period: Range = (2.0, 2.0)


def draw_style(kind: str, rng: np.random.Generator) -> Style:
    """The ranges of one style of ``kind``, drawn from ``rng``."""
    if kind == "low-contrast":  # a pixel std of about 1.5-10 %
        return Style(kind, contrast=(rng.uniform(0.04, 0.06), rng.uniform(0.15, 0.25)))
    if kind == "flat":  # a glyph of half to four fifths of the side on a uniform ground
        return Style(kind, contrast=(0.5, 1.0), scale=(rng.uniform(0.55, 0.65), 0.85))
    if kind == "high-frequency":
        return Style(kind, contrast=(0.6, 1.0), texture=(0.1, rng.uniform(0.25, 0.3)),
                     period=(2.0, rng.uniform(2.5, 3.0)))
    if kind in ("inverted", "coloured"):
        return Style(kind, contrast=(rng.uniform(0.3, 0.5), 1.0))
    raise ValueError(f"unknown style kind {kind!r}; kinds: {KINDS}")


def family(seed: int) -> list[Style]:
    """The five styles of family ``seed``, one per kind, in :data:`KINDS` order."""
    rng = np.random.default_rng([seed, 59])
    return [draw_style(kind, rng) for kind in KINDS]


def _colours(kind: str, contrast: np.ndarray, rng: np.random.Generator
             ) -> tuple[np.ndarray, np.ndarray]:
    """Per image (n, 3): paper and ink. ``low-contrast``: grey on grey, either polarity;
    ``flat`` and ``high-frequency``: light ink on dark coloured paper; ``inverted``: dark ink
    on light paper; ``coloured``: ink that differs from its paper in one channel only."""
    n = len(contrast)
    c = contrast[:, None]
    if kind == "low-contrast":
        paper = np.repeat(rng.uniform(0.25, 0.75, (n, 1)), 3, axis=1)
        return paper, paper + c
    if kind in ("flat", "high-frequency"):
        paper = rng.uniform(0.0, 1.0 - c, (n, 3))
        return paper, paper + c
    if kind == "inverted":
        paper = rng.uniform(c, 1.0, (n, 3))
        return paper, paper - c
    paper = rng.uniform(0.0, 1.0, (n, 3))
    ink = paper.copy()
    channel = rng.integers(3, size=n)
    rows = np.arange(n)
    up = paper[rows, channel] < 0.5
    ink[rows, channel] += np.where(up, 1.0, -1.0) * np.minimum(contrast, 0.5)
    return paper, ink


def _shrink(d: np.ndarray, scale: np.ndarray) -> np.ndarray:
    """Each glyph of ``d`` (n, H, W) shrunk to its ``scale`` of the side, centred on a zero
    ground."""
    import torch

    out = np.zeros_like(d)
    n, h, w = d.shape
    for i in range(n):
        sh, sw = max(2, round(h * scale[i])), max(2, round(w * scale[i]))
        small = torch.nn.functional.interpolate(torch.from_numpy(d[i:i + 1, None]),
                                                size=(sh, sw), mode="bilinear",
                                                align_corners=False)[0, 0].numpy()
        top, left = (h - sh) // 2, (w - sw) // 2
        out[i, top:top + sh, left:left + sw] = small
    return out


def render(d: np.ndarray, style: Style, rng: np.random.Generator) -> np.ndarray:
    """Digit intensities ``d`` (n, H, W) in [0, 1] drawn in ``style``: RGB (n, 3, H, W) in
    [0, 1]; every image draws its colours, size and grating from the style's ranges."""
    n, h, w = d.shape
    draw = lambda r: rng.uniform(*r, n)  # noqa: E731
    paper, ink = _colours(style.kind, draw(style.contrast), rng)
    scale = draw(style.scale)
    if (scale < 1).any():
        d = _shrink(d, scale)
    ground = np.broadcast_to(paper[:, :, None, None], (n, 3, h, w)).copy()
    amplitude = draw(style.texture)
    if amplitude.any():
        yy, xx = np.mgrid[0:h, 0:w].astype(np.float64)
        theta, phase = rng.uniform(0, np.pi, (n, 1, 1)), rng.uniform(0, 2 * np.pi, (n, 1, 1))
        wave = (np.cos(theta) * xx + np.sin(theta) * yy) / draw(style.period)[:, None, None]
        ground += (amplitude[:, None, None] * np.sin(2 * np.pi * wave + phase))[:, None]
    image = ground * (1 - d[:, None]) + ink[:, :, None, None] * d[:, None]
    return np.clip(image, 0.0, 1.0)


def load_family(seed: int, request: LoadRequest, name: str) -> MultiDomainDataset:
    """Family ``seed`` at ``request.image_size``, its domains named by their kinds."""
    images, y = _digits(request.image_size)
    groups = _stratified_groups(y, len(KINDS), None, np.random.default_rng(_SPLIT_SEED))
    rng = np.random.default_rng([seed, request.image_size])
    domains = [Domain(style.kind, _to_uint8(render(images[idx], style, rng)), y[idx])
               for style, idx in zip(family(seed), groups, strict=True)]
    return MultiDomainDataset(name, [str(i) for i in range(10)], domains, (0.5,) * 3,
                              (0.5,) * 3)


def family_spec(seed: int) -> DatasetSpec:
    """The dataset of family ``seed``: no method options of its own (a user's dataset)."""
    name = "digits-gen" if seed == 0 else f"digits-gen-{seed}"
    return DatasetSpec(name, KINDS, DIGITS_DEFAULTS,
                       lambda request: load_family(seed, request, name),
                       f"embedded: sklearn digits in 5 generated extreme styles (family {seed})")


def register_family(seed: int) -> str:
    """Register family ``seed`` (once) and return its dataset name."""
    spec = family_spec(seed)
    if spec.name.lower() not in {n.lower() for n in DATASETS.names()}:
        DATASETS.register(spec.name)(spec)
    return spec.name


register_family(0)
