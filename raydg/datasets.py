"""Multi-domain datasets: the embedded digits benchmarks and DomainBed-layout image folders.

A dataset is a list of domains, each a uint8 image array ``(n, C, H, W)`` with int64 labels.
Images are normalised to model inputs with the dataset's per-channel mean and std
(:func:`to_inputs`), on the client that trains on them.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from raydg.errors import RaydgError
from raydg.registry import Registry

IMAGE_EXTENSIONS = {".jpg", ".jpeg", ".png", ".bmp", ".gif", ".tif", ".tiff"}
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
DATA_ROOT_ENV = "RAYDG_DATA_ROOT"


@dataclass(frozen=True)
class TrainDefaults:
    """A dataset's default protocol; every field can be overridden from the config."""

    rounds: int
    local_steps: int
    lr: float
    momentum: float
    batch_size: int
    model: str
    image_size: int


@dataclass
class Domain:
    name: str
    x: np.ndarray  # uint8 (n, C, H, W)
    y: np.ndarray  # int64 (n,)

    def __len__(self) -> int:
        return len(self.y)


@dataclass
class MultiDomainDataset:
    name: str
    classes: list[str]
    domains: list[Domain]
    mean: tuple[float, ...]
    std: tuple[float, ...]

    @property
    def channels(self) -> int:
        return self.domains[0].x.shape[1]

    def domain(self, name: str) -> Domain:
        for d in self.domains:
            if d.name == name:
                return d
        raise RaydgError(f"unknown domain {name!r} for {self.name}; domains: {self.domain_names}")

    @property
    def domain_names(self) -> list[str]:
        return [d.name for d in self.domains]


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset: how to load it and the protocol its papers use."""

    name: str
    domains: tuple[str, ...]
    defaults: TrainDefaults
    load: Callable[[Path | None, int], MultiDomainDataset]
    description: str
    needs_root: bool = False


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def to_inputs(x: np.ndarray, mean: tuple[float, ...], std: tuple[float, ...]):
    """uint8 ``(n, C, H, W)`` images -> normalised float32 torch tensor."""
    import torch

    t = torch.from_numpy(np.array(x, dtype=np.float32)).div_(255.0)
    m = torch.tensor(mean, dtype=torch.float32).view(1, -1, 1, 1)
    s = torch.tensor(std, dtype=torch.float32).view(1, -1, 1, 1)
    return (t - m) / s


def load_dataset(name: str, data_root: str | None, image_size: int | None) -> MultiDomainDataset:
    spec = DATASETS.get(name)
    root = resolve_root(spec, data_root)
    data = spec.load(root, image_size or spec.defaults.image_size)
    for d in data.domains:
        if len(d) == 0:
            raise RaydgError(f"{spec.name}: domain {d.name!r} has no images")
    return data


def resolve_root(spec: DatasetSpec, data_root: str | None) -> Path | None:
    if not spec.needs_root:
        return None
    root = data_root or os.environ.get(DATA_ROOT_ENV)
    if not root:
        raise RaydgError(
            f"{spec.name} needs its data: pass --data-root DIR or set {DATA_ROOT_ENV}"
        )
    path = Path(root).expanduser()
    if not path.is_dir():
        raise RaydgError(f"data root {str(path)!r} does not exist")
    return path


# --------------------------------------------------------------------------- embedded digits
DIGITS_DEFAULTS = TrainDefaults(
    rounds=10, local_steps=20, lr=0.05, momentum=0.5, batch_size=32, model="cnn", image_size=16
)
_DIGITS_SEED = 20240601  # fixed: the benchmark's images never depend on the run seed


def _digits(size: int) -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled 8x8 digits, bilinearly resized to ``size``, in [0, 1]."""
    import torch
    from sklearn.datasets import load_digits

    bunch = load_digits()
    images = torch.from_numpy(bunch.images.astype(np.float32) / 16.0).unsqueeze(1)
    images = torch.nn.functional.interpolate(
        images, size=(size, size), mode="bilinear", align_corners=False
    )
    return images.squeeze(1).clamp(0, 1).numpy(), bunch.target.astype(np.int64)


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


def load_digits_rot(_root: Path | None, size: int) -> MultiDomainDataset:
    """Rotated digits, following CSAC §4.1's Rotated-MNIST protocol.

    100 images per class are drawn once; domain ``M<a>`` holds the same 1,000 images rotated
    clockwise by ``a`` degrees, a in 0, 15, ..., 75 (Ghifary et al.'s protocol that CSAC follows).
    """
    from scipy.ndimage import rotate

    images, y = _digits(size)
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


def load_digits_style(_root: Path | None, size: int) -> MultiDomainDataset:
    """Digits in four appearance domains with PACS-like style shift.

    The 1,797 digits are split, class-balanced, into four disjoint quarters (as PACS domains hold
    different images); each quarter is rendered in one style: ``plain`` (white on black),
    ``colour-inverted`` (dark tinted ink on light coloured paper), ``sketch`` (dark edge strokes
    on white) and ``texture`` (bright coloured ink over dim coloured stripes). Calibrated so that
    a centrally trained CNN reaches roughly 50-90 % on each held-out style, as on PACS.
    """
    images, y = _digits(size)
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


# --------------------------------------------------------------------------- image folders
PAPER_DEFAULTS = TrainDefaults(
    rounds=40, local_steps=200, lr=0.01, momentum=0.5, batch_size=64, model="resnet18",
    image_size=224,
)  # FedFD-A §4.1


def load_image_folder(root: Path, folder: str, domains: tuple[str, ...], size: int,
                      name: str) -> MultiDomainDataset:
    """Read DomainBed's layout ``ROOT/<folder>/<domain>/<class>/<image>``, resized to ``size``."""
    from PIL import Image, UnidentifiedImageError

    base = root / folder
    missing = [d for d in domains if not (base / d).is_dir()]
    if missing:
        raise RaydgError(f"{name}: missing domain folder(s) {missing} under {base}")
    classes = sorted({c.name for d in domains for c in (base / d).iterdir() if c.is_dir()})
    if not classes:
        raise RaydgError(f"{name}: no class folders under {base}")
    out = []
    for d in domains:
        files = [
            (p, label)
            for label, c in enumerate(classes)
            if (base / d / c).is_dir()
            for p in sorted((base / d / c).iterdir())
            if p.suffix.lower() in IMAGE_EXTENSIONS
        ]
        if not files:
            raise RaydgError(f"{name}: domain {d!r} has no images under {base / d}")
        x = np.empty((len(files), 3, size, size), dtype=np.uint8)
        for i, (path, _) in enumerate(files):
            try:
                with Image.open(path) as img:
                    img = img.convert("RGB").resize((size, size), Image.BILINEAR)
                    x[i] = np.asarray(img).transpose(2, 0, 1)
            except (OSError, UnidentifiedImageError) as err:
                raise RaydgError(f"{name}: cannot read image {path}: {err}") from err
        out.append(Domain(d, x, np.array([label for _, label in files], dtype=np.int64)))
    return MultiDomainDataset(name, classes, out, IMAGENET_MEAN, IMAGENET_STD)


def _register_folder(name: str, folder: str, domains: tuple[str, ...], description: str) -> None:
    def load(root: Path | None, size: int) -> MultiDomainDataset:
        assert root is not None
        return load_image_folder(root, folder, domains, size, name)

    DATASETS.register(name)(
        DatasetSpec(name, domains, PAPER_DEFAULTS, load, description, needs_root=True)
    )


_register_folder("pacs", "PACS", ("art_painting", "cartoon", "photo", "sketch"),
                 "PACS, 7 classes, 4 domains (DomainBed layout; needs --data-root)")
_register_folder("vlcs", "VLCS", ("Caltech101", "LabelMe", "SUN09", "VOC2007"),
                 "VLCS, 5 classes, 4 domains (DomainBed layout; needs --data-root)")
_register_folder("officehome", "office_home", ("Art", "Clipart", "Product", "Real World"),
                 "OfficeHome, 65 classes, 4 domains (DomainBed layout; needs --data-root)")
