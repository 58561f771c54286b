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
    assert restore(str(bucket), restored) == (written[-1], [])
    assert _runs(restored) == {"run0": 0.0, "run1": 0.1, "run2": 0.2}


def test_restore_replaces_nothing_and_leaves_nothing_half_done(tmp_path):
    db, bucket = tmp_path / "mlflow.db", tmp_path / "bucket"
    assert restore(str(bucket), db) == (None, []) and not db.exists()  # a first start
    _log(db, "run", 0.5)
    backup(db, str(bucket))
    with pytest.raises(RaydgError, match="exists"):
        restore(str(bucket), db)
    only_bad, target = tmp_path / "only-bad", tmp_path / "other" / "mlflow.db"
    only_bad.mkdir()
    only_bad.joinpath("mlflow-29990101T000000.000000Z.db.gz").write_bytes(gzip.compress(b"x"))
    with pytest.raises(RaydgError, match=r"none of the 1 backups .* is sound; the newest: .*"
                                          r"not an MLflow SQLite store"):
        restore(str(only_bad), target)
    assert list(target.parent.iterdir()) == []  # nothing half-restored


@pytest.mark.parametrize("damage", ["truncated", "random bytes", "not gzip", "not sqlite"])
def test_a_damaged_newest_backup_is_skipped_for_the_newest_sound_one(tmp_path, damage):
    """A truncated newest backup (a cut upload) beside an older good one: the good one is
    restored and the bad one named; one damaged backup alone is one line."""
    db, bucket = tmp_path / "mlflow.db", tmp_path / "bucket"
    _log(db, "run", 0.5)
    good = backup(db, str(bucket))
    whole = Path(good).read_bytes()
    newest = bucket / "mlflow-29990101T000000.000000Z.db.gz"
    newest.write_bytes({"truncated": whole[: len(whole) // 2],
                        "random bytes": gzip.compress(bytes(range(256)) * 64),
                        "not gzip": bytes(range(256)) * 8,
                        "not sqlite": gzip.compress(b"hello")}[damage])
    target = tmp_path / "new" / "mlflow.db"
    found, skipped = restore(str(bucket), target)
    assert found == good and _runs(target) == {"run": 0.5}
    assert len(skipped) == 1 and str(newest) in skipped[0]
    Path(good).unlink()
    with pytest.raises(RaydgError, match=r"none of the 1 backups") as err:
        restore(str(bucket), tmp_path / "again" / "mlflow.db")
    assert "\n" not in str(err.value) and len(str(err.value)) < 400


def test_backup_refuses_what_is_not_a_store(tmp_path):
    with pytest.raises(RaydgError, match="no MLflow store"):
        backup(tmp_path / "missing.db", str(tmp_path / "b"))
    (tmp_path / "x.db").write_text("hello")
    with pytest.raises(RaydgError, match="not an MLflow SQLite store"):
        backup(tmp_path / "x.db", str(tmp_path / "b"))


def test_backup_to_a_destination_that_cannot_be_made_is_one_line(tmp_path):
    db = tmp_path / "mlflow.db"
    _log(db, "run", 0.5)
    (tmp_path / "afile").write_text("x")
    for destination in (tmp_path / "afile", tmp_path / "afile" / "sub"):
        with pytest.raises(RaydgError, match="cannot write a backup to"):
            backup(db, str(destination))


def test_the_store_commands_say_a_bad_backup_in_one_line(tmp_path):
    """``raydg store restore``: a damaged newest backup beside a sound one is named in one
    warning and the sound one restored; only damaged ones is one error line, exit 2; ``raydg
    store backup`` to a file is one line too."""
    from click.testing import CliRunner

    from raydg.cli import cli

    db, bucket = tmp_path / "mlflow.db", tmp_path / "bucket"
    _log(db, "run", 0.5)
    good = backup(db, str(bucket))
    bad = bucket / "mlflow-29990101T000000.000000Z.db.gz"
    bad.write_bytes(Path(good).read_bytes()[:100])  # a cut upload
    restored = CliRunner().invoke(cli, ["store", "restore", str(bucket), str(tmp_path / "a.db")])
    assert restored.exit_code == 0, restored.output
    assert restored.stderr.count("\n") == 1 and f"skipped {bad}" in restored.stderr
    assert restored.stdout.strip() == f"restored {tmp_path / 'a.db'} from {good}"
    Path(good).unlink()
    failed = CliRunner().invoke(cli, ["store", "restore", str(bucket), str(tmp_path / "b.db")])
    assert failed.exit_code == 2 and len(failed.output.strip().splitlines()) == 1
    (tmp_path / "afile").write_text("x")
    to_file = CliRunner().invoke(cli, ["store", "backup", str(db), str(tmp_path / "afile")])
    assert to_file.exit_code == 2 and len(to_file.output.strip().splitlines()) == 1
