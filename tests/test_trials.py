"""Federations as concurrent Tune trials: identical results, one MLflow writer, sweeps, refusals."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
import ray
from mlflow import MlflowClient

from raydg.api import simulation
from raydg.config import RunConfig, parse_search
from raydg.datasets import load_dataset
from raydg.errors import RaydgError
from raydg.experiment import run_experiment
from raydg.planning import plan_experiment
from raydg.results import timing_free
from raydg.trials.tuner import _root_cause
from tests.conftest import start_local_ray

pytestmark = pytest.mark.usefixtures("ray_with_a_gpu")


@pytest.fixture(scope="module")
def ray_with_a_gpu():
    """This module's own local Ray (not the suite's ``ray_session``): 2 CPUs and one GPU that
    Ray schedules but torch cannot see (a failing trial's cause)."""
    start_local_ray(num_gpus=1)
    yield
    ray.shutdown()

TINY = {"dataset": "digits-style", "target": "sketch", "rounds": 2, "local_steps": 4,
        "batch_size": 16, "val_every": 2, "seeds": [0, 1]}


def _assert_same(a, b):
    assert (a.target, a.seed) == (b.target, b.seed)
    assert a.global_state.keys() == b.global_state.keys()
    for k in a.global_state:
        np.testing.assert_array_equal(a.global_state[k], b.global_state[k], err_msg=k)
    assert timing_free(a.history) == timing_free(b.history)
    assert (a.selected_round, a.selected, a.last) == (b.selected_round, b.selected, b.last)


@pytest.fixture(scope="module")
def concurrent(tmp_path_factory):
    """FedBN, 4 clients, 2 federations on 2 CPUs: by default both run at once, 1 actor each."""
    uri = f"sqlite:///{tmp_path_factory.mktemp('mlflow')}/mlflow.db"
    cfg = RunConfig(**TINY, method="fedbn", clients=4, tracking_uri=uri)
    lines: list[str] = []
    return cfg, run_experiment(cfg, out=lines.append), lines


def _actors(run) -> int:
    return sum(r["role"] == "client" for r in run.tables["placement"])


@pytest.mark.slow
def test_concurrent_trials_equal_sequential_runs_whatever_the_layout(concurrent):
    cfg, result, _ = concurrent
    assert [_actors(r) for r in result.runs] == [1, 1]
    data = load_dataset("digits-style", None, None)
    for fed, run in zip(result.plan.federations, result.runs, strict=True):
        alone = dataclasses.replace(fed.config, actors=2)  # in this process, no Tune, 2 actors
        _assert_same(run, simulation(alone, data, fed.target, fed.seed, log=print).run())
    again = run_experiment(dataclasses.replace(
        cfg, max_concurrent=1, actors=2, placement="spread",
        tracking_uri=cfg.tracking_uri.replace("mlflow.db", "again.db")), out=lambda _: None)
    assert [_actors(r) for r in again.runs] == [2, 2]
    # one after the other on one trial actor: the second federation reset the first's actors
    clients = [[r for r in run.tables["placement"] if r["role"] == "client"] for run in again.runs]
    assert [{r["pid"] for r in c} for c in clients[1:]] == [{r["pid"] for r in clients[0]}]
    assert [c[0]["reused"] for c in clients] == [False, True]
    for a, b in zip(result.runs, again.runs, strict=True):
        _assert_same(a, b)
    assert again.summary == result.summary


def test_one_mlflow_writer_keeps_every_round_of_concurrent_trials(concurrent):
    cfg, result, lines = concurrent
    client = MlflowClient(cfg.tracking_uri)
    runs = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id])
    parents = [r for r in runs if "mlflow.parentRunId" not in r.data.tags]
    children = [r for r in runs if "mlflow.parentRunId" in r.data.tags]
    assert len(parents) == 1 and len(children) == 2
    assert parents[0].info.run_id == result.run_id and parents[0].info.status == "FINISHED"
    assert "avg/selected/global" in parents[0].data.metrics
    seeds = sorted(int(c.data.tags["raydg.seed"]) for c in children)
    assert seeds == [0, 1]
    for child in children:
        assert child.info.status == "FINISHED"
        assert child.data.tags["mlflow.parentRunId"] == result.run_id
        for metric in ("train_loss", "val_acc", "target_acc", "bytes_up", "bytes_down",
                       "round_seconds", "target_acc/global"):
            steps = [m.step for m in client.get_metric_history(child.info.run_id, metric)]
            assert sorted(steps) == [1, 2], (metric, steps)
        names = {a.path for a in client.list_artifacts(child.info.run_id)}
        assert {"history.parquet", "ledger.parquet", "placement.csv"} <= names
    # the two trials overlapped in time: they ran concurrently
    first, second = sorted(children, key=lambda c: c.info.start_time)
    assert second.info.start_time < first.info.end_time
    # raydg's progress lines, not Tune's tables
    assert sum("] round " in line and " loss " in line for line in lines) == 4
    # the same placement for both trials: said once
    assert sum("] placement: 4 clients on 1 actor " in line for line in lines) == 1
    # no silent stretch between the headline and the first round's line: the trials' start,
    # then (once, for the first federation placed) its round 1 under way
    said = [line for line in lines if "starting the federations'" in line or "under way" in line]
    assert said[0] == "raydg: starting the federations' drivers and client actors"
    assert len(said) == 2 and said[1].endswith("] round 1/2 under way")
    assert lines.index(said[0]) < lines.index(said[1]) < min(
        i for i, line in enumerate(lines) if "] round 1/2 loss" in line)
    assert not any("Trial" in line or "╭" in line for line in lines)


@pytest.mark.slow
def test_sweep_selects_per_target_by_mean_source_validation(tmp_path):
    cfg = RunConfig(**TINY, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db")
    lines: list[str] = []
    result = run_experiment(cfg, parse_search({"lr": [0.01, 0.2]}), out=lines.append)
    assert [r.setting for r in result.runs] == [{"lr": 0.01}] * 2 + [{"lr": 0.2}] * 2
    assert not np.array_equal(result.runs[0].global_state["classifier.weight"],
                              result.runs[2].global_state["classifier.weight"])
    # independently: the selected round's validation accuracy, averaged over seeds
    val = {lr: np.mean([max(h["val_acc"] for h in r.history) for r in result.runs
                        if r.setting["lr"] == lr]) for lr in (0.01, 0.2)}
    target = {lr: [100 * r.selected["global"] for r in result.runs if r.setting["lr"] == lr]
              for lr in (0.01, 0.2)}
    best = max(val, key=val.get)
    oracle = max(target, key=lambda lr: np.mean(target[lr]))
    row = next(r for r in result.selection if r["target"] == "sketch")
    assert row["setting"] == f"lr={best}" and row["val_acc"] == pytest.approx(100 * val[best])
    assert row["accuracy"] == pytest.approx(np.mean(target[best]))
    assert row["oracle_setting"] == f"lr={oracle}"
    assert "Selected setting" in result.printed and f"lr={best}" in result.printed
    client = MlflowClient(cfg.tracking_uri)
    parent = client.get_run(result.run_id)
    assert parent.data.metrics["avg/selected_hparams/fedavg/global"] == pytest.approx(
        row["accuracy"])
    # the headline metric every parent run has, here the selected setting's: the runs table
    # compares a sweep with a single run on one column
    assert parent.data.metrics["avg/selected/global"] == pytest.approx(row["accuracy"])
    assert "lr" in parent.data.params["search"]


@pytest.mark.parametrize(("overrides", "message"), [
    ({"cpus_per_actor": 100.0}, "no node can host a client actor of 100 CPU"),
    ({"actors": 3}, "a federation of 3 actors needs 3 CPU"),
    ({"gpus_per_actor": 2.0}, "no node can host a client actor of 1 CPU and 2 GPU"),
    ({"gpus_per_actor": 1.0}, "a federation of 1 actors needs 1 CPU and 2 GPU"),
])
def test_resources_the_cluster_lacks_are_refused_before_any_trial(tmp_path, overrides,
                                                                  message):
    cfg = RunConfig(**TINY, tracking_uri=f"sqlite:///{tmp_path}/mlflow.db", **overrides)
    with pytest.raises(RaydgError, match=message):
        run_experiment(cfg, out=lambda _: None)


@pytest.mark.slow
def test_a_failing_trial_stops_the_experiment_with_its_error(tmp_path):
    uri = f"sqlite:///{tmp_path}/mlflow.db"
    cfg = RunConfig(**TINY, gpus_per_actor=0.5, tracking_uri=uri)  # Ray's GPU, torch sees none
    with pytest.raises(RaydgError, match="sees no CUDA device"):
        run_experiment(cfg, out=lambda _: None)
    client = MlflowClient(uri)
    runs = client.search_runs([client.get_experiment_by_name("digits-style").experiment_id])
    assert runs and {r.info.status for r in runs} == {"FAILED"}


def test_a_trials_user_error_is_found_under_rays_wrappers():
    @ray.remote
    def fail():
        raise RaydgError("bad input inside a trial")

    with pytest.raises(ray.exceptions.RayTaskError) as info:
        ray.get(fail.remote())
    wrapped = RuntimeError("Tune's wrapper")
    wrapped.__cause__ = info.value
    cause = _root_cause(wrapped)
    assert isinstance(cause, RaydgError) and "bad input inside a trial" in str(cause)


def test_progress_estimates_the_work_left_over_the_running_federations(monkeypatch):
    import raydg.trials.progress as progress_mod

    clock = iter([0.0, 0.0, 12.0, 13.0])  # two trials start; their first rounds end at 12, 13 s
    monkeypatch.setattr(progress_mod.time, "perf_counter", lambda: next(clock))
    plan = plan_experiment(RunConfig(dataset="digits-style", rounds=4, seeds=[0]))
    lines: list[str] = []
    progress = progress_mod.Progress(plan.federations, lines.append, status_every=2)  # 4 feds x 4
    a, b = plan.federations[:2]
    progress.start(a.key)
    progress.start(b.key)
    row = {"round": 1, "train_loss": 1.0, "val_acc": 0.5, "target_acc": 0.25}
    progress(a, {**row, "round_seconds": 3.0})  # start-up 12 s; no steady round yet: 3 s
    assert lines[-2] == f"[{a.title()}] round 1/4 loss 1.000 val 50.0% target 25.0% 3.0s"
    # (3 x 3 + 4 x 3 + 2 x (12 + 3 x 3)) / 2 = 31.5
    assert lines[-1] == "raydg: 0 of 4 federations done, 2 running; about 0:00:31 left in all"
    progress(b, {**row, "round_seconds": 2.0})  # start-up 13 s; the status every 2nd round
    assert lines[-1].startswith(f"[{b.title()}] round 1/4")
    progress(b, {**row, "round": 2, "round_seconds": 1.0})  # b's round 2: steady 1 s
    # left: a 3 rounds, b 2 rounds at 1 s; 2 federations pending at start-up 12.5 s + 3 rounds
    assert lines[-1].endswith("about 0:00:18 left in all")  # (3 + 2 + 2 x (12.5 + 3)) / 2
    assert lines[-2].startswith(f"[{b.title()}] round 2/4")
    assert all(len(line) <= 80 for line in lines)


def test_progress_after_a_resume_counts_only_the_work_left():
    """After a resume: the round that a federation evaluates again started before the stop (no
    seconds on its line, none in the estimate: it said "about 0:00:00 left"), and federations
    that ended before the stop are no work left (they were counted as not started: "about
    12:55:01 left" for about 6 hours of the Rotated MNIST CSAC experiment)."""
    from raydg.trials.progress import Progress

    plan = plan_experiment(RunConfig(dataset="digits-style", rounds=4, seeds=[0]))
    a, b, c, _ = plan.federations
    lines: list[str] = []
    progress = Progress(plan.federations, lines.append, done={a.key: 2, b.key: 4, c.key: 1},
                        status_every=1)  # b ended before the stop, c stopped after round 1
    progress.start(a.key)
    row = {"round": 3, "train_loss": 1.0, "val_acc": 0.5, "target_acc": 0.25}
    progress(a, row)
    assert lines[-2] == f"[{a.title()}] round 3/4 loss 1.000 val 50.0% target 25.0% restored"
    assert lines[-1] == "raydg: 1 of 4 federations done, 1 running"
    progress(a, {**row, "round": 4, "round_seconds": 2.0})
    # start-up unknown (resumed: a steady round, 2 s); c: 2 + 2 rounds x 2, the 4th: 2 + 3 x 2
    assert lines[-1] == "raydg: 2 of 4 federations done, 0 running; about 0:00:14 left in all"


def test_an_experiment_saved_before_the_trials_package_finds_its_collector():
    """Tune saved the collector and stopper of an experiment that raydg started before
    2026-11-27 as a reference to ``raydg.runner._active``: it still resolves (resumed end to end
    from an experiment of 3bd1e89 in that session's closing note)."""
    import pickle

    from raydg.trials import callbacks

    assert pickle.loads(b"craydg.runner\n_active\n.") is callbacks._active
