"""The MLflow writer: a store that stops answering loses nothing; a fresh store is created once
by concurrent first runs."""

from __future__ import annotations

import subprocess
import sys

import pytest
from mlflow import MlflowClient

from raydg.config import RunConfig
from raydg.errors import TrackingError
from raydg.plan import resolve
from raydg.tracking import Tracker


def _tracker(tmp_path) -> Tracker:
    cfg = resolve(RunConfig(target="sketch", tracking_uri=f"sqlite:///{tmp_path}/m.db"))
    return Tracker(cfg, "fedavg")


def test_calls_that_fail_are_kept_in_order_and_retried(tmp_path):
    tracker = _tracker(tmp_path)
    real = tracker.client.log_batch
    outage = {"on": True}

    def flaky(*args, **kwargs):
        if outage["on"]:
            raise ConnectionError("tracking server gone")
        return real(*args, **kwargs)

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
    assert [(m.step, m.value) for m in history] == [(r, r / 10) for r in (1, 2, 3, 4)]


def test_a_store_gone_for_good_is_an_error_at_the_end(tmp_path):
    tracker = _tracker(tmp_path)

    def down(*_args, **_kwargs):
        raise ConnectionError("tracking server gone")

    with pytest.raises(TrackingError, match=r"MLflow calls to .* failed until the end"), tracker:
        tracker.client.log_batch = down
        tracker.start_child("sketch-s0", tracker.cfg, {}, "fedavg")


def test_concurrent_first_runs_create_one_store(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    code = f"from raydg.tracking import check_store; check_store({uri!r})"
    procs = [subprocess.Popen([sys.executable, "-c", code], stderr=subprocess.PIPE, text=True)
             for _ in range(3)]
    errors = [p.communicate(timeout=120)[1] for p in procs]
    assert [p.returncode for p in procs] == [0, 0, 0], errors
    assert MlflowClient(uri).search_experiments()  # the store works afterwards
