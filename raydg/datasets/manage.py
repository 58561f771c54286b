"""Getting and checking a dataset's files: ``raydg data download`` and ``raydg data check``.

Download: each archive of the dataset's :class:`DataSource` is fetched into
``ROOT/.downloads`` (resumable, verified by size or checksum where they are known), extracted
once into the dataset's folder, renamed into the layout the loader reads, and then checked.
Check: the loader reads every image (unreadable ones are collected, not fatal) and the
per-domain counts are compared with the published ones.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from raydg.datasets import DATASETS, LoadRequest, missing_classes
from raydg.download import extract, fetch
from raydg.errors import RaydgError

Log = Callable[[str], None]
CHECK_SIZE = 32  # images are decoded in full; the resize only bounds memory


def check(name: str, root: Path, log: Log = print) -> list[str]:
    """Every problem with the copy of ``name`` under ``root`` (empty: it is complete)."""
    spec = DATASETS.get(name)
    request = LoadRequest(root, CHECK_SIZE, skip_bad=True, log=lambda _: None)
    try:
        data = spec.load(request)
    except RaydgError as err:  # layout errors name every missing domain or file
        return [str(err)]
    problems = [f"unreadable: {bad}" for _, bad in request.bad_files] + missing_classes(data)
    counts = [len(d) + sum(label == f"{spec.name}/{d.name}" for label, _ in request.bad_files)
              for d in data.domains]
    for d, n, want in zip(data.domains, counts, spec.expected or counts, strict=True):
        if n != want:
            problems.append(f"{spec.name}/{d.name}: {n} images, expected {want}")
        log(f"{spec.name}/{d.name}: {len(d)} readable images")
    return problems


def download(name: str, root: Path, log: Log = print) -> None:
    """Fetch, extract and arrange ``name`` under ``root``, then check it."""
    spec = DATASETS.get(name)
    if not (spec.needs_root or spec.optional_root):
        raise RaydgError(f"{spec.name} is embedded in raydg: there is nothing to download")
    if spec.source is None:
        raise RaydgError(f"{spec.name}: no public download is registered; {spec.description}")
    source, downloads = spec.source, root / ".downloads"
    target = root / source.into
    for archive in source.archives:
        if not source.extract:
            fetch(archive, target, log)
            continue
        path = fetch(archive, downloads, log)
        done = path.with_name(path.name + ".extracted")
        if not done.exists():
            extract(path, target, log)
            done.touch()
    for old, new in source.renames:
        _rename(root / old, root / new, log)
    if source.note:
        log(f"{spec.name}: note: {source.note}")
    problems = check(spec.name, root, log)
    if problems:
        raise RaydgError(f"{spec.name}: downloaded, but {len(problems)} problem(s), the first: "
                         f"{problems[0]}; run raydg data check {spec.name} for all")


def _rename(old: Path, new: Path, log: Log) -> None:
    """Move an extracted folder to the name the loader expects (a present one is kept)."""
    if not old.exists():
        return
    if new.exists():
        raise RaydgError(f"both {old} and {new} exist; remove one and download again")
    shutil.move(str(old), str(new))
    log(f"moved {old} to {new}")
