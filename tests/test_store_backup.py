"""Backups of an MLflow SQLite store: a snapshot restores the runs it held, the newest backup
is the one restored, old ones are pruned, and nothing is ever overwritten or half-restored."""

from __future__ import annotations

import gzip
from pathlib import Path

import pytest
from mlflow import MlflowClient

from raydg.errors import RaydgError
from raydg.tracking.backup import backup, restore


def _log(db: Path, name: str, value: float) -> None:
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("e") or client.get_experiment(
        client.create_experiment("e"))
    run = client.create_run(experiment.experiment_id, run_name=name)
    client.log_metric(run.info.run_id, "acc", value, step=1)


def _runs(db: Path) -> dict[str, float]:
    client = MlflowClient(f"sqlite:///{db}")
    experiment = client.get_experiment_by_name("e")
    return {r.info.run_name: r.data.metrics["acc"]
            for r in client.search_runs([experiment.experiment_id])}


def test_the_newest_of_the_kept_backups_restores_the_runs_it_held(tmp_path):
    db, bucket = tmp_path / "head" / "mlflow.db", tmp_path / "bucket" / "backups"
    db.parent.mkdir()
    written = []
    for i in range(3):
        _log(db, f"run{i}", i / 10)
        written.append(backup(db, str(bucket), keep=2))
    assert sorted(str(p) for p in bucket.iterdir()) == written[1:]  # the oldest was pruned
    assert written == sorted(written)  # names sort by time
    with gzip.open(written[-1]) as f:
        assert f.read(16) == b"SQLite format 3\x00"
    restored = tmp_path / "new-head" / "mlflow.db"
    assert restore(str(bucket), restored) == written[-1]
    assert _runs(restored) == {"run0": 0.0, "run1": 0.1, "run2": 0.2}


def test_restore_replaces_nothing_and_leaves_nothing_half_done(tmp_path):
    db, bucket = tmp_path / "mlflow.db", tmp_path / "bucket"
    assert restore(str(bucket), db) is None and not db.exists()  # a first start: no backup yet
    _log(db, "run", 0.5)
    backup(db, str(bucket))
    with pytest.raises(RaydgError, match="exists"):
        restore(str(bucket), db)
    (bucket / "mlflow-29990101T000000.000000Z.db.gz").write_bytes(gzip.compress(b"not sqlite"))
    target = tmp_path / "other" / "mlflow.db"
    with pytest.raises(RaydgError, match="not an MLflow SQLite store"):
        restore(str(bucket), target)  # the newest backup is broken: refused, no file left
    assert list(target.parent.iterdir()) == []


def test_backup_refuses_what_is_not_a_store(tmp_path):
    with pytest.raises(RaydgError, match="no MLflow store"):
        backup(tmp_path / "missing.db", str(tmp_path / "b"))
    (tmp_path / "x.db").write_text("hello")
    with pytest.raises(RaydgError, match="not an MLflow SQLite store"):
        backup(tmp_path / "x.db", str(tmp_path / "b"))
