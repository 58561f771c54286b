"""Faults: a client actor or the driver actor killed mid-run, Ctrl-C and SIGTERM, resume, bad
experiment folders. Every finished run must equal an undisturbed one exactly."""

from __future__ import annotations

import contextlib
import json
import logging
import os
import re
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import psutil
import pytest
from mlflow import MlflowClient
from mlflow.entities import Run
from ray.tune import ExperimentAnalysis

from raydg.config import RunConfig
from raydg.experiment import run_experiment
from raydg.results import timing_free
from raydg.trials.tuner import Interrupted

TINY = {"dataset": "digits-style", "target": "sketch", "method": "fedbn", "clients": 4,
        "rounds": 6, "local_steps": 6, "batch_size": 16, "val_every": 2, "seeds": [0],
        "checkpoint_every": 1}


def _children(title: str) -> list[psutil.Process]:
    """This process's Ray workers whose title starts with ``title`` (never another Ray's)."""
    return [p for p in psutil.Process().children(recursive=True)
            if " ".join(p.cmdline()).startswith(title)]


def _same(a, b) -> None:
    for k in a.global_state:
        np.testing.assert_array_equal(a.global_state[k], b.global_state[k], err_msg=k)
    assert timing_free(a.history) == timing_free(b.history)


@pytest.fixture(scope="module")
def undisturbed(ray_session, tmp_path_factory):
    uri = f"sqlite:///{tmp_path_factory.mktemp('undisturbed')}/mlflow.db"
    return run_experiment(RunConfig(**TINY, tracking_uri=uri), out=lambda _: None).runs[0]


@pytest.mark.parametrize("title", ["ray::ClientHost", "ray::ImplicitFunc"],
                         ids=["client-actor", "driver-actor"])
@pytest.mark.slow
def test_a_killed_actor_restarts_from_its_checkpoint_and_ends_identically(
        undisturbed, tmp_path, title):
    killed: list[int] = []
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        if "] round 2/" in line and not killed:  # round 1's checkpoint is registered
            victim = _children(title)[0]
            killed.append(victim.pid)
            victim.kill()  # SIGKILL, from outside, while the federation trains round 4

    uri = f"sqlite:///{tmp_path}/mlflow.db"
    tune_log: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = tune_log.append
    tune_logger = logging.getLogger("ray.tune.execution.tune_controller")
    tune_logger.addHandler(handler)
    try:
        result = run_experiment(RunConfig(**TINY, tracking_uri=uri), out=out)
    finally:
        tune_logger.removeHandler(handler)
    assert killed
    assert any("continues from its checkpoint after round" in line for line in lines)
    assert not [r for r in tune_log if "Trial task failed" in r.getMessage()]  # raydg's line
    _same(undisturbed, result.runs[0])
    client = MlflowClient(uri)
    child = client.get_run(client.search_runs(
        [client.get_experiment_by_name("digits-style").experiment_id],
        "tags.raydg.key = 'sketch-s0'")[0].info.run_id)
    assert child.info.status == "FINISHED" and child.data.tags["raydg.restarts"] == "1"
    steps = [m.step for m in client.get_metric_history(child.info.run_id, "val_acc")]
    assert sorted(steps) == list(range(1, 7))  # each round once, not twice


def _cli(*args: str, env: dict[str, str]) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "raydg", *args], stdout=subprocess.PIPE,
                            stderr=subprocess.STDOUT, text=True, env=env,
                            start_new_session=True)


def _stop_after_round(proc: subprocess.Popen, sig: int, after: int = 2, to: str = "raydg"
                      ) -> tuple[str, list[psutil.Process], float]:
    """Send ``sig`` when round ``after`` is reported, ``to`` the command (``raydg``), its
    process group (``group``: what ``timeout`` and job control do) or every process under it
    at once (``all``: a scheduler that signals a job's cgroup). Everything the command
    printed, the processes under it when the signal was sent, and the seconds from the signal
    to the command's end."""
    printed = []
    for line in proc.stdout:
        printed.append(line)
        if f"] round {after}/" in line:
            break
    under = psutil.Process(proc.pid).children(recursive=True)
    start = time.monotonic()
    if to == "group":
        os.killpg(proc.pid, sig)
    else:
        for p in [psutil.Process(proc.pid), *(under if to == "all" else [])]:
            with contextlib.suppress(psutil.Error):
                p.send_signal(sig)
    rest, _ = proc.communicate(timeout=180)
    return "".join(printed) + rest, under, time.monotonic() - start


RAY_LOG = re.compile(r"\x1b\[|\(\w[\w ]* pid=\d+"  # colour codes, a worker's prefix
                     r"|^\d{4}-\d\d-\d\d \d\d:\d\d:\d\d,\d+\s+(INFO|WARNING|ERROR)")  # its format


def ray_lines(printed: str) -> list[str]:
    """The lines of Ray's own logs (a worker's prefix, colour codes, its log format) in what
    a command printed: none belongs in raydg's output."""
    return [line for line in printed.splitlines() if RAY_LOG.search(line)]


def _left(procs: list[psutil.Process]) -> list[str]:
    """Those of ``procs`` (a stopped command's, its Ray's) still running after 30 s."""
    _, alive = psutil.wait_procs(procs, timeout=30)
    return [" ".join(p.cmdline()) for p in alive]


def _stopped_with_ctrl_c(uri: str, env: dict[str, str]) -> tuple[str, Run]:
    """Seeds 0 and 1, one at a time, stopped by SIGINT in seed 0's round 4 (seed 1 never
    starts): 130, no Ray log, nothing left running, both runs KILLED. The experiment's folder
    (from the resume hint) and its parent run."""
    args = ["run", "digits-style", "--target", "sketch", "--method", "fedbn", "--clients", "4",
            "--rounds", "6", "--local-steps", "6", "--batch-size", "16", "--seed", "0",
            "--seed", "1", "--max-concurrent", "1", "--set", "val_every=2",
            "--set", "checkpoint_every=1", "--tracking-uri", uri]
    proc = _cli(*args, env=env)
    printed, under, _ = _stop_after_round(proc, signal.SIGINT, after=4)
    assert proc.returncode == 130, printed[-2000:]
    assert ray_lines(printed) == []
    assert _left(under) == []
    (resume,) = [line for line in printed.splitlines() if "continue with: " in line]
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id])
    assert {r.info.status for r in runs} == {"KILLED"} and len(runs) == 2
    parent = next(r for r in runs if "mlflow.parentRunId" not in r.data.tags)
    return resume.split("raydg resume ")[1].strip(), parent  # bare or the venv's raydg


def _break_the_checkpoints(directory: str, env: dict[str, str]) -> Path:
    """sketch-s0's checkpoints as a crash leaves them: the one it continues from (Tune's state
    names it; newer ones may be on disk) corrupt, then gone, a resume stops at once in one line
    naming it; then intact, but the older one deleted, as a kill after Tune deleted it but
    before it saved its state leaves it (a resume goes on without it): the older one's path."""
    (trial,) = [t for t in ExperimentAnalysis(directory).trials
                if t.config["federation"]["key"] == "sketch-s0"]
    latest = Path(trial.run_metadata.checkpoint_manager.latest_checkpoint_result.checkpoint.path)
    intact = (latest / "arrays.npz").read_bytes()
    (latest / "arrays.npz").write_bytes(intact[:100])
    broken = _cli("resume", directory, env=env)
    printed, _ = broken.communicate(timeout=300)
    assert broken.returncode == 2, printed[-2000:]
    assert f"raydg: error: checkpoint file {latest}/arrays.npz does not match its manifest" in (
        printed)
    (latest / "arrays.npz").write_bytes(intact)
    latest.rename(latest.with_name("away"))  # gone: one line too
    broken = _cli("resume", directory, env=env)
    printed, _ = broken.communicate(timeout=300)
    assert broken.returncode == 2 and "Traceback" not in printed, printed[-2000:]
    assert f"raydg: error: checkpoint {latest}, which the experiment's state names as the last" \
        " of sketch-s0, is gone" in printed
    latest.with_name("away").rename(latest)
    (older,) = [Path(r.checkpoint.path) for r in
                trial.run_metadata.checkpoint_manager.best_checkpoint_results
                if Path(r.checkpoint.path) != latest]
    shutil.rmtree(older)
    return older


@pytest.mark.slow
def test_ctrl_c_stops_cleanly_and_resume_ends_identically(undisturbed, tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    env = {**os.environ, "RAYDG_STORAGE": str(tmp_path / "results")}
    directory, parent = _stopped_with_ctrl_c(uri, env)
    listed = _cli("resume", env=env)  # no target: what can continue, with its command
    said, _ = listed.communicate(timeout=120)
    assert listed.returncode == 0 and "KILLED: " in said and f" resume {directory}" in said
    older = _break_the_checkpoints(directory, env)
    again = _cli("resume", parent.info.run_id, "--tracking-uri", uri, env=env)
    printed, _ = again.communicate(timeout=300)
    assert again.returncode == 0, printed[-2000:]
    assert f"resuming the experiment in {directory}" in printed
    assert "Traceback" not in printed and not older.exists()  # resumed without the older one
    assert ray_lines(printed) == []  # Tune's "Restored on ... from checkpoint" among them
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id])
    assert {r.info.status for r in runs} == {"FINISHED"} and len(runs) == 3  # + seed 1's
    assert parent.info.run_id in {r.info.run_id for r in runs}  # the same parent run
    child = next(r for r in runs if r.data.tags.get("raydg.seed") == "0")
    steps = [m.step for m in client.get_metric_history(child.info.run_id, "val_acc")]
    assert sorted(steps) == list(range(1, 7))
    (final,) = [p.parent for p in Path(directory).glob("sketch-s0-*/checkpoint_*/result.json")]
    result = json.loads((final / "result.json").read_text())
    assert result["selected"] == undisturbed.selected and result["last"] == undisturbed.last
    with np.load(final / "global_state.npz", allow_pickle=False) as npz:
        for k in undisturbed.global_state:
            np.testing.assert_array_equal(npz[k], undisturbed.global_state[k], err_msg=k)


@pytest.mark.slow
@pytest.mark.parametrize("to", ["raydg", "group", "all"])
def test_sigterm_stops_cleanly_with_143(tmp_path, to):
    """SIGTERM to raydg, to its process group, or to every process under it (Ray's too): runs
    KILLED, a resume hint, 143, nothing left running; resumed, every round is logged once."""
    env = {**os.environ, "RAYDG_STORAGE": str(tmp_path / "results"), "RAYDG_STOP_SECONDS": "4"}
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = _cli("run", "digits-style", "--target", "sketch", "--rounds", "6", "--seed", "0",
                "--set", "checkpoint_every=1", "--tracking-uri", uri, env=env)
    printed, under, seconds = _stop_after_round(proc, signal.SIGTERM, to=to)
    assert proc.returncode == 143, printed[-2000:]
    assert seconds < 50  # not Ray's own end: a minute, waiting for the GCS it lost
    assert "SIGTERM received" not in printed and "Traceback" not in printed
    assert _left(under) == []
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id])
    assert {r.info.status for r in runs} == {"KILLED"}
    (hint,) = [line for line in printed.splitlines() if "continue with: " in line]
    if to == "all":  # Ray ended with raydg: the run goes on from what Tune recorded
        again = _cli("resume", hint.split("raydg resume ")[1].strip(), env=env)
        printed, _ = again.communicate(timeout=300)
        assert again.returncode == 0 and "Traceback" not in printed, printed[-2000:]
        runs = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id])
        assert {r.info.status for r in runs} == {"FINISHED"}
        child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
        steps = [m.step for m in client.get_metric_history(child.info.run_id, "target_acc")]
        assert sorted(steps) == list(range(1, 7))


@pytest.mark.slow
def test_a_killed_parent_stops_the_experiment_cleanly(tmp_path):
    """SIGTERM to the group and SIGKILL a moment later (a short grace period): the experiment,
    in a session of its own, still ends its runs KILLED and leaves nothing running."""
    env = {**os.environ, "RAYDG_STORAGE": str(tmp_path / "results")}
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    proc = _cli("run", "digits-style", "--target", "sketch", "--rounds", "6", "--seed", "0",
                "--tracking-uri", uri, env=env)
    for line in proc.stdout:
        if "] round 2/" in line:
            break
    under = psutil.Process(proc.pid).children(recursive=True)
    os.killpg(proc.pid, signal.SIGTERM)
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _left(under) == []
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id])
    assert {r.info.status for r in runs} == {"KILLED"}


def test_a_bad_experiment_folder_is_one_line(tmp_path, monkeypatch):
    """In any path form (absolute, relative, ``~``) a folder is read as itself; one that does
    not exist, or holds no manifest, is one line."""
    from click.testing import CliRunner

    from raydg.cli import cli

    result = CliRunner().invoke(cli, ["resume", str(tmp_path / "nowhere")])
    lines = result.stderr.strip().splitlines()
    assert result.exit_code == 2 and len(lines) == 1
    assert lines[0].startswith(f"raydg: error: no experiment folder {tmp_path / 'nowhere'}")
    (tmp_path / "bad").mkdir()
    (tmp_path / "bad" / "raydg.json").write_text("{not json")
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("HOME", str(tmp_path))
    for form in (str(tmp_path / "bad"), "bad", "./bad/", "~/bad"):
        result = CliRunner().invoke(cli, ["resume", form])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, result.output
        assert lines[0].startswith(  # the absolute folder, whatever form named it
            f"raydg: error: {tmp_path / 'bad'}/raydg.json is not a raydg experiment"), lines
    result = CliRunner().invoke(cli, ["resume", "0" * 32, "--tracking-uri",
                                      f"sqlite:///{tmp_path}/m.db"])
    assert result.exit_code == 2 and f"no MLflow run {'0' * 32}" in result.stderr


@pytest.mark.slow
def test_nothing_outlives_a_killed_command(tmp_path):
    """SIGKILL of the process that runs the experiment leaves it no chance to stop its Ray: its
    reaper does; the command exits 137."""
    env = {**os.environ, "RAYDG_STORAGE": str(tmp_path / "results")}
    proc = _cli("run", "digits-style", "--target", "sketch", "--rounds", "6", "--seed", "0",
                "--tracking-uri", f"sqlite:///{tmp_path}/mlflow.db", env=env)
    for line in proc.stdout:
        if "] round 2/" in line:
            break
    (experiment,) = psutil.Process(proc.pid).children()  # the detached command
    left = experiment.children(recursive=True)
    assert left  # its Ray is running
    experiment.kill()
    assert proc.wait() == 137
    _, alive = psutil.wait_procs(left, timeout=60)
    assert alive == [], [" ".join(p.cmdline()) for p in alive]


def test_resuming_into_a_store_without_the_experiments_run_is_one_line(tmp_path, ray_session):
    """The store an experiment logged to was replaced (an empty one at its URI): one line
    that says so and names --tracking-uri; the same with --tracking-uri pointing elsewhere."""
    from click.testing import CliRunner

    from raydg.cli import cli
    from raydg.config import to_dict
    from raydg.trials.storage import write_manifest

    cfg = RunConfig(dataset="digits-style", target="sketch", rounds=1, local_steps=2,
                    tracking_uri=f"sqlite:///{tmp_path}/empty.db", storage=str(tmp_path))
    write_manifest(str(tmp_path / "exp"), {"run_id": "a" * 32, "config": to_dict(cfg),
                                           "search": {"grid": {}, "space": {}, "samples": 0},
                                           "plugins": []})
    result = CliRunner().invoke(cli, ["resume", str(tmp_path / "exp"), "-q"])
    assert result.exit_code == 2 and result.stderr.strip() == (
        f"raydg: error: {tmp_path / 'exp'} holds no Tune experiment state "
        "(experiment_state-*.json): the experiment stopped before its federations started; "
        "run it again")
    (tmp_path / "exp" / "experiment_state-2026-11-25_00-00-00.json").write_text(
        json.dumps({"trial_data": [], "runner_data": {}, "stats": {}}))  # Tune's, no trials
    for extra in ([], ["--tracking-uri", f"sqlite:///{tmp_path}/other.db"]):
        result = CliRunner().invoke(cli, ["resume", str(tmp_path / "exp"), "-q", *extra])
        lines = result.stderr.strip().splitlines()
        assert result.exit_code == 2 and len(lines) == 1, result.output
        uri = extra[-1] if extra else cfg.tracking_uri
        assert lines[0] == (f"raydg: error: the MLflow store {uri} holds no run {'a' * 32}, "
                            "where this experiment logged: if the store has moved, resume "
                            "with --tracking-uri URI of where it is now")


def test_an_experiment_of_another_minor_version_is_one_line_naming_it(tmp_path, monkeypatch):
    """Its manifest names the raydg that wrote it: resuming it is refused before anything else,
    and ``raydg resume`` lists it with the same reason."""
    from click.testing import CliRunner

    from raydg.cli import cli
    from raydg.config import to_dict
    from raydg.trials.storage import MANIFEST, write_manifest
    from raydg.version import __version__

    cfg = RunConfig(dataset="digits-style", tracking_uri=f"sqlite:///{tmp_path}/m.db")
    write_manifest(str(tmp_path / "exp"), {"run_id": "a" * 32, "config": to_dict(cfg),
                                           "search": {}, "plugins": []})
    path = tmp_path / "exp" / MANIFEST
    manifest = json.loads(path.read_text())
    assert manifest["raydg"] == __version__
    for wrote, reason in (
            ("0.0.9", f"the experiment was written by raydg 0.0.9 and this is raydg "
                      f"{__version__}: resume it with raydg 0.0.9, or run it again"),
            (None, f"the experiment was written by a raydg before 0.1.0 and this is raydg "
                   f"{__version__}: run it again")):
        path.write_text(json.dumps({**manifest, "raydg": wrote} if wrote else
                                   {k: v for k, v in manifest.items() if k != "raydg"}))
        result = CliRunner().invoke(cli, ["resume", str(tmp_path / "exp")])
        assert result.exit_code == 2 and result.stderr.strip() == (
            f"raydg: error: {path}: {reason}"), result.output
        monkeypatch.setenv("RAYDG_STORAGE", str(tmp_path))
        listed = CliRunner().invoke(cli, ["resume"])
        assert f"  {reason}: " in listed.output and str(tmp_path / "exp") in listed.output


@pytest.mark.slow
def test_resuming_a_finished_experiment_says_there_is_nothing_to_do(tmp_path, ray_session):
    """Its results again (the same tables), after a line that says nothing was left to run."""
    from click.testing import CliRunner

    from raydg.cli import cli

    args = ["--tracking-uri", f"sqlite:///{tmp_path}/done.db", "--storage", str(tmp_path)]
    run = CliRunner().invoke(cli, ["run", "digits-style", "--target", "sketch", "--rounds", "1",
                                   "--local-steps", "2", *args])
    assert run.exit_code == 0, run.output
    directory = re.search(r"trial files in (\S+)", run.output)[1]
    again = CliRunner().invoke(cli, ["resume", directory, *args[:2]])
    assert again.exit_code == 0, again.output
    assert (f"raydg: nothing to resume in {directory}: every federation finished (1 of 1); "
            "their results") in again.output

    def tables(out: str) -> str:
        return out[out.index("Accuracy (%)"):out.index("raydg: done")]

    assert tables(again.output) == tables(run.output)


@pytest.mark.slow
@pytest.mark.parametrize("back", ["mid-run", "for-resume", "stopped-for-resume"])
def test_a_store_moved_away_and_back_logs_every_round_once(ray_session, tmp_path, caplog, back):
    """The SQLite store moved away after round 2's report and back after round 4's, or only
    after the run (which then ends with raydg's error), or only after the run was stopped at
    round 4 (what raydg kept to log is lost with it): one line says it failed, none is a
    traceback, and in the end (resumed, but in the first case) every round is logged once,
    from what the federations stored."""
    from raydg.errors import TrackingError

    db = tmp_path / "mlflow.db"
    lines: list[str] = []

    def out(line: str) -> None:
        lines.append(line)
        if "] round 2/" in line:
            db.rename(tmp_path / "away.db")
        if "] round 4/" in line and back == "mid-run":
            (tmp_path / "away.db").rename(db)
        if "] round 4/" in line and back == "stopped-for-resume":
            os.kill(os.getpid(), signal.SIGINT)  # Ctrl-C: Tune stops the trial

    cfg = RunConfig(**TINY, tracking_uri=f"sqlite:///{db}")
    if back == "mid-run":
        run_experiment(cfg, out=out)
    else:
        with pytest.raises((TrackingError, KeyboardInterrupt)) as stopped:
            run_experiment(cfg, out=out)
        assert isinstance(stopped.value, TrackingError if back == "for-resume" else Interrupted)
        (tmp_path / "away.db").rename(db)
        (started,) = [line for line in lines if " as Tune trials" in line]
        run_experiment(RunConfig(), resume=started.split("results in ")[1], out=lines.append)
    said = [r.getMessage() for r in caplog.records if r.name.startswith(("raydg", "mlflow"))]
    assert [m for m in said if " failed (" in m] == [
        f"raydg: warning: MLflow at sqlite:///{db} failed (MlflowException: "
        "(sqlite3.OperationalError) attempt to write a readonly database); what it misses is "
        "kept and logged when it answers again"]
    assert not [r for r in caplog.records if r.exc_info]  # no traceback
    client = MlflowClient(f"sqlite:///{db}")
    runs = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id])
    assert {r.info.status for r in runs} == {"FINISHED"} and len(runs) == 2
    child = next(r for r in runs if "mlflow.parentRunId" in r.data.tags)
    for metric in ("val_acc", "train_loss", "target_acc"):
        steps = [m.step for m in client.get_metric_history(child.info.run_id, metric)]
        assert sorted(steps) == list(range(1, 7)), metric
