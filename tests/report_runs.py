"""The runs that test_report.py reports on, and what ``raydg report`` should say of them,
computed here from the runs' per-round metrics."""

from __future__ import annotations

import csv
import io

import numpy as np
from click.testing import CliRunner
from mlflow import MlflowClient
from scipy import stats

from raydg.cli import cli
from raydg.config import RunConfig
from raydg.experiment import run_experiment

TARGETS = ("M0", "M45")
SEEDS = (0, 1)
METHODS = ("fedavg", "fedbn")
EXPERIMENT = "report-test"


def _run(uri: str, method: str, target: str, **overrides) -> None:
    cfg = RunConfig(dataset="digits-rot", method=method, target=target, seeds=list(SEEDS),
                    rounds=2, local_steps=3, batch_size=16, tracking_uri=uri,
                    experiment=EXPERIMENT, **overrides)
    run_experiment(cfg, out=lambda _: None, progress="none")


def write_runs(uri: str) -> None:
    """2 methods x 2 targets x 2 seeds, each (method, target) its own ``raydg run``, and one
    more fedavg run on M0 with another learning rate, into the store at ``uri``."""
    for method in METHODS:
        for target in TARGETS:
            _run(uri, method, target)
    _run(uri, "fedavg", "M0", lr=0.5)


def report(uri: str, *args: str):
    """``raydg report ARGS`` on the experiment of ``write_runs`` in ``uri``: click's result."""
    return CliRunner().invoke(cli, ["report", "--tracking-uri", uri, "--experiment", EXPERIMENT,
                                    *args])


def report_csv(uri: str, *args: str) -> list[dict[str, str]]:
    """The rows of ``report`` in CSV (which must succeed)."""
    result = report(uri, "--format", "csv", *args)
    assert result.exit_code == 0, result.output
    return list(csv.DictReader(io.StringIO(result.stdout)))


def child_runs(uri: str, lr: str | None = None, method: str | None = None) -> list:
    """The runs of one target and seed, of learning rate ``lr`` and ``method`` where given."""
    client = MlflowClient(uri)
    exp = client.get_experiment_by_name(EXPERIMENT)
    runs = [r for r in client.search_runs([exp.experiment_id])
            if "raydg.target" in r.data.tags]
    return [r for r in runs if (lr is None or r.data.params["lr"] == lr)
            and (method is None or r.data.tags["raydg.method"] == method)]


def expected_table(uri: str, selection: str, lr: str) -> dict[str, dict[str, float]]:
    """Per method: mean and std over seeds per target and of the per-seed Avg, from
    :func:`run_accuracies`."""
    acc = run_accuracies(uri, selection, lr)
    out = {}
    for method in METHODS:
        row = {}
        for t in TARGETS:
            values = [acc[method, t, s] for s in SEEDS]
            row[t], row[t + "_std"] = np.mean(values), np.std(values, ddof=1)
        per_seed = [np.mean([acc[method, t, s] for t in TARGETS]) for s in SEEDS]
        row["Avg"], row["Avg_std"] = np.mean(per_seed), np.std(per_seed, ddof=1)
        row["per_seed"] = per_seed
        out[method] = row
    return out


def run_accuracies(uri: str, selection: str, lr: str) -> dict[tuple[str, str, int], float]:
    """Each run's target accuracy by (method, target, seed), from its logged ``val_acc`` /
    ``target_acc`` per round (selected: the first round of best source validation accuracy;
    last; oracle: the best target accuracy)."""
    client = MlflowClient(uri)
    acc: dict[tuple[str, str, int], float] = {}
    for run in child_runs(uri, lr):
        val = [m.value for m in sorted(client.get_metric_history(run.info.run_id, "val_acc"),
                                       key=lambda m: m.step)]
        target = [m.value for m in sorted(
            client.get_metric_history(run.info.run_id, "target_acc"), key=lambda m: m.step)]
        pick = {"selected": target[int(np.argmax(val))], "last": target[-1],
                "oracle": max(target)}[selection]
        tags = run.data.tags
        acc[tags["raydg.method"], tags["raydg.target"], int(tags["raydg.seed"])] = pick
    return acc


def paired_interval(expected: dict[str, dict], method: str, versus: str) -> tuple[float, float]:
    """In an ``expected_table``: the mean of ``method``'s per-seed Avg minus ``versus``', and
    the half width of its 95% t interval."""
    d = np.subtract(expected[method]["per_seed"], expected[versus]["per_seed"])
    return d.mean(), stats.t.ppf(0.975, len(d) - 1) * d.std(ddof=1) / np.sqrt(len(d))
