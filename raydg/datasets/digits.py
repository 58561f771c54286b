"""The embedded benchmarks built from scikit-learn's bundled digits: no download needed."""

from __future__ import annotations

import gzip
import importlib.util
from pathlib import Path

import numpy as np

from raydg.datasets import (
    DATASETS,
    DatasetSpec,
    Domain,
    LoadRequest,
    MultiDomainDataset,
    TrainDefaults,
)
from raydg.errors import RaydgError

DIGITS_DEFAULTS = TrainDefaults(
    rounds=10, local_steps=20, lr=0.05, momentum=0.5, batch_size=32, model="cnn", image_size=16,
    val_every=2,  # the papers' 10 client-side validations per round (20 of 200 steps)
)
_DIGITS_SEED = 20240601  # fixed: the benchmark's images never depend on the run seed


def sklearn_digits() -> tuple[np.ndarray, np.ndarray]:
    """The 1,797 8x8 digits that scikit-learn ships (values 0-16) and their labels, read from
    its data file as ``sklearn.datasets.load_digits`` reads it, without importing scikit-learn,
    which the experiment's process needs for nothing else."""
    spec = importlib.util.find_spec("sklearn")  # locates the package, runs none of it
    if spec is None or not spec.submodule_search_locations:
        raise RaydgError("the embedded digits come with scikit-learn: pip install scikit-learn")
    path = Path(spec.submodule_search_locations[0], "datasets", "data", "digits.csv.gz")
    with gzip.open(path, "rt", encoding="utf-8") as f:
        data = np.loadtxt(f, delimiter=",")
    return data[:, :-1].reshape(-1, 8, 8), data[:, -1].astype(np.int64)


def _digits(size: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits, bilinearly resized to ``size``, in [0, 1]."""
    import torch

    pixels, labels = sklearn_digits()
    images = torch.from_numpy(pixels.astype(np.float32) / 16.0).unsqueeze(1)
    images = torch.nn.functional.interpolate(
        images, size=(size, size), mode="bilinear", align_corners=False
    )
    return images.squeeze(1).clamp(0, 1).numpy(), labels


def _stratified_groups(y: np.ndarray, groups: int, per_class: int | None, rng) -> list[np.ndarray]:
    """Split indices into ``groups`` class-balanced disjoint groups (or pick ``per_class``)."""
    out: list[list[int]] = [[] for _ in range(groups)]
    for c in np.unique(y):
        idx = rng.permutation(np.flatnonzero(y == c))
        if per_class is not None:
            out[0].extend(idx[:per_class])
            continue
        for g, chunk in enumerate(np.array_split(idx, groups)):
            out[g].extend(chunk)
    return [np.sort(np.asarray(g, dtype=np.int64)) for g in out]


def _to_uint8(images: np.ndarray) -> np.ndarray:
    return np.round(np.clip(images, 0, 1) * 255).astype(np.uint8)


ROTATIONS = (0, 15, 30, 45, 60, 75)


def load_digits_rot(request: LoadRequest) -> MultiDomainDataset:
    """Rotated digits, following CSAC §4.1's Rotated-MNIST protocol.

    100 images per class are drawn once; domain ``M<a>`` holds the same 1,000 images rotated
    clockwise by ``a`` degrees, a in 0, 15, ..., 75 (Ghifary et al.'s protocol that CSAC follows).
    """
    from scipy.ndimage import rotate

    images, y = _digits(request.image_size)
    (keep,) = _stratified_groups(y, 1, 100, np.random.default_rng(_DIGITS_SEED))
    images, y = images[keep], y[keep]
    domains = []
    for angle in ROTATIONS:
        rotated = rotate(images, -angle, axes=(2, 1), reshape=False, order=1, mode="constant")
        domains.append(Domain(f"M{angle}", _to_uint8(rotated)[:, None], y.copy()))
    return MultiDomainDataset("digits-rot", [str(i) for i in range(10)], domains, (0.5,), (0.5,))


STYLES = ("plain", "colour-inverted", "sketch", "texture")


def _style(name: str, d: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """Render digit intensities ``d`` (n, H, W) in [0, 1] in one style as RGB (n, 3, H, W)."""
    n, h, w = d.shape
    ink_mask = np.repeat(d[:, None], 3, axis=1)
    if name == "plain":
        return ink_mask
    if name == "colour-inverted":
        paper = rng.uniform(0.5, 1.0, size=(n, 3, 1, 1))
        ink = paper * rng.uniform(0.0, 0.4, size=(n, 3, 1, 1))
        return (1 - ink_mask) * paper + ink_mask * ink
    if name == "sketch":
        from scipy.ndimage import sobel

        edges = np.hypot(sobel(d, axis=1), sobel(d, axis=2))
        edges /= edges.reshape(n, -1).max(axis=1).reshape(n, 1, 1) + 1e-8
        strokes = np.clip(0.6 * edges + 0.8 * d, 0, 1)
        return np.repeat(1.0 - strokes[:, None], 3, axis=1)
    if name == "texture":
        yy, xx = np.mgrid[0:h, 0:w] / max(h, w)
        theta = rng.uniform(0, np.pi, size=(n, 1, 1))
        freq = rng.uniform(2.0, 5.0, size=(n, 1, 1))
        phase = rng.uniform(0, 2 * np.pi, size=(n, 1, 1))
        wave = np.cos(theta) * xx + np.sin(theta) * yy
        stripes = 0.5 + 0.5 * np.sin(2 * np.pi * freq * wave + phase)
        background = stripes[:, None] * rng.uniform(0.1, 0.4, size=(n, 3, 1, 1))
        ink = rng.uniform(0.6, 1.0, size=(n, 3, 1, 1))
        return (1 - ink_mask) * background + ink_mask * ink
    raise ValueError(name)


def load_digits_style(request: LoadRequest) -> MultiDomainDataset:
    """Digits in four appearance domains with PACS-like style shift.

    The 1,797 digits are split, class-balanced, into four disjoint quarters (as PACS domains hold
    different images); each quarter is rendered in one style: ``plain`` (white on black),
    ``colour-inverted`` (dark tinted ink on light coloured paper), ``sketch`` (dark edge strokes
    on white) and ``texture`` (bright coloured ink over dim coloured stripes). Calibrated so that
    a centrally trained CNN reaches roughly 50-90 % on each held-out style, as on PACS.
    """
    images, y = _digits(request.image_size)
    rng = np.random.default_rng(_DIGITS_SEED)
    groups = _stratified_groups(y, len(STYLES), None, rng)
    domains = [
        Domain(style, _to_uint8(_style(style, images[idx], rng)), y[idx])
        for style, idx in zip(STYLES, groups, strict=True)
    ]
    return MultiDomainDataset(
        "digits-style", [str(i) for i in range(10)], domains, (0.5,) * 3, (0.5,) * 3
    )


DATASETS.register("digits-rot")(
    DatasetSpec(
        "digits-rot", tuple(f"M{a}" for a in ROTATIONS), DIGITS_DEFAULTS, load_digits_rot,
        "embedded: sklearn digits, 6 rotation domains (CSAC's Rotated-MNIST protocol)",
    )
)
DATASETS.register("digits-style")(
    DatasetSpec(
        "digits-style", STYLES, DIGITS_DEFAULTS, load_digits_style,
        "embedded: sklearn digits, 4 appearance domains with PACS-like style shift",
    )
)


