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
    MultiDomainDataset,
    TrainDefaults,
)
from raydg.errors import RaydgError

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
