"""Checkpoints: a safe round trip of every kind of state, refusal of bad folders, and a
federation restored from a snapshot that ends exactly where an undisturbed one does."""

from __future__ import annotations

import hashlib
import json
import logging
import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import numpy as np
import pytest
import torch
from ray import tune

from raydg import checkpoint
from raydg.api import resume, simulation
from raydg.config import RunConfig, to_dict
from raydg.datasets import load_dataset
from raydg.engine.client import ClientState
from raydg.errors import RaydgError
from raydg.partition import ClientData
from raydg.results import timing_free
from raydg.trials.storage import verify_checkpoints, write_manifest
from tests.conftest import free_ports, stopped_and_restored, tiny_config

CONFIG = {"dataset": "digits-style", "rounds": 3, "actors": 2, "storage": "/a"}


def _state():
    data = ClientData(3, "sketch", np.arange(12, dtype=np.uint8).reshape(1, 3, 2, 2),
                      np.array([7]), np.zeros((0, 3, 2, 2), np.uint8), np.zeros(0, np.int64))
    return {"round": 2, "nested": {1: [np.float32(0.5), (1, "a")], "set": {3, 4}},
            "clients": {0: ClientState({"w": np.ones((2, 2), np.float32)},
                                       {"ccst_data": data, "t": torch.arange(3)})},
            "sampler": np.random.default_rng(5).bit_generator.state, "none": None}


def test_every_kind_of_state_round_trips_without_pickle(tmp_path):
    checkpoint.write(tmp_path / "c", _state(), CONFIG)
    back = checkpoint.read(tmp_path / "c", {**CONFIG, "actors": 7, "storage": "/b"})
    assert back["round"] == 2 and back["none"] is None
    assert back["nested"][1][0] == np.float32(0.5) and back["nested"][1][0].dtype == np.float32
    assert back["nested"][1][1] == (1, "a") and back["nested"]["set"] == {3, 4}
    client = back["clients"][0]
    assert isinstance(client, ClientState) and isinstance(client.memory["ccst_data"], ClientData)
    np.testing.assert_array_equal(client.memory["ccst_data"].train_x,
                                  _state()["clients"][0].memory["ccst_data"].train_x)
    assert torch.equal(client.memory["t"], torch.arange(3))
    rng = np.random.default_rng(0)
    rng.bit_generator.state = back["sampler"]
    assert rng.random() == np.random.default_rng(5).random()
    with np.load(tmp_path / "c" / "arrays.npz", allow_pickle=False) as npz:
        assert len(npz.files) == 6  # w, the four ClientData arrays, the tensor


def test_a_check_reads_no_state_and_a_read_needs_the_types_registered(tmp_path):
    """``check`` (an experiment's process before a resume) needs neither the engine nor torch;
    ``read`` builds only the dataclasses its process has registered: none is imported for it."""
    checkpoint.write(tmp_path / "c", _state(), CONFIG)
    code = ("import sys; from pathlib import Path; from raydg import checkpoint; "
            f"checkpoint.check(Path({str(tmp_path / 'c')!r}), {CONFIG!r}); "
            "print(sorted(m for m in ('torch', 'raydg.engine.client') if m in sys.modules)); "
            f"checkpoint.read(Path({str(tmp_path / 'c')!r}), {CONFIG!r})")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True)
    assert out.stdout.strip() == "[]", out.stderr[-2000:]
    assert out.stderr.strip().splitlines()[-1] == (
        "raydg.errors.RaydgError: a checkpoint holds a ClientState, which no imported module "
        "registers")
    with pytest.raises(RaydgError, match="different config"):
        checkpoint.check(tmp_path / "c", {**CONFIG, "rounds": 4})


def test_bad_checkpoints_are_refused_with_the_file_named(tmp_path):
    folder = tmp_path / "c"
    checkpoint.write(folder, _state(), CONFIG)
    with pytest.raises(RaydgError, match="different config"):
        checkpoint.read(folder, {**CONFIG, "rounds": 4})
    arrays = (folder / "arrays.npz").read_bytes()
    (folder / "arrays.npz").write_bytes(arrays[: len(arrays) // 2])  # truncated
    with pytest.raises(RaydgError, match=r"arrays\.npz does not match its manifest"):
        checkpoint.read(folder, CONFIG)
    (folder / "arrays.npz").write_bytes(arrays)
    (folder / "manifest.json").unlink()  # cut short before the manifest
    with pytest.raises(RaydgError, match=r"manifest\.json is missing or unreadable"):
        checkpoint.read(folder, CONFIG)
    (folder / "manifest.json").write_text(json.dumps({"format": "other", "files": {}}))
    with pytest.raises(RaydgError, match="not a raydg federation checkpoint"):
        checkpoint.read(folder, CONFIG)
    with pytest.raises(RaydgError, match=r"cannot checkpoint a builtins\.object"):
        checkpoint.write(tmp_path / "d", {"x": object()}, CONFIG)


def _rehash(folder):
    """Make the manifest match the files again, as someone tampering would."""
    files = {n: hashlib.sha256((folder / n).read_bytes()).hexdigest()
             for n in checkpoint.FILES}
    (folder / "manifest.json").write_text(json.dumps({"format": checkpoint.FORMAT,
                                                      "files": files}))


def test_a_tampered_checkpoint_with_a_matching_manifest_is_one_line(tmp_path, monkeypatch):
    """A manifest naming any other file (a path out of the folder, with that file's real
    hash) is refused before a file is opened; an object array, which needs pickle, is one
    line, not a traceback."""
    folder = tmp_path / "c"
    checkpoint.write(folder, _state(), CONFIG)
    outside = tmp_path / "secret"
    outside.write_text("not yours")
    manifest = json.loads((folder / "manifest.json").read_text())
    manifest["files"]["../secret"] = hashlib.sha256(outside.read_bytes()).hexdigest()
    (folder / "manifest.json").write_text(json.dumps(manifest))
    opened = []
    real = Path.read_bytes
    monkeypatch.setattr(Path, "read_bytes", lambda p: opened.append(p) or real(p))
    with pytest.raises(RaydgError, match=r"names \['\.\./secret', 'arrays\.npz', 'state\.json'\]"):
        checkpoint.read(folder, CONFIG)
    assert opened == []
    monkeypatch.undo()
    np.savez(folder / "arrays.npz", a0=np.array([object()], dtype=object), allow_pickle=True)
    _rehash(folder)
    with pytest.raises(RaydgError, match="matches its manifest but cannot be read "
                                         r"\(ValueError: Object arrays cannot be loaded"):
        checkpoint.read(folder, CONFIG)


@pytest.mark.usefixtures("warm_actors")
@pytest.mark.parametrize(("method", "options", "extra"), [
    ("fedbn", {}, {"validate_clients": "sampled"}), ("csac", {"acquire_steps": 3}, {}),
    ("ccst", {"k": 2}, {})])
@pytest.mark.slow
def test_a_restored_federation_ends_as_the_undisturbed_one(method, options, extra, tmp_path):
    """FedBN's local BN tensors, CSAC's frozen local models, CCST's augmented data: client
    memories of every kind survive the checkpoint, and the run ends bit-identically (with
    FedBN, the round redone after the restore is validated by that round's sampled clients)."""
    cfg = tiny_config(method=method, clients=4, sample=3, rounds=4, options=options, **extra)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    whole, again, restore = stopped_and_restored(cfg, data, 2, tmp_path / "c")
    assert restore["round"] == 3 and [r["round"] for r in restore["history"]] == [1, 2]
    # round 3 started before the stop: its time is not known (no 0 s round in the history)
    assert [r["round"] for r in again.history if "round_seconds" not in r] == [3]
    for k in whole.global_state:
        np.testing.assert_array_equal(whole.global_state[k], again.global_state[k], err_msg=k)
    assert timing_free(whole.history) == timing_free(again.history)
    assert whole.tables["ledger"] == again.tables["ledger"]


@pytest.mark.usefixtures("warm_actors")
def test_a_federation_that_fails_to_start_leaves_no_actor_behind():
    import psutil

    cfg = tiny_config(clients=4)
    data = load_dataset(cfg.dataset, None, cfg.image_size)
    with pytest.raises(KeyError):  # a snapshot without its clients: fails after the actors exist
        simulation(cfg, data, log=lambda _: None,
                   restore={"round": 1, "global_state": {}, "history": [], "pending": {},
                            "ledger": [], "tables": {}, "has_local": [], "steps": 0,
                            "sampler": np.random.default_rng(0).bit_generator.state})
    def client_host(p: psutil.Process) -> bool:
        try:
            return " ".join(p.cmdline()).startswith("ray::ClientHost")
        except psutil.Error:  # exited (a zombie, or gone) while being listed
            return False

    hosts = [p for p in psutil.Process().children(recursive=True) if client_host(p)]
    _, alive = psutil.wait_procs(hosts, timeout=30)
    assert alive == []


@pytest.mark.slow
@pytest.mark.usefixtures("warm_actors")
def test_a_resume_check_is_silent_about_trials_that_never_started(tmp_path):
    """A Tune experiment interrupted while a trial waited for resources (as the Rotated MNIST
    experiments were at every stop): its state names a pending trial without metric files,
    which ``tune.ExperimentAnalysis`` reports as a warning; raydg's check before a resume
    reads trial states only and logs nothing."""
    def report_then_interrupt(config):
        tune.report({"i": config["i"]})
        os.kill(config["driver"], signal.SIGUSR1)  # Tune's own "stop and save" signal
        threading.Event().wait()  # until Tune ends this trial

    tune.Tuner(tune.with_resources(report_then_interrupt, {"cpu": 2}),  # one at a time
               param_space={"i": tune.grid_search([0, 1]), "driver": os.getpid()},
               run_config=tune.RunConfig(name="stopped", storage_path=str(tmp_path),
                                         verbose=0)).fit()
    directory = str(tmp_path / "stopped")
    records: list[logging.LogRecord] = []
    handler = logging.Handler()
    handler.emit = records.append
    tune_logger = logging.getLogger("ray.tune")
    level = tune_logger.level  # the session's logging_level="ERROR" would hide the warning
    tune_logger.addHandler(handler)
    tune_logger.setLevel(logging.WARNING)
    try:
        statuses = sorted(t.status for t in tune.ExperimentAnalysis(directory).trials)
        assert statuses == ["PENDING", "PENDING"]  # the running one, too, to start again
        assert any(r.getMessage().startswith("Failed to fetch metrics") for r in records)
        records.clear()
        verify_checkpoints(directory, [])
    finally:
        tune_logger.removeHandler(handler)
        tune_logger.setLevel(level)
    assert [r.getMessage() for r in records] == []


def test_a_resume_names_the_cluster_to_continue_on_where_the_experiments_is_gone(tmp_path):
    """The experiment's manifest names a Ray head that no longer listens: the resume says so
    and how to name another; ``address`` is then the cluster it joins, the manifest's
    config otherwise kept."""
    gone, other = free_ports(2)
    folder = tmp_path / "exp"
    write_manifest(str(folder), {"run_id": "0" * 32, "search": {}, "config": to_dict(
        RunConfig(address=f"127.0.0.1:{gone}", tracking_uri=f"sqlite:///{tmp_path}/m.db"))})
    with pytest.raises(RaydgError, match=rf"cannot reach the Ray cluster at 127.0.0.1:{gone}: "
                                         r".*\(raydg resume --address names the cluster"):
        resume(folder)
    with pytest.raises(RaydgError, match=rf"cannot reach the Ray cluster at 127.0.0.1:{other}"):
        resume(folder, address=f"127.0.0.1:{other}")
