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
from raydg.tracking.store import check_sqlite_store

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


def backup(db: Path, destination: str, keep: int = 10) -> str:
    """Write a snapshot of the store ``db`` to ``destination``; return the backup's location."""
    if keep < 1:
        raise RaydgError(f"--keep must be at least 1, not {keep}")
    if not db.is_file():
        raise RaydgError(f"no MLflow store at {db}")
    fs, folder, scheme = _filesystem(destination)
    stamp = datetime.datetime.now(datetime.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    target = f"{folder}/{PREFIX}{stamp}{SUFFIX}"
    check_sqlite_store(db)
    with tempfile.TemporaryDirectory() as tmp:
        snapshot = Path(tmp) / "mlflow.db"
        with _read_only(db) as src, contextlib.closing(sqlite3.connect(snapshot)) as dst:
            src.backup(dst)
        try:
            fs.create_dir(folder, recursive=True)
            with snapshot.open("rb") as f, fs.open_output_stream(target,
                                                                 compression="gzip") as out:
                shutil.copyfileobj(f, out)
        except OSError as err:
            raise RaydgError(f"cannot write a backup to {destination}: "
                             f"{str(err).splitlines()[0][:200]}") from None
    for old in _backups(fs, folder)[:-keep]:
        fs.delete_file(old)
    return scheme + target


def restore(source: str, db: Path) -> tuple[str | None, list[str]]:
    """Put the newest sound backup in ``source`` at ``db``: its location (None when there is
    none: a first start) and a line for each newer one that was skipped, unreadable or not a
    whole MLflow store. Refuses to replace an existing store, and fails in one line when no
    backup is sound."""
    if db.exists():
        raise RaydgError(f"{db} exists: restoring would replace it; move it away first")
    fs, folder, scheme = _filesystem(source)
    found = _backups(fs, folder)
    if not found:
        return None, []
    db.parent.mkdir(parents=True, exist_ok=True)
    partial = db.with_name(db.name + ".restoring")
    skipped = []
    for candidate in reversed(found):
        try:
            _unpack(fs, candidate, partial, scheme + candidate)
        except RaydgError as err:
            skipped.append(f"skipped {err}")
            continue
        partial.rename(db)
        return scheme + candidate, skipped
    raise RaydgError(f"none of the {len(found)} backups in {source} is sound; the newest: "
                     f"{skipped[0].removeprefix('skipped ')}")


def _unpack(fs: pafs.FileSystem, backup: str, partial: Path, shown: str) -> None:
    """Decompress ``backup`` into ``partial`` and check that it is a whole MLflow store;
    ``partial`` is removed when it is not."""
    try:
        with fs.open_input_stream(backup, compression="gzip") as src, partial.open("wb") as out:
            shutil.copyfileobj(src, out)
        check_sqlite_store(partial, shown=shown)
        with _read_only(partial) as check:
            verdict = check.execute("PRAGMA quick_check").fetchone()[0]
        if verdict != "ok":
            raise RaydgError(f"{shown} is a damaged SQLite file: {verdict[:200]}")
    except (OSError, EOFError, sqlite3.Error) as err:
        partial.unlink(missing_ok=True)
        raise RaydgError(f"{shown}: cannot be read ({type(err).__name__}: "
                         f"{str(err).splitlines()[0][:160]})") from None
    except BaseException:
        partial.unlink(missing_ok=True)
        raise
