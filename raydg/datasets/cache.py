"""Decode once: file-based datasets are cached as uint8 ``.npy`` arrays, memory-mapped on reuse.

One cache entry per (dataset, image size, skip setting, source files): the key hashes the
relative path, size and modification time of every file under the dataset's folder, so
adding, removing or changing a file makes a new entry. Entries are written to a temporary
folder and renamed into place, so an interrupted write never leaves a half entry.
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import tempfile
from pathlib import Path

import numpy as np

from raydg.datasets import Domain, LoadRequest, MultiDomainDataset

CACHE_ENV = "RAYDG_CACHE"


def cache_root(configured: str | None) -> Path:
    """``configured``, else ``$RAYDG_CACHE``, else ``~/.cache/raydg``."""
    return Path(configured or os.environ.get(CACHE_ENV) or "~/.cache/raydg").expanduser()


def fingerprint(name: str, request: LoadRequest, source: Path) -> str:
    """A key for the dataset as loaded from the files under ``source``. Nothing is opened,
    and what the loader names or skips (a link loop, an unreadable folder, a FIFO) changes
    the key as a file does, without an error here."""
    h = hashlib.sha256(json.dumps([name, request.image_size, request.skip_bad,
                                   str(source.resolve())]).encode())
    for dirpath, dirnames, filenames in os.walk(source):  # unreadable folders: left out
        dirnames.sort()
        for f in sorted(filenames):
            p = Path(dirpath) / f
            try:
                st = p.stat()
                state = f"{st.st_size}\0{st.st_mtime_ns}"
            except OSError as err:  # a link loop or a dangling link
                state = f"error {err.errno}"
            h.update(f"{p.relative_to(source)}\0{state}\n".encode())
    return f"{name}-{request.image_size}-{h.hexdigest()[:16]}"


def load(entry: Path) -> MultiDomainDataset | None:
    """The cached dataset (arrays memory-mapped, read-only), or None if there is no entry."""
    meta_file = entry / "meta.json"
    if not meta_file.is_file():
        return None
    meta = json.loads(meta_file.read_text())
    domains = [Domain(d, np.load(entry / f"{i}_x.npy", mmap_mode="r"),
                      np.load(entry / f"{i}_y.npy")) for i, d in enumerate(meta["domains"])]
    return MultiDomainDataset(meta["name"], meta["classes"], domains, tuple(meta["mean"]),
                              tuple(meta["std"]), meta.get("provenance", {}))


def _remove_orphans(folder: Path) -> None:
    """Temporary folders of writers that were killed (their pid is in the name)."""
    import psutil

    for tmp in folder.glob(".writing-*-*"):
        pid = tmp.name.split("-")[1]
        if pid.isdigit() and not psutil.pid_exists(int(pid)):
            shutil.rmtree(tmp, ignore_errors=True)


def store(entry: Path, data: MultiDomainDataset) -> None:
    """Write ``data`` as a cache entry (atomically: a temporary folder renamed into place).
    An interrupted write removes its folder; one killed outright is removed by the next."""
    entry.parent.mkdir(parents=True, exist_ok=True)
    _remove_orphans(entry.parent)
    tmp = Path(tempfile.mkdtemp(dir=entry.parent, prefix=f".writing-{os.getpid()}-"))
    try:
        for i, d in enumerate(data.domains):
            np.save(tmp / f"{i}_x.npy", np.ascontiguousarray(d.x))
            np.save(tmp / f"{i}_y.npy", d.y)
        meta = {"name": data.name, "classes": data.classes, "mean": list(data.mean),
                "std": list(data.std), "domains": data.domain_names,
                "provenance": data.provenance}
        (tmp / "meta.json").write_text(json.dumps(meta))
        tmp.rename(entry)
    except BaseException as err:  # Ctrl-C included: never leave the temporary folder
        shutil.rmtree(tmp, ignore_errors=True)
        if not isinstance(err, OSError) or not (entry / "meta.json").is_file():
            raise  # (an OSError after a concurrent writer won the rename is no error)
