"""The MLflow writer: a store that stops answering loses nothing; a fresh store is created once
by concurrent first runs, its tables copied from the cache's template as MLflow makes them;
logging a model draws no progress bar."""

from __future__ import annotations

import contextlib
import re
import sqlite3
import subprocess
import sys
import types
from collections.abc import Callable
from typing import Any

import mlflow
import numpy as np
import pytest
from mlflow import MlflowClient

from raydg import results
from raydg.config import RunConfig
from raydg.errors import TrackingError
from raydg.resolve import resolve
from raydg.tracking import tracker as tracker_mod
from raydg.tracking.logged_model import log_model
from raydg.tracking.tracker import Tracker


def _tracker(tmp_path) -> Tracker:
    cfg = resolve(RunConfig(target="sketch", tracking_uri=f"sqlite:///{tmp_path}/m.db"))
    return Tracker(cfg.tracking_uri, cfg, "fedavg")


def _flaky(tracker: Tracker) -> tuple[dict[str, Any], Callable[..., Any]]:
    """An outage switch (``on``) and a ``log_batch`` that fails while it is on (``calls``)."""
    real = tracker.client.log_batch
    outage = {"on": True, "calls": 0}

    def flaky(*args, **kwargs):
        outage["calls"] += 1
        if outage["on"]:
            raise ConnectionError("tracking server gone")
        return real(*args, **kwargs)

    return outage, flaky


def _said(caplog) -> list[str]:
    return [r.getMessage() for r in caplog.records if r.name == "raydg"]


def test_calls_that_fail_are_kept_in_order_and_retried(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(tracker_mod, "RETRY_SECONDS", 0.0)  # each call tries the kept ones again
    tracker = _tracker(tmp_path)
    outage, flaky = _flaky(tracker)

    with tracker:
        tracker.client.log_batch = flaky  # the parent run exists; then the server goes away
        tracker.start_child("sketch-s0", tracker.cfg, {}, "fedavg")
        for rnd in (1, 2, 3):  # the server is down for the first calls
            tracker.log_round("sketch-s0", {"round": rnd, "val_acc": rnd / 10})
        assert len(tracker.backlog) == 4  # the child's params and 3 rounds: kept, not lost
        outage["on"] = False
        tracker.log_round("sketch-s0", {"round": 4, "val_acc": 0.4})  # back up: all flushed
        assert not tracker.backlog
    history = MlflowClient(tracker.client.tracking_uri).get_metric_history(
        tracker.children["sketch-s0"], "val_acc")
    assert [(m.step, m.value) for m in history] == [  # logged in percent
        (r, pytest.approx(10.0 * r)) for r in (1, 2, 3, 4)]
    uri = tracker.client.tracking_uri
    assert _said(caplog) == [  # one line when it went away, one when it came back
        f"raydg: warning: MLflow at {uri} failed (ConnectionError: tracking server gone); what "
        "it misses is kept and logged when it answers again",
        f"raydg: warning: MLflow at {uri} answers again after 0m00s: the 5 calls kept are "
        "logged"]


def test_while_mlflow_is_away_it_is_tried_again_only_every_retry_seconds(tmp_path, monkeypatch,
                                                                         caplog):
    monkeypatch.setattr(tracker_mod, "REMIND_SECONDS", 0.0)  # each failed retry says so
    tracker = _tracker(tmp_path)
    outage, flaky = _flaky(tracker)
    with tracker:
        tracker.client.log_batch = flaky
        tracker.start_child("sketch-s0", tracker.cfg, {}, "fedavg")  # fails: kept
        for rnd in (1, 2, 3):
            tracker.log_round("sketch-s0", {"round": rnd, "val_acc": rnd / 10})
        assert outage["calls"] == 1 and len(tracker.backlog) == 4  # not tried again within 10 s
        monkeypatch.setattr(tracker_mod, "RETRY_SECONDS", 0.0)
        tracker.log_round("sketch-s0", {"round": 4, "val_acc": 0.4})
        assert outage["calls"] == 2 and len(tracker.backlog) == 5  # tried again, still away
        outage["on"] = False
    assert _said(caplog)[1] == (f"raydg: warning: MLflow at {tracker.client.tracking_uri} still "
                                "fails after 0m00s (ConnectionError: tracking server gone); 5 "
                                "calls kept")
    history = MlflowClient(tracker.client.tracking_uri).get_metric_history(
        tracker.children["sketch-s0"], "val_acc")
    assert [m.step for m in history] == [1, 2, 3, 4]  # at the end, each once


def test_a_store_gone_for_good_is_an_error_at_the_end(tmp_path):
    tracker = _tracker(tmp_path)

    def down(*_args, **_kwargs):
        raise ConnectionError("tracking server gone")

    with pytest.raises(TrackingError, match=r"MLflow calls to .* failed until the end"), tracker:
        tracker.client.log_batch = down
        tracker.start_child("sketch-s0", tracker.cfg, {}, "fedavg")


@pytest.mark.slow
def test_concurrent_first_runs_create_one_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = ("import sys; from raydg.tracking.store import check_store; "
            "check_store(sys.argv[1], sys.argv[2])")
    procs = [subprocess.Popen([sys.executable, "-c", code, uri, str(tmp_path / "cache")],
                              stderr=subprocess.PIPE, text=True) for _ in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert MlflowClient(uri).search_experiments()  # the store works afterwards
    assert [p.name for p in (tmp_path / "cache").glob("*.db")] == [
        f"mlflow-{mlflow.__version__}-tables.db"]  # one template, made once


def test_a_store_from_the_caches_template_is_the_store_mlflow_makes(tmp_path):
    """In a command of its own (outside this suite's template): stores made by MLflow's
    migrations, from a new template, from it again, and with a cache that cannot be written
    hold the same tables, revision and Default experiment."""
    (tmp_path / "a-file").touch()
    caches = {"mlflow": "", "template": tmp_path / "cache", "again": tmp_path / "cache",
              "unwritable": tmp_path / "a-file" / "cache"}
    code = ("import sys; from raydg.tracking.store import check_store\n"
            "for uri, cache in zip(sys.argv[1::2], sys.argv[2::2]): check_store(uri, cache)")
    args = [a for name, cache in caches.items()
            for a in (f"sqlite:///{tmp_path}/{name}.db", str(cache))]
    subprocess.run([sys.executable, "-c", code, *args], check=True, cwd=tmp_path)

    def store(name: str) -> tuple[list[Any], ...]:
        """Its tables (each statement's clauses as a set: MLflow's migrations write a table's
        CHECK constraints in an order that varies from one process to the next), revision and
        experiments."""
        with contextlib.closing(sqlite3.connect(tmp_path / f"{name}.db")) as db:
            schema = sorted((kind, table, frozenset(re.split(r",? *\n\t*", sql or "")))
                            for kind, table, sql in db.execute(
                                "SELECT type, name, sql FROM sqlite_master"))
            return schema, *(sorted(db.execute(query).fetchall()) for query in (
                "SELECT * FROM alembic_version",
                "SELECT experiment_id, name, artifact_location FROM experiments"))

    made = store("mlflow")
    assert made[2] == [(0, "Default", f"{tmp_path}/mlruns/0")] and len(made[0]) > 100
    assert all(store(name) == made for name in caches)
    with contextlib.closing(sqlite3.connect(
            tmp_path / "cache" / f"mlflow-{mlflow.__version__}-tables.db")) as template:
        assert template.execute("SELECT COUNT(*) FROM experiments").fetchone() == (0,)


def test_accuracies_are_logged_in_percent_and_tagged_so(tmp_path):
    with _tracker(tmp_path) as new:
        new.start_child("sketch-s0", new.cfg, {}, "fedavg")
        new.log_round("sketch-s0", {"round": 1, "val_acc": 0.5, "train_loss": 2.0})
    client = MlflowClient(new.client.tracking_uri)
    child = client.get_run(new.children["sketch-s0"])
    assert child.data.tags[results.UNIT_TAG] == "percent"
    assert child.data.metrics == {"val_acc": 50.0, "train_loss": 2.0,
                                  f"{tracker_mod.CURVES}/val_acc": 50.0,
                                  f"{tracker_mod.CURVES}/train_loss": 2.0}


def test_logging_a_model_draws_no_progress_bar_unless_the_user_asks(tmp_path, monkeypatch):
    """MLflow draws its artifact progress bars with tqdm where tqdm is installed (not in this
    environment: a stand-in counts the bars): none on a run's console, unless the user set
    MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR."""
    bars = []

    class Bar:  # tqdm's constructor; every other call does nothing
        def __init__(self, *args, desc: str = "", **kwargs):
            bars.append(desc)

        def __getattr__(self, name: str) -> Callable[..., None]:
            return lambda *args, **kwargs: None

    fake = types.ModuleType("tqdm.auto")
    fake.tqdm = Bar
    monkeypatch.setitem(sys.modules, "tqdm", types.ModuleType("tqdm"))
    monkeypatch.setitem(sys.modules, "tqdm.auto", fake)
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "")
    monkeypatch.delenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR")
    client = MlflowClient(f"sqlite:///{tmp_path}/m.db")
    run = client.create_run(client.create_experiment("models")).info.run_id
    info = {"in_channels": 1, "image_size": 8}
    log_model(client, run, {"global": {"w": np.zeros(2)}}, info, "0.0")
    assert bars == []
    monkeypatch.setenv("MLFLOW_ENABLE_ARTIFACTS_PROGRESS_BAR", "true")
    log_model(client, run, {"global": {"w": np.zeros(2)}}, info, "0.0")
    assert bars and all(b == "Downloading artifacts" for b in bars)
