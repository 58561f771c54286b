"""Image-folder datasets in DomainBed's layout ``ROOT/<folder>/<domain>/<class>/<image>``,
or from a copy of its Hub mirror (Parquet) in ``ROOT/<folder>/hub``
(:mod:`raydg.datasets.hub`) when the domain folders are absent: the same images either way,
each ``provenance`` naming its source and fingerprint."""

from __future__ import annotations

import io
import stat
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

import numpy as np

from raydg.datasets import (
    DATASETS,
    IMAGE_EXTENSIONS,
    IMAGENET_MEAN,
    IMAGENET_STD,
    DatasetSpec,
    DataSource,
    Domain,
    HubMirror,
    LoadRequest,
    MultiDomainDataset,
    TrainDefaults,
    hub,
    images_fingerprint,
)
from raydg.download import Archive, drive_url
from raydg.errors import RaydgError

PAPER_DEFAULTS = TrainDefaults(
    rounds=40, local_steps=200, lr=0.01, momentum=0.5, batch_size=64, model="resnet18",
    image_size=224, pretrained=True,
)  # FedFD-A §4.1 (ImageNet-pretrained ResNet-18)


def read_image(path: Path | IO[bytes], size: int) -> np.ndarray:
    """One image file as uint8 ``(3, size, size)`` RGB, bilinearly resized; raises
    ``OSError`` (or PIL's ``UnidentifiedImageError``) for an unreadable or truncated file."""
    from PIL import Image

    with Image.open(path) as img:
        img = img.convert("RGB").resize((size, size), Image.BILINEAR)
        return np.asarray(img).transpose(2, 0, 1)


SPECIAL_FILES = ((stat.S_ISDIR, "a folder"), (stat.S_ISFIFO, "a FIFO"),
                 (stat.S_ISSOCK, "a socket"), (stat.S_ISCHR, "a character device"),
                 (stat.S_ISBLK, "a block device"))
SKIP_HINT = "(pass --skip-bad-images to skip unreadable files)"


def check_regular(path: Path) -> None:
    """Raise ``OSError`` unless ``path`` is a regular file, or a link to one, without opening
    it: a FIFO would block its reader forever; a link loop raises here too."""
    mode = path.stat().st_mode
    kind = next((name for test, name in SPECIAL_FILES if test(mode)), None)
    if kind is not None:
        raise OSError(f"not a regular file but {kind}")


def _why(err: OSError) -> str:
    """``err`` without the file name that the message around it says already."""
    return err.strerror if err.strerror and err.filename else str(err)


def _bad(request: LoadRequest, name: str, what: str, path: object, err: OSError) -> None:
    """An unreadable ``what`` (image, folder) of domain ``name``: an error, or with
    ``request.skip_bad`` recorded in ``request.bad_files``."""
    if not request.skip_bad:
        raise RaydgError(f"{name}: cannot read {what} {path}: {_why(err)} {SKIP_HINT}")
    request.bad_files.append((name, f"{path}: {_why(err)}"))


def _bad_folder(request: LoadRequest, name: str, folder: Path, err: OSError) -> None:
    """A folder of domain ``name`` that cannot be listed: :func:`_bad`, and said when
    skipped."""
    _bad(request, name, "folder", folder, err)
    request.log(f"{name}: skipped the unreadable folder {folder}: {_why(err)}")


def _regular(path: Path) -> Path:
    check_regular(path)
    return path


def read_images(paths: Sequence[Any], request: LoadRequest, name: str,
                opener: Callable[[Any], Path | IO[bytes]] = _regular
                ) -> tuple[np.ndarray, list[int]]:
    """Decode and resize every file of domain ``name`` (``<dataset>/<domain>``), each opened
    by ``opener`` (default: a regular file's path); return the images and the indices of the
    files read.

    An unreadable file (a link loop, a FIFO or other special file, a broken image) is an error
    naming it, or with ``request.skip_bad`` skipped and counted.
    """
    size = request.image_size
    x = np.empty((len(paths), 3, size, size), dtype=np.uint8)
    kept: list[int] = []
    for i, path in enumerate(paths):
        try:
            x[len(kept)] = read_image(opener(path), size)
            kept.append(i)
        except OSError as err:  # PIL's UnidentifiedImageError is an OSError
            _bad(request, name, "image", path, err)
    if len(kept) < len(paths):
        request.log(f"{name}: skipped {len(paths) - len(kept)} unreadable image(s) of "
                    f"{len(paths)}")
    return x[:len(kept)], kept


def _is_dir(path: Path) -> bool:
    """Whether ``path`` is a folder or a link to one (False for a link loop, whatever the
    error)."""
    try:
        return stat.S_ISDIR(path.stat().st_mode)
    except OSError:
        return False


def subfolders(folder: Path, request: LoadRequest, name: str) -> list[Path]:
    """The folders in ``folder``, sorted; an unreadable ``folder`` is an error naming it, or
    with ``request.skip_bad`` skipped (and counted) as empty."""
    try:
        return sorted(p for p in folder.iterdir() if _is_dir(p))
    except OSError as err:
        _bad_folder(request, name, folder, err)
        return []


def class_files(folders: list[Path], classes: dict[str, int], key: Callable[[str], str],
                request: LoadRequest, name: str) -> tuple[list[Path], list[int]]:
    """The image files in the class ``folders`` whose ``key(folder name)`` is one of
    ``classes``, with its index, in sorted order; unreadable folders as :func:`subfolders`."""
    files = []
    for c in folders:
        if key(c.name) not in classes:
            continue
        try:
            files += [(p, classes[key(c.name)]) for p in sorted(c.iterdir())
                      if p.suffix.lower() in IMAGE_EXTENSIONS]
        except OSError as err:
            _bad_folder(request, name, c, err)
    return [p for p, _ in files], [label for _, label in files]


def load_folders(request: LoadRequest, name: str, domains: dict[str, str],
                 key: Callable[[str], str] | None = None) -> MultiDomainDataset:
    """Domains from ``ROOT/<domains[d]>/<class>/<image>``. Every domain must have the same
    class folders; with ``key`` (a merged dataset) the classes are instead those that every
    domain has, compared by ``key(folder name)``."""
    assert request.root is not None
    folders = {d: request.root / rel for d, rel in domains.items()}
    missing = [str(f) for f in folders.values() if not f.is_dir()]
    if missing:
        raise RaydgError(f"{name}: missing domain folder(s) {missing}")
    listed = {d: subfolders(f, request, f"{name}/{d}") for d, f in folders.items()}
    per_domain = {d: {(key or str)(c.name) for c in listed[d]} for d in folders}
    common = sorted(set.intersection(*per_domain.values()))
    every = set.union(*per_domain.values())
    if key is None and common and len(common) < len(every):
        lacking = {d: sorted(every - have) for d, have in per_domain.items() if have != every}
        raise RaydgError(f"{name}: class folders missing: {lacking}")
    if not common:
        raise RaydgError(f"{name}: no class folders common to {sorted(map(str, folders.values()))}")
    index = {c: i for i, c in enumerate(common)}
    out = []
    for d, folder in folders.items():
        paths, labels = class_files(listed[d], index, key or str, request, f"{name}/{d}")
        if not paths:
            raise RaydgError(f"{name}: domain {d!r} has no images under {folder}")
        x, kept = read_images(paths, request, f"{name}/{d}")
        out.append(Domain(d, x, np.asarray(labels, dtype=np.int64)[kept]))
    return MultiDomainDataset(name, common, out, IMAGENET_MEAN, IMAGENET_STD)


def load_hub(request: LoadRequest, name: str, base: Path,
             domains: tuple[str, ...]) -> MultiDomainDataset:
    """Domains from the Hub copy in ``base/hub``, as :func:`load_folders` gives them from the
    same images: classes sorted by name, each domain's images by class, then file name, decoded
    by :func:`read_image`."""
    folder = base / hub.FOLDER
    record = hub.read_record(folder)
    assert record is not None
    names = hub.classes(folder, record)
    classes = sorted(names)
    index = {i: classes.index(c) for i, c in enumerate(names)}
    out = []
    for d in domains:
        found = hub.images(folder, record, d)
        if not found:
            raise RaydgError(f"{name}: domain {d!r} has no images in {record.source}")
        if bad := next((im for im in found if im.label not in index), None):
            raise RaydgError(f"{name}: {bad} has label {bad.label!r}, not one of the "
                             f"{len(names)} classes")
        found.sort(key=lambda im: (index[im.label], im.name))
        x, kept = read_images(found, request, f"{name}/{d}", lambda im: io.BytesIO(im.data))
        y = np.asarray([index[im.label] for im in found], dtype=np.int64)[kept]
        out.append(Domain(d, x, y))
    return _traced(MultiDomainDataset(name, classes, out, IMAGENET_MEAN, IMAGENET_STD),
                   record.source)


def _traced(data: MultiDomainDataset, source: str) -> MultiDomainDataset:
    """``data`` with its provenance: ``source`` and the images' fingerprint."""
    data.provenance = {"source": source, "fingerprint": images_fingerprint(data)}
    return data


def _register(name: str, folder: str, domains: dict[str, str], description: str,
              key: Callable[[str], str] | None = None, source: DataSource | None = None,
              expected: tuple[int, ...] | None = None,
              defaults: TrainDefaults = PAPER_DEFAULTS) -> DatasetSpec:
    def load(request: LoadRequest) -> MultiDomainDataset:
        assert request.root is not None
        base = request.root / folder
        if hub.in_use(base, tuple(domains)):
            return load_hub(request, name, base, tuple(domains))
        return _traced(load_folders(request, name, domains, key), f"original:{base}")

    return DATASETS.register(name)(
        DatasetSpec(name, tuple(domains), defaults, load, description, needs_root=True,
                    folder=folder, source=source, expected=expected)
    )


def domainbed(name: str, folder: str, domains: tuple[str, ...], description: str,
              source: DataSource | None = None, expected: tuple[int, ...] | None = None,
              defaults: TrainDefaults = PAPER_DEFAULTS) -> DatasetSpec:
    """Register the dataset ``name`` in DomainBed's layout ``ROOT/<folder>/<domain>/<class>/``
    (ROOT: the data root), trained by default with ``defaults`` (FedFD-A's protocol). Also
    the way a plugin adds a folder of images (examples/folder_dataset)."""
    return _register(name, folder, {d: f"{folder}/{d}" for d in domains}, description,
                     source=source, expected=expected, defaults=defaults)


# Sources and counts: the Hub mirrors that the FL community uses (Parquet at a pinned
# revision; listing, sizes and sha256 from the Hub's tree API, recorded at the first
# download), then DomainBed's downloads (Google Drive files; their archives' checksums are
# not published, so the per-domain image counts are what verifies them).
# flwrlabs/pacs: the commit of its dataset card (features image, domain, label with names
# dog..person; 9,991 images; download_size 191,395,900 bytes: the sum of data/train-*).
PACS_MIRROR = HubMirror("flwrlabs/pacs", "9c6f80edcd5320a55a39b1e84120dcfa25c8ce9b",
                        total_size=191_395_900)
# flwrlabs/office-home: no commit is pinned here; main is resolved at the first download and
# recorded; its layout (assumed PACS's) and domain names are checked then (hub.class_names).
OFFICE_HOME_MIRROR = HubMirror("flwrlabs/office-home", "main")
domainbed("pacs", "PACS", ("art_painting", "cartoon", "photo", "sketch"),
           "PACS, 7 classes, 4 domains (DomainBed layout; needs --data-root)",
           DataSource((Archive(drive_url("1JFr8f805nMUelQWWmfnJR3y4_SYoN5Pd"), "PACS.zip"),),
                      renames=(("kfold", "PACS"),), mirror=PACS_MIRROR),
           (2048, 2344, 1670, 3929))
domainbed("vlcs", "VLCS", ("Caltech101", "LabelMe", "SUN09", "VOC2007"),
           "VLCS, 5 classes, 4 domains (DomainBed layout; needs --data-root)",
           DataSource((Archive(drive_url("1skwblH1_okBwxWxmRsp9_qi15hyPpxg8"), "VLCS.tar.gz"),)),
           (1415, 2656, 3282, 3376))
domainbed("officehome", "office_home", ("Art", "Clipart", "Product", "Real World"),
           "OfficeHome, 65 classes, 4 domains (DomainBed layout; needs --data-root)",
           DataSource((Archive(drive_url("1uY0pj7oFsjMxRwaD3Sxy0jgel0fsYXLC"),
                               "office_home.zip"),),
                      renames=(("OfficeHomeDataset_10072016", "office_home"),),
                      mirror=OFFICE_HOME_MIRROR),
           (2427, 4365, 4439, 4357))
_DOMAINNET_URL = "http://csr.bu.edu/ftp/visda/2019/multi-source/"
domainbed("domainnet", "domain_net",
           ("clipart", "infograph", "painting", "quickdraw", "real", "sketch"),
           "DomainNet, 345 classes, 6 domains (DomainBed layout; needs --data-root; decoded "
           "into memory: ~0.6 M images, use a small --image-size or a large machine)",
           DataSource(tuple(Archive(f"{_DOMAINNET_URL}{sub}{d}.zip", f"{d}.zip") for d, sub in (
               ("clipart", "groundtruth/"), ("infograph", ""), ("painting", "groundtruth/"),
               ("quickdraw", ""), ("real", ""), ("sketch", ""))), into="domain_net",
               note="DomainBed's list of duplicate images is not removed"))

OFFICE_CALTECH_ALIASES = {"back_pack": "backpack", "laptop_computer": "laptop"}


def office_class(folder: str) -> str:
    """One name for a class in Office-Caltech10 (``back_pack``) and OfficeHome (``Backpack``)."""
    name = folder.lower().replace(" ", "_")
    return OFFICE_CALTECH_ALIASES.get(name, name)


_register("office-caltech-home", "", {
    "Amazon": "office_caltech_10/amazon", "Webcam": "office_caltech_10/webcam",
    "Caltech": "office_caltech_10/caltech", **{d: f"office_home/{d}" for d in (
        "Art", "Clipart", "Product", "Real World")}},
    "Office-Caltech-Home (CSAC §4.1): the classes common to Office-Caltech10 and OfficeHome, "
    "7 domains, DSLR dropped (needs --data-root with office_caltech_10/ and office_home/)",
    key=office_class)
