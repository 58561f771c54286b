"""Where runs are kept: the MLflow store's URI, its check before Ray starts, and the end of
the runs of an experiment whose process could not end them. Imports no more than MLflow (a
scheduler's SIGKILL follows SIGTERM within seconds)."""

from __future__ import annotations

import contextlib
import logging
import os
import re
import sqlite3
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

from raydg.config import RunConfig
from raydg.errors import EmptyResult, RaydgError

if TYPE_CHECKING:
    from mlflow import MlflowClient

DEFAULT_TRACKING_URI = "sqlite:///mlflow.db"
SERVER_TIMEOUT = 5.0  # seconds for a tracking server to answer before the run starts
# MLflow's own HTTP retries would wait minutes for a server that is gone
HTTP_SETTINGS = {"MLFLOW_HTTP_REQUEST_MAX_RETRIES": "2", "MLFLOW_HTTP_REQUEST_TIMEOUT": "20"}


def tracking_uri(cfg: RunConfig) -> str:
    """The store: ``--tracking-uri``, ``MLFLOW_TRACKING_URI`` or ``sqlite:///mlflow.db``, a
    relative SQLite path made absolute (a resumed experiment finds the same store)."""
    uri = cfg.tracking_uri or os.environ.get("MLFLOW_TRACKING_URI") or DEFAULT_TRACKING_URI
    if uri.startswith("sqlite:///") and not uri.startswith("sqlite:////"):
        uri = "sqlite:///" + str(Path(uri[len("sqlite:///"):]).absolute())
    return uri


def check_store(uri: str, cache: str | None = None) -> None:
    """Refuse a tracking server that does not answer within ``SERVER_TIMEOUT`` seconds,
    before Ray starts; create a SQLite store under a file lock (concurrent first runs would
    race in MLflow's schema migration), its tables copied from :func:`tables_template` in
    ``cache`` where one is given."""
    for key, value in HTTP_SETTINGS.items():
        os.environ.setdefault(key, value)
    if uri.startswith(("http://", "https://")):
        import requests

        try:
            requests.get(f"{uri.rstrip('/')}/health", timeout=SERVER_TIMEOUT).raise_for_status()
        except requests.RequestException as err:
            raise RaydgError(f"the MLflow tracking server at {uri} does not answer: "
                             f"{type(err).__name__}") from None
    elif uri.startswith("sqlite:///"):
        from filelock import FileLock
        from mlflow import MlflowClient

        path = Path(uri[len("sqlite:///"):])
        logging.getLogger("mlflow").setLevel(logging.WARNING)  # no schema-migration INFO lines
        with FileLock(f"{path}.lock"):
            template = _writable_template(Path(cache)) if cache and not path.exists() else None
            if template is not None:
                copy_tables(template, path)
            MlflowClient(uri).search_experiments(max_results=1)


def _writable_template(cache: Path) -> Path | None:
    """:func:`tables_template` in ``cache``, or None where the cache cannot be written (MLflow
    then makes the tables, only slower)."""
    try:
        return tables_template(cache)
    except OSError:
        return None


def copy_tables(template: Path, path: Path) -> None:
    """Give the new SQLite file ``path`` the tables of ``template`` (:func:`tables_template`)
    through SQLite's backup API: 0.04 s of CPU where MLflow's migrations take 1.1-1.5 s. MLflow
    adds its Default experiment when it opens the store."""
    with contextlib.closing(sqlite3.connect(template)) as source, \
            contextlib.closing(sqlite3.connect(path)) as store:
        source.backup(store)


def tables_template(cache: Path) -> Path:
    """``<cache>/mlflow-<version>-tables.db``: the tables that this MLflow version's
    migrations make, with no experiment in them, made once per cache folder (under a file
    lock, renamed into place whole)."""
    import mlflow
    from filelock import FileLock

    template = cache / f"mlflow-{mlflow.__version__}-tables.db"
    cache.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{template}.lock"):
        if not template.exists():
            with tempfile.TemporaryDirectory(dir=cache) as tmp:
                made = Path(tmp) / "mlflow.db"
                mlflow.MlflowClient(f"sqlite:///{made}").search_experiments(max_results=1)
                with contextlib.closing(sqlite3.connect(made)) as db, db:
                    db.execute("DELETE FROM experiments")  # the Default one, made where it ran
                os.replace(made, template)
    return template


def check_sqlite_store(path: Path, shown: str | None = None) -> None:
    """Refuse a file that is not an MLflow SQLite store (named ``shown`` in the error), read
    only: MLflow itself would write its tables into any SQLite file it is pointed at."""
    try:
        with contextlib.closing(sqlite3.connect(f"{path.absolute().as_uri()}?mode=ro",
                                                uri=True)) as db:
            tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master")}
    except sqlite3.Error as err:
        raise RaydgError(f"{shown or path} is not an MLflow SQLite store: {err}") from None
    if not {"alembic_version", "runs"} <= tables:
        raise RaydgError(f"{shown or path} is not an MLflow SQLite store: it has no "
                         "alembic_version or runs table (nothing read, nothing written)")


def reading_client(uri: str) -> MlflowClient:
    """A client of an existing store, for commands that only read it: a SQLite store must be
    an MLflow one (:func:`check_sqlite_store`), and one of another MLflow schema is refused in
    one line that says how to upgrade it."""
    from mlflow import MlflowClient
    from mlflow.exceptions import MlflowException

    quiet_mlflow()
    if uri.startswith("sqlite:///"):
        path = Path(uri.removeprefix("sqlite:///"))
        if not path.is_file():
            raise EmptyResult(f"no MLflow store at {path} (runs write one there; "
                              "--tracking-uri or MLFLOW_TRACKING_URI names another)")
        check_sqlite_store(path)
    try:
        client = MlflowClient(uri)
        client.search_experiments(max_results=1)
    except MlflowException as err:
        found = re.search(r"found version (\w+), but expected (\w+)", err.message)
        if found:
            raise RaydgError(f"the MLflow store {uri} has the schema of another MLflow version "
                             f"({found[1]}, this MLflow expects {found[2]}): back it up, then "
                             f"`mlflow db upgrade {uri}`") from None
        raise RaydgError(f"cannot read the MLflow store {uri}: "
                         f"{err.message.splitlines()[0][:200]}") from None
    return client


def quiet_mlflow() -> None:
    logging.getLogger("mlflow").setLevel(logging.WARNING)
    # a failed query is raised to raydg, which says so in one line: not logged again with its
    # traceback
    logging.getLogger("mlflow.store.db.utils").setLevel(logging.CRITICAL)


def end_stopped(uri: str, run_id: str) -> None:
    """End the parent run ``run_id`` ``KILLED``, with its child runs still running: the stop of
    an experiment whose process ended before it could say so (:mod:`raydg.signals`)."""
    from mlflow import MlflowClient

    quiet_mlflow()
    client = MlflowClient(uri)
    parent = client.get_run(run_id)
    for run in client.search_runs([parent.info.experiment_id],
                                  f"tags.mlflow.parentRunId = '{run_id}'", max_results=10000):
        if run.info.status == "RUNNING":
            client.set_terminated(run.info.run_id, "KILLED")
    if parent.info.status == "RUNNING":
        client.set_terminated(run_id, "KILLED")
