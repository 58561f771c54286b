"""Unpack a downloaded dataset archive: zip and tar (optionally gzip, bz2 or xz), detected by
content, refusing any member (or link target) that would land outside the destination.
"""

from __future__ import annotations

import os
import re
import shutil
import tarfile
import zipfile
import zlib
from collections.abc import Callable
from pathlib import Path

from raydg.errors import RaydgError

_CHUNK = 1 << 20
_EXTRACT_ERRORS = (zipfile.BadZipFile, tarfile.TarError, zlib.error, EOFError, OSError,
                   NotImplementedError, RuntimeError)


def extract(path: Path, dest: Path, log: Callable[[str], None] = print) -> None:
    """Unpack the zip or tar archive ``path`` into ``dest``, refusing members outside it."""
    path, dest = Path(path), Path(dest)
    dest.mkdir(parents=True, exist_ok=True)
    try:
        if zipfile.is_zipfile(path):
            count = _extract_zip(path, dest)
        elif tarfile.is_tarfile(path):
            count = _extract_tar(path, dest)
        else:
            raise RaydgError(f"cannot extract {path}: not a zip or tar archive "
                             "(corrupt or truncated download? delete it and download again)")
    except _EXTRACT_ERRORS as err:
        reason = " ".join((str(err) or type(err).__name__).split())
        raise RaydgError(f"cannot extract {path}: {reason} (corrupt or truncated archive? "
                         "delete it and download again)") from err
    log(f"extracted {count} files from {path.name} into {dest}")


def _extract_zip(path: Path, dest: Path) -> int:
    root = os.path.realpath(dest)
    with zipfile.ZipFile(path) as zf:
        members = [(info, _target(root, info.filename)) for info in zf.infolist()]
        for info, target in members:
            if info.is_dir():
                os.makedirs(target, exist_ok=True)
                continue
            os.makedirs(os.path.dirname(target), exist_ok=True)
            with zf.open(info) as src, open(target, "wb") as dst:
                shutil.copyfileobj(src, dst, _CHUNK)
    return sum(not info.is_dir() for info, _ in members)


def _extract_tar(path: Path, dest: Path) -> int:
    root, count = os.path.realpath(dest), 0
    safe = {"filter": "data"} if hasattr(tarfile, "data_filter") else {}
    with tarfile.open(path, "r:*") as tar:
        for member in tar:  # streamed; each member is checked against the tree as it is now
            _check_tar_member(root, member)
            try:
                tar.extract(member, root, set_attrs=not member.isdir(), **safe)
            except getattr(tarfile, "FilterError", ()) as err:
                raise RaydgError(f"refusing archive member {member.name!r}: {err}") from err
            count += member.isfile()
    return count


def _check_tar_member(root: str, member: tarfile.TarInfo) -> None:
    """Refuse a member, or the target of a link member, that resolves outside ``root``."""
    _target(root, member.name)
    if member.issym():
        folder = os.path.dirname(os.path.join(root, member.name))
        _target(root, member.linkname, base=folder, member=member.name)
    elif member.islnk():
        _target(root, member.linkname, member=member.name)
    elif not (member.isfile() or member.isdir()):
        raise RaydgError(f"refusing archive member {member.name!r}: not a file or folder")


def _target(root: str, name: str, base: str | None = None, member: str | None = None) -> str:
    """Real path of ``name`` under ``base`` (default ``root``); RaydgError if outside ``root``.

    ``..`` is refused in member names (``member`` unset) and allowed in link targets.
    """
    absolute = os.path.isabs(name) or name.startswith(("/", "\\")) or bool(
        re.match(r"^[A-Za-z]:", name))
    dotdot = member is None and ".." in re.split(r"[\\/]", name)
    target = os.path.realpath(os.path.join(base or root, name))
    if absolute or dotdot or os.path.commonpath([root, target]) != root:
        what = f"links to {name!r}, outside" if member else "would land outside"
        raise RaydgError(f"refusing archive member {member or name!r}: it {what} {root}")
    return target
