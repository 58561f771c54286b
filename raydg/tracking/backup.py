"""Copies of an MLflow SQLite store that outlive the machine it lives on.

A cluster's tracking server keeps its runs in a SQLite file on the head's disk, which ``ray
down`` deletes. :func:`backup` writes a consistent, gzip-compressed snapshot of that file
(SQLite's online backup, safe while the server writes) to a folder or any pyarrow filesystem
URI (``s3://bucket/mlflow-backups``), named by its UTC time so that no backup overwrites
another, and keeps the newest ``keep``; :func:`restore` puts the newest one back before the
server starts on a new head.
"""

from __future__ import annotations

import contextlib
import datetime
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pyarrow.fs as pafs

from raydg.errors import RaydgError

PREFIX, SUFFIX = "mlflow-", ".db.gz"


def _filesystem(location: str) -> tuple[pafs.FileSystem, str, str]:
    """The filesystem, the folder's path in it, and the prefix that makes a path a URI again
    (``s3://``; empty for a local folder)."""
    uri = location if "://" in location else Path(location).expanduser().absolute().as_uri()
    try:
        fs, folder = pafs.FileSystem.from_uri(uri)
    except (OSError, ValueError) as err:
        raise RaydgError(f"cannot use {location} for backups: {err}") from None
    return fs, folder, "" if isinstance(fs, pafs.LocalFileSystem) else uri.split("://")[0] + "://"


def _backups(fs: pafs.FileSystem, folder: str) -> list[str]:
    """The backups in ``folder``, oldest first (their names sort by time)."""
    infos = fs.get_file_info(pafs.FileSelector(folder, allow_not_found=True))
    names = (info.base_name for info in infos if info.type == pafs.FileType.File)
    return sorted(f"{folder}/{n}" for n in names if n.startswith(PREFIX) and n.endswith(SUFFIX))


def _read_only(path: Path) -> contextlib.closing[sqlite3.Connection]:
    return contextlib.closing(sqlite3.connect(f"{path.as_uri()}?mode=ro", uri=True))


def _check_store(path: Path, shown: str | None = None) -> None:
    """Refuse a file that is not an MLflow SQLite store (named ``shown`` in the error)."""
    try:
        with _read_only(path) as db:
            db.execute("SELECT COUNT(*) FROM runs").fetchone()
    except sqlite3.DatabaseError as err:
        raise RaydgError(f"{shown or path} is not an MLflow SQLite store: {err}") from None


def backup(db: Path, destination: str, keep: int = 10) -> str:
    """Write a snapshot of the store ``db`` to ``destination``; return the backup's location."""
    if keep < 1:
        raise RaydgError(f"--keep must be at least 1, not {keep}")
    if not db.is_file():
        raise RaydgError(f"no MLflow store at {db}")
    fs, folder, scheme = _filesystem(destination)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = f"{folder}/{PREFIX}{stamp}{SUFFIX}"
    _check_store(db)
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(tmp) / "mlflow.db"
        with _read_only(db) as src, contextlib.closing(sqlite3.connect(snapshot)) as dst:
            src.backup(dst)
        fs.create_dir(folder, recursive=True)
        with snapshot.open("rb") as f, fs.open_output_stream(target, compression="gzip") as out:
            shutil.copyfileobj(f, out)
    for old in _backups(fs, folder)[:-keep]:
        fs.delete_file(old)
    return scheme + target


def restore(source: str, db: Path) -> str | None:
    """Put the newest backup in ``source`` at ``db``; return its location, or None when there
    is none (a first start). Refuses to replace an existing store."""
    if db.exists():
        raise RaydgError(f"{db} exists: restoring would replace it; move it away first")
    fs, folder, scheme = _filesystem(source)
    found = _backups(fs, folder)
    if not found:
        return None
    db.parent.mkdir(parents=True, exist_ok=True)
    partial = db.with_name(db.name + ".restoring")
    try:
        with fs.open_input_stream(found[-1], compression="gzip") as src, \
                partial.open("wb") as out:
            shutil.copyfileobj(src, out)
        _check_store(partial, shown=scheme + found[-1])
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
    partial.rename(db)
    return scheme + found[-1]
