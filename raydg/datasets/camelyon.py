"""Camelyon17 (WILDS v1.0 release): 96x96 histology patches from five hospitals, tumor or not.

Layout: ``ROOT/camelyon17_v1.0/metadata.csv`` and ``ROOT/camelyon17_v1.0/patches/
patient_PPP_node_N/patch_patient_PPP_node_N_x_X_y_Y.png``. Each hospital (the ``center`` column)
is one domain; the label is the ``tumor`` column. WILDS' own ``split`` column is not used: raydg
splits each source client itself (the papers use 80/20, i.e. ``val_fraction: 0.2``).
"""

from __future__ import annotations

import csv
from pathlib import Path

import numpy as np

from raydg.datasets import (
    DATASETS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    DatasetSpec,
    DataSource,
    Domain,
    LoadRequest,
    MultiDomainDataset,
    TrainDefaults,
)
from raydg.datasets.folders import read_images
from raydg.download import Archive
from raydg.errors import RaydgError

FOLDER = "camelyon17_v1.0"
HOSPITALS = tuple(f"hospital{c}" for c in range(5))
CLASSES = ["normal", "tumor"]
COLUMNS = ("patient", "node", "x_coord", "y_coord", "tumor", "center")
SMALL_CAP = 2000  # camelyon17-small: patches per hospital
SOURCE = DataSource((Archive(  # the WILDS v1.0 release, as the wilds package downloads it
    "https://worksheets.codalab.org/rest/bundles/0xe45e15f39fb54e9d9e919556af67aabe/contents/"
    "blob/", "archive.tar.gz", size=10_658_709_504),), into=FOLDER)
COUNTS = (59_436, 34_904, 85_054, 129_838, 146_722)  # patches per hospital (WILDS v1.0)
CAMELYON_SEED = 20240603  # fixed: the capped subset never depends on the run seed

# gPerXAN §4 "Implementation Details": Camelyon17 "images are resized to 96x96 pixels, and
# DenseNet-121 ... is used", "SGD optimizer with a learning rate of 2e-3 for 100 communication
# rounds (i.e. T = 100) with one local update epoch"; CCST §4 likewise trains Camelyon17 for
# "100 communication rounds" with one local epoch (lr 1e-3) and DenseNet121. raydg has no
# DenseNet-121, so ResNet-50 (gPerXAN's backbone for PACS/Office-Home) stands in. Momentum 0.9
# and batch 32 are gPerXAN's released code (the paper gives neither; CCST's M = dataset_size/32
# also implies batch 32). One epoch: 455,964 patches (gPerXAN §4) / 5 hospitals x 80 % train
# / 32 = 2,280 steps; for camelyon17-small 2,000 x 80 % / 32 = 50 steps.
CAMELYON_DEFAULTS = TrainDefaults(
    rounds=100, local_steps=2280, lr=0.002, momentum=0.9, batch_size=32, model="resnet50",
    image_size=96,
)
SMALL_DEFAULTS = TrainDefaults(
    rounds=100, local_steps=50, lr=0.002, momentum=0.9, batch_size=32, model="resnet50",
    image_size=96,
)


def patch_path(patient: int, node: int, x: int, y: int) -> str:
    """A patch's path relative to the dataset folder (WILDS' naming)."""
    slide = f"patient_{patient:03d}_node_{node}"
    return f"patches/{slide}/patch_{slide}_x_{x}_y_{y}.png"


def _row_values(row: dict[str, str], path: Path, line: int) -> list[int]:
    try:
        return [int(float(row[c])) for c in COLUMNS]
    except (TypeError, ValueError):
        raise RaydgError(f"camelyon17: bad value on line {line} of {path}: "
                         f"{[row.get(c) for c in COLUMNS]}") from None


def read_metadata(path: Path) -> tuple[list[str], np.ndarray, np.ndarray]:
    """Patch paths (relative), labels and hospital indices from WILDS' ``metadata.csv``."""
    if not path.is_file():
        raise RaydgError(f"camelyon17: missing {path} (expected WILDS' Camelyon17 v1.0 layout "
                         f"ROOT/{FOLDER}/metadata.csv and patches/)")
    paths, labels, centers = [], [], []
    with path.open(newline="") as f:
        reader = csv.DictReader(f)
        missing = [c for c in COLUMNS if c not in (reader.fieldnames or [])]
        if missing:
            raise RaydgError(f"camelyon17: {path} lacks column(s) {missing}")
        for line, row in enumerate(reader, start=2):
            patient, node, x, y, tumor, center = _row_values(row, path, line)
            if tumor not in (0, 1) or not 0 <= center < len(HOSPITALS):
                raise RaydgError(f"camelyon17: line {line} of {path}: tumor must be 0/1 and "
                                 f"center 0-4, got tumor={tumor} center={center}")
            paths.append(patch_path(patient, node, x, y))
            labels.append(tumor)
            centers.append(center)
    return paths, np.asarray(labels, dtype=np.int64), np.asarray(centers, dtype=np.int64)


def stratified_cap(y: np.ndarray, cap: int, rng: np.random.Generator) -> np.ndarray:
    """Sorted indices of at most ``cap`` samples, each class keeping its share of ``y``
    (largest-remainder rounding), drawn at random within each class."""
    if cap >= len(y):
        return np.arange(len(y))
    classes, counts = np.unique(y, return_counts=True)
    share = cap * counts / len(y)
    quota = np.floor(share).astype(int)
    quota[np.argsort(quota - share)[: cap - quota.sum()]] += 1  # largest remainders first
    picked = [rng.permutation(np.flatnonzero(y == c))[:q]
              for c, q in zip(classes, quota, strict=True)]
    return np.sort(np.concatenate(picked))


def load_camelyon17(request: LoadRequest, max_per_domain: int | None = None,
                    name: str = "camelyon17", seed: int = CAMELYON_SEED) -> MultiDomainDataset:
    """Camelyon17's five hospitals as domains (CCST §4, gPerXAN §4), optionally capped at
    ``max_per_domain`` patches per hospital (class-stratified, drawn with the fixed ``seed``).

    The full release is 455,954 patches, about 12.6 GB as uint8 at 96x96.
    """
    assert request.root is not None
    base = request.root / FOLDER
    paths, labels, centers = read_metadata(base / "metadata.csv")
    domains = []
    for c, hospital in enumerate(HOSPITALS):
        idx = np.flatnonzero(centers == c)
        if len(idx) == 0:
            raise RaydgError(f"{name}: {base / 'metadata.csv'} lists no patches of {hospital} "
                             f"(center {c})")
        if max_per_domain is not None:
            idx = idx[stratified_cap(labels[idx], max_per_domain, np.random.default_rng([seed, c]))]
        x, kept = read_images([base / paths[i] for i in idx], request, f"{name}/{hospital}")
        domains.append(Domain(hospital, x, labels[idx][kept]))
    return MultiDomainDataset(name, list(CLASSES), domains, IMAGENET_MEAN, IMAGENET_STD)


def load_camelyon17_small(request: LoadRequest) -> MultiDomainDataset:
    """Camelyon17 capped at 2,000 patches per hospital for laptops."""
    return load_camelyon17(request, SMALL_CAP, "camelyon17-small")


DATASETS.register("camelyon17")(
    DatasetSpec(
        "camelyon17", HOSPITALS, CAMELYON_DEFAULTS, load_camelyon17,
        "Camelyon17 (WILDS v1.0), 2 classes, 5 hospitals, all 455,954 patches (~12.6 GB in "
        f"memory); needs --data-root with {FOLDER}/metadata.csv and patches/",
        needs_root=True, folder=FOLDER, source=SOURCE, expected=COUNTS,
    )
)
DATASETS.register("camelyon17-small")(
    DatasetSpec(
        "camelyon17-small", HOSPITALS, SMALL_DEFAULTS, load_camelyon17_small,
        f"Camelyon17 capped at {SMALL_CAP:,} patches per hospital (class-stratified, fixed "
        f"seed) for laptops; needs --data-root with {FOLDER}/metadata.csv and patches/",
        needs_root=True, folder=FOLDER, source=SOURCE, expected=(SMALL_CAP,) * len(HOSPITALS),
    )
)
