"""Image-folder datasets in DomainBed's layout ``ROOT/<folder>/<domain>/<class>/<image>``."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from raydg.datasets import (
    DATASETS,
    IMAGE_EXTENSIONS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    DatasetSpec,
    Domain,
    LoadRequest,
    MultiDomainDataset,
    TrainDefaults,
)
from raydg.errors import RaydgError

PAPER_DEFAULTS = TrainDefaults(
    rounds=40, local_steps=200, lr=0.01, momentum=0.5, batch_size=64, model="resnet18",
    image_size=224, pretrained=True,
)  # FedFD-A §4.1 (ImageNet-pretrained ResNet-18)


def read_image(path: Path, size: int) -> np.ndarray:
    """One image file as uint8 ``(3, size, size)`` RGB, bilinearly resized; raises
    ``OSError`` (or PIL's ``UnidentifiedImageError``) for an unreadable or truncated file."""
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB").resize((size, size), Image.BILINEAR)
        return np.asarray(img).transpose(2, 0, 1)


def read_images(paths: list[Path], request: LoadRequest, name: str) -> tuple[np.ndarray,
                                                                               list[int]]:
    """Decode and resize every file; return the images and the indices of the files read.

    An unreadable file is an error naming it, or with ``request.skip_bad`` skipped and counted.
    """
    size = request.image_size
    x = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    kept: list[int] = []
    for i, path in enumerate(paths):
        try:
            x[len(kept)] = read_image(path, size)
            kept.append(i)
        except OSError as err:  # PIL's UnidentifiedImageError is an OSError
            if not request.skip_bad:
                raise RaydgError(f"{name}: cannot read image {path}: {err} (pass "
                                 "--skip-bad-images to skip unreadable files)") from None
    if len(kept) < len(paths):
        request.log(f"{name}: skipped {len(paths) - len(kept)} unreadable image(s) of "
                    f"{len(paths)}")
    return x[:len(kept)], kept


def class_files(folder: Path, classes: list[str]) -> tuple[list[Path], list[int]]:
    """The image files under ``folder/<class>/`` with their class indices, in sorted order."""
    files = [(p, label) for label, c in enumerate(classes) if (folder / c).is_dir()
             for p in sorted((folder / c).iterdir()) if p.suffix.lower() in IMAGE_EXTENSIONS]
    return [p for p, _ in files], [label for _, label in files]


def load_image_folder(request: LoadRequest, folder: str, domains: tuple[str, ...],
                      name: str) -> MultiDomainDataset:
    """Read DomainBed's layout ``ROOT/<folder>/<domain>/<class>/<image>``."""
    assert request.root is not None
    base = request.root / folder
    missing = [d for d in domains if not (base / d).is_dir()]
    if missing:
        raise RaydgError(f"{name}: missing domain folder(s) {missing} under {base}")
    classes = sorted({c.name for d in domains for c in (base / d).iterdir() if c.is_dir()})
    if not classes:
        raise RaydgError(f"{name}: no class folders under {base}")
    out = []
    for d in domains:
        paths, labels = class_files(base / d, classes)
        if not paths:
            raise RaydgError(f"{name}: domain {d!r} has no images under {base / d}")
        x, kept = read_images(paths, request, f"{name}/{d}")
        out.append(Domain(d, x, np.asarray(labels, dtype=np.int64)[kept]))
    return MultiDomainDataset(name, classes, out, IMAGENET_MEAN, IMAGENET_STD)


def _register_folder(name: str, folder: str, domains: tuple[str, ...], description: str) -> None:
    def load(request: LoadRequest) -> MultiDomainDataset:
        return load_image_folder(request, folder, domains, name)

    DATASETS.register(name)(
        DatasetSpec(name, domains, PAPER_DEFAULTS, load, description, needs_root=True,
                    folder=folder)
    )


_register_folder("pacs", "PACS", ("art_painting", "cartoon", "photo", "sketch"),
                 "PACS, 7 classes, 4 domains (DomainBed layout; needs --data-root)")
_register_folder("vlcs", "VLCS", ("Caltech101", "LabelMe", "SUN09", "VOC2007"),
                 "VLCS, 5 classes, 4 domains (DomainBed layout; needs --data-root)")
_register_folder("officehome", "office_home", ("Art", "Clipart", "Product", "Real World"),
                 "OfficeHome, 65 classes, 4 domains (DomainBed layout; needs --data-root)")
