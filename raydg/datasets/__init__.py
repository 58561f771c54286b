"""Multi-domain datasets: one registry, one module per family of datasets.

A dataset is a list of domains, each a uint8 image array ``(n, C, H, W)`` with int64 labels.
Images are normalised to model inputs with the dataset's per-channel mean and std
(:func:`to_inputs`), on the client that trains on them. Every module of this package registers
its datasets on import (``digits``: the embedded benchmarks; ``folders``: DomainBed layouts).
"""

from __future__ import annotations

import hashlib
import importlib
import json
import os
import pkgutil
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from raydg.download import Archive
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
    pretrained: bool = False  # start the backbone from ImageNet weights (where it has them)
    val_every: int = 20  # client-side validation: every 20 of 200 local steps (FedFD-A §4.1)


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
    # where the images came from, printed and logged to MLflow (e.g. source, fingerprint)
    provenance: dict[str, str] = field(default_factory=dict)

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
class LoadRequest:
    """What a dataset loader is asked for."""

    root: Path | None  # the data root (None for embedded datasets)
    image_size: int
    skip_bad: bool = False  # skip unreadable images (and report how many) instead of failing
    log: Callable[[str], None] = print
    # filled with what was skipped: ("<dataset>/<domain>", "<file>: <why>")
    bad_files: list[tuple[str, str]] = field(default_factory=list)


@dataclass(frozen=True)
class HubMirror:
    """A copy of a dataset as Parquet files on the Hugging Face Hub (:mod:`raydg.datasets.hub`),
    laid out as flwrlabs' mirrors: columns ``image`` ({bytes, path}), ``domain`` (the domain's
    name) and ``label`` (a class label whose names are the class folders' names)."""

    repo: str  # the dataset repository, e.g. flwrlabs/pacs
    revision: str  # a commit; a branch is resolved to its commit at the first download
    pattern: str = "data/train-*"  # the Parquet files (the dataset card's data_files path)
    total_size: int | None = None  # bytes of those files (the card's download_size), checked


@dataclass(frozen=True)
class DataSource:
    """Where a dataset's files come from (``raydg data download``) and where they go."""

    archives: tuple[Archive, ...]  # the original source
    into: str = ""  # the folder under the data root that receives them
    extract: bool = True  # unpack each archive there (else keep the files as they are)
    renames: tuple[tuple[str, str], ...] = ()  # (from, to) under the root, after extraction
    note: str = ""  # what differs from the canonical preparation, if anything
    mirror: HubMirror | None = None  # tried before the archives, where there is one


@dataclass(frozen=True)
class DatasetSpec:
    """A registered dataset: how to load it and the protocol its papers use."""

    name: str
    domains: tuple[str, ...]
    defaults: TrainDefaults
    load: Callable[[LoadRequest], MultiDomainDataset]
    description: str
    needs_root: bool = False
    optional_root: bool = False  # reads a data root when one is given, else data it ships
    folder: str = ""  # the dataset's folder under the data root (what the cache key covers)
    source: DataSource | None = None  # None: no public download is known
    expected: tuple[int, ...] | None = None  # images per domain, checked by ``raydg data check``
    # method name -> options it starts from here, where its paper's value does not train on
    # this dataset (chosen by training-domain validation; tables label them: not the paper's)
    method_options: Mapping[str, Mapping[str, Any]] = field(default_factory=dict)


DATASETS: Registry[DatasetSpec] = Registry("dataset")


def to_inputs(x, mean, std, device=None):
    """uint8 ``(n, C, H, W)`` images (numpy or torch) -> normalised float32 tensor on
    ``device`` (default: where ``x`` is); the uint8 images are moved, then converted there.
    ``mean`` and ``std``: per channel, floats or float32 tensors (used as they are when already
    on that device)."""
    import torch

    t = x if isinstance(x, torch.Tensor) else torch.from_numpy(np.array(x, dtype=np.uint8))
    t = t.to(device or t.device, non_blocking=True).float().div_(255.0)
    m = torch.as_tensor(mean, dtype=torch.float32, device=t.device).view(1, -1, 1, 1)
    s = torch.as_tensor(std, dtype=torch.float32, device=t.device).view(1, -1, 1, 1)
    return (t - m) / s


def load_dataset(name: str, data_root: str | None, image_size: int | None,
                 skip_bad: bool = False, log: Callable[[str], None] = print,
                 cache: Path | None = None) -> MultiDomainDataset:
    """Load a registered dataset; a file-based one is decoded once into ``cache`` (a folder;
    None: no cache) and memory-mapped from there afterwards."""
    from raydg.datasets import cache as cache_mod

    spec = DATASETS.get(name)
    root = resolve_root(spec, data_root)
    request = LoadRequest(root, image_size or spec.defaults.image_size, skip_bad, log)
    entry = None
    if cache is not None and root is not None and (root / spec.folder).is_dir():
        entry = cache / cache_mod.fingerprint(spec.name, request, root / spec.folder)
        data = cache_mod.load(entry)
        if data is not None:
            log(f"{spec.name}: decoded images from the cache {entry}")
            return data
    data = spec.load(request)
    for d in data.domains:
        if len(d) == 0:
            raise RaydgError(f"{spec.name}: domain {d.name!r} has no images")
    problems = missing_classes(data)
    if problems:  # a class absent from a domain would silently shrink the task there
        raise RaydgError(problems[0])
    if entry is not None:
        cache_mod.store(entry, data)
        log(f"{spec.name}: cached the decoded images in {entry}")
    return data


@dataclass(frozen=True)
class DataSpec:
    """Which data an experiment loads, as its planning step resolved it: the dataset's name,
    its data root (None: ``$RAYDG_DATA_ROOT``, or none for an embedded dataset), the image
    size (None: the dataset's default), whether unreadable images are skipped, and the folder
    that image files are decoded into once (None: no cache)."""

    dataset: str
    root: str | None = None
    image_size: int | None = None
    skip_bad_images: bool = False
    cache: str | None = None

    @property
    def shipped(self) -> bool:
        """Whether it ships with raydg (small, made in memory) rather than read from a root."""
        return resolve_root(DATASETS.get(self.dataset), self.root) is None

    def load(self, log: Callable[[str], None] = print) -> MultiDomainDataset:
        """The data (:func:`load_dataset`), its provenance said."""
        log(f"raydg: loading {self.dataset}")
        data = load_dataset(self.dataset, self.root, self.image_size, self.skip_bad_images, log,
                            None if self.cache is None else Path(self.cache))
        for key, value in data.provenance.items():
            log(f"raydg: {data.name} {key}: {value}")
        return data


def images_fingerprint(data: MultiDomainDataset) -> str:
    """SHA-256 (first 16 hex digits) of the classes, and of every domain's name, uint8 images
    and int64 labels, in order: equal for the same images, whatever source they came from."""
    h = hashlib.sha256(json.dumps(data.classes).encode())
    for d in data.domains:
        h.update(d.name.encode() + b"\0")
        h.update(memoryview(np.ascontiguousarray(d.x, dtype=np.uint8)))
        h.update(memoryview(np.ascontiguousarray(d.y, dtype=np.int64)))
    return h.hexdigest()[:16]


def missing_classes(data: MultiDomainDataset) -> list[str]:
    """One line per domain that has no image of some class."""
    out = []
    for d in data.domains:
        absent = sorted(set(range(len(data.classes))) - {int(c) for c in np.unique(d.y)})
        if absent:
            out.append(f"{data.name}: domain {d.name!r} has no images of class(es) "
                       f"{[data.classes[c] for c in absent]}")
    return out


def resolve_root(spec: DatasetSpec, data_root: str | None) -> Path | None:
    """The data root (``data_root``, else ``$RAYDG_DATA_ROOT``): None for an embedded dataset,
    and for one with an optional root when none is given."""
    if not (spec.needs_root or spec.optional_root):
        return None
    root = data_root or os.environ.get(DATA_ROOT_ENV)
    if not root and spec.optional_root:
        return None
    if not root:
        raise RaydgError(
            f"{spec.name} needs its data: pass --data-root DIR or set {DATA_ROOT_ENV}"
        )
    path = Path(root).expanduser()
    if not path.is_dir():
        raise RaydgError(f"data root {str(path)!r} does not exist")
    return path


for _module in pkgutil.iter_modules(__path__):
    importlib.import_module(f"{__name__}.{_module.name}")
