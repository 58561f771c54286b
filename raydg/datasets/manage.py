"""Getting and checking a dataset's files: ``raydg data download`` and ``raydg data check``.

Download: sources in order, each tried when the one before it fails: the dataset's Hub mirror
(:mod:`raydg.datasets.hub`: Parquet files at a pinned revision into ``ROOT/<folder>/hub``),
then the original one: each archive of the dataset's :class:`DataSource` is fetched into
``ROOT/.downloads`` (resumable, verified by size or checksum where they are known), extracted
once into the dataset's folder and renamed into the layout the loader reads. Either way the
result is then checked. A copy of the original layout already there is completed from the
original source (the loader reads it before a Hub copy).
Check: the recorded Hub files' sizes and sha256 where the Hub copy is what runs read; then the
loader reads every image (unreadable ones are collected, not fatal) and the per-domain counts
are compared with the published ones.
"""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

from raydg.archives import extract
from raydg.datasets import DATASETS, DatasetSpec, LoadRequest, hub, missing_classes
from raydg.download import fetch
from raydg.errors import RaydgError

Log = Callable[[str], None]
CHECK_SIZE = 32  # images are decoded in full; the resize only bounds memory


def check(name: str, root: Path, log: Log = print) -> list[str]:
    """Every problem with the copy of ``name`` under ``root`` (empty: it is complete)."""
    spec = DATASETS.get(name)
    request = LoadRequest(root, CHECK_SIZE, skip_bad=True, log=lambda _: None)
    folder = root / spec.folder / hub.FOLDER
    files = hub.problems(folder) if hub.in_use(folder.parent, spec.domains) else []
    try:
        data = spec.load(request)
    except RaydgError as err:  # layout errors name every missing domain or file
        return [*files, str(err)]
    if "source" in data.provenance:
        log(f"{spec.name}: source {data.provenance['source']}")
    problems = files + [f"unreadable: {bad}" for _, bad in request.bad_files]
    problems += missing_classes(data)
    counts = [len(d) + sum(label == f"{spec.name}/{d.name}" for label, _ in request.bad_files)
              for d in data.domains]
    for d, n, want in zip(data.domains, counts, spec.expected or counts, strict=True):
        if n != want:
            problems.append(f"{spec.name}/{d.name}: {n} images, expected {want}")
        log(f"{spec.name}/{d.name}: {len(d)} readable images")
    return problems


def download(name: str, root: Path, log: Log = print, source: str | None = None) -> None:
    """Fetch ``name`` under ``root`` from ``source`` ("hub" or "original"; None: the Hub
    mirror where there is one, then the original source if it fails), then check it."""
    spec = DATASETS.get(name)
    if not (spec.needs_root or spec.optional_root):
        raise RaydgError(f"{spec.name} is embedded in raydg: there is nothing to download")
    if spec.source is None:
        raise RaydgError(f"{spec.name}: no public download is registered; {spec.description}")
    order = _sources(spec, root, source)
    for kind in order:
        try:
            hub.download(spec, root, log) if kind == "hub" else _original(spec, root, log)
            break
        except RaydgError as err:
            if kind == order[-1]:
                raise
            log(f"{spec.name}: the Hub mirror failed: {err}")
            log(f"{spec.name}: falling back to the original source")
    problems = check(spec.name, root, log)
    if problems:
        raise RaydgError(f"{spec.name}: downloaded, but {len(problems)} problem(s), the first: "
                         f"{problems[0]}; run raydg data check {spec.name} for all")


def _sources(spec: DatasetSpec, root: Path, source: str | None) -> tuple[str, ...]:
    """The sources to try, in order."""
    assert spec.source is not None
    folders = [d for d in spec.domains if (root / spec.folder / d).exists()]
    if source == "original":
        return ("original",)
    if source == "hub":
        if spec.source.mirror is None:
            raise RaydgError(f"{spec.name} has no Hub mirror; use --source original")
        if folders:
            raise RaydgError(f"{spec.name}: DomainBed's folders in {root / spec.folder} (e.g. "
                             f"{folders[0]}) are read before a Hub copy; move them away first")
        return ("hub",)
    return ("hub", "original") if spec.source.mirror is not None and not folders else (
        "original",)


def _original(spec: DatasetSpec, root: Path, log: Log) -> None:
    """Fetch, extract and arrange ``spec``'s archives under ``root``."""
    assert spec.source is not None
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


def _rename(old: Path, new: Path, log: Log) -> None:
    """Move an extracted folder to the name the loader expects; into it, entry by entry,
    when it exists (holding a Hub copy), refusing to replace anything there."""
    if not old.exists():
        return
    if not new.exists():
        shutil.move(str(old), str(new))
    elif clash := next((p.name for p in old.iterdir() if (new / p.name).exists()), None):
        raise RaydgError(f"both {old} and {new} hold {clash}; remove one and download again")
    else:
        for entry in list(old.iterdir()):
            shutil.move(str(entry), str(new / entry.name))
        old.rmdir()
    log(f"moved {old} to {new}")
